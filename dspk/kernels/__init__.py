"""Every CUDA source of dspk (``*.cu`` in this folder, shipped as package data), and loading and
launching their kernels.

Each source is compiled by NVRTC (through ``cupy.RawModule``, cached on disk by CuPy) once per
device, the first time one of its kernels is asked for, with every template instance dspk
takes from it in the same call: the module that launches a file's kernels declares their list
(`declare_instances`), so a first tuning run, which tries many instances of one file, compiles
the file once rather than once per instance. An instance missing from its file's list still
compiles on demand, on its own, with a logged warning (the list is incomplete: a bug).

Nothing here runs at import time but reading launch.cuh: CuPy is imported, and a kernel
compiled, the first time a kernel is asked for.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from ..backend import cupy_module, device_properties
from ..caches import shared

log = logging.getLogger(__name__)

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
#: modules, by (device, file); the kernels taken from them, by (device, file, expression)
SOURCES = "cuda_sources"
MODULES = "cuda_modules"
KERNELS = "cuda_kernels"
#: NVRTC's options for every source
OPTIONS = ("-std=c++17",)

#: file -> instances(device properties) -> the template instances dspk takes from it. Filled
#: at import by the modules that launch each file's kernels (`declare_instances`) and never
#: cleared: a table of declarations, not a cache.
_DECLARED: dict[str, Callable[[dict], Iterable[str]]] = {}


def declare_instances(filename: str, instances: Callable[[dict], Iterable[str]]) -> None:
    """Declare every template instance (and plain kernel) dspk takes from ``filename``: the
    first request for one of its kernels on a device compiles them all, in one NVRTC call.

    Parameters
    ----------
    filename : str
        A source of this folder. One module declares each file (the one that launches its
        kernels), when it is imported.
    instances : callable
        ``instances(props)`` -> the kernel expressions (``"gram_small<float, float, 4,
        true>"``, ``"combine_planes"``) dspk can request on a device with properties
        ``props`` (`dspk.backend.device_properties`), spelled as they are requested.
    """
    if filename in _DECLARED and _DECLARED[filename] is not instances:
        raise ValueError(f"{filename}: instances declared twice")
    if not (KERNEL_DIR / filename).is_file():
        raise ValueError(f"{filename}: no such source in {KERNEL_DIR}")
    _DECLARED[filename] = instances


def declared_instances(filename: str, props: dict) -> list[str] | None:
    """The instances declared for ``filename`` on a device with properties ``props``, sorted
    (None for a file without a declaration: a benchmark's own source, say)."""
    make = _DECLARED.get(filename)
    return None if make is None else sorted(set(make(props)))


def declared_files() -> tuple[str, ...]:
    """The sources whose instances are declared (those of the modules imported so far)."""
    return tuple(sorted(_DECLARED))


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


class _Modules(dict):
    """(device, file) -> (module, its instances); its lock makes one compile of each."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def _module(device_id: int, filename: str) -> tuple[Any, frozenset]:
    """The module of ``filename`` on ``device_id`` with every declared instance (compiled
    on first use), and those instances; (None, empty) for an undeclared file."""
    modules = shared(MODULES, _Modules)
    key = (device_id, filename)
    hit = modules.get(key)
    if hit is not None:
        return hit
    cp = cupy_module()
    with modules.lock:
        hit = modules.get(key)
        if hit is None:
            names = declared_instances(filename, device_properties(device_id))
            module = None
            if names:
                try:
                    with cp.cuda.Device(device_id):
                        module = cp.RawModule(code=source(filename), options=OPTIONS,
                                              name_expressions=names)
                        module.compile()
                except Exception as exc:  # noqa: BLE001 (each instance is then tried alone)
                    log.warning("dspk.kernels: %s did not compile with its %d instances "
                                "(%s: %s); each is compiled on its own when asked for",
                                filename, len(names), type(exc).__name__, exc)
                    module, names = None, None
            hit = modules[key] = (module, frozenset(names or ()))
    return hit


def precompile(filenames: Iterable[str] | None = None) -> dict[str, int]:
    """Compile the declared instances of ``filenames`` (every declared file by default) for
    the current device now, rather than at the first request: for a warm-up before work
    that is timed, or ahead of a job (``dspk tune``). NVRTC's results are cached on disk by
    CuPy, so a later process loads them.

    Parameters
    ----------
    filenames : iterable of str, optional
        Sources of this folder; default `declared_files`.

    Returns
    -------
    dict
        File -> instances compiled together (0 where the list did not compile as a whole:
        its instances compile one by one when asked for, as a logged warning says).
    """
    device_id = cupy_module().cuda.runtime.getDevice()
    return {f: len(_module(device_id, f)[1]) for f in (filenames or declared_files())}


def kernel(filename: str, expression: str) -> Any:
    """The compiled kernel ``expression`` (a template instance such as
    ``"gram_small<float, float, 4, true>"``) from ``filename`` (in this folder, or an absolute
    path, e.g. a benchmark's own source) for the current device.

    The first request of a declared file compiles all its instances (`declare_instances`);
    an instance not in the list, or one of an undeclared file, is compiled on its own."""
    cp = cupy_module()
    device_id = cp.cuda.runtime.getDevice()
    functions = shared(KERNELS, dict)
    key = (device_id, filename, expression)
    fn = functions.get(key)
    if fn is not None:
        return fn
    module, names = _module(device_id, filename)
    if expression not in names:
        if filename in _DECLARED and names:
            log.warning("dspk.kernels: %s is not among the instances declared for %s; "
                        "compiled on its own", expression, filename)
        with cp.cuda.Device(device_id):
            module = cp.RawModule(code=source(filename), options=OPTIONS,
                                  name_expressions=[expression])
    with cp.cuda.Device(device_id):
        fn = module.get_function(expression)
    return functions.setdefault(key, fn)


def grid_1d(total: int, block: int = 256, cap: int = 65535 * 16) -> tuple[int]:
    return (max(1, min(cap, -(-total // block))),)


def _gather_expression(dtype: Any) -> str:
    return f"gather3d<{ctype(dtype)}>"


def _gather_instances(props: dict) -> list[str]:
    """`gather` copies views of every dtype a kernel takes."""
    return [_gather_expression(dt) for dt in CTYPES]


def gather(view: Any) -> Any:
    """Contiguous row-major copy of a GPU `MatrixView`, one pass, offset applied in the kernel."""
    cp = cupy_module()
    view.check()
    b, r, c = view.shape
    dst = cp.empty(b * r * c, dtype=view.dtype)
    if dst.size == 0:
        return dst
    fn = kernel("gather.cu", _gather_expression(view.dtype))
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


declare_instances("gather.cu", _gather_instances)
