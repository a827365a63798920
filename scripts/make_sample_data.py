#!/usr/bin/env python3
"""Regenerate data/sample.nwb: a synthetic extracellular recording in NWB (written through
pynwb, so that pynwb, SpikeInterface and dspk read it) for the demo, the tests and the
notebooks; the same samples and ground truth on every run (pynwb's object ids excepted).

32 channels on a two-column probe (16 rows, 20 µm apart; columns 32 µm apart), 8 s at 30 kHz,
int16 with 0.195 µV per bit (an Intan amplifier's step). The signal in µV:
- 8 units at positions near the probe, each a biphasic spike (trough then rebound, 2 ms)
  whose amplitude falls with distance from the unit, firing as Poisson trains with a 2 ms
  refractory period;
- noise correlated across channels (covariance exp(−d / 40 µm), 10 µV per channel);
- a slow common-mode drift (sum of a few sinusoids between 0.5 and 8 Hz, 40 µV), which the
  high-pass removes.
The ground truth: the spikes' sample indices and units in /analysis/ground_truth
(``sample_index``, ``unit_index``), the units' spike times, positions and templates in µV on
every channel in /units (``spike_times``, ``position_um``, ``templates_uv``).

    python scripts/make_sample_data.py [OUT]     (default: data/sample.nwb)
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from hdmf.common import DynamicTable, VectorData
from pynwb import NWBHDF5IO, NWBFile
from pynwb.ecephys import ElectricalSeries
from pynwb.file import Subject
from pynwb.misc import Units

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
    """The NWB file, through pynwb: the recording as /acquisition/ElectricalSeries with its
    electrodes (rel_x, rel_y), the ground truth as /analysis/ground_truth (a table of the
    spikes: sample_index, unit_index) and /units (one row per unit: spike_times in s,
    position_um, templates_uv). Every value pynwb would otherwise take from the clock is
    fixed (the object ids are pynwb's own, new on every write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.nwb")
    when = datetime(2026, 12, 2, tzinfo=timezone.utc)
    nwb = NWBFile(session_description="dspk synthetic sample: 8 units on a 32-channel "
                                      "two-column probe",
                  identifier="dspk-sample-20261202", session_start_time=when,
                  file_create_date=[when],
                  # DANDI and nwbinspector require a species and an age (CRITICAL without
                  # one): placeholders, said so, for a recording no animal made
                  subject=Subject(subject_id="synthetic", sex="U", species="Mus musculus",
                                  age="P90D",
                                  description="none: a synthetic recording made by "
                                              "scripts/make_sample_data.py (species and age "
                                              "are placeholders that NWB's checks require)"))
    device = nwb.create_device(name="probe", description="a 32-contact two-column probe "
                               "(16 rows 20 µm apart, columns 32 µm apart)")
    group = nwb.create_electrode_group(name="shank0", description="the probe's one shank",
                                       location="unknown", device=device)
    for x, y in g["geometry"]:
        nwb.add_electrode(group=group, location="unknown", rel_x=float(x), rel_y=float(y))
    region = nwb.create_electrode_table_region(region=list(range(len(g["geometry"]))),
                                               description="every contact")
    nwb.add_acquisition(ElectricalSeries(
        name="ElectricalSeries", data=g["data"], electrodes=region, starting_time=0.0,
        rate=FS, conversion=UV_PER_BIT * 1e-6, offset=0.0,
        description="synthetic extracellular voltage"))
    nwb.add_analysis(DynamicTable(
        name="ground_truth", description="every spike of the ground truth, by time",
        columns=[VectorData(name="sample_index", data=g["times"],
                            description="the sample of the spike's trough"),
                 VectorData(name="unit_index", data=g["units"],
                            description="the unit that fired it (the row of /units)")]))
    nwb.units = Units(name="units", description="the ground truth's units",
                      resolution=1.0 / FS)
    nwb.add_unit_column(name="position_um", description="the unit's position [x, y, "
                        "distance from the probe plane] in µm")
    nwb.add_unit_column(name="templates_uv", description="the unit's spike on every channel "
                        "[channels, taps] in µV, trough at tap 20")
    for u in range(len(g["positions"])):
        nwb.add_unit(spike_times=g["times"][g["units"] == u] / FS,
                     position_um=g["positions"][u],
                     templates_uv=g["templates"][u].astype(np.float32))
    with NWBHDF5IO(str(tmp), "w") as io:
        io.write(nwb)
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
