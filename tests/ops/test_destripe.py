"""dspk.ops.highpass_spatial_filter against SpikeInterface's highpass_spatial_filter (IBL's
kfilt) on NP1.0-like, 2-column and 4-shank layouts with a common-mode stripe and coloured
noise, with and without AGC, both directions, several paddings and tapers;
highpass_spatial_matrix's structure; shapes, dtypes and chunking (hypothesis); every bad
input; the CuPy path against the NumPy float64 reference (`gpu` params)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.signal import lfilter

import dspk
from dspk.backend import to_numpy
from dspk.ops import agc_window, highpass_spatial_filter, highpass_spatial_matrix, spatial_filter
from tests.geometry import np1_geometry

FS = 30000.0


def two_column_geometry(n=192):
    """NP2.0-like single shank: two columns 32 µm apart, 15 µm rows."""
    c = np.arange(n)
    return np.c_[27.0 + 32.0 * (c % 2), 15.0 * (c // 2)]


def four_shank_geometry(per_shank=96):
    """NP2.0 4-shank-like: shanks 250 µm apart, two columns each; shank ids."""
    g = two_column_geometry(per_shank)
    geom = np.vstack([g + [250.0 * s, 0.0] for s in range(4)])
    return geom, np.repeat(np.arange(4), per_shank)


def striped(n_channels, n_samples, seed=0):
    """Coloured (AR(1)) noise per channel plus a common-mode stripe: the same slow sine and
    random walk on every channel, larger than the noise."""
    rng = np.random.default_rng(seed)
    noise = lfilter([1.0], [1.0, -0.9], rng.normal(0, 10, (n_channels, n_samples)), axis=1)
    t = np.arange(n_samples)
    stripe = 150.0 * np.sin(t / 40.0) + lfilter([1.0], [1.0, -0.99], rng.normal(0, 15, n_samples))
    # integer-valued (as raw counts): SpikeInterface rounds its input and its padding's odd
    # extension to float32, exact on integers, so its float64 output is exact float64 math
    return np.round(noise + stripe[None, :])


def si_highpass_spatial(x, geom, shanks=None, **kwargs):
    """SpikeInterface's highpass_spatial_filter of [channels, samples] x (each shank alone,
    through split_by("group"), as it requires)."""
    core = pytest.importorskip("spikeinterface.core",
                               reason="the comparison runs against SpikeInterface")
    pre = pytest.importorskip("spikeinterface.preprocessing",
                              reason="the comparison runs against SpikeInterface")
    pi = pytest.importorskip("probeinterface", reason="SpikeInterface needs a probe attached")
    rec = core.NumpyRecording(np.ascontiguousarray(x.T), FS)
    probe = pi.Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=geom, shapes="square", shape_params={"width": 12},
                       shank_ids=None if shanks is None else shanks.astype(str))
    probe.set_device_channel_indices(np.arange(len(geom)))
    attached = rec.set_probe(probe)        # in place from 0.105; a new recording before
    rec = rec if attached is None else attached
    rms = kwargs.pop("rms_values")
    if shanks is None:
        return pre.highpass_spatial_filter(rec, rms_values=rms, **kwargs).get_traces().T
    out = np.empty_like(x, dtype=kwargs.get("dtype") or x.dtype)
    ids = list(rec.get_channel_ids())
    for sub in rec.split_by("group").values():
        idx = np.array([ids.index(c) for c in sub.get_channel_ids()])
        out[idx] = pre.highpass_spatial_filter(sub, rms_values=rms[idx],
                                               **kwargs).get_traces().T
    return out


def rms_of(x):
    return np.sqrt(np.mean(np.asarray(x, dtype=np.float64) ** 2, axis=1))


def rel_max(got, ref):
    return np.abs(np.asarray(got, dtype=np.float64) - ref).max() / np.abs(ref).max()


LAYOUTS = {
    "np1": (np1_geometry(), None),
    "two columns": (two_column_geometry(), None),
    "four shanks": four_shank_geometry(),
}
# the largest relative difference allowed (measured: 1.4e-6, 1.8e-13, 1.8e-6, 3.7e-7)
TOLERANCE = {(np.float32, False): 1e-5, (np.float64, False): 1e-10,
             (np.float32, True): 1e-5, (np.float64, True): 3e-6}


@pytest.mark.parametrize("apply_agc", [False, True], ids=["plain", "agc"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_matches_spikeinterface(layout, dtype, apply_agc):
    geom, shanks = LAYOUTS[layout]
    x = striped(len(geom), 4000, seed=len(geom)).astype(dtype)
    rms = rms_of(x)
    ref = si_highpass_spatial(x, geom, shanks, apply_agc=apply_agc, rms_values=rms)
    y = highpass_spatial_filter(x, geom, FS, apply_agc=apply_agc, rms_values=rms,
                                groups=shanks)
    assert y.shape == x.shape and y.dtype == dtype
    assert rel_max(y, ref) <= TOLERANCE[dtype, apply_agc]
    # the stripe is gone: the output is within a few noise RMS where the input is not
    assert np.abs(ref).max() < 0.5 * np.abs(x).max()


@pytest.mark.parametrize("kwargs", [
    {"direction": "x"},
    {"n_channel_taper": None},                              # taper = pad
    {"n_channel_pad": 20, "n_channel_taper": 10},
    {"n_channel_pad": 0},
    {"n_channel_pad": None},
    {"highpass_butter_order": 5, "highpass_butter_wn": 0.05},
], ids=str)
@pytest.mark.parametrize("apply_agc", [False, True], ids=["plain", "agc"])
def test_matches_spikeinterface_with_other_parameters(kwargs, apply_agc):
    geom = np1_geometry()
    x = striped(len(geom), 3000, seed=3)
    rms = rms_of(x)
    ref = si_highpass_spatial(x, geom, apply_agc=apply_agc, rms_values=rms, **kwargs)
    y = highpass_spatial_filter(x, geom, FS, apply_agc=apply_agc, rms_values=rms, **kwargs)
    assert rel_max(y, ref) <= TOLERANCE[np.float64, apply_agc]


@pytest.mark.parametrize("direction", ["x", "y"])
def test_channels_in_any_order_match_spikeinterface(direction):
    """Unsorted channels: the reference orders them by y (ties by x) and back."""
    perm = np.random.default_rng(1).permutation(384)
    geom = np1_geometry()[perm]
    x = striped(384, 2000, seed=4)
    rms = rms_of(x)
    ref = si_highpass_spatial(x, geom, apply_agc=False, rms_values=rms, direction=direction)
    y = highpass_spatial_filter(x, geom, apply_agc=False, direction=direction)
    assert rel_max(y, ref) <= 1e-10


def test_silent_channel_and_short_traces_match_spikeinterface():
    """A channel of zeros (RMS 0, so no floor under its gain) stays 0 without NaN, as the
    reference's dead channel; traces shorter than the AGC window (3001 samples)."""
    geom = np1_geometry(96)
    x = striped(96, 1200, seed=5)
    x[7] = 0.0
    rms = rms_of(x)
    ref = si_highpass_spatial(x, geom, apply_agc=True, rms_values=rms, n_channel_pad=30)
    y = highpass_spatial_filter(x, geom, FS, rms_values=rms, n_channel_pad=30)
    assert np.isfinite(y).all() and (y[7] == 0).all()
    assert rel_max(y, ref) <= TOLERANCE[np.float64, True]


def test_int16_output_matches_spikeinterface():
    geom = np1_geometry()
    x = striped(384, 2000, seed=6).astype(np.float32)
    rms = rms_of(x)
    ref = si_highpass_spatial(x, geom, apply_agc=True, rms_values=rms, dtype="int16")
    y = highpass_spatial_filter(x, geom, FS, rms_values=rms, dtype=np.int16)
    assert y.dtype == np.int16 and ref.dtype == np.int16
    # rounded from values that agree to ~1e-6: a .5 boundary may fall either side
    assert np.abs(y.astype(np.int32) - ref).max() <= 1


def test_default_rms_is_each_channels_rms_over_x():
    geom = two_column_geometry(64)
    x = striped(64, 2000, seed=7)
    np.testing.assert_array_equal(highpass_spatial_filter(x, geom, FS, n_channel_pad=20),
                                  highpass_spatial_filter(x, geom, FS, n_channel_pad=20,
                                                          rms_values=rms_of(x)))


def test_without_agc_it_is_the_matrix_applied():
    geom = np1_geometry()
    x = striped(384, 500, seed=8)
    w = highpass_spatial_matrix(geom)
    np.testing.assert_array_equal(highpass_spatial_filter(x, geom, apply_agc=False),
                                  spatial_filter(w, x))


def test_matrix_structure():
    geom, shanks = four_shank_geometry(64)
    w = highpass_spatial_matrix(geom, groups=shanks, n_channel_pad=30)
    assert w.shape == (256, 256) and w.dtype == np.float64 and not w.flags.writeable
    # block-diagonal over the shanks, each block the matrix of the shank alone
    for s in range(4):
        rows = shanks == s
        assert (w[np.ix_(rows, ~rows)] == 0).all()
        np.testing.assert_array_equal(w[np.ix_(rows, rows)],
                                      highpass_spatial_matrix(geom[rows], n_channel_pad=30))
    # a high-pass: a constant across depth is (nearly) removed, away from the ends
    assert np.abs(w @ np.ones(256)).max() < 0.05
    # cached: the same arguments give the same array
    assert highpass_spatial_matrix(geom, groups=shanks, n_channel_pad=30) is w


def test_a_probe_groups_by_its_shanks():
    pi = pytest.importorskip("probeinterface", reason="a Probe as geometry")
    geom, shanks = four_shank_geometry(64)
    probe = pi.Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=geom, shank_ids=shanks.astype(str))
    np.testing.assert_array_equal(highpass_spatial_matrix(probe, n_channel_pad=30),
                                  highpass_spatial_matrix(geom, groups=shanks, n_channel_pad=30))
    plain = pi.Probe(ndim=2, si_units="um")
    plain.set_contacts(positions=np1_geometry(64))
    np.testing.assert_array_equal(highpass_spatial_matrix(plain, n_channel_pad=30),
                                  highpass_spatial_matrix(np1_geometry(64), n_channel_pad=30))


def test_groups_by_column_filter_each_column_alone():
    geom = two_column_geometry(128)
    w = highpass_spatial_matrix(geom, groups=geom[:, 0], n_channel_pad=40)
    left = geom[:, 0] == geom[0, 0]
    np.testing.assert_array_equal(w[np.ix_(left, left)],
                                  highpass_spatial_matrix(geom[left], n_channel_pad=40))
    assert (w[np.ix_(left, ~left)] == 0).all()


def test_agc_window_is_the_references():
    for fs, seconds in [(30000.0, 0.1), (2500.0, 0.1), (30000.0, 0.01), (1000.0, 0.0205)]:
        n = int(np.round(seconds / (1 / fs) / 2) * 2 + 1)
        want = np.hanning(n) / np.hanning(n).sum()
        np.testing.assert_array_equal(agc_window(fs, seconds), want)


@settings(max_examples=25, deadline=None)
@given(n_groups=st.integers(1, 3), per_group=st.integers(14, 40),
       n_samples=st.integers(40, 400), dtype=st.sampled_from([np.float32, np.float64]),
       apply_agc=st.booleans(), pad=st.integers(0, 14), seed=st.integers(0, 2**16))
def test_shapes_dtypes_and_float64_reference(n_groups, per_group, n_samples, dtype, apply_agc,
                                             pad, seed):
    """Any layout, length and dtype: x's shape and dtype back, and float32 agrees with the
    float64 result."""
    geom = np.vstack([two_column_geometry(per_group) + [300.0 * s, 0.0]
                      for s in range(n_groups)])
    groups = np.repeat(np.arange(n_groups), per_group)
    x = striped(len(geom), n_samples, seed=seed)
    kwargs = dict(apply_agc=apply_agc, n_channel_pad=pad, groups=groups,
                  agc_window_length_s=0.02, rms_values=rms_of(x))
    ref = highpass_spatial_filter(x, geom, 1000.0, **kwargs)
    y = highpass_spatial_filter(x.astype(dtype), geom, 1000.0, **kwargs)
    assert y.shape == x.shape and y.dtype == dtype
    if dtype == np.float64:
        np.testing.assert_array_equal(y, ref)
    else:
        assert rel_max(y, ref) <= 1e-5


@settings(max_examples=25, deadline=None)
@given(n_samples=st.integers(5, 700), window_s=st.sampled_from([0.0004, 0.01, 0.05]),
       halo=st.integers(0, 100), seed=st.integers(0, 2**16))
def test_agc_gain_is_the_fft_convolution(n_samples, window_s, halo, seed):
    """The AGC's gain is the reference's ``fftconvolve(|x|, window, mode="same")`` to float64
    rounding, windows longer and shorter
    than x, any halo: the AGC-normalised, spatially filtered, re-gained traces equal those
    built from the reference's gain (with a floor as high as the RMS, so that the result
    depends on the gain's scale, not only on its shape)."""
    from scipy.signal import fftconvolve

    halo = min(halo, (n_samples - 1) // 2)
    geom = np1_geometry(16)
    x = striped(16, n_samples, seed=seed).astype(np.float64)
    rms = rms_of(x)
    w = agc_window(FS, window_s)
    gain = fftconvolve(np.abs(x), w[None], mode="same", axes=1)
    floor = 1.0 * rms[:, None]
    W = highpass_spatial_matrix(geom, n_channel_pad=8)
    want = (W @ (x / np.maximum(floor, gain)) * gain)[:, halo:n_samples - halo]
    got = highpass_spatial_filter(x, geom, FS, agc_window_length_s=window_s, rms_values=rms,
                                  epsilon=1.0, n_channel_pad=8, halo=halo)
    assert np.abs(got - want).max() <= 1e-11 * np.abs(want).max()


@settings(max_examples=20, deadline=None)
@given(cuts=st.lists(st.integers(1, 599), min_size=1, max_size=4, unique=True),
       dtype=st.sampled_from([np.float32, np.float64]), apply_agc=st.booleans(),
       extra=st.integers(0, 5), seed=st.integers(0, 2**16))
def test_chunks_with_a_halo_give_the_one_shot_interior(cuts, dtype, apply_agc, extra, seed):
    """Streaming: each chunk read with ``halo`` samples of context on both sides (at least
    the AGC window's half length) gives the one-shot result on its samples."""
    fs, seconds = 1000.0, 0.02                     # a 21-sample window: halo 10
    geom = np1_geometry(48)
    x = striped(48, 600, seed=seed).astype(dtype)
    rms = rms_of(x)
    kwargs = dict(apply_agc=apply_agc, n_channel_pad=20, agc_window_length_s=seconds,
                  rms_values=rms)
    whole = highpass_spatial_filter(x, geom, fs, **kwargs)
    halo = len(agc_window(fs, seconds)) // 2 + extra
    padded = np.pad(x, ((0, 0), (halo, halo)))    # zeros beyond the ends, as the one-shot
    edges = [0, *sorted(cuts), 600]
    parts = [highpass_spatial_filter(padded[:, a:b + 2 * halo], geom, fs, halo=halo, **kwargs)
             for a, b in zip(edges[:-1], edges[1:])]
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert rel_max(np.hstack(parts), whole.astype(np.float64)) <= tol


def test_bad_input():
    geom = np1_geometry(64)
    x = striped(64, 500, seed=9).astype(np.float32)
    with pytest.raises(TypeError, match="x: expected a NumPy or CuPy array"):
        highpass_spatial_filter(x.tolist(), geom, FS)
    with pytest.raises(TypeError, match="x: unsupported dtype int16"):
        highpass_spatial_filter(x.astype(np.int16), geom, FS)
    with pytest.raises(ValueError, match=r"x: expected a 2-D \[channels, samples\]"):
        highpass_spatial_filter(x[0], geom, FS)
    bad = x.copy()
    bad[3, 17] = np.nan
    with pytest.raises(ValueError, match=r"x: not finite at channel 3, sample 17 \(nan\)"):
        highpass_spatial_filter(bad, geom, FS)
    bad[3, 17] = np.inf
    with pytest.raises(ValueError, match="x: not finite at channel 3, sample 17"):
        highpass_spatial_filter(bad, geom, FS, apply_agc=False)
    with pytest.raises(ValueError, match=r"geometry: expected \[channels, 2\] positions in µm "
                                         r"\(x, y\), got shape \(64, 3\); pass geometry="):
        highpass_spatial_filter(x, np.zeros((64, 3)), FS)
    with pytest.raises(ValueError, match=r"geometry: expected \[channels, 2\]"):
        highpass_spatial_matrix(np.zeros(64))
    with pytest.raises(TypeError, match="geometry: expected"):
        highpass_spatial_matrix("np1")
    g = geom.copy()
    g[5, 1] = np.nan
    with pytest.raises(ValueError, match="geometry: the position of channel 5 is not finite"):
        highpass_spatial_filter(x, g, FS)
    with pytest.raises(ValueError, match="geometry: 63 positions for the 64 channels of x"):
        highpass_spatial_filter(x, geom[:63], FS)                 # before n_channel_pad
    flat = np.c_[20.0 * np.arange(64), np.zeros(64)]          # all at one depth
    with pytest.raises(ValueError, match=r"geometry: the 64 channels of group 0 all have "
                                         r"y = 0 µm.*pass direction= or groups="):
        highpass_spatial_filter(x, flat, FS)
    column = np.c_[np.zeros(64), 20.0 * np.arange(64)]
    with pytest.raises(ValueError, match="geometry: the 64 channels of group 0 all have x = 0"):
        highpass_spatial_matrix(column, direction="x")
    # a padding above a group's channels is capped there, as IBL's kfilt caps it (issue 45)
    np.testing.assert_array_equal(highpass_spatial_matrix(geom, n_channel_pad=65),
                                  highpass_spatial_matrix(geom, n_channel_pad=64))
    np.testing.assert_array_equal(
        highpass_spatial_matrix(geom, groups=np.arange(64) // 32, n_channel_pad=40),
        highpass_spatial_matrix(geom, groups=np.arange(64) // 32, n_channel_pad=32))
    with pytest.raises(ValueError, match="n_channel_pad: expected 0 <= n_channel_pad"):
        highpass_spatial_matrix(geom, n_channel_pad=-1)
    with pytest.raises(TypeError, match="n_channel_pad: expected an integer number"):
        highpass_spatial_matrix(geom, n_channel_pad=2.5)
    with pytest.raises(ValueError, match=r"n_channel_taper: expected 0 <= n_channel_taper <= "
                                         r"64"):
        highpass_spatial_matrix(geom, n_channel_taper=100)
    with pytest.raises(TypeError, match="n_channel_taper: expected an integer number"):
        highpass_spatial_matrix(geom, n_channel_taper="all")
    with pytest.raises(ValueError, match=r"n_channel_pad: a group of 8 channels padded by 0 on "
                                         r"each side gives 8 channels, not more than the 12"):
        highpass_spatial_matrix(np1_geometry(8), n_channel_pad=0)
    with pytest.raises(ValueError, match="direction: expected 'x' or 'y'"):
        highpass_spatial_matrix(geom, direction="z")
    for order in (0, 2.0, True):
        with pytest.raises(ValueError, match="highpass_butter_order: expected a positive"):
            highpass_spatial_matrix(geom, highpass_butter_order=order)
    for wn in (0.0, 1.0, np.nan):
        with pytest.raises(ValueError, match=r"highpass_butter_wn: expected a cut-off in "
                                             r"\(0, 1\)"):
            highpass_spatial_matrix(geom, highpass_butter_wn=wn)
    with pytest.raises(TypeError, match="highpass_butter_wn: expected a number"):
        highpass_spatial_matrix(geom, highpass_butter_wn=[0.01])
    with pytest.raises(ValueError, match=r"groups: expected one label per channel \(64\)"):
        highpass_spatial_matrix(geom, groups=[0, 1])
    with pytest.raises(ValueError, match=r"fs: the AGC's window is in seconds: pass fs= .*"
                                         r"or apply_agc=False"):
        highpass_spatial_filter(x, geom)
    for fs in (0.0, -1.0, np.inf):
        with pytest.raises(ValueError, match="fs: expected a positive sampling rate"):
            highpass_spatial_filter(x, geom, fs)
    with pytest.raises(TypeError, match="fs, agc_window_length_s: expected numbers"):
        highpass_spatial_filter(x, geom, "30 kHz")
    with pytest.raises(ValueError, match="agc_window_length_s: expected a positive duration"):
        highpass_spatial_filter(x, geom, FS, agc_window_length_s=0.0)
    for eps in (-0.1, np.nan):
        with pytest.raises(ValueError, match="epsilon: expected a finite number >= 0"):
            highpass_spatial_filter(x, geom, FS, epsilon=eps)
    with pytest.raises(TypeError, match="epsilon: expected a number"):
        highpass_spatial_filter(x, geom, FS, epsilon="small")
    for rms in (np.ones(63), np.full(64, np.nan), -np.ones(64)):
        with pytest.raises(ValueError, match=r"rms_values: expected 64 finite values >= 0"):
            highpass_spatial_filter(x, geom, FS, rms_values=rms)
    with pytest.raises(TypeError, match="dtype: expected float32, float64 or int16"):
        highpass_spatial_filter(x, geom, FS, dtype=np.uint8)
    for halo in (-1, 250, 1.5, True):
        with pytest.raises(ValueError, match=r"halo: expected an integer with 0 <= halo < "
                                             r"samples/2 \(500 samples\)"):
            highpass_spatial_filter(x, geom, FS, halo=halo)


def test_exported_at_the_top_level():
    assert dspk.highpass_spatial_filter is highpass_spatial_filter
    assert dspk.highpass_spatial_matrix is highpass_spatial_matrix
    assert dspk.ops.agc_window is agc_window


@pytest.mark.parametrize("apply_agc", [False, True], ids=["plain", "agc"])
@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_on_both_backends_matches_the_float64_reference(xp, dtype, tol, apply_agc):
    geom, shanks = four_shank_geometry()
    x = striped(len(geom), 6000, seed=10)
    kwargs = dict(apply_agc=apply_agc, groups=shanks, rms_values=rms_of(x))
    ref = highpass_spatial_filter(x, geom, FS, **kwargs)
    y = highpass_spatial_filter(xp.asarray(x.astype(dtype)), geom, FS, **kwargs)
    assert isinstance(y, type(xp.asarray(x))) and y.dtype == dtype and y.shape == x.shape
    assert rel_max(to_numpy(y), ref) <= tol
    # streamed on the device: two chunks with the AGC's halo give the one-shot interior
    halo = len(agc_window(FS)) // 2
    part = highpass_spatial_filter(xp.asarray(x[:, :4500].astype(dtype)), geom, FS,
                                   halo=halo, **kwargs)
    assert rel_max(to_numpy(part), ref[:, halo:4500 - halo]) <= tol
