#!/usr/bin/env python3
"""What a drift correction after whitening does to the noise and the units a sorter is given:
kriging matrices as they are (`dspk.motion.Correction`) against their white form
(``white=True``, `dspk.motion.keep_white`), for three kernels.

The ground: one of `bench_sorting`'s recordings (SpikeInterface's `generate_drifting_recording`,
NP1.0 geometry, int16 binary and its ``gt.npz``), high-passed, median-referenced and whitened
(local, 32 neighbours: `--preset kilosort`'s chain), then corrected by the ground truth's own
displacement, so that only the interpolation differs between rows. Each row: the units' median
SNR, waveform stability and peak-amplitude CV over time bins (`bench_sorting.unit_quality`),
the median noise SD over the whole output and its least and greatest over 6-s bins (Kilosort4's
thresholds are fixed numbers: a noise SD that moves with the drift moves them in noise SDs).

    python benchmarks/profiles/profile_keep_white.py WORK/rigid-64ch-120s-30u-seed1

(make the recording with ``benchmarks/bench_sorting.py --channels 64 --seconds 120 --units 30
--variants rigid --preprocess-only --work WORK``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import bench_sorting  # noqa: E402
import probeinterface  # noqa: E402

import dspk  # noqa: E402
from dspk.motion import Correction, Motion  # noqa: E402
from dspk.pipeline import HighPass, Pipeline, Reference, Whiten  # noqa: E402
from dspk.pipeline.steps import MOTION_P, MOTION_SIGMA_UM  # noqa: E402

FS = 30000.0
#: the noise's time bins (s)
NOISE_BIN_S = 6.0


def true_motion(gt, geometry) -> Motion:
    """The ground truth's displacement as a `Motion` over the units' depths."""
    order = np.argsort(gt["unit_xy"][:, 1])
    depths = gt["unit_xy"][order, 1]
    keep = np.r_[True, np.diff(depths) > 0]
    disp = gt["unit_displacement"]
    edges = (np.arange(disp.shape[0] + 1) - 0.5) / float(gt["displacement_fs"])
    return Motion(edges, depths[keep], disp[:, order][:, keep], geometry=geometry)


def row(name: str, z: np.ndarray, geometry, rec: Path) -> str:
    q = bench_sorting.unit_quality(np.ascontiguousarray(z.T), geometry, rec, 1.0)
    step = int(NOISE_BIN_S * FS)
    sds = [float(np.median(np.median(np.abs(z[:, a:a + step]), axis=1) / 0.6745))
           for a in range(0, z.shape[1] - step + 1, step)]
    return (f"| {name} | {q['snr_median']:.2f} | {q['stability_median']:.4f} | "
            f"{q['amplitude_cv_median']:.3f} | {q['noise_sd']:.3f} | {min(sds):.3f} | "
            f"{max(sds):.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording", type=Path, help="a bench_sorting recording's folder")
    args = ap.parse_args()
    rec = args.recording
    geometry = probeinterface.read_probeinterface(rec / "probe.json").probes[0] \
        .contact_positions.astype(float)
    n = len(geometry)
    gt = np.load(rec / "gt.npz")
    raw = np.fromfile(rec / "raw.bin", np.int16).reshape(-1, n)
    recording = dspk.open_recording(raw, fs=FS, geometry=geometry,
                                    gain_to_uv=bench_sorting.GAIN_UV, layout="samples_channels")
    pipe = Pipeline([HighPass(300.0), Reference("median"), Whiten("local", 32)],
                    backend="cpu").fit(recording)
    y = pipe.transform(np.ascontiguousarray(raw.T).astype(np.float32) * bench_sorting.GAIN_UV)
    motion = true_motion(gt, geometry)
    print(f"# {rec.name}: whitened (--preset kilosort's chain), corrected by the true motion\n")
    print("| correction | unit SNR | stability | amplitude CV | noise SD | 6-s noise SD min | "
          "max |\n|---|---|---|---|---|---|---|")
    print(row("none", y, geometry, rec))
    for sigma, p in [(MOTION_SIGMA_UM, MOTION_P), (20.0, 2.0), (20.0, 1.0)]:
        for white in (False, True):
            t0 = time.perf_counter()
            z = Correction(geometry, motion, sigma_um=sigma, p=p, white=white)(y, 0.0, FS)
            name = (f"kriging {sigma:.4g} µm p={p:g}" + (", white" if white else "")
                    + f" ({time.perf_counter() - t0:.0f} s)")
            print(row(name, z, geometry, rec), flush=True)


if __name__ == "__main__":
    main()
