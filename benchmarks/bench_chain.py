#!/usr/bin/env python3
"""The Neuropixels chain's ops against their references (issue 33), each on one batch of 384
channels x 2 s float32 at 30 kHz (NP1.0 layout: 4 staggered columns, 20 µm rows; coloured
noise plus a common-mode stripe): saturation blanking, the ADC phase shift, bad-channel
detection (one 0.3 s chunk, the reference's per-chunk function), bad-channel interpolation and
the spatial high-pass (destriping, with and without its AGC), dspk against SpikeInterface's
`blank_saturation`, `phase_shift`, `detect_bad_channels_ibl`, `interpolate_bad_channels` and
`highpass_spatial_filter`, and IBL's `destripe` where ibl-neuropixel imports; the LFP steps
(issue 47: the decimation to 2.5 kHz against SciPy's, IBL's LFP band-pass against SciPy's
``sosfiltfilt`` and IBL's ``destripe_lfp`` chain, on 20 s at 2.5 kHz: `lfp_rows`). With
``--backend gpu`` dspk runs on CuPy arrays (timed to the device's completion), the references
on the CPU as users run them, and IBL's `destripe_gpu` where it imports.

Both get the same traces and the same per-channel RMS (`rms_values`, so SpikeInterface does
not sample its noise levels inside the timing). SpikeInterface's preprocessor is built outside
the timing and each sample is one `get_traces()` of the whole batch ([samples, channels], its
layout); dspk's is one call on [channels, samples] (its layout). Times are the median of
``--repeats`` calls (default 3) after one warm-up call, with `time.perf_counter`; the first
call in the process (dspk: the spatial matrix built and the products' candidates tuned, with
an empty $DSPK_CACHE_DIR when the caller gives one) is reported apart. The accuracy column is
the largest absolute difference over the reference's largest value. IBL's own `destripe`
(ibl-neuropixel) is reported missing where it does not import.

    python benchmarks/bench_chain.py [--backend cpu|gpu] [--seconds S] [--repeats N]
                                     [--out DIR|FILE.md]

The machine's load (``/proc/loadavg``, 1/5/15 min, our own run included) is written at the
start and the end: on shared cores a loaded machine slows every row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, out_files  # noqa: E402

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


def timed(fn, repeats: int, sync=lambda: None) -> tuple[float, float]:
    """(first call ms, median ms of ``repeats`` calls after it), each to ``sync()``'s return
    (the device's completion on the GPU)."""
    def once() -> float:
        t0 = time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - t0) * 1e3
    first = once()
    return first, statistics.median(once() for _ in range(repeats))


def si_recording(x: np.ndarray, geom: np.ndarray):
    import probeinterface as pi
    import spikeinterface.core as sc

    rec = sc.NumpyRecording(np.ascontiguousarray(x.T), FS)
    probe = pi.Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=geom, shapes="square", shape_params={"width": 12})
    probe.set_device_channel_indices(np.arange(len(geom)))
    attached = rec.set_probe(probe)
    return rec if attached is None else attached


def cases(x: np.ndarray, geom: np.ndarray, xp, rec) -> list[tuple]:
    """(case, dspk's call, the reference's call or None, the reference's name[, samples left
    out of the comparison at each end]) for each op; the calls return [channels, samples]
    arrays (dspk's on the backend) or labels. The phase shift is compared in the interior:
    at the batch's ends SpikeInterface's FFT sees its own margin's padding."""
    import dspk.ops as ops

    n = x.shape[0]
    xd = xp.asarray(x)
    rms = np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1))
    # NP1.0's ADC shifts of readout channels 0..383 (k/13)
    shifts = ((np.arange(n) % 24) // 2) / 13.0
    bad = np.zeros(n, bool)
    bad[[7, 100, 101, 250]] = True
    chunk = x[:, :int(0.3 * FS)]
    chunk_d = xp.asarray(chunk)
    threshold = float(np.quantile(x, 0.999))
    W = None

    def interpolate():
        nonlocal W
        W = ops.interpolation_matrix(geom, bad)     # built in the call, as the step does
        return ops.spatial_filter(xp.asarray(W), xd)

    out = [("saturation blanking (fill 0)",
            lambda: ops.blank_saturation(xd, threshold, fill=0.0),
            None if rec is None else
            (lambda: spre.blank_saturation(rec, abs_threshold=threshold,
                                           fill_value=0.0).get_traces().T),
            "blank_saturation"),
           ("ADC phase shift (NP1.0, k/13)", lambda: ops.phase_shift(xd, shifts),
            None if rec is None else _si_phase_shift(rec, shifts), "phase_shift",
            int(0.04 * FS)),
           ("bad channels, one 0.3 s chunk",
            lambda: ops.detect_bad_channels(chunk_d, geom, FS, num_random_chunks=1).labels,
            None if rec is None else _si_bad_chunk(rec, chunk), "detect_bad_channels_ibl"),
           ("bad channels interpolated (4 of 384)", interpolate,
            None if rec is None else
            (lambda: spre.interpolate_bad_channels(
                rec, bad_channel_ids=rec.channel_ids[bad]).get_traces().T),
            "interpolate_bad_channels")]
    for agc in (True, False):
        kwargs = dict(apply_agc=agc, rms_values=rms)
        out.append((f"spatial high-pass, AGC {'on' if agc else 'off'}",
                    lambda kwargs=kwargs: ops.highpass_spatial_filter(xd, geom, FS, **kwargs),
                    None if rec is None else
                    (lambda kwargs=kwargs: spre.highpass_spatial_filter(rec, **kwargs)
                     .get_traces().T),
                    "highpass_spatial_filter"))
    return out


def _si_phase_shift(rec, shifts):
    rec.set_property("inter_sample_shift", shifts)
    pre = spre.phase_shift(rec)
    return lambda: pre.get_traces().T


def _si_bad_chunk(rec, chunk):
    import spikeinterface.core as sc
    from spikeinterface.preprocessing.detect_bad_channels import detect_bad_channels_ibl

    order_f, order_r = sc.order_channels_by_depth(rec)
    labels = np.array(["good", "dead", "noise", "out"])
    return lambda: labels[detect_bad_channels_ibl(chunk.T[:, order_f], FS,
                                                  psd_hf_threshold=0.02)[order_r]]


def ibl_rows(x: np.ndarray, geom: np.ndarray, backend: str, repeats: int, notes: list,
             xp=np, sync=lambda: None) -> list:
    """IBL's `destripe` (CPU) or `destripe_gpu` on the same batch, where ibl-neuropixel
    imports: its chain (Butterworth high-pass, ADC phase shift, kfilt with AGC; no bad-channel
    detection, its default), beside dspk's ops in the same order (FIR high-pass, phase shift,
    spatial high-pass with AGC)."""
    import dspk.ops as ops

    try:
        if backend == "gpu":
            from ibldsp.destripe_gpu import destripe_array as destripe  # noqa: PLC0415
        else:
            from ibldsp.voltage import destripe  # noqa: PLC0415
    except ImportError as e:
        notes.append(f"IBL destripe (ibl-neuropixel) missing on this machine: {e}")
        return []
    shifts = ((np.arange(len(geom)) % 24) // 2) / 13.0
    h = {"x": geom[:, 0], "y": geom[:, 1], "sample_shift": shifts,
         "shank": np.zeros(len(geom), np.int64)}
    try:
        first, med = timed(lambda: destripe(x, fs=FS, h=h), repeats)
    except Exception as e:  # noqa: BLE001 -- a reference that fails is reported, not fatal
        notes.append(f"IBL destripe failed: {type(e).__name__}: {e}")
        return []
    xd = xp.asarray(x)
    taps = ops.highpass_taps(FS, 300.0)

    def ours():
        y = ops.fir_filter(xd, taps)
        y = ops.phase_shift(y, shifts)
        return ops.highpass_spatial_filter(y, geom, FS)

    o_first, o_med = timed(ours, repeats, sync)
    case = "IBL destripe's chain (high-pass, phase shift, spatial high-pass + AGC)"
    return [dict(case=case, impl=f"ibl-neuropixel destripe ({backend})", first_ms=first,
                 median_ms=med, rel=None, peer=True),
            dict(case=case, impl=f"dspk ({backend})", first_ms=o_first, median_ms=o_med,
                 rel=None)]


#: the LFP rows' batch (`lfp_rows`): seconds at 2.5 kHz, longer than IBL's band-pass (12.4 s)
LFP_SECONDS = 20.0
LFP_FS = 2500.0


def lfp_rows(x: np.ndarray, geom: np.ndarray, backend: str, repeats: int, notes: list,
             xp=np, sync=lambda: None) -> list:
    """The LFP steps (issue 47): the decimation 30 kHz -> 2.5 kHz of the batch against
    ``scipy.signal.decimate(ftype="fir")``; on a 384-channel batch of `LFP_SECONDS` at 2.5 kHz
    (the band-pass is 12.4 s long), IBL's Butterworth 0.5-300 Hz run forward and backward
    (dspk's zero-phase FIR, `ButterBandPass`) against ``scipy.signal.sosfiltfilt``, and IBL's
    ``destripe_lfp`` chain (its band-pass, NP1.0 ADC shift, median across channels; no
    bad-channel detection, its default) against dspk's ops in the same order. Differences
    in the interior (``sosfiltfilt`` pads the ends by odd extension)."""
    import dspk.ops as ops
    from scipy import signal

    rows = []
    notes.append("LFP rows (decimate, Butterworth, destripe_lfp): the difference column is "
                 "against SciPy's or IBL's result, in the interior where marked")
    xd = xp.asarray(x)
    ref = signal.decimate(x, 12, ftype="fir", axis=1)
    first, med = timed(lambda: signal.decimate(x, 12, ftype="fir", axis=1), repeats)
    case = "decimate by 12 (30 kHz -> 2.5 kHz)"
    rows.append(dict(case=case, impl="scipy.signal.decimate(ftype='fir') (cpu)",
                     first_ms=first, median_ms=med, rel=None, peer=True))
    first, med = timed(lambda: ops.decimate(xd, 12), repeats, sync)
    y = ops.decimate(xd, 12)
    y = y.get() if hasattr(y, "get") else y
    rows.append(dict(case=case, impl=f"dspk ({backend})", first_ms=first, median_ms=med,
                     rel=float(np.abs(y - ref).max() / np.abs(ref).max())))
    n = int(LFP_SECONDS * LFP_FS)
    rng = np.random.default_rng(1)
    t = np.arange(n) / LFP_FS
    lf = (80 * np.sin(2 * np.pi * 6 * t)[None] + signal.lfilter(
        [1.0], [1.0, -0.98], rng.normal(0, 8, (len(geom), n)), axis=1)).astype(np.float32)
    lfd = xp.asarray(lf)
    inner = slice(16000, n - 16000)
    sos = signal.butter(3, [0.5, 300.0], btype="bandpass", fs=LFP_FS, output="sos")
    case = "Butterworth 0.5-300 Hz forward-backward (384 x 20 s at 2.5 kHz)"
    first, med = timed(lambda: signal.sosfiltfilt(sos, lf, axis=1), repeats)
    ref = signal.sosfiltfilt(sos, lf.astype(np.float64), axis=1)
    rows.append(dict(case=case, impl="scipy.signal.sosfiltfilt (cpu)", first_ms=first,
                     median_ms=med, rel=None, peer=True, seconds=LFP_SECONDS))
    first, med = timed(lambda: ops.butter_zero_phase(lfd, LFP_FS, 0.5, 300.0), repeats, sync)
    y = ops.butter_zero_phase(lfd, LFP_FS, 0.5, 300.0)
    y = y.get() if hasattr(y, "get") else y
    rows.append(dict(case=case, impl=f"dspk ({backend})", first_ms=first, median_ms=med,
                     rel=float(np.abs(y - ref)[:, inner].max() / np.abs(ref[:, inner]).max()),
                     seconds=LFP_SECONDS, interior=True))
    try:
        from ibldsp.voltage import destripe_lfp  # noqa: PLC0415
    except ImportError as e:
        notes.append(f"IBL destripe_lfp (ibl-neuropixel) missing on this machine: {e}")
        return rows
    shifts = ((np.arange(len(geom)) % 24) // 2) / 13.0
    h = {"x": geom[:, 0], "y": geom[:, 1], "sample_shift": shifts,
         "shank": np.zeros(len(geom), np.int64)}
    case = "IBL destripe_lfp's chain (band-pass, phase shift, median), 20 s at 2.5 kHz"
    first, med = timed(lambda: destripe_lfp(lf, fs=LFP_FS, h=h), repeats)
    ref = destripe_lfp(lf.astype(np.float64), fs=LFP_FS, h=h)
    rows.append(dict(case=case, impl="ibl-neuropixel destripe_lfp (cpu)", first_ms=first,
                     median_ms=med, rel=None, peer=True, seconds=LFP_SECONDS))

    def ours():
        y = ops.phase_shift(lfd, shifts)
        y = ops.butter_zero_phase(y, LFP_FS, 0.5, 300.0)
        return ops.common_reference(y, "median")

    first, med = timed(ours, repeats, sync)
    y = ours()
    y = y.get() if hasattr(y, "get") else y
    rows.append(dict(case=case, impl=f"dspk ({backend})", first_ms=first, median_ms=med,
                     rel=float(np.abs(y - ref)[:, inner].max() / np.abs(ref[:, inner]).max()),
                     seconds=LFP_SECONDS, interior=True))
    return rows


def main(argv=None) -> None:
    global spre
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="folder for bench_chain-<backend>.{md,json} "
                    "(or the table's FILE.md, its JSON beside it)")
    args = ap.parse_args(argv)
    gpu = args.backend == "gpu"
    if gpu:
        import cupy as xp
        sync = xp.cuda.get_current_stream().synchronize
    else:
        xp, sync = np, (lambda: None)

    load_start = load()
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    geom = np1_geometry()
    n = int(round(args.seconds * FS))
    x = striped(len(geom), n)
    rows, notes = [], []
    try:
        import spikeinterface
        import spikeinterface.preprocessing as spre
        rec = si_recording(x, geom)
        si_version = spikeinterface.__version__
    except ImportError as e:
        rec, si_version = None, None
        notes.append(f"SpikeInterface missing ({e}): no reference rows")
    for case, ours, theirs, name, *trim in cases(x, geom, xp, rec):
        cut = slice(trim[0], -trim[0]) if trim else slice(None)
        first, med = timed(ours, args.repeats, sync)
        y = ours()
        y = y.get() if hasattr(y, "get") else y
        rel = None
        if theirs is not None:
            si_first, si_med = timed(theirs, args.repeats)
            ref = theirs()
            rows.append(dict(case=case, impl=f"SpikeInterface {si_version} {name} (cpu)",
                             first_ms=si_first, median_ms=si_med, rel=None))
            if ref.dtype.kind in "USO":
                rel = float(np.sum(np.asarray(y) != ref))      # labels that differ
            else:
                d = y[:, cut].astype(np.float64) - ref[:, cut]
                rel = float(np.abs(d).max() / np.abs(ref[:, cut]).max())
        rows.append(dict(case=case, impl=f"dspk ({args.backend})", first_ms=first,
                         median_ms=med, rel=rel))
    rows += ibl_rows(x, geom, args.backend, args.repeats, notes, xp, sync)
    rows += lfp_rows(x, geom, args.backend, args.repeats, notes, xp, sync)
    notes.append("The phase shift's difference from SpikeInterface's FFT shift is the "
                 "windowed-sinc FIR's design error near Nyquist: this batch's noise is white "
                 "up to 15 kHz; on 300-6000 Hz signals, and on a SpikeGLX file, the two agree "
                 "within 1e-4 of the RMS (tests/ops/test_delay.py)")
    end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env = environment(gpu)
    command = " ".join(["python", "benchmarks/bench_chain.py", *(argv or sys.argv[1:])])
    lines = [f"# bench_chain — {args.backend} ({os.cpu_count()} cores)", "",
             "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), "",
             f"Command: `{command}` (DSPK_CACHE_DIR="
             f"{os.environ.get('DSPK_CACHE_DIR', '~/.cache/dspk')})", "",
             f"Run {start} to {end}; load average (1/5/15 min) at start {load_start}, at end "
             f"{load()}.", "",
             f"Batch: 384 channels x {n} samples ({args.seconds:g} s at 30 kHz) float32, NP1.0 "
             f"layout (bad-channel detection: its first 0.3 s); median of {args.repeats} "
             f"calls after the first. The first call includes building the op's matrices "
             f"and taps and, with an empty tuner cache, tuning.", "",
             "| case | implementation | first call ms | median ms | x real time | speed-up "
             "vs the reference | difference vs SI |",
             "|---|---|---|---|---|---|---|"]
    ref_ms = {r["case"]: r["median_ms"] for r in rows
              if r["impl"].startswith("Spike") or r.get("peer")}
    for r in rows:
        si_ms = ref_ms.get(r["case"])
        speed = "" if si_ms is None else f"{si_ms / r['median_ms']:.2f}x"
        if r["rel"] is None:
            rel = ""
        elif r["case"].startswith("bad channels,"):
            rel = f"{r['rel']:.0f} labels differ"
        else:
            rel = f"{r['rel']:.1e} rel. max" + (" (interior)" if "phase" in r["case"] or
                                                r.get("interior") else "")
        seconds = 0.3 if r["case"].startswith("bad channels,") else \
            r.get("seconds", args.seconds)
        xrt = f"{seconds * 1e3 / r['median_ms']:.1f}"
        lines.append(f"| {r['case']} | {r['impl']} | {r['first_ms']:.1f} | "
                     f"{r['median_ms']:.1f} | {xrt} | {speed} | {rel} |")
    if notes:
        lines += ["", "## Notes", ""] + [f"- {s}" for s in notes]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        md_path, json_path = out_files(args.out, "bench_chain", args.backend)
        md_path.write_text(md)
        json_path.write_text(json.dumps(
            dict(rows=rows, notes=notes, environment=env, command=command), indent=1))


spre = None

if __name__ == "__main__":
    main()
