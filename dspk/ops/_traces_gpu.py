"""GPU kernels of the ops on [channels, samples] traces (dspk/kernels/traces.cu): the direct
FIR / filter-bank kernel and the per-sample median reference. CuPy arrays only; callers check
availability first (``*_reason`` returns why a kernel cannot take the inputs, or None)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import device_properties
from ..kernels import FLOAT_DTYPES, LAUNCH, ctype, declare_instances, kernel

FIR_R, FIR_THREADS = LAUNCH["FIR_R"], LAUNCH["FIR_THREADS"]
FIR_TILE = FIR_R * FIR_THREADS
CAR_S, CAR_THREADS = LAUNCH["CAR_S"], 32 * LAUNCH["CAR_WARPS"]
_KEY = {np.dtype(np.float32): "unsigned int", np.dtype(np.float64): "unsigned long long"}
_VPL = (1, 2, 4, 8, 12, 16, 24, 32)   # values per lane compiled for the median kernel


def _fir_expression(dtype: Any) -> str:
    return f"fir_direct<{ctype(dtype)}>"


def _fir_rows_expression(dtype: Any) -> str:
    return f"fir_rows<{ctype(dtype)}>"


def _car_expression(dtype: Any, vpl: int) -> str:
    return f"car_median<{ctype(dtype)}, {_KEY[np.dtype(dtype)]}, {vpl}>"


def _cc(props: dict) -> tuple[int, int]:
    return int(props.get("major", 0)), int(props.get("minor", 0))


#: car_median's warp reductions (__reduce_add_sync) need this compute capability
CAR_MIN_CC = (8, 0)


def _instances(props: dict) -> list[str]:
    """fir_direct and fir_rows for both dtypes; car_median for every values-per-lane, where it
    compiles."""
    car = _cc(props) >= CAR_MIN_CC
    return [*(_fir_expression(dt) for dt in FLOAT_DTYPES),
            *(_fir_rows_expression(dt) for dt in FLOAT_DTYPES),
            *(_car_expression(dt, v) for dt in FLOAT_DTYPES for v in _VPL if car)]


declare_instances("traces.cu", _instances)


def _optin(device_id: int) -> int:
    return int(device_properties(device_id).get("sharedMemPerBlockOptin", 48 * 1024))


def _fir_smem(nf: int, taps: int, itemsize: int) -> int:
    tpad = -(-taps // FIR_R) * FIR_R
    span = FIR_TILE + tpad + FIR_R
    return (nf * tpad + span + span // 32 + 1) * itemsize


def fir_reason(x: Any, nf: int, taps: int) -> str | None:
    """Why the direct FIR kernel cannot run (None if it can)."""
    if x.dtype not in FLOAT_DTYPES:
        return f"dtype {x.dtype}"
    if x.shape[0] > 65535:
        return "more than 65535 channels (grid y)"
    if _fir_smem(nf, taps, x.itemsize) > _optin(x.device.id):
        return "taps and input tile exceed the shared memory of a block"
    return None


def fir_direct(x: Any, weights: Any, center: int) -> Any:
    """out[c, i, t] = Σ_j weights[i, j]·x[c, t + j − center] (zero outside), [C, nf, n]."""
    import cupy as cp  # noqa: PLC0415 (GPU-only module)

    xc = x if x.strides[1] == x.itemsize else cp.ascontiguousarray(x)
    w = cp.ascontiguousarray(cp.asarray(weights, dtype=x.dtype))
    nf, taps = w.shape
    C, n = xc.shape
    tpad = -(-taps // FIR_R) * FIR_R
    out = cp.empty((C, nf, n), dtype=x.dtype)
    fn = kernel("traces.cu", _fir_expression(x.dtype))
    smem = _fir_smem(nf, taps, x.itemsize)
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    fn((-(-n // FIR_TILE), C), (FIR_THREADS,),
       (xc, np.int64(xc.strides[0] // xc.itemsize), np.int32(n), w, np.int32(nf),
        np.int32(taps), np.int32(tpad), np.int32(center), out, np.int64(nf * n), np.int64(n)),
       shared_mem=smem)
    return out


def fir_rows(x: Any, bank: Any, sel: Any, center: int) -> Any:
    """out[c, t] = Σ_j bank[sel[c], j]·x[c, t + j − center] (zero outside), [C, n]: each
    channel through its own filter of ``bank`` [filters, taps], in one launch (``fir_reason(x,
    1, taps)`` says whether it can run)."""
    import cupy as cp  # noqa: PLC0415 (GPU-only module)

    xc = x if x.strides[1] == x.itemsize else cp.ascontiguousarray(x)
    w = cp.ascontiguousarray(cp.asarray(bank, dtype=x.dtype))
    rows = cp.ascontiguousarray(cp.asarray(sel, dtype=np.int32))
    taps = w.shape[1]
    C, n = xc.shape
    if rows.shape != (C,):
        raise ValueError(f"sel: expected one filter index per channel ({C}), got shape "
                         f"{rows.shape}")
    tpad = -(-taps // FIR_R) * FIR_R
    out = cp.empty((C, n), dtype=x.dtype)
    fn = kernel("traces.cu", _fir_rows_expression(x.dtype))
    smem = _fir_smem(1, taps, x.itemsize)
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    fn((-(-n // FIR_TILE), C), (FIR_THREADS,),
       (xc, np.int64(xc.strides[0] // xc.itemsize), np.int32(n), w, rows, np.int32(taps),
        np.int32(tpad), np.int32(center), out, np.int64(n)),
       shared_mem=smem)
    return out


def _car_smem(c: int, itemsize: int) -> int:
    return c * (CAR_S + 1) * itemsize


def car_reason(x: Any) -> str | None:
    """Why the median-reference kernel cannot run (None if it can)."""
    if x.dtype not in FLOAT_DTYPES:
        return f"dtype {x.dtype}"
    props = device_properties(x.device.id)
    if _cc(props) < CAR_MIN_CC:
        return "warp reductions (__reduce_add_sync) need compute capability 8.0"
    if -(-x.shape[0] // 32) > _VPL[-1]:
        return f"more than {32 * _VPL[-1]} channels"
    if _car_smem(x.shape[0], x.itemsize) > _optin(x.device.id) - 1024:
        return "the [channels, 32] tile exceeds the shared memory of a block"
    return None


def car_median(x: Any) -> Any:
    """x minus its median across channels, per sample (numpy's median; exact)."""
    import cupy as cp  # noqa: PLC0415 (GPU-only module)

    xc = x if x.strides[1] == x.itemsize else cp.ascontiguousarray(x)
    C, n = xc.shape
    vpl = next(v for v in _VPL if 32 * v >= C)
    out = cp.empty((C, n), dtype=x.dtype)
    fn = kernel("traces.cu", _car_expression(x.dtype, vpl))
    smem = _car_smem(C, x.itemsize)
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    fn((-(-n // CAR_S),), (CAR_THREADS,),
       (xc, np.int64(xc.strides[0] // xc.itemsize), np.int32(C), np.int32(n), out,
        np.int64(n)), shared_mem=smem)
    return out
