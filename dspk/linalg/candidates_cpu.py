"""CPU candidates: NumPy's BLAS, BLAS syrk for X·Xᵀ, split-K with pairwise sums, and a direct
(einsum) loop for tiny shapes where BLAS dispatch costs more than the product."""

from __future__ import annotations

import numpy as np

from .problem import Candidate, Problem
from .view import MatrixView


def _blas_array(v: MatrixView) -> np.ndarray:
    """The view as an array NumPy's matmul hands to BLAS without its slow non-BLAS loop."""
    return (v if v.layout() != "S" else v.contiguous()).to_array()


def _pairwise_sum(parts: list[np.ndarray]) -> np.ndarray:
    """Sum in a balanced binary tree: the error grows with log(len), not len."""
    while len(parts) > 1:
        nxt = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]


class NumpyMatmul(Candidate):
    name = "numpy"
    summary = "numpy.matmul (the installed BLAS), operands gathered only if BLAS cannot take them"

    def unavailable(self, p: Problem) -> str | None:
        return None

    def run(self, p: Problem) -> None:
        out = p.out.to_array()
        np.matmul(_blas_array(p.a), _blas_array(p.b), out=out)


class NumpySplitK(Candidate):
    def __init__(self, chunk: int):
        self.chunk = chunk
        self.name = f"numpy_splitk{chunk}"
        self.summary = f"numpy.matmul over K-chunks of {chunk}, summed pairwise"

    def unavailable(self, p: Problem) -> str | None:
        if p.k < 4 * self.chunk:
            return f"K={p.k} shorter than 4 chunks of {self.chunk}"
        return None

    def run(self, p: Problem) -> None:
        a, b = _blas_array(p.a), _blas_array(p.b)
        parts = [np.matmul(a[:, :, k0:k0 + self.chunk], b[:, k0:k0 + self.chunk, :])
                 for k0 in range(0, p.k, self.chunk)]
        p.out.to_array()[...] = _pairwise_sum(parts)


class CpuSyrk(Candidate):
    name = "blas_syrk"
    summary = "BLAS ssyrk/dsyrk for X·Xᵀ (half the products), upper triangle mirrored"

    def unavailable(self, p: Problem) -> str | None:
        if not p.symmetric:
            return "only for X·Xᵀ (b is not a.T)"
        return None

    def run(self, p: Problem) -> None:
        from scipy.linalg import blas  # noqa: PLC0415 (scipy import is slow; only when used)

        syrk = blas.ssyrk if p.dtype == np.float32 else blas.dsyrk
        a = _blas_array(p.a)
        out = p.out.to_array()
        for i in range(p.batches):
            x = a[i]
            # Fortran-ordered xᵀ (no copy for a C-ordered x): syrk(trans=1) gives x·xᵀ.
            c = syrk(1.0, x.T, trans=1, lower=0)
            upper = np.triu(c)
            out[i] = upper + np.triu(c, 1).T


class CpuDirect(Candidate):
    name = "direct_einsum"
    summary = "numpy.einsum loop without BLAS, for tiny products"

    def unavailable(self, p: Problem) -> str | None:
        if p.m * p.n * p.k > 4096:
            return f"M·N·K = {p.m * p.n * p.k} > 4096: BLAS is the better tool"
        return None

    def run(self, p: Problem) -> None:
        np.einsum("bmk,bkn->bmn", p.a.to_array(), p.b.to_array(), out=p.out.to_array(),
                  optimize=False)


def cpu_candidates() -> list[Candidate]:
    """All CPU candidates, in the order used when tuning is off."""
    return [NumpyMatmul(), CpuSyrk(), NumpySplitK(4096), NumpySplitK(16384), CpuDirect()]
