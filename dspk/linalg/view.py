"""MatrixView: a batch of matrices described by shape, strides and offset over a 1-D buffer.

A view costs nothing to make: a transpose swaps two strides, a column range moves the offset.
Every kernel and BLAS call in `dspk.linalg` takes views, and checks them first (`check`), so an
out-of-bounds view is refused before anything is launched.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ..backend import cupy_module, is_cupy_array
from ..kernels import gather

__all__ = ["MatrixView", "INT32_MAX"]

INT32_MAX = 2**31 - 1


def _is_1d_buffer(x: Any) -> bool:
    if is_cupy_array(x):
        return x.ndim == 1 and (x.size <= 1 or x.strides[0] == x.itemsize)
    return isinstance(x, np.ndarray) and x.ndim == 1 and (x.size <= 1 or x.strides[0] == x.itemsize)


class MatrixView:
    """``shape = (batches, rows, cols)`` matrices over a 1-D NumPy or CuPy ``buffer``.

    Element ``[b, i, j]`` is ``buffer[offset + b*strides[0] + i*strides[1] + j*strides[2]]``;
    strides and offset count elements, not bytes. Strides may be zero (broadcast) or negative.

    Parameters
    ----------
    buffer : numpy.ndarray or cupy.ndarray
        One-dimensional, contiguous.
    shape : tuple of int
        ``(batches, rows, cols)``, or ``(rows, cols)`` for a single matrix.
    strides : tuple of int
        Element strides, same length as ``shape``.
    offset : int
        Index in ``buffer`` of element ``[0, 0, 0]``.
    name : str
        How error messages refer to this view (``"a"``, ``"b"``, ``"out"``...).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.arange(12.0, dtype=np.float32)
    >>> v = MatrixView(x, (3, 4), (4, 1))          # a 3x4 row-major matrix
    >>> v.T.to_array()[0].shape
    (4, 3)
    >>> v.cols(1, 3).to_array()[0]
    array([[ 1.,  2.],
           [ 5.,  6.],
           [ 9., 10.]], dtype=float32)
    """

    __slots__ = ("buffer", "shape", "strides", "offset", "name")

    def __init__(self, buffer: Any, shape: tuple, strides: tuple, offset: int = 0,
                 name: str = "view"):
        if not _is_1d_buffer(buffer):
            raise TypeError(f"{name}: buffer must be a 1-D contiguous NumPy or CuPy array, got "
                            f"{type(buffer).__name__} with shape {getattr(buffer, 'shape', None)}")
        shape = tuple(int(s) for s in shape)
        strides = tuple(int(s) for s in strides)
        if len(shape) == 2:
            shape = (1,) + shape
            strides = (0,) + strides
        if len(shape) != 3 or len(strides) != 3:
            raise ValueError(f"{name}: shape and strides must have 2 or 3 entries "
                             f"(batches, rows, cols), got shape={shape}, strides={strides}")
        if any(s < 0 for s in shape):
            raise ValueError(f"{name}: shape must be non-negative, got {shape}")
        self.buffer = buffer
        self.shape = shape
        self.strides = strides
        self.offset = int(offset)
        self.name = name

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def of(cls, array: Any, name: str = "view") -> "MatrixView":
        """Wrap a 2-D or 3-D NumPy/CuPy array without copying.

        Raises
        ------
        TypeError
            If ``array`` is not a NumPy or CuPy array.
        ValueError
            If it is not 2-D or 3-D, or its byte strides are not multiples of its item size.
        """
        if isinstance(array, MatrixView):
            return array.named(name)
        if not (isinstance(array, np.ndarray) or is_cupy_array(array)):
            raise TypeError(f"{name}: expected a NumPy or CuPy array or a MatrixView, "
                            f"got {type(array).__name__}")
        if array.ndim not in (2, 3):
            raise ValueError(f"{name}: expected a 2-D [rows, cols] or 3-D [batches, rows, cols] "
                             f"array, got {array.ndim}-D with shape {array.shape}")
        item = array.itemsize
        if any(s % item for s in array.strides):
            raise ValueError(f"{name}: byte strides {array.strides} are not multiples of the "
                             f"item size {item}")
        estrides = tuple(s // item for s in array.strides)
        if array.size == 0:
            xp = cupy_module() if is_cupy_array(array) else np
            return cls(xp.empty(0, array.dtype), array.shape, estrides, 0, name)
        # Re-origin at the lowest address so that the 1-D buffer starts there.
        flip = tuple(slice(None, None, -1) if s < 0 else slice(None) for s in array.strides)
        low = array[flip]
        lo = sum(min(0, s * (n - 1)) for s, n in zip(estrides, array.shape))
        hi = sum(max(0, s * (n - 1)) for s, n in zip(estrides, array.shape))
        span = hi - lo + 1
        if is_cupy_array(array):
            cp = cupy_module()
            buf = cp.ndarray((span,), array.dtype, memptr=low.data)
        else:
            buf = np.lib.stride_tricks.as_strided(low, shape=(span,), strides=(item,),
                                                  writeable=array.flags.writeable)
        return cls(buf, array.shape, estrides, -lo, name)

    def named(self, name: str) -> "MatrixView":
        return MatrixView(self.buffer, self.shape, self.strides, self.offset, name)

    # -- basic properties ------------------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        return self.buffer.dtype

    @property
    def itemsize(self) -> int:
        return self.buffer.itemsize

    @property
    def is_gpu(self) -> bool:
        return is_cupy_array(self.buffer)

    @property
    def xp(self) -> ModuleType:
        return cupy_module() if self.is_gpu else np

    @property
    def batches(self) -> int:
        return self.shape[0]

    @property
    def nrows(self) -> int:
        return self.shape[1]

    @property
    def ncols(self) -> int:
        return self.shape[2]

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1] * self.shape[2]

    @property
    def device_id(self) -> int | None:
        return self.buffer.device.id if self.is_gpu else None

    @property
    def ptr(self) -> int:
        """Address of element [0, 0, 0] (host address for NumPy buffers)."""
        base = self.buffer.data.ptr if self.is_gpu else self.buffer.ctypes.data
        return base + self.offset * self.itemsize

    def __repr__(self) -> str:
        where = f"cuda:{self.device_id}" if self.is_gpu else "cpu"
        return (f"MatrixView({self.name!r}, shape={self.shape}, strides={self.strides}, "
                f"offset={self.offset}, dtype={self.dtype}, buffer size={self.buffer.size}, "
                f"{where})")

    # -- derived views -----------------------------------------------------------------------
    @property
    def T(self) -> "MatrixView":
        """The transposed view: rows and columns (and their strides) swapped."""
        b, r, c = self.shape
        sb, sr, sc = self.strides
        return MatrixView(self.buffer, (b, c, r), (sb, sc, sr), self.offset, self.name)

    def rows(self, start: int, stop: int) -> "MatrixView":
        """Rows ``start:stop`` (offset moved, nothing copied)."""
        start, stop = self._range(start, stop, self.shape[1], "rows")
        return MatrixView(self.buffer, (self.shape[0], stop - start, self.shape[2]), self.strides,
                          self.offset + start * self.strides[1], self.name)

    def cols(self, start: int, stop: int) -> "MatrixView":
        """Columns ``start:stop`` (offset moved, nothing copied)."""
        start, stop = self._range(start, stop, self.shape[2], "cols")
        return MatrixView(self.buffer, (self.shape[0], self.shape[1], stop - start), self.strides,
                          self.offset + start * self.strides[2], self.name)

    def batch(self, start: int, stop: int) -> "MatrixView":
        """Batches ``start:stop``."""
        start, stop = self._range(start, stop, self.shape[0], "batches")
        return MatrixView(self.buffer, (stop - start,) + self.shape[1:], self.strides,
                          self.offset + start * self.strides[0], self.name)

    def broadcast_to(self, batches: int) -> "MatrixView":
        """A single-batch view repeated ``batches`` times (batch stride 0)."""
        if self.shape[0] != 1:
            raise ValueError(f"{self.name}: only a single-batch view can be broadcast, "
                             f"this one has {self.shape[0]} batches")
        return MatrixView(self.buffer, (batches,) + self.shape[1:], (0,) + self.strides[1:],
                          self.offset, self.name)

    def _range(self, start: int, stop: int, n: int, what: str) -> tuple[int, int]:
        if not (0 <= start <= stop <= n):
            raise ValueError(f"{self.name}: {what} range [{start}, {stop}) is outside [0, {n})")
        return int(start), int(stop)

    # -- bounds --------------------------------------------------------------------------------
    def extent(self) -> tuple[int, int]:
        """Lowest and highest buffer index reached (``(0, -1)`` for an empty view)."""
        if self.size == 0:
            return 0, -1
        lo = self.offset + sum(min(0, s * (n - 1)) for s, n in zip(self.strides, self.shape))
        hi = self.offset + sum(max(0, s * (n - 1)) for s, n in zip(self.strides, self.shape))
        return lo, hi

    def check(self, index_bits: int = 64) -> "MatrixView":
        """Refuse a view that reaches outside its buffer, or beyond 32-bit indices when the
        kernel about to read it indexes with 32 bits (``index_bits=32``).

        Raises
        ------
        ValueError
            Naming the view and the bound it breaks.
        """
        lo, hi = self.extent()
        if self.size == 0:
            return self
        if lo < 0:
            raise ValueError(f"{self.name}: lowest element reached is buffer index {lo} < 0 "
                             f"({self!r})")
        if hi >= self.buffer.size:
            raise ValueError(f"{self.name}: highest element reached is buffer index {hi} >= "
                             f"buffer size {self.buffer.size} ({self!r})")
        if index_bits == 32 and hi > INT32_MAX:
            raise ValueError(f"{self.name}: highest element index {hi} exceeds the 32-bit index "
                             f"bound {INT32_MAX} of this kernel ({self!r})")
        return self

    def fits_int32(self) -> bool:
        lo, hi = self.extent()
        return hi <= INT32_MAX

    def byte_range(self) -> tuple[int, int]:
        """[first, last] byte addresses touched (for overlap tests); (0, -1) when empty."""
        if self.size == 0:
            return 0, -1
        lo, hi = self.extent()
        base = self.buffer.data.ptr if self.is_gpu else self.buffer.ctypes.data
        return base + lo * self.itemsize, base + (hi + 1) * self.itemsize - 1

    # -- layout ------------------------------------------------------------------------------
    def layout(self) -> str:
        """``"R"`` row-major or ``"C"`` column-major (each matrix usable by BLAS with a leading
        dimension), else ``"S"`` (needs a gather before BLAS)."""
        b, r, c = self.shape
        sb, sr, sc = self.strides
        if b > 1 and sb < 0:
            return "S"
        if (sc == 1 or c <= 1) and (r <= 1 or sr >= max(c, 1)):
            return "R"
        if (sr == 1 or r <= 1) and (c <= 1 or sc >= max(r, 1)):
            return "C"
        return "S"

    def leading_dim(self, layout: str) -> int:
        """BLAS leading dimension for layout ``"R"`` (row stride) or ``"C"`` (column stride)."""
        b, r, c = self.shape
        if layout == "R":
            return max(self.strides[1], c, 1) if r > 1 else max(c, 1)
        return max(self.strides[2], r, 1) if c > 1 else max(r, 1)

    def is_transpose_of(self, other: "MatrixView") -> bool:
        """True when this view is exactly ``other.T`` over the same memory (X·Xᵀ detection)."""
        return (self.buffer.dtype == other.buffer.dtype and self.ptr == other.ptr
                and self.is_gpu == other.is_gpu
                and self.shape == (other.shape[0], other.shape[2], other.shape[1])
                and self.strides[1:] == (other.strides[2], other.strides[1])
                and (self.shape[0] == 1 or self.strides[0] == other.strides[0]))

    # -- materializing -----------------------------------------------------------------------
    def to_array(self) -> Any:
        """A strided NumPy/CuPy array over the same memory (3-D); checks bounds first."""
        self.check()
        if self.size == 0:
            return self.xp.empty(self.shape, self.dtype)
        item = self.itemsize
        if self.is_gpu:
            cp = cupy_module()
            return cp.ndarray(self.shape, self.dtype, memptr=self.buffer.data + self.offset * item,
                              strides=tuple(s * item for s in self.strides))
        base = self.buffer[self.offset:] if self.offset >= 0 else self.buffer
        return np.lib.stride_tricks.as_strided(base, shape=self.shape,
                                               strides=tuple(s * item for s in self.strides),
                                               writeable=self.buffer.flags.writeable)

    def contiguous(self) -> "MatrixView":
        """A row-major copy in a new buffer, in one pass (a gather kernel on the GPU).

        A broadcast view (batch stride 0) keeps stride 0 and gathers one batch only.
        """
        self.check()
        b, r, c = self.shape
        nb = 1 if (b > 1 and self.strides[0] == 0) else b
        src = MatrixView(self.buffer, (nb, r, c), self.strides, self.offset, self.name)
        if self.is_gpu:
            buf = gather(src)
        else:
            buf = np.ascontiguousarray(src.to_array()).reshape(-1)
        sb = 0 if nb != b else r * c
        return MatrixView(buf, (b, r, c), (sb, c, 1), 0, self.name)

    def aligned(self, alignment: int = 16) -> "MatrixView":
        """This view if BLAS can take it as it is and its start is ``alignment``-byte aligned,
        else a contiguous, aligned copy (`contiguous`)."""
        if self.layout() != "S" and self.ptr % alignment == 0:
            return self
        return self.contiguous()
