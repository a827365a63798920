#!/usr/bin/env python3
"""IBL's preprocessing order file to file (issue 33): ADC phase shift, high-pass 300 Hz,
bad-channel detection and interpolation, spatial high-pass (destriping, with AGC) and local
whitening, on a 384-channel int16 HDF5 recording (NP1.0 layout, its ADC shifts and shanks as
attributes; coloured noise, a common-mode stripe, one dead and one noisy channel; generated
here, not committed), written as float32 HDF5.

dspk runs as a user runs it, ``python -m dspk preprocess IN OUT --preset ibl --whiten local``
in a fresh process: with an empty $DSPK_CACHE_DIR (the first job on a machine) and again with
the cache it filled; and in a warm process (`Pipeline.from_options(preset ...)`: its fit and
its run timed apart). SpikeInterface's same chain on the CPU (``phase_shift`` →
``highpass_filter(300)`` → ``detect_bad_channels`` + ``interpolate_bad_channels`` →
``highpass_spatial_filter`` → ``whiten(mode="local", radius_um=100)``, saved with
``save(format="binary", n_jobs=2)``), timed from reading the HDF5 file (it has no reader for
it: h5py into a NumpyRecording). Both chains' bad channels are reported.

    python benchmarks/bench_ibl_chain.py [--backend cpu|gpu] [--seconds 60] [--no-si]
                                         [--out DIR|FILE.md]

Goals (issue 33): >= 40x real time on the GPU machine, >= 3x SpikeInterface on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_chain import load, np1_geometry  # noqa: E402 (benchmarks/)
from common import environment, out_files  # noqa: E402

FS = 30000.0
CHANNELS = 384
DEAD, NOISY = 50, 200
GAIN_UV = 2.34375                                   # NP1.0 AP at gain 500


def shifts() -> np.ndarray:
    """NP1.0's ADC shifts of readout channels 0..383 (k/13)."""
    return ((np.arange(CHANNELS) % 24) // 2) / 13.0


def make_recording(path: Path, seconds: float) -> None:
    """[samples, channels] int16, written second by second (the recording never whole in
    memory): AR(1) noise per channel, a common stripe, channel DEAD flat, channel NOISY with
    broadband noise five times the others'."""
    import h5py
    from scipy.signal import lfilter

    n = int(round(seconds * FS))
    step = int(FS)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", (n, CHANNELS), dtype=np.int16, chunks=(step, CHANNELS))
        d.attrs["fs"] = FS
        d.attrs["gain_to_uv"] = GAIN_UV
        d.attrs["geometry"] = np1_geometry(CHANNELS)
        d.attrs["sample_shifts"] = shifts()
        d.attrs["shank_ids"] = np.zeros(CHANNELS, np.int64)
        for i, s in enumerate(range(0, n, step)):
            m = min(step, n - s)
            rng = np.random.default_rng(i)
            x = lfilter([1.0], [1.0, -0.9], rng.normal(0, 4, (CHANNELS, m)), axis=1)
            t = np.arange(s, s + m)
            x += 60.0 * np.sin(t / 40.0)[None] + rng.normal(0, 6, m)[None]
            x[DEAD] = 0.0
            x[NOISY] += rng.normal(0, 40, m)
            d[s:s + m] = np.round(x.T).astype(np.int16)


def cli_child(backend: str, src: Path, out: Path, cache: str) -> tuple[float, str]:
    """Wall seconds of ``python -m dspk preprocess`` in a fresh process, and its stderr."""
    cmd = [sys.executable, "-m", "dspk", "preprocess", str(src), str(out), "--preset", "ibl",
           "--whiten", "local", "--backend", backend, "--overwrite", "--quiet"]
    env = dict(os.environ, DSPK_CACHE_DIR=cache)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr[-2000:]}")
    return wall, done.stderr + done.stdout


def in_process(backend: str, src: Path, out: Path, dtype: Any = np.float32) -> dict:
    """A warm process: fit and run timed apart (the second job of the process), each job
    into a new output (the previous one deleted before, untimed: renaming a finished output
    over an existing file makes ext4 write the new file's data out first (its auto_da_alloc),
    1-2 s for 2.8 GB on the GPU machine, which a batch of new recordings does not pay)."""
    import dspk

    from dspk.pipeline.registry import preset

    opts = dict(preset("ibl"), whiten="local", backend=backend)
    result = {}
    for attempt in range(2):
        out.unlink(missing_ok=True)
        pipe = dspk.Pipeline.from_options(**opts)
        rec = dspk.open_recording(src)
        t0 = time.perf_counter()
        pipe.fit(rec)
        fit_s = time.perf_counter() - t0
        pipe.run(rec, out, output_dtype=dtype, progress=False)
        rec.close()
        result = dict(fit_s=fit_s, **pipe.last_run)
    import h5py
    with h5py.File(out, "r") as f:
        result["bad"] = _bad_from_output(f)
    return result


def _bad_from_output(f) -> list:
    """The channels the job replaced: its BadChannels step's fitted labels (int8 codes, 0 =
    good), as `dspk info` lists them."""
    found = []

    def visit(name, obj):
        if name.endswith("_BadChannels/labels"):
            found.extend(int(i) for i in np.flatnonzero(np.asarray(obj[()]) != 0))
    f.visititems(visit)
    return sorted(found)


def spikeinterface_chain(src: Path, work: Path) -> tuple[float, list] | None:
    try:
        import probeinterface as pi
        import spikeinterface.core as sc
        import spikeinterface.preprocessing as spre
    except ImportError:
        return None
    import h5py

    t0 = time.perf_counter()
    with h5py.File(src, "r") as f:
        traces = f["traces"][:]
    rec = sc.NumpyRecording([traces], sampling_frequency=FS)
    probe = pi.Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=np1_geometry(CHANNELS), shapes="square",
                       shape_params={"width": 12})
    probe.set_device_channel_indices(np.arange(CHANNELS))
    attached = rec.set_probe(probe)
    rec = rec if attached is None else attached
    rec.set_channel_gains(GAIN_UV)
    rec.set_channel_offsets(0.0)
    rec.set_property("inter_sample_shift", shifts())
    # in µV float32 from the start, as dspk computes (int16 through SpikeInterface's filters
    # would round at every step)
    rec = spre.scale_to_uV(rec) if hasattr(spre, "scale_to_uV") else spre.astype(rec, "float32")
    rec = spre.phase_shift(rec)
    rec = spre.highpass_filter(rec, freq_min=300.0)
    bad_ids, _ = spre.detect_bad_channels(rec, method="coherence+psd", seed=0)
    rec = spre.interpolate_bad_channels(rec, bad_channel_ids=bad_ids)
    rec = spre.highpass_spatial_filter(rec)
    rec = spre.whiten(rec, mode="local", radius_um=100.0, dtype="float32")
    rec.save(folder=work / "si", format="binary", n_jobs=2, chunk_duration="1s",
             progress_bar=False, overwrite=True)
    wall = time.perf_counter() - t0
    ids = list(rec.channel_ids)
    return wall, sorted(int(ids.index(b)) for b in bad_ids)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--no-si", action="store_true", help="leave SpikeInterface's chain out")
    ap.add_argument("--int16", action="store_true",
                    help="also a warm job writing int16 (IBL's destriped .bin, Kilosort's input)")
    ap.add_argument("--out", default=None, help="folder for bench_ibl_chain-<backend>.{md,json} "
                    "(or the table's FILE.md, its JSON beside it)")
    args = ap.parse_args(argv)
    rows, notes = [], []
    start, load_start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), load()
    with tempfile.TemporaryDirectory(prefix="dspk-ibl-") as tmp:
        work = Path(tmp)
        src = work / "in.h5"
        make_recording(src, args.seconds)
        with tempfile.TemporaryDirectory(prefix="dspk-ibl-cache-") as cache:
            for what in ("fresh process, empty tuner cache (first job on this machine)",
                         "fresh process, the cache filled by the job above"):
                (work / "cli.h5").unlink(missing_ok=True)    # a new output each time
                wall, log = cli_child(args.backend, src, work / "cli.h5", cache)
                rows.append(dict(what=f"dspk preprocess --preset ibl --whiten local "
                                 f"({args.backend}), {what}", wall_s=wall))
            (work / "cli.h5").unlink(missing_ok=True)
            os.environ["DSPK_CACHE_DIR"] = cache
            r16 = in_process(args.backend, src, work / "warm16.h5", np.int16) \
                if args.int16 else None
            (work / "warm16.h5").unlink(missing_ok=True)
            r = in_process(args.backend, src, work / "warm.h5")
        rows.append(dict(what=f"dspk Pipeline fit + run in a warm process ({args.backend})",
                         wall_s=r["fit_s"] + r["wall_s"], fit_s=r["fit_s"],
                         run_s=r["wall_s"]))
        if r16 is not None:
            rows.append(dict(what=f"dspk Pipeline fit + run in a warm process ({args.backend}), "
                             f"int16 output (--int16)",
                             wall_s=r16["fit_s"] + r16["wall_s"], fit_s=r16["fit_s"],
                             run_s=r16["wall_s"]))
            notes.append(f"int16 output's run: read {r16['read_s']:.2f} s, compute "
                         f"{r16['compute_s']:.2f} s, write {r16['write_s']:.2f} s; the chunk "
                         f"loop {r16['loop_s']:.2f} s of the run's {r16['wall_s']:.2f} s")
        notes.append("every job writes a new output (the previous one deleted before it, "
                     "untimed)")
        notes.append(f"dspk's bad channels: {r['bad']} (injected: dead {DEAD}, noisy "
                     f"{NOISY}); its run's split (overlapped): read {r['read_s']:.2f} s, "
                     f"compute {r['compute_s']:.2f} s, write {r['write_s']:.2f} s, transfer "
                     f"{r['transfer_s']:.2f} s; the chunk loop {r['loop_s']:.2f} s of the "
                     f"run's {r['wall_s']:.2f} s (the rest: opening, the output's metadata "
                     f"and fitted state, committing)")
        # the warm run's chunk timeline ([what, chunk, start s, end s]) for the JSON
        timeline = r.get("events", [])
        if not args.no_si:
            si = spikeinterface_chain(src, work)
            if si is None:
                notes.append("SpikeInterface missing: no reference row")
            else:
                rows.append(dict(what="SpikeInterface's same chain (cpu, n_jobs=2, float32 "
                                 "binary; from reading the HDF5 file)", wall_s=si[0]))
                notes.append(f"SpikeInterface's bad channels: {si[1]}")
    si_s = next((r["wall_s"] for r in rows if r["what"].startswith("Spike")), None)
    for r in rows:
        r["x_real_time"] = args.seconds / r["wall_s"]
        r["vs_si"] = None if si_s is None else si_s / r["wall_s"]
        # the fields dspk.plot.benchmark_bars draws
        r.update(case=f"IBL order, {CHANNELS} ch x {args.seconds:g} s file to file",
                 impl=r["what"], ms=r["wall_s"] * 1e3)
    env = environment(args.backend == "gpu")
    command = " ".join(["python", "benchmarks/bench_ibl_chain.py", *(argv or sys.argv[1:])])
    lines = [f"# bench_ibl_chain — {args.backend} ({os.cpu_count()} cores)", "",
             "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), "",
             f"Command: `{command}`", "",
             f"Run {start} to {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}; load "
             f"average (1/5/15 min) at start {load_start}, at end {load()}.", "",
             f"Recording: {CHANNELS} channels x {args.seconds:g} s int16 HDF5 "
             f"({CHANNELS * FS * 2 * args.seconds / 1e9:.2f} GB) -> float32 HDF5.", "",
             "| job | wall s | fit s | run s | x real time | x SpikeInterface |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        f = lambda k: "" if r.get(k) is None else f"{r[k]:.2f}"  # noqa: E731
        lines.append(f"| {r['what']} | {r['wall_s']:.2f} | {f('fit_s')} | {f('run_s')} | "
                     f"{r['x_real_time']:.1f} | {f('vs_si')} |")
    lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        md_path, json_path = out_files(args.out, "bench_ibl_chain", args.backend)
        md_path.write_text(md)
        json_path.write_text(json.dumps(
            dict(rows=rows, notes=notes, environment=env, command=command,
                 warm_run_timeline=timeline), indent=1))


if __name__ == "__main__":
    main()
