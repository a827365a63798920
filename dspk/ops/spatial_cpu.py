"""A neighbourhood-sparse spatial filter on the CPU as dense products of row blocks
(`RowBlocksPlan`), one of the implementations `dspk.SpatialFilter` times against the dense
product.

Local whitening, local references and Laplacians give each output channel a few neighbours
(32 of 384 for local whitening). With the channels in probe order, the non-zeros of a block
of consecutive rows of W lie in a narrow range of columns: ``W[r0:r1] · x`` needs only the x
rows of that range. Each block is one BLAS product of [rows, span] by [span, samples] — about
a sixth of the dense product's multiply-adds for local whitening of a Neuropixels probe in
blocks of 32 rows — at the BLAS rate, where scipy.sparse's CSR product (the other sparse
candidate) runs one row at a time without SIMD.

One product per row block and `COLUMN_BLOCK` samples, `numpy.matmul` with BLAS on one thread,
the products shared among the engine's threads (`dspk.linalg.threads.parallel_blocks`), so the
bits do not depend on the thread count. (OpenBLAS's grouped ?gemm_batch was no faster on 2 idle
cores — 18.3 against 16.0 ms for local whitening of 384 x 30 262 float32 in blocks of 32 rows
— and slower when another process held a core: 43.8 against 30.4 ms.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..linalg.threads import parallel_blocks, single_threaded_blas

__all__ = ["RowBlocksPlan", "ROW_BLOCKS", "COLUMN_BLOCK"]

#: rows per block of the plans `dspk.SpatialFilter` times (the tuner keeps the faster)
ROW_BLOCKS = (32, 64)
#: samples per product (the sums do not depend on it): 2048/4096/8192 took 19.1/17.3/16.0 ms
#: for 384 x 30 262 float32 in blocks of 32 rows on 2 cores
COLUMN_BLOCK = 8192
#: a plan whose blocks cover more than this share of W's area is not offered (dense is better)
MAX_AREA = 0.5


class RowBlocksPlan:
    """W [out, in] cut into blocks of ``rows`` consecutive rows, each kept with the one range
    of ``span`` columns that holds all its non-zeros (the same width for every block, so
    that all products share one shape).

    Parameters
    ----------
    w : numpy.ndarray
        [out_channels, channels], float (any); zeros are structural.
    dtype : float32 or float64
        The traces' dtype (W is converted once).
    rows : int
        Rows per block (the last block may have fewer).

    Attributes
    ----------
    span : int
        Columns of every block.
    area : float
        The blocks' share of W's area (rows · span / W.size).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops.spatial_cpu import RowBlocksPlan
    >>> w = np.eye(6) + np.eye(6, k=1)                 # each row: its channel and the next
    >>> plan = RowBlocksPlan(w, np.float64, rows=2)
    >>> plan.span, plan.starts.tolist()
    (3, [0, 2, 3])
    >>> x = np.arange(12.0).reshape(6, 2)
    >>> bool(np.array_equal(plan(x), w @ x))
    True
    """

    def __init__(self, w: np.ndarray, dtype: Any, rows: int) -> None:
        w = np.asarray(w)
        if w.ndim != 2 or w.size == 0:
            raise ValueError(f"w: expected a non-empty 2-D matrix, got shape {w.shape}")
        if rows < 1:
            raise ValueError(f"rows: expected a positive block height, got {rows}")
        n_out, n_in = w.shape
        nz = w != 0
        has = nz.any(axis=1)
        lo = np.where(has, nz.argmax(axis=1), n_in)
        hi = np.where(has, n_in - nz[:, ::-1].argmax(axis=1), 0)
        r0 = np.arange(0, n_out, rows)
        lo_b = np.minimum.reduceat(lo, r0)
        hi_b = np.maximum.reduceat(hi, r0)
        span = max(1, int((hi_b - lo_b).max()))
        # the start of each block's columns: its first non-zero column, moved left where the
        # common span would run past W's last column (empty blocks: any start)
        starts = np.clip(np.where(hi_b > lo_b, lo_b, 0), 0, n_in - span)
        self.rows, self.span = int(rows), span
        self.starts = starts.astype(np.int64)
        self.shape = (n_out, n_in)
        self.dtype = np.dtype(dtype)
        self.area = n_out * span / w.size
        block_rows = np.arange(n_out) // rows
        cols = self.starts[block_rows][:, None] + np.arange(span)[None, :]
        self.wb = np.ascontiguousarray(np.take_along_axis(w, cols, axis=1), dtype=self.dtype)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``W · x`` for x [channels, samples] of the plan's dtype."""
        n_out, n_in = self.shape
        if x.ndim != 2 or x.shape[0] != n_in or x.dtype != self.dtype:
            raise ValueError(f"x: expected [{n_in}, samples] {self.dtype}, got {x.dtype} "
                             f"{x.shape}")
        it = x.itemsize
        if x.strides[1] != it or x.strides[0] % it or x.strides[0] < 0:
            x = np.ascontiguousarray(x)
        n = x.shape[1]
        out = np.empty((n_out, n), dtype=self.dtype)
        if n == 0:
            return out
        rows, span, wb = self.rows, self.span, self.wb
        members = [(int(r), int(a), int(s)) for r, a in zip(range(0, n_out, rows), self.starts)
                   for s in range(0, n, COLUMN_BLOCK)]

        def product(member: tuple) -> None:
            r, a, s = member
            e = min(n, s + COLUMN_BLOCK)
            np.matmul(wb[r:r + rows], x[a:a + span, s:e], out=out[r:r + rows, s:e])

        if len(members) == 1:
            with single_threaded_blas():
                product(members[0])
        else:
            parallel_blocks(product, members)
        return out
