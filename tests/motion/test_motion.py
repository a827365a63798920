"""dspk.motion: the drift estimate (a known rigid shift recovered within 1 µm, non-rigid and
per-shank drift), the correction (the true motion re-aligns a drifting unit's waveform;
SpikeInterface's interpolate_motion matched), the Motion object and its file, the pipeline's
Motion step (fit pass, chunked run, saved state, dspk info), bad input; NumPy and CuPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspk
from dspk.backend import to_numpy
from dspk.motion import (Correction, Motion, MotionError, correct, estimate, keep_white,
                         kriging_matrix,
                         localize, pairwise_displacement, shank_labels, spatial_windows,
                         to_spikeinterface)
from dspk.pipeline import PipelineError
from dspk.pipeline.steps import MOTION_P, MOTION_SIGMA_UM
from tests.geometry import np1_geometry

FS = 30000.0


def column(n: int, pitch: float = 20.0, x: float = 0.0) -> np.ndarray:
    return np.c_[np.full(n, x), pitch * np.arange(n)]


def drifting_spikes(drift, duration: float = 80.0, n_units: int = 30, rate: float = 12.0,
                    depth: tuple = (40.0, 600.0), jitter_um: float = 1.5, seed: int = 0,
                    x: float = 0.0) -> dict:
    """Spikes of units at fixed depths moved by ``drift(t, y)`` µm, each depth measured with
    Gaussian jitter: the ground truth of a registration."""
    rng = np.random.default_rng(seed)
    units = rng.uniform(*depth, n_units)
    n = int(n_units * rate * duration)
    t = np.sort(rng.uniform(0, duration, n))
    u = rng.integers(0, n_units, n)
    y = units[u] + drift(t, units[u]) + rng.normal(0, jitter_um, n)
    return {"time_s": t, "y": y, "amplitude": rng.uniform(8, 30, n), "x": np.full(n, x)}


def zigzag(t, y=None):
    return 8.0 * np.abs(((t / 20.0) % 2.0) - 1.0) - 4.0 + np.where(t > 50, 6.0, 0.0)


def relative_error(m: Motion, drift, depths, shank=0) -> np.ndarray:
    """|estimate − truth| at the bins' centres and the given depths, after removing each
    depth's constant offset (the estimate is relative)."""
    tc = m.time_centres_s
    out = []
    for y in depths:
        e = m.displacement_at(tc, y, shank) - drift(tc, np.full(len(tc), y))
        out.append(np.abs(e - e.mean()))
    return np.array(out)


# -- the estimate ------------------------------------------------------------------------------
def test_a_known_rigid_shift_is_recovered_within_1um(xp):
    spikes = drifting_spikes(zigzag)
    geom = column(32)
    cols = {k: xp.asarray(v) for k, v in spikes.items()}
    m = estimate(cols, geom, 80.0, rigid=True)
    assert m.rigid and m.displacement.shape == (40, 1)
    err = relative_error(m, zigzag, [300.0])
    assert err.max() < 0.4, err.max()                     # measured 0.19 (CPU)
    assert np.sqrt((err ** 2).mean()) < 0.15              # measured 0.087


@pytest.mark.gpu
def test_the_gpu_estimate_is_the_cpu_estimate():
    cp = pytest.importorskip("cupy")
    spikes = drifting_spikes(zigzag)
    geom = column(32)
    for rigid in (True, False):
        ref = estimate(spikes, geom, 80.0, rigid=rigid)
        got = estimate({k: cp.asarray(v) for k, v in spikes.items()}, geom, 80.0, rigid=rigid)
        np.testing.assert_allclose(got.displacement, ref.displacement, atol=0.05)


def test_nonrigid_drift_is_followed_along_depth():
    def gradient(t, y):
        return 2.0 * zigzag(t) * (0.2 + 0.8 * y / 1000.0)     # 5x more drift at the top

    spikes = drifting_spikes(gradient, depth=(40.0, 980.0), n_units=60)
    geom = column(51)
    m = estimate(spikes, geom, 80.0, win_step_um=200.0, win_scale_um=200.0)
    assert not m.rigid and len(m.depths_um) >= 3
    depths = np.linspace(200.0, 800.0, 4)
    assert relative_error(m, gradient, depths).max() < 1.1         # measured 0.86
    rigid = estimate(spikes, geom, 80.0, rigid=True)
    assert relative_error(rigid, gradient, depths).max() > 3.0     # what rigid cannot do


def test_each_shank_gets_its_own_motion():
    geom = np.r_[column(32), column(32, x=250.0)]
    a = drifting_spikes(zigzag, x=0.0, seed=1)
    b = drifting_spikes(lambda t, y: -zigzag(t), x=250.0, seed=2)
    spikes = {k: np.concatenate([a[k], b[k]]) for k in a}
    m = estimate(spikes, geom, 80.0, rigid=True)
    assert m.shanks.tolist() == [0, 1] and m.bin_shanks.tolist() == [0, 1]
    assert relative_error(m, zigzag, [300.0], shank=0).max() < 0.4            # measured 0.19
    assert relative_error(m, lambda t, y: -zigzag(t), [300.0], shank=1).max() < 0.4   # 0.23
    assert m.channel_shanks.tolist() == [0] * 32 + [1] * 32


def test_pairwise_displacement_finds_the_shift_between_lags(xp):
    d = np.arange(300.0)
    bump = lambda c: np.exp(-0.5 * ((d - c) / 5.0) ** 2) + 0.5 * np.exp(-0.5 * ((d - c - 40) / 3.0) ** 2)  # noqa: E731,E501
    raster = xp.asarray(np.stack([bump(100.0 + s) for s in (0.0, 2.25, -7.5, 12.0)])
                        .astype(np.float32))
    shift, corr = pairwise_displacement(raster, np.ones(300), max_lag=30)
    assert isinstance(shift, type(raster)) and isinstance(corr, type(raster))   # where it is
    shift, corr = to_numpy(shift), to_numpy(corr)
    truth = np.array([0.0, 2.25, -7.5, 12.0])
    np.testing.assert_allclose(shift, truth[None, :] - truth[:, None], atol=0.15)
    assert corr.min() > 0.95
    near = to_numpy(pairwise_displacement(raster, np.ones(300), max_lag=30, horizon=1)[0])
    assert near[0, 2] == 0 and near[0, 1] != 0          # beyond the horizon: not compared


@pytest.mark.parametrize("lower", [False, True])
def test_the_block_solves_inverse_is_numpys(lower):
    """The block solve's inverse from a Cholesky factor (LAPACK potri, mirrored) is the
    inverse, from either triangle."""
    from scipy.linalg import cho_factor

    from dspk.motion.registration import _inverse

    a = np.random.default_rng(3).standard_normal((50, 50))
    m = a @ a.T + 50 * np.eye(50)
    inv = _inverse(cho_factor(m, lower=lower))
    np.testing.assert_allclose(inv, np.linalg.inv(m), rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(inv, inv.T)


@pytest.mark.parametrize("n_b", [1, 4])
def test_the_device_form_of_the_block_solve_is_the_hosts(n_b):
    """The block solve the GPU runs (a Cholesky factor from ``linalg.cholesky``, triangular
    solves, the inverse as L⁻ᵀL⁻¹), here with NumPy and SciPy's solve_triangular: the host's
    cho_factor/potri solve to rounding."""
    from dspk.motion.registration import _device_cholesky, _solve_blocks

    rng = np.random.default_rng(7)
    diag = []
    for _ in range(n_b):
        a = rng.standard_normal((30, 30))
        diag.append(a @ a.T + 30 * np.eye(30))
    rhs = [rng.standard_normal(30) for _ in range(n_b)]
    ref = _solve_blocks(diag, 0.7, rhs)
    got = _solve_blocks(diag, 0.7, rhs, _device_cholesky(np))
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    # and the system is solved: block row b of the tridiagonal product gives rhs[b]
    for b in range(n_b):
        row = diag[b] @ got[b]
        if b > 0:
            row -= 0.7 * got[b - 1]
        if b < n_b - 1:
            row -= 0.7 * got[b + 1]
        np.testing.assert_allclose(row, rhs[b], rtol=1e-9, atol=1e-9)


@pytest.mark.gpu
def test_the_gpu_solve_is_the_hosts():
    """solve_displacement on CuPy shifts (cuSOLVER in float64, the reweighting on the
    device) gives the host's displacement, as a CuPy array."""
    cp = pytest.importorskip("cupy")
    from dspk.motion import solve_displacement

    rng = np.random.default_rng(8)
    p = np.cumsum(rng.normal(0, 1, (3, 60)), axis=1)
    d = p[:, None, :] - p[:, :, None] + rng.normal(0, 0.2, (3, 60, 60))
    d[:, 5, 40] += 30.0                                     # an outlier the reweighting drops
    w = rng.uniform(0.2, 1.0, (3, 60, 60))
    ref = solve_displacement(d, w)
    got = solve_displacement(cp.asarray(d), cp.asarray(w))
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(got), ref, rtol=1e-8, atol=1e-8)


def test_the_hosts_lag_by_lag_normalisation_is_the_whole_block_expression():
    """The correlations normalised lag by lag on the host: the whole-block expression's bits,
    zeros where the variance product is not above tiny."""
    from dspk.motion.registration import _normalised

    rng = np.random.default_rng(5)
    g = rng.standard_normal((7, 5, 6)).astype(np.float32)
    mean_t, mean_x = rng.random(5).astype(np.float32), rng.random((7, 6)).astype(np.float32)
    var_t, var_x = rng.random(5).astype(np.float32), rng.random((7, 6)).astype(np.float32)
    var_t[2] = 0.0                                          # an empty time bin
    tiny = np.float32(1e-12)
    ref = g / np.float32(3.0) - mean_t[None, :, None] * mean_x[:, None, :]
    den = var_t[None, :, None] * var_x[:, None, :]
    ref = np.where(den > tiny, ref / np.sqrt(np.where(den > tiny, den, 1)), 0)
    got = _normalised(np, g.copy(), 3.0, mean_t, mean_x, var_t, var_x, tiny)
    np.testing.assert_array_equal(got, ref)
    assert not got[:, 2].any()


def test_the_row_blocks_do_not_change_the_pairwise_shifts():
    rng = np.random.default_rng(0)
    raster = rng.random((12, 80)).astype(np.float32)
    w = spatial_windows(np.arange(80) + 0.5, 0.0, 80.0, step_um=20.0, scale_um=20.0)[0][1]
    whole = pairwise_displacement(raster, w, 10)
    blocked = pairwise_displacement(raster, w, 10, memory_bytes=1)        # one row at a time
    # the same products over other row blocks: float32 sums in another order at most
    np.testing.assert_allclose(blocked[0], whole[0], atol=1e-4)
    np.testing.assert_allclose(blocked[1], whole[1], atol=1e-5)


# -- localisation ------------------------------------------------------------------------------
def test_localize_places_a_spike_between_channels(xp):
    geom = column(8)
    x = np.zeros((8, 200), np.float32)
    x[3, 100], x[4, 100] = -9.0, -3.0            # 3/4 of the squared amplitude on channel 3
    spikes = np.array([(100, 3), (2, 3)], dtype=[("sample_index", "i8"), ("channel_index", "i8")])
    px, py, amp = localize(xp.asarray(x), spikes, geom, FS, method="center_of_mass")
    assert py[0] == pytest.approx(60.0 + 20.0 * 9 / 90) and amp[0] == 9.0
    assert py[1] == 60.0 and amp[1] == 0.0        # nothing negative near sample 2: the channel


def test_the_grid_follows_a_source_moving_between_channels(xp):
    """A point source 25 µm from a Neuropixels-like probe (its amplitudes decaying as the
    grid's model), moved along depth 1 µm at a time across two rows: the grid's positions
    follow it within 0.65 µm RMS (a constant offset aside), closer than the centre of mass's."""
    geom = np1_geometry(32)
    wave = dspk.detect.default_templates(FS)[2]
    wave = wave / -wave.min()
    depths = np.arange(140.0, 180.0)
    x = np.zeros((32, 100 * len(depths) + 100), np.float32)
    chans = []
    for i, d in enumerate(depths):
        r = np.sqrt((geom[:, 0] - 30.0) ** 2 + (geom[:, 1] - d) ** 2 + 25.0 ** 2)
        x[:, 100 * i + 50:100 * i + 111] += (30.0 * np.exp(-r / 25.0))[:, None] * wave[None, :]
        chans.append(int(np.argmin(r)))
    spikes = {"sample_index": 100 * np.arange(len(depths)) + 70,
              "channel_index": np.array(chans)}
    dev = {}
    for method in ("grid", "center_of_mass"):
        y = localize(xp.asarray(x), spikes, geom, FS, method=method)[1]
        e = y - depths
        dev[method] = np.sqrt(np.mean((e - e.mean()) ** 2))
    assert dev["grid"] < 0.65 and dev["grid"] < dev["center_of_mass"], dev   # 0.51, 0.96


def test_localize_bad_input():
    geom = column(4)
    spikes = {"sample_index": np.array([5]), "channel_index": np.array([7])}
    with pytest.raises(ValueError, match="channel_index outside the 4 channels"):
        localize(np.zeros((4, 20), np.float32), spikes, geom, FS)
    with pytest.raises(ValueError, match="method: expected 'grid' or 'center_of_mass'"):
        localize(np.zeros((4, 20), np.float32), spikes, geom, FS, method="monopolar")
    with pytest.raises(ValueError, match="x: expected \\[channels, samples\\] traces of the 4"):
        localize(np.zeros((3, 20), np.float32), spikes, geom, FS)
    empty = localize(np.zeros((4, 20), np.float32), {"sample_index": np.zeros(0, np.int64),
                                                     "channel_index": np.zeros(0, np.int64)},
                     geom, FS)
    assert [len(v) for v in empty] == [0, 0, 0]


# -- the correction ----------------------------------------------------------------------------
def unit_traces(geom, drift_um, n=4000, fs=FS, width_um=25.0, depth=150.0, seed=0):
    """One unit's spikes every 200 samples, its footprint a Gaussian along depth centred at
    ``depth + drift_um(t)``, plus a little noise."""
    rng = np.random.default_rng(seed)
    wave = dspk.detect.default_templates(fs)[2]
    wave = wave / -wave.min()
    x = 0.05 * rng.standard_normal((len(geom), n)).astype(np.float32)
    for t in range(100, n - 100, 200):
        centre = depth + drift_um(t / fs)
        amp = 10.0 * np.exp(-0.5 * ((geom[:, 1] - centre) / width_um) ** 2)
        x[:, t - 20:t + 41] += (amp[:, None] * wave[None, :]).astype(np.float32)
    return x


def test_correcting_by_the_true_motion_realigns_a_drifting_unit(xp):
    geom = column(32, pitch=10.0)
    step = lambda t: np.where(t >= 2000 / FS, 20.0, 0.0)  # noqa: E731
    x = unit_traces(geom, step)
    m = Motion([0.0, 2000 / FS, 4000 / FS], [150.0], [[0.0], [20.0]], geometry=geom)
    y = dspk.backend.to_numpy(correct(xp.asarray(x), geom, m, t0=0.0, fs=FS))
    assert y.dtype == np.float32 and y.shape == x.shape
    early, late = slice(300 - 20, 300 + 41), slice(3100 - 20, 3100 + 41)   # two spikes
    before = np.abs(x[:, late] - x[:, early]).max() / np.abs(x[:, early]).max()
    after = np.abs(y[:, late] - y[:, early]).max() / np.abs(y[:, early]).max()
    assert before > 0.3 and after < 0.03, (before, after)


def test_correct_matches_spikeinterface_interpolate_motion():
    si = pytest.importorskip("spikeinterface.core")
    smotion = pytest.importorskip("spikeinterface.sortingcomponents.motion")
    from spikeinterface.sortingcomponents.motion.motion_interpolation import \
        interpolate_motion_on_traces

    rng = np.random.default_rng(0)
    geom = np.c_[np.tile([0.0, 32.0], 16), 15.0 * np.repeat(np.arange(16), 2)]
    n = 9000
    x = rng.standard_normal((32, n)).astype(np.float32)
    disp = np.array([[0.0, 2.0], [7.5, 4.0], [-6.0, 11.0]])
    m = Motion([0.0, 0.1, 0.2, 0.3], [60.0, 180.0], disp, geometry=geom)
    times = np.arange(n) / FS
    for border, extrapolate in (("zeros", False), ("extrapolate", True)):
        ref = interpolate_motion_on_traces(
            x.T.copy(), times, geom, to_spikeinterface(m),
            spatial_interpolation_kwargs=dict(sigma_um=20.0, p=1, force_extrapolate=extrapolate))
        got = correct(x, geom, m, t0=0.0, fs=FS, border=border)
        np.testing.assert_allclose(got, ref.T, atol=2e-5)
    # the lazy recording: the same but in the first and last bins, which it evaluates a
    # quarter bin inward (at the midpoints of the edges it rebuilds from the centres)
    rec = si.NumpyRecording(x.T.copy(), FS)
    rec.set_dummy_probe_from_locations(geom)
    ref = smotion.interpolate_motion(rec, to_spikeinterface(m),
                                     border_mode="force_zeros").get_traces().T
    got = correct(x, geom, m, t0=0.0, fs=FS)
    np.testing.assert_allclose(got[:, 3000:6000], ref[:, 3000:6000], atol=2e-5)
    quarter = Motion(m.time_edges_s, m.depths_um, disp + [[1.875, 0.5], [0, 0], [3.375, -1.75]],
                     geometry=geom)                     # a quarter of the way to the next bin
    np.testing.assert_allclose(correct(x, geom, quarter, t0=0.0, fs=FS), ref, atol=2e-5)
    ref = smotion.interpolate_motion(rec, to_spikeinterface(m), border_mode="force_zeros",
                                     interpolation_time_bin_size_s=0.025).get_traces()
    got = correct(x, geom, m, t0=0.0, fs=FS, time_bin_s=0.025)
    # where an edge falls on a sample (0.075 s: sample 2250), SpikeInterface's edge computed
    # as 3 x 0.025 lands a float step after it and the sample stays in the bin before
    off = np.flatnonzero(np.abs(got - ref.T).max(axis=0) > 2e-5)
    assert set(off.tolist()) <= set(range(0, n, 750)), off


def test_displacement_at_matches_spikeinterface():
    pytest.importorskip("spikeinterface.core")
    rng = np.random.default_rng(1)
    m = Motion(np.arange(6.0) * 2, [100.0, 250.0, 400.0], rng.normal(0, 5, (5, 3)))
    t, y = rng.uniform(-3, 14, 500), rng.uniform(0, 500, 500)
    ref = to_spikeinterface(m).get_displacement_at_time_and_depth(t, y)
    np.testing.assert_allclose(m.displacement_at(t, y), ref, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(1, 2999), max_size=6), offset=st.integers(0, 10 ** 7))
def test_each_sample_takes_its_bin_however_the_traces_are_chunked(cuts, offset):
    """A sample's time bin depends on its index in the recording only: chunks starting
    anywhere (their first sample's time start / fs) give the bins of the whole."""
    geom = column(4)
    edges = np.r_[0.0, np.cumsum(np.full(40, 0.0125))] + offset / FS
    m = Motion(edges, [30.0], np.zeros((40, 1)), geometry=geom)
    c = Correction(geom, m)

    def bins(start, n):
        out = np.empty(n, np.int64)
        for k, a, b in c.segments(n, start / FS, FS):
            out[a:b] = k
        return out

    whole = bins(offset, 3000)
    bounds = [0, *sorted(set(cuts)), 3000]
    parts = np.concatenate([bins(offset + a, b - a) for a, b in zip(bounds[:-1], bounds[1:])])
    assert np.array_equal(parts, whole)
    assert whole[0] == 0 and np.all(np.diff(whole) >= 0)


def test_correct_in_chunks_equals_the_whole():
    rng = np.random.default_rng(2)
    geom = column(16)
    x = rng.standard_normal((16, 6000)).astype(np.float32)
    m = Motion(np.arange(7.0) * 0.03, [150.0], rng.normal(0, 8, (6, 1)), geometry=geom)
    whole = correct(x, geom, m, 0.0, FS)
    parts = np.concatenate([correct(x[:, a:a + 1700], geom, m, a / FS, FS)
                            for a in range(0, 6000, 1700)], axis=1)
    np.testing.assert_allclose(parts, whole, atol=1e-5)


def test_kriging_without_motion_is_the_identity_and_zeros_beyond_the_probe():
    geom = column(6)
    assert np.allclose(kriging_matrix(geom, np.zeros(6)), np.eye(6), atol=1e-6)
    w = kriging_matrix(geom, np.full(6, -30.0))          # channels 0, 1 moved below the tip
    assert not w[:2].any() and np.allclose(w[2:].sum(axis=1), 1.0)
    w = kriging_matrix(geom, np.full(6, -30.0), border="extrapolate")
    assert w[0].any() and w[1].any()
    two = np.r_[column(3), column(3, x=300.0)]
    w = kriging_matrix(two, np.full(6, 5.0))
    assert not w[:3, 3:].any() and not w[3:, :3].any()        # shanks kept apart



@pytest.mark.parametrize("geom", [column(24), np1_geometry(48), np1_geometry(384),
                                  np.r_[column(12), column(12, x=250.0)]],
                         ids=["column", "np1", "np1-384", "two-shanks"])
@given(shift=st.floats(-45.0, 45.0), sigma=st.sampled_from([(20.0, 1.0), (MOTION_SIGMA_UM,
                                                                           MOTION_P)]))
@settings(max_examples=25, deadline=None)
def test_keep_white_keeps_white_noise_white_at_any_drift(geom, shift, sigma):
    """W·Wᵀ (the noise covariance a correction after whitening feeds on) is the identity on
    the rows that read inside the probe, whatever the drift's fraction of the pitch; rows
    beyond stay zero and the shanks apart; at a whole number of rows W itself (a permutation)."""
    n = len(geom)
    w = kriging_matrix(geom, np.full(n, shift), *sigma)
    u = keep_white(w)
    inside = np.abs(w).sum(axis=1) > 0
    assert not u[~inside].any()
    np.testing.assert_allclose((u @ u.T)[np.ix_(inside, inside)], np.eye(inside.sum()),
                               atol=1e-6)
    if len(np.unique(geom[:, 0] // 200)) > 1:
        half = n // 2
        assert not u[:half, half:].any() and not u[half:, :half].any()


def test_keep_white_at_a_whole_pitch_is_the_kriging_itself():
    geom = column(16)
    w = kriging_matrix(geom, np.full(16, 40.0), MOTION_SIGMA_UM, MOTION_P)
    np.testing.assert_allclose(keep_white(w), w, atol=1e-5)


def test_a_white_correction_keeps_the_noise_sd_where_kriging_lowers_it():
    """White noise corrected halfway between contacts: kriging halves its variance on a
    column (SD 0.71, measured), the white form keeps SD 1; a unit put back moves alike."""
    rng = np.random.default_rng(3)
    geom = column(24)
    x = rng.standard_normal((24, 60000)).astype(np.float32)
    m = Motion([0.0, 1.0, 2.0], [240.0], [[10.0], [10.0]], geometry=geom)
    plain = correct(x, geom, m, 0.0, FS, sigma_um=20.0, p=1.0)
    white = correct(x, geom, m, 0.0, FS, sigma_um=20.0, p=1.0, white=True)
    inner = slice(2, 20)
    np.testing.assert_allclose(plain[inner].std(axis=1), np.sqrt(0.5), atol=0.01)
    np.testing.assert_allclose(white[inner].std(axis=1), 1.0, atol=0.01)
    unit = unit_traces(geom, lambda t: 10.0, depth=140.0)
    back_plain = correct(unit, geom, m, 0.0, FS, sigma_um=20.0, p=1.0)
    back_white = correct(unit, geom, m, 0.0, FS, sigma_um=20.0, p=1.0, white=True)
    assert np.argmin(back_plain.min(axis=1)) == np.argmin(back_white.min(axis=1)) == 7


def test_the_white_option_is_checked_and_reaches_the_step():
    geom = column(4)
    m = Motion([0.0, 1.0], [30.0], [[0.0]], geometry=geom)
    with pytest.raises(TypeError, match="white: expected True or False"):
        correct(np.zeros((4, 10), np.float32), geom, m, 0.0, FS, white="yes")
    with pytest.raises(PipelineError, match="motion white: expected True or False"):
        dspk.pipeline.Motion("rigid", white=1)
    from dspk.pipeline import registry

    spec = dspk.Pipeline([dspk.pipeline.Motion("rigid", white=True)]).options()[-1]
    assert spec["white"] is True
    assert registry.stage_class(spec.pop("step"))(**spec).white is True


@pytest.mark.gpu
def test_keep_white_on_the_gpu_is_the_hosts():
    import cupy as cp

    geom = np1_geometry(96)
    w = kriging_matrix(geom, np.linspace(-30.0, 30.0, 96), MOTION_SIGMA_UM, MOTION_P)
    np.testing.assert_allclose(cp.asnumpy(keep_white(cp.asarray(w))), keep_white(w),
                               atol=1e-9)

# -- the Motion object -----------------------------------------------------------------------
def test_motion_file_round_trip_and_another_probe_refused(tmp_path):
    geom = column(8)
    m = Motion([0.0, 2.0, 4.0], [70.0], [[0.0], [3.5]], geometry=geom)
    path = tmp_path / "motion.npz"
    m.save(path)
    back = Motion.load(path, geometry=geom)
    assert np.array_equal(back.displacement, m.displacement) and back.probe == m.probe
    with pytest.raises(MotionError, match="8 channels spanning y 0..140 µm.*7 channels"):
        Motion.load(path, geometry=geom[:7])
    moved = geom.copy()
    moved[5, 1] += 2.0
    with pytest.raises(MotionError, match=r"other positions \(channel 5"):
        Motion.load(path, geometry=moved)
    with pytest.raises(MotionError, match="channel 4 on shank 1"):
        Motion.load(path, geometry=geom, shank_ids=[0, 0, 0, 0, 1, 1, 1, 1])
    with pytest.raises(MotionError, match="another probe"):
        correct(np.zeros((7, 10), np.float32), geom[:7], back, 0.0, FS)
    (tmp_path / "other.npz").write_bytes(b"not a motion")
    with pytest.raises(MotionError, match="not a motion file"):
        Motion.load(tmp_path / "other.npz")


def test_nan_displacement_never_reaches_the_traces():
    with pytest.raises(MotionError, match="not finite at time bin 1, spatial bin 0"):
        Motion([0.0, 2.0, 4.0], [70.0], [[0.0], [np.nan]])
    with pytest.raises(MotionError, match="not finite at channel 2"):
        kriging_matrix(column(4), [0.0, 1.0, np.inf, 0.0])
    state = Motion([0.0, 2.0], [70.0], [[1.0]], geometry=column(4)).to_state()
    state["displacement"] = np.array([[np.nan]])
    with pytest.raises(MotionError, match="not finite"):
        Motion.from_state(state)


def test_motion_checks_its_arrays():
    with pytest.raises(MotionError, match="time_edges_s: expected at least 2"):
        Motion([0.0], [1.0], np.zeros((0, 1)))
    with pytest.raises(MotionError, match="expected \\[time bins, spatial bins\\] = \\[2, 1\\]"):
        Motion([0.0, 1.0, 2.0], [1.0], np.zeros((3, 1)))
    with pytest.raises(MotionError, match="increasing depth"):
        Motion([0.0, 1.0], [5.0, 1.0], np.zeros((1, 2)))
    with pytest.raises(MotionError, match="no spatial bin on shank 1"):
        Motion([0.0, 1.0], [5.0], np.zeros((1, 1)), geometry=np.r_[column(2), column(2, x=500)])
    with pytest.raises(MotionError, match="the motion has no spatial bin on shank 3"):
        Motion([0.0, 1.0], [5.0], np.zeros((1, 1))).displacement_at(0.5, 1.0, 3)
    two = Motion([0.0, 1.0], [5.0, 5.0], np.zeros((1, 2)), bin_shanks=[0, 1])
    with pytest.raises(MotionError, match="2 shanks"):
        to_spikeinterface(two)
    assert shank_labels(np.c_[[0.0, 16.0, 300.0, 316.0], np.zeros(4)]).tolist() == [0, 0, 1, 1]


# -- bad input ---------------------------------------------------------------------------------
def test_too_few_spikes_names_the_count_needed():
    spikes = drifting_spikes(zigzag, n_units=2, rate=1.0)
    with pytest.raises(MotionError, match=r"\d+ spikes on shank 0; estimating its motion needs "
                                          r"at least 800 \(20 per time bin, 40 bins of 2 s\)"):
        estimate(spikes, column(32), 80.0)


def test_a_probe_without_depth_extent_is_refused():
    geom = np.c_[20.0 * np.arange(8), np.zeros(8)]         # a row along x
    spikes = drifting_spikes(zigzag)
    with pytest.raises(MotionError, match="all lie at y = 0 µm: a probe with no depth extent"):
        estimate(spikes, geom, 80.0, shank_ids=np.zeros(8))


def test_a_short_probe_falls_back_to_rigid_and_says_so():
    spikes = drifting_spikes(zigzag, depth=(20.0, 130.0))
    with pytest.warns(UserWarning, match="too short for non-rigid windows.*estimated rigid"):
        m = estimate(spikes, column(8), 80.0, rigid=False, win_scale_um=100.0)
    assert m.rigid


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 10**7), bins=st.integers(1, 2000), extent=st.floats(10.0, 10_000.0))
def test_the_default_windows_hold_their_spikes_within_bounds(n, bins, extent):
    """`window_scale`: within [WINDOW_MIN_UM, WINDOW_MAX_UM]; where not clipped, a Gaussian
    window of that SD holds WINDOW_SPIKES_PER_BIN spikes per bin at the mean density; denser
    spikes never widen it."""
    from dspk.motion import estimation as me

    w = me.window_scale(n, bins, extent)
    assert me.WINDOW_MIN_UM <= w <= me.WINDOW_MAX_UM
    held = n / (bins * extent) * np.sqrt(2 * np.pi) * w
    if me.WINDOW_MIN_UM < w < me.WINDOW_MAX_UM:
        assert held == pytest.approx(me.WINDOW_SPIKES_PER_BIN, rel=1e-9)
    assert me.window_scale(2 * n + 1, bins, extent) <= w


def test_the_default_windows_follow_the_spike_density():
    """Sparse spikes on a long probe get wide windows, dense ones on a short probe narrow
    ones (the estimate says how many it used)."""
    sparse = drifting_spikes(zigzag, n_units=30, rate=4.0, depth=(40.0, 2500.0))
    dense = drifting_spikes(zigzag, n_units=60, rate=12.0, depth=(40.0, 600.0))
    wide = estimate(sparse, column(128, pitch=20.0), 80.0)
    narrow = estimate(dense, column(32), 80.0)
    assert np.diff(wide.depths_um).min() > 2 * np.diff(narrow.depths_um).min()


def test_estimate_bad_input():
    spikes = drifting_spikes(zigzag)
    geom = column(32)
    with pytest.raises(MotionError, match="gives 1 time bin of 2 s; motion needs at least 2"):
        estimate(spikes, geom, 1.5)
    with pytest.raises(MotionError, match="duration_s: expected"):
        estimate(spikes, geom, float("nan"))
    with pytest.raises(MotionError, match="no 'y'"):
        estimate({"time_s": spikes["time_s"]}, geom, 80.0)
    with pytest.raises(MotionError, match="pass the sampling rate"):
        estimate({"sample_index": np.zeros(3, np.int64), "y": np.zeros(3)}, geom, 80.0)
    with pytest.raises(ValueError, match="weights: expected one of"):
        estimate(spikes, geom, 80.0, weights="loud")
    with pytest.raises(TypeError, match="spikes: expected a structured array or a mapping"):
        estimate([1, 2, 3], geom, 80.0)
    two = np.r_[geom, column(32, x=500.0)]
    with pytest.raises(MotionError, match="multi-shank probe needs each spike's"):
        estimate({"time_s": spikes["time_s"], "y": spikes["y"]}, two, 80.0)


def test_correct_bad_input():
    geom = column(4)
    m = Motion([0.0, 1.0], [30.0], [[0.0]], geometry=geom)
    x = np.zeros((4, 10), np.float32)
    with pytest.raises(ValueError, match="border: expected 'zeros' or 'extrapolate'"):
        correct(x, geom, m, 0.0, FS, border="remove_channels")
    with pytest.raises(ValueError, match="sigma_um: expected a positive"):
        correct(x, geom, m, 0.0, FS, sigma_um=0.0)
    with pytest.raises(TypeError, match="x: expected float32 or float64"):
        correct(x.astype(np.int16), geom, m, 0.0, FS)
    with pytest.raises(ValueError, match="x: expected \\[channels, samples\\] traces of the 4"):
        correct(x[:3], geom, m, 0.0, FS)
    with pytest.raises(TypeError, match="motion: expected a dspk.motion.Motion"):
        correct(x, geom, np.zeros((1, 1)), 0.0, FS)
    with pytest.raises(ValueError, match="fs: expected a positive"):
        correct(x, geom, m, 0.0, 0.0)


# -- the pipeline step ---------------------------------------------------------------------------
def drifting_recording(duration=24.0, n_ch=32, n_units=14, rate=15.0, seed=0):
    """Whitened-like traces (unit noise) with units whose Gaussian footprints move with
    ``zigzag``; (traces [samples, channels], geometry, drift)."""
    from scipy.signal import oaconvolve

    rng = np.random.default_rng(seed)
    geom = np.c_[np.tile([0.0, 24.0], n_ch // 2), 12.5 * np.repeat(np.arange(n_ch // 2), 2)]
    n = int(duration * FS)
    drift = lambda t, y=None: 3.0 * zigzag(np.asarray(t) * 2.5)  # noqa: E731
    depths = rng.uniform(40.0, geom[:, 1].max() - 40.0, n_units)
    wave = dspk.detect.default_templates(FS)[2]
    wave = wave / -wave.min()
    impulses = np.zeros((n_ch, n))
    for d in depths:
        times = np.sort(rng.choice(np.arange(100, n - 100), int(rate * duration), replace=False))
        centre = d + drift(times / FS)
        amp = rng.uniform(12, 18) * np.exp(
            -0.5 * ((geom[:, 1][:, None] - centre[None, :]) ** 2 +
                    (geom[:, 0][:, None] - 12.0) ** 2) / 18.0 ** 2)
        np.add.at(impulses, (slice(None), times), amp)
    spikes = oaconvolve(impulses, wave[None, :], axes=1)[:, 20:20 + n]
    x = rng.standard_normal((n_ch, n)) + spikes
    return x.T.astype(np.float32), geom, drift


@pytest.fixture(scope="module")
def drifting():
    return drifting_recording()


def test_the_motion_step_estimates_and_corrects_the_drift(drifting, tmp_path):
    traces, geom, drift = drifting
    rec = dspk.open_recording(traces, fs=FS, geometry=geom)
    p = dspk.Pipeline.from_options(highpass=None, reference="none", whiten="none",
                                   motion="rigid", backend="cpu")
    assert [s["step"] for s in p.options()] == ["Motion"]
    p.fit(rec)
    m = Motion.from_state(p.states[0])
    assert m.rigid and len(m.time_centres_s) == 12
    err = relative_error(m, drift, [150.0])
    assert err.max() < 1.2, err                                         # measured 0.92
    out = p.run(rec, tmp_path / "out.h5", chunk_s=0.7, progress=False)
    with dspk.open_recording(out) as done:
        y = done.read()
    step = p.steps[0]                         # the step's kernel (Kilosort4's by default)
    assert (step.sigma_um, step.p) == (MOTION_SIGMA_UM, MOTION_P)
    whole = correct(np.ascontiguousarray(traces.T), geom, m, 0.0, FS, sigma_um=step.sigma_um,
                    p=step.p)
    np.testing.assert_allclose(y, whole, atol=1e-4)
    states = p.read_fitted(out)
    assert np.array_equal(states[0]["displacement"], p.states[0]["displacement"])
    part = np.ascontiguousarray(traces[:40000].T)          # an array: the fitted probe's
    np.testing.assert_allclose(p.transform(part), whole[:, :40000], atol=1e-4)
    p.save(tmp_path / "p.npz")
    q = dspk.Pipeline.load(tmp_path / "p.npz")
    assert q.fingerprint() == p.fingerprint()
    other = dspk.open_recording(traces[:, :30], fs=FS, geometry=geom[:30])
    with pytest.raises(PipelineError, match="motion='rigid': motion: estimated on a probe of "
                                            "32 channels"):
        q.block(other, 0, 100)


def test_a_motion_step_after_whitening_and_before_detection(drifting):
    traces, geom, _ = drifting
    rec = dspk.open_recording(traces[:12 * 30000], fs=FS, geometry=geom)
    p = dspk.Pipeline.from_options(highpass=None, reference="none", whiten="global",
                                   motion="nonrigid", detect=True, backend="cpu")
    assert [s["step"] for s in p.options()] == ["Whiten", "Motion", "Detect"]
    p.fit(rec)
    assert p.is_fitted and "noise" in p.states[-1]


def test_the_motion_step_refuses_what_it_cannot_estimate():
    x = np.random.default_rng(0).standard_normal((3 * 30000, 8)).astype(np.float32)
    rec = dspk.open_recording(x, fs=FS, geometry=column(8))
    p = dspk.Pipeline.from_options(highpass=None, reference="none", whiten="none",
                                   motion="rigid")
    with pytest.raises(PipelineError, match="lasts 3 s, less than two time bins of 2 s"):
        p.fit(rec)
    long = dspk.open_recording(np.tile(x, (3, 1)), fs=FS, geometry=column(8))
    with pytest.raises(PipelineError, match=r"motion='rigid': spikes: \d+ spikes on shank 0; "
                                            r"estimating its motion needs at least 100"):
        p.fit(long)
    no_geometry = dspk.open_recording(np.tile(x, (3, 1)), fs=FS)
    with pytest.raises(PipelineError, match="needs the recording's geometry"):
        p.fit(no_geometry)
    with pytest.raises(PipelineError, match="motion=: expected 'rigid', 'nonrigid' or 'none'"):
        dspk.pipeline.Motion("wobbly")
    with pytest.raises(PipelineError, match="expected 'rigid', 'nonrigid' or 'none'"):
        dspk.Pipeline.from_options(motion="wobbly")


def test_command_line_motion_and_info(drifting, tmp_path, capsys):
    import h5py

    from dspk import cli

    traces, geom, _ = drifting
    path = tmp_path / "rec.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", data=traces[:16 * 30000])
        d.attrs["fs"] = FS
        d.attrs["geometry"] = geom
    out = tmp_path / "out.h5"
    assert cli.main(["preprocess", str(path), str(out), "--highpass", "0", "--reference",
                     "none", "--whiten", "none", "--motion", "rigid", "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["info", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "written by dspk: Motion" in printed
    assert "drift (corrected): rigid, 8 time bins of 2 s, displacement" in printed


@pytest.mark.gpu
def test_the_motion_step_on_the_gpu_gives_the_cpu_motion(drifting, tmp_path):
    pytest.importorskip("cupy")
    traces, geom, _ = drifting
    rec = dspk.open_recording(traces, fs=FS, geometry=geom)
    fitted = {}
    for backend in ("cpu", "gpu"):
        p = dspk.Pipeline.from_options(highpass=None, reference="none", whiten="none",
                                       motion="rigid", backend=backend).fit(rec)
        fitted[backend] = p
    cpu, gpu = (Motion.from_state(fitted[b].states[0]) for b in ("cpu", "gpu"))
    np.testing.assert_allclose(gpu.displacement, cpu.displacement, atol=0.1)
    outs = {b: fitted[b].run(rec, tmp_path / f"{b}.h5", chunk_s=0.5, progress=False)
            for b in ("cpu", "gpu")}
    with dspk.open_recording(outs["cpu"]) as a, dspk.open_recording(outs["gpu"]) as b:
        # the GPU run corrects by the GPU's estimate with the step's kernel: compare it with
        # the CPU's correction of the same estimate by the same kernel
        y = b.read(0, 60000)
        ref = correct(np.ascontiguousarray(traces[:60000].T), geom, gpu, 0.0, FS,
                      sigma_um=MOTION_SIGMA_UM, p=MOTION_P)
        np.testing.assert_allclose(y, ref, atol=1e-4)
        assert a.n_samples == b.n_samples


@settings(max_examples=8, deadline=None)
@given(block=st.integers(3000, 20000))
def test_a_pass_in_blocks_finds_the_spikes_of_the_whole(block):
    """`SpikeSurvey` on a recording in blocks with `pass_margin` samples of context (zeros
    beyond the ends, as a pipeline's pass pads) keeps each spike once, in the block holding
    its trough: the same spikes, times, channels and positions as one block of the whole
    recording, whatever the block length (spikes put across the cuts); the amplitudes to
    float32's last bits (the detector's products are summed in blocks of the block's
    length)."""
    from dspk.motion.spikes import SpikeSurvey, pass_margin

    rng = np.random.default_rng(4)
    fs, n, c = 30000.0, 45000, 24
    g = np.c_[np.tile([0.0, 32.0], c // 2), 20.0 * (np.arange(c) // 2)]
    x = rng.standard_normal((c, n)).astype(np.float32)
    shape = np.hanning(24).astype(np.float32)
    for t in list(range(1500, n - 100, 997)) + [block - 10, 2 * block + 5]:
        ch = int(rng.integers(2, c - 2))
        if t + 24 < n:
            x[ch - 2:ch + 3, t:t + 24] -= np.float32(30.0) * shape * \
                np.array([0.3, 0.7, 1.0, 0.7, 0.3], np.float32)[:, None]
    h = pass_margin(fs)
    padded = np.pad(x, ((0, 0), (h, h)))
    whole = SpikeSurvey(x[:, :15000], g, fs, threshold=7.0)
    whole.add(padded, 0, n, h)
    parts = SpikeSurvey(x[:, :15000], g, fs, threshold=7.0)
    parts.add_all(((s0, min(s0 + block, n), padded[:, s0:min(s0 + block, n) + 2 * h])
                   for s0 in range(0, n, block)), halo=h)
    a, b = whole.spikes(), parts.spikes()
    assert len(a["time_s"]) >= 40
    for k in ("time_s", "y", "channel_index"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    np.testing.assert_allclose(a["amplitude"], b["amplitude"], rtol=2e-6)
