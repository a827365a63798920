"""dspk.ops.interpolation_matrix applied with spatial_filter against SpikeInterface's
interpolate_bad_channels (NP1.0 and NP2.0 layouts, several bad sets, sigma_um, p, the
Kilosort 2.5 (sigma_x, sigma_y) mode, given weights), its structure (hypothesis), bad input;
the CuPy path against NumPy (`gpu` params)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspk
from dspk.backend import to_numpy
from dspk.ops import interpolation_matrix, spatial_filter
from tests.geometry import np1_geometry, np2_geometry


def si_interpolate(x, geom, bad, **kwargs):
    """SpikeInterface's interpolate_bad_channels of [channels, samples] x."""
    core = pytest.importorskip("spikeinterface.core",
                               reason="the comparison runs against SpikeInterface")
    pre = pytest.importorskip("spikeinterface.preprocessing",
                              reason="the comparison runs against SpikeInterface")
    pi = pytest.importorskip("probeinterface", reason="SpikeInterface needs a probe attached")
    rec = core.NumpyRecording(np.ascontiguousarray(x.T), 30000.0)
    probe = pi.Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=geom, shapes="square", shape_params={"width": 12})
    probe.set_device_channel_indices(np.arange(len(geom)))
    attached = rec.set_probe(probe)        # in place from 0.105; a new recording before
    rec = rec if attached is None else attached
    ids = rec.get_channel_ids()[np.asarray(bad)]
    return pre.interpolate_bad_channels(rec, ids, **kwargs).get_traces().T


CASES = {
    "np1 scattered": (np1_geometry(), [0, 5, 100, 101, 102, 383], {"sigma_um": 20.0}),
    # most of the block is farther than the kernel reaches: all-zero rows, as the reference's
    "np1 block at the top": (np1_geometry(), list(range(340, 384)), {"sigma_um": 20.0}),
    "np1 p=2": (np1_geometry(), [7, 200, 201], {"sigma_um": 35.0, "p": 2.0}),
    "np2": (np2_geometry(), [1, 2, 50, 300], {"sigma_um": 15.0}),
    "np2 narrow kernel": (np2_geometry(64), [10, 11], {"sigma_um": 5.0}),
    "kilosort sigma pair": (np1_geometry(96), [3, 40, 41], {"sigma_um": [20.0, 30.0]}),
}


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("case", list(CASES))
def test_interpolation_matches_spikeinterface(case, dtype, tol):
    geom, bad, kwargs = CASES[case]
    x = np.random.default_rng(len(bad)).normal(0, 50, (len(geom), 2000))
    ref = si_interpolate(x, geom, bad, **kwargs)
    w = interpolation_matrix(geom, bad, **kwargs)
    assert w.shape == (len(geom), len(geom)) and w.dtype == np.float64
    y = spatial_filter(w, x.astype(dtype))
    assert y.dtype == dtype
    rel = np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert rel <= tol


def test_given_weights_are_used_as_spikeinterfaces():
    geom = np1_geometry(32)
    bad = [4, 9]
    weights = np.random.default_rng(0).random((30, 2))
    x = np.random.default_rng(1).normal(0, 50, (32, 500))
    ref = si_interpolate(x, geom, bad, sigma_um=20.0, weights=weights)
    w = interpolation_matrix(geom, bad, weights=weights)
    np.testing.assert_allclose(spatial_filter(w, x), ref, rtol=1e-12, atol=1e-12)


def test_a_bad_channel_far_from_every_good_one_is_zero():
    geom = np.c_[np.zeros(4), [0.0, 20.0, 40.0, 5000.0]]
    w = interpolation_matrix(geom, [3])
    np.testing.assert_array_equal(w[3], 0.0)
    np.testing.assert_array_equal(w[:3], np.eye(4)[:3])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 40), data=st.data(), sigma=st.floats(5.0, 60.0),
       p=st.floats(0.5, 2.5), as_mask=st.booleans())
def test_structure(n, data, sigma, p, as_mask):
    """Good rows are the identity's; bad rows have weights only at good channels, each at
    least the threshold, summing to at most 1 (1 unless the second threshold dropped some);
    a mask and an index list give the same W."""
    bad = data.draw(st.lists(st.integers(0, n - 1), min_size=0, max_size=n - 1, unique=True))
    geom = np1_geometry(n)
    mask = np.zeros(n, dtype=bool)
    mask[bad] = True
    w = interpolation_matrix(geom, mask if as_mask else bad, sigma_um=sigma, p=p)
    np.testing.assert_array_equal(w, interpolation_matrix(geom, mask, sigma_um=sigma, p=p))
    np.testing.assert_array_equal(w[~mask], np.eye(n)[~mask])
    rows = w[mask]
    assert (rows[:, mask] == 0).all()
    nz = rows[rows != 0]
    assert (nz >= 0.005).all()
    assert (rows.sum(axis=1) <= 1 + 1e-12).all()


def test_no_bad_channel_is_the_identity():
    np.testing.assert_array_equal(interpolation_matrix(np1_geometry(8), []), np.eye(8))


def test_a_probeinterface_probe_is_accepted():
    pi = pytest.importorskip("probeinterface", reason="a Probe as geometry")
    geom = np1_geometry(16)
    probe = pi.Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=geom)
    np.testing.assert_array_equal(interpolation_matrix(probe, [3]),
                                  interpolation_matrix(geom, [3]))


def test_bad_input():
    geom = np1_geometry(8)
    with pytest.raises(ValueError, match=r"bad: channel 8 is not one of the 8 channels of "
                                         r"geometry= \(indices 0..7\)"):
        interpolation_matrix(geom, [1, 8])
    with pytest.raises(ValueError, match="bad: channel -1 is not one of the 8 channels"):
        interpolation_matrix(geom, [-1])
    with pytest.raises(ValueError, match="bad: all 8 channels are bad"):
        interpolation_matrix(geom, list(range(8)))
    with pytest.raises(ValueError, match="bad: all 8 channels are bad"):
        interpolation_matrix(geom, np.ones(8, dtype=bool))
    with pytest.raises(ValueError, match=r"bad: a mask needs one flag per channel \(8\)"):
        interpolation_matrix(geom, np.ones(7, dtype=bool))
    with pytest.raises(ValueError, match="bad: expected channel indices"):
        interpolation_matrix(geom, ["ch3"])
    with pytest.raises(ValueError, match="bad: expected channel indices"):
        interpolation_matrix(geom, [1.5])
    with pytest.raises(ValueError, match=r"geometry: expected \[channels, 2\] positions in µm "
                                         r"\(x, y\), got shape \(8, 3\); pass geometry="):
        interpolation_matrix(np.zeros((8, 3)), [1])
    with pytest.raises(ValueError, match=r"geometry: expected \[channels, 2\]"):
        interpolation_matrix(np.zeros(8), [1])
    g = geom.copy()
    g[5, 1] = np.nan
    with pytest.raises(ValueError, match="geometry: the position of channel 5 is not finite"):
        interpolation_matrix(g, [1])
    for sigma in (0.0, -20.0, np.nan, [20.0, 0.0]):
        with pytest.raises(ValueError, match="sigma_um: expected a positive"):
            interpolation_matrix(geom, [1], sigma_um=sigma)
    with pytest.raises(ValueError, match="sigma_um: expected one number or a"):
        interpolation_matrix(geom, [1], sigma_um=[1.0, 2.0, 3.0])
    for p in (0.0, np.inf):
        with pytest.raises(ValueError, match="p: expected a positive finite number"):
            interpolation_matrix(geom, [1], p=p)
    with pytest.raises(ValueError, match=r"weights: expected \[good channels, bad channels\] "
                                         r"= \[6, 2\], got shape \(2, 6\)"):
        interpolation_matrix(geom, [1, 2], weights=np.ones((2, 6)))
    with pytest.raises(ValueError, match="weights: must be finite"):
        interpolation_matrix(geom, [1], weights=np.full((7, 1), np.nan))


def test_exported_at_the_top_level():
    assert dspk.interpolation_matrix is interpolation_matrix


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_interpolation_on_both_backends_matches_the_float64_reference(xp, dtype, tol):
    geom, bad, kwargs = CASES["np1 scattered"]
    x = np.random.default_rng(2).normal(0, 50, (len(geom), 3000))
    w = interpolation_matrix(geom, bad, **kwargs)
    ref = w @ x
    y = spatial_filter(xp.asarray(w), xp.asarray(x.astype(dtype)))
    assert isinstance(y, type(xp.asarray(x))) and y.dtype == dtype
    assert np.abs(to_numpy(y).astype(np.float64) - ref).max() <= tol * np.abs(ref).max()
