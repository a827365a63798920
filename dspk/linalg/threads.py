"""CPU threads for products whose bits do not depend on the thread count.

A multi-threaded BLAS partitions a product by its thread count, and OpenBLAS's partitions
change the order in which a dot product is summed: measured with NumPy's OpenBLAS 0.3.31 on a
2-core Xeon, ``a @ b`` with K = 3 000 gives different last bits on 1 and on 2 threads for
[384, K]·[K, 384] float32, and for float64 already at [100, 256]·[256, 100]. A Dask worker
(BLAS on one thread) and the process that started it (BLAS on every core) would write different
outputs for the same job. So the engine's CPU products call BLAS on one thread
(`single_threaded_blas`) and do their own threading over blocks that are fixed whatever the
thread count (`parallel_blocks`): the same blocks, each summed in the same order, on 1 thread
or on 16.

The thread count used is the one BLAS had been given (``OPENBLAS_NUM_THREADS``,
``OMP_NUM_THREADS``, threadpoolctl, or a Dask worker's limit of 1), so a process that asked for
one thread still gets one.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

__all__ = ["single_threaded_blas", "parallel_blocks", "blas_threads"]

_lock = threading.Lock()
_depth = 0                       # nested or concurrent single_threaded_blas() sections open
_saved: list[tuple[Any, int]] = []   # (BLAS library, its thread count) restored on the last exit
_libs: list[Any] | None = None
_pool: ThreadPoolExecutor | None = None
_pool_width = 0
_in_pool = threading.local()


def _blas_libraries() -> list[Any]:
    """threadpoolctl's controllers of the BLAS libraries loaded in this process (found once)."""
    global _libs
    if _libs is None:
        from threadpoolctl import ThreadpoolController  # noqa: PLC0415 (scans loaded libraries)

        _libs = list(ThreadpoolController().select(user_api="blas").lib_controllers)
    return _libs


def blas_threads() -> int:
    """Threads BLAS may use in this process, as configured (inside `single_threaded_blas`, the
    count it will be given back)."""
    with _lock:
        counts = [n for _, n in _saved] if _depth else \
            [lib.get_num_threads() for lib in _blas_libraries()]
    if not counts:   # a BLAS threadpoolctl cannot see: a thread per core
        return os.cpu_count() or 1
    return max([1, *(int(n) for n in counts if n)])


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """BLAS on one thread inside the block (process-wide: BLAS libraries keep one count).

    Sections may nest and may be open in several threads at once: the first to enter sets one
    thread, the last to leave gives BLAS its count back.
    """
    global _depth
    with _lock:
        if _depth == 0:
            _saved[:] = [(lib, lib.get_num_threads()) for lib in _blas_libraries()]
            for lib, n in _saved:
                if n != 1:
                    lib.set_num_threads(1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for lib, n in _saved:
                    if n != 1:
                        lib.set_num_threads(n)
                _saved.clear()


def _executor(width: int) -> ThreadPoolExecutor:
    global _pool, _pool_width
    with _lock:
        if _pool is None or _pool_width < width:
            # a wider pool replaces the old one, which finishes what it holds and exits
            old, _pool = _pool, ThreadPoolExecutor(width, thread_name_prefix="dspk-blas")
            _pool_width = width
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def parallel_blocks(fn: Callable[[Any], Any], blocks: Iterable[Any]) -> list:
    """``[fn(block) for block in blocks]``, on as many threads as BLAS was given (the calling
    thread among them), each with BLAS on one thread. The blocks are the caller's and never
    depend on the thread count, so neither does the result. Runs in the calling thread alone
    when one thread is allowed or when already inside a block (no nested pools)."""
    blocks = list(blocks)
    results: list[Any] = [None] * len(blocks)
    with single_threaded_blas():
        width = min(blas_threads(), len(blocks))
        if width <= 1 or getattr(_in_pool, "active", False):
            return [fn(blk) for blk in blocks]
        todo = iter(range(len(blocks)))
        take = threading.Lock()

        def work() -> None:
            _in_pool.active = True
            try:
                while True:
                    with take:
                        i = next(todo, None)
                    if i is None:
                        return
                    results[i] = fn(blocks[i])
            finally:
                _in_pool.active = False

        helpers = [_executor(width - 1).submit(work) for _ in range(width - 1)]
        try:
            work()
        finally:
            for h in helpers:
                h.result()
    return results
