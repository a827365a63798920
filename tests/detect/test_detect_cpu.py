"""The CPU detection path (`dspk.detect._cpu_spikes`: a bound on the score, scores only where it
reaches the threshold, maxima among the points above it) against the straightforward one it
replaced on NumPy input, which CuPy input the fused kernels cannot take still goes through
(`_engine_scores`: every score of every position and sample; `_local_maxima`: dense maximum
filters): the same spikes, amplitudes to the bit. Coloured noise, random geometries, banks,
widths, thresholds, time blocks (memory budgets) and batch lengths, both float dtypes."""

import warnings
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dspk
from dspk.detect import (SPIKE_DTYPE, _engine_scores, _host_abs_median, _inverse_noise,
                         _local_maxima, _neighbourhoods, _sparse_maxima, _template_noise,
                         default_templates, detect_spikes)
from dspk.linalg import Engine, current_engine
from dspk.ops.fir_cpu import toeplitz_correlate

from tests.groundtruth import FS, shaped_noise


def _reference(x, geometry, templates, threshold, n_neighbors, widths, dead_ms, memory,
               shanks, noise):
    """detect_spikes as it was before the CPU path (the engine path on NumPy), its bank by the
    Toeplitz products (`toeplitz_correlate`: the CPU path computes those products itself, in
    blocks; the tuner's other choices for `dspk.fir_bank` round differently)."""
    with mock.patch("dspk.detect.spikes.fir_bank", toeplitz_correlate):
        return _dense(x, geometry, templates, threshold, n_neighbors, widths, dead_ms, memory,
                      shanks, noise)


def _dense(x, geometry, templates, threshold, n_neighbors, widths, dead_ms, memory, shanks,
           noise):
    c, n = x.shape
    bank = default_templates(FS) if templates is None else np.asarray(templates, np.float64)
    bank = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    k, taps = bank.shape
    nbr, w = _neighbourhoods(np.asarray(geometry, np.float64), n_neighbors, widths, shanks)
    inv_sd = None if noise is None else _inverse_noise(noise, c, k)
    dead = max(1, int(round(dead_ms * 1e-3 * FS)))
    score, best_k = _engine_scores(np, x, bank, nbr, w, inv_sd, memory)
    p, t = _local_maxima(np, score, nbr, threshold, dead)
    order = np.lexsort((p, t))
    p, t = p[order], t[order]
    out = np.empty(len(t), dtype=SPIKE_DTYPE)
    out["sample_index"] = t - (taps // 2 - 20)
    out["channel_index"] = p
    out["amplitude"] = score[p, t]
    out["template_index"] = best_k[p, t]
    out["x"], out["y"] = geometry[p, 0], geometry[p, 1]
    return out


def _spiky(rng, c, n, spectrum, dtype, geometry, rate=0.02, amp=(2.0, 30.0)):
    """Coloured unit-variance noise with spikes of random size (near the threshold, too) on
    random channels, decaying over ~25 µm."""
    x = shaped_noise(c, n, spectrum, seed=int(rng.integers(2**31))).astype(np.float64)
    wave = default_templates()[int(rng.integers(6))]
    wave = wave / np.abs(wave).max()
    for t in rng.integers(0, n, max(1, int(rate * n))):
        ch = int(rng.integers(c))
        d = np.sqrt(((geometry - geometry[ch]) ** 2).sum(-1))
        a = rng.uniform(*amp) * np.exp(-d / 25.0)
        lo, hi = max(0, t - 20), min(n, t + 41)
        x[:, lo:hi] += a[:, None] * wave[None, lo - (t - 20):hi - (t - 20)]
    return x.astype(dtype)


def _assert_same(got, want):
    assert got.dtype == SPIKE_DTYPE
    np.testing.assert_array_equal(got["sample_index"], want["sample_index"])
    np.testing.assert_array_equal(got["channel_index"], want["channel_index"])
    np.testing.assert_array_equal(got["amplitude"].view(np.uint32),
                                  want["amplitude"].view(np.uint32))     # to the bit
    np.testing.assert_array_equal(got["template_index"], want["template_index"])
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), c=st.integers(1, 40), n=st.integers(3, 4000),
       nn=st.integers(1, 12), widths=st.integers(1, 6), k=st.integers(1, 7),
       taps=st.sampled_from([1, 3, 21, 61]), memory=st.sampled_from([1, 3000, 1 << 16, 1 << 27]),
       threshold=st.sampled_from([1.5, 3.0, 5.0, 7.0, 6.3]),
       dead=st.sampled_from([0.02, 0.67, 2.0]),
       dtype=st.sampled_from([np.float32, np.float64]),
       spectrum=st.sampled_from(["white", "band", "pink"]), layout=st.integers(0, 3),
       noise_given=st.booleans())
def test_cpu_path_equals_the_dense_engine_path(seed, c, n, nn, widths, k, taps, memory, threshold,
                                               dead, dtype, spectrum, layout, noise_given):
    rng = np.random.default_rng(seed)
    taps = min(taps, n if n % 2 else n - 1) if n > 1 else 1
    if layout == 0:                                    # a random layout
        g = rng.uniform(0, 120, (c, 2))
    elif layout == 1:                                  # a column, channels in random order
        g = np.c_[np.zeros(c), 20.0 * rng.permutation(c)]
    elif layout == 2:                                  # several channels at one place
        g = np.round(rng.uniform(0, 40, (c, 2)) / 20) * 20
    else:                                              # Neuropixels-like, two shanks
        rows = np.arange(c) // 2
        g = np.c_[np.where(np.arange(c) % 2, 32.0, 0.0) + 16.0 * (rows % 2), 20.0 * rows]
    shanks = (np.arange(c) >= c // 2).astype(np.int64) if layout == 3 and c > 1 else None
    if taps == 61:                                     # shapes of spikes
        bank = default_templates()[rng.integers(0, 6, k)] + 0.05 * rng.standard_normal((k, 61))
    else:
        bank = rng.standard_normal((k, taps))
        bank[:, taps // 2] -= 2.0                      # a trough: spikes correlate positively
    wid = tuple(float(v) for v in np.sort(rng.uniform(5, 60, widths)))
    x = _spiky(rng, c, n, spectrum, dtype, g)
    noise = rng.uniform(0.5, 2.0, (c, k)) if noise_given else None
    if noise is not None and c > 1:
        noise[rng.integers(c), rng.integers(k)] = 0.0   # a dead output: ignored
    with warnings.catch_warnings(), Engine(mode="off"):  # BLAS for every product
        warnings.simplefilter("ignore")
        want = _reference(x, g, bank, threshold, nn, wid, dead, memory, shanks, noise)
        got = detect_spikes(x, g, FS, templates=bank, threshold=threshold, n_neighbors=nn,
                            widths_um=wid, dead_time_ms=dead, memory_bytes=memory,
                            shank_ids=shanks, noise=noise)
    _assert_same(got, want)


@pytest.mark.parametrize("spectrum", ["white", "band"])
def test_cpu_path_on_a_neuropixels_batch(spectrum):
    """384 channels x 0.3 s, ~750 spikes/s, default parameters (the engine tuning as it
    would in use), then the memory budget of many small blocks."""
    rng = np.random.default_rng(7)
    rows = np.arange(384) // 2
    g = np.c_[np.where(np.arange(384) % 2, 32.0, 0.0) + 16.0 * (rows % 2), 20.0 * rows]
    x = _spiky(rng, 384, 9000, spectrum, np.float32, g, rate=0.025, amp=(5.0, 25.0))
    want = _reference(x, g, None, 7.0, 10, (10.0, 20.0, 30.0, 40.0, 50.0), 0.67, 128 << 20,
                      None, None)
    assert len(want) > 100
    _assert_same(detect_spikes(x, g, FS), want)
    _assert_same(detect_spikes(x, g, FS, memory_bytes=1 << 18), want)
    _assert_same(detect_spikes(x, g, FS, threshold=4.0),
                 _reference(x, g, None, 4.0, 10, (10.0, 20.0, 30.0, 40.0, 50.0), 0.67,
                            128 << 20, None, None))


def test_amplitudes_are_the_float64_scores():
    """Each spike's amplitude is its score by the definition (float64, einsum), and no score
    of the definition above the threshold is a missed local maximum."""
    rng = np.random.default_rng(3)
    g = rng.uniform(0, 80, (24, 2))
    x = _spiky(rng, 24, 4000, "band", np.float32, g, rate=0.01)
    spikes = detect_spikes(x, g, FS)
    bank = default_templates()
    nbr, w = _neighbourhoods(g, 10, (10.0, 20.0, 30.0, 40.0, 50.0), None)
    b = dspk.fir_bank(x.astype(np.float64), bank)
    b = b / _template_noise(x, bank)[:, :, None]
    v = np.einsum("psj,pjkt->pskt", w, b[nbr]).max(axis=1)               # [P, k, n]
    score = v.max(axis=1)
    t = spikes["sample_index"] + 10
    np.testing.assert_allclose(spikes["amplitude"], score[spikes["channel_index"], t],
                               rtol=2e-5)
    np.testing.assert_array_equal(spikes["template_index"],
                                  v.argmax(axis=1)[spikes["channel_index"], t])
    p, t = _local_maxima(np, score, nbr, 7.0, 20)
    assert len(p) == len(spikes)


@pytest.mark.parametrize("case", range(8))
def test_sparse_maxima_equal_local_maxima(case):
    """The maxima among the points above the threshold are those of the dense filters on the
    whole score array: plateaus, ties, channels at one place, windows cut by the batch's
    edges."""
    rng = np.random.default_rng(case)
    c = int(rng.integers(1, 30))
    nn = int(rng.integers(1, c + 1))
    n = int(rng.integers(1, 800))
    g = rng.uniform(0, 60, (c, 2))
    if case == 2:
        g[:] = 0.0                                     # nbr[p, 0] is not p
    nbr, _ = _neighbourhoods(g, nn, (20.0,), None)
    dtype = np.float32 if case % 2 == 0 else np.float64
    score = np.round(rng.standard_normal((c, n)) * 2, 0 if case < 4 else 3).astype(dtype)
    dead = int(rng.integers(1, 30))
    threshold = float(rng.choice([0.5, 1.0, 2.0]))
    rp, rt = _local_maxima(np, score, nbr, threshold, dead)
    p, t = np.nonzero(score >= threshold)
    keep = _sparse_maxima(p, t, score[p, t], nbr, dead, n)
    o, r = np.lexsort((p[keep], t[keep])), np.lexsort((rp, rt))
    np.testing.assert_array_equal(p[keep][o], rp[r])
    np.testing.assert_array_equal(t[keep][o], rt[r])
    assert _sparse_maxima(p[:0], t[:0], score[p[:0], t[:0]], nbr, dead, n).shape == (0,)


@pytest.mark.parametrize("dtype, m", [(np.float32, 8191), (np.float64, 8191), (np.float32, 1),
                                      (np.float32, 2999), (np.float64, 4), (np.float32, 600)])
def test_host_abs_median_is_numpys(dtype, m):
    """The rows partitioned in place in blocks give np.median's values: ties, zeros, a NaN
    (that row NaN, the others exact), infinities, even lengths."""
    rng = np.random.default_rng(m)
    a = rng.standard_normal((9, 70, m)).astype(dtype)
    a[0, 0] = 0.0
    a[1, 1, :m // 2] = 3.0
    a[2, 2, 0] = np.inf
    a[3, 3, -1] = -np.inf
    want = np.median(np.abs(a), axis=-1)
    np.testing.assert_array_equal(_host_abs_median(a), want)
    a[4, 4, m // 3] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = np.median(np.abs(a), axis=-1)
    got = _host_abs_median(a)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[4, 4]) and got.dtype == want.dtype
    assert _host_abs_median(a[:0]).shape == (0, 70)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 60), m=st.integers(1, 3001),
       dtype=st.sampled_from([np.float32, np.float64]),
       kind=st.sampled_from(["normal", "ties", "range", "tiny", "equal"]))
def test_host_abs_median_on_any_values(seed, rows, m, dtype, kind):
    """np.median's values whatever the values: few distinct ones (many share the middle
    key), a huge dynamic range, subnormals, all equal; signed zeros and infinities."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        a = rng.standard_normal((rows, m))
    elif kind == "ties":
        a = rng.integers(-3, 4, (rows, m)) * 0.5
    elif kind == "range":
        a = rng.standard_normal((rows, m)) * 10.0 ** rng.uniform(-30, 30, (rows, m))
    elif kind == "tiny":
        a = rng.standard_normal((rows, m)) * np.finfo(dtype).smallest_subnormal * 50
    else:
        a = np.full((rows, m), -1.25)
    a = a.astype(dtype)
    a.flat[rng.integers(0, a.size, 3)] = rng.choice([0.0, -0.0, np.inf, -np.inf], 3)
    with np.errstate(over="ignore"):
        want = np.median(np.abs(a), axis=-1)
    got = _host_abs_median(a)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_template_noise_is_unchanged_by_the_host_median():
    """template_noise: the median |output| at the noise samples / 0.6745, as np.median."""
    from dspk.detect import MAD_TO_SD, _noise_samples

    x = shaped_noise(12, 30000, "band", seed=5).astype(np.float32)
    bank = default_templates()
    b = dspk.fir_bank(x, bank.astype(np.float32))
    idx = _noise_samples(x.shape[1], bank.shape[1])
    want = np.median(np.abs(b[:, :, idx]), axis=-1).astype(np.float64) / MAD_TO_SD
    np.testing.assert_array_equal(_template_noise(x, bank, b), want)
    # computed without b: the bank by the CPU path's Toeplitz products, channel block by block
    t = toeplitz_correlate(x, bank)
    want = np.median(np.abs(t[:, :, idx]), axis=-1).astype(np.float64) / MAD_TO_SD
    np.testing.assert_array_equal(dspk.detect.template_noise(x, FS), want)


def test_neighbourhoods_live_with_the_engine():
    """Kept in the engine in use (its prepared store), dropped by Engine.forget, bounded."""
    from dspk.detect import NEIGHBOURHOOD_PROBES

    g = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    with Engine(mode="off") as engine:
        a = _neighbourhoods(g, 3, (20.0,), None)
        assert _neighbourhoods(g, 3, (20.0,), None) is a
        store = engine.prepared("detect.neighbourhoods", dict)
        assert len(store) == 1 and not a[0].flags.writeable
        for i in range(NEIGHBOURHOOD_PROBES + 3):
            _neighbourhoods(g + i, 3, (20.0,), None)
        assert len(store) == NEIGHBOURHOOD_PROBES
        engine.forget()
        assert len(store) == 0
        assert _neighbourhoods(g, 3, (20.0,), None) is not a
    assert current_engine() is not engine


def test_bad_neighbourhoods():
    x = np.random.default_rng(2).standard_normal((4, 2000)).astype(np.float32)
    g = np.c_[np.zeros(4), 20.0 * np.arange(4)]
    with pytest.raises(ValueError, match="n_neighbors: expected at least 1"):
        detect_spikes(x, g, FS, n_neighbors=0)
    with pytest.raises(ValueError, match="widths_um: expected one or more positive"):
        detect_spikes(x, g, FS, widths_um=())
    with pytest.raises(ValueError, match="widths_um: expected one or more positive"):
        detect_spikes(x, g, FS, widths_um=(20.0, -5.0))


def test_nan_noise_raises_as_before():
    """A NaN in the measured noise (a NaN in x) is refused as before, from the bound's pass."""
    from dspk.detect import _cpu_noise, _cpu_spikes

    rng = np.random.default_rng(4)
    g = np.c_[np.zeros(8), 20.0 * np.arange(8)]
    x = rng.standard_normal((8, 3000)).astype(np.float32)
    bank = default_templates()
    nbr, w = _neighbourhoods(g, 4, (20.0,), None)
    b = dspk.fir_bank(x, bank.astype(np.float32))
    b[3, 2, 1234] = np.nan                             # as a NaN in x leaves it in the bank
    import dspk.detect.spikes as det

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(det, "fir_bank", lambda *a: b.copy())
        with pytest.raises(ValueError, match="noise: expected finite"):
            _engine_scores(np, x, bank, nbr, w, None, 1 << 20)
    x[3, 1234] = np.nan                                # the CPU path computes its own bank
    with pytest.raises(ValueError, match="noise: expected finite"):
        _cpu_spikes(x, bank, nbr, w, None, 7.0, 20, 1 << 20)
    sd = _cpu_noise(x, bank)                          # template_noise: NaN, as before
    assert np.all(np.isnan(sd[3])) and np.all(np.isfinite(np.delete(sd, 3, axis=0)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, taps", [(3000, 61), (1100, 61), (70, 61), (40, 21), (500, 17),
                                     (600, 33), (9, 3), (5, 1), (4000, 1)])
def test_row_bank_is_the_toeplitz_bank_to_the_bit(n, taps, dtype, monkeypatch):
    """`_RowBank` (the first pass: chunks of a channel's bank output reduced in cache) gives
    `toeplitz_correlate`'s outputs at the noise samples and each template's window maxima,
    to the bit, with chunks of every size (the last one short)."""
    import dspk.detect.spikes_cpu as sc
    from dspk.detect.noise import _noise_samples

    monkeypatch.setattr(sc, "CHUNK_BLOCKS", 7)
    rng = np.random.default_rng(n + taps)
    x = rng.standard_normal((3, n)).astype(dtype)
    bank = rng.standard_normal((4, taps))
    ref = toeplitz_correlate(x, bank)                          # [C, k, n]
    win = min(sc.BOUND_WINDOW, n)
    rb = sc._RowBank(np.ascontiguousarray(x), bank, win)
    idx = _noise_samples(n, taps)
    n_windows = -(-n // win)
    pad = np.full((3, 4, n_windows * win), -np.inf, dtype=dtype)
    pad[:, :, :n] = ref
    want_max = pad.reshape(3, 4, n_windows, win).max(axis=3)
    for c in range(3):
        v = np.empty((4, rb.noise_m), dtype=dtype)
        wm = np.empty((n_windows, 4), dtype=dtype)
        rb.row(c, v, wm)
        np.testing.assert_array_equal(v, ref[c][:, idx])
        np.testing.assert_array_equal(wm, want_max[c].T)
