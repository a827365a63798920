"""GPU candidates: cuBLAS (plain, split-K, symmetric blocks), cuBLASLt's ranked algorithms
(candidates_lt.py) and the direct kernels of ``kernels/skinny.cu`` and ``kernels/wx_tile.cu``.
Each says why it cannot run a problem, rather than failing.

cuBLAS is called through CuPy's thin wrappers with the compute type passed explicitly
(CUBLAS_COMPUTE_32F / 64F: never TF32, whatever CuPy's or the handle's default).
"""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from ..backend import cupy_module, device_properties
from ..kernels import FLOAT_DTYPES, LAUNCH, FastLaunch, ctype, declare_instances, kernel
from .candidates_lt import CublasLtGemm
from .cublaslt import gemm_geometry
from .gpu_common import Workspace, blas_dims_reason, stream_getter
from .problem import Candidate, Problem, Runner, copy_into, instances_of, scratch_like
from .view import INT32_MAX, MatrixView

# cuBLAS / CUDA enums (CuPy lacks some; values from cublas_api.h / library_types.h).
CUDA_R_32F, CUDA_R_64F = 0, 1
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F = 68, 70
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_DEFAULT_MATH = 0  # computes with at least the requested mantissa bits: never TF32
OP_N, OP_T = 0, 1
_DATA_TYPE = {np.dtype(np.float32): CUDA_R_32F, np.dtype(np.float64): CUDA_R_64F}
_COMPUTE_TYPE = {np.dtype(np.float32): CUBLAS_COMPUTE_32F, np.dtype(np.float64): CUBLAS_COMPUTE_64F}
_ONE = {np.dtype(t): np.ones(1, t) for t in (np.float32, np.float64)}
_ZERO = {np.dtype(t): np.zeros(1, t) for t in (np.float32, np.float64)}
_ATTR_FP32_TO_FP64_RATIO = 87  # cudaDevAttrSingleToDoublePrecisionPerfRatio
#: skinny.cu's and wx_tile.cu's blocks (dspk/kernels/launch.cuh)
GS_THREADS, GS_STEP = LAUNCH["GS_THREADS"], LAUNCH["GS_THREADS"] * LAUNCH["GS_U"]
GT_TILE, GT_THREADS, GT_SYM_THREADS = (LAUNCH["GT_TILE"], LAUNCH["GT_THREADS"],
                                       LAUNCH["GT_SYM_THREADS"])
RED_THREADS = LAUNCH["RED_THREADS"]
WXD_THREADS, WXV_THREADS, WT_TM = LAUNCH["WXD_THREADS"], LAUNCH["WXV_THREADS"], LAUNCH["WT_TM"]


def _cublas() -> Any:
    cupy_module()
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415 (lazy: needs CuPy)

    return cublas


# device attributes: facts of the machine (like dspk.backend.device_properties), not caches
@lru_cache(maxsize=None)
def _fp64_ratio(device_id: int) -> int:
    return int(cupy_module().cuda.runtime.deviceGetAttribute(_ATTR_FP32_TO_FP64_RATIO, device_id))


def _sm_count(device_id: int) -> int:
    return int(device_properties(device_id)["multiProcessorCount"])


def _optin(props: dict) -> int:
    """Dynamic shared memory one CTA may opt in to (bytes) on a device with properties
    ``props``: 227 KiB on Hopper."""
    return int(props.get("sharedMemPerBlockOptin", 0) or props.get("sharedMemPerBlock", 48 << 10))


@lru_cache(maxsize=None)
def _smem_optin(device_id: int) -> int:
    return _optin(device_properties(device_id))


def _pow2_at_least(n: int, lo: int) -> int:
    """The template size class used for a runtime dimension n (fewer compiled instances)."""
    v = lo
    while v < n:
        v *= 2
    return v


def _int32_reason(p: Problem) -> str | None:
    for v in (p.a, p.b, p.out):
        lo, hi = v.extent()
        if hi > INT32_MAX or any(abs(s) > INT32_MAX for s in v.strides):
            return f"{v.name} reaches element {hi}, beyond this kernel's 32-bit indexing"
    return None


def _check32(p: Problem) -> None:
    for v in (p.a, p.b, p.out):
        v.check(index_bits=32)


# ------------------------------------------------------------------------------------------
# cuBLAS
# ------------------------------------------------------------------------------------------
def _blas_ready(v: MatrixView) -> MatrixView:
    """An operand cuBLAS can take: its own view when one of its strides is 1, else a gather."""
    return v if v.layout() != "S" else v.contiguous()


def _gemm_plan(a: MatrixView, b: MatrixView, out: MatrixView, batches: int, stride_a: int,
               stride_b: int, stride_out: int) -> Callable[[int, int, int], None]:
    """A runner ``f(ptr_a, ptr_b, ptr_out)`` computing ``out = a·b`` for ``batches`` matrices of
    this geometry through gemmStridedBatchedEx (gemmEx for one matrix: the same kernel,
    measured 8 µs less host time per call for 384 x 384 x 60 000 float32 on an H200).
    ``out``, ``a``, ``b`` must be R or C layout."""
    cublas = _cublas()
    dt = a.dtype
    g = gemm_geometry(a, b, out)
    s1, s2 = (stride_b, stride_a) if g.swap else (stride_a, stride_b)
    one, zero = _ONE[dt].ctypes.data, _ZERO[dt].ctypes.data
    dtype_id, compute = _DATA_TYPE[dt], _COMPUTE_TYPE[dt]
    get_handle = cupy_module().cuda.device.get_cublas_handle
    swap, op1, op2, m, n, K = g.swap, g.op1, g.op2, g.m, g.n, g.k
    ld1, ld2, ldc = g.ld1, g.ld2, g.ldc
    if batches == 1:
        gemm = cublas.gemmEx

        def run(pa: int, pb: int, po: int) -> None:
            p1, p2 = (pb, pa) if swap else (pa, pb)
            gemm(get_handle(), op1, op2, m, n, K, one, p1, dtype_id, ld1, p2, dtype_id, ld2,
                 zero, po, dtype_id, ldc, compute, CUBLAS_GEMM_DEFAULT)

        return run
    gemm = cublas.gemmStridedBatchedEx

    def run_batched(pa: int, pb: int, po: int) -> None:
        p1, p2 = (pb, pa) if swap else (pa, pb)
        gemm(get_handle(), op1, op2, m, n, K, one, p1, dtype_id, ld1, s1, p2, dtype_id, ld2,
             s2, zero, po, dtype_id, ldc, stride_out, batches, compute, CUBLAS_GEMM_DEFAULT)

    return run_batched


def _gemm_batched(a: MatrixView, b: MatrixView, out: MatrixView, batches: int,
                  stride_a: int, stride_b: int, stride_out: int) -> None:
    _gemm_plan(a, b, out, batches, stride_a, stride_b, stride_out)(a.ptr, b.ptr, out.ptr)


class CublasGemm(Candidate):
    name = "cublas"
    gpu = True
    summary = "cuBLAS gemmStridedBatchedEx, compute type 32F/64F passed explicitly"

    def unavailable(self, p: Problem) -> str | None:
        return blas_dims_reason(p)

    def bind(self, p: Problem) -> Runner | None:
        if "S" in (p.a.layout(), p.b.layout(), p.out.layout()):
            return None
        return _gemm_plan(p.a, p.b, p.out, p.batches, p.a.strides[0], p.b.strides[0],
                          p.out.strides[0])

    def run(self, p: Problem) -> None:
        fast = self.bind(p)
        if fast is not None:
            fast(p.a.ptr, p.b.ptr, p.out.ptr)
            return
        a, b = _blas_ready(p.a), _blas_ready(p.b)
        out = p.out if p.out.layout() != "S" else scratch_like(cupy_module(), p.out.shape, p.dtype)
        _gemm_batched(a, b, out, p.batches, a.strides[0], b.strides[0], out.strides[0])
        if out is not p.out:
            copy_into(p.out, out)


class CublasSplitK(Candidate):
    """K split into ``chunks`` products (one strided-batched call), then summed in a fixed
    order by ``splitk_reduce``: more parallelism when M, N ≪ K, and shorter float32 sums."""

    gpu = True

    def __init__(self, chunks: int):
        self.chunks = chunks
        self.name = f"cublas_splitk{chunks}"
        self.summary = (f"cuBLAS over {chunks} K-chunks (strided-batched) + deterministic "
                        f"reduction kernel")

    def unavailable(self, p: Problem) -> str | None:
        if p.batches != 1:
            return "split-K runs single products only (batches > 1)"
        if p.k < 64 * self.chunks:
            return f"K={p.k} is too short for {self.chunks} chunks of at least 64"
        return blas_dims_reason(p) or _int32_reason(p)

    def bind(self, p: Problem) -> Runner | None:
        if "S" in (p.a.layout(), p.b.layout()):
            return None
        a, b = p.a, p.b
        M, N, K, S = p.m, p.n, p.k, self.chunks
        kc = K // S
        rem = K - kc * S
        slots = S + (1 if rem else 0)
        workspace = Workspace(slots * M * N, p.dtype)
        item = p.dtype.itemsize
        scratch = MatrixView(cupy_module().empty(0, p.dtype), (S, M, N), (M * N, N, 1), 0)
        chunks = _gemm_plan(a.cols(0, kc), b.rows(0, kc), scratch, S, kc * a.strides[2],
                            kc * b.strides[1], M * N)
        last = None
        if rem:
            last_view = MatrixView(scratch.buffer, (1, M, N), (0, N, 1), 0)
            last = _gemm_plan(a.cols(S * kc, K), b.rows(S * kc, K), last_view, 1, 0, 0, 0)
        a_off = S * kc * a.strides[2] * item
        b_off = S * kc * b.strides[1] * item
        reduce = _reduce_plan(slots, 0, M * N, N, p, symmetric=False, acc=p.dtype)

        get_stream = stream_getter()

        def run(pa: int, pb: int, po: int) -> None:
            stream = get_stream().ptr
            part = workspace.get(stream)[0].data.ptr
            chunks(pa, pb, part)
            if last is not None:
                last(pa + a_off, pb + b_off, part + S * M * N * item)
            reduce(stream, part, po)

        return run

    def run(self, p: Problem) -> None:
        a, b = _blas_ready(p.a), _blas_ready(p.b)
        self.bind(p.with_operands(a, b, p.out))(a.ptr, b.ptr, p.out.ptr)

    def instances(self, props: dict) -> dict[str, set[str]]:
        # the chunks, and one more for a remainder of K
        return {"skinny.cu": {splitk_reduce_expression(dt, dt, _groups(slots), False)
                              for dt in FLOAT_DTYPES
                              for slots in (self.chunks, self.chunks + 1)}}


class CublasSymBlocks(Candidate):
    """X·Xᵀ from the upper-triangular blocks only: nb(nb+1)/2 of nb² block products, each
    split over K, as one pointer-array batched cuBLAS call; ``symblock_reduce`` sums the chunks
    and mirrors. About half of the products of a full GEMM, exactly symmetric output."""

    gpu = True

    def __init__(self, block: int, waves: int):
        self.block, self.waves = block, waves
        self.name = f"cublas_symblock{block}w{waves}"
        self.summary = (f"X·Xᵀ from upper-triangular {block}-row blocks, K split so that the "
                        f"block products fill ~{waves} waves of SMs; batched cuBLAS + reduction")

    def _chunks(self, p: Problem) -> int:
        nb = -(-p.m // self.block)
        pairs = nb * (nb + 1) // 2
        return max(1, min(p.k // 32, -(-self.waves * _sm_count(p.device_id) // pairs)))

    def unavailable(self, p: Problem) -> str | None:
        if not p.symmetric:
            return "only for X·Xᵀ (b is not a.T)"
        if p.batches != 1:
            return "single products only (batches > 1)"
        if p.m < 2 * self.block:
            return f"M={p.m} < 2 blocks of {self.block}: nothing to save"
        if p.a.layout() == "S":
            return "operand has no unit stride (would need a gather first)"
        if p.k < 256:
            return f"K={p.k} too short to split"
        return blas_dims_reason(p) or _int32_reason(p)

    def bind(self, p: Problem) -> Runner:
        cp = cupy_module()
        cublas = _cublas()
        x, dt = p.a, p.dtype
        M, K, bs, S = p.m, p.k, self.block, self._chunks(p)
        nb = -(-M // bs)
        starts = [min(q * bs, M - bs) for q in range(nb)]
        pairs = [(i, j) for i in range(nb) for j in range(i, nb)]
        kc = K // S
        rem = K - kc * S
        slots = S + (1 if rem else 0)
        workspace = Workspace(slots * len(pairs) * bs * bs, dt)
        item = dt.itemsize
        sam, sak = x.strides[1], x.strides[2]
        if x.layout() == "R":
            op_p, op_q, ld = OP_T, OP_N, x.leading_dim("R")
        else:
            op_p, op_q, ld = OP_N, OP_T, x.leading_dim("C")
        gemm = cublas.sgemmBatched if dt == np.float32 else cublas.dgemmBatched
        one, zero = _ONE[dt].ctypes.data, _ZERO[dt].ctypes.data
        # Byte offsets of every block product from X and from the partials: pointer arrays are
        # these plus the call's base addresses (cached per address: the H2D copy is the cost).
        groups = []
        for s_lo, s_hi, k_len in ((0, S, kc), (S, S + 1, rem)):
            if k_len == 0:
                continue
            P, Q, C = [], [], []
            for s in range(s_lo, s_hi):
                for idx, (pi, qj) in enumerate(pairs):
                    P.append((starts[qj] * sam + s * kc * sak) * item)
                    Q.append((starts[pi] * sam + s * kc * sak) * item)
                    C.append((s * len(pairs) + idx) * bs * bs * item)
            groups.append((k_len, len(P), np.array(P, np.uint64), np.array(Q, np.uint64),
                           np.array(C, np.uint64)))
        cache: OrderedDict = OrderedDict()

        def pointer_arrays(px: int, pp: int) -> list:
            hit = cache.get((px, pp))
            if hit is None:
                hit = [(k_len, n, cp.asarray(P + np.uint64(px)), cp.asarray(Q + np.uint64(px)),
                        cp.asarray(C + np.uint64(pp))) for k_len, n, P, Q, C in groups]
                cache[(px, pp)] = hit
                if len(cache) > 16:
                    cache.popitem(last=False)
            return hit

        G = _groups(slots)
        fn = kernel("skinny.cu", symblock_reduce_expression(dt, G))
        reduce = FastLaunch(fn, (M * -(-M // (RED_THREADS // G)),), (RED_THREADS,),
                            _args(None, slots, nb, bs, M, None, p.out.strides[1],
                                  p.out.strides[2]))
        get_handle = cp.cuda.device.get_cublas_handle
        get_math, set_math = cublas.getMathMode, cublas.setMathMode

        get_stream = stream_getter()

        def run(pa: int, pb: int, po: int) -> None:
            stream = get_stream().ptr
            part = workspace.get(stream)[0].data.ptr
            handle = get_handle()
            # s/dgemmBatched take no compute type: the handle's math mode decides. CuPy's
            # shared handle is in the default mode unless someone changed it (TF32, say), so
            # the mode is set explicitly for these calls and put back after.
            mode = get_math(handle)
            if mode != CUBLAS_DEFAULT_MATH:
                set_math(handle, CUBLAS_DEFAULT_MATH)
            try:
                for k_len, count, P, Q, C in pointer_arrays(pa, part):
                    gemm(handle, op_p, op_q, bs, bs, k_len, one, P.data.ptr, ld, Q.data.ptr,
                         ld, zero, C.data.ptr, bs, count)
            finally:
                if mode != CUBLAS_DEFAULT_MATH:
                    set_math(handle, mode)
            reduce(stream, part, po)

        return run

    def run(self, p: Problem) -> None:
        self.bind(p)(p.a.ptr, p.b.ptr, p.out.ptr)

    def instances(self, props: dict) -> dict[str, set[str]]:
        # any number of K chunks (slots): both group counts of the reduction
        return {"skinny.cu": {symblock_reduce_expression(dt, g) for dt in FLOAT_DTYPES
                              for g in GROUPS}}


# ------------------------------------------------------------------------------------------
# Direct kernels
# ------------------------------------------------------------------------------------------
#: the partial-sum groups the reduction kernels are compiled for (`_groups`)
GROUPS = (4, 32)


def _groups(S: int) -> int:
    """Partial-sum groups per output in the reduction kernels: enough loads in flight per
    thread (S/G of them), enough consecutive outputs per block (256/G) to coalesce."""
    return GROUPS[0] if S <= 64 else GROUPS[1]


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def splitk_reduce_expression(acc: Any, dtype: Any, groups: int, symmetric: bool) -> str:
    """The ``splitk_reduce`` instance summing ``acc`` partials into ``dtype``."""
    return f"splitk_reduce<{ctype(acc)}, {ctype(dtype)}, {groups}, {_bool(symmetric)}>"


def symblock_reduce_expression(dtype: Any, groups: int) -> str:
    """The ``symblock_reduce`` instance for ``dtype``."""
    return f"symblock_reduce<{ctype(dtype)}, {groups}>"


def _reduce_plan(S: int, pbs: int, pss: int, ldp: int, p: Problem, symmetric: bool,
                 acc: Any) -> Callable[..., None]:
    """A launch ``f(stream, ptr_partials, ptr_out)`` summing split-K partials into ``p.out``."""
    G = _groups(S)
    fn = kernel("skinny.cu", splitk_reduce_expression(acc, p.dtype, G, symmetric))
    grid = (p.m * -(-p.n // (RED_THREADS // G)), p.batches)
    return FastLaunch(fn, grid, (RED_THREADS,),
                      _args(None, S, np.int64(pbs), np.int64(pss), ldp, p.m, p.n, None,
                            p.out.strides))


def _args(*spec: Any) -> list:
    """FastLaunch argument specs: None -> an address given per call; MatrixView strides and
    ints -> int32 constants."""
    out = []
    for x in spec:
        if x is None:
            out.append(("ptr", None))
        elif isinstance(x, tuple):
            out.extend(("i32", int(v)) for v in x)
        elif isinstance(x, np.int64):
            out.append(("i64", int(x)))
        else:
            out.append(("i32", int(x)))
    return out


class _Direct(Candidate):
    gpu = True

    def run(self, p: Problem) -> None:
        self.bind(p)(p.a.ptr, p.b.ptr, p.out.ptr)

    def __init__(self, acc: str = "same"):
        self.acc = acc  # "same": accumulate in the operands' dtype; "f64": in float64

    def _acc_dtype(self, p: Problem) -> Any:
        return np.float64 if self.acc == "f64" else p.dtype

    def _dtypes(self) -> list[tuple[np.dtype, np.dtype]]:
        """(operand dtype, accumulator dtype) of the products this candidate can run."""
        if self.acc == "f64":
            return [(np.dtype(np.float32), np.dtype(np.float64))]
        return [(dt, dt) for dt in FLOAT_DTYPES]

    def _acc_reason(self, p: Problem) -> str | None:
        if self.acc == "f64":
            if p.dtype != np.float32:
                return "float64 accumulation variant is for float32 operands"
            ratio = _fp64_ratio(p.device_id)
            if ratio > 2:
                return f"float64 runs at 1/{ratio} of the float32 rate on this device"
        return None

    def _suffix(self) -> str:
        return "_f64acc" if self.acc == "f64" else ""


class GramSmall(_Direct):
    """Tiny outputs (M, N ≤ 8) with long K: one launch, split-K, last CTA reduces."""

    MAX = 8

    def __init__(self, acc: str = "same"):
        super().__init__(acc)
        self.name = "direct_gram_small" + self._suffix()
        self.summary = ("direct kernel for outputs up to 8x8: split-K over CTAs, last CTA "
                        "reduces (one launch)" + (", float64 accumulation" if acc == "f64" else ""))

    def unavailable(self, p: Problem) -> str | None:
        if p.m > self.MAX or p.n > self.MAX:
            return f"output {p.m}x{p.n} larger than {self.MAX}x{self.MAX}"
        if p.batches > 65535:
            return "more than 65535 batches"
        return self._acc_reason(p) or _int32_reason(p)

    def bind(self, p: Problem) -> Runner:
        _check32(p)
        acc = self._acc_dtype(p)
        M, N, K, B = p.m, p.n, p.k, p.batches
        sym = p.symmetric and M == N
        S = max(1, min(64, -(-K // GS_STEP)))           # a whole step of the block each
        kchunk = -(-K // S)
        S = -(-K // kchunk)
        md = _pow2_at_least(max(M, N), 1)
        fn = kernel("skinny.cu", self.expression(p.dtype, acc, md, sym))
        workspace = Workspace(B * S * md * md, acc, counters=B)
        launch = FastLaunch(fn, (S, B), (GS_THREADS,),
                            _args(None, p.a.strides, None, p.b.strides, M, N, K, kchunk,
                                  None, None, None, p.out.strides))

        get_stream = stream_getter()

        def run(pa: int, pb: int, po: int) -> None:
            stream = get_stream().ptr
            part, count = workspace.get(stream)
            launch(stream, pa, pb, part.data.ptr, count.data.ptr, po)

        return run

    @staticmethod
    def expression(dtype: Any, acc: Any, md: int, symmetric: bool) -> str:
        """The ``gram_small`` instance for outputs of up to ``md`` x ``md``."""
        return f"gram_small<{ctype(dtype)}, {ctype(acc)}, {md}, {_bool(symmetric)}>"

    def instances(self, props: dict) -> dict[str, set[str]]:
        return {"skinny.cu": {self.expression(dt, acc, md, sym) for dt, acc in self._dtypes()
                              for md in (1, 2, 4, 8) for sym in (False, True)}}


class GramTiled(_Direct):
    """Outputs up to 64x64 with long K: 64x64 register-tiled CTAs over K-chunks, then a
    deterministic reduction. X·Xᵀ computes only the upper triangle of thread tiles."""

    MAX = GT_TILE

    def __init__(self, ctas_per_sm: int = 4, acc: str = "same", min_blocks: int = 1):
        super().__init__(acc)
        self.ctas_per_sm, self.min_blocks = ctas_per_sm, min_blocks
        self.name = (f"direct_gram_tiled{ctas_per_sm}" + self._suffix()
                     + (f"_o{min_blocks}" if min_blocks > 1 else ""))
        self.summary = (f"direct 64x64-tile kernel, K split over ~{ctas_per_sm} CTAs per SM, "
                        f"+ reduction kernel" + (", float64 accumulation" if acc == "f64" else ""))

    def unavailable(self, p: Problem) -> str | None:
        if p.m > self.MAX or p.n > self.MAX:
            return f"output {p.m}x{p.n} larger than {self.MAX}x{self.MAX}"
        if p.batches > 65535:
            return "more than 65535 batches"
        return self._acc_reason(p) or _int32_reason(p)

    def bind(self, p: Problem) -> Runner:
        _check32(p)
        acc = self._acc_dtype(p)
        M, N, K, B = p.m, p.n, p.k, p.batches
        sym = p.symmetric and M == N
        target = max(1, self.ctas_per_sm * _sm_count(p.device_id) // B)
        S = max(1, min(target, -(-K // 128)))
        kchunk = -(-(-(-K // S)) // 32) * 32
        S = max(1, -(-K // kchunk))
        fn = kernel("skinny.cu", self.expression(p.dtype, acc, sym))
        tile = GT_TILE * GT_TILE
        workspace = Workspace(B * S * tile, acc)
        reduce = _reduce_plan(S, S * tile, tile, GT_TILE, p, symmetric=sym, acc=acc)
        launch = FastLaunch(fn, (S, B), (GT_SYM_THREADS if sym else GT_THREADS,),
                            _args(None, p.a.strides, None, p.b.strides, M, N, K, kchunk, None))

        get_stream = stream_getter()

        def run(pa: int, pb: int, po: int) -> None:
            stream = get_stream().ptr
            part = workspace.get(stream)[0].data.ptr
            launch(stream, pa, pb, part)
            reduce(stream, part, po)

        return run

    def expression(self, dtype: Any, acc: Any, symmetric: bool) -> str:
        """The ``gram_tiled`` instance."""
        return (f"gram_tiled<{ctype(dtype)}, {ctype(acc)}, {_bool(symmetric)}, "
                f"{self.min_blocks}>")

    def instances(self, props: dict) -> dict[str, set[str]]:
        # with the reduction of any number of K chunks
        return {"skinny.cu": {e for dt, acc in self._dtypes() for sym in (False, True)
                              for e in (self.expression(dt, acc, sym),
                                        *(splitk_reduce_expression(acc, dt, g, sym)
                                          for g in GROUPS))}}


class _SmallLeft(_Direct):
    """Direct kernels for a small left operand W·X; they take the mirrored shape X·W too, as
    outᵀ = Wᵀ·Xᵀ (views only, nothing copied). Subclasses say in `_fits` what they need."""

    def _fits(self, p: Problem) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError

    def orient(self, p: Problem) -> Problem | None:
        """``p`` or its mirror, whichever this kernel can run; None if neither."""
        if self._fits(p) is None:
            return p
        t = p.transposed()
        return t if self._fits(t) is None else None

    def unavailable(self, p: Problem) -> str | None:
        if p.batches > 65535:
            return "more than 65535 batches"
        if self.orient(p) is None:
            return self._fits(p) + "; mirrored: " + self._fits(p.transposed())
        return _int32_reason(p)


class WxDirect(_SmallLeft):
    """Small left operand W [M ≤ 64, K ≤ 256] times a wide X: spatial filters, projections.
    Also takes the mirrored shape X·W (via outᵀ = Wᵀ·Xᵀ, no copy)."""

    MAX_M = 64
    MAX_ACC = 128  # accumulators per thread (registers)
    SMEM = 48 * 1024

    def __init__(self, cols_per_thread: int = 1):
        super().__init__("same")
        self.cpt = cols_per_thread
        self.name = f"direct_wx{cols_per_thread}"
        self.summary = (f"direct kernel for small W·X: W staged in shared memory, "
                        f"{cols_per_thread} column(s) per thread, one launch")

    def _fits(self, p: Problem) -> str | None:
        return self._fits_shape(p.m, p.k, p.dtype)

    def _fits_shape(self, m: int, k: int, dtype: Any) -> str | None:
        mm = _pow2_at_least(m, 4)
        if m > self.MAX_M:
            return f"{m} output rows > {self.MAX_M}"
        if mm * self.cpt > self.MAX_ACC:
            return f"{mm} rows x {self.cpt} columns per thread > {self.MAX_ACC} accumulators"
        if mm * k * np.dtype(dtype).itemsize > self.SMEM:
            return f"W [{m},{k}] does not fit in {self.SMEM // 1024} KiB of shared memory"
        return None

    def expression(self, dtype: Any, mm: int) -> str:
        """The ``wx_direct`` instance for W of up to ``mm`` rows."""
        return f"wx_direct<{ctype(dtype)}, {mm}, {self.cpt}>"

    def instances(self, props: dict) -> dict[str, set[str]]:
        return {"skinny.cu": {self.expression(dt, _pow2_at_least(m, 4)) for dt in FLOAT_DTYPES
                              for m in range(1, self.MAX_M + 1)
                              if self._fits_shape(m, 1, dt) is None}}

    def bind(self, p: Problem) -> Runner:
        q = self.orient(p)
        _check32(q)
        mirrored = q is not p
        M, K, N, B = q.m, q.k, q.n, q.batches
        mm = _pow2_at_least(M, 4)
        fn = kernel("skinny.cu", self.expression(q.dtype, mm))
        launch = FastLaunch(fn, (-(-N // (WXD_THREADS * self.cpt)), B), (WXD_THREADS,),
                            _args(None, q.a.strides, None, q.b.strides, M, K, N, None,
                                  q.out.strides), shared_mem=mm * K * q.dtype.itemsize)

        get_stream = stream_getter()

        def run(pa: int, pb: int, po: int) -> None:
            if mirrored:
                pa, pb = pb, pa
            launch(get_stream().ptr, pa, pb, po)

        return run


class WxVec(_SmallLeft):
    """Small W [M ≤ 64] times a wide X with unit column stride: 4 consecutive columns per
    thread (16-byte loads/stores), rows split over ``slices`` warp groups of 64 threads."""

    SMEM = 48 * 1024
    MAX_M = 64

    def __init__(self, slices: int, unroll: int):
        super().__init__("same")
        self.slices, self.unroll = slices, unroll
        self.name = f"direct_wxv{slices}k{unroll}"
        self.summary = (f"direct kernel for small W·X, 4 columns per thread with 16-byte "
                        f"loads, {unroll} rows of X in flight, rows over {slices} slice(s), "
                        f"one launch")

    def _rows_per_slice(self, m: int) -> int:
        return _pow2_at_least(-(-m // self.slices), 4)

    def _fits_shape(self, m: int, k: int, dtype: Any) -> str | None:
        mt = self._rows_per_slice(m)
        if m > self.MAX_M or mt > 32:
            return f"{m} rows > {32 * self.slices} for {self.slices} slice(s)"
        if mt * (self.slices - 1) >= m:
            return f"{m} rows leave a slice empty"
        if mt * self.slices * k * np.dtype(dtype).itemsize > self.SMEM:
            return f"W [{m},{k}] does not fit in {self.SMEM // 1024} KiB of shared memory"
        return None

    def expression(self, dtype: Any, mt: int) -> str:
        """The ``wx_vec`` instance for ``mt`` rows per slice."""
        return f"wx_vec<{ctype(dtype)}, {mt}, {self.slices}, {self.unroll}>"

    def instances(self, props: dict) -> dict[str, set[str]]:
        return {"skinny.cu": {self.expression(dt, self._rows_per_slice(m))
                              for dt in FLOAT_DTYPES for m in range(1, self.MAX_M + 1)
                              if self._fits_shape(m, 1, dt) is None}}

    def _fits(self, p: Problem) -> str | None:
        reason = self._fits_shape(p.m, p.k, p.dtype)
        if reason:
            return reason
        x, out = p.b, p.out
        if x.strides[2] != 1 or out.strides[2] != 1:
            return "needs unit column stride in X and out"
        if x.strides[1] % 4 or out.strides[1] % 4 or (p.batches > 1 and (x.strides[0] % 4 or
                                                                           out.strides[0] % 4)):
            return "needs row strides that are multiples of 4 (16-byte aligned rows)"
        if x.ptr % 16 or out.ptr % 16:
            return "X or out does not start on a 16-byte boundary"
        return None

    def bind(self, p: Problem) -> Runner:
        q = self.orient(p)
        _check32(q)
        mirrored = q is not p
        M, K, N, B = q.m, q.k, q.n, q.batches
        mt = self._rows_per_slice(M)
        fn = kernel("skinny.cu", self.expression(q.dtype, mt))
        launch = FastLaunch(fn, (-(-N // (4 * WXV_THREADS)), B), (WXV_THREADS, self.slices),
                            _args(None, q.a.strides, None, q.b.strides[:2], M, K, N, None,
                                  q.out.strides[:2]),
                            shared_mem=mt * self.slices * K * q.dtype.itemsize)

        get_stream = stream_getter()

        def run(pa: int, pb: int, po: int) -> None:
            if mirrored:
                pa, pb = pb, pa
            launch(get_stream().ptr, pa, pb, po)

        return run


class WxTile(_SmallLeft):
    """Small W [M ≤ 64] times a wide X with unit column stride, as a register-tiled GEMM in
    persistent CTAs (``wx_tile`` in kernels/wx_tile.cu): W staged once per CTA, column tiles of X
    streamed through a ``stages``-deep cp.async pipeline, 8 rows x ``col_vecs`` 16-byte column
    vectors per thread, register fragments double-buffered across k (one barrier per k-chunk,
    before its last k), registers capped by ``__launch_bounds__`` so that ``warps`` fit.

    Parameters
    ----------
    tile_vecs : int
        Columns per tile, in 16-byte vectors (32: 128 float32 or 64 float64 columns).
    col_vecs : int
        16-byte column vectors per thread (1 or 2).
    stages : int
        Pipeline depth: k-chunks of X in shared memory (``stages - 1`` in flight while one is
        multiplied; at least 3: ``stages - 2`` ahead, one read, one being filled).
    warps : int
        Resident warps per SM asked for; CTAs per SM = ``warps`` / warps per CTA, capped by
        what the shared memory allows, and the grid is that many per SM (at most one CTA per
        tile). The kernel's ``__launch_bounds__`` asks for that many CTAs, so the compiler
        keeps the registers within 65536 / (32 * ``warps``) per thread (128 for 16 warps).
    stage_bytes : int
        Bytes of X per pipeline stage (k-chunk rows = stage_bytes / tile width in bytes).
    """

    MAX_M = 64
    #: bytes of X per pipeline stage: k-chunk rows = STAGE_BYTES / (tile width in bytes). 8 KiB
    #: keeps ~48 KiB of loads in flight per SM at 2 CTAs x 3 stages, about what it takes to
    #: cover the H200's DRAM latency at its copy rate (4.1 TB/s x ~1.5 µs / 132 SMs)
    STAGE_BYTES = 8 << 10
    #: larger CTAs leave fewer than 64 registers per thread at one CTA per SM
    MAX_THREADS = 512

    def __init__(self, tile_vecs: int, col_vecs: int, stages: int, warps: int,
                 stage_bytes: int = STAGE_BYTES):
        super().__init__("same")
        if stages < 3:
            raise ValueError("wx_tile needs at least 3 pipeline stages")
        self.tile_vecs, self.col_vecs, self.stages, self.warps = tile_vecs, col_vecs, stages, warps
        self.stage_bytes = stage_bytes
        self.name = f"direct_wxtile{tile_vecs}c{col_vecs}s{stages}w{warps}"
        self.summary = (f"direct register-tiled kernel for small W·X: persistent CTAs, W in "
                        f"shared memory, {tile_vecs}x16-byte column tiles through a {stages}-stage "
                        f"cp.async pipeline, 8 rows x {col_vecs}x16 bytes per thread, ~{warps} "
                        f"warps per SM, one launch")

    def _geometry(self, m: int, k: int, dtype: Any) -> tuple[int, int, int, int, int, int]:
        """(MM rows per tile, TN columns per tile, TC columns per thread, KC rows per k-chunk
        (even), threads per CTA, dynamic shared memory in bytes) for an [m, k] W of ``dtype``."""
        item = np.dtype(dtype).itemsize
        ve = 16 // item
        mm = _pow2_at_least(m, WT_TM)
        tn, tc = self.tile_vecs * ve, self.col_vecs * ve
        kc = max(4, min(self.stage_bytes // (self.tile_vecs * 16), _pow2_at_least(k, 4)))
        kp = max(1, -(-k // kc)) * kc
        threads = (mm // WT_TM) * (self.tile_vecs // self.col_vecs)
        smem = (self.stages * kc * tn + kp * (mm + ve)) * item
        return mm, tn, tc, kc, threads, smem

    def _min_blocks(self, threads: int, smem: int, optin: int) -> int:
        """CTAs per SM the kernel's ``__launch_bounds__`` asks registers for: those ``warps``
        asks for, no more than the shared memory lets reside (an SM has the per-block opt-in
        limit ``optin`` plus 1 KiB, and each CTA reserves 1 KiB), so no register is given up
        for CTAs that cannot be there."""
        fit = (optin + 1024) // (smem + 1024)
        return max(1, min(self.warps * 32 // threads, fit))

    def _fits_shape(self, m: int, k: int, dtype: Any, optin: int) -> str | None:
        """Why an [m, k] W of ``dtype`` cannot run with a shared-memory opt-in of ``optin``
        bytes (None if it can; X's layout aside)."""
        if m > self.MAX_M:
            return f"{m} output rows > {self.MAX_M}"
        mm, tn, _, _, threads, smem = self._geometry(m, k, dtype)
        lanes = 32 // min(mm // WT_TM, 4)  # columns of lanes in a warp (kernel: WC)
        if (self.tile_vecs // self.col_vecs) % lanes or threads > 1024:
            return (f"{tn}-column tiles of {self.col_vecs} vector(s) per thread do not make "
                    f"whole warps for {mm} rows")
        if threads > self.MAX_THREADS:
            return (f"{threads} threads per CTA for {mm} rows (more than {self.MAX_THREADS}: "
                    f"too few registers per thread for the 8-row tile)")
        if smem > optin:
            return (f"W [{m},{k}] and {self.stages} stages need {smem} bytes of shared "
                    f"memory, more than the {optin} a block may use")
        return None

    def expression(self, dtype: Any, m: int, k: int, optin: int) -> str:
        """The ``wx_tile`` instance for an [m, k] W of ``dtype`` on a device whose blocks may
        opt in to ``optin`` bytes of shared memory."""
        mm, tn, tc, kc, threads, smem = self._geometry(m, k, dtype)
        minb = self._min_blocks(threads, smem, optin)
        return f"wx_tile<{ctype(dtype)}, {mm}, {tn}, {tc}, {kc}, {self.stages}, {minb}>"

    def instances(self, props: dict) -> dict[str, set[str]]:
        """Every W that fits: the geometry depends on m through its row class (8, 16, 32, 64:
        WT_TM times a power of two) and on k through the k-chunk and its padded length, so
        one m per class and one k per padded length cover them all (the shared memory, and so
        the CTAs per SM, only grow with k)."""
        optin = _optin(props)
        final = max(4, self.stage_bytes // (self.tile_vecs * 16))   # the k-chunk of long K
        found = set()
        for dt in FLOAT_DTYPES:
            for m in (r for r in (WT_TM << i for i in range(8)) if r <= self.MAX_M):
                k = 1
                while self._fits_shape(m, k, dt, optin) is None:
                    found.add(self.expression(dt, m, k, optin))
                    k = k + 1 if k < final else (k // final + 1) * final
        return {"wx_tile.cu": found}

    def _fits(self, p: Problem) -> str | None:
        optin = _smem_optin(p.device_id)
        reason = self._fits_shape(p.m, p.k, p.dtype, optin)
        if reason:
            return reason
        x, out, item = p.b, p.out, p.dtype.itemsize
        ve = 16 // item
        if x.strides[2] != 1 or out.strides[2] != 1:
            return "needs unit column stride in X and out"
        if x.strides[1] % ve or out.strides[1] % ve or (p.batches > 1 and (x.strides[0] % ve or
                                                                           out.strides[0] % ve)):
            return f"needs row strides that are multiples of {ve} (16-byte aligned rows)"
        if x.ptr % 16 or out.ptr % 16:
            return "X or out does not start on a 16-byte boundary"
        return None

    def launch_config(self, p: Problem) -> dict:
        """How `bind` launches ``p`` (in the orientation this kernel runs): the template
        expression, grid, threads, shared memory, CTAs per SM and registers per thread."""
        q = self.orient(p)
        if q is None:
            raise ValueError(f"{self.name} cannot run this product: {self.unavailable(p)}")
        M, K, N, B = q.m, q.k, q.n, q.batches
        mm, tn, tc, kc, threads, smem = self._geometry(M, K, q.dtype)
        expr = self.expression(q.dtype, M, K, _smem_optin(q.device_id))
        fn = kernel("wx_tile.cu", expr)
        if smem > 48 << 10 and fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        from cupy_backends.cuda.api import driver  # noqa: PLC0415 (lazy: needs CuPy)

        fit = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, smem)
        if fit < 1:
            raise RuntimeError(f"{expr}: no CTA of {threads} threads and {smem} bytes of shared "
                               f"memory fits on an SM ({fn.num_regs} registers per thread)")
        per_sm = max(1, min(fit, self.warps // (threads // 32)))
        # Persistent: one wave of CTAs, each looping over tiles first, first + grid, ...; the
        # batches share the wave (a CTA stages the W of its own batch only).
        tiles = -(-N // tn)
        grid_x = max(1, min(tiles, -(-per_sm * _sm_count(q.device_id) // max(B, 1))))
        return {"expression": expr, "fn": fn, "grid": (grid_x, B), "threads": threads,
                "smem": smem, "ctas_per_sm": per_sm, "registers": fn.num_regs, "tile": tn,
                "k_chunk": kc, "mirrored": q is not p}

    def bind(self, p: Problem) -> Runner:
        q = self.orient(p)
        _check32(q)
        cfg = self.launch_config(q)
        mirrored = q is not p
        launch = FastLaunch(cfg["fn"], cfg["grid"], (cfg["threads"],),
                            _args(None, q.a.strides, None, q.b.strides[:2], q.m, q.k, q.n, None,
                                  q.out.strides[:2]), shared_mem=cfg["smem"])

        get_stream = stream_getter()

        def run(pa: int, pb: int, po: int) -> None:
            if mirrored:
                pa, pb = pb, pa
            launch(get_stream().ptr, pa, pb, po)

        return run


#: the ranks of cuBLASLt's heuristic timed as candidates (measured on an H200: for
#: 64 x 64 x 60 000 float32 rank 1 beats rank 0; beyond rank 3 none came close)
LT_RANKS = 4


def gpu_candidates() -> list[Candidate]:
    """All GPU candidates, in the order used when tuning is off (first available wins)."""
    return [
        GramSmall(), GramSmall("f64"),
        WxVec(1, 16), WxVec(2, 16), WxVec(4, 16), WxVec(2, 8), WxVec(4, 8), WxVec(1, 4),
        WxVec(4, 4),
        WxTile(32, 2, 4, 16), WxTile(64, 2, 4, 16), WxTile(32, 2, 4, 12),
        WxTile(128, 1, 6, 16, stage_bytes=16 << 10),
        WxDirect(1), WxDirect(2), WxDirect(4),
        GramTiled(2), GramTiled(1), GramTiled(4), GramTiled(2, min_blocks=3),
        GramTiled(4, min_blocks=3), GramTiled(2, "f64"),
        CublasGemm(), *(CublasLtGemm(r) for r in range(LT_RANKS)),
        CublasSymBlocks(128, 2), CublasSymBlocks(128, 4), CublasSymBlocks(96, 2),
        CublasSymBlocks(192, 2), CublasSymBlocks(192, 4), CublasSymBlocks(64, 2),
        CublasSymBlocks(64, 4), CublasSymBlocks(32, 2),
        CublasSplitK(16), CublasSplitK(64),
    ]


def _instances(filename: str) -> Callable[[dict], set[str]]:
    """The kernels of ``filename`` the GPU candidates can request."""
    return lambda props: instances_of(gpu_candidates(), filename, props)


declare_instances("skinny.cu", _instances("skinny.cu"))
declare_instances("wx_tile.cu", _instances("wx_tile.cu"))
