"""Every CUDA source of dspk (``*.cu`` in this folder, shipped as package data), and loading and
launching their kernels (compiled by NVRTC through ``cupy.RawModule`` on first use, cached on
disk by CuPy).

Nothing here runs at import time: CuPy is imported, and a kernel compiled, the first time a
kernel is asked for.
"""

from __future__ import annotations

import ctypes
import re
import threading
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from ..backend import cupy_module
from ..caches import shared

KERNEL_DIR = Path(__file__).resolve().parent
CUDA_SOURCES = tuple(sorted(KERNEL_DIR.glob("*.cu")))

#: CUDA C type names of the dtypes the kernels are instantiated for
CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
          np.dtype(np.uint8): "unsigned char", np.dtype(np.int8): "signed char",
          np.dtype(np.int16): "short"}
#: the float dtypes (the trace kernels take these)
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def ctype(dtype: Any) -> str:
    """The CUDA C type name of ``dtype`` (KeyError for a type no kernel is compiled for)."""
    return CTYPES[np.dtype(dtype)]


#: a source's include of a header of this folder: ``#include "name.cuh"``
_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_]+\.cuh)"[ \t]*$', re.MULTILINE)
#: a line of launch.cuh: ``constexpr int NAME = 123;`` (a comment may follow)
_CONSTANT = re.compile(r"^constexpr int ([A-Z][A-Z0-9_]*) = ([0-9]+);[ \t]*(//.*)?$")


def _launch_constants(path: Path) -> dict[str, int]:
    """The constants of launch.cuh, the one table the kernels and their Python launches read
    (each kernel includes the header; nvcc and NVRTC see the same values). A ``constexpr``
    line that is not a plain integer constant is an error, not skipped."""
    found: dict[str, int] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("constexpr"):
            continue
        m = _CONSTANT.match(line)
        if m is None:
            raise ValueError(f"{path.name}:{n}: expected 'constexpr int NAME = <integer>;', "
                             f"got {line!r}")
        if m.group(1) in found:
            raise ValueError(f"{path.name}:{n}: {m.group(1)} defined twice")
        found[m.group(1)] = int(m.group(2))
    return found


#: the launch constants of dspk/kernels/launch.cuh, by name (read once, at import)
LAUNCH: Mapping[str, int] = MappingProxyType(_launch_constants(KERNEL_DIR / "launch.cuh"))


#: the process-wide stores (`dspk.caches`): the texts NVRTC compiles, by file; the compiled
#: kernels, by (device, file, expression)
SOURCES = "cuda_sources"
KERNELS = "cuda_kernels"


def source(filename: str) -> str:
    """The text NVRTC compiles: the file with each ``#include "x.cuh"`` of this folder
    replaced by the header's text, so that NVRTC needs no include path and CuPy's compile
    cache, keyed on the text, sees a changed header (nvcc compiles the files as they are)."""
    texts = shared(SOURCES, dict)
    text = texts.get(filename)
    if text is None:
        path = Path(filename)
        text = texts[filename] = _paste_headers(
            (path if path.is_absolute() else KERNEL_DIR / filename).read_text(), set())
    return text


def _paste_headers(text: str, pasted: set) -> str:
    """``text`` with each include of a header of this folder replaced by the header's own text
    (its includes pasted too), each header once."""
    def paste(m: re.Match) -> str:
        name = m.group(1)
        if name in pasted:
            return ""
        pasted.add(name)
        return _paste_headers((KERNEL_DIR / name).read_text(), pasted)

    return _INCLUDE.sub(paste, text)


#: the name it had before it was public (tests and benchmarks read it)
_source = source


def kernel(filename: str, expression: str) -> Any:
    """The compiled kernel ``expression`` (a template instance such as
    ``"gram_small<float, float, 4, true>"``) from ``filename`` (in this folder, or an absolute
    path, e.g. a benchmark's own source) for the current device."""
    cp = cupy_module()
    device_id = cp.cuda.runtime.getDevice()
    functions = shared(KERNELS, dict)
    key = (device_id, filename, expression)
    fn = functions.get(key)
    if fn is None:
        with cp.cuda.Device(device_id):
            module = cp.RawModule(code=source(filename), options=("-std=c++17",),
                                  name_expressions=[expression])
            fn = functions.setdefault(key, module.get_function(expression))
    return fn


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


class FastLaunch:
    """A kernel launch with its parameters packed once: a call sets only the arguments that
    change (addresses) and goes straight to ``cuLaunchKernel``.

    CuPy's ``RawKernel.__call__`` converts every argument on every call, which costs more host
    time than the whole kernel runs for the skinny products (4 channels: ~3 µs of GPU work);
    this keeps a launch to a few microseconds of Python.

    Parameters
    ----------
    fn : cupy.RawKernel
    grid, block : tuple of int
    args : list
        One entry per kernel parameter: ``("ptr", None)`` for an address given at call time,
        or ``(ctype, value)`` for a constant (``"i32"``, ``"i64"``, ``"u64"``, ``"f32"``;
        arrays by their address).
    shared_mem : int
    """

    _CT = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64,
           "f32": ctypes.c_float, "ptr": ctypes.c_uint64}

    def __init__(self, fn: Any, grid: tuple, block: tuple, args: list, shared_mem: int = 0):
        cupy_module()
        from cupy_backends.cuda.api import driver  # noqa: PLC0415 (needs CuPy)

        self._launch = driver.launchKernel
        # the kernel keeps its module loaded while this launch may run (a `forget` drops the
        # table of compiled kernels, not the kernels that launches hold)
        self.fn = fn
        self.fptr = fn.kernel.ptr
        g = tuple(grid) + (1,) * (3 - len(grid))
        b = tuple(block) + (1,) * (3 - len(block))
        self.dims = (*g, *b, int(shared_mem))
        ndyn = sum(1 for kind, value in args if kind == "ptr" and value is None)
        self._dyn = (ctypes.c_uint64 * max(ndyn, 1))()  # call-time addresses, set in one slice
        self.ndyn = ndyn
        self._vals = []
        addrs = []
        d = 0
        for kind, value in args:
            if kind == "ptr" and value is None:
                addrs.append(ctypes.addressof(self._dyn) + 8 * d)
                d += 1
                continue
            if hasattr(value, "data") and hasattr(value.data, "ptr"):
                value = value.data.ptr
            v = self._CT[kind](float(value) if kind == "f32" else int(value))
            self._vals.append(v)
            addrs.append(ctypes.addressof(v))
        self._params = (ctypes.c_void_p * len(addrs))(*addrs)
        self._addr = ctypes.addressof(self._params)
        self._lock = threading.Lock()

    def __call__(self, stream: int, *ptrs: int) -> None:
        """Launch on ``stream`` (a ``cudaStream_t`` as int) with the call-time addresses."""
        dims = self.dims
        with self._lock:  # the packed parameters are shared; cuLaunchKernel copies them
            self._dyn[:self.ndyn] = ptrs
            self._launch(self.fptr, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5],
                         dims[6], stream, self._addr, 0)
