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

Where NumPy's BLAS is OpenBLAS >= 0.3.30 (pthreads), the blocks go to OpenBLAS instead, in one
grouped ``?gemm_batch`` call (`gemm_batch`): it runs each block with its one-thread driver and
shares whole blocks among its own threads, so the bits are still those of the fixed blocks, and
no dspk thread competes with OpenBLAS's workers, which spin for ~0.1 s after each of NumPy's
multi-threaded products (measured: a dspk pool thread next to them ran at half speed, dspk 2.2x
slower than NumPy on 384 x 384 x 6000). Thread counts are read and set through OpenBLAS's own
functions (ctypes), from any Python thread.

The thread count used is the one BLAS had been given (``OPENBLAS_NUM_THREADS``,
``OMP_NUM_THREADS``, threadpoolctl, or a Dask worker's limit of 1), so a process that asked for
one thread still gets one.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import numpy as np
from threadpoolctl import ThreadpoolController

from ..caches import shared

__all__ = ["single_threaded_blas", "parallel_blocks", "blas_threads", "gemm_batch"]

#: the name of this module's process-wide store (`dspk.caches`)
STORE = "blas_threads"


class _Threads:
    """Get and set one BLAS library's thread count. OpenBLAS on pthreads is called through
    ctypes: threadpoolctl's ``set_num_threads`` does nothing, silently, when called from any
    thread but the first that set a count (its "controlling thread", kept for as long as that
    thread lives), so a product run from a second Python thread would have kept every BLAS
    thread (and its bits). Other libraries go through threadpoolctl."""

    __slots__ = ("ctl", "get", "set", "batch")

    def __init__(self, ctl: Any):
        self.ctl = ctl
        self.get, self.set = ctl.get_num_threads, ctl.set_num_threads
        self.batch: dict[Any, Callable] = {}
        if ctl.internal_api != "openblas" or getattr(ctl, "threading_layer", "") != "pthreads":
            return
        sym = getattr(ctl, "_get_symbol", None)
        get_n = sym("openblas_get_num_threads") if sym else None
        set_n = sym("openblas_set_num_threads") if sym else None
        if get_n is None or set_n is None:
            return
        get_n.restype, get_n.argtypes = ctypes.c_int, []
        set_n.restype, set_n.argtypes = None, [ctypes.c_int]
        self.get, self.set = get_n, set_n
        # the grouped batch (OpenBLAS >= 0.3.30): each member on one thread with OpenBLAS's
        # one-thread driver, the members shared among OpenBLAS's own threads
        int_t = ctypes.c_int64 if "64" in (getattr(ctl, "_symbol_suffix", "") or "") \
            else ctypes.c_int32
        for dtype, name in ((np.float32, "cblas_sgemm_batch"), (np.float64, "cblas_dgemm_batch")):
            fn = sym(name)
            if fn is not None:
                fn.restype = None
                fn.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 13 + [int_t, ctypes.c_void_p]
                self.batch[np.dtype(dtype)] = fn
        self.batch["int"] = np.int64 if int_t is ctypes.c_int64 else np.int32


class BlasThreads:
    """The process's BLAS thread state, one object (`dspk.caches` store `STORE`): the BLAS
    libraries found in the process, the pinned sections open (nested or in several threads)
    with the counts to give back, and the pool of helper threads.

    ``clear()`` (every engine's `forget`) drops the libraries found (found again on next use;
    not while a section is open, which restores them) and shuts the pool down (threads
    finish what they hold and exit; a new pool starts on next use)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0                   # nested or concurrent single_threaded_blas() open
        self.saved: list[tuple[Any, int]] = []   # (library, its count) restored on last exit
        self.libs: list[_Threads] | None = None
        self.libs_key = -1               # len(sys.modules) when libs was found
        self.pool: ThreadPoolExecutor | None = None
        self.pool_width = 0
        self.in_pool = threading.local()

    def libraries(self) -> list[_Threads]:
        """The BLAS libraries loaded in this process, found again when modules were imported
        since (SciPy brings its own OpenBLAS; a library found late would not be pinned). Call
        with ``lock`` held."""
        key = len(sys.modules)
        if self.libs is None or (key != self.libs_key and self.depth == 0):
            old = {id(t.ctl.dynlib): t for t in self.libs or () if hasattr(t.ctl, "dynlib")}
            found = []
            for ctl in ThreadpoolController().select(user_api="blas").lib_controllers:
                prev = old.get(id(getattr(ctl, "dynlib", None)))
                found.append(prev if prev is not None else _Threads(ctl))
            self.libs, self.libs_key = found, key
        return self.libs

    def executor(self, width: int) -> ThreadPoolExecutor:
        with self.lock:
            if self.pool is None or self.pool_width < width:
                # a wider pool replaces the old one, which finishes what it holds and exits
                old = self.pool
                self.pool = ThreadPoolExecutor(width, thread_name_prefix="dspk-blas")
                self.pool_width = width
                if old is not None:
                    old.shutdown(wait=False)
            return self.pool

    def clear(self) -> None:
        with self.lock:
            if self.depth == 0:
                self.libs, self.libs_key = None, -1
            pool, self.pool, self.pool_width = self.pool, None, 0
        if pool is not None:
            pool.shutdown(wait=False)    # work already submitted still runs

    def __len__(self) -> int:
        """Libraries found and pool threads held."""
        return len(self.libs or ()) + self.pool_width


def _state() -> BlasThreads:
    return shared(STORE, BlasThreads)


def _numpy_blas(state: BlasThreads) -> _Threads | None:
    """The library NumPy's own products call (in a wheel, the OpenBLAS under numpy.libs)."""
    libs = state.libraries()
    root = os.path.dirname(os.path.dirname(np.__file__))
    mine = [t for t in libs if os.path.basename(os.path.dirname(t.ctl.filepath)).startswith("numpy")
            and os.path.dirname(os.path.dirname(t.ctl.filepath)) == root]
    if len(mine) == 1:
        return mine[0]
    return libs[0] if len(libs) == 1 else None


def gemm_batch(dtype: Any) -> tuple[Callable, type] | None:
    """``(cblas_?gemm_batch, its integer type)`` of NumPy's OpenBLAS for ``dtype`` when it has
    one (OpenBLAS >= 0.3.30 on pthreads), else None. OpenBLAS runs each member of a batch
    with its one-thread driver and shares whole members among its threads, so the bits do not
    depend on its thread count, and the work runs on OpenBLAS's own (already spinning) threads
    at the count the user gave BLAS."""
    state = _state()
    with state.lock:
        lib = _numpy_blas(state)
    if lib is None:
        return None
    fn = lib.batch.get(np.dtype(dtype))
    return None if fn is None else (fn, lib.batch["int"])


def blas_threads() -> int:
    """Threads BLAS may use in this process, as configured (inside `single_threaded_blas`, the
    count it will be given back)."""
    state = _state()
    with state.lock:
        counts = [n for _, n in state.saved] if state.depth else \
            [lib.get() for lib in state.libraries()]
    if not counts:   # a BLAS threadpoolctl cannot see: a thread per core
        return os.cpu_count() or 1
    return max([1, *(int(n) for n in counts if n)])


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """BLAS on one thread inside the block (process-wide: BLAS libraries keep one count).

    Sections may nest and may be open in several threads at once: the first to enter sets one
    thread, the last to leave gives BLAS its count back. Works from any Python thread.
    """
    state = _state()
    with state.lock:
        if state.depth == 0:
            state.saved[:] = [(lib, lib.get()) for lib in state.libraries()]
            for lib, n in state.saved:
                if n != 1:
                    lib.set(1)
        state.depth += 1
    try:
        yield
    finally:
        with state.lock:
            state.depth -= 1
            if state.depth == 0:
                for lib, n in state.saved:
                    if n != 1:
                        lib.set(n)
                state.saved.clear()


def parallel_blocks(fn: Callable[[Any], Any], blocks: Iterable[Any]) -> list:
    """``[fn(block) for block in blocks]``, on as many threads as BLAS was given (the calling
    thread among them), each with BLAS on one thread. The blocks are the caller's and never
    depend on the thread count, so neither does the result. Runs in the calling thread alone
    when one thread is allowed or when already inside a block (no nested pools)."""
    blocks = list(blocks)
    results: list[Any] = [None] * len(blocks)
    state = _state()
    in_pool = state.in_pool
    with single_threaded_blas():
        width = min(blas_threads(), len(blocks))
        if width <= 1 or getattr(in_pool, "active", False):
            return [fn(blk) for blk in blocks]
        todo = iter(range(len(blocks)))
        take = threading.Lock()

        def work() -> None:
            in_pool.active = True
            try:
                while True:
                    with take:
                        i = next(todo, None)
                    if i is None:
                        return
                    results[i] = fn(blocks[i])
            finally:
                in_pool.active = False

        helpers = [state.executor(width - 1).submit(work) for _ in range(width - 1)]
        try:
            work()
        finally:
            for h in helpers:
                h.result()
    return results
