"""Every CUDA source of dspk (``*.cu`` in this folder, shipped as package data), and loading and
launching their kernels.

The module that launches a file's kernels declares every template instance dspk takes from it
(`declare_instances`). A declared source's kernels come, where possible, from its prebuilt
fatbin (``prebuilt/<name>.fatbin``, built by nvcc for the common architectures with the same
options as NVRTC's: `dspk.kernels.fatbins`, ``python -m dspk.kernels.build``), loaded once
per device: no compile in a user's first call. NVRTC (through ``cupy.RawModule``, cached on
disk by CuPy) compiles what the fatbin cannot give: all of a file's declared instances in one
call at the first request of one, when the fatbin is missing, older than the sources, has no
image for the device or the driver is too old for it (or DSPK_KERNELS=nvrtc), or just those
instances it lacks (the device declares one its architecture's image was not built with). An
instance missing from its file's list still compiles on demand, on its own, with a logged
warning (the list is incomplete: a bug). `loaded_from` says which happened, as the log does.

Nothing here runs at import time but reading launch.cuh: CuPy is imported, and a kernel
loaded or compiled, the first time a kernel is asked for.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from ..backend import cupy_module, device_properties
from ..caches import shared
from . import fatbins
from .fatbins import NVRTC_OPTIONS, PREBUILT_DIR, paste_headers

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
OPTIONS = NVRTC_OPTIONS

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
    cache, keyed on the text, sees a changed header (the prebuilt fatbins are built from this
    text too, and their tables record its hash: `dspk.kernels.fatbins`)."""
    texts = shared(SOURCES, dict)
    text = texts.get(filename)
    if text is None:
        path = Path(filename)
        text = texts[filename] = paste_headers(
            (path if path.is_absolute() else KERNEL_DIR / filename).read_text())
    return text


#: where a source's kernels come from: DSPK_KERNELS = ``auto`` (the prebuilt fatbin where it
#: is usable, else NVRTC), ``prebuilt`` (the prebuilt fatbin or an error: for checking that
#: it is used) or ``nvrtc`` (NVRTC for everything, as without prebuilt kernels)
KERNELS_ENV = "DSPK_KERNELS"
KERNEL_ORIGINS = ("auto", "prebuilt", "nvrtc")


def kernel_origin_mode() -> str:
    """The value of DSPK_KERNELS (`KERNEL_ORIGINS`; ``auto`` when unset or empty)."""
    mode = (os.environ.get(KERNELS_ENV, "auto") or "auto").strip().lower()
    if mode not in KERNEL_ORIGINS:
        raise ValueError(f"{KERNELS_ENV}={mode!r}: expected one of {', '.join(KERNEL_ORIGINS)}")
    return mode


class _Loaded:
    """A source's kernels on one device: the prebuilt module (None if not usable: ``origin``
    says why) and the mangled names of its instances; the declared instances; NVRTC's
    module of the declared instances the prebuilt one lacks (every one without it),
    compiled in one call at the first request of one of them."""

    def __init__(self, mode: str, declared: frozenset, prebuilt: Any, names: dict,
                 origin: str) -> None:
        self.mode = mode
        self.declared = declared
        self.prebuilt = prebuilt
        self.names = names
        self.origin = origin
        self.nvrtc: Any = None
        self.nvrtc_names: frozenset = frozenset()
        self.compiled = False


class _Modules(dict):
    """(device, file) -> `_Loaded`; its lock makes one load and one compile of each."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def _prebuilt(cp: Any, device_id: int, filename: str) -> tuple[Any, dict, str]:
    """``filename``'s prebuilt module on ``device_id`` (loaded now, so a fatbin the driver
    refuses falls back here rather than at a launch), its instances' mangled names, and
    where the kernels come from; (None, {}, why NVRTC) when it is not usable."""
    props = device_properties(device_id)
    try:
        table = fatbins.read_table(filename, PREBUILT_DIR)
        why = fatbins.stale(table, source(filename), PREBUILT_DIR)
        if why is not None:
            return None, {}, f"NVRTC ({why})"
        arch, which = fatbins.image_for(table, (int(props["major"]), int(props["minor"])),
                                        int(cp.cuda.runtime.driverGetVersion()))
        if arch is None:
            return None, {}, f"NVRTC ({which})"
        names = fatbins.names(table, arch)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # a damaged table
        log.warning("dspk.kernels: the prebuilt table of %s is unreadable (%s: %s); NVRTC "
                    "compiles its kernels", filename, type(exc).__name__, exc)
        return None, {}, f"NVRTC (unreadable prebuilt table: {type(exc).__name__}: {exc})"
    path = PREBUILT_DIR / table["fatbin"]
    try:
        with cp.cuda.Device(device_id):
            module = cp.RawModule(path=str(path))
            module.module  # noqa: B018 (loads the fatbin now)
    except Exception as exc:  # noqa: BLE001 (NVRTC compiles the kernels instead)
        log.warning("dspk.kernels: the driver did not load %s (%s: %s); NVRTC compiles %s",
                    path, type(exc).__name__, exc, filename)
        return None, {}, f"NVRTC (the driver did not load {path.name}: {exc})"
    return module, names, f"prebuilt {which} ({path.name})"


def _loaded(cp: Any, device_id: int, filename: str) -> _Loaded:
    """The `_Loaded` of ``filename`` on ``device_id``, made on first use: the prebuilt
    fatbin of a declared source of this folder where it is usable and allowed."""
    modules = shared(MODULES, _Modules)
    key = (device_id, filename)
    hit = modules.get(key)
    if hit is not None:
        return hit
    with modules.lock:
        hit = modules.get(key)
        if hit is None:
            mode = kernel_origin_mode()
            declared = frozenset(declared_instances(filename, device_properties(device_id))
                                 or ())
            module, names, origin = None, {}, "NVRTC (no declared instances)"
            if filename in _DECLARED and mode == "nvrtc":
                origin = f"NVRTC ({KERNELS_ENV}=nvrtc)"
            elif filename in _DECLARED:
                module, names, origin = _prebuilt(cp, device_id, filename)
                if module is None and mode == "prebuilt":
                    raise RuntimeError(f"{filename}: {KERNELS_ENV}=prebuilt, but {origin}")
            log.info("dspk.kernels: %s on device %d: %s", filename, device_id, origin)
            hit = modules[key] = _Loaded(mode, declared, module, names, origin)
    return hit


def _nvrtc(cp: Any, device_id: int, filename: str, loaded: _Loaded) -> tuple[Any, frozenset]:
    """NVRTC's module of the declared instances of ``filename`` the prebuilt module lacks,
    compiled in one call on first use, and those instances (none if they did not compile
    together: each is then compiled on its own when asked for)."""
    if loaded.compiled:
        return loaded.nvrtc, loaded.nvrtc_names
    with shared(MODULES, _Modules).lock:
        if not loaded.compiled:
            names = sorted(loaded.declared - set(loaded.names))
            module = None
            if names:
                t0 = time.perf_counter()
                try:
                    with cp.cuda.Device(device_id):
                        module = cp.RawModule(code=source(filename), options=OPTIONS,
                                              name_expressions=names)
                        module.compile()
                    log.info("dspk.kernels: NVRTC compiled %d instances of %s in %.1f s; "
                             "%s", len(names), filename, time.perf_counter() - t0,
                             loaded.origin)
                except Exception as exc:  # noqa: BLE001 (each instance is then tried alone)
                    log.warning("dspk.kernels: %s did not compile with its %d instances "
                                "(%s: %s); each is compiled on its own when asked for",
                                filename, len(names), type(exc).__name__, exc)
                    module, names = None, []
            loaded.nvrtc, loaded.nvrtc_names = module, frozenset(names)
            loaded.compiled = True
    return loaded.nvrtc, loaded.nvrtc_names


def loaded_from(filename: str, device_id: int | None = None) -> str | None:
    """Where the kernels of ``filename`` on ``device_id`` (default: the current device) come
    from, or None before the first request of one there: ``"prebuilt SASS sm_90
    (ncc.fatbin)"``, with ``"; NVRTC for 3 instances"`` when NVRTC compiled those the
    prebuilt image lacks, or ``"NVRTC (why)"`` (no usable prebuilt fatbin, or
    DSPK_KERNELS=nvrtc). Also logged (INFO) at the first request."""
    if device_id is None:
        device_id = cupy_module().cuda.runtime.getDevice()
    loaded = shared(MODULES, _Modules).get((device_id, filename))
    if loaded is None:
        return None
    if loaded.prebuilt is not None and loaded.compiled and loaded.nvrtc_names:
        return f"{loaded.origin}; NVRTC for {len(loaded.nvrtc_names)} instances"
    return loaded.origin


def precompile(filenames: Iterable[str] | None = None) -> dict[str, int]:
    """Load (from the prebuilt fatbin) or compile (NVRTC) every declared instance of
    ``filenames`` (every declared file by default) for the current device now, rather than
    at the first request: for a warm-up before work that is timed, or ahead of a job
    (``dspk tune --compile``). NVRTC's results are cached on disk by CuPy, so a later
    process loads them; `loaded_from` says where each file's kernels came from.

    Parameters
    ----------
    filenames : iterable of str, optional
        Sources of this folder; default `declared_files`.

    Returns
    -------
    dict
        File -> its declared instances on this device, each now loaded.
    """
    cp = cupy_module()
    device_id = cp.cuda.runtime.getDevice()
    found = {}
    for f in (filenames or declared_files()):
        names = declared_instances(f, device_properties(device_id)) or []
        for expression in names:
            _kernel(cp, device_id, f, expression)
        found[f] = len(names)
    return found


def kernel(filename: str, expression: str) -> Any:
    """The compiled kernel ``expression`` (a template instance such as
    ``"gram_small<float, float, 4, true>"``) from ``filename`` (in this folder, or an absolute
    path, e.g. a benchmark's own source) for the current device.

    A declared source's kernels come from its prebuilt fatbin where that is usable (see
    `dspk.kernels.fatbins`; DSPK_KERNELS chooses, `KERNEL_ORIGINS`); otherwise the first
    request compiles all its declared instances the fatbin lacks in one NVRTC call
    (`declare_instances`). An instance not in the list, or one of an undeclared file, is
    compiled on its own."""
    cp = cupy_module()
    return _kernel(cp, cp.cuda.runtime.getDevice(), filename, expression)


def _kernel(cp: Any, device_id: int, filename: str, expression: str) -> Any:
    functions = shared(KERNELS, dict)
    key = (device_id, filename, expression)
    fn = functions.get(key)
    if fn is not None:
        return fn
    loaded = _loaded(cp, device_id, filename)
    mangled = loaded.names.get(expression)
    if mangled is not None:
        try:
            with cp.cuda.Device(device_id):
                fn = loaded.prebuilt.get_function(mangled)
        except Exception as exc:  # noqa: BLE001 (NVRTC compiles it instead)
            if loaded.mode == "prebuilt":
                raise
            log.warning("dspk.kernels: %s (%s) not loaded from %s (%s: %s); NVRTC compiles "
                        "it", expression, mangled, loaded.origin, type(exc).__name__, exc)
    if fn is None:
        if loaded.mode == "prebuilt" and filename in _DECLARED:
            raise RuntimeError(f"{filename}: {expression} is not in its prebuilt image "
                               f"({loaded.origin}) and {KERNELS_ENV}=prebuilt")
        module, names = _nvrtc(cp, device_id, filename, loaded)
        if expression not in names:
            if filename in _DECLARED and loaded.declared and \
                    expression not in loaded.declared:
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
