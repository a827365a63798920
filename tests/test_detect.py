"""Spike detection against ground truth (tests/groundtruth.py): recall, precision, timing
tolerance; memory-bounded blocks; bad input."""

import warnings

import numpy as np
import pytest

import dspk
from dspk.detect import SPIKE_DTYPE, default_templates, detect_spikes

from .groundtruth import FS, make, match, probe


@pytest.fixture(scope="module")
def whitened():
    d = make()
    w = dspk.whitening_matrix(dspk.covariance(d["x"]))
    d["xw"] = dspk.spatial_filter(w, d["x"])
    return d


def test_recall_and_precision_on_ground_truth(whitened):
    d = whitened
    spikes = detect_spikes(d["xw"], d["geometry"], FS)
    assert spikes.dtype == SPIKE_DTYPE
    assert np.all(np.diff(spikes["sample_index"]) >= 0)
    found = spikes["sample_index"]
    truth_hit, found_hit = match(found, d["times"], tolerance=int(0.4e-3 * FS))   # ±0.4 ms
    strong = np.isin(d["units"], np.flatnonzero(d["snr"] >= 5))
    assert truth_hit[strong].mean() >= 0.9
    assert found_hit.mean() >= 0.95
    # position: the detecting channel lies near the unit's largest channel
    best = np.abs(d["templates"]).max(axis=2).argmax(axis=1)          # [units]
    nearest = np.abs(found[:, None] - d["times"][None]).argmin(axis=1)
    unit = d["units"][nearest][found_hit]
    g = d["geometry"]
    dist = np.sqrt(((g[spikes["channel_index"][found_hit]] - g[best[unit]]) ** 2).sum(-1))
    assert np.mean(dist <= 50.0) >= 0.9
    np.testing.assert_array_equal(spikes["x"], g[spikes["channel_index"], 0])
    assert np.all(np.isin(spikes["template_index"], np.arange(6)))


def test_memory_budget_changes_nothing(whitened):
    d = whitened
    x = d["xw"][:, :30000]
    a = detect_spikes(x, d["geometry"], FS)
    b = detect_spikes(x, d["geometry"], FS, memory_bytes=1 << 20)     # many time blocks
    np.testing.assert_array_equal(a, b)


def test_no_spikes_and_one_channel():
    rng = np.random.default_rng(1)
    quiet = rng.standard_normal((8, 3000)).astype(np.float32)
    out = detect_spikes(quiet, probe(8), FS, threshold=50.0)
    assert out.dtype == SPIKE_DTYPE and len(out) == 0
    one = rng.standard_normal((1, 3000)).astype(np.float32)
    one[0, 1000:1061] += 12 * default_templates()[0] / np.abs(default_templates()[0]).max()
    got = detect_spikes(one, np.zeros((1, 2)), FS)
    assert any(abs(int(t) - 1020) <= 2 for t in got["sample_index"])


def test_default_templates():
    t = default_templates()
    assert t.shape == (6, 61) and np.allclose(np.linalg.norm(t, axis=1), 1)
    assert np.all(t.argmin(axis=1) == 20)


def test_bad_input():
    x = np.random.default_rng(2).standard_normal((4, 2000)).astype(np.float32)
    with pytest.raises(ValueError, match="geometry: detection needs"):
        detect_spikes(x, None, FS)
    with pytest.raises(ValueError, match=r"geometry: expected \[4, 2\]"):
        detect_spikes(x, np.zeros((3, 2)), FS)
    with pytest.raises(ValueError, match="templates: expected"):
        detect_spikes(x, probe(4), FS, templates=np.ones((2, 60)))
    with pytest.raises(ValueError, match="threshold: expected a positive"):
        detect_spikes(x, probe(4), FS, threshold=0)
    with pytest.warns(UserWarning, match="expects whitened data"):
        detect_spikes(x * 50, probe(4), FS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        detect_spikes(x, probe(4), FS)                 # whitened-looking: no warning


@pytest.mark.gpu
def test_gpu_detection_equals_cpu(whitened):
    import cupy as cp

    d = whitened
    x = d["xw"][:, :60000]
    cpu = detect_spikes(x, d["geometry"], FS)
    gpu = detect_spikes(cp.asarray(x), d["geometry"], FS)
    np.testing.assert_array_equal(gpu[["sample_index", "channel_index", "template_index"]],
                                  cpu[["sample_index", "channel_index", "template_index"]])
    np.testing.assert_allclose(gpu["amplitude"], cpu["amplitude"], rtol=1e-4)


def test_learned_templates_detect_as_well(whitened):
    from dspk.detect import learn_templates

    d = whitened
    bank = learn_templates(d["xw"], FS, seed=3)
    assert bank.shape == (6, 61) and np.all(bank.argmin(axis=1) == 20)
    assert np.allclose(np.linalg.norm(bank, axis=1), 1)
    np.testing.assert_array_equal(bank, learn_templates(d["xw"], FS, seed=3))  # reproducible
    spikes = detect_spikes(d["xw"], d["geometry"], FS, templates=bank)
    truth_hit, found_hit = match(spikes["sample_index"], d["times"], tolerance=12)
    strong = np.isin(d["units"], np.flatnonzero(d["snr"] >= 5))
    assert truth_hit[strong].mean() >= 0.9 and found_hit.mean() >= 0.95
    with pytest.raises(ValueError, match="isolated crossings"):
        learn_templates(d["xw"][:, :3000], FS, threshold=40.0)


def test_spike_features(whitened):
    from dspk.detect import spike_features

    d = whitened
    spikes = detect_spikes(d["xw"], d["geometry"], FS)
    feats, chans, pca = spike_features(d["xw"], spikes, d["geometry"], FS, n_components=3)
    assert feats.shape == (len(spikes), 10, 3) and feats.dtype == np.float32
    np.testing.assert_array_equal(chans[:, 0], spikes["channel_index"])   # own channel first
    # the features of the spikes of two different units are far apart compared to their spread
    nearest = np.abs(spikes["sample_index"][:, None] - d["times"][None]).argmin(axis=1)
    unit = d["units"][nearest]
    a, b = (feats[unit == u, 0] for u in np.argsort(d["snr"])[-2:])
    gap = np.linalg.norm(a.mean(axis=0) - b.mean(axis=0))
    assert gap > 2 * max(a.std(axis=0).mean(), b.std(axis=0).mean())
    again, _, _ = spike_features(d["xw"], spikes, d["geometry"], FS, pca=pca)
    np.testing.assert_array_equal(again, feats)
    with pytest.raises(ValueError, match="geometry: expected"):
        spike_features(d["xw"], spikes, d["geometry"][:5], FS)


def test_shanks_are_kept_apart():
    """Two shanks at the same depths: a spike on one is found there only, and a simultaneous
    spike on the other shank is not suppressed by it."""
    rng = np.random.default_rng(5)
    one = probe(16)
    geom = np.concatenate([one, one + [12.0, 0.0]])   # interleaved shanks, 12 µm apart
    shanks = np.repeat([0, 1], 16)
    x = 0.3 * rng.standard_normal((32, 6000)).astype(np.float32)
    wave = default_templates()[2] / np.abs(default_templates()[2]).max()
    x[4, 3000:3061] += 15 * wave                  # shank 0, (0, 40) µm
    x[16 + 4, 3000:3061] += 9 * wave              # shank 1, (12, 40) µm, same time, smaller
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")           # low noise: "not whitened" is expected
        got = detect_spikes(x, geom, FS, shank_ids=shanks)
        merged = detect_spikes(x, geom, FS)
    at = got[np.abs(got["sample_index"] - 3020) <= 2]
    assert sorted(shanks[at["channel_index"]]) == [0, 1]
    # without shank ids the larger spike suppresses the neighbouring smaller one
    assert len(merged[np.abs(merged["sample_index"] - 3020) <= 2]) == 1
    with pytest.raises(ValueError, match="shank_ids: expected one shank per channel"):
        detect_spikes(x, geom, FS, shank_ids=shanks[:5])
