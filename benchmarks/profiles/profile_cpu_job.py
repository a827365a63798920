#!/usr/bin/env python3
"""Where the time of a CPU job goes: `Pipeline.run` file to file (high-pass + median reference
+ local whitening, float32 out, its fit included) in this process, with the job's pieces
wrapped and their time summed per piece. Pieces on the reader and writer threads overlap the
main thread's, so the sums exceed the job's wall time.

Run it twice with the same ``$DSPK_CACHE_DIR``: the first run tunes (the tuner's share is a
row), the second is the next job on the machine. The input is an HDF5 recording such as
`bench_pipeline.py` makes (384 int16 channels, [samples, channels]); the second part times the
host-side data movement of one 1-s chunk against alternatives (bits compared with the current
code): the read (h5py, int16 transpose, µV scaling) and the output (the [samples, channels]
float32 or int16 block the writer stores), including OpenBLAS's ``cblas_somatcopy``
(transpose and scale in one pass) where NumPy's OpenBLAS exports it.

    PYTHONPATH=$PWD python benchmarks/profiles/profile_cpu_job.py IN.h5 OUT.h5 [--no-job] [--no-io]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

T0 = time.perf_counter()
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
import dspk  # noqa: E402

IMPORT_S = time.perf_counter() - T0


def job(src: str, out: str) -> None:
    spent: dict = defaultdict(float)
    calls: dict = defaultdict(int)
    lock = threading.Lock()

    def wrap(obj, name, label):
        f = getattr(obj, name)

        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                with lock:
                    spent[label] += time.perf_counter() - t
                    calls[label] += 1
        setattr(obj, name, g)

    mod = importlib.import_module
    steps, stream, jobm, output = (mod(f"dspk.pipeline.{n}") for n in
                                   ("steps", "stream", "job", "output"))
    prepared, pipeline = mod("dspk.pipeline.prepared"), mod("dspk.pipeline.pipeline")
    cov = mod("dspk.ops.covariance")
    from dspk.linalg.tuner import Tuner

    wrap(steps.HighPass, "apply", "step HighPass.apply (fir_filter)")
    wrap(steps.HighPass, "taps", "HighPass.taps (highpass_taps; imports scipy.signal first)")
    wrap(steps.Reference, "apply", "step Reference.apply (common_reference median)")
    wrap(steps.Whiten, "apply", "step Whiten.apply (SpatialFilter, local W)")
    wrap(steps.Whiten, "from_covariance", "Whiten.from_covariance (whitening_matrix)")
    wrap(cov.CovarianceAccumulator, "add", "CovarianceAccumulator.add (fit)")
    wrap(stream, "read_block", "read_block, run (h5py + transpose + to_uv; reader threads)")
    wrap(prepared, "read_block", "read_block, fit (reader threads)")
    wrap(jobm, "output_block", "output_block (contiguous float32 copy)")
    wrap(output, "write_traces", "write_traces (transpose + h5py write; writer thread)")
    wrap(jobm.Job, "_loop", "the job's chunk loop")
    wrap(pipeline, "fitted_states", "the fit (fitted_states)")
    wrap(Tuner, "_tune", "the tuner (timing candidates)")
    wrap(Tuner, "_choose_now", "the tuner (timing candidates)")
    t = time.perf_counter()
    p = dspk.Pipeline.from_options(highpass=300, reference="median", whiten="local",
                                   backend="cpu")
    p.run(src, out, output_dtype=np.float32, overwrite=True, progress=False)
    total = time.perf_counter() - t
    print(f"interpreter start to `import dspk` done: {IMPORT_S:.2f} s; Pipeline.run "
          f"{total:.2f} s\n\n| seconds | calls | piece |\n|---|---|---|")
    for k in sorted(spent, key=spent.get, reverse=True):
        print(f"| {spent[k]:.3f} | {calls[k]} | {k} |")
    print("\nlast_run:", {k: round(v, 3) for k, v in p.last_run.items() if k.endswith("_s")})


def median_ms(fn, n: int = 9) -> float:
    fn()
    got = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        got.append((time.perf_counter() - t) * 1e3)
    return statistics.median(got)


def somatcopy():
    """OpenBLAS's cblas_somatcopy (B = alpha·Aᵀ, float32) from NumPy's OpenBLAS, or None."""
    from threadpoolctl import ThreadpoolController

    for ctl in ThreadpoolController().select(user_api="blas").lib_controllers:
        get = getattr(ctl, "_get_symbol", None)
        fn = get("cblas_somatcopy") if get else None
        if fn is not None:
            it = ctypes.c_int64 if "64" in (getattr(ctl, "_symbol_suffix", "") or "") \
                else ctypes.c_int32
            fn.restype = None
            fn.argtypes = [ctypes.c_int, ctypes.c_int, it, it, ctypes.c_float, ctypes.c_void_p,
                           it, ctypes.c_void_p, it]
            return fn
    return None


def io(src: str) -> None:
    from dspk.backend import blocked_transpose
    from dspk.pipeline.stream import output_block

    rec = dspk.open_recording(src)
    m = 131
    a, b = 60000 - m, 90000 + m
    raw = rec.read_native(a, b)                        # [samples, channels] int16
    ref = rec.read(a, b)
    gain = rec.gain_to_uv
    g32 = np.float32(gain[0])
    rows = [("read: rec.read as now (h5py, int16 blocked transpose, to_uv)",
             median_ms(lambda: rec.read(a, b)), "-"),
            ("read: h5py alone (read_native)", median_ms(lambda: rec.read_native(a, b)), "-"),
            ("read: blocked_transpose of the int16 block",
             median_ms(lambda: blocked_transpose(raw)), "-")]
    t16 = blocked_transpose(raw)
    rows.append(("read: to_uv of the transposed block (astype + *= gain)",
                 median_ms(lambda: dspk.io.to_uv(t16, rec.gain_to_uv, rec.offset_to_uv)), "-"))
    fn = somatcopy()
    full = np.random.default_rng(0).standard_normal((raw.shape[1], b - a)).astype(np.float32)
    y = full[:, m:m + 30000]
    if fn is not None and bool(np.all(gain == gain[0])) and not np.any(rec.offset_to_uv):
        def read_blas():
            f = raw.astype(np.float32)
            o = np.empty((raw.shape[1], raw.shape[0]), np.float32)
            fn(101, 112, raw.shape[0], raw.shape[1], g32, f.ctypes.data, raw.shape[1],
               o.ctypes.data, raw.shape[0])
            return o
        rows.append(("read: astype float32 on [samples, channels], then somatcopy (transpose "
                     "× gain)", median_ms(read_blas),
                     "same" if np.array_equal(read_blas(), ref) else "DIFFER"))

        def out_blas():
            o = np.empty((y.shape[1], y.shape[0]), np.float32)
            fn(101, 112, y.shape[0], y.shape[1], 1.0, y.ctypes.data, full.shape[1],
               o.ctypes.data, y.shape[0])
            return o
        want = blocked_transpose(output_block(0, y, None, np.float32, 0.01))
        rows.append(("float32 out: output_block + blocked_transpose as now",
                     median_ms(lambda: blocked_transpose(output_block(0, y, None, np.float32,
                                                                      0.01))), "-"))
        rows.append(("float32 out: somatcopy straight from the chunk's view",
                     median_ms(out_blas), "same" if np.array_equal(out_blas(), want) else
                     "DIFFER"))
    else:
        rows.append(("somatcopy rows", float("nan"), "cblas_somatcopy not found (or "
                     "per-channel gains)"))
    print("\n| one 1-s chunk (384 x 30 262) | ms | bits vs now |\n|---|---|---|")
    for name, ms, bits in rows:
        print(f"| {name} | {ms:.1f} | {bits} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--no-job", action="store_true")
    ap.add_argument("--no-io", action="store_true")
    args = ap.parse_args()
    if not args.no_job:
        job(args.src, args.out)
    if not args.no_io:
        io(args.src)


if __name__ == "__main__":
    main()
