"""CPU parallelism for the NumPy path: NumPy's partitions and SciPy's FFTs release the GIL, so
blocks of an array processed in a thread pool run on every core."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

_pool: Any = None

#: below this many elements one block is faster than the pool's overhead
MIN_PARALLEL = 1 << 20


def cpu_pool() -> Any:
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

        _pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="dspk")
    return _pool


def blocks(fn: Callable[[int, int], np.ndarray], length: int, size: int, axis: int) -> np.ndarray:
    """``fn(start, stop)`` over blocks of ``range(length)`` in the thread pool, concatenated
    along ``axis``; one call when the work (``size`` elements) is small or there is one core."""
    workers = os.cpu_count() or 1
    if workers == 1 or size < MIN_PARALLEL or length < 2:
        return fn(0, length)
    n = min(length, 4 * workers)
    edges = np.linspace(0, length, n + 1).astype(int)
    parts = cpu_pool().map(lambda ab: fn(int(ab[0]), int(ab[1])), zip(edges[:-1], edges[1:]))
    return np.concatenate(list(parts), axis=axis)
