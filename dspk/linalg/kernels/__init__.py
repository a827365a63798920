"""Loading and launching the CUDA kernels in this folder (``*.cu``, compiled by NVRTC through
``cupy.RawModule`` on first use, cached on disk by CuPy).

Nothing here runs at import time: CuPy is imported, and a kernel compiled, the first time a
kernel is asked for.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ...backend import cupy_module

KERNEL_DIR = Path(__file__).resolve().parent
CUDA_SOURCES = tuple(sorted(KERNEL_DIR.glob("*.cu")))

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def ctype(dtype: Any) -> str:
    """The CUDA C type name of a float dtype."""
    return _CTYPE[np.dtype(dtype)]


@lru_cache(maxsize=None)
def _source(filename: str) -> str:
    return (KERNEL_DIR / filename).read_text()


@lru_cache(maxsize=None)
def _function(device_id: int, filename: str, expression: str) -> Any:
    cp = cupy_module()
    with cp.cuda.Device(device_id):
        module = cp.RawModule(code=_source(filename), options=("-std=c++17",),
                              name_expressions=[expression])
        return module.get_function(expression)


def kernel(filename: str, expression: str) -> Any:
    """The compiled kernel ``expression`` (a template instance such as
    ``"gram_small<float, 4, 4, true>"``) from ``filename`` for the current device."""
    cp = cupy_module()
    return _function(cp.cuda.runtime.getDevice(), filename, expression)


_counters: dict[tuple[int, int], Any] = {}


def counters(n: int) -> Any:
    """Zeroed uint32 counters for kernels whose last CTA reduces (one array per device and
    stream: launches on one stream run in order, and each kernel leaves its counters at 0)."""
    cp = cupy_module()
    key = (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr)
    buf = _counters.get(key)
    if buf is None or buf.size < n:
        buf = cp.zeros(max(n, 256), dtype=np.uint32)
        _counters[key] = buf
    return buf


def grid_1d(total: int, block: int = 256, cap: int = 65535 * 16) -> tuple[int]:
    return (max(1, min(cap, -(-total // block))),)


def gather(view: Any) -> Any:
    """Contiguous row-major copy of a GPU `MatrixView`, one pass, offset applied in the kernel."""
    cp = cupy_module()
    view.check()
    b, r, c = view.shape
    dst = cp.empty(b * r * c, dtype=view.dtype)
    if dst.size == 0:
        return dst
    fn = kernel("gather.cu", f"gather3d<{ctype(view.dtype)}>")
    sb, sr, sc = view.strides
    fn(grid_1d(dst.size), (256,), (view.buffer, np.int64(view.offset), np.int64(sb), np.int64(sr),
                                   np.int64(sc), np.int64(b), np.int64(r), np.int64(c), dst))
    return dst
