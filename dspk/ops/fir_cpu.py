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

__all__ = ["toeplitz_correlate", "toeplitz_block", "ToeplitzBank", "gemm"]

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


def gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``numpy.matmul(a, b)`` (stacked, broadcast) through BLAS's ?gemm proper: a product with
    one row or one column (OpenBLAS >= 0.3.27 forwards those to ?gemv, whose sums go in
    another order) is padded to two (a repeated row of a, a zero column of b) and cut back, so
    that every output is the same sum in the order of the inner dimension whatever the shapes
    around it (`ToeplitzBank`'s pieces against `toeplitz_correlate`)."""
    m, n = a.shape[-2], b.shape[-1]
    if m == 1:
        a = np.concatenate([a, a], axis=-2)
    if n == 1:
        b = np.concatenate([b, np.zeros_like(b)], axis=-1)
    out = np.matmul(a, b)
    return out[..., :m, :n] if m == 1 or n == 1 else out


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
        y = gemm(win, h[:, :m + t - 1, :m])            # [k, channels, m]
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
            if c == 1 or length == 1:                   # (one row or column: `gemm`)
                o4[i, b0:b1] = gemm(a3[b0:b1], h[i])
            else:
                np.matmul(a3[b0:b1], h[i], out=o4[i, b0:b1])

    parallel_blocks(run, zip(edges[:-1], edges[1:]))


#: output samples per product of `ToeplitzBank.interior` (the filters stacked side by side:
#: one product [blocks, L + T − 1]·[L + T − 1, k·L] per channel). Measured on 2 cores, 384 x
#: 30 000 float32 and 6 x 61 taps, the products alone: L = 8/16/24/32/48/64 took
#: 82/68/73/79/87/97 ms (the band's waste (L + T − 1)/T against the product's efficiency).
STACKED_BLOCK = 16


class ToeplitzBank:
    """The products of `toeplitz_correlate` for a bank of ``k`` filters on rows of ``n``
    samples, in pieces a caller reduces while they are in cache (spike detection needs only
    the per-sample best of the bank and, at a few windows, the exact outputs: the whole
    [channels, k, n] output is never written).

    The pieces give the same bits as `toeplitz_correlate` (and as `dspk.fir_bank` where the
    tuner chose ``toeplitz_gemm``) where the BLAS sums each product in the order of its inner
    dimension, as OpenBLAS's one-thread ``?gemm`` does: the zeros of the band add nothing, so
    an output is the same sum of the same T products whatever the block length (checked by the
    tests against `toeplitz_correlate`).

    Parameters
    ----------
    weights : numpy.ndarray
        [k, T] filters (correlated, not reversed), 1 <= T <= n.
    n : int
        Samples per row.
    dtype : numpy dtype
        float32 or float64: the products' precision (x's).
    length : int, optional
        Output samples per block of `interior` (default `STACKED_BLOCK`).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops.fir_cpu import ToeplitzBank, toeplitz_correlate
    >>> x = np.random.default_rng(0).standard_normal((2, 100)).astype(np.float32)
    >>> w = np.random.default_rng(1).standard_normal((3, 11))
    >>> tb = ToeplitzBank(w, 100, np.float32)
    >>> ref = toeplitz_correlate(x, w)
    >>> out = np.empty((tb.blocks, 3 * tb.length), dtype=np.float32)
    >>> tb.interior(x, 1, out)
    >>> mid = out.reshape(tb.blocks, 3, tb.length).transpose(1, 0, 2).reshape(3, -1)
    >>> bool(np.array_equal(mid, ref[1, :, tb.half:tb.stop]))
    True
    >>> bool(np.array_equal(tb.span(x, 0, tb.half), ref[:, :, :tb.half]))
    True
    >>> win = tb.windows(x, np.array([0, 1]), np.array([0, 95]), 5)
    >>> bool(np.array_equal(win[1], ref[1, :, 95:]))
    True
    """

    def __init__(self, weights: np.ndarray, n: int, dtype: Any, length: int | None = None):
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 2 or w.shape[0] == 0 or not 1 <= w.shape[1] <= n:
            raise ValueError(f"weights: expected [k, taps] with 1 <= taps <= {n}, got shape "
                             f"{w.shape}")
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype: expected float32 or float64, got {self.dtype}")
        self.k, self.taps = w.shape
        self.n = int(n)
        self.half = self.taps // 2
        self.length = STACKED_BLOCK if length is None else int(length)
        if self.length < 1:
            raise ValueError(f"length: expected a positive block length, got {self.length}")
        #: full blocks: outputs [half, stop), each block's window inside the row
        self.blocks = (self.n - self.taps + 1) // self.length
        self.stop = self.half + self.blocks * self.length
        self.weights = w
        edge = max(self.half, self.n - self.stop, 1)
        self._h = toeplitz_matrices(w, max(self.length, edge), self.dtype)
        self._stacked: dict[int, np.ndarray] = {}
        self.stacked = self.stacked_matrix(self.length)

    def stacked_matrix(self, length: int) -> np.ndarray:
        """[length + T − 1, k·length]: the k Toeplitz matrices side by side (kept)."""
        h = self._stacked.get(length)
        if h is None:
            h = toeplitz_matrices(self.weights, length, self.dtype)
            h = np.ascontiguousarray(h.transpose(1, 0, 2).reshape(length + self.taps - 1,
                                                                   self.k * length))
            self._stacked[length] = h
        return h

    def interior(self, x: np.ndarray, row: int, out: np.ndarray) -> None:
        """Outputs [half, stop) of row ``row`` of x (contiguous samples) into ``out``
        [blocks, k·L] (block b, filter i, sample l is output half + b·L + l): one product of
        the row's overlapping windows (a strided view, no copy) with `stacked`. BLAS as set by
        the caller (one thread inside `parallel_blocks`)."""
        if self.blocks == 0:
            return
        it = x.itemsize
        kk = self.length + self.taps - 1
        a = as_strided(x[row], shape=(self.blocks, kk), strides=(self.length * it, it),
                       writeable=False)
        if self.blocks == 1 or self.stacked.shape[1] == 1:   # (one row or column: `gemm`)
            out[...] = gemm(a, self.stacked)
        else:
            np.matmul(a, self.stacked, out=out)

    def span(self, x: np.ndarray, t0: int, t1: int) -> np.ndarray:
        """[rows, k, t1 − t0]: outputs [t0, t1) of every row of x (the edges, whose windows
        reach outside the row: a zero-padded copy, as `toeplitz_correlate`'s)."""
        m = t1 - t0
        if m <= 0:
            return np.zeros((x.shape[0], self.k, 0), dtype=self.dtype)
        t = self.taps
        a0, a1 = t0 - self.half, t1 - self.half + t - 1
        win = np.zeros((x.shape[0], a1 - a0), dtype=self.dtype)
        s0, s1 = max(a0, 0), min(a1, x.shape[1])
        win[:, s0 - a0:s1 - a0] = x[:, s0:s1]
        h = self._h if m <= self._h.shape[2] else toeplitz_matrices(self.weights, m, self.dtype)
        return gemm(win, h[:, :m + t - 1, :m]).transpose(1, 0, 2)

    def windows(self, x: np.ndarray, rows: np.ndarray, starts: np.ndarray,
                length: int) -> np.ndarray:
        """[m, k, length]: outputs [starts[j], starts[j] + length) of row rows[j] of x (zero
        outside the row), one product of the gathered windows with `stacked_matrix`."""
        kk = length + self.taps - 1
        n = x.shape[1]
        a0 = np.asarray(starts, dtype=np.int64) - self.half
        rows = np.asarray(rows, dtype=np.int64)
        win = np.empty((len(a0), kk), dtype=self.dtype)
        inside = (a0 >= 0) & (a0 + kk <= n)
        if n >= kk and np.any(inside):
            it = x.itemsize
            every = as_strided(x, shape=(x.shape[0], n - kk + 1, kk),
                               strides=(x.strides[0], it, it), writeable=False)
            win[inside] = every[rows[inside], a0[inside]]
        out_ = ~inside
        if np.any(out_):
            j = a0[out_, None] + np.arange(kk)
            ok = (j >= 0) & (j < n)
            win[out_] = np.where(ok, x[rows[out_, None], np.clip(j, 0, n - 1)], 0)
        return gemm(win, self.stacked_matrix(length)).reshape(len(a0), self.k, length)
