#!/usr/bin/env python3
"""dspk.dask against the single-process pipeline (issue 7): many small recordings through
`preprocess_many` and one long recording through `to_dask` + `apply` and through `run_split`
(spans of whole chunks, one per worker, each through `Pipeline.run`'s chunk loop), with 1 and
2 worker processes of a LocalCluster (CPU backend) or one GPU worker (GPU backend: dask-cuda's
LocalCUDACluster when installed, else one worker process), reported as × real time of all the
recordings and as the overhead against one process doing the same work.

Synthetic int16 recordings (correlated noise), high-pass 300 Hz + median reference + global
whitening; float32 output.

    python benchmarks/bench_dask.py [--backend cpu|gpu|auto] [--small] [--out DIR]
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dspk  # noqa: E402
from common import bench_main, finish, heading  # noqa: E402 (benchmarks/)

FS = 30000.0
OPTIONS = dict(highpass=300.0, reference="median", whiten="global")
REPEATS = 3


def make(path: Path, channels: int, seconds: float, seed: int) -> Path:
    import h5py  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    n = int(seconds * FS)
    mix = rng.standard_normal((channels, channels // 4 + 1)).astype(np.float32)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", shape=(n, channels), dtype=np.int16)
        d.attrs["fs"] = FS
        for s0 in range(0, n, int(FS)):
            s1 = min(n, s0 + int(FS))
            x = rng.standard_normal((s1 - s0, mix.shape[1]), dtype=np.float32) @ mix.T * 20
            x += 5 * rng.standard_normal((s1 - s0, channels), dtype=np.float32)
            d[s0:s1] = np.rint(x).astype(np.int16)
    return path


def _warm() -> None:
    import h5py  # noqa: F401,PLC0415
    import scipy.signal  # noqa: F401,PLC0415

    import dspk.pipeline  # noqa: F401,PLC0415


def _warm_job(paths: list, backend: str) -> None:
    """In each worker before the clock: one whole job (fit and run to a scratch file) of each
    kind of recording, so that the CUDA context, cuBLAS, the compiled kernels and the tuner's
    choices (read from the shared cache) are loaded, as they are in the single process after
    its tuning pass — once per worker process in real use."""
    _warm()
    with tempfile.TemporaryDirectory() as tmp:
        for i, path in enumerate(paths):
            dspk.preprocess(path, Path(tmp) / f"warm-{i}.h5", **OPTIONS, backend=backend,
                            progress=False)


def _timed(fn, *args, **kwargs) -> tuple:
    """fn's result and wall time, from a clean page cache state: the dirty pages of the
    previous runs' outputs written back first (``os.sync``), so that no run pays for the
    writeback of another's gigabytes."""
    os.sync()
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def _remove(paths) -> None:
    """Outputs deleted once checked: dirty pages dropped, the disk not filled."""
    for p in paths:
        if isinstance(p, (str, os.PathLike)):
            Path(p).unlink(missing_ok=True)


class _SpanLog(logging.Handler):
    """run_split's per-span timings (read, compute, write inside the worker) as notes."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        logger = logging.getLogger("dspk.dask")
        logger.setLevel(logging.INFO)
        logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("run_split"):
            self.lines.append(record.getMessage())


def _same_traces(a: Path, b: Path) -> bool:
    import h5py  # noqa: PLC0415

    with h5py.File(a) as f, h5py.File(b) as g:
        return bool(np.array_equal(f["traces"][:], g["traces"][:]))


def client_for(backend: str, workers: int):
    from distributed import Client, LocalCluster  # noqa: PLC0415

    if backend == "gpu":
        try:
            from dask_cuda import LocalCUDACluster  # noqa: PLC0415

            return Client(LocalCUDACluster(n_workers=workers))
        except ImportError:
            pass
    return Client(LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=":0"))


def run(backend: str, small: bool) -> tuple[list, list]:
    from dspk.dask import (  # noqa: PLC0415
        apply, fit, preprocess_many, run_split, to_dask, to_hdf5)

    gpu = dspk.resolve_backend(backend or "auto") == "gpu"
    be = "gpu" if gpu else "cpu"
    rows, notes = [], []
    n_small, small_ch, small_s = (4, 64, 5.0) if small else (8, 64, 10.0)
    big_ch, big_s = (384, 10.0) if small else (384, 30.0)
    if gpu and not small:
        # the GPU runs 10 s of 64 channels in ~60 ms: longer recordings, so that the
        # overhead measured is not the noise of sub-second runs
        n_small, small_s, big_s = 16, 30.0, 60.0
    worker_counts = (1,) if gpu else (1, 2)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths = [make(work / f"s{i}.h5", small_ch, small_s, i) for i in range(n_small)]
        big = make(work / "big.h5", big_ch, big_s, 99)
        total_small = n_small * small_s
        # the tuner's decisions once, outside every timing (they land in the shared cache)
        for p in (paths[0], big):
            dspk.Pipeline.from_options(**OPTIONS, backend=be).tune(dspk.open_recording(p))
        _warm_job([str(paths[0]), str(big)], be)   # the same warm-up as each worker's
        rec = dspk.open_recording(big)
        pipe = dspk.Pipeline.from_options(**OPTIONS, backend=be).fit(rec)
        many_case = f"{n_small} recordings, {small_ch} ch x {small_s:g} s"
        big_case = f"1 recording, {big_ch} ch x {big_s:g} s"

        def single_many_job(tag: str) -> list:
            outs = [work / f"single{tag}-{i}.h5" for i in range(n_small)]
            for p, o in zip(paths, outs):
                dspk.preprocess(str(p), o, **OPTIONS, backend=be, progress=False)
            return outs

        singles, single_many = _timed(single_many_job, "")
        rows.append(dict(case=many_case, what="single process, one after another",
                         workers="-", wall_s=single_many, xrt=total_small / single_many))
        # the long recording's runs are write-bound (GB of output through the page cache) and
        # vary from run to run: the median of REPEATS, every time in the notes
        times, ref_big = [], None
        for _ in range(REPEATS):
            _remove([ref_big])
            ref_big, dt = _timed(pipe.run, rec, work / "single-big.h5", progress=False)
            times.append(dt)
        single_big = float(np.median(times))
        notes.append(f"single process, {big_case}: " + ", ".join(f"{t:.3f}" for t in times)
                     + " s")
        rows.append(dict(case=big_case, what=f"single process (Pipeline.run to HDF5), median "
                         f"of {REPEATS}", workers="-", wall_s=single_big,
                         xrt=big_s / single_big))
        spans_log = _SpanLog()
        for workers in worker_counts:
            with client_for(be, workers) as client:
                # workers up, dspk, its imports, the GPU context and kernels loaded before the
                # clock (once per worker process in real use); the choices are already in the
                # tuner's cache
                client.run(_warm_job, [str(paths[0]), str(big)], be)
                res, dt = _timed(preprocess_many, [str(p) for p in paths],
                                 work / f"many-{workers}", client=client, tune=False,
                                 **OPTIONS, backend=be)
                same = all(not isinstance(res[str(p)], Exception)
                           and _same_traces(Path(res[str(p)]), o)
                           for p, o in zip(paths, singles))
                rows.append(dict(case=many_case, what="dspk.dask.preprocess_many"
                                 + ("" if same else " OUTPUT DIFFERS"), workers=workers,
                                 wall_s=dt, xrt=total_small / dt, vs_single=dt / single_many))
                _remove(res.values())

                def fit_apply() -> Path:
                    p2 = fit(dspk.Pipeline.from_options(**OPTIONS, backend=be), rec,
                             client=client)
                    return to_hdf5(apply(p2, to_dask(rec)), work / f"big-{workers}.h5",
                                   client=client)

                out, dt = _timed(fit_apply)
                rows.append(dict(case=big_case, what="dspk.dask fit + apply + to_hdf5 (blocks "
                                 "written by the workers)", workers=workers, wall_s=dt,
                                 xrt=big_s / dt, vs_single=dt / single_big))
                _remove([out])
                # the same fitted pipeline as the single-process row: run against run
                times, same = [], True
                for _ in range(REPEATS):
                    out, dt = _timed(run_split, pipe, str(big), work / f"split-{workers}.h5",
                                     client=client)
                    same = same and _same_traces(out, ref_big)
                    times.append(dt)
                    _remove([out])
                dt = float(np.median(times))
                notes.append(f"run_split, {workers} worker(s): "
                             + ", ".join(f"{t:.3f}" for t in times) + " s")
                rows.append(dict(case=big_case, what=f"dspk.dask.run_split ({workers} span(s) "
                                 f"of whole chunks), median of {REPEATS}"
                                 f"{'' if same else ' OUTPUT DIFFERS'}",
                                 workers=workers, wall_s=dt, xrt=big_s / dt,
                                 vs_single=dt / single_big))
        # the single process once more, after the cluster runs: the order's share of the gap
        _remove(singles + [ref_big])
        outs, dt = _timed(single_many_job, "-again")
        rows.append(dict(case=many_case, what="single process again, after the dask rows",
                         workers="-", wall_s=dt, xrt=total_small / dt))
        _remove(outs)
        out, dt = _timed(pipe.run, rec, work / "single-big-again.h5", progress=False)
        rows.append(dict(case=big_case, what="single process again, after the dask rows",
                         workers="-", wall_s=dt, xrt=big_s / dt))
        notes.extend(spans_log.lines)
        notes.append(f"backend {be}; {'LocalCUDACluster' if gpu else 'LocalCluster'} worker "
                     f"processes, 1 thread each; the single-process rows ran first in this "
                     f"process (and again at the end); every run after one tuning pass per "
                     f"kind of recording and os.sync(); outputs compared with the single "
                     f"process's, then deleted")
    return rows, notes


def markdown(rows: list, notes: list, backend: str, env: dict) -> str:
    lines = heading("bench_dask", backend, env,
                    ["case", "what", "workers", "wall s", "× real time",
                     "vs single process (time)"])
    for r in rows:
        vs = f"{r['vs_single']:.2f}" if "vs_single" in r else "-"
        lines.append(f"| {r['case']} | {r['what']} | {r['workers']} | {r['wall_s']:.2f} | "
                     f"{r['xrt']:.1f} | {vs} |")
    return finish(lines, notes)


if __name__ == "__main__":
    bench_main("bench_dask", __doc__, run, markdown)
