#!/usr/bin/env python3
"""How fast IBL's compressed recordings (mtscomp's .cbin + .ch, with the SpikeGLX .meta) are
decoded, as × real time for 384 channels + sync at 30 kHz: a file of ``--seconds`` written by
mtscomp itself, read forward in 1-s blocks, by

- ``dspk CbinReader``: `dspk.io.cbin.CbinReader.read` of every stored channel, int16
  [channels, samples] (the decoder alone);
- ``dspk read_native``: the `SpikeGLXRecording` of the .cbin, its raw blocks as a GPU job
  reads them (int16 [384, samples], sync word left out);
- ``dspk read (µV)``: its float32 µV blocks as a CPU job reads them (the scaling included);
- ``mtscomp Reader[a:b]``: mtscomp's own slicing, one chunk at a time (how SpikeInterface's
  ``read_cbin_ibl`` and ibl-neuropixel's ``spikeglx.Reader`` read a .cbin);
- ``mtscomp decompress_chunks``: mtscomp's batch decompression on its thread pool of
  ``--threads`` (what ``mtsdecomp`` runs, without writing the file);
- ``ibl spikeglx.Reader``: ibl-neuropixel's reader of the .cbin, 1-s reads (volts);
- ``.bin read_native``: the uncompressed .bin of the same samples (page cache), for scale;
- the whole ``--preset ibl`` job (local whitening, float32 HDF5 out) on ``--backend``, on the
  .cbin and on the .bin alternately, one fitted pipeline for both (the same samples: the same
  fit), so that only the run's reading differs (issue 47: the .cbin job at the .bin job's
  speed).

Each is a pass over the whole file (the first one a warm-up), median of ``--repeats``. The
samples are a synthetic NP1.0 AP recording (band-limited noise of ~7 counts RMS, a common
signal and spikes): the compression ratio is in the table (IBL's files compress ~3x).

    python benchmarks/bench_cbin.py [--seconds 20] [--threads N] [--repeats 3]
                                    [--backend cpu] [--out DIR|FILE.md] [--small]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, out_files  # noqa: E402 (benchmarks/)

FS = 30000
N_CHANNELS = 385            # 384 AP channels and the SY word


def synthetic(seconds: float, seed: int = 0) -> np.ndarray:
    """[samples, 385] int16: per-channel band-limited noise (~7 counts RMS), a common signal
    of ~3 counts, spikes of 30-150 counts on a few channels, the sync word toggling."""
    from scipy.signal import butter, sosfilt

    rng = np.random.default_rng(seed)
    n = int(seconds * FS)
    sos = butter(2, [300, 6000], btype="bandpass", fs=FS, output="sos")
    out = np.empty((n, N_CHANNELS), np.int16)
    step = FS
    for a in range(0, n, step):
        b = min(n, a + step)
        x = sosfilt(sos, rng.standard_normal((b - a, 384)) * 12.0, axis=0)
        x += sosfilt(sos, rng.standard_normal(b - a) * 5.0)[:, None]
        for _ in range(int(0.02 * (b - a))):          # ~600 spikes per second
            t, c = int(rng.integers(0, b - a - 40)), int(rng.integers(0, 380))
            amp = rng.uniform(30, 150)
            shape = -amp * np.exp(-0.5 * ((np.arange(40) - 10) / 3.0) ** 2)
            x[t:t + 40, c:c + 4] += shape[:, None] * np.array([1.0, 0.7, 0.4, 0.2])
        out[a:b, :384] = np.round(x)
        out[a:b, 384] = ((np.arange(a, b) // FS) % 2) * 64
    return out


def np1_meta(n_samples: int) -> str:
    """A minimal NP1.0 AP .meta (gain 500 everywhere, bank 0)."""
    meta = {"typeThis": "imec", "imSampRate": str(FS), "nSavedChans": str(N_CHANNELS),
            "snsApLfSy": "384,0,1", "acqApLfSy": "384,384,1", "snsSaveChanSubset": "all",
            "imAiRangeMax": "0.6", "imAiRangeMin": "-0.6", "imMaxInt": "512",
            "imDatPrb_type": "0", "imDatPrb_pn": "PRB_1_4_0480_1",
            "fileSizeBytes": str(n_samples * N_CHANNELS * 2),
            "fileTimeSecs": str(n_samples / FS),
            "~imroTbl": "(0,384)" + "".join(f"({c} 0 0 500 250 1)" for c in range(384)),
            "~snsShankMap": "(1,2,480)" + "".join(f"(0:{c % 2}:{c // 2}:1)"
                                                  for c in range(384))}
    return "".join(f"{k}={v}\n" for k, v in meta.items())


def make_files(folder: Path, seconds: float, threads: int) -> tuple[Path, Path, float]:
    """The .bin, and the .cbin mtscomp writes of it (dspk's writer of the format where
    mtscomp is not installed), with the .meta beside each; the compression ratio."""
    data = synthetic(seconds)
    plain, comp = folder / "bin", folder / "cbin"
    plain.mkdir()
    comp.mkdir()
    binpath = plain / "run_g0_t0.imec0.ap.bin"
    data.tofile(binpath)
    for d in (plain, comp):
        (d / "run_g0_t0.imec0.ap.meta").write_text(np1_meta(len(data)))
    cbin = comp / "run_g0_t0.imec0.ap.cbin"
    try:
        import mtscomp
    except ImportError:
        from dspk.io.cbin import write_cbin

        write_cbin(str(cbin), data, float(FS), chunk_samples=FS)
    else:
        mtscomp.compress(binpath, cbin, cbin.with_suffix(".ch"), sample_rate=float(FS),
                         n_channels=N_CHANNELS, dtype=np.int16, n_threads=threads,
                         check_after_compress=False, quiet=True)
    return binpath, cbin, os.path.getsize(cbin) / os.path.getsize(binpath)


def forward(read, n: int, step: int = FS) -> None:
    for a in range(0, n, step):
        read(a, min(n, a + step))


def job_rows(binpath: Path, cbin: Path, seconds: float, backend: str, repeats: int,
             out_dir: Path) -> tuple[list, list]:
    """The ``--preset ibl`` job's run on the .cbin and on the .bin, alternated."""
    import dspk
    from dspk.pipeline.registry import preset

    pipe = dspk.Pipeline.from_options(**dict(preset("ibl"), whiten="local", backend=backend))
    with dspk.open_recording(binpath) as rec:
        pipe.fit(rec)
    times: dict = {"bin": [], "cbin": []}
    splits: dict = {"bin": [], "cbin": []}
    for k in range(repeats + 1):                      # the first round a warm-up
        for name, path in (("cbin", cbin), ("bin", binpath)):
            out = out_dir / f"job-{name}.h5"
            out.unlink(missing_ok=True)
            with dspk.open_recording(path) as rec:
                t0 = time.perf_counter()
                pipe.run(rec, out, progress=False)
                wall = time.perf_counter() - t0
            out.unlink(missing_ok=True)
            if k:
                times[name].append(wall)
                splits[name].append(pipe.last_run)
    rows = []
    for name, path in (("bin", binpath), ("cbin", cbin)):
        t = statistics.median(times[name])
        last = splits[name][len(splits[name]) // 2]
        rows.append(dict(case=f"--preset ibl job ({backend}), 384 ch, float32 HDF5 out",
                         impl=f"dspk Pipeline.run on the .{name}",
                         what=f"read {last.get('read_s', 0):.2f} s (of it decompress "
                              f"{last.get('decompress_s', 0):.2f} s), compute "
                              f"{last.get('compute_s', 0):.2f} s, write "
                              f"{last.get('write_s', 0):.2f} s, overlapped",
                         seconds=round(t, 3), xrt=round(seconds / t, 2),
                         mb_s=round(seconds * FS * N_CHANNELS * 2 / t / 1e6, 1),
                         passes_s=[round(v, 3) for v in times[name]]))
    ratio = statistics.median(times["cbin"]) / statistics.median(times["bin"])
    return rows, [f"the --preset ibl job's run on the .cbin took {ratio:.2f}x its run on the "
                  f".bin (medians of {repeats} alternated rounds after a warm-up round; one "
                  f"fitted pipeline for both)"]


def run(seconds: float, threads: int, repeats: int, backend: str = "cpu",
        job: bool = True) -> tuple[list, list, dict]:
    import dspk
    from dspk.io.cbin import CbinReader

    try:
        import mtscomp
    except ImportError:
        mtscomp = None
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        binpath, cbin, ratio = make_files(Path(tmp), seconds, threads)
        ch = cbin.with_suffix(".ch")
        n = int(seconds * FS)
        # the check of what is timed: dspk's blocks are the .bin's samples (and mtscomp's)
        raw = np.memmap(binpath, np.int16, "r", shape=(n, N_CHANNELS))
        with CbinReader(cbin, threads=threads) as cr:
            a = n // 3
            same = bool(np.array_equal(cr.read(a, a + FS + 17), raw[a:a + FS + 17].T))
        if mtscomp is not None:
            r = mtscomp.Reader(check_after_decompress=False, quiet=True)
            r.open(cbin, ch)
            same &= bool(np.array_equal(r[a:a + FS + 17], raw[a:a + FS + 17]))
            r.close()
        del raw
        if not same:
            raise SystemExit("dspk's decode differs from the .bin (or mtscomp's)")

        cases = []

        def case(name, fn, what):
            cases.append((name, fn, what))

        # each pass opens the file anew: a reader keeps its last decoded chunks
        def dspk_reader():
            with CbinReader(cbin, threads=threads) as cr:
                forward(cr.read, n)

        def dspk_recording(scaled):
            with dspk.open_recording(cbin) as rec:
                forward(rec.read if scaled else rec.read_native, n)

        case("dspk CbinReader", dspk_reader, f"int16 [385, 30000] blocks, {threads} threads")
        case("dspk read_native", lambda: dspk_recording(False),
             "int16 [384, 30000] (SpikeGLXRecording of the .cbin)")
        case("dspk read (µV)", lambda: dspk_recording(True), "float32 µV [384, 30000]")

        def mts_slices():
            rd = mtscomp.Reader(check_after_decompress=False, quiet=True)
            rd.open(cbin, ch)
            forward(lambda a, b: rd[a:b], n)
            rd.close()

        if mtscomp is None:
            notes.append("mtscomp is not installed: its cases are missing, and the .cbin was "
                         "written by dspk.io.cbin.write_cbin (the same format)")
        else:
            case("mtscomp Reader[a:b]", mts_slices, "int16 [30000, 385], 1 thread")

        def mts_batch():
            rd = mtscomp.Reader(check_after_decompress=False, quiet=True, n_threads=threads)
            rd.open(cbin, ch)
            pool = rd.start_thread_pool()
            for b0 in range(0, rd.n_chunks, threads):
                rd.decompress_chunks(range(b0, min(rd.n_chunks, b0 + threads)), pool)
            rd.stop_thread_pool()
            rd.close()

        if mtscomp is not None:
            case("mtscomp decompress_chunks", mts_batch, f"int16 chunks, pool of {threads}")
        try:
            import spikeglx        # ibl-neuropixel

            def ibl():
                sr = spikeglx.Reader(cbin)
                forward(lambda a, b: sr.read(nsel=slice(a, b), sync=False), n)
                sr.close()

            case("ibl spikeglx.Reader", ibl, "float32 volts [30000, 384]")
        except ImportError:
            notes.append("ibl-neuropixel (spikeglx) is not installed: its case is missing")
        def plain():
            with dspk.open_recording(binpath) as rec:
                forward(rec.read_native, n)

        case(".bin read_native", plain, "int16 [30000, 384] memory map (page cache)")
        # every case once per round, the rounds repeated: a machine whose load changes
        # during the run (a shared one) weighs on every case alike
        times = {name: [] for name, _, _ in cases}
        for _, fn, _ in cases:
            fn()                               # warm-up (and the files into the page cache)
        for _ in range(repeats):
            for name, fn, _ in cases:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        for name, _, what in cases:
            t = statistics.median(times[name])
            rows.append(dict(case="forward 1-s reads, 385 ch x 30 kHz", impl=name, what=what,
                             seconds=round(t, 3), xrt=round(seconds / t, 2),
                             mb_s=round(n * N_CHANNELS * 2 / t / 1e6, 1),
                             passes_s=[round(v, 3) for v in times[name]]))
        if job:
            more, said = job_rows(binpath, cbin, seconds, backend, repeats, Path(tmp))
            rows += more
            notes += said
    load = os.getloadavg()
    writer = "dspk.io.cbin.write_cbin" if mtscomp is None else "mtscomp"
    notes += [f"{seconds:g} s of 385 channels at 30 kHz ({n * N_CHANNELS * 2 / 1e6:.0f} MB "
              f"raw), written by {writer} (1-s chunks): compressed to {ratio:.3f} of its size",
              f"x real time = recording seconds / wall seconds of a forward pass in 1-s reads "
              f"(median of {repeats} rounds of every case, after a warm-up round; each "
              f"pass opens the file anew); the machine's load average at "
              f"the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} ({os.cpu_count()} CPUs, "
              f"shared)",
              "dspk's blocks were checked equal to the .bin's (and mtscomp's) before timing"]
    return rows, notes, dict(seconds=seconds, threads=threads, ratio=round(ratio, 4))


def markdown(rows: list, notes: list, backend: str, env: dict, machine: str) -> str:
    lines = [f"# bench_cbin — {backend} ({machine})", "",
             "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), "",
             "| reader or job | what | s per pass | × real time | MB/s (raw) |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['impl']} | {r['what']} | {r['seconds']} | {r['xrt']} | "
                     f"{r['mb_s']} |")
    lines += ["", "## Notes", ""] + [f"- {x}" for x in notes]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--machine", default="cpu-2core", help="the machine's name in the table")
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu",
                    help="the job rows' backend (decoding is the host's either way)")
    ap.add_argument("--no-job", action="store_true", help="the readers alone, no job rows")
    ap.add_argument("--small", action="store_true", help="4 s, 1 repeat")
    ap.add_argument("--out", default=None, help="folder for bench_cbin-<backend>.{md,json} "
                    "or a FILE.md (its JSON beside it)")
    args = ap.parse_args(argv)
    seconds, repeats = (4.0, 1) if args.small else (args.seconds, args.repeats)
    rows, notes, extra = run(seconds, args.threads, repeats, args.backend, not args.no_job)
    env = environment(False)
    md = markdown(rows, notes, args.backend, env, args.machine)
    print(md)
    if args.out:
        md_path, json_path = out_files(args.out, "bench_cbin", args.backend)
        md_path.write_text(md)
        json_path.write_text(json.dumps(dict(env=env, machine=args.machine, rows=rows,
                                             notes=notes, **extra), indent=1))


if __name__ == "__main__":
    main()
