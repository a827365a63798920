"""GPU candidates: cuBLAS (plain, split-K, symmetric blocks) and the direct kernels of
``kernels/skinny.cu``. Each says why it cannot run a problem, rather than failing.

cuBLAS is called through CuPy's thin wrappers with the compute type passed explicitly
(CUBLAS_COMPUTE_32F / 64F: never TF32, whatever CuPy's or the handle's default).
"""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache
from typing import Any

import numpy as np

from ..backend import cupy_module, device_properties
from .kernels import counters, ctype, grid_1d, kernel
from .problem import Candidate, Problem, copy_into, scratch_like
from .view import INT32_MAX, MatrixView

# cuBLAS / CUDA enums (CuPy lacks some; values from cublas_api.h / library_types.h).
CUDA_R_32F, CUDA_R_64F = 0, 1
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F = 68, 70
CUBLAS_GEMM_DEFAULT = -1
OP_N, OP_T = 0, 1
_DATA_TYPE = {np.dtype(np.float32): CUDA_R_32F, np.dtype(np.float64): CUDA_R_64F}
_COMPUTE_TYPE = {np.dtype(np.float32): CUBLAS_COMPUTE_32F, np.dtype(np.float64): CUBLAS_COMPUTE_64F}
_ONE = {np.dtype(t): np.ones(1, t) for t in (np.float32, np.float64)}
_ZERO = {np.dtype(t): np.zeros(1, t) for t in (np.float32, np.float64)}
_ATTR_FP32_TO_FP64_RATIO = 87  # cudaDevAttrSingleToDoublePrecisionPerfRatio


def _cublas() -> Any:
    cupy_module()
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415 (lazy: needs CuPy)

    return cublas


def _handle() -> int:
    return cupy_module().cuda.device.get_cublas_handle()


@lru_cache(maxsize=None)
def _fp64_ratio(device_id: int) -> int:
    return int(cupy_module().cuda.runtime.deviceGetAttribute(_ATTR_FP32_TO_FP64_RATIO, device_id))


def _sm_count(device_id: int) -> int:
    return int(device_properties(device_id)["multiProcessorCount"])


def _u64(v: MatrixView) -> np.uint64:
    return np.uint64(v.ptr)


def _i32(*xs: int) -> tuple:
    return tuple(np.int32(x) for x in xs)


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


def _gemm_batched(a: MatrixView, b: MatrixView, out: MatrixView, batches: int,
                  stride_a: int, stride_b: int, stride_out: int) -> None:
    """``out = a·b`` for ``batches`` matrices through gemmStridedBatchedEx. ``out`` must be R or
    C layout; ``a``, ``b`` R or C. Strides in elements between consecutive batches."""
    cublas = _cublas()
    dt = a.dtype
    target = out.layout()
    M, K = a.shape[1], a.shape[2]
    N = b.shape[2]
    if target == "R":
        first, second, m, n = b, a, N, M
    else:
        first, second, m, n = a, b, M, N
    la, lb = first.layout(), second.layout()
    op_a = OP_N if la == target else OP_T
    op_b = OP_N if lb == target else OP_T
    cublas.gemmStridedBatchedEx(
        _handle(), op_a, op_b, m, n, K,
        _ONE[dt].ctypes.data, first.ptr, _DATA_TYPE[dt], first.leading_dim(la),
        stride_b if first is b else stride_a,
        second.ptr, _DATA_TYPE[dt], second.leading_dim(lb),
        stride_a if second is a else stride_b,
        _ZERO[dt].ctypes.data, out.ptr, _DATA_TYPE[dt], out.leading_dim(target), stride_out,
        batches, _COMPUTE_TYPE[dt], CUBLAS_GEMM_DEFAULT)


def _blas_dims_reason(p: Problem) -> str | None:
    if max(p.m, p.n, p.k, p.batches) > INT32_MAX:
        return "a dimension exceeds cuBLAS's 32-bit sizes"
    return None


class CublasGemm(Candidate):
    name = "cublas"
    gpu = True
    summary = "cuBLAS gemmStridedBatchedEx, compute type 32F/64F passed explicitly"

    def unavailable(self, p: Problem) -> str | None:
        return _blas_dims_reason(p)

    def run(self, p: Problem) -> None:
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
        return _blas_dims_reason(p) or _int32_reason(p)

    def run(self, p: Problem) -> None:
        cp = cupy_module()
        a, b = _blas_ready(p.a), _blas_ready(p.b)
        M, N, K, S = p.m, p.n, p.k, self.chunks
        kc = K // S
        rem = K - kc * S
        slots = S + (1 if rem else 0)
        part = cp.empty(slots * M * N, dtype=p.dtype)
        pv = MatrixView(part, (S, M, N), (M * N, N, 1), 0, "partials")
        _gemm_batched(a.cols(0, kc), b.rows(0, kc), pv, S, kc * a.strides[2],
                      kc * b.strides[1], M * N)
        if rem:
            last = MatrixView(part, (1, M, N), (0, N, 1), S * M * N, "partials")
            _gemm_batched(a.cols(S * kc, K), b.rows(S * kc, K), last, 1, 0, 0, 0)
        _reduce_partials(part, slots, 0, M * N, N, p, symmetric=False, acc=p.dtype)


class CublasSymBlocks(Candidate):
    """X·Xᵀ from the upper-triangular blocks only: nb(nb+1)/2 of nb² block products, each
    split over K, as one pointer-array batched cuBLAS call; ``symblock_reduce`` sums the chunks
    and mirrors. About half of the products of a full GEMM, exactly symmetric output."""

    gpu = True

    def __init__(self, block: int, chunks: int):
        self.block, self.chunks = block, chunks
        self.name = f"cublas_symblock{block}x{chunks}"
        self.summary = (f"X·Xᵀ from upper-triangular {block}-row blocks, {chunks} K-chunks, "
                        f"batched cuBLAS + reduction kernel")
        self._pointers: OrderedDict = OrderedDict()

    def unavailable(self, p: Problem) -> str | None:
        if not p.symmetric:
            return "only for X·Xᵀ (b is not a.T)"
        if p.batches != 1:
            return "single products only (batches > 1)"
        if p.m < 2 * self.block:
            return f"M={p.m} < 2 blocks of {self.block}: nothing to save"
        if p.a.layout() == "S":
            return "operand has no unit stride (would need a gather first)"
        if p.k < 32 * self.chunks:
            return f"K={p.k} too short for {self.chunks} chunks"
        return _blas_dims_reason(p) or _int32_reason(p)

    def _pointer_arrays(self, x: MatrixView, M: int, K: int, part_ptr: int) -> tuple:
        cp = cupy_module()
        key = (cp.cuda.runtime.getDevice(), x.ptr, x.strides, M, K, part_ptr)
        hit = self._pointers.get(key)
        if hit is not None:
            self._pointers.move_to_end(key)
            return hit
        bs, S, item = self.block, self.chunks, x.itemsize
        nb = -(-M // bs)
        starts = [min(q * bs, M - bs) for q in range(nb)]
        pairs = [(p_, q) for p_ in range(nb) for q in range(p_, nb)]
        kc = K // S
        rem = K - kc * S
        sam, sak = x.strides[1], x.strides[2]
        groups = []
        for s_lo, s_hi, k_len in ((0, S, kc), (S, S + 1, rem)):
            if k_len == 0 or s_hi <= s_lo:
                continue
            P, Q, C = [], [], []
            for s in range(s_lo, s_hi):
                k0 = s * kc
                for idx, (pb, qb) in enumerate(pairs):
                    P.append(x.ptr + (starts[qb] * sam + k0 * sak) * item)
                    Q.append(x.ptr + (starts[pb] * sam + k0 * sak) * item)
                    C.append(part_ptr + ((s * len(pairs) + idx) * bs * bs) * item)
            arrs = [cp.asarray(np.array(v, dtype=np.uint64)) for v in (P, Q, C)]
            groups.append((k_len, len(P), arrs))
        hit = (nb, len(pairs), groups)
        self._pointers[key] = hit
        if len(self._pointers) > 32:
            self._pointers.popitem(last=False)
        return hit

    def run(self, p: Problem) -> None:
        cp = cupy_module()
        cublas = _cublas()
        x = p.a
        M, K, bs, S = p.m, p.k, self.block, self.chunks
        nb = -(-M // bs)
        npairs = nb * (nb + 1) // 2
        slots = S + (1 if K % S else 0)
        part = self._workspace(cp, slots * npairs * bs * bs, p.dtype)
        _, _, groups = self._pointer_arrays(x, M, K, part.data.ptr)
        if x.layout() == "R":
            op_p, op_q, ld = OP_T, OP_N, x.leading_dim("R")
        else:
            op_p, op_q, ld = OP_N, OP_T, x.leading_dim("C")
        gemm = cublas.sgemmBatched if p.dtype == np.float32 else cublas.dgemmBatched
        dt = p.dtype
        for k_len, count, (P, Q, C) in groups:
            gemm(_handle(), op_p, op_q, bs, bs, k_len, _ONE[dt].ctypes.data, P.data.ptr, ld,
                 Q.data.ptr, ld, _ZERO[dt].ctypes.data, C.data.ptr, bs, count)
        out = p.out
        fn = kernel("skinny.cu", f"symblock_reduce<{ctype(dt)}>")
        fn(grid_1d(M * M, cap=2**31 - 1), (256,),
           (part, *_i32(slots, nb, bs, M), _u64(out), *_i32(out.strides[1], out.strides[2])))

    def _workspace(self, cp: Any, size: int, dtype: Any) -> Any:
        # Kept between calls so that the cached pointer arrays stay valid; reuse on one stream
        # is ordered by the stream, and a resize drops the pointer cache.
        key = (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr, np.dtype(dtype))
        ws = getattr(self, "_ws", {})
        buf = ws.get(key)
        if buf is None or buf.size < size:
            buf = cp.empty(size, dtype=dtype)
            ws[key] = buf
            self._ws = ws
            self._pointers.clear()
        return buf


# ------------------------------------------------------------------------------------------
# Direct kernels
# ------------------------------------------------------------------------------------------
def _reduce_partials(part: Any, S: int, pbs: int, pss: int, ldp: int, p: Problem,
                     symmetric: bool, acc: Any) -> None:
    out = p.out
    G = 32 if S >= 16 else 1
    fn = kernel("skinny.cu", f"splitk_reduce<{ctype(acc)}, {ctype(p.dtype)}, {G}, "
                             f"{'true' if symmetric else 'false'}>")
    total = p.batches * p.m * p.n * G
    fn(grid_1d(total, cap=2**31 - 1), (256,),
       (part, np.int32(S), np.int64(pbs), np.int64(pss), np.int32(ldp),
        *_i32(p.batches, p.m, p.n), _u64(out), *_i32(*out.strides)))


class _Direct(Candidate):
    gpu = True

    def __init__(self, acc: str = "same"):
        self.acc = acc  # "same": accumulate in the operands' dtype; "f64": in float64

    def _acc_dtype(self, p: Problem) -> Any:
        return np.float64 if self.acc == "f64" else p.dtype

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

    def run(self, p: Problem) -> None:
        cp = cupy_module()
        _check32(p)
        acc = self._acc_dtype(p)
        M, N, K, B = p.m, p.n, p.k, p.batches
        sym = p.symmetric and M == N
        S = max(1, min(64, -(-K // 1024)))
        kchunk = -(-K // S)
        S = -(-K // kchunk)
        md = _pow2_at_least(max(M, N), 1)
        part = cp.empty(B * S * md * md, dtype=acc)
        fn = kernel("skinny.cu", f"gram_small<{ctype(p.dtype)}, {ctype(acc)}, {md}, "
                                 f"{'true' if sym else 'false'}>")
        a, b, out = p.a, p.b, p.out
        fn((S, B), (256,), (_u64(a), *_i32(*a.strides), _u64(b), *_i32(*b.strides),
                            *_i32(M, N, K, kchunk), part, counters(B),
                            _u64(out), *_i32(*out.strides)))


class GramTiled(_Direct):
    """Outputs up to 64x64 with long K: 64x64 register-tiled CTAs over K-chunks, then a
    deterministic reduction. X·Xᵀ computes only the upper triangle of thread tiles."""

    MAX = 64

    def __init__(self, ctas_per_sm: int = 4, acc: str = "same"):
        super().__init__(acc)
        self.ctas_per_sm = ctas_per_sm
        self.name = f"direct_gram_tiled{ctas_per_sm}" + self._suffix()
        self.summary = (f"direct 64x64-tile kernel, K split over ~{ctas_per_sm} CTAs per SM, "
                        f"+ reduction kernel" + (", float64 accumulation" if acc == "f64" else ""))

    def unavailable(self, p: Problem) -> str | None:
        if p.m > self.MAX or p.n > self.MAX:
            return f"output {p.m}x{p.n} larger than {self.MAX}x{self.MAX}"
        if p.batches > 65535:
            return "more than 65535 batches"
        return self._acc_reason(p) or _int32_reason(p)

    def run(self, p: Problem) -> None:
        cp = cupy_module()
        _check32(p)
        acc = self._acc_dtype(p)
        M, N, K, B = p.m, p.n, p.k, p.batches
        sym = p.symmetric and M == N
        target = max(1, self.ctas_per_sm * _sm_count(p.device_id) // B)
        S = max(1, min(target, -(-K // 128)))
        kchunk = -(-(-(-K // S)) // 32) * 32
        S = max(1, -(-K // kchunk))
        part = cp.empty(B * S * 64 * 64, dtype=acc)
        fn = kernel("skinny.cu", f"gram_tiled<{ctype(p.dtype)}, {ctype(acc)}, "
                                 f"{'true' if sym else 'false'}>")
        a, b = p.a, p.b
        fn((S, B), (160 if sym else 256,),
           (_u64(a), *_i32(*a.strides), _u64(b), *_i32(*b.strides), *_i32(M, N, K, kchunk), part))
        _reduce_partials(part, S, S * 4096, 4096, 64, p, symmetric=sym, acc=acc)


class WxDirect(_Direct):
    """Small left operand W [M ≤ 64, K ≤ 256] times a wide X: spatial filters, projections.
    Also takes the mirrored shape X·W (via outᵀ = Wᵀ·Xᵀ, no copy)."""

    MAX_M = 64
    SMEM = 48 * 1024

    def __init__(self, cols_per_thread: int = 1):
        super().__init__("same")
        self.cpt = cols_per_thread
        self.name = f"direct_wx{cols_per_thread}"
        self.summary = (f"direct kernel for small W·X: W staged in shared memory, "
                        f"{cols_per_thread} column(s) per thread, one launch")

    def _fits(self, p: Problem) -> str | None:
        if _pow2_at_least(p.m, 4) * self.cpt > self.MAX_M:
            return f"{p.m} output rows x {self.cpt} columns per thread > {self.MAX_M} registers"
        if p.m * p.k * p.dtype.itemsize > self.SMEM:
            return f"W [{p.m},{p.k}] does not fit in {self.SMEM // 1024} KiB of shared memory"
        return None

    def orient(self, p: Problem) -> Problem | None:
        if self._fits(p) is None:
            return p
        t = p.transposed()
        if self._fits(t) is None:
            return t
        return None

    def unavailable(self, p: Problem) -> str | None:
        if p.batches > 65535:
            return "more than 65535 batches"
        if self.orient(p) is None:
            return self._fits(p) + "; mirrored: " + self._fits(p.transposed())
        return _int32_reason(p)

    def run(self, p: Problem) -> None:
        q = self.orient(p)
        _check32(q)
        M, K, N, B = q.m, q.k, q.n, q.batches
        mm = _pow2_at_least(M, 4)
        fn = kernel("skinny.cu", f"wx_direct<{ctype(q.dtype)}, {mm}, {self.cpt}>")
        w, x, out = q.a, q.b, q.out
        grid = (-(-N // (256 * self.cpt)), B)
        fn(grid, (256,), (_u64(w), *_i32(*w.strides), _u64(x), *_i32(*x.strides),
                          *_i32(M, K, N), _u64(out), *_i32(*out.strides)),
           shared_mem=M * K * q.dtype.itemsize)


def gpu_candidates() -> list[Candidate]:
    """All GPU candidates, in the order used when tuning is off (first available wins)."""
    return [
        GramSmall(), GramSmall("f64"),
        WxDirect(1), WxDirect(2),
        GramTiled(4), GramTiled(8), GramTiled(4, "f64"),
        CublasGemm(),
        CublasSymBlocks(128, 8), CublasSymBlocks(128, 16), CublasSymBlocks(96, 8),
        CublasSymBlocks(192, 16), CublasSymBlocks(64, 4),
        CublasSplitK(16), CublasSplitK(64),
    ]
