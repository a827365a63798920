#!/usr/bin/env python3
"""The Neuropixels chain's ops against their references on the CPU (issue 33): for now the
spatial high-pass (destriping), `dspk.ops.highpass_spatial_filter` against SpikeInterface's
`highpass_spatial_filter` (IBL's `kfilt`), with and without its AGC, on one batch of 384
channels x 2 s float32 at 30 kHz (NP1.0 layout: 4 staggered columns, 20 µm rows; coloured
noise plus a common-mode stripe).

Both get the same traces and the same per-channel RMS (`rms_values`, so SpikeInterface does
not sample its noise levels inside the timing). SpikeInterface's preprocessor is built outside
the timing and each sample is one `get_traces()` of the whole batch ([samples, channels], its
layout); dspk's is one call on [channels, samples] (its layout). Times are the median of
``--repeats`` calls (default 3) after one warm-up call, with `time.perf_counter`; the first
call in the process (dspk: the spatial matrix built and the products' candidates tuned, with
an empty $DSPK_CACHE_DIR when the caller gives one) is reported apart. The accuracy column is
the largest absolute difference over the reference's largest value. IBL's own `destripe`
(ibl-neuropixel) is reported missing where it does not import.

    python benchmarks/bench_chain.py [--seconds S] [--repeats N] [--out FILE.md]

The machine's load (``/proc/loadavg``, 1/5/15 min, our own run included) is written at the
start and the end: on shared cores a loaded machine slows every row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment  # noqa: E402

FS = 30000.0


def np1_geometry(n: int = 384) -> np.ndarray:
    c = np.arange(n)
    return np.c_[np.array([43.0, 11.0, 59.0, 27.0])[c % 4], 20.0 * (c // 2)]


def striped(n_channels: int, n_samples: int, seed: int = 0) -> np.ndarray:
    from scipy.signal import lfilter

    rng = np.random.default_rng(seed)
    noise = lfilter([1.0], [1.0, -0.9], rng.normal(0, 10, (n_channels, n_samples)), axis=1)
    t = np.arange(n_samples)
    stripe = 150.0 * np.sin(t / 40.0) + lfilter([1.0], [1.0, -0.99], rng.normal(0, 15, n_samples))
    return np.round(noise + stripe[None, :]).astype(np.float32)


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def timed(fn, repeats: int) -> tuple[float, float]:
    """(first call ms, median ms of ``repeats`` calls after it)."""
    t0 = time.perf_counter()
    fn()
    first = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return first, statistics.median(times)


def si_recording(x: np.ndarray, geom: np.ndarray):
    import probeinterface as pi
    import spikeinterface.core as sc

    rec = sc.NumpyRecording(np.ascontiguousarray(x.T), FS)
    probe = pi.Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=geom, shapes="square", shape_params={"width": 12})
    probe.set_device_channel_indices(np.arange(len(geom)))
    attached = rec.set_probe(probe)
    return rec if attached is None else attached


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the Markdown table to this file")
    args = ap.parse_args(argv)

    from dspk.ops import highpass_spatial_filter

    load_start = load()
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    geom = np1_geometry()
    n = int(round(args.seconds * FS))
    x = striped(len(geom), n)
    rms = np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1))
    rows, notes = [], []
    try:
        import spikeinterface
        import spikeinterface.preprocessing as spre
        rec = si_recording(x, geom)
        si_version = spikeinterface.__version__
    except ImportError as e:
        rec, si_version = None, None
        notes.append(f"SpikeInterface missing ({e}): no reference rows")
    try:
        import ibldsp.voltage  # noqa: F401
        notes.append("ibl-neuropixel is installed but not benchmarked yet")
    except ImportError as e:
        notes.append(f"IBL destripe (ibl-neuropixel) missing: {e}")
    for agc in (True, False):
        kwargs = dict(apply_agc=agc, rms_values=rms)
        ours = lambda: highpass_spatial_filter(x, geom, FS, **kwargs)  # noqa: E731
        first, med = timed(ours, args.repeats)
        y = ours()
        ref = None
        if rec is not None:
            pre = spre.highpass_spatial_filter(rec, **kwargs)
            theirs = lambda: pre.get_traces()  # noqa: E731
            si_first, si_med = timed(theirs, args.repeats)
            ref = theirs().T
            rows.append(dict(case=f"AGC {'on' if agc else 'off'}", impl="SpikeInterface "
                             f"{si_version} highpass_spatial_filter", first_ms=si_first,
                             median_ms=si_med, rel=None))
        rel = None if ref is None else float(
            np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max())
        rows.append(dict(case=f"AGC {'on' if agc else 'off'}",
                         impl="dspk.ops.highpass_spatial_filter", first_ms=first,
                         median_ms=med, rel=rel))
    end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env = environment(False)
    command = " ".join(["python", "benchmarks/bench_chain.py", *(argv or sys.argv[1:])])
    lines = [f"# bench_chain — cpu ({os.cpu_count()} cores)", "",
             "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), "",
             f"Command: `{command}` (DSPK_CACHE_DIR="
             f"{os.environ.get('DSPK_CACHE_DIR', '~/.cache/dspk')})", "",
             f"Run {start} to {end}; load average (1/5/15 min) at start {load_start}, at end "
             f"{load()}.", "",
             f"Batch: 384 channels x {n} samples ({args.seconds:g} s at 30 kHz) float32, NP1.0 "
             f"layout; median of {args.repeats} calls after the first.", "",
             "| case | implementation | first call ms | median ms | x real time | speed-up "
             "| rel. max diff vs SI |",
             "|---|---|---|---|---|---|---|"]
    ref_ms = {r["case"]: r["median_ms"] for r in rows if r["impl"].startswith("Spike")}
    for r in rows:
        si_ms = ref_ms.get(r["case"])
        speed = "" if si_ms is None else f"{si_ms / r['median_ms']:.2f}x"
        rel = "" if r["rel"] is None else f"{r['rel']:.1e}"
        lines.append(
            f"| {r['case']} | {r['impl']} | {r['first_ms']:.1f} | {r['median_ms']:.1f} | "
            f"{args.seconds * 1e3 / r['median_ms']:.1f} | {speed} | {rel} |")
    if notes:
        lines += ["", "## Notes", ""] + [f"- {s}" for s in notes]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(md)


if __name__ == "__main__":
    main()
