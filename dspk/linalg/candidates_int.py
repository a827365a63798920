"""Candidates for exact integer products (uint8, int8, int16 operands, int64 result).

CPU: float64 BLAS, exact while every partial sum stays below 2^53 (K chunked otherwise; X·Xᵀ
through syrk on blocks of X converted in cache), and a direct int64 product for small shapes.
GPU: INT8 tensor cores through cuBLAS gemmEx (int8 x int8 -> int32, compute 32I) in the "TN"
layout (both operands with K contiguous; the other layouts ran ~10x slower on the H200), with
M, N, K zero-padded to multiples of 16. uint8 is centred to int8 (x - 128) and corrected with row
and column sums; int16 is split into two int8 planes, x - 128 = 256*h + l with h = x >> 8 and
l = (x & 255) - 128, and the 3-4 plane products recombined in int64; K is chunked so that no
int32 accumulator can overflow (|sum| <= K * 128^2 < 2^31).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backend import cupy_module, device_properties
from ..caches import shared
from ..kernels import LAUNCH, FastLaunch, ctype, declare_instances, grid_1d, kernel
from . import cublaslt
from .gpu_common import Workspace, stream_getter
from .problem import Candidate, Problem, instances_of
from .threads import parallel_blocks
from .view import MatrixView

if TYPE_CHECKING:                      # the tuner is handed in (`int_candidates`), not imported
    from .tuner import Tuner

INT_DTYPES = (np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int16))
_MAX_ABS = {np.dtype(np.uint8): 255, np.dtype(np.int8): 128, np.dtype(np.int16): 32768}

# cuBLAS enums for INT8 IMMA (CuPy has no constant for CUDA_R_32I).
CUDA_R_8I, CUDA_R_32I = 3, 10
CUBLAS_COMPUTE_32I = 72
CUBLAS_GEMM_DEFAULT = -1
OP_N, OP_T = 0, 1
#: longest K one int32 accumulation may take: |sum| <= K*128^2 <= 2^31 - 1, a multiple of 16
INT8_K_CHUNK = ((2**31 - 1) // 128**2) // 16 * 16
#: cuBLASLt's ranks timed for the INT8 GEMM (measured on an H200, int16 covariance of 384
#: channels: ranks 0, 1, 3, 6 at 0.075 ms and 7 at 0.067, with 16 MB of workspace)
INT8_LT_RANKS = 8
#: the process-wide store (`dspk.caches`) of the cuBLASLt INT8 plans by packed geometry
LT_PLANS = "int8_lt_plans"
MAX_LT_PLANS = 256
#: 16-byte loads each thread of the contiguous-rows packing kernel keeps in flight
PACK_LOADS = 4
#: (samples per stage, stages, waves) of the fused int16 X·Xᵀ the tuner times
#: (measured on an H200, 384 x 60 000: 0.0812-0.0870 ms, 128-sample stages ahead; two waves
#: of shorter chunks were never ahead, 0.0891)
GRAM16_VARIANTS = ((128, 2, 1), (128, 3, 1), (64, 4, 1), (64, 3, 1))
_ONE_I32 = np.ones(1, np.int32)
_ZERO_I32 = np.zeros(1, np.int32)


def float64_k_chunk(dtype: Any) -> int:
    """Longest K whose float64 dot products of ``dtype`` values stay exact (< 2^53)."""
    m = _MAX_ABS[np.dtype(dtype)]
    return max(1, (2**53 - 1) // (m * m))


class IntViaFloat64(Candidate):
    name = "int_f64blas"
    gpu = False
    kinds = "iu"
    summary = "float64 BLAS, exact while K·max|a|·max|b| < 2^53 (K chunked beyond)"

    def unavailable(self, p: Problem) -> str | None:
        return None

    def run(self, p: Problem) -> None:
        a = p.a.to_array()
        b = p.b.to_array()
        out = p.out.to_array()
        chunk = float64_k_chunk(p.dtype)
        total = None
        for k0 in range(0, p.k, chunk):
            part = np.matmul(a[:, :, k0:k0 + chunk].astype(np.float64),
                             b[:, k0:k0 + chunk, :].astype(np.float64))
            part = part.astype(np.int64)  # exact: every value is an integer below 2^53
            total = part if total is None else total + part
        out[...] = total


#: samples of X converted to float64 at a time by `IntGramFloat64` (384 rows: 12 MB, within
#: the L3 cache of a 2-core EPYC slice; the conversion stays next to the product reading it)
GRAM_K_BLOCK = 4096


class IntGramFloat64(Candidate):
    """X·Xᵀ of an integer X through float64 BLAS's symmetric product (NumPy sends
    ``x @ x.T`` of one buffer to ?syrk: half the multiply-adds of `IntViaFloat64`'s gemm, and
    no float64 copy of Xᵀ), X converted ``GRAM_K_BLOCK`` samples at a time. The blocks are
    shared among the engine's threads (`dspk.linalg.threads.parallel_blocks`, BLAS on one
    thread each: OpenBLAS's own threaded syrk scaled poorly on 2 cores), each thread adding
    its blocks' products into an accumulator of its own. Exact: every partial sum is an
    integer below K·max|x|² < 2^53 (K is cut into `float64_k_chunk` pieces, each added into
    int64), so neither the order of the sums nor the thread count changes a bit.
    """

    name = "int_f64gram"
    gpu = False
    kinds = "iu"
    summary = ("X·Xᵀ by float64 BLAS syrk over blocks of samples converted in cache, shared "
               "among threads, exact while K·max|x|² < 2^53 (K chunked beyond)")

    def unavailable(self, p: Problem) -> str | None:
        if not p.symmetric:
            return "only for X·Xᵀ (b is a.T)"
        return None

    def run(self, p: Problem) -> None:
        a = p.a.to_array()
        out = p.out.to_array()
        chunk = float64_k_chunk(p.dtype)
        k, m = p.k, p.m
        for bi in range(p.batches):
            x = a[bi if a.shape[0] > 1 else 0]
            total = np.zeros((m, m), dtype=np.int64)
            for c0 in range(0, k, chunk):
                c1 = min(k, c0 + chunk)
                sums: dict[int, np.ndarray] = {}          # one float64 accumulator per thread

                def block(k0: int, c1: int = c1, x: Any = x, sums: dict = sums) -> None:
                    xb = x[:, k0:min(c1, k0 + GRAM_K_BLOCK)].astype(np.float64)
                    part = xb @ xb.T                     # ?syrk: xb is both operands
                    mine = sums.get(threading.get_ident())
                    if mine is None:
                        sums[threading.get_ident()] = part
                    else:
                        mine += part                     # exact: integers below 2^53

                parallel_blocks(block, range(c0, c1, GRAM_K_BLOCK))
                for acc in sums.values():
                    total += acc.astype(np.int64)
            out[bi] = total


class IntViaFloat32(Candidate):
    """Integer products through the float32 engine (the float candidates ``tuner`` chooses
    among: cuBLAS or BLAS...), available only where they are exact: every partial sum is an
    integer of magnitude at most K·max|a|·max|b| < 2^24, so every float32 product and sum is
    exact in any order (and the float engine never uses TF32). uint8 templates of up to 258
    pixels, for example.

    Parameters
    ----------
    gpu : bool
        The GPU's candidate or the CPU's.
    tuner : dspk.linalg.tuner.Tuner
        The tuner that chooses the float product (the engine's own, which also chooses among
        these candidates).
    """

    kinds = "iu"

    def __init__(self, gpu: bool, tuner: "Tuner"):
        self.gpu = gpu
        self.tuner = tuner
        self.name = "int_f32exact"
        self.summary = "float32 matmul engine, exact because K·max|a|·max|b| < 2^24"

    def unavailable(self, p: Problem) -> str | None:
        m = _MAX_ABS[p.dtype]
        if p.k * m * m >= 2**24:
            return f"K·max|a|·max|b| = {p.k * m * m} >= 2^24: float32 would round"
        return None

    def run(self, p: Problem) -> None:
        xp = p.a.xp
        a = p.a.to_array().astype(np.float32)
        b = p.b.to_array().astype(np.float32)
        c = xp.empty(p.out.shape, dtype=np.float32)
        # the product `matmul(a, b)` would compute: separate copies, so never X·Xᵀ
        self.tuner.select(Problem(MatrixView.of(a, "a"), MatrixView.of(b, "b"),
                                  MatrixView.of(c, "out"), False), run=True)
        p.out.to_array()[...] = xp.rint(c).astype(np.int64)


class IntDirect(Candidate):
    name = "int_direct"
    gpu = False
    kinds = "iu"
    summary = "numpy int64 product (no BLAS), for small shapes"

    def unavailable(self, p: Problem) -> str | None:
        if p.batches * p.m * p.n * p.k > 2**22:
            return "more than 4M multiply-adds: float64 BLAS is the better tool"
        return None

    def run(self, p: Problem) -> None:
        np.matmul(p.a.to_array().astype(np.int64), p.b.to_array().astype(np.int64),
                  out=p.out.to_array())


def _pack_expressions(dt: Any) -> tuple[str, str]:
    """(contiguous-rows kernel, strided kernel) packing ``dt`` operands: uint8 centred,
    int8 without row sums."""
    tmpl = (f"{ctype(dt)}, {'true' if dt == np.uint8 else 'false'}, "
            f"{'true' if dt != np.int8 else 'false'}")
    return f"pack_planes_rows<{tmpl}, {PACK_LOADS}>", f"pack_planes<{tmpl}>"


#: the kernel adding the plane products, with the centring correction, into int64
COMBINE = "combine_planes"


def _pack_kernel(v: Any, dt: Any, batches: int) -> tuple:
    """(kernel, elements per thread, whether it takes no K stride) packing view ``v``: the
    16-bytes-per-load kernel when K is contiguous and the rows (and batches, when there are
    several) start 16-byte aligned, the general strided one otherwise."""
    rows, strided = _pack_expressions(dt)
    sb, sr, sk = v.strides
    item = np.dtype(dt).itemsize
    if sk == 1 and v.ptr % 16 == 0 and (sr * item) % 16 == 0 and \
            (batches == 1 or (sb * item) % 16 == 0):
        return kernel("intpack.cu", rows), PACK_LOADS * 16 // item, True
    return kernel("intpack.cu", strided), 4, False


def _pad16(n: int) -> int:
    return max(16, -(-n // 16) * 16)


class Int8TensorCore(Candidate):
    """INT8 tensor cores through cuBLAS gemmEx, "TN", exact int64 recombination; with
    ``lt_rank``, the GEMM of a single product through cuBLASLt's algorithm of that rank, the
    whole K in one matrix where int32 holds it (cuBLASLt splits K itself, in its workspace:
    measured on an H200 for the int16 covariance of 384 channels, 0.067-0.075 ms against
    cuBLAS's 0.107 over dspk's K chunks)."""

    gpu = True
    kinds = "iu"
    #: the bound runner (single products) writes a's row sums where ``ps`` points
    row_sums = True

    def __init__(self, lt_rank: int | None = None):
        self.lt_rank = lt_rank
        self.name = "int8_tensorcore" + ("" if lt_rank is None else f"_lt{lt_rank}")
        gemm = ("cuBLAS gemmEx" if lt_rank is None else
                f"cuBLASLt's rank-{lt_rank} algorithm for the whole K")
        self.summary = (f"INT8 tensor cores ({gemm}, 8I x 8I -> 32I, TN, padded to 16): "
                        "operands packed in one pass (uint8 centred, int16 as two stacked int8 "
                        "planes), recombined with the centring correction in int64 "
                        "(intpack.cu)")

    def instances(self, props: dict) -> dict[str, set[str]]:
        return {"intpack.cu": {COMBINE, *(e for dt in INT_DTYPES for e in _pack_expressions(dt))}}

    def unavailable(self, p: Problem) -> str | None:
        props = device_properties(p.device_id)
        if (props["major"], props["minor"]) < (7, 5):
            return f"no INT8 tensor cores before compute capability 7.5 (this is " \
                   f"{props['major']}.{props['minor']})"
        if max(p.m, p.n, p.k) > 2**31 - 16:
            return "a dimension exceeds cuBLAS's 32-bit sizes"
        if self.lt_rank is not None:
            if p.batches != 1:
                return "cuBLASLt variant for single products (batched: cuBLAS)"
            reason = cublaslt.available()
            if reason:
                return reason
            lt = self._lt_plan(p)
            if not lt.ok:
                return f"cuBLASLt's heuristic offers {lt.algorithms} algorithm(s) here"
        return None

    def _lt_split(self, p: Problem) -> tuple[int, int]:
        """(splits, chunk) of K for the cuBLASLt variant: the whole K where int32 holds it."""
        P = 2 if p.dtype == np.int16 else 1
        kp = _pad16(p.k)
        if kp <= INT8_K_CHUNK:
            return 1, kp
        return _split_k(1, P * _pad16(p.m), P * _pad16(p.n), p.k, device_properties(p.device_id))

    def _lt_plan(self, p: Problem) -> Any:
        """The cuBLASLt GEMM for ``p``'s packed planes (kept per geometry)."""
        P = 2 if p.dtype == np.int16 else 1
        mp, np_ = _pad16(p.m), _pad16(p.n)
        splits, kc = self._lt_split(p)
        kp = splits * kc
        key = (p.device_id, P, mp, np_, splits, kc, self.lt_rank)
        plans = shared(LT_PLANS, dict)
        plan = plans.get(key)
        if plan is None:
            g = cublaslt.GemmGeometry(False, P * np_, P * mp, kc, OP_T, OP_N, kp, kp, P * np_)
            plan = plans[key] = cublaslt.LtMatmul(g, splits, kc, kc, P * mp * P * np_,
                                                  self.lt_rank, p.device_id, np.int8)
            while len(plans) > MAX_LT_PLANS:             # oldest first
                plans.pop(next(iter(plans)), None)
        return plan

    def bind(self, p: Problem) -> Any:
        """A runner for single products (B = 1, the covariance case) of ``p``'s geometry: the
        packing, GEMM and combine launches packed once, scratch kept per stream, the row sums
        zeroed by one memset. Batched products go through `run` (None here)."""
        if p.batches != 1:
            return None
        cp = cupy_module()
        from cupy_backends.cuda.libs import cublas  # noqa: PLC0415 (needs CuPy)

        M, N, K, dt = p.m, p.n, p.k, p.dtype
        P = 2 if dt == np.int16 else 1
        mp, np_ = _pad16(M), _pad16(N)
        if self.lt_rank is None:
            splits, kc = _split_k(1, P * mp, P * np_, K, device_properties(p.device_id))
            lt = None
        else:
            splits, kc = self._lt_split(p)
            lt = self._lt_plan(p)
        kp = splits * kc
        sums = dt != np.int8
        sym = p.symmetric
        def pack_launch(v: Any, rows: int, rp: int) -> FastLaunch:
            fn, per, rows_kernel = _pack_kernel(v, dt, 1)
            sb, sr, sk = v.strides
            strides = [("i64", sb), ("i64", sr)] + ([] if rows_kernel else [("i64", sk)])
            return FastLaunch(fn, (-(-kp // (256 * per)), min(65535, rp)), (256,),
                              [("ptr", None), *strides, ("i32", 1), ("i32", rows), ("i32", K),
                               ("i32", rp), ("i32", kp), ("ptr", None), ("ptr", None)])

        pack_a = pack_launch(p.a, M, mp)
        pack_b = None if sym else pack_launch(p.b.T, N, np_)
        out = p.out
        combine = FastLaunch(kernel("intpack.cu", COMBINE), grid_1d(M * N), (256,),
                             [("ptr", None), ("i32", splits), ("i32", P), ("i32", mp),
                              ("i32", np_), ("i32", 1), ("i32", M), ("i32", N), ("ptr", None),
                              ("i64", out.strides[0]), ("i64", out.strides[1]),
                              ("i64", out.strides[2]), ("ptr", None), ("ptr", None),
                              ("i64", 128 * 128 * K), ("i32", 1)])
        qa_n, qb_n = P * mp * kp, 0 if sym else P * np_ * kp
        c_n = splits * P * mp * P * np_
        rs_n = (M + (0 if sym else N)) if sums else 0
        # one int8 buffer per stream: planes of a (and b), the int32 partials, the row sums
        off_c = -(-(qa_n + qb_n) // 256) * 256
        off_r = off_c + 4 * c_n
        workspace = Workspace(off_r + 8 * rs_n, np.int8)
        memset = cp.cuda.runtime.memsetAsync
        handle_of = cp.cuda.device.get_cublas_handle
        gemm = cublas.gemmStridedBatchedEx
        one, zero = _ONE_I32.ctypes.data, _ZERO_I32.ctypes.data
        ldc, plane_c = P * np_, P * mp * P * np_

        get_stream = stream_getter()

        def run(pa: int, pb: int, po: int, ps: int = 0) -> None:
            """``ps``: where to write a's row sums (int64 [M]; `int_gram`, X·Xᵀ only)."""
            stream = get_stream().ptr
            base = workspace.get(stream)[0].data.ptr
            qa, qb = base, (base if sym else base + qa_n)
            c32, ra = base + off_c, base + off_r
            if ps:
                ra = ps
            cb = ra if sym else ra + 8 * M
            if sums:
                memset(ra, 0, 8 * rs_n, stream)
            pack_a(stream, pa, qa, ra if sums else 0)
            if pack_b is not None:
                pack_b(stream, pb, qb, cb if sums else 0)
            # row-major C[P*Mp, P*Np] = A·Bᵀ with K contiguous in both: cuBLAS "TN" on Cᵀ;
            # the split-K chunks are the GEMM's batch
            if lt is not None:
                lt(qb, qa, c32, stream)
            else:
                gemm(handle_of(), OP_T, OP_N, P * np_, P * mp, kc, one, qb, CUDA_R_8I, kp, kc,
                     qa, CUDA_R_8I, kp, kc, zero, c32, CUDA_R_32I, ldc, plane_c, splits,
                     CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT)
            combine(stream, c32, po, ra if sums else 0, cb if sums else 0)

        return run

    def run(self, p: Problem) -> None:
        if p.batches == 1:   # the same launches as the bound runner
            self.bind(p)(p.a.ptr, p.b.ptr, p.out.ptr)
            return
        cp = cupy_module()
        from cupy_backends.cuda.libs import cublas  # noqa: PLC0415 (needs CuPy)

        B, M, N, K, dt = p.batches, p.m, p.n, p.k, p.dtype
        P = 2 if dt == np.int16 else 1
        mp, np_ = _pad16(M), _pad16(N)
        splits, kc = _split_k(B, P * mp, P * np_, K, device_properties(p.device_id))
        kp = splits * kc if B == 1 else _pad16(K)
        sums = dt != np.int8   # the centring correction needs the raw row/column sums

        def packed(v: Any, rows: int, rp: int) -> tuple:
            """(planes [nb, P*rp, kp] int8, batch stride in elements, row sums [B, rows]
            int64 or None) of a [B, rows, K] view; a broadcast operand is packed once."""
            v.check()
            nb = 1 if (v.batches > 1 and v.strides[0] == 0) else v.batches
            dst = cp.empty(nb * P * rp * kp, dtype=np.int8)
            rs = cp.zeros((nb, rows), dtype=np.int64) if sums else None
            sb, sr, sk = v.strides
            pack, per, rows_kernel = _pack_kernel(v, dt, nb)
            strides = (np.int64(sb), np.int64(sr)) + (() if rows_kernel else (np.int64(sk),))
            pack((-(-kp // (256 * per)), min(65535, nb * rp)), (256,),
                 (np.uint64(v.ptr), *strides, np.int32(nb), np.int32(rows), np.int32(K),
                  np.int32(rp), np.int32(kp), dst, np.uint64(0 if rs is None else rs.data.ptr)))
            if rs is not None and nb != B:
                rs = cp.ascontiguousarray(cp.broadcast_to(rs, (B, rows)))
            return dst, (0 if nb == 1 else P * rp * kp), rs

        qa, stride_a, ra = packed(p.a, M, mp)
        qb, stride_b, cb = (qa, stride_a, ra) if p.symmetric else packed(p.b.T, N, np_)
        c32 = cp.empty(splits * B * P * mp * P * np_, dtype=np.int32)
        combine = kernel("intpack.cu", COMBINE)
        out = p.out
        out.check()
        handle = cp.cuda.device.get_cublas_handle()
        ldc, plane_c = P * np_, P * mp * P * np_
        if B == 1:
            chunks = [(0, kc, splits)]   # split-K: the K chunks as the GEMM's batch
        else:
            chunks = [(k0, min(INT8_K_CHUNK, kp - k0), 1) for k0 in range(0, kp, INT8_K_CHUNK)]
        for k0, kk, nsplit in chunks:
            # Row-major C[P*Mp, P*Np] = A·Bᵀ with K contiguous in both: cuBLAS "TN" on Cᵀ.
            sa, sb_ = (kk, kk) if B == 1 else (stride_a, stride_b)
            cublas.gemmStridedBatchedEx(
                handle, OP_T, OP_N, P * np_, P * mp, kk, _ONE_I32.ctypes.data,
                qb.data.ptr + k0, CUDA_R_8I, kp, sb_,
                qa.data.ptr + k0, CUDA_R_8I, kp, sa,
                _ZERO_I32.ctypes.data, c32.data.ptr, CUDA_R_32I, ldc, plane_c,
                B * nsplit, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT)
            combine(grid_1d(B * M * N), (256,),
                    (c32, np.int32(nsplit), np.int32(P), np.int32(mp), np.int32(np_),
                     np.int32(B), np.int32(M), np.int32(N), np.uint64(out.ptr),
                     np.int64(out.strides[0]), np.int64(out.strides[1]),
                     np.int64(out.strides[2]), np.uint64(0 if ra is None else ra.data.ptr),
                     np.uint64(0 if cb is None else cb.data.ptr), np.int64(128 * 128 * K),
                     np.int32(1 if k0 == 0 else 0)))


class Int16GramFused(Candidate):
    """X·Xᵀ of int16 rows in one kernel (gram16.cu): int16 tiles read straight into shared
    memory, bytes split in registers into s8/u8 mma.sync fragments, only the tiles on and
    above the diagonal computed, K split over CTAs and their exact int64 partials added with
    integer atomics. No int8 planes are written (the general path's pack pass cost as much as
    its GEMM) and no centring correction is needed (the low bytes go in as u8).

    Parameters
    ----------
    bk : int
        Samples per pipeline stage (64 or 128; one barrier per stage).
    stages : int
        cp.async pipeline depth (2 to 4; 256·bk bytes of shared memory each).
    waves : int
        CTAs launched, in waves of what fits on the GPU at once: the K split is chosen so
        that tile pairs x K chunks fills that many waves.
    """

    gpu = True
    kinds = "iu"
    #: the bound runner writes X's exact row sums where ``ps`` points (`int_gram`)
    row_sums = True
    TILE = LAUNCH["G16_BT"]
    THREADS = LAUNCH["G16_THREADS"]
    #: fewest samples a K chunk is given, so that a CTA's fixed costs (filling the pipeline,
    #: the epilogue's atomics) stay a small part of its work
    MIN_CHUNK = 1024
    MAX_CHUNK = LAUNCH["GRAM16_MAX_K"]        # no int32 accumulator can overflow

    #: CTAs per SM asked of the register allocator (3 spills: gram16.cu)
    MINB = 2

    def __init__(self, bk: int = 128, stages: int = 2, waves: int = 1):
        self.bk, self.stages, self.waves = bk, stages, waves
        self.name = f"int16_gram_k{bk}s{stages}w{waves}"
        self.summary = (f"fused int16 X·Xᵀ on INT8 tensor cores (mma.sync s8/u8, bytes split in "
                        f"registers, upper-triangle tiles of 64, {stages} cp.async stages of "
                        f"{bk} samples, K split over {waves} wave(s) of CTAs, int64 atomics; "
                        f"gram16.cu)")

    def expression(self) -> str:
        """The ``gram16`` instance of this variant."""
        return f"gram16<{self.bk}, {self.stages}, {self.MINB}>"

    def instances(self, props: dict) -> dict[str, set[str]]:
        if int(props.get("major", 0)) < 8:
            return {}                                   # no int8 mma.sync to compile
        return {"gram16.cu": {self.expression()}}

    def unavailable(self, p: Problem) -> str | None:
        if p.dtype != np.int16:
            return "int16 operands only"
        if not p.symmetric or p.batches != 1:
            return "X·Xᵀ of one matrix only"
        props = device_properties(p.device_id)
        if props["major"] < 8:
            return (f"needs int8 mma.sync m16n8k32 (compute capability 8.0+, this device is "
                    f"{props['major']}.{props['minor']})")
        _, sr, sk = p.a.strides
        if sk != 1 or (p.m > 1 and sr % 8) or p.a.ptr % 16:
            return "X's rows must be contiguous and start 16-byte aligned"
        if self._ld_out(p) is None:
            return "the result must be one contiguous [M, M] array"
        if p.m == 0 or p.k == 0 or p.m > 2**20:
            return "empty, or more rows than the kernel indexes"
        return None

    @staticmethod
    def _ld_out(p: Problem) -> int | None:
        """S's row stride when it is a contiguous [M, M] (C or F order: S is symmetric)."""
        _, so, sc = p.out.strides
        if (sc == 1 and so == p.m) or (so == 1 and sc == p.m) or p.m == 1:
            return p.m
        return None

    def launch_config(self, p: Problem) -> dict:
        """Kernel, grid, shared memory, CTAs per SM and the K split for ``p``."""
        from cupy_backends.cuda.api import driver  # noqa: PLC0415 (needs CuPy)

        expr = self.expression()
        fn = kernel("gram16.cu", expr)
        smem = max(self.stages * 2 * self.TILE * 2 * self.bk, self.TILE * (self.TILE + 1) * 8)
        if smem > 48 << 10 and fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, self.THREADS,
                                                                  smem)
        if per_sm < 1:
            raise RuntimeError(f"{expr}: no CTA fits on an SM ({fn.num_regs} registers)")
        tiles = -(-p.m // self.TILE)
        pairs = tiles * (tiles + 1) // 2
        slots = self.waves * per_sm * int(device_properties(p.device_id)["multiProcessorCount"])
        # as many K chunks as fill the waves, none shorter than MIN_CHUNK or longer than
        # MAX_CHUNK; whole stages each (the last one shorter)
        splits = max(1, min(slots // pairs, p.k // self.MIN_CHUNK, 65535),
                     -(-p.k // self.MAX_CHUNK))
        chunk = -(-p.k // (self.bk * splits)) * self.bk
        splits = -(-p.k // chunk)
        return {"expression": expr, "fn": fn, "grid": (pairs, splits), "smem": smem,
                "ctas_per_sm": per_sm, "registers": fn.num_regs, "tiles": tiles,
                "k_chunk": chunk}

    def bind(self, p: Problem) -> Any:
        """A runner ``run(pa, pb, po, ps=0)`` for ``p``'s geometry: zeroes S (and the row sums
        where ``ps`` is given), then one launch."""
        cp = cupy_module()
        cfg = self.launch_config(p)
        M, K = p.m, p.k
        launch = FastLaunch(cfg["fn"], cfg["grid"], (self.THREADS,),
                            [("ptr", None), ("i64", p.a.strides[1]), ("i32", M), ("i32", K),
                             ("i32", cfg["k_chunk"]), ("i32", cfg["tiles"]), ("ptr", None),
                             ("i64", self._ld_out(p)), ("ptr", None)], shared_mem=cfg["smem"])
        memset = cp.cuda.runtime.memsetAsync
        nbytes = 8 * M * M
        get_stream = stream_getter()

        def run(pa: int, pb: int, po: int, ps: int = 0) -> None:
            stream = get_stream().ptr
            memset(po, 0, nbytes, stream)
            if ps:
                memset(ps, 0, 8 * M, stream)
            launch(stream, pa, po, ps)

        return run

    def run(self, p: Problem) -> None:
        self.bind(p)(p.a.ptr, p.b.ptr, p.out.ptr)


def _split_k(batches: int, rows: int, cols: int, k: int, props: dict) -> tuple[int, int]:
    """(splits, chunk) for a single product: cuBLAS's int8 GEMM does not split K itself, and a
    768 x 768 output (int16 covariance of 384 channels) is only 36 tiles of 128 x 128 for 132
    SMs; the K chunks run as the batch of one strided-batched call, each at most INT8_K_CHUNK
    long (int32 accumulators exact), about two waves of tiles in all. Batched products keep
    the K loop (splits 1)."""
    kp = _pad16(k)
    if batches != 1:
        return 1, kp
    tiles = -(-rows // 128) * -(-cols // 128)
    want = -(-2 * int(props.get("multiProcessorCount", 1)) // tiles)
    splits = max(-(-kp // INT8_K_CHUNK), min(want, kp // 2048), 1)
    chunk = _pad16(-(-kp // splits))
    return splits, chunk


def _gpu_kernel_candidates() -> list[Candidate]:
    """The integer GPU candidates with kernels of their own, in the order used when tuning is
    off: the fused int16 X·Xᵀ first (where it can run it was measured fastest at every
    size), then the INT8 GEMMs."""
    return [*(Int16GramFused(*v) for v in GRAM16_VARIANTS), Int8TensorCore(),
            *(Int8TensorCore(r) for r in range(INT8_LT_RANKS))]


def int_candidates(gpu: bool, tuner: "Tuner") -> list[Candidate]:
    """Integer candidates, in the order used when tuning is off; ``tuner`` chooses the float
    product of `IntViaFloat32` (the tuner these candidates are made for)."""
    if gpu:
        return [*_gpu_kernel_candidates(), IntViaFloat32(gpu=True, tuner=tuner)]
    return [IntGramFloat64(), IntViaFloat64(), IntViaFloat32(gpu=False, tuner=tuner),
            IntDirect()]


def _instances(filename: str) -> Any:
    return lambda props: instances_of(_gpu_kernel_candidates(), filename, props)


declare_instances("intpack.cu", _instances("intpack.cu"))
declare_instances("gram16.cu", _instances("gram16.cu"))
