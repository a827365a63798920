"""The tuner's checks, done on the host: sampled rows and columns of a view read into NumPy,
sampled rows of an output overwritten, and two results compared.

Why by hand: on the GPU, CuPy compiles each elementwise and reduction kernel it meets with
NVRTC on first use (0.1-1.5 s each, measured on an H100 with CuPy 14: `abs`, `astype`, fancy
indexing, `all`, `max`, `linalg.norm`, which also imports cupyx and scipy.sparse). A first
call's checks met a dozen of them, 3-8 s in all, for products that take a fraction of a
millisecond. Here a GPU read goes through dspk's own prebuilt gather kernel
(`dspk.kernels.gather`) and a copy to the host, a write is a 2-D memcpy, and the arithmetic
is NumPy's: nothing is compiled in the call. On the CPU the same functions index NumPy arrays.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..backend import cupy_module, is_cupy_array
from ..kernels import gather
from .view import MatrixView

__all__ = ["read_rows", "read_cols", "read_matrix", "fill_rows", "to_host",
           "max_relative_difference", "identical"]


def _one(view: MatrixView, b: int) -> MatrixView:
    return view.batch(b, b + 1)


#: the dtype the gather kernel copies a dtype of each item size as (a copy moves bits: an
#: int64 output read as float64 keeps its value exactly)
_AS = {1: np.uint8, 2: np.int16, 4: np.float32, 8: np.float64}


def _get(view: MatrixView) -> np.ndarray:
    """A GPU view's elements as a row-major NumPy array of its shape."""
    dtype = view.dtype
    if dtype.itemsize in _AS and dtype != _AS[dtype.itemsize]:
        view = MatrixView(view.buffer.view(_AS[dtype.itemsize]), view.shape, view.strides,
                          view.offset, view.name)
    return gather(view).get().view(dtype).reshape(view.shape)


def read_rows(view: MatrixView, batches: Sequence[int], rows: Sequence[int]) -> np.ndarray:
    """``view[batches][:, rows, :]`` as a NumPy array ``[len(batches), len(rows), ncols]``."""
    if not view.is_gpu:
        arr = view.to_array()
        return np.stack([arr[b][list(rows)] for b in batches])
    return np.stack([np.concatenate([_get(_one(view, b).rows(r, r + 1))[0] for r in rows])
                     for b in batches])


def read_cols(view: MatrixView, batches: Sequence[int], cols: Sequence[int]) -> np.ndarray:
    """``view[batches][:, :, cols]`` as a NumPy array ``[len(batches), nrows, len(cols)]``."""
    if not view.is_gpu:
        arr = view.to_array()
        return np.stack([arr[b][:, list(cols)] for b in batches])
    return np.stack([np.concatenate([_get(_one(view, b).cols(c, c + 1))[0] for c in cols],
                                    axis=1) for b in batches])


def read_matrix(view: MatrixView, batches: Sequence[int]) -> np.ndarray:
    """``view[batches]`` as a NumPy array ``[len(batches), nrows, ncols]``."""
    if not view.is_gpu:
        arr = view.to_array()
        return np.stack([arr[b] for b in batches])
    return np.concatenate([_get(_one(view, b)) for b in batches])


def fill_rows(view: MatrixView, batches: Sequence[int], rows: Sequence[int], value: Any) -> None:
    """Set every element of rows ``rows`` of batches ``batches`` of ``view`` to ``value``
    (cast to the view's dtype). On the GPU each row is one 2-D memcpy from the host on the
    current stream (its elements are the copy's rows, its column stride the pitch)."""
    if not view.is_gpu:
        arr = view.to_array()
        for b in batches:
            arr[b, list(rows), :] = value
        return
    cp = cupy_module()
    item = view.itemsize
    n, sc = view.ncols, view.strides[2]
    if n == 0:
        return
    if sc == 0:
        n = 1                                     # a broadcast row: one element
    src = np.full(n, value).astype(view.dtype)
    stream = cp.cuda.get_current_stream()
    for b in batches:
        for r in rows:
            row = _one(view, b).rows(r, r + 1)
            ptr, pitch = row.ptr, abs(sc) * item
            if sc < 0:
                ptr += sc * (n - 1) * item        # the lowest address; the order is moot
            if n == 1 or abs(sc) == 1:
                cp.cuda.runtime.memcpyAsync(ptr, src.ctypes.data, n * item,
                                            cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
            else:
                cp.cuda.runtime.memcpy2DAsync(ptr, pitch, src.ctypes.data, item, item, n,
                                              cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
    stream.synchronize()                          # (src is pageable host memory)


def to_host(x: Any) -> np.ndarray:
    """A NumPy array of ``x``'s values: NumPy as it is; CuPy copied (a contiguous array by a
    plain copy; a 2-D or 3-D strided one through the gather kernel)."""
    if not is_cupy_array(x):
        return np.asarray(x)
    if x.flags.c_contiguous or x.ndim not in (2, 3):
        return x.get()
    return _get(MatrixView.of(x)).reshape(x.shape)


def max_relative_difference(got: Any, ref: Any) -> float:
    """``max|got - ref| / max|ref|`` (``max|ref|`` taken as 1 when it is 0), in the arrays'
    own dtype, on the host; NaN anywhere gives NaN (a failed comparison)."""
    g, r = to_host(got), to_host(ref)
    if r.size == 0:
        return 0.0
    scale = float(np.abs(r).max()) or 1.0
    return float(np.abs(g - r).max()) / scale


def identical(got: Any, ref: Any) -> bool:
    """Whether ``got`` and ``ref`` hold the same values (compared on the host)."""
    return bool(np.array_equal(to_host(got), to_host(ref)))
