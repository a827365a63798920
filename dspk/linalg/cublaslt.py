"""cuBLASLt through ctypes: its matmul with an algorithm chosen once per geometry.

Why by hand: CuPy exposes cuBLAS but not cuBLASLt. cuBLAS's ``gemm*`` entry points run the
library's heuristic on every call, which costs host time (measured on an H200: 28 µs per call
of gemmStridedBatchedEx for 384 x 384 x 60 000 float32, against 18 µs for a cuBLASLt call with
its algorithm fixed, the same kernel time), and they run one algorithm only. cuBLASLt's
heuristic returns a ranked list of algorithms; `LtGemm` keeps one, so the tuner can time the
first few and keep the fastest (for 64 x 64 x 60 000 float32 the second-ranked is faster than
the first and than cuBLAS: 0.0189 ms against 0.0195).

The compute type is passed explicitly (CUBLAS_COMPUTE_32F / 64F): never TF32.
cuBLASLt is found in the process (cuBLAS loads it), so it is the same build CuPy's cuBLAS uses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..backend import cupy_module
from ..caches import shared
from .view import MatrixView

__all__ = ["available", "GemmGeometry", "gemm_geometry", "LtMatmul", "LtGemm", "CublasLt"]

CUDA_R_32F, CUDA_R_64F = 0, 1
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F = 68, 70
OP_N, OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB = 3, 4                # cublasLtMatmulDescAttributes_t
_LAYOUT_BATCH_COUNT, _LAYOUT_BATCH_OFFSET = 5, 6  # cublasLtMatrixLayoutAttribute_t
_PREF_MAX_WORKSPACE = 1                          # cublasLtMatmulPreferenceAttributes_t
#: the most workspace an algorithm may ask for (a buffer of this size per device and stream
#: is allocated only when a chosen algorithm needs one)
MAX_WORKSPACE = 32 << 20
CUDA_R_8I, CUDA_R_32I, CUBLAS_COMPUTE_32I = 3, 10, 72
#: operand dtype -> (operand type, result type, compute type, scalar type); int8 products
#: give int32 (exact; the caller keeps K short enough)
_TYPES = {np.dtype(np.float32): (CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, ctypes.c_float),
          np.dtype(np.float64): (CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, ctypes.c_double),
          np.dtype(np.int8): (CUDA_R_8I, CUDA_R_32I, CUBLAS_COMPUTE_32I, ctypes.c_int32)}


class _Heuristic(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t."""

    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t),
                ("state", ctypes.c_int), ("waves", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


#: the name of this module's process-wide store (`dspk.caches`)
STORE = "cublaslt"


def _find_library() -> Any:
    """libcublasLt as this process loaded it (cuBLAS depends on it), else by name."""
    cp = cupy_module()
    cp.cuda.device.get_cublas_handle()          # loads cuBLAS, and with it cuBLASLt
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            if "libcublasLt" in line and line.split()[-1].startswith("/"):
                return ctypes.CDLL(line.split()[-1])
    major = cp.cuda.runtime.runtimeGetVersion() // 1000
    names = ([f"cublasLt64_{major}.dll"] if sys.platform == "win32" else
             [f"libcublasLt.so.{major}", ctypes.util.find_library("cublasLt")])
    for name in names:
        if name:
            try:
                return ctypes.CDLL(name)
            except OSError:
                continue
    raise OSError("libcublasLt not found")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what}: cuBLASLt status {status}")


class Handle:
    """A cuBLASLt handle, destroyed when the last object using it (the `CublasLt` store, the
    `LtMatmul` plans made with it) lets it go."""

    __slots__ = ("lib", "ptr")

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.ptr = ctypes.c_void_p()
        _check(lib.cublasLtCreate(ctypes.byref(self.ptr)), "cublasLtCreate")

    def __del__(self, _finalizing: Any = sys.is_finalizing) -> None:
        # at exit the driver may be gone first (and this module's globals, sys among them)
        if self.ptr and not _finalizing():
            self.lib.cublasLtDestroy(self.ptr)


class CublasLt:
    """cuBLASLt in this process (`dspk.caches` store `STORE`): the library, loaded on first
    use, and a handle per device. ``clear()`` (every engine's `forget`) lets both go: a plan
    made earlier keeps the library and its handle alive until it goes too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lib: Any = None
        self._reason: str | None = None
        self._handles: dict[int, Handle] = {}

    def library(self) -> Any:
        """The library with its call signatures set, or None (`reason` says why)."""
        with self._lock:
            if self._lib is None and self._reason is None:
                try:
                    lib = _find_library()
                    vp, i32, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
                    lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp,
                                                   vp, vp, vp, sz, vp]
                    lib.cublasLtMatmul.restype = i32
                    self._lib = lib
                except (OSError, AttributeError) as e:
                    self._reason = f"cuBLASLt could not be loaded ({e})"
            return self._lib

    @property
    def reason(self) -> str | None:
        """Why the library cannot be loaded (None if it can or was not tried)."""
        return self._reason

    def handle(self, device_id: int) -> Handle:
        """The handle of ``device_id`` (made on first use, with that device current)."""
        lib = self.library()
        if lib is None:
            raise RuntimeError(self._reason)
        with self._lock:
            h = self._handles.get(device_id)
        if h is None:
            h = Handle(lib)
            with self._lock:
                h = self._handles.setdefault(device_id, h)
        return h

    def clear(self) -> None:
        with self._lock:
            self._lib, self._reason = None, None
            self._handles.clear()

    def __len__(self) -> int:
        """The library (1 once loaded) and the handles held."""
        return (self._lib is not None) + len(self._handles)


def _state() -> CublasLt:
    return shared(STORE, CublasLt)


def available() -> str | None:
    """None when cuBLASLt can be called, else why not."""
    state = _state()
    state.library()
    return state.reason


@dataclass(frozen=True)
class GemmGeometry:
    """``out = a·b`` for row- or column-major views in cuBLAS's column-major terms: the
    column-major product is ``first·second`` (a·b, or bᵀ·aᵀ for a row-major out), with
    ``swap`` telling which operand comes first."""

    swap: bool
    m: int
    n: int
    k: int
    op1: int
    op2: int
    ld1: int
    ld2: int
    ldc: int


def gemm_geometry(a: MatrixView, b: MatrixView, out: MatrixView) -> GemmGeometry:
    """The column-major GEMM computing ``out = a·b`` (``a``, ``b``, ``out`` in R or C layout)."""
    target = out.layout()
    M, K, N = a.shape[1], a.shape[2], b.shape[2]
    swap = target == "R"  # row-major out: compute outᵀ = bᵀ·aᵀ in column-major terms
    first, second = (b, a) if swap else (a, b)
    la, lb = first.layout(), second.layout()
    return GemmGeometry(swap, N if swap else M, M if swap else N, K,
                        OP_N if la == target else OP_T, OP_N if lb == target else OP_T,
                        first.leading_dim(la), second.leading_dim(lb), out.leading_dim(target))


class LtMatmul:
    """cublasLtMatmul for one column-major geometry ``g`` (``batches`` matrices, batch strides
    ``s1``, ``s2``, ``sc`` in elements, operands of ``dtype``) with the algorithm ranked
    ``rank`` by cuBLASLt's heuristic for it; `algorithms` says how many the heuristic
    offered (``rank`` beyond them: `ok` is False). Called with the operands in ``g``'s order
    (first, second)."""

    def __init__(self, g: GemmGeometry, batches: int, s1: int, s2: int, sc: int, rank: int,
                 device_id: int, dtype: Any = np.float32):
        state = _state()
        lib = state.library()
        if lib is None:
            raise RuntimeError(state.reason)
        in_type, out_type, compute, scalar = _TYPES[np.dtype(dtype)]
        vp = ctypes.c_void_p
        self._lib = lib
        self._objects: list = []          # descriptors, destroyed with this object
        self._desc = vp()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self._desc), compute, out_type),
               "cublasLtMatmulDescCreate")       # scale type: the result's
        for attr, op in ((_DESC_TRANSA, g.op1), (_DESC_TRANSB, g.op2)):
            v = ctypes.c_int32(op)
            _check(lib.cublasLtMatmulDescSetAttribute(self._desc, attr, ctypes.byref(v), 4),
                   "cublasLtMatmulDescSetAttribute")

        def layout(kind: int, rows: int, cols: int, ld: int, stride: int) -> ctypes.c_void_p:
            lay = vp()
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), kind,
                                                  ctypes.c_uint64(rows), ctypes.c_uint64(cols),
                                                  ctypes.c_int64(ld)),
                   "cublasLtMatrixLayoutCreate")
            self._objects.append(("layout", lay))
            if batches > 1:
                count, offset = ctypes.c_int32(batches), ctypes.c_int64(stride)
                _check(lib.cublasLtMatrixLayoutSetAttribute(lay, _LAYOUT_BATCH_COUNT,
                                                            ctypes.byref(count), 4),
                       "cublasLtMatrixLayoutSetAttribute")
                _check(lib.cublasLtMatrixLayoutSetAttribute(lay, _LAYOUT_BATCH_OFFSET,
                                                            ctypes.byref(offset), 8),
                       "cublasLtMatrixLayoutSetAttribute")
            return lay

        # column-major shapes of the stored operands: op(first) is m x k, op(second) k x n
        r1, c1 = (g.m, g.k) if g.op1 == OP_N else (g.k, g.m)
        r2, c2 = (g.k, g.n) if g.op2 == OP_N else (g.n, g.k)
        self._l1 = layout(in_type, r1, c1, g.ld1, s1)
        self._l2 = layout(in_type, r2, c2, g.ld2, s2)
        self._lc = layout(out_type, g.m, g.n, g.ldc, sc)
        pref = vp()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)),
               "cublasLtMatmulPreferenceCreate")
        self._objects.append(("pref", pref))
        ws = ctypes.c_uint64(MAX_WORKSPACE)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE,
                                                        ctypes.byref(ws), 8),
               "cublasLtMatmulPreferenceSetAttribute")
        cp = cupy_module()
        with cp.cuda.Device(device_id):
            self._owner = state.handle(device_id)   # kept: the handle lives while this does
            handle = self._owner.ptr
            wanted = rank + 1
            results = (_Heuristic * wanted)()
            got = ctypes.c_int()
            status = lib.cublasLtMatmulAlgoGetHeuristic(handle, self._desc, self._l1, self._l2,
                                                        self._lc, self._lc, pref, wanted,
                                                        results, ctypes.byref(got))
        usable = [r for r in results[:got.value] if r.state == 0] if status == 0 else []
        self.algorithms = len(usable)
        self.ok = rank < len(usable)
        self._handle = handle
        self._one, self._zero = scalar(1), scalar(0)
        if not self.ok:
            return
        chosen = usable[rank]
        self._algo = _Heuristic()
        ctypes.memmove(ctypes.byref(self._algo), ctypes.byref(chosen), ctypes.sizeof(_Heuristic))
        self.workspace = int(chosen.workspace)
        self.waves = float(chosen.waves)
        self._buffers: dict = {}
        # the per-call arguments that never change, converted once
        self._fixed = (handle, self._desc, ctypes.addressof(self._one),
                       ctypes.addressof(self._zero), self._l1, self._l2, self._lc,
                       ctypes.addressof(self._algo.algo))

    def _work(self, stream: int) -> int:
        """A workspace for ``stream`` (a chosen algorithm's own; 0 when it needs none)."""
        if self.workspace == 0:
            return 0
        buf = self._buffers.get(stream)
        if buf is None:
            buf = self._buffers[stream] = cupy_module().empty(self.workspace, dtype=np.uint8)
        return buf.data.ptr

    def __call__(self, p1: int, p2: int, po: int, stream: int) -> None:
        """The product of the operands at ``p1``, ``p2`` (``g``'s order) into ``po``, on
        ``stream`` (a cudaStream_t as an int)."""
        handle, desc, one, zero, l1, l2, lc, algo = self._fixed
        status = self._lib.cublasLtMatmul(handle, desc, one, p1, l1, p2, l2, zero, po, lc, po,
                                          lc, algo, self._work(stream), self.workspace, stream)
        if status:
            raise RuntimeError(f"cublasLtMatmul: cuBLASLt status {status}")

    def __del__(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        for kind, obj in getattr(self, "_objects", ()):
            (lib.cublasLtMatrixLayoutDestroy if kind == "layout"
             else lib.cublasLtMatmulPreferenceDestroy)(obj)
        if getattr(self, "_desc", None):
            lib.cublasLtMatmulDescDestroy(self._desc)


class LtGemm(LtMatmul):
    """`LtMatmul` for ``out = a·b`` of row- or column-major views (``batches`` matrices with
    batch strides ``strides`` = (a's, b's, out's)), called with a's, b's and out's
    addresses."""

    def __init__(self, a: MatrixView, b: MatrixView, out: MatrixView, batches: int,
                 strides: tuple[int, int, int], rank: int, device_id: int):
        g = gemm_geometry(a, b, out)
        s1, s2 = (strides[1], strides[0]) if g.swap else (strides[0], strides[1])
        super().__init__(g, batches, s1, s2, strides[2], rank, device_id, a.dtype)
        self.swap = g.swap

    def __call__(self, pa: int, pb: int, po: int, stream: int) -> None:
        """``out = a·b`` at these addresses, on ``stream`` (a cudaStream_t as an int)."""
        if self.swap:
            pa, pb = pb, pa
        super().__call__(pa, pb, po, stream)
