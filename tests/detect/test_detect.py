"""Spike detection against ground truth (tests/groundtruth.py): recall, precision, timing
tolerance; memory-bounded blocks; bad input."""

import warnings

import numpy as np
import pytest

import dspk
from dspk.detect import SPIKE_DTYPE, default_templates, detect_spikes

from tests.groundtruth import FS, SPECTRA, make, match, probe, shaped_noise


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
    # measured (CPU): recall 0.984, precision 1.0, all within 50 µm
    assert truth_hit[strong].mean() >= 0.96, truth_hit[strong].mean()
    assert found_hit.mean() >= 0.99, found_hit.mean()
    # position: the detecting channel lies near the unit's largest channel
    best = np.abs(d["templates"]).max(axis=2).argmax(axis=1)          # [units]
    nearest = np.abs(found[:, None] - d["times"][None]).argmin(axis=1)
    unit = d["units"][nearest][found_hit]
    g = d["geometry"]
    dist = np.sqrt(((g[spikes["channel_index"][found_hit]] - g[best[unit]]) ** 2).sum(-1))
    assert np.mean(dist <= 50.0) >= 0.98
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


def _unexplained(x, geometry, a, b, threshold=7.0, tol=1e-4, shank_ids=None):
    """The differences between two spike lists of the same data that are not threshold ties:
    a spike in one list only must have a float64 score within ``tol`` (relative) of the
    threshold or of the largest score in its window (its own and neighbouring positions,
    ±dead); a common spike with different templates must have its two best templates within
    ``tol``. Returns a list of descriptions (empty when every difference is a tie)."""
    from dspk.detect import _neighbourhoods

    x = np.asarray(x, dtype=np.float64)
    n = x.shape[1]
    bank = default_templates(FS)
    taps = bank.shape[1]
    shift = taps // 2 - 20
    dead = int(round(0.67e-3 * FS))
    nbr, w = _neighbourhoods(np.asarray(geometry, np.float64), 10,
                             (10.0, 20.0, 30.0, 40.0, 50.0), shank_ids)
    b64 = dspk.fir_bank(x, bank)                                        # [C, k, n]

    def per_template(p, ts):                                            # [k, len(ts)]
        return np.einsum("sj,jkt->skt", w[p], b64[nbr[p]][:, :, ts]).max(axis=0)

    keys_a = {(int(s), int(c)): int(k) for s, c, k in
              zip(a["sample_index"], a["channel_index"], a["template_index"])}
    keys_b = {(int(s), int(c)): int(k) for s, c, k in
              zip(b["sample_index"], b["channel_index"], b["template_index"])}
    bad = []
    for key in set(keys_a) ^ set(keys_b):
        t, p = key[0] + shift, key[1]
        s = per_template(p, [t]).max()
        if abs(s - threshold) <= tol * threshold:
            continue
        ts = np.arange(max(0, t - dead), min(n, t + dead + 1))
        rows = [p] + [int(q) for q in nbr[p, 1:]]
        window = np.stack([per_template(q, ts).max(axis=0) for q in rows])
        window[0, ts == t] = -np.inf
        if abs(window.max() - s) <= tol * abs(s):
            continue
        bad.append(f"spike {key} in one list only: score {s:.6f}, window max "
                   f"{window.max():.6f}")
    for key in set(keys_a) & set(keys_b):
        if keys_a[key] != keys_b[key]:
            m = np.sort(per_template(key[1], [key[0] + shift])[:, 0])
            if len(m) < 2 or m[-1] - m[-2] > tol * abs(m[-1]):
                bad.append(f"spike {key}: templates {keys_a[key]} and {keys_b[key]}, "
                           f"best two scores {m[-2:]}")
    return bad


def test_time_blocks_cover_every_sample_once():
    from dspk.detect._gpu import block_samples, time_blocks

    for n, taps, block in ((1000, 61, 1), (1000, 61, 7), (1000, 61, 512), (1000, 61, 999),
                           (1000, 61, 5000), (61, 61, 3), (130, 21, 64)):
        h = taps // 2
        cover = []
        for t0, t1, lo, hi in time_blocks(n, taps, block):
            assert 0 <= lo <= t0 < t1 <= hi <= n and t1 - t0 <= block
            assert hi - lo >= taps                          # fir_bank's minimum length
            assert lo == 0 or lo <= t0 - h                  # real data under every output
            assert hi == n or hi >= t1 + h
            cover.extend(range(t0, t1))
        assert cover == list(range(n))
    # the bank output of a block stays within memory_bytes
    blk = block_samples(384, 6, 61, 4, 256 << 20)
    assert (blk + 60) * 384 * 6 * 4 <= 256 << 20 and blk > 20000
    assert block_samples(384, 6, 61, 4, 1000) == 1


def test_fused_reason():
    from dspk.detect._gpu import fused_reason

    x = np.zeros((4, 100), np.float32)
    assert fused_reason(x, 6, 5, 10) is None
    assert fused_reason(x.astype(np.float64), 6, 5, 10) is None
    assert "dtype" in fused_reason(x.astype(np.float16), 6, 5, 10)
    assert "widths" in fused_reason(x, 6, 9, 10)
    assert "neighbours" in fused_reason(x, 6, 5, 65)
    assert "templates" in fused_reason(x, 128, 5, 10)


def test_unexplained_differences_helper(whitened):
    """The tie check used by the GPU comparison finds a real difference."""
    d = whitened
    x = d["xw"][:, :20000]
    a = detect_spikes(x, d["geometry"], FS)
    assert _unexplained(x, d["geometry"], a, a) == []
    assert len(a) > 2
    assert len(_unexplained(x, d["geometry"], a, a[1:])) == 1
    other = a.copy()
    other["template_index"][0] = (other["template_index"][0] + 1) % 6
    assert len(_unexplained(x, d["geometry"], a, other)) == 1


@pytest.mark.gpu
def test_gpu_detection_equals_cpu(whitened):
    """The fused kernels (CuPy) against the engine path (NumPy) on ground truth: the same
    spikes and templates except threshold ties, amplitudes within float32 tolerance."""
    import cupy as cp

    d = whitened
    x = d["xw"][:, :60000]
    cpu = detect_spikes(x, d["geometry"], FS)
    for mem in (256 << 20, 1 << 20):                       # one block; blocks of ~600 samples
        gpu = detect_spikes(cp.asarray(x), d["geometry"], FS, memory_bytes=mem)
        assert gpu.dtype == SPIKE_DTYPE
        assert _unexplained(x, d["geometry"], cpu, gpu) == []
        assert abs(len(gpu) - len(cpu)) <= max(2, len(cpu) // 100)
        both, ia, ib = np.intersect1d(cpu["sample_index"] * 1000 + cpu["channel_index"],
                                      gpu["sample_index"] * 1000 + gpu["channel_index"],
                                      return_indices=True)
        assert len(both) >= len(cpu) - max(2, len(cpu) // 100)
        np.testing.assert_allclose(gpu["amplitude"][ib], cpu["amplitude"][ia], rtol=1e-4)
        np.testing.assert_array_equal(gpu["x"], d["geometry"][gpu["channel_index"], 0])
    # float64 input: the GPU path in float64 against the CPU in float64
    x64 = x[:, :20000].astype(np.float64)
    cpu64 = detect_spikes(x64, d["geometry"], FS)
    gpu64 = detect_spikes(cp.asarray(x64), d["geometry"], FS)
    assert _unexplained(x64, d["geometry"], cpu64, gpu64, tol=1e-9) == []


@pytest.mark.gpu
def test_gpu_engine_fallback_agrees(whitened, monkeypatch):
    """With the fused kernels refused (fused_reason), CuPy input takes the engine path and
    finds the same spikes as the fused path."""
    import cupy as cp

    import dspk.detect.spikes as det

    d = whitened
    x = cp.asarray(d["xw"][:, :30000])
    fused = detect_spikes(x, d["geometry"], FS)
    monkeypatch.setattr(det, "fused_reason", lambda *a, **k: "forced by the test")
    engine = detect_spikes(x, d["geometry"], FS)
    assert _unexplained(d["xw"][:, :30000], d["geometry"], engine, fused) == []
    assert abs(len(engine) - len(fused)) <= 2


def _reference_scores(x, bank, nbr, w, inv_sd=None):
    """float64 evaluation of the definition: score, best template, the two best template
    maxima (for ties)."""
    b = dspk.fir_bank(np.asarray(x, np.float64), np.asarray(bank, np.float64))   # [C, k, n]
    if inv_sd is not None:
        b = b * np.asarray(inv_sd, np.float64)[:, :, None]
    v = np.einsum("psj,pjkt->pskt", np.asarray(w, np.float64), b[nbr])           # [P, S, k, n]
    m = v.max(axis=1)
    return m.max(axis=1), m.argmax(axis=1), np.sort(m, axis=1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("C, nn, S, k, n, taps, block", [
    (5, 3, 2, 3, 700, 21, None),           # one block, n not a multiple of the 512-sample tile
    (7, 4, 5, 6, 1300, 61, 200),           # blocks of 200: block edges inside the tiles
    (3, 3, 1, 2, 130, 61, 1),              # one sample per block (a launch per sample)
    (6, 6, 3, 4, 1029, 31, 517),           # a block longer than a tile, short last block
    (4, 2, 8, 1, 640, 61, 100),            # 8 widths, 1 template
    (40, 12, 5, 6, 3001, 61, 1000),        # more neighbours than the default
    (2, 1, 5, 6, 61, 61, None),            # n = taps, one neighbour
])
def test_gpu_scores_match_float64_definition(C, nn, S, k, n, taps, block, dtype):
    import cupy as cp

    from dspk.detect import _gpu as _detect_gpu
    from dspk.detect import _neighbourhoods

    rng = np.random.default_rng(C * 1000 + n)
    g = rng.uniform(0, 100, (C, 2))
    nbr, w = _neighbourhoods(g, nn, tuple(np.linspace(10, 50, S)), None)
    bank = rng.standard_normal((k, taps))
    bank = (bank / np.linalg.norm(bank, axis=1, keepdims=True)).astype(dtype)
    x = rng.standard_normal((C, n)).astype(dtype)
    inv_sd = rng.uniform(0.3, 1.5, (C, k)).astype(dtype)     # each channel's and template's own
    inv_sd[0, 0] = 0                                          # a dead output contributes nothing
    isz = np.dtype(dtype).itemsize
    mem = 1 << 30 if block is None else C * k * isz * (block + taps - 1)
    if block is not None:
        assert _detect_gpu.block_samples(C, k, taps, isz, mem) == block
    score, best_k = _detect_gpu.scores(cp.asarray(x), bank, nbr, w.astype(dtype), inv_sd, mem)
    assert score.dtype == dtype and best_k.dtype == np.int8 and score.shape == (C, n)
    ref, ref_k, two = _reference_scores(x, bank, nbr, w.astype(dtype), inv_sd)
    scale = np.abs(ref).max()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(score.get(), ref, rtol=0, atol=tol * scale)
    clear = (two[:, -1] - two[:, -2] > 1e-4 * scale) if k > 1 else np.ones(ref.shape, bool)
    np.testing.assert_array_equal(best_k.get()[clear], ref_k[clear])
    # the same through one whole-batch block (the bank's tuner may choose another method
    # for another size: equal within tolerance, not necessarily bit for bit)
    whole, _ = _detect_gpu.scores(cp.asarray(x), bank, nbr, w.astype(dtype), inv_sd, 1 << 30)
    np.testing.assert_allclose(whole.get(), score.get(), rtol=0, atol=tol * scale)


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(6))
def test_gpu_peaks_equal_local_maxima(case):
    """The peaks kernel against _local_maxima on the same score array (exact: plateaus and
    ties included), with room for one peak too few so that the rerun on overflow runs."""
    import cupy as cp

    from dspk.detect import _gpu as _detect_gpu
    from dspk.detect import _local_maxima, _neighbourhoods

    rng = np.random.default_rng(case)
    C = int(rng.integers(1, 12))
    nn = int(rng.integers(1, C + 1))
    n = int(rng.integers(50, 1500))
    g = rng.uniform(0, 60, (C, 2))
    if case == 2:
        g[:] = 0.0                       # one place: nbr[p, 0] is not p for p > 0
    nbr, _ = _neighbourhoods(g, nn, (20.0,), None)
    dtype = np.float32 if case % 2 == 0 else np.float64
    score = np.round(rng.standard_normal((C, n)) * 2, 0 if case < 4 else 3).astype(dtype)
    dead = int(rng.integers(1, 25))
    rp, rt = _local_maxima(np, score, nbr, 1.0, dead)
    assert len(rp) >= 2
    p, t = _detect_gpu.peaks(cp.asarray(score), nbr, 1.0, dead, capacity=len(rp) - 1)
    assert p.dtype == np.int64 and t.dtype == np.int64
    o, r = np.lexsort((p, t)), np.lexsort((rp, rt))
    np.testing.assert_array_equal(p[o], rp[r])
    np.testing.assert_array_equal(t[o], rt[r])


@pytest.mark.gpu
def test_gpu_shanks_are_kept_apart():
    import cupy as cp

    rng = np.random.default_rng(5)
    one = probe(16)
    geom = np.concatenate([one, one + [12.0, 0.0]])
    shanks = np.repeat([0, 1], 16)
    x = 0.3 * rng.standard_normal((32, 6000)).astype(np.float32)
    wave = default_templates()[2] / np.abs(default_templates()[2]).max()
    x[4, 3000:3061] += 15 * wave
    x[16 + 4, 3000:3061] += 9 * wave
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = detect_spikes(cp.asarray(x), geom, FS, shank_ids=cp.asarray(shanks))
        cpu = detect_spikes(x, geom, FS, shank_ids=shanks)
        merged = detect_spikes(cp.asarray(x), geom, FS)
    at = got[np.abs(got["sample_index"] - 3020) <= 2]
    assert sorted(shanks[at["channel_index"]]) == [0, 1]
    assert len(merged[np.abs(merged["sample_index"] - 3020) <= 2]) == 1
    assert _unexplained(x, geom, cpu, got, shank_ids=shanks) == []


@pytest.mark.gpu
def test_gpu_no_spikes_and_one_channel():
    import cupy as cp

    rng = np.random.default_rng(1)
    quiet = rng.standard_normal((8, 3000)).astype(np.float32)
    out = detect_spikes(cp.asarray(quiet), probe(8), FS, threshold=50.0)
    assert out.dtype == SPIKE_DTYPE and len(out) == 0
    one = rng.standard_normal((1, 3000)).astype(np.float32)
    one[0, 1000:1061] += 12 * default_templates()[0] / np.abs(default_templates()[0]).max()
    got = detect_spikes(cp.asarray(one), np.zeros((1, 2)), FS)
    assert got.dtype == SPIKE_DTYPE
    assert any(abs(int(t) - 1020) <= 2 for t in got["sample_index"])
    cpu = detect_spikes(one, np.zeros((1, 2)), FS)
    assert _unexplained(one, np.zeros((1, 2)), cpu, got) == []


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
    # a geometry given as nested lists gives the same clips as the array
    from dspk.detect import spike_clips

    clips, ch = spike_clips(d["xw"], spikes[:20], d["geometry"], FS)
    clips_l, ch_l = spike_clips(d["xw"], spikes[:20], np.asarray(d["geometry"]).tolist(), FS)
    np.testing.assert_array_equal(clips_l, clips)
    np.testing.assert_array_equal(ch_l, ch)


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


@pytest.mark.slow
@pytest.mark.parametrize("spectrum", SPECTRA)
def test_precision_holds_on_any_noise_spectrum(spectrum):
    """Whitened traces have unit variance per channel but not a white spectrum: on white,
    band-limited (300–6000 Hz) and 1/f-tilted noise the threshold means the same false-alarm
    rate, because it is in units of each template output's measured noise."""
    geom = probe(96)
    d = make(seconds=3.0, geometry=geom, spectrum=spectrum, noise_um=1e-3, seed=11)
    spikes = detect_spikes(d["x"], geom, FS)
    truth_hit, found_hit = match(spikes["sample_index"], d["times"], tolerance=12)
    strong = np.isin(d["units"], np.flatnonzero(d["snr"] >= 5))
    # measured (CPU): recall 0.992 / 0.986 / 0.979 (white, band, pink), precision 1.0, and
    # no detection at all in 2 s of 384 channels of noise alone
    assert truth_hit[strong].mean() >= 0.95, truth_hit[strong].mean()
    assert found_hit.mean() >= 0.99, found_hit.mean()
    quiet = shaped_noise(384, int(2 * FS), spectrum, seed=12).astype(np.float32)
    false = detect_spikes(quiet, probe(384), FS)
    assert len(false) <= 1, len(false)          # < 0.25 per second per 100 channels


def test_template_noise_measures_each_output():
    from dspk.detect import template_noise

    white = shaped_noise(8, 60000, "white", seed=3).astype(np.float32)
    band = shaped_noise(8, 60000, "band", seed=3).astype(np.float32)
    sd_w, sd_b = template_noise(white, FS), template_noise(band, FS)
    assert sd_w.shape == (8, 6) and np.all(np.abs(sd_w - 1) < 0.05)     # measured 0.042
    # band-limited noise puts more power where a spike's power is: every output noisier
    assert np.all(sd_b > 1.3)
    # the measured noise is the template output's SD, robust to spikes (MAD)
    b = dspk.fir_bank(band.astype(np.float64), default_templates() /
                      np.linalg.norm(default_templates(), axis=1, keepdims=True))
    np.testing.assert_allclose(sd_b, b.std(axis=2), rtol=0.05)
    spiky = band.copy()                                    # 10 big spikes/s on every channel
    spiky[:, ::3000] += 40.0
    np.testing.assert_allclose(template_noise(spiky, FS), sd_b, rtol=0.05)
    assert np.all(spiky.std(axis=1) > 1.05 * band.std(axis=1))   # a plain SD would not be


def test_noise_given_is_used_and_checked():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6000)).astype(np.float32)
    x[1, 3000:3061] += 9 * default_templates()[0] / np.abs(default_templates()[0]).max()
    geom = probe(4)
    from dspk.detect import template_noise

    sd = template_noise(x, FS)
    np.testing.assert_array_equal(detect_spikes(x, geom, FS, noise=sd),
                                  detect_spikes(x, geom, FS))
    assert len(detect_spikes(x, geom, FS, noise=sd * 3)) == 0       # 3x the noise: nothing
    with pytest.raises(ValueError, match=r"noise: expected .*\[4, 6\]"):
        detect_spikes(x, geom, FS, noise=np.ones((4, 5)))
    with pytest.raises(ValueError, match="noise: expected finite"):
        detect_spikes(x, geom, FS, noise=np.full((4, 6), np.nan))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [3000, 60000])
def test_gpu_template_noise_equals_cpu(n):
    """The GPU computes only the sampled outputs (windows gathered, times the bank); the CPU
    takes them from the whole fir_bank output: the same SDs within float rounding."""
    import cupy as cp

    from dspk.detect import template_noise

    x = shaped_noise(40, n, "band", seed=4).astype(np.float32)
    np.testing.assert_allclose(template_noise(cp.asarray(x), FS), template_noise(x, FS),
                               rtol=2e-5)


@pytest.mark.gpu
def test_gpu_learn_templates_equal_cpu(whitened):
    """Crossings found, waveforms gathered and k-means run on the device: the same templates
    as on the host within float rounding."""
    import cupy as cp

    from dspk.detect import learn_templates

    d = whitened
    cpu = learn_templates(d["xw"], FS, seed=3)
    gpu = learn_templates(cp.asarray(d["xw"]), FS, seed=3)
    assert isinstance(gpu, np.ndarray) and gpu.shape == cpu.shape
    np.testing.assert_allclose(gpu, cpu, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, m", [(np.float32, 8191), (np.float32, 1), (np.float64, 2999),
                                      (np.float64, 8191), (np.float32, 20001)])
def test_gpu_abs_median_is_numpys(dtype, m):
    """The bisection (in shared memory, or with array operations for rows that do not fit)
    lands on the middle value itself."""
    import cupy as cp

    from dspk.detect import _abs_median

    a = np.random.default_rng(m).standard_normal((5, 7, m)).astype(dtype)
    a[0, 0] = 0.0                                              # a flat row
    a[1, 1, : m // 2] = 3.0                                    # ties at the middle
    np.testing.assert_array_equal(_abs_median(cp, cp.asarray(a)).get(),
                                  np.median(np.abs(a), axis=-1))
