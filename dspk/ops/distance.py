"""Distances through the product engine: ‖a‖² + ‖b‖² − 2·A·Bᵀ."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import array_module, is_cupy_array
from ..kernels import FLOAT_DTYPES, LAUNCH, ctype, declare_instances, kernel
from ..linalg import matmul
from ..finite import api, check_finite
from ._checks import FLOATS

__all__ = ["pairwise_sqdist", "knn"]


def _points(a: Any, name: str) -> Any:
    if not (isinstance(a, np.ndarray) or is_cupy_array(a)):
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got {type(a).__name__}")
    if a.ndim != 2:
        raise ValueError(f"{name}: expected [points, dims], got shape {a.shape}")
    if a.dtype not in FLOATS:
        raise TypeError(f"{name}: unsupported dtype {a.dtype}; expected float32 or float64")
    return array_module(a)


@api
def pairwise_sqdist(a: Any, b: Any) -> Any:
    """Squared Euclidean distances [n, m] between the rows of a [n, d] and b [m, d], as
    ‖a‖² + ‖b‖² − 2·A·Bᵀ (one product), clamped at 0 (rounding can make it slightly negative).

    On the GPU, for few dimensions (up to 32, or up to 128 for outputs up to 2²³ elements), one
    kernel computes norms, products and the clamp per tile and writes the result once (a
    point's distance to an identical point is then exactly 0); otherwise the engine's product is
    finished in place in one pass.

    Parameters
    ----------
    a : array
        [n, d] points, float32 or float64 (NumPy or CuPy).
    b : array
        [m, d] points, the same dtype and array type as ``a``.

    Returns
    -------
    array
        [n, m] in the points' dtype and array type.

    Raises
    ------
    TypeError
        Not arrays, dtypes other than float32/float64 or different for a and b, NumPy mixed
        with CuPy.
    ValueError
        Not 2-D, or different numbers of dimensions d.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import pairwise_sqdist
    >>> a = np.array([[0.0, 0.0], [3.0, 4.0]])
    >>> b = np.array([[0.0, 0.0], [1.0, 1.0], [3.0, 0.0]])
    >>> pairwise_sqdist(a, b)
    array([[ 0.,  2.,  9.],
           [25., 13., 16.]])
    """
    xp = _points(a, "a")
    if _points(b, "b") is not xp:
        raise TypeError("a and b mix NumPy and CuPy arrays")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a has {a.shape[1]} dimensions but b has {b.shape[1]}")
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}; convert one explicitly")
    check_finite(a, "a", ("row", "column"))
    check_finite(b, "b", ("row", "column"))
    if xp is not np and _direct(a.shape[0], b.shape[0], a.shape[1]):
        return _sqdist_direct(a, b)
    ab = matmul(a, b.T)                 # a new [n, m] array: finished in place
    na = (a * a).sum(axis=1)
    nb = (b * b).sum(axis=1)
    if xp is not np:
        return _finish_gpu(ab, na, nb)
    # NumPy's expression na[:, None] + nb[None, :] - 2 * ab with one [n, m] temporary, not
    # four (2 * ab is exact, so the bits are the same)
    ab *= 2
    np.subtract(na[:, None] + nb[None, :], ab, out=ab)
    return np.maximum(ab, 0, out=ab)


def _expression(name: str, dtype: Any) -> str:
    return f"{name}<{ctype(dtype)}>"


declare_instances("distance.cu", lambda props: [_expression(n, dt) for dt in FLOAT_DTYPES
                                                for n in ("sqdist_finish", "sqdist_direct")])


def _finish_gpu(ab: Any, na: Any, nb: Any) -> Any:
    """The same expression on the GPU in one pass over ab (dspk/kernels/distance.cu)."""
    import cupy as cp  # noqa: PLC0415 (CuPy input)

    if not ab.flags.c_contiguous:
        ab = cp.ascontiguousarray(ab)
    n, m = ab.shape
    if ab.size == 0:
        return ab
    with cp.cuda.Device(ab.data.device_id):
        fn = kernel("distance.cu", _expression("sqdist_finish", ab.dtype))
        fn((-(-m // (_SQD_THREADS * _SQD_UNROLL)), min(n, 65535)), (_SQD_THREADS,),
           (ab, cp.ascontiguousarray(na), cp.ascontiguousarray(nb), np.int64(n), np.int64(m)))
    return ab


_SQD_THREADS, _SQD_UNROLL = LAUNCH["SQD_THREADS"], LAUNCH["SQD_UNROLL"]
_SQDD_TILE = LAUNCH["SQDD_TILE"]
#: the GPU route: the one-launch kernel always up to _DIRECT_MAX_DIMS dimensions, and up to
#: _DIRECT_SMALL_DIMS for outputs of at most _DIRECT_SMALL_SIZE elements; else the engine's
#: product and the in-place finish. Measured on the H100 (benchmarks/profiles/profile_oneshot.py,
#: results/profile_oneshot-gpu-h100-2026-12-05.md, float32, back to back, ms):
#:   d = 16:  20 000² direct 0.77, product+finish 1.75;  2000² 0.014 vs 0.079
#:   d = 64:  20 000² direct 3.05, product+finish 2.58;  2000² 0.037 vs 0.083
#:   d = 128: 20 000² direct 5.83, product+finish 3.58;  2000² 0.067 vs 0.076
#: (the direct kernel's fp32 FMA rate is below cuBLAS's, so for large outputs its saving of a
#: pass over D stops paying between 16 and 64 dimensions; for small outputs the launches saved
#: dominate up to 128)
_DIRECT_MAX_DIMS = 32
_DIRECT_SMALL_DIMS = 128
_DIRECT_SMALL_SIZE = 1 << 23
_DIRECT_MAX_ROWS = 65535 * _SQDD_TILE   # the grid's y limit


def _direct(n: int, m: int, d: int) -> bool:
    """Whether the GPU distances take the one-launch kernel (see _DIRECT_MAX_DIMS)."""
    if n > _DIRECT_MAX_ROWS:
        return False
    return d <= _DIRECT_MAX_DIMS or (d <= _DIRECT_SMALL_DIMS and n * m <= _DIRECT_SMALL_SIZE)


def _sqdist_direct(a: Any, b: Any) -> Any:
    """The GPU distances in one launch for few dimensions (dspk/kernels/distance.cu,
    sqdist_direct): norms, product and clamp computed per tile, D written once."""
    import cupy as cp  # noqa: PLC0415 (CuPy input)

    n, d = a.shape
    m = b.shape[0]
    out = cp.empty((n, m), dtype=a.dtype)
    if out.size == 0:
        return out
    if d == 0:
        out.fill(0)
        return out
    a = cp.ascontiguousarray(a)
    b = cp.ascontiguousarray(b)
    with cp.cuda.Device(a.data.device_id):
        fn = kernel("distance.cu", _expression("sqdist_direct", a.dtype))
        fn((-(-m // _SQDD_TILE), -(-n // _SQDD_TILE)), (256,),
           (a, b, np.int64(n), np.int64(m), np.int32(d), out))
    return out


@api
def knn(a: Any, b: Any, k: int) -> tuple:
    """The k nearest rows of b for each row of a: (indices [n, k] int64, squared distances
    [n, k]), nearest first.

    Parameters
    ----------
    a : array
        [n, d] query points, float32 or float64 (NumPy or CuPy).
    b : array
        [m, d] points to search, like ``a``.
    k : int
        Neighbours per query, 1 <= k <= m.

    Returns
    -------
    (indices, sqdist)
        indices int64 [n, k] into the rows of b and their squared distances [n, k] (from
        `pairwise_sqdist`), sorted nearest first (on the CPU, equal distances keep the order
        ``argpartition`` left them in).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import knn
    >>> b = np.array([[0.0, 0.0], [1.0, 0.0], [5.0, 0.0], [9.0, 0.0]])
    >>> idx, d2 = knn(np.array([[4.0, 0.0], [0.2, 0.0]]), b, k=2)
    >>> idx
    array([[2, 1],
           [0, 1]])
    >>> np.round(d2, 2)
    array([[1.  , 9.  ],
           [0.04, 0.64]])
    """
    if int(k) < 1 or int(k) > b.shape[0]:
        raise ValueError(f"k: expected 1 <= k <= {b.shape[0]} (rows of b), got {k}")
    xp = array_module(a, b)
    check_finite(a, "a", ("row", "column"))
    check_finite(b, "b", ("row", "column"))
    d = pairwise_sqdist(a, b)
    k = int(k)
    part = xp.argpartition(d, k - 1, axis=1)[:, :k]
    dk = xp.take_along_axis(d, part, axis=1)
    order = xp.argsort(dk, axis=1, kind="stable") if xp is np else xp.argsort(dk, axis=1)
    return xp.take_along_axis(part, order, axis=1).astype(np.int64), \
        xp.take_along_axis(dk, order, axis=1)


def probe_sqdist(g: np.ndarray) -> np.ndarray:
    """[n, n] squared distances between the rows of a host geometry [n, D] (µm), float64: the
    same values as ``((g[:, None] - g[None]) ** 2).sum(-1)``, a column at a time (the
    [n, n, D] temporary and its sum over the short last axis cost 4x more for 384
    channels)."""
    g = np.asarray(g, dtype=np.float64)
    out = np.zeros((len(g), len(g)))
    for j in range(g.shape[1]):
        dj = g[:, j, None] - g[None, :, j]
        out += dj * dj
    return out
