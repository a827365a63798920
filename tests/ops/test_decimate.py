"""dspk.ops.decimate against scipy.signal.decimate(ftype="fir", zero_phase=True) on the same
arrays (factors, lengths, filter orders odd and even, white and band-limited noise, float32
and float64), the filter's documented response, blocks with a halo against one call, bad
inputs; the CuPy path against NumPy (`gpu`)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.signal import butter, decimate as scipy_decimate, freqz, sosfiltfilt

from dspk.backend import to_numpy
from dspk.ops import decimate, decimate_taps


def noise(c, n, seed=0, band=None):
    x = np.random.default_rng(seed).standard_normal((c, n))
    if band is not None:
        x = sosfiltfilt(butter(4, band, btype="bandpass", fs=30000.0, output="sos"), x)
    return x


@pytest.mark.parametrize("q", [2, 3, 12, 25])
@pytest.mark.parametrize("n_samples", [1000, 4567, 30001])
@pytest.mark.parametrize("band", [None, (1.0, 2000.0)])
def test_matches_scipy(q, n_samples, band):
    x = noise(4, n_samples, seed=q, band=band)
    ref = scipy_decimate(x, q, ftype="fir", zero_phase=True)
    got = decimate(x, q)
    assert got.shape == ref.shape and got.dtype == np.float64
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= 1e-13 * scale
    got32 = decimate(x.astype(np.float32), q)
    assert got32.dtype == np.float32
    assert np.abs(got32 - ref).max() <= 1e-6 * scale          # the docstring's 6e-7 (+margin)


@settings(max_examples=30, deadline=None)
@given(q=st.integers(2, 16), order=st.integers(1, 80), n_samples=st.integers(1, 700))
def test_any_order_and_length_matches_scipy(q, order, n_samples):
    x = noise(2, n_samples, seed=order)
    n = max(order, 1)
    try:
        ref = scipy_decimate(x, q, n=n, ftype="fir")
    except ValueError:                       # the reference refuses some short inputs
        return
    got = decimate(x, q, n=n)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * max(1.0, np.abs(ref).max()))


def test_the_filter_is_the_references_and_its_documented_response():
    from scipy.signal import firwin
    for q in (2, 4, 12):
        h = decimate_taps(q)
        np.testing.assert_array_equal(h, firwin(20 * q + 1, 1.0 / q, window="hamming"))
        w, resp = freqz(h, worN=np.linspace(0, 0.5, 20001), fs=1.0)
        a, nyq = np.abs(resp), 0.5 / q
        assert np.abs(a[w <= 0.8 * nyq] - 1).max() <= 0.0033
        assert a[w >= 1.2 * nyq].max() <= 0.0024
        assert abs(a[np.argmin(np.abs(w - nyq))] - 0.5) < 1e-3
    assert not decimate_taps(12).flags.writeable


@pytest.mark.parametrize("q", [3, 12])
def test_blocks_with_a_halo_equal_one_call(q):
    x = noise(3, 12345, seed=4)
    whole = decimate(x, q)
    halo = 10 * q + q                                 # at least the half length
    parts = []
    step = 40 * q                                     # block starts at multiples of q
    for s0 in range(0, x.shape[1], step):
        s1 = min(x.shape[1], s0 + step)
        a, b = s0 - halo, s1 + halo
        block = np.zeros((3, b - a))
        lo, hi = max(a, 0), min(b, x.shape[1])
        block[:, lo - a:hi - a] = x[:, lo:hi]
        parts.append(decimate(block, q, halo=halo))
    np.testing.assert_allclose(np.hstack(parts)[:, :whole.shape[1]], whole, rtol=0,
                               atol=1e-13 * np.abs(whole).max())


def test_factor_one_and_bad_inputs():
    x = noise(2, 100)
    y = decimate(x, 1)
    assert y is not x and np.array_equal(y, x)
    for q in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="q"):
            decimate(x, q)
    with pytest.raises(ValueError, match="n"):
        decimate(x, 2, n=0)
    for halo in (-1, 50, 1.5):
        with pytest.raises(ValueError, match="halo"):
            decimate(x, 2, halo=halo)
    with pytest.raises(TypeError, match="x"):
        decimate(x.astype(np.int16), 2)
    with pytest.raises(ValueError, match="x"):
        decimate(x[0], 2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("q", [2, 12])
def test_cupy_matches_numpy(dtype, tol, q):
    cp = pytest.importorskip("cupy")
    x = noise(37, 30011, seed=9).astype(dtype)
    ref = scipy_decimate(x.astype(np.float64), q, ftype="fir")
    got = decimate(cp.asarray(x), q)
    assert isinstance(got, cp.ndarray) and got.dtype == dtype
    np.testing.assert_allclose(to_numpy(got), ref, rtol=0, atol=tol * np.abs(ref).max())
    halo = decimate(cp.asarray(x), q, halo=11 * q)
    np.testing.assert_allclose(to_numpy(halo), decimate(x, q, halo=11 * q), rtol=0,
                               atol=tol * np.abs(ref).max())
