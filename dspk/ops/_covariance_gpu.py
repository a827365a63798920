"""The GPU launches of `dspk.ops.covariance` (dspk/kernels/covariance.cu): the centred copy of
float channels, the float finish, and the exact int16 finish. CuPy arrays only; each launch is
packed once per geometry (`FastLaunch`), since for 4-64 channels the host time of CuPy's
argument conversion was larger than the kernels."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..backend import device_properties
from ..kernels import FLOAT_DTYPES, LAUNCH, FastLaunch, ctype, declare_instances, grid_1d, kernel
from ..linalg.engine import current_engine

CENTER_THREADS = LAUNCH["CENTER_THREADS"]
_CACHE_LIMIT = 64
#: the engine's store (`Engine.prepared`) of the packed launches, by geometry
LAUNCHES = "covariance_launches"
_F64, _F64_BITS = struct.Struct("<d"), struct.Struct("<Q")


def _f64_bits(value: float) -> int:
    """A float64 call-time parameter as the 8 bytes FastLaunch passes."""
    return _F64_BITS.unpack(_F64.pack(value))[0]


def _center_rows(dtype: Any) -> str:
    return f"center_rows<{ctype(dtype)}>"


def _cov_finish(dtype: Any) -> str:
    return f"cov_finish<{ctype(dtype)}>"


def _int_cov_finish(center: bool) -> str:
    return f"int_cov_finish<{'true' if center else 'false'}>"


declare_instances("covariance.cu", lambda props: [
    *(f(dt) for dt in FLOAT_DTYPES for f in (_center_rows, _cov_finish)),
    *(_int_cov_finish(c) for c in (False, True))])


def _launches() -> dict:
    return current_engine().prepared(LAUNCHES, dict)


def _remember(launches: dict, key: tuple, launch: Any) -> Any:
    if len(launches) < _CACHE_LIMIT:
        launches[key] = launch
    return launch


def _splits(rows: int, device_id: int) -> int:
    """Blocks per row: enough blocks for two per SM when there are few rows (each block re-sums
    its row from L2, so more splits cost L2 reads, not DRAM)."""
    sms = int(device_properties(device_id)["multiProcessorCount"])
    return max(1, min(64, -(-2 * sms // rows)))


def center_rows(x: Any) -> tuple[Any, Any]:
    """(x − each row's mean, the means): a contiguous copy of ``x`` [C, n] (float32/64, any
    strides) with each row centred as ``x - x.mean(axis=1, dtype=float64).astype(x.dtype)``
    computes it, and the float64 means; one launch."""
    import cupy as cp  # noqa: PLC0415 (GPU-only module)

    c, n = x.shape
    dev = x.data.device_id
    rs, cs = (s // x.itemsize for s in x.strides)
    key = ("center", dev, x.dtype.char, c, n, rs, cs)
    launches = _launches()
    launch = launches.get(key)
    if launch is None:
        fn = kernel("covariance.cu", _center_rows(x.dtype))
        dyn = ("ptr", None)
        launch = _remember(launches, key, FastLaunch(
            fn, (c, _splits(c, dev)), (CENTER_THREADS,),
            [dyn, ("i64", rs), ("i64", cs), ("i64", n), dyn, dyn]))
    out = cp.empty((c, n), dtype=x.dtype)
    mean = cp.empty(c, dtype=np.float64)
    launch(cp.cuda.get_current_stream().ptr, x.data.ptr, out.data.ptr, mean.data.ptr)
    return out, mean


def float_finish(m2: Any, denom: float) -> Any:
    """``(m2.astype(float64) / denom).astype(m2.dtype)`` of a contiguous product, one launch."""
    import cupy as cp  # noqa: PLC0415 (GPU-only module)

    total = m2.size
    key = ("finish", m2.data.device_id, m2.dtype.char, total)
    launches = _launches()
    launch = launches.get(key)
    if launch is None:
        fn = kernel("covariance.cu", _cov_finish(m2.dtype))
        dyn = ("ptr", None)
        launch = _remember(launches, key, FastLaunch(fn, grid_1d(total), (256,),
                                           [dyn, ("i64", total), dyn, dyn]))
    out = cp.empty(m2.shape, dtype=m2.dtype)
    launch(cp.cuda.get_current_stream().ptr, m2.data.ptr, _f64_bits(denom), out.data.ptr)
    return out


def int_finish(s_mat: Any, s: Any, n: int, ddof: int, center: bool) -> Any:
    """The covariance of int16 channels from their exact sums (S = X·Xᵀ and the row sums s,
    int64), float64 with NumPy's bits, one launch; with ``center`` only while n·S − s·sᵀ is
    exact in int64 (n < 2^16: the caller's condition)."""
    import cupy as cp  # noqa: PLC0415 (GPU-only module)

    c = s_mat.shape[0]
    if not s_mat.flags.c_contiguous:
        s_mat = cp.ascontiguousarray(s_mat)
    key = ("int", s_mat.data.device_id, c, bool(center))
    launches = _launches()
    launch = launches.get(key)
    if launch is None:
        fn = kernel("covariance.cu", _int_cov_finish(center))
        dyn = ("ptr", None)
        launch = _remember(launches, key, FastLaunch(fn, grid_1d(c * c), (256,),
                                           [dyn, dyn, ("i32", c), dyn, dyn, dyn]))
    out = cp.empty((c, c), dtype=np.float64)
    denom = float(n * (n - ddof)) if center else float(n - ddof)
    launch(cp.cuda.get_current_stream().ptr, s_mat.data.ptr, s.data.ptr, n, _f64_bits(denom),
           out.data.ptr)
    return out
