"""CPU candidates: NumPy's BLAS, BLAS syrk for X·Xᵀ, split-K with pairwise sums, and a direct
(einsum) loop for tiny shapes where BLAS dispatch costs more than the product.

Each computes on 3-D arrays ``a`` [B, M, K], ``b`` [B, K, N] into ``out`` [B, M, N]; `bind`
wraps that for the 2-D or 3-D arrays a caller passes to `matmul`.

BLAS runs on one thread and the candidates thread over blocks of their own that do not depend on
the thread count (`dspk.linalg.threads`): a product gives the same bits on 1 thread and on 16,
in a Dask worker and in the process that started it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .problem import Candidate, Problem, Runner
from .threads import parallel_blocks, single_threaded_blas

#: A threaded product's output columns are cut into blocks that are a function of the shape
#: alone, so the blocks (and the bits) are the same whatever the thread count: about
#: TARGET_BLOCKS blocks (work for up to 16 threads), each of at least BLOCK_FLOP (a pool
#: dispatch costs ~20 µs), in multiples of 256 columns. Measured on 2 cores (ms; NumPy on
#: its own two threads in brackets), against fixed 4096-column blocks split only from 8192
#: columns: 384 x 384 x 6000 13.3 as one block, 8-9 in 512-column blocks (5.9-7.3);
#: 6 x 61 x 100 000 2.4 as one block, 1.0-1.6 in 2048-16384-column blocks (1.5-1.9);
#: 32 x 64 x 60 000 2.6 as one block, 1.6-1.8 in 4096-16384 (1.4).
TARGET_BLOCKS = 16
BLOCK_FLOP = 1 << 24


def column_block(a: np.ndarray, n: int) -> int:
    """The output columns per block of `blocked_matmul` for left operand ``a`` [..., M, K]
    and ``n`` output columns."""
    cols = max(-(-BLOCK_FLOP // max(1, 2 * a.size)), -(-n // TARGET_BLOCKS))
    return -(-cols // 256) * 256


def _pairwise_sum(parts: list[np.ndarray]) -> np.ndarray:
    """Sum in a balanced binary tree: the error grows with log(len), not len."""
    while len(parts) > 1:
        nxt = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]


def _as3(x: np.ndarray) -> np.ndarray:
    return x if x.ndim == 3 else x[None]


class _CpuCandidate(Candidate):
    gpu = False
    #: whether the operands must be BLAS-ready (one unit stride) for `compute`
    needs_blas_layout = True

    def compute(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError  # pragma: no cover - interface

    def run(self, p: Problem) -> None:
        a, b = p.a, p.b
        if self.needs_blas_layout:
            a, b = (v if v.layout() != "S" else v.contiguous() for v in (a, b))
        self.compute(a.to_array(), b.to_array(), p.out.to_array())

    def bind(self, p: Problem) -> Runner | None:
        if self.needs_blas_layout and "S" in (p.a.layout(), p.b.layout()):
            return None
        compute = self.compute

        def run(a: Any, b: Any, out: Any) -> None:
            compute(_as3(a), _as3(b), _as3(out))

        return run


def blocked_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a @ b`` (2-D or batched), BLAS on one thread per call, threaded over blocks of
    `column_block` output columns when there are at least two."""
    n = out.shape[-1]
    cols = column_block(a, n)
    if n < 2 * cols:
        with single_threaded_blas():
            np.matmul(a, b, out=out)
        return

    def block(s: int) -> None:
        e = min(s + cols, n)
        np.matmul(a, b[..., s:e], out=out[..., s:e])

    parallel_blocks(block, range(0, n, cols))


class NumpyMatmul(_CpuCandidate):
    name = "numpy"
    summary = ("numpy.matmul (the installed BLAS, one thread per call, threaded over fixed "
               "column blocks), operands gathered only if BLAS cannot take them")

    def unavailable(self, p: Problem) -> str | None:
        return None

    def compute(self, a, b, out):
        blocked_matmul(a, b, out)

    def bind(self, p: Problem) -> Runner | None:
        if "S" in (p.a.layout(), p.b.layout()):
            return None
        return blocked_matmul  # 2-D or 3-D as given: no wrapper cost


class NumpySplitK(_CpuCandidate):
    def __init__(self, chunk: int):
        self.chunk = chunk
        self.name = f"numpy_splitk{chunk}"
        self.summary = f"numpy.matmul over K-chunks of {chunk}, summed pairwise"

    def unavailable(self, p: Problem) -> str | None:
        if p.k < 4 * self.chunk:
            return f"K={p.k} shorter than 4 chunks of {self.chunk}"
        return None

    def compute(self, a, b, out):
        c = self.chunk
        starts = range(0, a.shape[2], c)
        parts: list[Any] = [None] * len(starts)

        def part(i: int) -> None:
            k0 = starts[i]
            parts[i] = np.matmul(a[:, :, k0:k0 + c], b[:, k0:k0 + c, :])

        parallel_blocks(part, range(len(starts)))   # the chunks, not the threads, fix the sums
        out[...] = _pairwise_sum(parts)


class CpuSyrk(_CpuCandidate):
    name = "blas_syrk"
    summary = "BLAS ssyrk/dsyrk for X·Xᵀ (half the products), upper triangle mirrored"

    def unavailable(self, p: Problem) -> str | None:
        if not p.symmetric:
            return "only for X·Xᵀ (b is not a.T)"
        return None

    def compute(self, a, b, out):
        from scipy.linalg import blas  # noqa: PLC0415 (scipy import is slow; only when used)

        syrk = blas.ssyrk if a.dtype == np.float32 else blas.dsyrk
        with single_threaded_blas():
            for i in range(a.shape[0]):
                # Fortran-ordered xᵀ (no copy for a C-ordered x): syrk(trans=1) gives x·xᵀ.
                c = syrk(1.0, a[i].T, trans=1, lower=0)
                out[i] = np.triu(c) + np.triu(c, 1).T


class CpuDirect(_CpuCandidate):
    name = "direct_einsum"
    summary = "numpy.einsum loop without BLAS, for tiny products"
    needs_blas_layout = False

    def unavailable(self, p: Problem) -> str | None:
        if p.m * p.n * p.k > 4096:
            return f"M·N·K = {p.m * p.n * p.k} > 4096: BLAS is the better tool"
        return None

    def compute(self, a, b, out):
        np.einsum("bmk,bkn->bmn", a, b, out=out, optimize=False)


def cpu_candidates() -> list[Candidate]:
    """All CPU candidates, in the order used when tuning is off."""
    return [NumpyMatmul(), CpuSyrk(), NumpySplitK(4096), NumpySplitK(16384), CpuDirect()]
