"""What the GPU candidates share (cuBLAS, cuBLASLt, the direct kernels, the integer products):
the current CUDA stream, scratch buffers kept per stream, and cuBLAS's 32-bit size limit.
Nothing here imports CuPy before a GPU product is bound."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..backend import cupy_module
from .problem import Problem
from .view import INT32_MAX

__all__ = ["stream_getter", "current_stream", "Workspace", "blas_dims_reason"]


def stream_getter() -> Callable[[], Any]:
    """CuPy's ``get_current_stream``, for a bound runner to call per launch (resolved once,
    when the runner is bound: a launch costs a few microseconds of Python, and the lookup
    through the module would be a tenth of that)."""
    return cupy_module().cuda.get_current_stream


def current_stream() -> int:
    """The current CUDA stream of the current device, as an int (a ``cudaStream_t``)."""
    return cupy_module().cuda.get_current_stream().ptr


class Workspace:
    """Scratch buffers of one bound runner, one set per stream: kernels on one stream run in
    order, so a launch cannot overwrite partials a previous launch is still reducing.

    Parameters
    ----------
    size : int
        Elements of the scratch buffer.
    dtype : numpy.dtype
        Its element type.
    counters : int
        uint32 counters (zeroed once) kept beside it; 0 for none.
    """

    def __init__(self, size: int, dtype: Any, counters: int = 0):
        self.size, self.dtype, self.counters = size, dtype, counters
        self._bufs: dict = {}

    def get(self, stream: int) -> tuple:
        """(scratch buffer, counters buffer or None) for ``stream``."""
        bufs = self._bufs.get(stream)
        if bufs is None:
            cp = cupy_module()
            bufs = (cp.empty(self.size, dtype=self.dtype),
                    cp.zeros(self.counters, dtype=np.uint32) if self.counters else None)
            self._bufs[stream] = bufs
        return bufs


def blas_dims_reason(p: Problem) -> str | None:
    """Why cuBLAS cannot take ``p``'s sizes (None if it can): its dimensions are 32-bit."""
    if max(p.m, p.n, p.k, p.batches) > INT32_MAX:
        return "a dimension exceeds cuBLAS's 32-bit sizes"
    return None
