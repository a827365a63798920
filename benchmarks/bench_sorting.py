#!/usr/bin/env python3
"""The sorting outcome (issue 42): how many true units Kilosort4 finds on dspk's output,
against Kilosort4 alone and against SpikeInterface's chain in front of Kilosort4.

**Recordings** (generated into ``--work``, never committed): SpikeInterface's
``generate_drifting_recording`` on a Neuropixels 1.0 probe (probeinterface's
``build_neuropixels_probe("NP1000")``, its first ``--channels`` contacts: 4 staggered
columns, 20 µm between rows; no download), ``--units`` units (default 100), noise 6-8 µV
with a 25-µm spatial decay (the generator's), firing 2-8 Hz, for ``--seconds`` (default 600).
Three variants of the same units and spike trains: ``static``; ``rigid``, a zig-zag drift of
±20 µm (period 200 s, or half the recording when shorter, from a tenth of it on); and
``nonrigid``, the same zig-zag scaled along depth from 0.5 at the probe's tip to 1 at its top
(the generator's ``non_rigid_gradient=0.5``). Each is written as what a user has: a flat
int16 binary [samples, channels] at Neuropixels 1.0's 2.34375 µV per bit (``raw.bin``), its
probe (``probe.json``, probeinterface) and the ground truth (``gt.npz``).

**Arms** (each a user's chain as written in its documentation; the same Kilosort4 after):

- ``kilosort4``: ``kilosort.run_kilosort`` on ``raw.bin`` with its defaults (its high-pass,
  CAR, whitening and rigid drift correction, ``nblocks=1``).
- ``dspk+kilosort4``: ``dspk preprocess raw.bin OUT --preset kilosort --motion nonrigid
  --format kilosort`` (a fresh process, as a user runs it; ``--backend`` as given), then
  Kilosort4 on ``OUT/traces.bin`` with ``OUT/chanMap.json``, its drift correction off
  (``nblocks=0``) and its CAR off (``do_CAR=False``). ``--ks-on-dspk`` says what Kilosort4
  still does: ``skip`` (default) runs it as SpikeInterface's ``skip_kilosort_preprocessing``
  does — no high-pass, the identity for whitening — on the folder's traces read as noise SDs
  (``scale`` = 1/200, the folder's ``dspk.json``); ``redo`` lets ``run_kilosort`` high-pass
  and whiten them again (what a user gets from ``run_kilosort`` alone: Kilosort4 cannot skip
  those there).
- ``spikeinterface+kilosort4``: SpikeInterface's chain on the same binary: ``highpass_filter``
  (300 Hz), ``common_reference`` (median), ``correct_motion`` (``--si-preset``, default
  ``dredge_fast``), ``whiten`` (local, 100 µm, float32), saved as a binary folder with
  ``--jobs`` workers; then ``run_sorter("kilosort4", ..., skip_kilosort_preprocessing=True,
  do_correction=False, do_CAR=False)``.

**Scores** per arm, from SpikeInterface's ``compare_sorter_to_ground_truth`` (exhaustive
ground truth, every Kilosort4 cluster, good and mua): well-detected units (accuracy ≥ 0.8),
median accuracy, recall and precision over the ground-truth units, false-positive and
redundant units; the wall time of the preprocessing (``preprocess_s``: dspk's CLI process;
SpikeInterface's motion estimate, whitening and saved binary) and of the sorter
(``sort_s``), apart, and Kilosort4's own preprocessing and drift times from its log
(``ks_preprocess_s``, ``ks_drift_s``).

    python benchmarks/bench_sorting.py [--channels 384] [--seconds 600] [--units 100]
        [--variants static rigid nonrigid] [--arms ...] [--work DIR] [--out DIR]
        [--machine NAME] [--backend auto|cpu|gpu] [--jobs N] [--diagnose] [--resume]
        [--stop-by EPOCH_S] [--preprocess-only]

``--diagnose`` adds each unit's SNR, stability and amplitude variation in the traces each
sorter is given (`unit_quality`); ``--resume`` keeps the rows already in ``--work``;
``--stop-by`` starts no arm after that time; ``--preprocess-only`` times the dspk and
SpikeInterface chains without sorting.

Writes ``bench_sorting-<machine>-<date>.json`` (``"arms"``: one object per recording and
arm, with the per-unit accuracies) and ``.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import job_timing_lines as dspk_timing_lines  # noqa: E402

FS = 30000.0
#: µV per bit of Neuropixels 1.0's AP band at gain 500 (the int16 a SpikeGLX file holds)
GAIN_UV = 2.34375
ARMS = ("kilosort4", "dspk+kilosort4", "spikeinterface+kilosort4")
VARIANTS = ("static", "rigid", "nonrigid")
#: accuracy at or above which a ground-truth unit counts as well detected (SpikeInterface's)
WELL_DETECTED = 0.8


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- recordings ---------------------------------------------------------------------------------
def np1_probe(channels: int):
    """probeinterface's Neuropixels 1.0, its first ``channels`` contacts, wired in order."""
    from probeinterface.neuropixels_tools import build_neuropixels_probe

    probe = build_neuropixels_probe("NP1000").get_slice(np.arange(channels))
    probe.set_device_channel_indices(np.arange(channels))
    return probe


def drift_kwargs(variant: str, seconds: float) -> dict:
    """SpikeInterface's ``generate_displacement_vector`` arguments of a variant."""
    period = 200.0 if seconds >= 400 else seconds / 2
    motion = dict(drift_mode="zigzag", t_start_drift=seconds / 10, t_end_drift=None,
                  period_s=period,
                  non_rigid_gradient=0.5 if variant == "nonrigid" else None)
    return dict(displacement_sampling_frequency=5.0, drift_start_um=[0, 20],
                drift_stop_um=[0, -20], drift_step_um=1, motion_list=[motion])


def generate(variant: str, channels: int, seconds: float, units: int, seed: int, work: Path,
             jobs: int) -> Path:
    """The variant's folder (``raw.bin``, ``probe.json``, ``gt.npz``, ``info.json``), written
    unless it is there already (the same channels, seconds, units and seed)."""
    import probeinterface
    import spikeinterface.core as sc
    from spikeinterface.generation import generate_drifting_recording
    from spikeinterface.preprocessing import scale

    folder = work / f"{variant}-{channels}ch-{seconds:g}s-{units}u-seed{seed}"
    if (folder / "info.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    probe = np1_probe(channels)
    static, drifting, sorting, extra = generate_drifting_recording(
        num_units=units, duration=seconds, sampling_frequency=FS, probe=probe,
        generate_displacement_vector_kwargs=drift_kwargs(variant, seconds),
        extra_outputs=True, seed=seed)
    rec = static if variant == "static" else drifting
    as_int16 = scale(rec, gain=1.0 / GAIN_UV, offset=0.0, dtype="int16")
    sc.write_binary_recording(as_int16, file_paths=[folder / "raw.bin"], dtype="int16",
                              n_jobs=jobs, chunk_duration="1s", progress_bar=False)
    probeinterface.write_probeinterface(folder / "probe.json", probe)
    vec = sorting.to_spike_vector()
    disp = extra["unit_displacements"][:, :, 1] if variant != "static" else \
        np.zeros_like(extra["unit_displacements"][:, :, 1])
    np.savez(folder / "gt.npz", sample_index=vec["sample_index"].astype(np.int64),
             unit_index=vec["unit_index"].astype(np.int64),
             unit_xy=extra["unit_locations"][:, :2].astype(np.float64),
             unit_displacement=disp.astype(np.float32),
             displacement_fs=float(extra["displacement_sampling_frequency"]),
             unit_ids=np.asarray(sorting.unit_ids))
    info = dict(variant=variant, channels=channels, seconds=seconds, units=units, seed=seed,
                fs=FS, gain_to_uv=GAIN_UV, dtype="int16",
                generate_s=round(time.perf_counter() - t0, 2))
    (folder / "info.json").write_text(json.dumps(info, indent=1))
    log(f"generated {folder.name} in {info['generate_s']} s")
    return folder


# -- Kilosort4 ----------------------------------------------------------------------------------
def torch_device(name: str):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def release_gpu() -> None:
    """Give torch's cached GPU memory back (the next arm's dspk process needs the device)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def ks_log_times(results: Path) -> dict:
    """Kilosort4's own stage times from its log (``kilosort4.log``)."""
    text = ""
    for f in results.glob("kilosort4*.log"):
        text += f.read_text(errors="replace")
    out = {}
    for key, pattern in (("ks_preprocess_s", r"Preprocessing filters computed in ([0-9.]+)s"),
                         ("ks_drift_s", r"drift computed in ([0-9.]+)s")):
        m = re.findall(pattern, text)
        out[key] = float(m[-1]) if m else None
    return out


def ks_probe(geometry: np.ndarray) -> dict:
    """Kilosort4's probe dictionary (one shank, channels in file order)."""
    n = len(geometry)
    return dict(chanMap=np.arange(n), xc=geometry[:, 0].astype(np.float32),
                yc=geometry[:, 1].astype(np.float32), kcoords=np.zeros(n, np.float32),
                n_chan=n)


def run_ks4(binary: Path, geometry: np.ndarray, results: Path, device, *, nblocks=None,
            do_car: bool = True, dtype: str = "int16") -> float:
    """``kilosort.run_kilosort`` on a flat binary; its wall time (s)."""
    from kilosort import run_kilosort

    settings = dict(n_chan_bin=len(geometry), fs=FS)
    if nblocks is not None:
        settings["nblocks"] = nblocks
    t0 = time.perf_counter()
    run_kilosort(settings=settings, probe=ks_probe(geometry), filename=binary,
                 results_dir=results, data_dtype=dtype, do_CAR=do_car, device=device)
    return time.perf_counter() - t0


def run_ks4_skip(binary: Path, geometry: np.ndarray, results: Path, device, *,
                 scale: float, dtype: str = "int16") -> float:
    """Kilosort4 on traces already filtered, referenced, whitened and drift-corrected: its
    high-pass off and the identity for whitening (what SpikeInterface's wrapper does with
    ``skip_kilosort_preprocessing=True``), the samples multiplied by ``scale`` on reading
    (int16 steps to noise SDs), no CAR, no drift correction; its wall time (s)."""
    import torch
    from kilosort import io as ksio
    from kilosort.parameters import DEFAULT_SETTINGS
    from kilosort.run_kilosort import (close_logger, cluster_spikes, compute_drift_correction,
                                       detect_spikes, initialize_ops, save_sorting, set_files,
                                       setup_logger)

    n = len(geometry)
    t0 = time.perf_counter()
    tic0 = time.time()
    settings = {**DEFAULT_SETTINGS, "n_chan_bin": n, "fs": FS, "nblocks": 0, "scale": scale}
    _, _, results_dir, probe = set_files(
        settings=settings, filename=binary, probe=ks_probe(geometry), probe_name=None,
        data_dir=None, results_dir=results, bad_channels=None, shank_idx=None)
    setup_logger(results_dir)
    try:
        ops, settings = initialize_ops(settings, probe, dtype, False, False, device, False)
        ops["preprocessing"] = dict(hp_filter=None, whiten_mat=None)
        ops["Wrot"] = torch.eye(n, device=device)
        probe_file = ksio.BinaryFiltered(ops["filename"], n, FS, ops["batch_size"], ops["nt"],
                                         ops["nt0min"], probe["chanMap"], device=device,
                                         do_CAR=False, dtype=dtype)
        ops["Nbatches"] = probe_file.n_batches
        np.random.seed(1)              # as run_kilosort seeds its clustering
        torch.cuda.manual_seed_all(1)
        torch.random.manual_seed(1)
        ops, bfile, _ = compute_drift_correction(ops, device, tic0=tic0)
        st, tF, _, _ = detect_spikes(ops, device, bfile, tic0=tic0)
        clu, Wall, st, tF = cluster_spikes(st, tF, ops, device, bfile, tic0=tic0)
        # Phy's files want a whitening matrix and a filter: the identity, no filter
        ops["preprocessing"] = dict(hp_filter=torch.zeros(1), whiten_mat=torch.eye(n))
        save_sorting(ops, results_dir, st, clu, tF, Wall, bfile.imin, tic0)
    finally:
        close_logger()
    return time.perf_counter() - t0


# -- the arms -----------------------------------------------------------------------------------
def arm_kilosort4(rec: Path, geometry, work: Path, args) -> dict:
    results = work / "ks4"
    sort_s = run_ks4(rec / "raw.bin", geometry, results, torch_device(args.device))
    return dict(preprocess_s=0.0, sort_s=sort_s, results=results,
                chain="Kilosort4 defaults (its high-pass, CAR, whitening, nblocks=1)")


#: runs a saved step list through `Pipeline.run` (``--dspk-steps``): the same job as the
#: CLI's, in a fresh process, for chains the command line does not spell (another order)
_DSPK_STEPS_JOB = """
import json, logging, sys
import numpy as np, dspk
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")   # (the CLI's log)
from dspk.pipeline import Pipeline, registry
raw, out, n, fs, gain, probe, steps, backend = sys.argv[1:9]
stages = [registry.stage_class(s.pop("step"))(**s) for s in json.loads(steps)]
rec = dspk.open_recording(raw, n_channels=int(n), fs=float(fs), gain_to_uv=float(gain),
                          geometry=dspk.io.read_probe(probe))
Pipeline(stages, backend=backend).run(rec, out, format="kilosort", progress=False)
"""


def dspk_command(rec: Path, out: Path, n: int, args) -> list:
    """The dspk job of the arm: the CLI (a user's command), or ``--dspk-steps``' chain."""
    raw = str(rec / "raw.bin")
    if args.dspk_steps:
        return [sys.executable, "-c", _DSPK_STEPS_JOB, raw, str(out), str(n), f"{FS:g}",
                str(GAIN_UV), str(rec / "probe.json"), args.dspk_steps, args.backend or "auto"]
    cmd = [sys.executable, "-m", "dspk", "preprocess", raw, str(out), "--n-channels", str(n),
           "--fs", f"{FS:g}", "--gain-to-uv", str(GAIN_UV), "--probe", str(rec / "probe.json"),
           "--preset", "kilosort", "--motion", args.dspk_motion, "--format", "kilosort",
           "--quiet"]
    if args.backend:
        cmd += ["--backend", args.backend]
    return cmd + list(args.dspk_extra)


def arm_dspk(rec: Path, geometry, work: Path, args) -> dict:
    out = work / "dspk"
    cmd = dspk_command(rec, out, len(geometry), args)
    t0 = time.perf_counter()
    # its log kept (work/dspk.log) and its timing lines in the row: where dspk's time goes
    with open(work / "dspk.log", "w") as logfile:
        subprocess.run(cmd, check=True, stdout=logfile, stderr=subprocess.STDOUT)
    preprocess_s = time.perf_counter() - t0
    timing = dspk_timing_lines((work / "dspk.log").read_text())
    meta = json.loads((out / "dspk.json").read_text())
    shown = (f"Pipeline({args.dspk_steps}).run(format='kilosort')" if args.dspk_steps
             else "dspk " + " ".join(cmd[3:]))
    if args.preprocess_only:
        return dict(preprocess_s=preprocess_s, sort_s=None, results=None, chain=shown,
                    dspk_timing=timing)
    results = work / "ks4"
    device = torch_device(args.device)
    scale = float(meta["scale"])
    if args.ks_on_dspk == "skip":
        sort_s = run_ks4_skip(out / "traces.bin", geometry, results, device, scale=scale)
        chain = (f"{shown}; Kilosort4 without high-pass, whitening, CAR or drift correction, "
                 f"samples x {scale:g} (noise SDs)")
    else:
        sort_s = run_ks4(out / "traces.bin", geometry, results, device, nblocks=0,
                         do_car=False)
        chain = f"{shown}; Kilosort4 nblocks=0, do_CAR=False (its high-pass and whitening again)"
    traces = np.memmap(out / "traces.bin", np.int16, "r").reshape(-1, len(geometry))
    return dict(preprocess_s=preprocess_s, sort_s=sort_s, results=results, chain=chain,
                traces=traces, scale=scale, dspk_units=meta.get("units"),
                scratch=[out / "traces.bin"], dspk_timing=timing)


def arm_spikeinterface(rec: Path, geometry, work: Path, args) -> dict:
    import probeinterface
    import spikeinterface.extractors as se
    import spikeinterface.preprocessing as spre
    from spikeinterface.sorters import run_sorter

    job = dict(n_jobs=args.jobs, chunk_duration="1s", progress_bar=False)
    t0 = time.perf_counter()
    r = se.read_binary(rec / "raw.bin", sampling_frequency=FS, dtype="int16",
                       num_channels=len(geometry), gain_to_uV=GAIN_UV, offset_to_uV=0.0)
    r = r.set_probe(probeinterface.read_probeinterface(rec / "probe.json").probes[0],
                    in_place=False)
    r = spre.highpass_filter(r, freq_min=300.0, dtype="float32")
    r = spre.common_reference(r, operator="median")
    r = spre.correct_motion(r, preset=args.si_preset, **job)
    r = spre.whiten(r, mode="local", radius_um=100.0, dtype="float32", seed=0)
    saved = r.save(folder=work / "si_preprocessed", format="binary", **job)
    preprocess_s = time.perf_counter() - t0
    shown = (f"SpikeInterface highpass_filter(300) + common_reference(median) + "
             f"correct_motion({args.si_preset}) + whiten(local, 100 µm)")
    if args.preprocess_only:
        return dict(preprocess_s=preprocess_s, sort_s=None, results=None, chain=shown)
    t0 = time.perf_counter()
    run_sorter("kilosort4", saved, folder=work / "ks4_si", remove_existing_folder=True,
               skip_kilosort_preprocessing=True, do_correction=False, do_CAR=False,
               torch_device=args.device if args.device != "auto" else "auto",
               verbose=False)
    sort_s = time.perf_counter() - t0
    traces = np.memmap(work / "si_preprocessed" / "traces_cached_seg0.raw", np.float32,
                       "r").reshape(-1, len(geometry))
    return dict(preprocess_s=preprocess_s, sort_s=sort_s, traces=traces, scale=1.0,
                results=work / "ks4_si" / "sorter_output", scratch=[work / "si_preprocessed"],
                chain=f"{shown}; run_sorter kilosort4 skip_kilosort_preprocessing, no "
                      f"correction, no CAR")


RUNNERS = {"kilosort4": arm_kilosort4, "dspk+kilosort4": arm_dspk,
           "spikeinterface+kilosort4": arm_spikeinterface}


# -- scores -------------------------------------------------------------------------------------
def score(rec: Path, results: Path) -> dict:
    """SpikeInterface's ground-truth comparison of a Kilosort4 output with the recording's."""
    import spikeinterface.comparison as scmp
    import spikeinterface.core as sc

    gt = np.load(rec / "gt.npz")
    truth = sc.NumpySorting.from_samples_and_labels(
        [gt["sample_index"]], [gt["unit_index"]], FS, unit_ids=np.arange(len(gt["unit_ids"])))
    times = np.load(results / "spike_times.npy").astype(np.int64).ravel()
    labels = np.load(results / "spike_clusters.npy").astype(np.int64).ravel()
    found = sc.NumpySorting.from_samples_and_labels([times], [labels], FS)
    cmp = scmp.compare_sorter_to_ground_truth(truth, found, exhaustive_gt=True)
    perf = cmp.get_performance(method="by_unit")
    acc = perf["accuracy"].to_numpy(np.float64)
    fate = unit_fate(gt["sample_index"], gt["unit_index"], len(gt["unit_ids"]), times, labels)
    return dict(**fate, n_found=int(len(found.unit_ids)),
                well_detected=int(cmp.count_well_detected_units(WELL_DETECTED)),
                accuracy_median=float(np.median(acc)),
                recall_median=float(np.median(perf["recall"].to_numpy(np.float64))),
                precision_median=float(np.median(perf["precision"].to_numpy(np.float64))),
                false_positive=int(cmp.count_false_positive_units()),
                redundant=int(cmp.count_redundant_units()),
                overmerged=int(cmp.count_overmerged_units()),
                accuracy=[round(float(a), 4) for a in acc],
                recall=[round(float(a), 4) for a in perf["recall"].to_numpy(np.float64)],
                precision=[round(float(a), 4) for a in perf["precision"].to_numpy(np.float64)])


#: a sorted spike within this many samples of a ground-truth spike detects it (0.4 ms:
#: `compare_sorter_to_ground_truth`'s delta_time)
DETECT_SAMPLES = 12
#: the nearest sorted spike's offset counts in a unit's timing offset within this many samples
#: (1 ms: beyond it the nearest spike is more likely another unit's)
LAG_SAMPLES = 30
#: a sorted unit holding at least this fraction of a ground-truth unit's detected spikes is one
#: of its pieces
PIECE_FRACTION = 0.1


def unit_fate(gt_times: np.ndarray, gt_units: np.ndarray, n_units: int, times: np.ndarray,
              labels: np.ndarray) -> dict:
    """Where each ground-truth unit went, whatever the comparison matched: ``detected``, the
    fraction of its spikes with a sorted spike within `DETECT_SAMPLES` (any unit); ``lag``, the
    median signed offset (sorted − true samples) of those nearest sorted spikes (a sorter that
    times a unit off by more than the comparison's 0.4 ms loses it whole); ``pieces``, the
    sorted units holding ≥ `PIECE_FRACTION` of its detected spikes (2+: split); ``missed``, the
    units with detected < 0.5, and ``detected_median``."""
    order = np.argsort(times, kind="stable")
    t, lab = times[order], labels[order]
    if len(t) == 0:
        nearest = np.zeros(len(gt_times), np.int64)
        off = np.full(len(gt_times), np.iinfo(np.int64).max)
    else:
        i = np.searchsorted(t, gt_times)
        left, right = np.clip(i - 1, 0, len(t) - 1), np.clip(i, 0, len(t) - 1)
        nearest = np.where(np.abs(t[left] - gt_times) <= np.abs(t[right] - gt_times), left,
                           right)
        off = t[nearest] - gt_times
    hit = np.abs(off) <= DETECT_SAMPLES
    detected, lag, pieces = [], [], []
    for u in range(n_units):
        mine = gt_units == u
        got = hit[mine]
        detected.append(float(got.mean()) if mine.any() else 0.0)
        near = np.abs(off[mine]) <= LAG_SAMPLES
        lag.append(float(np.median(off[mine][near])) if near.any() else None)
        if got.any():
            _, counts = np.unique(lab[nearest[mine][got]], return_counts=True)
            pieces.append(int(np.sum(counts >= PIECE_FRACTION * got.sum())))
        else:
            pieces.append(0)
    det = np.asarray(detected)
    return dict(unit_detected=[round(d, 4) for d in detected], unit_lag=lag,
                unit_pieces=pieces, missed=int(np.sum(det < 0.5)),
                detected_median=float(np.median(det)))


# -- what the sorter is given -------------------------------------------------------------------
#: the diagnostic's window around a ground-truth spike (samples before, after)
WINDOW = (20, 41)
#: channels nearest a unit in its diagnostic, time bins of its stability
NEAREST, BINS = 12, 10


def unit_quality(traces: np.ndarray, geometry: np.ndarray, rec: Path, scale: float,
                 max_spikes: int = 2000) -> dict:
    """How sortable each ground-truth unit is in the traces a sorter is given.

    For each unit, on the ``NEAREST`` channels around its mean position (where a corrected
    output puts it): ``snr``, the peak |mean waveform| over the channels' noise SD (median
    absolute value / 0.6745, on the whole output: the noise the detector thresholds against);
    ``stability``, the mean correlation of the unit's mean waveform in each of ``BINS`` time
    bins with its mean over the whole recording (1: the waveform does not move; drift that
    was not corrected lowers it); ``amplitude_cv``, the coefficient of variation over those
    bins of the mean waveform's value at its peak (sample and channel of the whole mean:
    interpolation that attenuates a unit depending on where the drift puts it raises it).
    ``noise_sd``: the median over channels of each channel's
    noise SD in the output's units times ``scale`` (1 for traces whitened to unit noise).

    Parameters
    ----------
    traces : numpy.ndarray
        [samples, channels] (a memmap of the output: only windows are read).
    geometry : numpy.ndarray
        [channels, 2] µm.
    rec : Path
        The recording's folder (``gt.npz``).
    scale : float
        The output's units per stored step.
    """
    gt = np.load(rec / "gt.npz")
    rng = np.random.default_rng(0)
    n = traces.shape[0]
    probe_rows = rng.integers(WINDOW[0], n - WINDOW[1], 40)
    noise_block = np.concatenate([np.asarray(traces[t:t + 3000], np.float32)
                                  for t in probe_rows if t + 3000 < n])
    noise = np.median(np.abs(noise_block), axis=0) / 0.6745
    mean_disp = gt["unit_displacement"].mean(axis=0) if gt["unit_displacement"].size else \
        np.zeros(len(gt["unit_xy"]))
    snr, stability, amp_cv = [], [], []
    offsets = np.arange(-WINDOW[0], WINDOW[1])
    for u in range(len(gt["unit_xy"])):
        t = gt["sample_index"][gt["unit_index"] == u]
        t = t[(t >= WINDOW[0]) & (t < n - WINDOW[1])]
        if len(t) > max_spikes:
            t = np.sort(rng.choice(t, max_spikes, replace=False))
        where = gt["unit_xy"][u] + np.array([0.0, mean_disp[u]])
        chans = np.argsort(np.hypot(*(geometry - where).T))[:NEAREST]
        w = np.asarray(traces[(t[:, None] + offsets).ravel()][:, chans], np.float32)
        w = w.reshape(len(t), len(offsets), NEAREST)
        mean = w.mean(axis=0)
        sd = np.where(noise[chans] > 0, noise[chans], np.inf)
        snr.append(float(np.max(np.abs(mean) / sd)))
        bins = np.minimum((t * BINS) // n, BINS - 1)
        cors, peaks = [], []
        peak = np.unravel_index(np.argmax(np.abs(mean)), mean.shape)
        for b in range(BINS):
            if np.sum(bins == b) >= 5:
                m = w[bins == b].mean(axis=0)
                c = np.corrcoef(m.ravel(), mean.ravel())[0, 1]
                cors.append(c if np.isfinite(c) else 0.0)
                peaks.append(abs(float(m[peak])))
        stability.append(float(np.mean(cors)) if cors else 0.0)
        amp_cv.append(float(np.std(peaks) / np.mean(peaks)) if len(peaks) > 1 and
                      np.mean(peaks) > 0 else 0.0)
    return dict(snr=[round(s, 3) for s in snr], stability=[round(s, 4) for s in stability],
                amplitude_cv=[round(s, 4) for s in amp_cv],
                snr_median=float(np.median(snr)), stability_median=float(np.median(stability)),
                amplitude_cv_median=float(np.median(amp_cv)),
                noise_sd=float(np.median(noise) * scale))


# -- the run ------------------------------------------------------------------------------------
def arm_variant(arm: str, args) -> str:
    """What distinguishes this run of an arm from its default (``""`` for the default)."""
    if args.preprocess_only:
        return "; ".join(filter(None, ["preprocessing only", _arm_variant(arm, args)]))
    return _arm_variant(arm, args)


def _step_label(spec: dict) -> str:
    """A ``--dspk-steps`` step's name, with the options it sets away from the step's defaults
    (``Motion(white=True)``), so that two chains of the same steps are two variants."""
    import dataclasses

    from dspk.pipeline import registry

    spec = dict(spec)
    name = spec.pop("step")
    cls = registry.stage_class(name)
    defaults = {f.name: f.default for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING} if dataclasses.is_dataclass(cls) else {}
    changed = [f"{k}={v!r}" for k, v in spec.items() if k in defaults and defaults[k] != v]
    return f"{name}({', '.join(changed)})" if changed else name


def _arm_variant(arm: str, args) -> str:
    if arm == "dspk+kilosort4":
        parts = []
        if args.dspk_steps:
            parts.append("steps=" + ">".join(_step_label(s) for s in json.loads(args.dspk_steps)))
        elif args.dspk_motion != "nonrigid":
            parts.append(f"motion={args.dspk_motion}")
        if args.dspk_extra:
            parts.append(" ".join(args.dspk_extra))
        if args.ks_on_dspk != "skip":
            parts.append(f"ks={args.ks_on_dspk}")
        return "; ".join(parts)
    if arm == "spikeinterface+kilosort4" and args.si_preset != "dredge_fast":
        return f"preset={args.si_preset}"
    return ""


def run_arm(arm: str, rec: Path, args) -> dict:
    import probeinterface

    variant = arm_variant(arm, args)
    tag = re.sub(r"[^A-Za-z0-9_.+-]+", "_", f"{arm}-{variant}" if variant else arm)
    work = Path(args.work) / f"{rec.name}-{tag}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    geometry = probeinterface.read_probeinterface(rec / "probe.json").probes[0] \
        .contact_positions.astype(np.float64)
    log(f"{arm} {variant} on {rec.name}")
    got = RUNNERS[arm](rec, geometry, work, args)
    row = dict(recording=json.loads((rec / "info.json").read_text())["variant"], arm=arm,
               variant=variant, preprocess_s=round(got["preprocess_s"], 2),
               sort_s=None if got["sort_s"] is None else round(got["sort_s"], 2),
               chain=got["chain"])
    if got.get("dspk_timing"):
        row["dspk_timing"] = got["dspk_timing"]
    if got["results"] is None:          # --preprocess-only: a timing, nothing sorted
        log(f"{arm} {variant} on {rec.name}: preprocess {row['preprocess_s']} s")
        return row
    row.update(ks_log_times(got["results"]))
    row.update(score(rec, got["results"]))
    if args.diagnose and "traces" in got:
        q = unit_quality(got["traces"], geometry, rec, got["scale"])
        row.update({f"unit_{k}" if k in ("snr", "stability", "amplitude_cv") else k: v
                    for k, v in q.items()})
    got.pop("traces", None)
    if not args.keep_traces:
        # a 384-channel, 10-minute arm leaves 14 GB (int16) to 28 GB (float32) of traces: three
        # arms and a recording would fill the GPU machine's 64 GB disk
        for path in got.get("scratch", []):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    log(f"{arm} {variant} on {rec.name}: {row['well_detected']} well detected, median "
        f"accuracy {row['accuracy_median']:.3f}, {row['false_positive']} false positive; "
        f"preprocess {row['preprocess_s']} s, sort {row['sort_s']} s")
    return row


def fmt(v, spec: str) -> str:
    return "" if v is None else format(v, spec)


def unmatched_detected(row: dict) -> int | None:
    """Units whose spikes the sorter detected (≥ 0.8) but in pieces or merged: no sorted unit
    reaches accuracy 0.5 (None for a row without `unit_fate`)."""
    if "unit_detected" not in row:
        return None
    return int(sum(d >= 0.8 and a < 0.5 for d, a in zip(row["unit_detected"], row["accuracy"])))


def markdown(rows: list, env: dict, args) -> str:
    lines = [f"# bench_sorting — {args.machine}", "",
             "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), "",
             f"Recordings: {args.channels} channels x {args.seconds:g} s, {args.units} units, "
             f"seed {args.seed} (SpikeInterface's generate_drifting_recording, NP1.0 geometry, "
             f"int16 at {GAIN_UV} µV/bit).", "",
             "| recording | arm | variant | well detected (acc ≥ 0.8) | median accuracy "
             "| median recall | median precision | KS units | false positive | redundant "
             "| missed (detected < 0.5) | detected ≥ 0.8, accuracy < 0.5 "
             "| preprocess s | sort s | KS4 log: preprocessing s | KS4 log: drift s "
             "| unit SNR (median) | unit stability (median) | unit amplitude CV (median) "
             "| noise SD |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['recording']} | {r['arm']} | {r.get('variant', '')} | "
                     f"{fmt(r.get('well_detected'), 'd')} | "
                     f"{fmt(r.get('accuracy_median'), '.3f')} | "
                     f"{fmt(r.get('recall_median'), '.3f')} | "
                     f"{fmt(r.get('precision_median'), '.3f')} | "
                     f"{fmt(r.get('n_found'), 'd')} | {fmt(r.get('false_positive'), 'd')} | "
                     f"{fmt(r.get('redundant'), 'd')} | {fmt(r.get('missed'), 'd')} | "
                     f"{fmt(unmatched_detected(r), 'd')} | "
                     f"{r['preprocess_s']:.2f} | {fmt(r['sort_s'], '.2f')} | "
                     f"{fmt(r.get('ks_preprocess_s'), '.2f')} | {fmt(r.get('ks_drift_s'), '.2f')}"
                     f" | {fmt(r.get('snr_median'), '.2f')} | "
                     f"{fmt(r.get('stability_median'), '.3f')} | "
                     f"{fmt(r.get('amplitude_cv_median'), '.3f')} | "
                     f"{fmt(r.get('noise_sd'), '.3f')} |")
    lines += ["", "## Chains", ""]
    seen = set()
    for r in rows:
        key = (r["arm"], r.get("variant", ""))
        if key not in seen:
            seen.add(key)
            lines.append(f"- `{r['arm']}`{' (' + key[1] + ')' if key[1] else ''}: {r['chain']}")
    return "\n".join(lines) + "\n"


def environment(args) -> dict:
    import platform

    import dspk

    env = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dspk": dspk.__version__,
           "python": platform.python_version(), "cpus": os.cpu_count()}
    for mod in ("spikeinterface", "kilosort", "torch", "numpy"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as exc:       # a missing peer is said, never skipped silently
            env[mod] = f"missing ({type(exc).__name__})"
    try:
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    return env


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--channels", type=int, default=384)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--units", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                   "dspk-bench-sorting"))
    ap.add_argument("--out", default=None, help="folder for the .json and .md")
    ap.add_argument("--machine", default="cpu-2core", help="the machine's name in the file names")
    ap.add_argument("--backend", default=None, help="dspk's --backend (default: its own)")
    ap.add_argument("--device", default="auto", help="Kilosort4's torch device: auto, cpu, cuda")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="workers for the generator and SpikeInterface")
    ap.add_argument("--dspk-motion", default="nonrigid", choices=("rigid", "nonrigid", "none"))
    ap.add_argument("--dspk-steps", default=None,
                    help="the dspk arm as a JSON list of steps (Pipeline.options()' form) run by "
                         "Pipeline.run instead of the CLI's preset (chains the CLI does not spell)")
    ap.add_argument("--ks-on-dspk", default="skip", choices=("skip", "redo"))
    ap.add_argument("--si-preset", default="dredge_fast")
    ap.add_argument("--preprocess-only", action="store_true",
                    help="time the dspk and SpikeInterface chains only (no sort, no scores; "
                         "the kilosort4 arm, whose preprocessing is inside its sort, is "
                         "skipped)")
    ap.add_argument("--diagnose", action="store_true",
                    help="each unit's SNR and stability in the traces each sorter is given")
    ap.add_argument("--keep-traces", action="store_true",
                    help="keep each arm's preprocessed traces (deleted once scored by default)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows of an earlier run in --work (same recording, arm, variant)")
    ap.add_argument("--stop-by", type=float, default=None,
                    help="start no arm after this time (seconds since the epoch, as `date +%%s`"
                         " prints): the rows so far are written")
    ap.add_argument("--dspk-extra", nargs=argparse.REMAINDER, default=[],
                    help="more options for dspk preprocess (last on the line)")
    return ap.parse_args(argv)


def main(argv=None) -> list:
    args = parse(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = environment(args)
    kept = work / f"rows-{args.channels}ch-{args.seconds:g}s-{args.units}u-seed{args.seed}.json"
    rows = json.loads(kept.read_text()) if args.resume and kept.exists() else []
    for variant in args.variants:
        for arm in args.arms:
            if args.preprocess_only and arm == "kilosort4":
                continue
            if any(r["recording"] == variant and r["arm"] == arm
                   and r.get("variant", "") == arm_variant(arm, args) for r in rows):
                continue
            if args.stop_by is not None and time.time() > args.stop_by:
                log(f"--stop-by passed: {arm} {arm_variant(arm, args)} on {variant} not started")
                continue
            rec = generate(variant, args.channels, args.seconds, args.units, args.seed, work,
                           args.jobs)
            rows.append(run_arm(arm, rec, args))
            release_gpu()
            kept.write_text(json.dumps(rows, indent=1))
            write(rows, env, args)
    write(rows, env, args)
    return rows


NOTES = ["rows: each chain's preprocessing wall time, drift correction included (Kilosort4's "
         "from its own log: its preprocessing and drift stages); arms: the sorting outcome"]


def timing_rows(rows: list, args) -> list:
    """The preprocessing times in the form of the other benchmarks' results (``rows`` of
    ``case``, ``impl``, ``wall_s``: `dspk.plot.benchmark_bars` draws them)."""
    out = []
    for r in rows:
        case = (f"{r['recording']} ({args.channels} ch x {args.seconds:g} s): preprocessing, "
                f"drift correction included")
        impl = r["arm"] + (f" ({r['variant']})" if r.get("variant") else "")
        if r["arm"] == "kilosort4":
            if r.get("ks_preprocess_s") is None or r.get("ks_drift_s") is None:
                continue
            out.append(dict(case=case, impl=impl + ": its log's preprocessing + drift",
                            wall_s=round(r["ks_preprocess_s"] + r["ks_drift_s"], 2)))
        else:
            out.append(dict(case=case, impl=impl, wall_s=r["preprocess_s"]))
    return out


def write(rows: list, env: dict, args) -> None:
    md = markdown(rows, env, args)
    print(md, flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"bench_sorting-{args.machine}-{time.strftime('%Y-%m-%d')}"
        payload = dict(env=env, recordings=dict(channels=args.channels, seconds=args.seconds,
                                                units=args.units, seed=args.seed),
                       arms=rows, rows=timing_rows(rows, args), notes=NOTES)
        (out / f"{stem}.json").write_text(json.dumps(payload, indent=1))
        (out / f"{stem}.md").write_text(md)


if __name__ == "__main__":
    main()
