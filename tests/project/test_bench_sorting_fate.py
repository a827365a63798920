"""`bench_sorting.unit_fate`: where each ground-truth unit went in a sorting, whatever the
ground-truth comparison matched (found whole, split, timed off, missed)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

_SPEC = importlib.util.spec_from_file_location(
    "bench_sorting", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sorting.py")
bench_sorting = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench_sorting)
unit_fate = bench_sorting.unit_fate


def _truth(n_units=4, per_unit=200, seed=0):
    rng = np.random.default_rng(seed)
    times = np.sort(rng.choice(np.arange(100, 3_000_000, 97), n_units * per_unit,
                               replace=False))
    units = rng.permutation(np.repeat(np.arange(n_units), per_unit))
    return times, units


def test_a_whole_unit_a_split_one_a_late_one_and_a_missed_one():
    gt_t, gt_u = _truth()
    # unit 0 found whole (2 samples late); unit 1 in two sorted units by halves; unit 2 found
    # 20 samples late (beyond the comparison's 0.4 ms); unit 3 not found
    t0 = gt_t[gt_u == 0] + 2
    t1 = gt_t[gt_u == 1]
    t2 = gt_t[gt_u == 2] + 20
    times = np.concatenate([t0, t1, t2])
    labels = np.concatenate([np.full(len(t0), 7), np.arange(len(t1)) % 2 + 10,
                             np.full(len(t2), 3)])
    fate = unit_fate(gt_t, gt_u, 4, times, labels)
    assert fate["unit_detected"] == [1.0, 1.0, 0.0, 0.0]
    assert fate["unit_lag"][:3] == [2.0, 0.0, 20.0]
    assert fate["unit_lag"][3] is None
    assert fate["unit_pieces"] == [1, 2, 0, 0]
    assert fate["missed"] == 2


def test_no_sorted_spike_misses_every_unit():
    gt_t, gt_u = _truth(n_units=3)
    fate = unit_fate(gt_t, gt_u, 3, np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert fate["missed"] == 3 and fate["unit_pieces"] == [0, 0, 0]


@settings(max_examples=30, deadline=None)
@given(shift=st.integers(-40, 40), seed=st.integers(0, 10))
def test_a_shifted_copy_of_the_truth_is_detected_within_the_window(shift, seed):
    gt_t, gt_u = _truth(seed=seed)
    fate = unit_fate(gt_t, gt_u, 4, gt_t + shift, gt_u)
    inside = abs(shift) <= bench_sorting.DETECT_SAMPLES
    assert fate["unit_detected"] == [1.0 if inside else 0.0] * 4
    assert fate["unit_lag"] == ([float(shift)] * 4 if abs(shift) <= bench_sorting.LAG_SAMPLES
                                else [None] * 4)


def test_a_steps_chain_is_labelled_by_what_it_changes():
    """Two `--dspk-steps` chains of the same steps are two variants (their rows are kept apart
    by --resume): the label names each option set away from the step's default."""
    base = [{"step": "HighPass", "cutoff_hz": 300.0},
            {"step": "Whiten", "mode": "local", "n_neighbors": 32, "eps": None,
             "groups": "none"},
            {"step": "Motion", "mode": "nonrigid", "white": False}]
    white = [dict(s) for s in base]
    white[-1]["white"] = True
    label = [">".join(bench_sorting._step_label(s) for s in chain) for chain in (base, white)]
    assert label == ["HighPass>Whiten>Motion", "HighPass>Whiten>Motion(white=True)"]
    assert bench_sorting._step_label({"step": "HighPass", "cutoff_hz": 150.0}) == \
        "HighPass(cutoff_hz=150.0)"


def test_the_dspk_arm_keeps_the_jobs_timing_lines(tmp_path):
    # the lines bench_sorting keeps of the dspk job's log (`dspk_timing_lines`) are those a
    # real job writes: the fit's split and the job's (a message renamed here fails this)
    import subprocess
    import sys

    x = (np.random.default_rng(0).standard_normal((60000, 8)) * 30).astype(np.int16)
    x.tofile(tmp_path / "raw.bin")
    done = subprocess.run([sys.executable, "-m", "dspk", "preprocess", str(tmp_path / "raw.bin"),
                           str(tmp_path / "out.h5"), "--n-channels", "8", "--fs", "30000",
                           "--whiten", "global", "--quiet", "--no-fsync"],
                          capture_output=True, text=True, check=True)
    lines = bench_sorting.dspk_timing_lines(done.stdout + done.stderr)
    assert any(line.startswith("dspk.pipeline: fit in ") and "Whiten" in line
               for line in lines), lines
    assert any(" samples in " in line for line in lines), lines
    assert any("written in" in line for line in lines), lines
