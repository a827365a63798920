"""FIR correlation on the CPU as matrix products (BLAS), one of the implementations the tuner
chooses among for `dspk.ops.fir_filter` and `dspk.ops.fir_bank`.

Output samples are taken in blocks of ``L``: the block starting at sample t0 of filter i is
the product of the input window ``x[:, t0 − c : t0 − c + L + T − 1]`` ([channels, L + T − 1],
an ordinary strided matrix: rows of x, no copy) with the banded Toeplitz matrix
``H_i[m, p] = w_i[m − p]`` ([L + T − 1, L]), written straight into ``out[:, i, t0 : t0 + L]``
(row stride k·n: no copy either). The products go through `numpy.matmul` on stacked views of
x and out, BLAS on one thread, in `BLOCKS` groups of output blocks fixed by the shape and
shared among the engine's threads (`dspk.linalg.threads.parallel_blocks`), so the bits do not
depend on the thread count. (OpenBLAS's grouped ?gemm_batch, which shares whole products among
its own threads, was as fast on 2 idle cores, and 2.4-2.8x slower than these blocks when
another process held one of the cores: its threads wait for each other after every round of
products; the blocks here are taken from a queue by whichever thread is free.)

A product of H costs (L + T − 1)·L multiply-adds for L·T useful ones — ~2x for a 61-tap bank
in blocks of 64 — but runs at the BLAS rate (measured on 2 cores of an AMD EPYC, float32
sgemm: ~170 GFLOP/s in this shape), where whole-row FFTs spend most of their time in
per-filter inverse transforms: 384 x 30 000 float32 and 6 x 61 taps, 130 ms (the output's
pages faulted in by the writes included) against 270-330 ms.

The first ``c`` and the last few output samples, whose windows reach outside x, are computed
from small zero-padded copies of x's ends with the same Toeplitz matrices (`numpy.matmul`,
BLAS on one thread).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..linalg.threads import parallel_blocks, single_threaded_blas

__all__ = ["toeplitz_correlate", "toeplitz_block"]

#: groups of output blocks handed to one thread at a time (a function of the shape alone: the
#: bits do not depend on the thread count); more than threads, so that a thread slowed by
#: another process leaves the rest to the others
BLOCKS = 32


def toeplitz_block(taps: int) -> int:
    """The output block length L used for filters of ``taps`` taps: measured on 2 cores
    (float32, 384 channels x 30 000): 61 taps, L = 32/48/56/64/72/96/128 took 136/116/104/101/
    113/131/155 ms; 263 taps, L = 32/48/64/96/128 took 48/50/51/54/54 ms — the wasted share
    (L + T − 1)/T against the GEMM's efficiency at N = L.

    Examples
    --------
    >>> from dspk.ops.fir_cpu import toeplitz_block
    >>> toeplitz_block(61), toeplitz_block(263)
    (64, 32)
    """
    return 64 if taps <= 128 else 32


def toeplitz_matrices(weights: np.ndarray, length: int, dtype: Any) -> np.ndarray:
    """[k, length + T − 1, length]: ``H[i, m, p] = weights[i, m − p]`` (0 <= m − p < T), in
    ``dtype``; its top-left [m + T − 1, m] corner is the matrix of m outputs."""
    k, t = weights.shape
    h = np.zeros((k, length + t - 1, length), dtype=dtype)
    w = weights.astype(dtype)
    for p in range(length):
        h[:, p:p + t, p] = w
    return h


def toeplitz_correlate(x: np.ndarray, weights: np.ndarray, block: int | None = None) -> np.ndarray:
    """``out[c, i, t] = Σ_j weights[i, j]·x[c, t + j − T//2]`` (zero outside x) by blocked
    Toeplitz matrix products; the same sums as `dspk.ops.fir_bank`'s reference (overlap-add,
    scipy.signal.oaconvolve), within float rounding.

    Parameters
    ----------
    x : numpy.ndarray
        [channels, samples], float32 or float64 (the products run in x's precision); rows may
        be strided (copied when the samples are not contiguous).
    weights : numpy.ndarray
        [k, T] filters (correlated, not reversed), converted to x's dtype; T <= samples.
    block : int, optional
        Output samples per product (default `toeplitz_block`).

    Returns
    -------
    numpy.ndarray
        [channels, k, samples], x's dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops.fir_cpu import toeplitz_correlate
    >>> x = np.zeros((1, 7), dtype=np.float32)
    >>> x[0, 3] = 1.0
    >>> toeplitz_correlate(x, np.array([[1.0, 2.0, 3.0]]))[0, 0]
    array([0., 0., 3., 2., 1., 0., 0.], dtype=float32)
    """
    if x.ndim != 2 or x.dtype not in (np.float32, np.float64):
        raise ValueError(f"x: expected a 2-D float32/float64 array, got {x.dtype} {x.shape}")
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] == 0 or w.shape[1] > x.shape[1]:
        raise ValueError(f"weights: expected [k, taps] with 1 <= taps <= {x.shape[1]}, got "
                         f"shape {w.shape}")
    k, t = w.shape
    c, n = x.shape
    length = toeplitz_block(t) if block is None else int(block)
    if length < 1:
        raise ValueError(f"block: expected a positive block length, got {length}")
    it = x.itemsize
    if x.strides[1] != it or x.strides[0] % it or x.strides[0] < 0:
        x = np.ascontiguousarray(x)
    out = np.empty((c, k, n), dtype=x.dtype)
    if c == 0 or k == 0:
        return out
    half = t // 2
    # full blocks: outputs [half, half + nb·L), each window inside x
    nb = (n - t + 1) // length
    edge = max(half, n - half - nb * length)          # longest edge computed from a copy
    h = toeplitz_matrices(w, max(length, edge), x.dtype)
    if nb > 0:
        _interior(x, h[:, :length + t - 1, :length], out, nb, length, half)
    tail0 = half + nb * length
    _edge(x, h, out, 0, half)
    _edge(x, h, out, tail0, n)
    return out


def _edge(x: np.ndarray, h: np.ndarray, out: np.ndarray, t0: int, t1: int) -> None:
    """Outputs [t0, t1) from a zero-padded copy of the input they need."""
    if t1 <= t0:
        return
    k, _, _ = h.shape
    t = h.shape[1] - h.shape[2] + 1
    half = t // 2
    m = t1 - t0
    a0, a1 = t0 - half, t1 - half + t - 1               # the window, may reach outside x
    win = np.zeros((x.shape[0], a1 - a0), dtype=x.dtype)
    s0, s1 = max(a0, 0), min(a1, x.shape[1])
    win[:, s0 - a0:s1 - a0] = x[:, s0:s1]
    with single_threaded_blas():
        y = np.matmul(win, h[:, :m + t - 1, :m])       # [k, channels, m]
    out[:, :, t0:t1] = y.transpose(1, 0, 2)


def _interior(x: np.ndarray, h: np.ndarray, out: np.ndarray, nb: int, length: int,
              half: int) -> None:
    """The nb full blocks of L outputs from ``half`` on: window b is x[:, b·L : b·L + L + T −
    1], multiplied by each filter's H into out[:, i, half + b·L : ...] (stacked numpy.matmul,
    BLAS on one thread, `BLOCKS` groups of windows shared among the threads)."""
    k, kk, _ = h.shape
    c, n = x.shape
    it = x.itemsize
    a3 = as_strided(x, shape=(nb, c, kk), strides=(length * it, x.strides[0], it),
                    writeable=False)
    o4 = as_strided(out[:, :, half:], shape=(k, nb, c, length),
                    strides=(n * it, length * it, k * n * it, it))
    edges = np.linspace(0, nb, min(nb, BLOCKS) + 1).astype(int)

    def run(span: tuple) -> None:
        b0, b1 = span
        for i in range(k):
            np.matmul(a3[b0:b1], h[i], out=o4[i, b0:b1])

    parallel_blocks(run, zip(edges[:-1], edges[1:]))
