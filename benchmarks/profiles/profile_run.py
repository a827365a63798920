#!/usr/bin/env python3
"""Where a job's chunk goes: each stage of a fitted pipeline's run timed alone on one chunk
(``--chain ibl``: IBL's order with local whitening on `bench_ibl_chain.make_recording`'s
384-channel int16 HDF5 recording, float32 output; ``--chain motion``: ``--motion nonrigid``
on `bench_motion.write_drifting_np1`'s drifting one, int16 output; 1-s chunks with their
halos): the raw block's move to the device and its
scaling, every step's ``apply_at``, and the output block's transpose, cast and copy back to
pinned memory; each the median of ``--repeats`` calls, synchronised (on the GPU the device
is idle before each call, so each figure is the stage alone, launch overheads included).
The sum, x the job's chunks, is the compute a job's loop cannot go below without a faster
stage; the job's own loop time (`Job.timing`) is printed beside it.

    python benchmarks/profiles/profile_run.py [--backend cpu|gpu] [--chain ibl|motion]
                                              [--seconds 60] [--repeats 20] [--int16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import dspk  # noqa: E402
from bench_ibl_chain import make_recording  # noqa: E402 (benchmarks/)
from dspk.pipeline.registry import preset  # noqa: E402
from dspk.pipeline.stage import Context  # noqa: E402
from dspk.pipeline.stream import Staging, ahead, read_block  # noqa: E402


def timer(xp):
    if xp is np:
        return lambda: None
    return xp.cuda.Device().synchronize


def median_time(fn, sync, repeats: int) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--chain", choices=("ibl", "motion"), default="ibl")
    ap.add_argument("--int16", action="store_true", help="int16 output blocks (always for "
                    "--chain motion)")
    args = ap.parse_args(argv)
    if args.chain == "motion":
        args.int16 = True
    out_dtype = np.int16 if args.int16 else np.float32
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.h5"
        if args.chain == "ibl":
            make_recording(src, args.seconds)
            opts = dict(preset("ibl"), whiten="local", backend=args.backend)
        else:
            from bench_motion import write_drifting_np1

            write_drifting_np1(src, args.seconds)
            opts = dict(motion="nonrigid", backend=args.backend)
        rec = dspk.open_recording(src)
        pipe = dspk.Pipeline.from_options(**opts)
        pipe.fit(rec)
        xp = pipe.xp
        sync = timer(xp)
        fs = rec.fs
        chunk = int(round(fs))
        m = pipe.margin(fs)
        ctx = Context.of(rec, xp, pipe.dtype)
        run = pipe.prepare(ctx)
        s0 = chunk * 2                                  # an inner chunk: halos on both sides
        s1 = s0 + chunk
        rows = []
        if xp is np:
            raw = read_block(rec, s0, s1, m)
            rows.append(("read (h5py, scaled)", median_time(
                lambda: read_block(rec, s0, s1, m), sync, args.repeats)))
            x0 = raw[1]
        else:
            staging = Staging(rec, chunk + 2 * m, ahead(rec) + 2, (chunk, rec.n_channels),
                              out_dtype, "samples_channels")
            got = staging.read(0, s0, s1, m)
            rows.append(("read into pinned (raw int16)", median_time(
                lambda: staging.read(0, s0, s1, m), sync, args.repeats)))
            rows.append(("to device + scale (to_uv)", median_time(
                lambda: staging.to_device(got, xp), sync, args.repeats)))
            x0 = staging.to_device(got, xp)[1]
        x0 = xp.asarray(x0).astype(pipe.dtype, copy=True)
        x = x0.copy()
        for step, prepared in run.steps:
            inp = x.copy()

            def once(step=step, prepared=prepared, inp=inp):
                return step.apply_at(inp.copy(), ctx, prepared, s0 - m)

            copy_t = median_time(lambda inp=inp: inp.copy(), sync, args.repeats)
            t = median_time(once, sync, args.repeats) - copy_t
            rows.append((f"{type(step).__name__}: {step.describe()}", t))
            x = step.apply_at(x, ctx, prepared, s0 - m)
        y = x[:, m:m + chunk]
        if xp is np:
            from dspk.pipeline.stream import output_block
            rows.append(("output block (host transpose/cast)", median_time(
                lambda: output_block(0, y, None, out_dtype, 1.0), sync, args.repeats)))
        else:
            rows.append(("output block (transpose, cast, to pinned)", median_time(
                lambda: staging.to_host(0, y, 1.0), sync, args.repeats)))
        n_chunks = int(np.ceil(rec.n_samples / chunk))
        total = sum(t for _, t in rows)
        print(f"# profile_run — {args.chain}, {args.backend}, {rec.n_channels} ch, chunk "
              f"{chunk} + 2 x {m} halo, {n_chunks} chunks, output {np.dtype(out_dtype).name}")
        print(f"{'stage':58s} {'ms/chunk':>9s} {'s/job':>7s}")
        for name, t in rows:
            print(f"{name:58s} {1e3 * t:9.2f} {t * n_chunks:7.3f}")
        print(f"{'sum':58s} {1e3 * total:9.2f} {total * n_chunks:7.3f}")
        out = Path(tmp) / "o.h5"
        kind = "int16" if args.int16 else "float32"
        for _ in range(2):              # the second job: the output's first touch is out
            pipe.run(rec, str(out), output_dtype=kind, overwrite=True, progress=False)
        t = pipe.last_run
        print("the job's run (warm): " + ", ".join(
            f"{k} {v:.3f}" for k, v in t.items() if isinstance(v, float)))
        rec.close()


if __name__ == "__main__":
    main()
