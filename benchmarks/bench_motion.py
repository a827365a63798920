#!/usr/bin/env python3
"""Motion (drift) estimation and correction against SpikeInterface's on data with known drift
(issue 35); and, with ``--hour``, the estimate and correction of a 384-channel hour on the GPU.

**Ground truth** (CPU mode): SpikeInterface's ``generate_drifting_recording`` on a 128-channel
probe built by ``probeinterface.generate_multi_columns_probe`` (4 columns x 32, 16 µm x 20 µm
pitch, staggered 10 µm: no download), 100 units, noise 6-8 µV, a zig-zag drift of ±20 µm
(peak to peak 40 µm, period 60 s, from 10 s); the "rigid" case moves every unit alike, the
"nonrigid" case scales the drift along depth (SpikeInterface's ``non_rigid_gradient=0.5``).
``--seconds`` (default 120; ``--long``: 600), ``--seeds`` (default 0 1 2). The traces are
generated once per case and seed (not timed) and held in memory as float32; every
implementation reads the same array.

**Rows.**

- ``dspk global whitening + Motion step``: ``Pipeline([Whiten("global"),
  Motion(mode)]).fit(rec)`` on the recording — the whitening fitted, the pass over the
  whole recording (whitened, spikes detected and localised), the drift estimated: everything
  a job does before its first chunk. ``wall_s`` is that fit's wall time; ``estimate_s`` the
  registration alone (`dspk.motion.estimate` on the spikes of a pass with the step's
  detector, re-run). ``dspk Motion step alone``: ``Pipeline([Motion(mode)])`` (no whitening:
  the pass detects on the traces scaled to unit noise per channel).
- ``SpikeInterface <preset>``: ``spikeinterface.preprocessing.compute_motion(rec, preset)``
  (peak detection, localisation, estimation) with ``n_jobs=2`` (both cores, as dspk uses),
  1-s chunks; ``kilosort_like`` and ``nonrigid_fast_and_accurate`` (no torch needed), and
  ``dredge_fast`` where torch imports (reported missing otherwise).
- Times: each implementation runs ``--repeats`` times (default 2) in a row on each
  recording and its shortest wall time is reported (the cores are shared with other work:
  the least disturbed run); the load average is written beside each row.
- Error of an estimate: at every time the ground truth is sampled (5 Hz) and at every unit's
  depth, the estimate (linear between its bins, as both libraries interpolate) minus the
  unit's true displacement, each unit's mean over time removed (the estimate is relative; in
  the non-rigid case the constant differs along depth): ``rms_um`` and ``max_um`` over all.
- Correction quality (dspk's correction of its own estimate; ``--quality-seeds``, default the
  first seed): the recording through ``Whiten("global")`` then ``dspk.detect_spikes`` (the
  ``Detect`` sink's detector and units) and ``dspk.motion.localize``, without and with the
  ``Motion`` step; each ground-truth spike matched to a detected one within ±0.5 ms and 60 µm
  of the unit; ``recall`` the fraction matched; ``unit_sd_um`` the median over units (≥ 30
  matched spikes) of the SD of their spikes' localised depths.

**--hour** (``--backend gpu``): a Neuropixels 1.0 probe (384 channels, 3840 µm), 400 units
firing 5 Hz for 3600 s (7.2 M synthetic spikes: depth = unit depth + drift + 2 µm jitter, the
drift a zig-zag ±20 µm whose amplitude grows 2x along depth); the estimate (rigid and
non-rigid) from spike columns on the GPU, then a streamed correction of 3600 s x 384 channels
float32 in 1-s chunks (one random chunk on the device re-used for every second: the
correction's cost, not a generator's). CuPy's memory pool is capped at 40 GiB (the run fails
rather than exceed it; the peak is reported). ``--hour-seconds`` shortens it (a CPU smoke
test).

    python benchmarks/bench_motion.py [--seconds 120 | --long] [--seeds 0 1 2] [--out DIR]
    python benchmarks/bench_motion.py --backend gpu --hour --out DIR

Writes ``bench_motion-<backend>.{md,json}`` in ``--out`` (the JSON's ``rows``: one dict per
measurement). The machine's load (``/proc/loadavg``) is written at the start and the end.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib.util
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, job_timing_lines  # noqa: E402

FS = 30000.0
PRESETS = ("nonrigid_fast_and_accurate", "kilosort_like", "dredge_fast")
POOL_LIMIT = 40 << 30


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


# -- ground truth ------------------------------------------------------------------------------
def generate(case: str, seconds: float, seed: int) -> dict:
    """SpikeInterface's drifting recording, materialised: traces [samples, channels] float32,
    the geometry and the ground truth."""
    from spikeinterface.generation import generate_drifting_recording

    probe_kw = dict(num_columns=4, num_contact_per_column=32, xpitch=16, ypitch=20,
                    y_shift_per_column=[0, 10, 0, 10], contact_shapes="square",
                    contact_shape_params={"width": 12})
    motion = dict(drift_mode="zigzag", non_rigid_gradient=None if case == "rigid" else 0.5,
                  t_start_drift=10.0, t_end_drift=None, period_s=60)
    t0 = time.perf_counter()
    _, drifting, sorting, extra = generate_drifting_recording(
        num_units=100, duration=seconds, sampling_frequency=FS, generate_probe_kwargs=probe_kw,
        generate_displacement_vector_kwargs=dict(
            displacement_sampling_frequency=5.0, drift_start_um=[0, 20],
            drift_stop_um=[0, -20], drift_step_um=1, motion_list=[motion]),
        extra_outputs=True, seed=seed)
    traces = np.ascontiguousarray(drifting.get_traces(0, 0, None), dtype=np.float32)
    vec = sorting.to_spike_vector()
    return dict(traces=traces, geometry=drifting.get_channel_locations().astype(np.float64),
                unit_disp=extra["unit_displacements"][:, :, 1].astype(np.float64),
                disp_fs=float(extra["displacement_sampling_frequency"]),
                unit_xy=extra["unit_locations"][:, :2].astype(np.float64),
                gt_samples=vec["sample_index"].astype(np.int64),
                gt_units=vec["unit_index"].astype(np.int64),
                generate_s=time.perf_counter() - t0)


def estimate_error(displacement_at, gt: dict) -> tuple:
    """(RMS, max) µm of the estimate at every ground-truth time and unit depth, each unit's
    mean over time removed."""
    ud = gt["unit_disp"]
    times = np.arange(ud.shape[0]) / gt["disp_fs"]
    est = np.stack([displacement_at(times, np.full(len(times), y))
                    for y in gt["unit_xy"][:, 1]], axis=1)
    err = est - ud
    err -= err.mean(axis=0)
    return float(np.sqrt(np.mean(err ** 2))), float(np.abs(err).max())


# -- dspk --------------------------------------------------------------------------------------
def dspk_fit(gt: dict, mode: str, whiten: bool) -> tuple:
    """(fitted pipeline, fit wall s, Motion) of ``[Whiten("global"), Motion(mode)]`` (or the
    Motion step alone)."""
    import dspk
    from dspk.pipeline import Motion, Whiten

    rec = dspk.open_recording(gt["traces"], fs=FS, geometry=gt["geometry"])
    pipe = dspk.Pipeline(([Whiten("global")] if whiten else []) + [Motion(mode)],
                         backend="cpu")
    t0 = time.perf_counter()
    pipe.fit(rec)
    wall = time.perf_counter() - t0
    return pipe, wall, dspk.motion.Motion.from_state(pipe.states[-1])


def pass_spikes(gt: dict, pipe, upto: int, detector: str) -> dict:
    """Spikes of the recording through the pipeline's first ``upto`` steps: ``detector``
    "motion" (the Motion step's: one template, two widths) or "detect" (the Detect sink's)."""
    import dspk
    from dspk.detect import default_templates, detect_spikes, template_noise
    from dspk.motion import localize
    from dspk.pipeline.steps import MOTION_TEMPLATE, MOTION_WIDTHS_UM

    rec = dspk.open_recording(gt["traces"], fs=FS, geometry=gt["geometry"])
    g = gt["geometry"]
    kw = {}
    if detector == "motion":
        kw = dict(templates=default_templates(FS)[MOTION_TEMPLATE:MOTION_TEMPLATE + 1],
                  widths_um=MOTION_WIDTHS_UM)
    halo = 51
    fit = [pipe.block(rec, s0, s0 + int(FS // 2), upto=upto)
           for s0 in range(0, rec.n_samples - int(FS), rec.n_samples // 16)][:16]
    noise = template_noise(np.concatenate(fit, axis=1), FS, kw.get("templates"))
    out = {"sample_index": [], "channel_index": [], "y": [], "amplitude": []}
    chunk = int(FS)
    for s0 in range(0, rec.n_samples, chunk):
        s1 = min(rec.n_samples, s0 + chunk)
        a, b = max(0, s0 - halo), min(rec.n_samples, s1 + halo)
        x = pipe.block(rec, a, b, upto=upto)
        sp = detect_spikes(x, g, FS, noise=noise, **kw)
        keep = (sp["sample_index"] + a >= s0) & (sp["sample_index"] + a < s1)
        sp = sp[keep]
        _, y, _ = localize(x, sp, g, FS)
        out["sample_index"].append(sp["sample_index"] + a)
        out["channel_index"].append(sp["channel_index"])
        out["y"].append(y)
        out["amplitude"].append(sp["amplitude"].astype(np.float64))
    return {k: np.concatenate(v) for k, v in out.items()}


def quality(gt: dict, spikes: dict, corrected: bool, motion=None) -> tuple:
    """(recall, median per-unit SD of the localised depth µm) of detected spikes against the
    ground truth: a ground-truth spike matched by the nearest detected spike within ±0.5 ms
    whose channel lies within 60 µm of the unit (where it is at that time, or where it was at
    time 0: after a correction)."""
    g = gt["geometry"]
    order = np.argsort(spikes["sample_index"], kind="stable")
    st = spikes["sample_index"][order]
    ch = spikes["channel_index"][order]
    ys = spikes["y"][order]
    tol = int(round(0.5e-3 * FS))
    ud, times = gt["unit_disp"], np.arange(gt["unit_disp"].shape[0]) / gt["disp_fs"]
    matched_y = np.full(len(gt["gt_samples"]), np.nan)
    lo = np.searchsorted(st, gt["gt_samples"] - tol)
    hi = np.searchsorted(st, gt["gt_samples"] + tol, side="right")
    k = np.clip(np.searchsorted(times, gt["gt_samples"] / FS), 0, len(times) - 1)
    unit_y = gt["unit_xy"][gt["gt_units"], 1]
    unit_x = gt["unit_xy"][gt["gt_units"], 0]
    where = [unit_y + ud[k, gt["gt_units"]]]
    if corrected:
        shift = motion.displacement_at(gt["gt_samples"] / FS, unit_y) if motion is not None \
            else 0.0
        where.append(unit_y + ud[k, gt["gt_units"]] - shift)
        where.append(unit_y)
    for i in np.flatnonzero(hi > lo):
        cand = np.arange(lo[i], hi[i])
        best = cand[np.argsort(np.abs(st[cand] - gt["gt_samples"][i]))]
        for c in best:
            d = min(np.hypot(g[ch[c], 0] - unit_x[i], g[ch[c], 1] - w[i]) for w in where)
            if d <= 60.0:
                matched_y[i] = ys[c]
                break
    recall = float(np.mean(np.isfinite(matched_y)))
    sds = []
    for u in np.unique(gt["gt_units"]):
        v = matched_y[(gt["gt_units"] == u) & np.isfinite(matched_y)]
        if len(v) >= 30:
            sds.append(float(np.std(v)))
    return recall, (statistics.median(sds) if sds else float("nan")), len(sds)


def true_motion(gt: dict):
    """The ground truth as a `dspk.motion.Motion`: one spatial bin per unit depth, time bins
    of the ground truth's sampling (5 Hz)."""
    from dspk.motion import Motion

    order = np.argsort(gt["unit_xy"][:, 1], kind="stable")
    depths = gt["unit_xy"][order, 1]
    keep = np.r_[True, np.diff(depths) > 0]
    n = gt["unit_disp"].shape[0]
    return Motion((np.arange(n + 1) - 0.5) / gt["disp_fs"], depths[keep],
                  gt["unit_disp"][:, order][:, keep], geometry=gt["geometry"])


# -- SpikeInterface ----------------------------------------------------------------------------
def si_recording(gt: dict):
    import spikeinterface.core as sc

    rec = sc.NumpyRecording(gt["traces"], FS)
    rec.set_dummy_probe_from_locations(gt["geometry"])
    return rec


def si_motion(gt: dict, preset: str) -> tuple:
    """(Motion, wall s, run times) of compute_motion, or a reason it could not run."""
    from spikeinterface.preprocessing import compute_motion

    rec = si_recording(gt)
    t0 = time.perf_counter()
    motion, info = compute_motion(rec, preset=preset, output_motion_info=True, n_jobs=2,
                                  chunk_duration="1s", progress_bar=False)
    return motion, time.perf_counter() - t0, info.get("run_times", {})


def peers() -> tuple:
    """(presets that can run, notes on those that cannot)."""
    notes, ok = [], []
    if importlib.util.find_spec("spikeinterface") is None:
        return ok, ["SpikeInterface missing: no peer rows"]
    import spikeinterface

    sk = importlib.util.find_spec("sklearn") is not None
    torch = importlib.util.find_spec("torch") is not None
    for p in PRESETS:
        if p == "dredge_fast" and not torch:
            notes.append(f"SpikeInterface {spikeinterface.__version__} preset dredge_fast "
                         f"missing: torch is not installed")
        elif not sk:
            notes.append(f"SpikeInterface preset {p} missing: its grid_convolution "
                         f"localisation needs scikit-learn, not installed")
        else:
            ok.append(p)
    return ok, notes


# -- the CPU comparison ------------------------------------------------------------------------
def timed(repeats: int, fit, *a, **k) -> tuple:
    """``fit(*a, **k)`` (which returns (result, wall s, extra)) ``repeats`` times in a row:
    the first run's result with the shortest wall time (on shared cores the least disturbed
    run)."""
    first, wall, extra = fit(*a, **k)
    for _ in range(repeats - 1):
        wall = min(wall, fit(*a, **k)[1])
    return first, wall, extra


def run_cpu(args) -> tuple:
    import spikeinterface

    import dspk.motion as dm

    rows, notes = [], []
    ok, missing = peers()
    notes += missing
    quality_seeds = args.seeds[:args.quality_seeds]
    for case in args.cases:
        mode = "rigid" if case == "rigid" else "nonrigid"
        for seed in args.seeds:
            gt = generate(case, args.seconds, seed)
            label = f"{case} ±20 µm zig-zag, 128 ch x {args.seconds:g} s"
            print(f"[{case} seed {seed}] generated in {gt['generate_s']:.1f} s; load {load()}",
                  flush=True)
            bare, wall, bare_motion = timed(args.repeats, dspk_fit, gt, mode, whiten=False)
            r, x = estimate_error(bare_motion.displacement_at, gt)
            rows.append(dict(case=label, seed=seed, impl=f"dspk Motion step ({mode}) alone",
                             wall_s=wall, rms_um=r, max_um=x, load=load()))
            print(f"  dspk alone: {wall:.1f} s, rms {r:.3f} max {x:.3f} µm", flush=True)
            pipe, wall, motion = timed(args.repeats, dspk_fit, gt, mode, whiten=True)
            rms, mx = estimate_error(motion.displacement_at, gt)
            # the registration alone, on the spikes of a pass with the step's detector
            spikes = pass_spikes(gt, pipe, 1, "motion")
            t0 = time.perf_counter()
            dm.estimate(spikes, gt["geometry"], args.seconds, fs=FS, rigid=mode == "rigid")
            est_s = time.perf_counter() - t0
            row = dict(case=label, seed=seed, impl=f"dspk global whitening + Motion step "
                       f"({mode})", wall_s=wall, estimate_s=est_s, rms_um=rms, max_um=mx,
                       spikes=len(spikes["y"]), load=load())
            rows.append(row)
            print(f"  dspk: {wall:.1f} s, rms {rms:.3f} max {mx:.3f} µm", flush=True)
            if seed in quality_seeds:
                before = pass_spikes(gt, pipe, 1, "detect")
                after = pass_spikes(gt, pipe, 2, "detect")
                r0, sd0, n0 = quality(gt, before, False)
                r1, sd1, n1 = quality(gt, after, True, motion)
                truth = true_motion(gt)
                pipe.states[-1] = truth.to_state()
                ideal = pass_spikes(gt, pipe, 2, "detect")
                r2, sd2, n2 = quality(gt, ideal, True, truth)
                qcase = f"{label}: correction quality"
                rows.append(dict(case=qcase, seed=seed, impl="dspk detection, uncorrected",
                                 recall=r0, unit_sd_um=sd0, units=n0))
                rows.append(dict(case=qcase, seed=seed, impl=f"dspk detection, corrected by "
                                 f"the dspk estimate ({mode})", recall=r1, unit_sd_um=sd1,
                                 units=n1))
                rows.append(dict(case=qcase, seed=seed, impl="dspk detection, corrected by "
                                 "the true motion (the floor)", recall=r2, unit_sd_um=sd2,
                                 units=n2))
                print(f"  recall {r0:.3f} -> {r1:.3f}, unit SD {sd0:.2f} -> {sd1:.2f} µm",
                      flush=True)
            for preset in ok:
                try:
                    m, w, times = timed(args.repeats, si_motion, gt, preset)
                except Exception as exc:  # a peer that fails is reported, not skipped
                    notes.append(f"SpikeInterface {preset} failed on {case} seed {seed}: "
                                 f"{type(exc).__name__}: {exc}")
                    continue
                r, x = estimate_error(
                    lambda t, y, m=m: m.get_displacement_at_time_and_depth(t, y), gt)
                rows.append(dict(case=label, seed=seed, impl=f"SpikeInterface "
                                 f"{spikeinterface.__version__} {preset}", wall_s=w,
                                 estimate_s=float(times.get("estimate_motion", float("nan"))),
                                 rms_um=r, max_um=x, load=load()))
                print(f"  {preset}: {w:.1f} s, rms {r:.3f} max {x:.3f} µm", flush=True)
            del gt
    return rows, notes


def summary(rows: list) -> list:
    """Per case and implementation: medians over the seeds."""
    out = []
    keys = sorted({(r["case"], r["impl"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for case, impl in keys:
        mine = [r for r in rows if r["case"] == case and r["impl"] == impl]
        agg = dict(case=case, impl=impl, seeds=len(mine))
        for k in ("wall_s", "estimate_s", "rms_um", "max_um", "recall", "unit_sd_um"):
            vals = [r[k] for r in mine if isinstance(r.get(k), (int, float))
                    and np.isfinite(r[k])]
            agg[k] = statistics.median(vals) if vals else None
        out.append(agg)
    return out


def markdown_cpu(rows: list, notes: list, args, env: dict, start: str, end: str,
                 load0: str, load1: str) -> str:
    def f(v, spec):
        return "" if v is None else format(v, spec)

    command = " ".join(["python", "benchmarks/bench_motion.py", *args.argv])
    lines = [f"# bench_motion — cpu ({os.cpu_count()} cores)", "",
             "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), "",
             f"Command: `{command}`", "",
             f"Run {start} to {end}; load average (1/5/15 min) at start {load0}, at end "
             f"{load1}.", "",
             "## Medians over the seeds", "",
             "| case | implementation | seeds | wall s | estimate alone s | RMS error µm | "
             "max error µm | recall | per-unit depth SD µm |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in summary(rows):
        lines.append(f"| {r['case']} | {r['impl']} | {r['seeds']} | {f(r['wall_s'], '.1f')} "
                     f"| {f(r['estimate_s'], '.2f')} | {f(r['rms_um'], '.3f')} | "
                     f"{f(r['max_um'], '.2f')} | {f(r['recall'], '.3f')} | "
                     f"{f(r['unit_sd_um'], '.2f')} |")
    lines += ["", "## Every run", "",
              "| case | seed | implementation | wall s | estimate alone s | RMS µm | max µm | "
              "spikes | recall | unit SD µm | load |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['seed']} | {r['impl']} | {f(r.get('wall_s'), '.1f')} "
                     f"| {f(r.get('estimate_s'), '.2f')} | {f(r.get('rms_um'), '.3f')} | "
                     f"{f(r.get('max_um'), '.2f')} | {r.get('spikes', '')} | "
                     f"{f(r.get('recall'), '.3f')} | {f(r.get('unit_sd_um'), '.2f')} | "
                     f"{r.get('load', '')} |")
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


# -- the GPU hour ------------------------------------------------------------------------------
def np1_geometry(n: int = 384) -> np.ndarray:
    c = np.arange(n)
    return np.c_[np.array([43.0, 11.0, 59.0, 27.0])[c % 4], 20.0 * (c // 2)]


def hour_spikes(seconds: float, seed: int = 0, n_units: int = 400, rate: float = 5.0,
                units: bool = False) -> tuple:
    rng = np.random.default_rng(seed)
    g = np1_geometry()
    depth = rng.uniform(20.0, g[:, 1].max() - 20.0, n_units)
    n = int(n_units * rate * seconds)
    t = np.sort(rng.uniform(0.0, seconds, n))
    u = rng.integers(0, n_units, n)

    def drift(tt, yy):
        tri = 40.0 * np.abs(((tt / 300.0) % 2.0) - 1.0) - 20.0
        return tri * (1.0 + yy / g[:, 1].max())

    y = depth[u] + drift(t, depth[u]) + rng.normal(0.0, 2.0, n)
    spikes = {"time_s": t, "y": y, "amplitude": rng.uniform(7.0, 30.0, n)}
    return (g, spikes, drift, depth) + ((u,) if units else ())


def drift_errors(m, drift, depths) -> np.ndarray:
    """The estimate minus the true drift at its time bins' centres and at each of ``depths``,
    each depth's mean over time removed (the estimate is relative)."""
    tc = m.time_centres_s
    errs = [m.displacement_at(tc, y) - drift(tc, y) for y in depths]
    return np.concatenate([e - e.mean() for e in errs])


def run_hour(args, backend: str) -> tuple:
    import dspk.motion as dm
    from dspk.backend import to_numpy

    gpu = backend == "gpu"
    if gpu:
        import cupy as xp

        pool = xp.get_default_memory_pool()
        pool.set_limit(size=POOL_LIMIT)
        sync = xp.cuda.Device().synchronize
    else:
        xp, pool, sync = np, None, (lambda: None)
    seconds = float(args.hour_seconds)
    rows, notes = [], []
    peak = [0]

    def note_peak():
        if pool is not None:
            peak[0] = max(peak[0], pool.total_bytes())

    g, spikes, drift, depth = hour_spikes(seconds)
    cols = {k: xp.asarray(v) for k, v in spikes.items()}
    case = f"NP1 384 ch x {seconds:g} s, {len(spikes['y']) / 1e6:.1f} M spikes"
    for rigid in (True, False):
        # a first call (the tuner's choices for these sizes), then the timed one
        sync()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        m = prof.runcall(dm.estimate, cols, g, seconds, rigid=rigid)
        sync()
        first = time.perf_counter() - t0
        note_peak()
        # where the first call went (printed before the second: a run stopped by a time
        # limit still says it)
        print(f"estimate rigid={rigid}, first call {first:.2f} s; its 15 largest "
              f"cumulative times:", flush=True)
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(15)
        t0 = time.perf_counter()
        m = dm.estimate(cols, g, seconds, rigid=rigid)
        sync()
        wall = time.perf_counter() - t0
        note_peak()
        errs = drift_errors(m, drift, depth[::20])
        kind = "rigid" if rigid else "non-rigid"
        rows.append(dict(case=case, impl=f"dspk.motion.estimate ({kind}, "
                         f"{len(m.depths_um)} windows)", wall_s=wall, first_s=first,
                         rms_um=float(np.sqrt(np.mean(errs ** 2))),
                         max_um=float(np.abs(errs).max())))
        print(f"estimate rigid={rigid}: {wall:.2f} s (first {first:.2f} s)", flush=True)
    del cols
    corr = dm.Correction(g, m)
    chunk = int(FS)
    rng = np.random.default_rng(1)
    x = xp.asarray(rng.standard_normal((len(g), chunk)).astype(np.float32))
    n_chunks = int(np.ceil(seconds))
    y = corr(x, 0.0, FS)       # the first chunk: kernels and the product's tuning
    sync()
    t0 = time.perf_counter()
    for k in range(n_chunks):
        y = corr(x, float(k), FS)
    sync()
    wall = time.perf_counter() - t0
    note_peak()
    gb = len(g) * chunk * 4 * n_chunks / 1e9
    rows.append(dict(case=case, impl=f"dspk.motion.Correction (non-rigid), {n_chunks} chunks "
                     f"of 1 s", wall_s=wall, gb_per_s=gb / wall, xrt=seconds / wall))
    print(f"correction: {wall:.2f} s ({gb / wall:.1f} GB/s)", flush=True)
    assert np.all(np.isfinite(to_numpy(y)))
    total = rows[-2]["wall_s"] + wall
    rows.append(dict(case=case, impl="estimate (non-rigid) + correction", wall_s=total,
                     target_s=60.0))
    if pool is not None:
        notes.append(f"CuPy memory pool peak {peak[0] / 2**30:.2f} GiB (capped at "
                     f"{POOL_LIMIT / 2**30:.0f} GiB)")
    notes.append("the estimate's first call in the process (the tuner's choices for these "
                 "sizes) is first_s; wall_s is the second")
    return rows, notes


def write_drifting_np1(path: Path, seconds: float, seed: int = 0, n_units: int = 400,
                       rate: float = 5.0) -> tuple:
    """A 384-channel int16 HDF5 recording (µV, gain 1) of ``hour_spikes``' units and drift:
    AR(1) noise (~10 µV), each spike a 1.6-ms biphasic waveform on the channels within
    60 µm of its drifted position (Gaussian footprint, 20 µm), written second by second (a
    waveform that would cross into the next second is cut there: 1.6 ms of each second at
    most). Returns the drift function and the units' depths."""
    import h5py
    from scipy.signal import fftconvolve, lfilter

    g, spikes, drift, depth, u_all = hour_spikes(seconds, seed, n_units, rate, units=True)
    rng = np.random.default_rng(seed + 1)
    xs = rng.choice(np.unique(g[:, 0]), n_units)
    t_w = np.arange(48) / FS
    wave = (-np.exp(-((t_w - 0.4e-3) / 0.15e-3) ** 2)
            + 0.35 * np.exp(-((t_w - 0.9e-3) / 0.3e-3) ** 2))
    n, step = int(round(seconds * FS)), int(FS)
    t_all, y_all, amp_all = spikes["time_s"], spikes["y"], spikes["amplitude"] * 6.0
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", (n, len(g)), dtype=np.int16, chunks=(step, len(g)))
        d.attrs["fs"] = FS
        d.attrs["gain_to_uv"] = 1.0
        d.attrs["geometry"] = g
        for i, s0 in enumerate(range(0, n, step)):
            m = min(step, n - s0)
            noise = np.random.default_rng(100 + i).normal(0, 9, (len(g), m))
            x = lfilter([1.0], [1.0, -0.5], noise, axis=1)
            sel = (t_all >= s0 / FS) & (t_all < (s0 + m) / FS)
            ts = np.round(t_all[sel] * FS).astype(np.int64) - s0
            dist2 = ((g[None, :, 1] - y_all[sel, None]) ** 2
                     + (g[None, :, 0] - xs[u_all[sel], None]) ** 2)
            foot = amp_all[sel, None] * np.exp(-dist2 / (2 * 20.0 ** 2)) * (dist2 < 60.0 ** 2)
            imp = np.zeros((len(g), m + len(wave)))
            np.add.at(imp, (slice(None), ts), foot.T)
            x += fftconvolve(imp, wave[None], axes=1)[:, :m]
            d[s0:s0 + m] = np.clip(np.round(x.T), -32768, 32767).astype(np.int16)
    return drift, depth


def run_hour_job(args, backend: str) -> tuple:
    """The whole job on a recording of ``--job-seconds`` (default 120): ``dspk preprocess IN OUT
    --motion nonrigid`` (high-pass, median reference, global whitening, the motion pass and
    the corrected traces written, int16), in a fresh process (the CLI, empty tuner cache)
    and in a warm process (fit and run timed apart); the hour is extrapolated linearly."""
    import subprocess
    import tempfile

    import dspk

    seconds = float(args.job_seconds)
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in.h5", Path(tmp) / "out.h5"
        t0 = time.perf_counter()
        drift, depth = write_drifting_np1(src, seconds)
        notes.append(f"recording written in {time.perf_counter() - t0:.1f} s (not timed)")
        case = f"NP1 384 ch x {seconds:g} s int16 HDF5 -> int16 HDF5"
        cmd = [sys.executable, "-m", "dspk", "preprocess", str(src), str(out), "--motion",
               "nonrigid", "--backend", backend, "--overwrite", "--quiet"]
        env = dict(os.environ, DSPK_CACHE_DIR=tempfile.mkdtemp(dir=tmp))
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode:
            raise RuntimeError(done.stderr[-3000:])
        rows.append(dict(case=case, impl="CLI, fresh process, empty tuner cache", wall_s=wall,
                         xrt=seconds / wall, hour_s=wall * 3600.0 / seconds))
        # where the CLI's time went, from its log: the fit's split, the drift, the loop's
        notes += [f"CLI log: `{line}`" for line in job_timing_lines(done.stdout + done.stderr)]
        print(f"CLI: {wall:.2f} s", flush=True)
        for attempt in range(2):
            pipe = dspk.Pipeline.from_options(motion="nonrigid", backend=backend)
            rec = dspk.open_recording(src)
            t0 = time.perf_counter()
            pipe.fit(rec)
            fit_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            pipe.run(rec, out, overwrite=True, progress=False)
            run_s = time.perf_counter() - t0
            rec.close()
        total = fit_s + run_s
        rows.append(dict(case=case, impl="warm process: fit (whitening + motion pass + "
                         "estimate)", wall_s=fit_s, xrt=seconds / fit_s,
                         hour_s=fit_s * 3600.0 / seconds))
        rows.append(dict(case=case, impl="warm process: run (corrected, written)", wall_s=run_s,
                         xrt=seconds / run_s, hour_s=run_s * 3600.0 / seconds))
        rows.append(dict(case=case, impl="warm process: fit + run", wall_s=total,
                         xrt=seconds / total, hour_s=total * 3600.0 / seconds, target_s=60.0))
        from dspk.motion import Motion as MotionEstimate

        state = next(st for st, step in zip(pipe.states, pipe.steps)
                     if type(step).__name__ == "Motion")
        errs = drift_errors(MotionEstimate.from_state(state), drift, depth[::10])
        notes.append(f"the job's drift estimate against the truth: RMS "
                     f"{np.sqrt(np.mean(errs ** 2)):.2f} µm, max {np.abs(errs).max():.2f} µm "
                     f"(units' depths, each unit's mean removed)")
        notes.append("hour_s: the wall time scaled linearly to 3600 s (an hour of int16 is "
                     "83 GB, more than the machine's disk)")
    return rows, notes


def markdown_hour(rows: list, notes: list, args, env: dict, backend: str) -> str:
    command = " ".join(["python", "benchmarks/bench_motion.py", *args.argv])
    lines = [f"# bench_motion --hour — {backend}", "",
             "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), "",
             f"Command: `{command}`; load at end {load()}", "",
             "| case | implementation | wall s | first call s | RMS µm | max µm | GB/s | "
             "x real time | an hour, scaled s | target s |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, spec):
        return "" if v is None else format(v, spec)

    for r in rows:
        lines.append(f"| {r['case']} | {r['impl']} | {f(r.get('wall_s'), '.2f')} | "
                     f"{f(r.get('first_s'), '.2f')} | {f(r.get('rms_um'), '.3f')} | "
                     f"{f(r.get('max_um'), '.2f')} | {f(r.get('gb_per_s'), '.1f')} | "
                     f"{f(r.get('xrt'), '.0f')} | {f(r.get('hour_s'), '.1f')} | "
                     f"{f(r.get('target_s'), '.0f')} |")
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default=None, help="cpu or gpu (default: $DSPK_BACKEND)")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--long", action="store_true", help="600 s recordings")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cases", nargs="+", default=["rigid", "nonrigid"],
                    choices=["rigid", "nonrigid"])
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of each implementation per recording: the shortest is reported")
    ap.add_argument("--quality-seeds", type=int, default=1,
                    help="seeds (the first N) whose correction quality is measured")
    ap.add_argument("--hour", action="store_true", help="the 384-channel hour (GPU)")
    ap.add_argument("--hour-seconds", type=float, default=3600.0)
    ap.add_argument("--hour-job", action="store_true",
                    help="the whole --motion job on a 384-channel recording, file to file")
    ap.add_argument("--job-seconds", type=float, default=120.0)
    ap.add_argument("--out", default=None, help="directory for bench_motion-<backend>.{md,json}")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.long:
        args.seconds = 600.0
    from dspk.backend import resolve_backend

    backend = resolve_backend(args.backend)
    env = environment(backend == "gpu")
    load0, start = load(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.hour:
        rows, notes = run_hour(args, backend)
        md = markdown_hour(rows, notes, args, env, backend)
        name = "bench_motion_hour"
    elif args.hour_job:
        rows, notes = run_hour_job(args, backend)
        md = markdown_hour(rows, notes, args, env, backend)
        name = "bench_motion_job"
    else:
        rows, notes = run_cpu(args)
        md = markdown_cpu(rows, notes, args, env, start,
                          time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), load0, load())
        name = "bench_motion"
    print(md)
    if args.out:
        d = Path(args.out)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}-{backend}.md").write_text(md)
        (d / f"{name}-{backend}.json").write_text(json.dumps(
            {"env": env, "rows": rows, "notes": notes, "load_start": load0,
             "load_end": load()}, indent=1))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
