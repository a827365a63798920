"""CPU parallelism for the NumPy path: NumPy's partitions and SciPy's FFTs release the GIL, so
blocks of an array processed on several threads run on every core. The threads are the
engine's (`dspk.linalg.threads`): as many as BLAS was given, one pool for the whole package."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..linalg.threads import blas_threads, parallel_blocks

#: below this many elements one block is faster than the pool's overhead
MIN_PARALLEL = 1 << 20


def blocks(fn: Callable[[int, int], np.ndarray], length: int, size: int, axis: int) -> np.ndarray:
    """``fn(start, stop)`` over blocks of ``range(length)`` on the engine's threads,
    concatenated along ``axis``; one call when the work (``size`` elements) is small or there
    is one thread. Every element of the result is computed on its own (rows of an FFT,
    columns of a median or a sparse product), so the blocks do not change the bits."""
    workers = blas_threads()
    if workers == 1 or size < MIN_PARALLEL or length < 2:
        return fn(0, length)
    n = min(length, 4 * workers)
    edges = np.linspace(0, length, n + 1).astype(int)
    parts = parallel_blocks(lambda ab: fn(int(ab[0]), int(ab[1])), zip(edges[:-1], edges[1:]))
    return np.concatenate(parts, axis=axis)
