"""The GPU launch of `dspk.ops.PCA.transform`: the centred projection of clips in one pass
(dspk/kernels/projection.cu). CuPy arrays only; each geometry's launch is packed once
(`FastLaunch`), because the call is short enough (~10-60 µs) for CuPy's argument conversion to
show."""

from __future__ import annotations

from typing import Any

from ..backend import device_properties
from ..kernels import FLOAT_DTYPES, LAUNCH, FastLaunch, ctype, declare_instances, kernel
from ..linalg.engine import current_engine

PR_THREADS, PR_MAX_PER_THREAD = LAUNCH["PR_THREADS"], LAUNCH["PR_MAX_PER_THREAD"]
_SHARED_LIMIT = 48 * 1024                     # dynamic shared memory without an opt-in
_CACHE_LIMIT = 64
#: the engine's store (`Engine.prepared`) of the packed launches, by geometry
LAUNCHES = "pca_launches"


def _expression(dtype: Any, per_thread: int) -> str:
    return f"center_project<{ctype(dtype)}, {per_thread}>"


#: components per thread: the powers of two up to PR_MAX_PER_THREAD (`_geometry`)
PER_THREAD = tuple(1 << i for i in range(PR_MAX_PER_THREAD.bit_length())
                   if 1 << i <= PR_MAX_PER_THREAD)
declare_instances("projection.cu", lambda props: [_expression(dt, p) for dt in FLOAT_DTYPES
                                                  for p in PER_THREAD])


def _geometry(k: int, m: int, itemsize: int) -> tuple[int, int, int, int] | None:
    """(rows per tile, components per thread, pitch, shared bytes) for K taps and M components,
    or None where no tile fits (the caller then takes the expression). 64-row tiles first:
    eight blocks per SM overlap one block's loads with another's products."""
    pitch = k | 1                                        # odd: conflict-free column reads
    for rows in (64, 32):
        groups = PR_THREADS // rows
        per_thread = 1 << max(0, (-(-m // groups) - 1).bit_length())
        if per_thread > PR_MAX_PER_THREAD:
            continue
        shared = (m * k + k + rows * pitch) * itemsize
        if shared <= _SHARED_LIMIT:
            return rows, per_thread, pitch, shared
    return None


def fits(k: int, m: int, itemsize: int) -> bool:
    """Whether `center_project` takes K taps and M components."""
    return k >= 1 and 1 <= m <= k and _geometry(k, m, itemsize) is not None


def center_project(x: Any, mean: Any, w: Any) -> Any:
    """``(x - mean) @ w.T`` for x [n, K] (any strides), mean [K] and w [M, K] of x's dtype, as
    [n, M] contiguous; one launch. The caller checks `fits`."""
    import cupy as cp  # noqa: PLC0415 (GPU-only module)

    n, k = x.shape
    m = w.shape[0]
    mean = cp.ascontiguousarray(mean)
    w = cp.ascontiguousarray(w)
    out = cp.empty((n, m), dtype=x.dtype)
    if n == 0:
        return out
    dev = x.data.device_id
    rs, cs = (s // x.itemsize for s in x.strides)
    key = (dev, x.dtype.char, n, k, m, rs, cs)
    launches = current_engine().prepared(LAUNCHES, dict)
    launch = launches.get(key)
    if launch is None:
        rows, per_thread, pitch, shared = _geometry(k, m, x.itemsize)
        sms = int(device_properties(dev)["multiProcessorCount"])
        grid = max(1, min(-(-n // rows), 64 * sms))
        fn = kernel("projection.cu", _expression(x.dtype, per_thread))
        dyn = ("ptr", None)
        launch = FastLaunch(fn, (grid,), (PR_THREADS,),
                            [dyn, ("i64", rs), ("i64", cs), ("i64", n), ("i32", k), dyn, dyn,
                             ("i32", m), ("i32", rows), ("i32", pitch), dyn], shared_mem=shared)
        if len(launches) < _CACHE_LIMIT:
            launches[key] = launch
    launch(cp.cuda.get_current_stream().ptr, x.data.ptr, mean.data.ptr, w.data.ptr,
           out.data.ptr)
    return out
