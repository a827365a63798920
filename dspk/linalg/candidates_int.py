"""Candidates for exact integer products (uint8, int8, int16 operands, int64 result).

CPU: float64 BLAS, exact while every partial sum stays below 2^53 (K chunked otherwise), and a
direct int64 product for small shapes.
GPU: INT8 tensor cores through cuBLAS gemmEx (int8 x int8 -> int32, compute 32I) in the "TN"
layout (both operands with K contiguous; the other layouts ran ~10x slower on the H200), with
M, N, K zero-padded to multiples of 16. uint8 is centred to int8 (x - 128) and corrected with row
and column sums; int16 is split into two int8 planes, x - 128 = 256*h + l with h = x >> 8 and
l = (x & 255) - 128, and the 3-4 plane products recombined in int64; K is chunked so that no
int32 accumulator can overflow (|sum| <= K * 128^2 < 2^31).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import cupy_module, device_properties
from .problem import Candidate, Problem

INT_DTYPES = (np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int16))
_MAX_ABS = {np.dtype(np.uint8): 255, np.dtype(np.int8): 128, np.dtype(np.int16): 32768}

# cuBLAS enums for INT8 IMMA (CuPy has no constant for CUDA_R_32I).
CUDA_R_8I, CUDA_R_32I = 3, 10
CUBLAS_COMPUTE_32I = 72
CUBLAS_GEMM_DEFAULT = -1
OP_N, OP_T = 0, 1
#: longest K one int32 accumulation may take: |sum| <= K*128^2 <= 2^31 - 1, a multiple of 16
INT8_K_CHUNK = ((2**31 - 1) // 128**2) // 16 * 16
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


def _pad16(n: int) -> int:
    return max(16, -(-n // 16) * 16)


class Int8TensorCore(Candidate):
    """INT8 tensor cores through cuBLAS gemmEx, "TN", exact int64 recombination."""

    name = "int8_tensorcore"
    gpu = True
    kinds = "iu"
    summary = ("INT8 tensor cores (cuBLAS gemmEx 8I x 8I -> 32I, TN, padded to 16), uint8 "
               "centred, int16 split in two int8 planes, K chunked, recombined in int64")

    def unavailable(self, p: Problem) -> str | None:
        props = device_properties(p.device_id)
        if (props["major"], props["minor"]) < (7, 5):
            return f"no INT8 tensor cores before compute capability 7.5 (this is " \
                   f"{props['major']}.{props['minor']})"
        if max(p.m, p.n, p.k) > 2**31 - 16:
            return "a dimension exceeds cuBLAS's 32-bit sizes"
        return None

    @staticmethod
    def _planes(x: Any, dtype: Any, rows: int, K: int, cp: Any) -> list:
        """int8 planes of x [B, rows, K] (K contiguous after padding), with their weights."""
        B = x.shape[0]
        rp, kp = _pad16(rows), _pad16(K)

        def padded(values: Any) -> Any:
            buf = cp.zeros((B, rp, kp), dtype=np.int8)
            buf[:, :rows, :K] = values
            return buf

        if dtype == np.int8:
            return [(padded(x), 1)]
        if dtype == np.uint8:
            return [(padded((x ^ np.uint8(0x80)).view(np.int8)), 1)]
        hi = (x >> 8).astype(np.int8)
        lo = ((x & 0xFF) - 128).astype(np.int8)
        return [(padded(hi), 256), (padded(lo), 1)]

    def run(self, p: Problem) -> None:
        cp = cupy_module()
        from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

        a = p.a.to_array()                       # [B, M, K]
        bt = cp.swapaxes(p.b.to_array(), 1, 2)   # [B, N, K]: K contiguous after packing
        B, M, N, K = p.batches, p.m, p.n, p.k
        dt = p.dtype
        pa = self._planes(a, dt, M, K, cp)
        pb = pa if p.symmetric else self._planes(bt, dt, N, K, cp)
        mp, np_, kp = _pad16(M), _pad16(N), _pad16(K)
        c32 = cp.empty((B, mp, np_), dtype=np.int32)
        acc = cp.zeros((B, M, N), dtype=np.int64)
        handle = cp.cuda.device.get_cublas_handle()

        def product(xa: Any, xb: Any) -> Any:
            """xa · xbᵀ in int64, K chunked so that no int32 accumulator overflows."""
            total = None
            for k0 in range(0, kp, INT8_K_CHUNK):
                k = min(INT8_K_CHUNK, kp - k0)
                # Row-major C[M, N] = A[M, K]·B[N, K]ᵀ is column-major Cᵀ = Bᵀ... : "TN".
                cublas.gemmStridedBatchedEx(
                    handle, OP_T, OP_N, np_, mp, k, _ONE_I32.ctypes.data,
                    xb.data.ptr + k0, CUDA_R_8I, kp, (xb.shape[0] > 1) * np_ * kp,
                    xa.data.ptr + k0, CUDA_R_8I, kp, (xa.shape[0] > 1) * mp * kp,
                    _ZERO_I32.ctypes.data, c32.data.ptr, CUDA_R_32I, np_, mp * np_,
                    B, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT)
                part = c32[:, :M, :N].astype(np.int64)
                total = part if total is None else total + part
            return total

        done = {}
        for ia, (xa, wa) in enumerate(pa):
            for ib, (xb, wb) in enumerate(pb):
                if p.symmetric and (ib, ia) in done:
                    s = cp.swapaxes(done[(ib, ia)], 1, 2)  # X·Xᵀ: the mixed plane term mirrors
                else:
                    s = product(xa, xb)
                    done[(ia, ib)] = s
                acc += (wa * wb) * s
        if dt != np.int8:
            # Undo the centring: sum(xy) = sum(X1·Y1) + 128·sum(x) + 128·sum(y) - 128²·K
            ra = a.sum(axis=2, dtype=np.int64)             # [B, M]
            cb = bt.sum(axis=2, dtype=np.int64)            # [B, N]
            acc += 128 * ra[:, :, None] + 128 * cb[:, None, :] - 128 * 128 * K
        p.out.to_array()[...] = acc


def int_candidates(gpu: bool) -> list[Candidate]:
    """Integer candidates, in the order used when tuning is off."""
    if gpu:
        return [Int8TensorCore()]
    return [IntViaFloat64(), IntDirect()]
