#!/usr/bin/env python3
"""Regenerate data/sample.nwb bit for bit: a synthetic extracellular recording in NWB 2.x
layout (written with h5py alone) for the demo, the tests and the notebooks.

32 channels on a two-column probe (16 rows, 20 µm apart; columns 32 µm apart), 8 s at 30 kHz,
int16 with 0.195 µV per bit (an Intan amplifier's step). The signal in µV:
- 8 units at positions near the probe, each a biphasic spike (trough then rebound, 2 ms)
  whose amplitude falls with distance from the unit, firing as Poisson trains with a 2 ms
  refractory period;
- noise correlated across channels (covariance exp(−d / 40 µm), 10 µV per channel);
- a slow common-mode drift (sum of a few sinusoids between 0.5 and 8 Hz, 40 µV), which the
  high-pass removes.
The ground truth (spike sample indices, unit of each spike, unit positions, the templates in
µV on every channel) is stored under /analysis/ground_truth.

    python scripts/make_sample_data.py [OUT]     (default: data/sample.nwb)
"""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np

FS = 30000.0
DURATION_S = 8.0
UV_PER_BIT = 0.195
N_UNITS = 8
TAPS = 61                      # 2 ms at 30 kHz
SEED = 20261202


def probe() -> np.ndarray:
    """[32, 2] contact positions in µm: 16 rows x 2 columns."""
    rows = np.repeat(np.arange(16) * 20.0, 2)
    cols = np.tile([0.0, 32.0], 16)
    return np.stack([cols, rows], axis=1)


def waveform(t_ms: np.ndarray, width: float) -> np.ndarray:
    """A unit-amplitude extracellular spike: a sharp trough and a slower positive rebound."""
    trough = -np.exp(-0.5 * (t_ms / (0.12 * width)) ** 2)
    rebound = 0.35 * np.exp(-0.5 * ((t_ms - 0.45 * width) / (0.3 * width)) ** 2)
    return trough + rebound


def generate(seed: int = SEED) -> dict:
    rng = np.random.default_rng(seed)
    geom = probe()
    n = int(FS * DURATION_S)
    c = len(geom)
    # units: positions within the probe's span, 10-40 µm off the shank plane
    pos = np.stack([rng.uniform(-10, 42, N_UNITS), rng.uniform(10, 290, N_UNITS)], axis=1)
    depth = rng.uniform(10, 40, N_UNITS)
    amp = rng.uniform(80, 250, N_UNITS)            # µV at the nearest contact
    width = rng.uniform(0.8, 1.4, N_UNITS)          # ms
    t_ms = (np.arange(TAPS) - 20) / FS * 1e3        # trough at tap 20
    dist = np.sqrt(((geom[None] - pos[:, None]) ** 2).sum(-1) + depth[:, None] ** 2)
    decay = (depth[:, None] / dist) ** 2            # 1/r² falloff, 1 at the closest point
    templates = (amp[:, None, None] * decay[:, :, None] *
                 np.stack([waveform(t_ms, w) for w in width])[:, None, :])   # [units, c, taps]
    # spike trains: Poisson, 2 ms refractory
    times, units = [], []
    for u in range(N_UNITS):
        rate = rng.uniform(2, 15)
        isi = rng.exponential(FS / rate, int(rate * DURATION_S * 2) + 10) + 0.002 * FS
        t = np.cumsum(isi).astype(np.int64)
        t = t[(t >= TAPS) & (t < n - TAPS)]
        times.append(t)
        units.append(np.full(len(t), u))
    times = np.concatenate(times)
    units = np.concatenate(units)
    order = np.argsort(times, kind="stable")
    times, units = times[order], units[order]
    # noise: spatially correlated, 10 µV; slow common-mode drift
    d = np.sqrt(((geom[:, None] - geom[None]) ** 2).sum(-1))
    mix = np.linalg.cholesky(np.exp(-d / 40.0) + 1e-9 * np.eye(c))
    x = 10.0 * (rng.standard_normal((n, c)) @ mix.T)
    tt = np.arange(n) / FS
    drift = sum(rng.uniform(5, 15) * np.sin(2 * np.pi * f * tt + rng.uniform(0, 2 * np.pi))
                for f in (0.5, 1.3, 3.1, 7.7))
    x += drift[:, None] * (40.0 / 30.0)
    for t, u in zip(times, units):
        x[t - 20:t - 20 + TAPS] += templates[u].T
    data = np.clip(np.rint(x / UV_PER_BIT), -32768, 32767).astype(np.int16)
    return dict(data=data, geometry=geom, times=times, units=units, templates=templates,
                positions=np.concatenate([pos, depth[:, None]], axis=1))


def write(path: Path, g: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with h5py.File(tmp, "w", track_order=False) as f:
        f.attrs["neurodata_type"] = "NWBFile"
        f.attrs["namespace"] = "core"
        f.attrs["nwb_version"] = "2.7.0"
        f.create_dataset("identifier", data="dspk-sample-20261202")
        f.create_dataset("session_description",
                         data="dspk synthetic sample: 8 units on a 32-channel two-column probe")
        table = f.create_group("general/extracellular_ephys/electrodes")
        table.attrs["neurodata_type"] = "DynamicTable"
        table.attrs["colnames"] = np.array([b"rel_x", b"rel_y"])
        table.create_dataset("id", data=np.arange(len(g["geometry"])))
        table.create_dataset("rel_x", data=g["geometry"][:, 0])
        table.create_dataset("rel_y", data=g["geometry"][:, 1])
        es = f.create_group("acquisition/ElectricalSeries")
        es.attrs["neurodata_type"] = "ElectricalSeries"
        es.attrs["description"] = "synthetic extracellular voltage"
        data = es.create_dataset("data", data=g["data"])
        data.attrs["conversion"] = UV_PER_BIT * 1e-6
        data.attrs["offset"] = 0.0
        data.attrs["unit"] = "volts"
        start = es.create_dataset("starting_time", data=0.0)
        start.attrs["rate"] = FS
        start.attrs["unit"] = "seconds"
        el = es.create_dataset("electrodes", data=np.arange(len(g["geometry"])))
        el.attrs["neurodata_type"] = "DynamicTableRegion"
        el.attrs["table"] = table.ref
        gt = f.create_group("analysis/ground_truth")
        gt.attrs["description"] = ("spike sample indices (trough), unit of each spike, unit "
                                   "positions [x, y, distance from the probe plane] in µm, "
                                   "templates [units, channels, taps] in µV (trough at tap 20)")
        gt.create_dataset("sample_index", data=g["times"])
        gt.create_dataset("unit_index", data=g["units"])
        gt.create_dataset("unit_position_um", data=g["positions"])
        gt.create_dataset("templates_uv", data=g["templates"].astype(np.float32))
    tmp.replace(path)


def main(argv: list[str]) -> None:
    out = Path(argv[1]) if len(argv) > 1 else \
        Path(__file__).resolve().parents[1] / "data" / "sample.nwb"
    g = generate()
    write(out, g)
    print(f"{out}: {g['data'].shape[1]} channels x {g['data'].shape[0]} samples, "
          f"{len(g['times'])} spikes of {N_UNITS} units, {out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main(sys.argv)
