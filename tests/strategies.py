"""Hypothesis strategies for MatrixViews: random shapes, strides (padded, transposed, negative,
broadcast), offsets and column ranges over a 1-D buffer."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from dspk.linalg import MatrixView


@st.composite
def view_geometry(draw, shape):
    """(strides, offset, buffer size) for a valid view of ``shape`` = (B, R, C)."""
    B, R, C = shape
    order = draw(st.sampled_from(["row", "col", "batch-inner"]))
    pad_r = draw(st.integers(0, 3))
    pad_c = draw(st.integers(0, 3))
    if order == "row":
        sc = 1 if draw(st.booleans()) else draw(st.integers(1, 3))
        sr = sc * C + pad_r
        sb = sr * R + pad_c
    elif order == "col":
        sr = 1 if draw(st.booleans()) else draw(st.integers(1, 3))
        sc = sr * R + pad_c
        sb = sc * C + pad_r
    else:  # batches interleaved inside rows
        sb = 1
        sc = B + pad_c
        sr = sc * C + pad_r
    if B > 1 and draw(st.integers(0, 4)) == 0:
        sb = 0  # broadcast
    signs = draw(st.tuples(*[st.sampled_from([1, 1, -1])] * 3))
    strides = tuple(s * g for s, g in zip((sb, sr, sc), signs))
    lo = sum(min(0, s * (n - 1)) for s, n in zip(strides, shape))
    hi = sum(max(0, s * (n - 1)) for s, n in zip(strides, shape))
    head = draw(st.integers(0, 5))
    tail = draw(st.integers(0, 5))
    offset = -lo + head
    size = offset + hi + 1 + tail
    return strides, offset, size


@st.composite
def matrix_views(draw, xp, dtype, shape, name="v"):
    """A valid MatrixView of ``shape`` with random geometry and random contents."""
    strides, offset, size = draw(view_geometry(shape))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":  # integers over the full range: extremes included
        info = np.iinfo(dtype)
        data = rng.integers(info.min, int(info.max) + 1, size, dtype=dtype)
    else:
        data = rng.standard_normal(size).astype(dtype)
    buf = xp.asarray(data)
    return MatrixView(buf, shape, strides, offset, name)


@st.composite
def product_operands(draw, xp, dtype, max_dim=7):
    """(a, b) views for a product, possibly built as transposes or column ranges of wider views,
    with a single-batch operand sometimes (broadcast)."""
    B = draw(st.integers(1, 3))
    M, K, N = (draw(st.integers(1, max_dim)) for _ in range(3))
    Ba = B if draw(st.integers(0, 3)) else 1
    Bb = B if (Ba == 1 or draw(st.integers(0, 3))) else 1

    def operand(batches, rows, cols, name):
        how = draw(st.sampled_from(["plain", "transpose", "cols", "rows"]))
        if how == "transpose":
            return draw(matrix_views(xp, dtype, (batches, cols, rows), name)).T
        if how == "cols":
            extra = draw(st.integers(1, 4))
            start = draw(st.integers(0, extra))
            wide = draw(matrix_views(xp, dtype, (batches, rows, cols + extra), name))
            return wide.cols(start, start + cols)
        if how == "rows":
            extra = draw(st.integers(1, 4))
            start = draw(st.integers(0, extra))
            tall = draw(matrix_views(xp, dtype, (batches, rows + extra, cols), name))
            return tall.rows(start, start + rows)
        return draw(matrix_views(xp, dtype, (batches, rows, cols), name))

    return operand(Ba, M, K, "a"), operand(Bb, K, N, "b")


def reference(a: MatrixView, b: MatrixView) -> np.ndarray:
    """float64 (int64 for integer operands) NumPy reference of a·b, with batch broadcasting."""
    ref_t = np.int64 if a.dtype.kind in "iu" else np.float64

    def host(v):
        arr = v.to_array()
        return np.asarray(arr.get() if hasattr(arr, "get") else arr, dtype=ref_t)

    return np.matmul(host(a), host(b))
