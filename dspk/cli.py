"""The ``dspk`` command.

    dspk info              backend, devices and the tuner cache
    dspk info IN           what a recording file holds (series, shape, rate, gains, geometry)
    dspk preprocess IN OUT [--highpass HZ | --bandpass LO HI] [--reference median|mean|none]
                   [--whiten global|local|none] [--detect] [--chunk SECONDS]
                   [--backend auto|cpu|gpu] [--resume] [--overwrite]
    dspk tune IN [pipeline options]   pre-tune the products and kernels a recording will need
    dspk tune-cache show   the tuned choices stored on disk
    dspk tune-cache clear  forget them (re-tuned on next use)
"""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__
from .backend import gpu_unavailable_reason, resolve_backend


def _info(args: argparse.Namespace) -> int:
    if args.input is not None:
        return _info_file(args)
    from .linalg.tuner import cache_path, tune_mode  # noqa: PLC0415

    print(f"dspk {__version__}")
    print(f"backend: {resolve_backend(args.backend)}")
    reason = gpu_unavailable_reason()
    if reason is None:
        from .backend import cupy_module, device_name  # noqa: PLC0415

        cp = cupy_module()
        for i in range(cp.cuda.runtime.getDeviceCount()):
            print(f"gpu {i}: {device_name(i)}")
        print(f"cupy {cp.__version__}, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}")
    else:
        print(f"gpu: none ({reason})")
    print(f"tuner: DSPK_TUNE={tune_mode()}, cache {cache_path()}")
    return 0


def _info_file(args: argparse.Namespace) -> int:
    import numpy as np  # noqa: PLC0415

    from .io import open_recording  # noqa: PLC0415

    path = args.input
    series = []
    try:
        from .io.hdf5 import _h5py, _datasets, electrical_series  # noqa: PLC0415

        if _h5py().is_hdf5(path):
            with _h5py().File(path, "r") as f:
                series = electrical_series(f)
                others = [d for d in _datasets(f) if not any(d.startswith(s + "/")
                                                             for s in series)]
            print(f"{path}: HDF5")
            for name in series:
                print(f"  ElectricalSeries {name}")
            for name in others:
                print(f"  dataset {name}")
    except OSError:
        pass
    names = series if (series and args.dataset is None) else [args.dataset]
    for name in names:
        rec = open_recording(path, dataset=name, fs=args.fs, n_channels=args.n_channels)
        print(f"{rec.source}")
        print(f"  {rec.n_channels} channels x {rec.n_samples} samples {rec.dtype}, "
              f"{rec.fs:g} Hz, {rec.duration_s:.3f} s")
        g, o = rec.gain_to_uv, rec.offset_to_uv
        same = np.all(g == g[0]) and np.all(o == o[0])
        print(f"  µV = raw x {g[0]:g} + {o[0]:g}" if same else
              f"  µV = raw x gain + offset, per channel: gain {g.min():g}..{g.max():g}, "
              f"offset {o.min():g}..{o.max():g}")
        if rec.geometry is None:
            print("  geometry: none")
        else:
            lo, hi = rec.geometry.min(axis=0), rec.geometry.max(axis=0)
            print(f"  geometry: x {lo[0]:g}..{hi[0]:g} µm, y {lo[1]:g}..{hi[1]:g} µm")
        if hasattr(rec, "close"):
            rec.close()
    return 0


def _preprocess(args: argparse.Namespace) -> int:
    import logging  # noqa: PLC0415
    import time  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from .io import open_recording  # noqa: PLC0415
    from .pipeline import Pipeline  # noqa: PLC0415

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    rec = open_recording(args.input, dataset=args.dataset, fs=args.fs,
                         n_channels=args.n_channels)
    pipe = Pipeline.from_options(
        highpass=None if not args.highpass else args.highpass,
        bandpass=tuple(args.bandpass) if args.bandpass else None,
        reference=args.reference, whiten=args.whiten, n_neighbors=args.neighbors,
        backend=args.backend or "auto", detect=args.detect, detect_threshold=args.threshold)
    print(f"{rec.source}: {rec.n_channels} channels x {rec.n_samples} samples, "
          f"{rec.fs:g} Hz ({rec.duration_s:.2f} s)")
    print("steps: " + " -> ".join(f"{o['step']}" for o in pipe.options()))
    t0 = time.perf_counter()
    out = pipe.run(rec, args.output, chunk_s=args.chunk,
                   output_dtype=np.int16 if args.int16 else np.float32,
                   overwrite=args.overwrite, resume=args.resume,
                   compression=None if args.compression == "none" else args.compression,
                   layout="channels_samples" if args.channels_first else "samples_channels",
                   progress=not args.quiet)
    dt = time.perf_counter() - t0
    print(f"{out}: written in {dt:.2f} s ({rec.duration_s / dt:.1f} x real time, "
          f"{'gpu' if pipe._xp().__name__ == 'cupy' else 'cpu'} backend)")
    return 0


def _preprocess_many(args: argparse.Namespace) -> int:
    import numpy as np  # noqa: PLC0415

    from .dask import close_client, cluster_client, preprocess_many  # noqa: PLC0415

    backend = args.backend or "auto"
    client = cluster_client(args.scheduler, args.workers, gpu=backend == "gpu")
    options = dict(highpass=None if not args.highpass else args.highpass,
                   bandpass=tuple(args.bandpass) if args.bandpass else None,
                   reference=args.reference, whiten=args.whiten, n_neighbors=args.neighbors,
                   backend=backend, chunk_s=args.chunk,
                   output_dtype=np.int16 if args.int16 else np.float32,
                   overwrite=args.overwrite)
    for key in ("dataset", "fs", "n_channels"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    try:
        results = preprocess_many(args.pattern, args.outdir, client=client, **options)
    finally:
        close_client(client)
    failed = 0
    for path, res in results.items():
        if isinstance(res, Exception):
            failed += 1
            print(f"{path}: FAILED: {type(res).__name__}: {res}")
        else:
            print(f"{path} -> {res}")
    print(f"{len(results) - failed} of {len(results)} recordings preprocessed")
    return 1 if failed else 0


def _tune(args: argparse.Namespace) -> int:
    """Fit the pipeline and push one chunk through it: every tuner decision the job will need
    (products, FIR and reference implementations) is taken now and stored in the cache."""
    import time  # noqa: PLC0415

    from .io import open_recording  # noqa: PLC0415
    from .linalg.tuner import cache_path  # noqa: PLC0415
    from .pipeline import Pipeline  # noqa: PLC0415

    rec = open_recording(args.input, dataset=args.dataset, fs=args.fs,
                         n_channels=args.n_channels)
    pipe = Pipeline.from_options(highpass=args.highpass or None,
                                 bandpass=tuple(args.bandpass) if args.bandpass else None,
                                 reference=args.reference, whiten=args.whiten,
                                 n_neighbors=args.neighbors, backend=args.backend or "auto")
    t0 = time.perf_counter()
    pipe.tune(rec, args.chunk)
    chunk = min(rec.n_samples, max(1, int(round(args.chunk * rec.fs))))
    print(f"tuned for {rec.n_channels} channels, chunks of {chunk} samples in "
          f"{time.perf_counter() - t0:.2f} s; choices in {cache_path()}")
    return 0


def _pipeline_options(p: argparse.ArgumentParser) -> None:
    band = p.add_mutually_exclusive_group()
    band.add_argument("--highpass", type=float, default=300.0, metavar="HZ",
                      help="FIR high-pass cutoff (default 300 Hz; 0: none)")
    band.add_argument("--bandpass", type=float, nargs=2, metavar=("LO", "HI"))
    p.add_argument("--reference", default="median", choices=("median", "mean", "none"))
    p.add_argument("--whiten", default="local", choices=("global", "local", "none"))
    p.add_argument("--neighbors", type=int, default=32,
                   help="channels per neighbourhood for local whitening (default 32)")
    p.add_argument("--chunk", type=float, default=1.0, metavar="SECONDS")
    p.add_argument("--dataset", default=None, help="dataset or ElectricalSeries path")
    p.add_argument("--fs", type=float, default=None, help="sampling rate (Hz)")
    p.add_argument("--n-channels", type=int, default=None, help="for flat binaries")
    p.add_argument("--backend", default=None, help="auto, cpu or gpu ($DSPK_BACKEND)")


def _cache(args: argparse.Namespace) -> int:
    from .linalg.tuner import _read_cache, cache_path  # noqa: PLC0415

    path = cache_path()
    if args.action == "clear":
        if path.exists():
            path.unlink()
            print(f"removed {path}")
        else:
            print(f"no cache at {path}")
        return 0
    entries = _read_cache(path)
    if not entries:
        print(f"no tuned choices in {path}")
        return 0
    for key, entry in sorted(entries.items()):
        times = entry.get("timings_ms", {})
        best = entry["ranking"][0] if entry["ranking"] else "?"
        print(f"{key}\n    -> {best} ({times.get(best, float('nan')):.4g} ms); "
              f"ranking {json.dumps(entry['ranking'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dspk", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dspk {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="backend, devices and tuner cache; or what a "
                                         "recording file holds")
    p_info.add_argument("input", nargs="?", default=None, help="a recording file")
    p_info.add_argument("--dataset", default=None, help="dataset or ElectricalSeries path")
    p_info.add_argument("--fs", type=float, default=None, help="sampling rate (Hz)")
    p_info.add_argument("--n-channels", type=int, default=None, help="for flat binaries")
    p_info.add_argument("--backend", default=None, help="auto, cpu or gpu ($DSPK_BACKEND)")
    p_info.set_defaults(func=_info)
    p_pre = sub.add_parser("preprocess", help="filter, reference and whiten a recording into "
                                              "an HDF5 file")
    p_pre.add_argument("input", help="HDF5/NWB file or flat binary")
    p_pre.add_argument("output", help="output HDF5 file (traces [samples, channels])")
    _pipeline_options(p_pre)
    p_pre.add_argument("--int16", action="store_true", help="scaled int16 output")
    p_pre.add_argument("--detect", action="store_true",
                       help="also detect spikes (written to /spikes of the output)")
    p_pre.add_argument("--threshold", type=float, default=7.0,
                       help="detection threshold in noise SDs (default 7)")
    p_pre.add_argument("--compression", default="none", choices=("none", "gzip", "lzf"),
                       help="HDF5 compression of the output")
    p_pre.add_argument("--channels-first", action="store_true",
                       help="write traces as [channels, samples] (default [samples, channels])")
    p_pre.add_argument("--resume", action="store_true", help="continue a killed job")
    p_pre.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p_pre.add_argument("--quiet", action="store_true", help="no progress bar")
    p_pre.set_defaults(func=_preprocess)
    p_many = sub.add_parser("preprocess-many", help="preprocess many recordings on a Dask "
                                                    "cluster (needs dspk[dask])")
    p_many.add_argument("pattern", help="a glob of recording files (quote it)")
    p_many.add_argument("outdir", help="outputs OUTDIR/<recording name>.h5")
    where = p_many.add_mutually_exclusive_group()
    where.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="a running dask.distributed scheduler")
    where.add_argument("--workers", type=int, default=None,
                       help="local worker processes (default: one per core; with "
                            "--backend gpu and dask-cuda, one per GPU)")
    _pipeline_options(p_many)
    p_many.add_argument("--int16", action="store_true", help="scaled int16 output")
    p_many.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    p_many.set_defaults(func=_preprocess_many)
    p_tune = sub.add_parser("tune", help="pre-tune what preprocessing a recording needs")
    p_tune.add_argument("input", help="HDF5/NWB file or flat binary")
    _pipeline_options(p_tune)
    p_tune.set_defaults(func=_tune)
    p_cache = sub.add_parser("tune-cache", help="show or clear the tuner's stored choices")
    p_cache.add_argument("action", choices=("show", "clear"))
    p_cache.set_defaults(func=_cache)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:  # a clear one-line error for the command line
        print(f"dspk: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
