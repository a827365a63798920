"""NumPy/CuPy dispatch: which array module an array belongs to, which device, and timers.

Nothing here imports CuPy at module import time: ``import dspk`` must stay fast and must work
on machines without a GPU or without CuPy. CuPy is imported the first time a GPU is asked for
or a CuPy array is seen.
"""

from __future__ import annotations

import gc
import logging
import os
import platform
import time
from functools import lru_cache
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "BackendError",
    "array_module",
    "is_cupy_array",
    "gpu_available",
    "gpu_unavailable_reason",
    "resolve_backend",
    "device_of",
    "device_name",
    "to_numpy",
    "DeviceOutOfMemory",
    "out_of_memory",
    "free_device_memory",
]

log = logging.getLogger("dspk")

BACKENDS = ("auto", "cpu", "gpu")


class BackendError(RuntimeError):
    """The requested backend cannot be used on this machine.

    Raised by `resolve_backend` for ``"gpu"`` without a usable GPU, and when CuPy is needed
    but cannot be imported.

    Examples
    --------
    >>> from dspk.backend import BackendError, resolve_backend
    >>> try:
    ...     backend = resolve_backend("gpu")
    ... except BackendError:               # no GPU here: fall back by hand
    ...     backend = "cpu"
    >>> backend in ("cpu", "gpu")
    True
    """


class DeviceOutOfMemory(MemoryError):
    """The GPU ran out of memory for good: every way dspk has to go on with less (a smaller
    chunk, the fit's chunks held on the host, another candidate of the tuner) ran out too.
    The message says what ran out of memory and which option gives it more (``gpu_memory``,
    ``--gpu-memory``), or asks for less. A `MemoryError`, as CuPy's own
    ``OutOfMemoryError``; `out_of_memory` recognises both.

    Parameters
    ----------
    message : str

    Examples
    --------
    >>> from dspk.backend import DeviceOutOfMemory, out_of_memory
    >>> out_of_memory(DeviceOutOfMemory("the fit ran out of device memory"))
    True
    """


#: what CUDA, cuBLAS and cuFFT say when an allocation fails (CuPy's own error is known by name)
_OOM_WORDS = ("out of memory", "cudaerrormemoryallocation", "alloc_failed")


def out_of_memory(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) says the device ran out of memory:
    CuPy's ``OutOfMemoryError`` (known by its name, so CuPy is not imported), a CUDA, cuBLAS
    or cuFFT allocation failure, or `DeviceOutOfMemory`. A host `MemoryError` is not one
    (less device memory would not help).

    Parameters
    ----------
    exc : BaseException or None

    Returns
    -------
    bool

    Examples
    --------
    >>> from dspk.backend import out_of_memory
    >>> class OutOfMemoryError(MemoryError):
    ...     pass
    >>> out_of_memory(OutOfMemoryError("2 GiB")), out_of_memory(ValueError("a NaN"))
    (True, False)
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DeviceOutOfMemory) or \
                any(t.__name__ == "OutOfMemoryError" for t in type(exc).__mro__):
            return True
        # (a ValueError's message may quote a user's text: words there prove nothing)
        if not isinstance(exc, (ValueError, KeyError, TypeError)) and \
                any(w in str(exc).lower() for w in _OOM_WORDS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def free_device_memory(xp: Any) -> None:
    """Give CuPy's unused pooled device and pinned memory back, after a garbage collection
    (arrays held by reference cycles, or by the frames of an error, go first); nothing for
    NumPy. Call it outside the ``except`` block of an out-of-memory error: the failed work's
    arrays are freed only once the error is gone.

    Parameters
    ----------
    xp : module
        The array module of the work (``numpy`` or ``cupy``).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.backend import free_device_memory
    >>> free_device_memory(np)                  # a CPU computation: nothing to give back
    """
    if getattr(xp, "__name__", "") == "cupy":
        gc.collect()
        xp.get_default_memory_pool().free_all_blocks()
        xp.get_default_pinned_memory_pool().free_all_blocks()


def is_cupy_array(x: Any) -> bool:
    """True for a ``cupy.ndarray`` (checked by type name, so CuPy is not imported).

    Parameters
    ----------
    x : object
        Anything.

    Returns
    -------
    bool

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.backend import is_cupy_array
    >>> is_cupy_array(np.zeros(3)), is_cupy_array([1, 2])
    (False, False)
    """
    cls = type(x)
    return cls.__name__ == "ndarray" and cls.__module__.startswith("cupy")


# The lru_caches of this module hold facts of the machine that do not change while the process
# runs (CuPy importable or not, a device's name and properties), not state derived from dspk's
# work: `Engine.forget` (dspk.caches) leaves them.
@lru_cache(maxsize=1)
def _cupy() -> ModuleType | None:
    try:
        import cupy  # noqa: PLC0415 (optional: imported on first use)
    except Exception:  # ImportError, or a broken CUDA install raising at import
        return None
    return cupy


def cupy_module() -> ModuleType:
    """CuPy, imported on first use; `BackendError` if it cannot be imported."""
    cp = _cupy()
    if cp is None:
        raise BackendError("CuPy is not installed (pip install 'dspk[cuda12]' or 'dspk[cuda13]')")
    return cp


@lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA GPU can be used through CuPy, else why not (never raises).

    The answer is computed once per process (cached).

    Returns
    -------
    str or None
        For example ``"CuPy is not installed"`` or ``"no CUDA device found"``.

    Examples
    --------
    >>> from dspk.backend import gpu_available, gpu_unavailable_reason
    >>> reason = gpu_unavailable_reason()
    >>> (reason is None) == gpu_available()
    True
    """
    cp = _cupy()
    if cp is None:
        return "CuPy is not installed"
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device, driver too old...
        return f"CUDA is not usable: {exc}"
    if n < 1:
        return "no CUDA device found"
    return None


def gpu_available() -> bool:
    """True when CuPy is installed and sees at least one CUDA device.

    Never raises; `gpu_unavailable_reason` says why not.

    Returns
    -------
    bool

    Examples
    --------
    >>> import dspk
    >>> backend = "gpu" if dspk.gpu_available() else "cpu"
    >>> backend in ("cpu", "gpu")
    True
    """
    return gpu_unavailable_reason() is None


_fallback_logged = False


def resolve_backend(backend: str | None = None) -> str:
    """Turn ``"auto" | "cpu" | "gpu"`` (default: ``$DSPK_BACKEND`` or ``"auto"``) into ``"cpu"``
    or ``"gpu"``.

    ``"gpu"`` without a usable GPU raises `BackendError`; ``"auto"`` falls back to the CPU and
    logs that once per process.

    Parameters
    ----------
    backend : {"auto", "cpu", "gpu"}, optional
        Case and surrounding spaces are ignored. None reads ``$DSPK_BACKEND`` (unset or
        empty: ``"auto"``).

    Returns
    -------
    str
        ``"cpu"`` or ``"gpu"``.

    Raises
    ------
    ValueError
        A name other than the three.
    BackendError
        ``"gpu"`` on a machine where no GPU can be used.

    Examples
    --------
    >>> from dspk.backend import resolve_backend
    >>> resolve_backend("cpu")
    'cpu'
    >>> resolve_backend(" Auto ") in ("cpu", "gpu")     # "gpu" when CuPy sees a GPU
    True
    >>> resolve_backend("tpu")
    Traceback (most recent call last):
    ...
    ValueError: backend must be one of ('auto', 'cpu', 'gpu'), got 'tpu'
    """
    global _fallback_logged
    source = "backend"
    if backend is None:
        backend = os.environ.get("DSPK_BACKEND", "auto") or "auto"
        source = "DSPK_BACKEND"
    name = backend.strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"{source} must be one of {BACKENDS}, got {backend!r}")
    if name == "cpu":
        return "cpu"
    reason = gpu_unavailable_reason()
    if name == "gpu":
        if reason is not None:
            raise BackendError(f"{source}='gpu' was requested but no GPU can be used: {reason}")
        return "gpu"
    if reason is not None:
        if not _fallback_logged:
            log.info("no GPU (%s); using the CPU backend", reason)   # the logger names dspk
            _fallback_logged = True
        return "cpu"
    return "gpu"


def array_module(*arrays: Any) -> ModuleType:
    """NumPy or CuPy, chosen by the arrays given.

    Parameters
    ----------
    *arrays : array or None
        NumPy arrays, CuPy arrays or anything else (taken as host data); None is skipped.

    Returns
    -------
    module
        ``numpy``, or ``cupy`` when the arrays are CuPy arrays (imported on first use).

    Raises
    ------
    TypeError
        If NumPy and CuPy arrays are mixed, or CuPy arrays live on different devices.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.backend import array_module
    >>> array_module(np.zeros(3), None, [1.0]) is np
    True
    """
    kinds = set()
    devices = set()
    for x in arrays:
        if x is None:
            continue
        if is_cupy_array(x):
            kinds.add("cupy")
            devices.add(x.device.id)
        else:
            kinds.add("numpy")
    if len(kinds) > 1:
        raise TypeError("NumPy and CuPy arrays are mixed; move them to one device first")
    if len(devices) > 1:
        raise TypeError(f"CuPy arrays are on different GPUs {sorted(devices)}")
    if kinds == {"cupy"}:
        return cupy_module()
    return np


def device_of(x: Any) -> int | None:
    """CUDA device id of a CuPy array, None for host arrays.

    Parameters
    ----------
    x : array

    Returns
    -------
    int or None

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.backend import device_of
    >>> print(device_of(np.zeros(3)))
    None
    """
    return x.device.id if is_cupy_array(x) else None


@lru_cache(maxsize=None)
def device_name(device_id: int | None) -> str:
    """A stable name for the tuner key: ``"cpu:<machine>:<cores>"`` or
    ``"<GPU name> cc<XY> sm<N>"``.

    Parameters
    ----------
    device_id : int or None
        A CUDA device id, or None for the host.

    Returns
    -------
    str

    Examples
    --------
    >>> from dspk.backend import device_name
    >>> device_name(None)                    # doctest: +ELLIPSIS
    'cpu:...:...'
    """
    if device_id is None:
        return f"cpu:{platform.machine()}:{os.cpu_count()}"
    cp = cupy_module()
    props = cp.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return f"{name} cc{props['major']}{props['minor']} sm{props['multiProcessorCount']}"


@lru_cache(maxsize=None)
def device_properties(device_id: int) -> dict:
    """CUDA device properties (cached)."""
    return cupy_module().cuda.runtime.getDeviceProperties(device_id)


#: samples per tile of the blocked transpose: measured on a 2-core x86 host for 384 int16
#: channels, 4096 ran at 1.15 GB/s, 8192 at 0.56 and a plain ascontiguousarray(x.T) at 0.16
#: (the H200 host: 0.28 GB/s, slower than its disk)
TRANSPOSE_TILE = 4096


def blocked_transpose(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A C-contiguous transpose of a 2-D host array, tile by tile so that each tile's reads
    and writes stay in cache (NumPy's strided transpose copy is several times slower)."""
    n, c = a.shape
    if out is None:
        out = np.empty((c, n), dtype=a.dtype)
    for s0 in range(0, n, TRANSPOSE_TILE):
        s1 = min(n, s0 + TRANSPOSE_TILE)
        out[:, s0:s1] = a[s0:s1].T
    return out


def to_numpy(x: Any) -> np.ndarray:
    """Host copy of any array (CuPy arrays are transferred).

    Parameters
    ----------
    x : array-like
        A CuPy array (copied to the host) or anything ``numpy.asarray`` takes (not copied
        when it is already a NumPy array).

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> from dspk.backend import to_numpy
    >>> to_numpy([1, 2, 3])
    array([1, 2, 3])
    """
    if is_cupy_array(x):
        return x.get()
    return np.asarray(x)


class Timer:
    """Times a region on the device of ``xp``: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, xp: ModuleType):
        self.gpu = xp is not np
        self.xp = xp

    def __enter__(self) -> "Timer":
        if self.gpu:
            self._start = self.xp.cuda.Event()
            self._stop = self.xp.cuda.Event()
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.gpu:
            self._stop.record()
            self._stop.synchronize()
            self.seconds = self.xp.cuda.get_elapsed_time(self._start, self._stop) * 1e-3
        else:
            self.seconds = time.perf_counter() - self._t0


def pinned_empty(n: int, dtype: Any) -> np.ndarray:
    """An uninitialised 1-D NumPy array of ``n`` items in page-locked host memory (what
    ``cupyx.empty_pinned`` gives, without importing cupyx: its import pulls in scipy.sparse
    and numpy.f2py, 0.5-0.8 s of a GPU process's first call, measured on an H100 host)."""
    cp = cupy_module()
    dtype = np.dtype(dtype)
    mem = cp.cuda.alloc_pinned_memory(max(1, int(n)) * dtype.itemsize)
    return np.ndarray((int(n),), dtype=dtype, buffer=mem)
