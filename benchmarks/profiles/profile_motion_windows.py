#!/usr/bin/env python3
"""How wide `dspk.motion.estimate`'s non-rigid windows should be: the error of the estimate
against the ground truth's displacement for several window widths (and the rigid estimate),
on the spikes the `Motion` step itself finds in a pass.

Two grounds, both SpikeInterface's `generate_drifting_recording`:

- ``--probe np1``: `bench_sorting`'s recordings (NP1.0, 384 channels, 3840 µm, 100 units,
  int16 binary; the step's pass through ``--preset kilosort``), ``--seconds`` long;
- ``--probe dense``: `bench_motion`'s (128 channels over 630 µm, 100 units, 120 s; the pass
  through global whitening, as bench_motion fits).

Each row: the windows' spacing/SD (``auto``: `dspk.motion.window_scale`), the error RMS and max
(µm; each unit's mean over time removed, `bench_motion.estimate_error`'s measure) and the
estimate's wall time. The pass's spikes are kept in ``--work`` (a re-run only re-estimates).

    python benchmarks/profiles/profile_motion_windows.py --probe np1 --case rigid \\
        --widths auto 100/100 200/300 400/450 600/600
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import dspk  # noqa: E402
import dspk.pipeline.steps.motion as motion_step  # noqa: E402
from dspk.motion import estimate, window_scale  # noqa: E402


def pass_spikes(pipe, rec) -> dict:
    """The spikes the Motion step's pass finds (captured where the step estimates)."""
    seen = {}
    estimate_motion = motion_step.estimate_motion

    def keep(found, geometry, duration, **kw):
        seen.update(found={k: dspk.backend.to_numpy(v) for k, v in found.items()},
                    duration=duration)
        return estimate_motion(found, geometry, duration, **kw)

    motion_step.estimate_motion = keep
    try:
        pipe.fit(rec)
    finally:
        motion_step.estimate_motion = estimate_motion
    return seen


def np1_ground(case: str, seconds: float, work: Path) -> tuple:
    import bench_sorting as bs

    folder = bs.generate(case, 384, seconds, 100, 0, work, 2)
    geometry = bs.np1_probe(384).contact_positions.astype(np.float64)
    gt = np.load(folder / "gt.npz")
    truth = dict(unit_disp=gt["unit_displacement"], disp_fs=float(gt["displacement_fs"]),
                 unit_xy=gt["unit_xy"])
    spikes = folder / "motion_pass_spikes.pkl"
    if not spikes.exists():
        rec = dspk.open_recording(folder / "raw.bin", n_channels=384, fs=bs.FS,
                                  gain_to_uv=bs.GAIN_UV, geometry=geometry)
        pipe = dspk.Pipeline.from_options(preset="kilosort", motion="nonrigid", backend="cpu")
        spikes.write_bytes(pickle.dumps(pass_spikes(pipe, rec)))
    return geometry, truth, pickle.loads(spikes.read_bytes())


def dense_ground(case: str, work: Path, seed: int = 0) -> tuple:
    import bench_motion as bm
    from dspk.pipeline import Motion, Whiten

    gt = bm.generate(case, 120.0, seed)
    spikes = work / f"dense-{case}-{seed}-motion_pass_spikes.pkl"
    if not spikes.exists():
        rec = dspk.open_recording(gt["traces"], fs=bm.FS, geometry=gt["geometry"])
        pipe = dspk.Pipeline([Whiten("global"), Motion("nonrigid")], backend="cpu")
        spikes.write_bytes(pickle.dumps(pass_spikes(pipe, rec)))
    return gt["geometry"], gt, pickle.loads(spikes.read_bytes())


def main(argv=None) -> None:
    import bench_motion as bm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", choices=("np1", "dense"), default="np1")
    ap.add_argument("--case", choices=("rigid", "nonrigid"), default="rigid")
    ap.add_argument("--seconds", type=float, default=300.0, help="np1 only")
    ap.add_argument("--widths", nargs="+", default=["auto", "100/100", "200/300", "400/450"],
                    help="spacing/SD pairs in µm, 'auto' or 'rigid'")
    ap.add_argument("--work", default="/tmp/dspk-motion-windows")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    geometry, truth, seen = (np1_ground(args.case, args.seconds, work) if args.probe == "np1"
                             else dense_ground(args.case, work))
    found, duration = seen["found"], seen["duration"]
    extent = float(np.ptp(geometry[:, 1]))
    n_bins = int(np.ceil(duration / 2.0))
    print(f"# {args.probe} {args.case}: {len(found['y'])} spikes, {extent:g} µm, "
          f"{n_bins} bins of 2 s; auto width {window_scale(len(found['y']), n_bins, extent):.0f}"
          f" µm")
    print("| windows (spacing/SD µm) | error RMS µm | max µm | estimate s |")
    print("|---|---|---|---|")
    for width in ["rigid"] + [w for w in args.widths if w != "rigid"]:
        kw = dict(rigid=True) if width == "rigid" else {}
        if width not in ("rigid", "auto"):
            step, scale = map(float, width.split("/"))
            kw = dict(win_step_um=step, win_scale_um=scale)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # a window too wide for the probe: rigid
            m = estimate(found, geometry, duration, **kw)
        wall = time.perf_counter() - t0
        rms, worst = bm.estimate_error(m.displacement_at, truth)
        print(f"| {width} | {rms:.3f} | {worst:.2f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
