"""dspk.ops.blank_saturation against SpikeInterface's blank_saturation (every direction, given
and default fills, float and int16 traces), shapes and dtypes (hypothesis), bad input; the
CuPy path against NumPy (`gpu` params)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspk
from dspk.backend import to_numpy
from dspk.ops import blank_saturation


def si_blank(x, **kwargs):
    """SpikeInterface's blank_saturation of [channels, samples] x, as [channels, samples]."""
    core = pytest.importorskip("spikeinterface.core",
                               reason="the comparison runs against SpikeInterface")
    pre = pytest.importorskip("spikeinterface.preprocessing",
                              reason="the comparison runs against SpikeInterface")
    rec = core.NumpyRecording(np.ascontiguousarray(x.T), 30000.0)
    return pre.blank_saturation(rec, **kwargs).get_traces().T


def traces(dtype, seed=0, shape=(6, 3000)):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 100, shape)
    x[rng.random(shape) < 0.01] = 1000.0           # saturated both ways, and exactly at it
    x[rng.random(shape) < 0.01] = -1000.0
    x[rng.random(shape) < 0.01] = 400.0
    x[rng.random(shape) < 0.01] = -400.0
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16])
@pytest.mark.parametrize("direction, threshold", [("upper", 400.0), ("lower", -400.0),
                                                  ("both", 400.0), ("lower", 50.0),
                                                  ("upper", -20.5)])
@pytest.mark.parametrize("fill", [0.0, -7.6, 123.0])
def test_blank_saturation_matches_spikeinterface(dtype, direction, threshold, fill):
    x = traces(dtype)
    ref = si_blank(x, abs_threshold=threshold, direction=direction, fill_value=fill)
    got = blank_saturation(x, threshold, direction=direction, fill=fill)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(got, ref)
    assert (got != x).any()                          # something was blanked


@pytest.mark.parametrize("dtype", [np.float32, np.int16])
def test_the_default_fill_is_the_median_as_spikeinterfaces_over_the_whole_array(dtype):
    # the reference's median of random chunks: one chunk as long as the recording is x itself
    x = traces(dtype, seed=1, shape=(4, 500)) + dtype(3)
    ref = si_blank(x, abs_threshold=400.0, direction="both", num_chunks_per_segment=1,
                   chunk_size=500)
    np.testing.assert_array_equal(blank_saturation(x, 400.0, direction="both"), ref)
    got = blank_saturation(x, 400.0, direction="both")
    assert got[np.abs(x) >= 400].tolist() == [np.asarray(np.median(x)).astype(dtype)] * \
        int((np.abs(x) >= 400).sum())


@settings(max_examples=40, deadline=None)
@given(shape=st.tuples(st.integers(1, 5), st.integers(1, 60)),
       dtype=st.sampled_from([np.float32, np.float64, np.int16]),
       direction=st.sampled_from(["upper", "lower", "both"]),
       threshold=st.floats(-300, 300), fill=st.floats(-100, 100), seed=st.integers(0, 999))
def test_blank_saturation_is_the_element_wise_rule(shape, dtype, direction, threshold, fill,
                                                   seed):
    x = np.random.default_rng(seed).normal(0, 150, shape).astype(dtype)
    before = x.copy()
    got = blank_saturation(x, threshold, direction=direction, fill=fill)
    np.testing.assert_array_equal(x, before)                       # x is not modified
    assert got.shape == x.shape and got.dtype == x.dtype
    xf = x.astype(np.float64)
    mask = {"upper": xf >= threshold, "lower": xf <= threshold,
            "both": (xf <= -threshold) | (xf >= threshold)}[direction]
    np.testing.assert_array_equal(got[~mask], x[~mask])
    assert (got[mask] == np.asarray(fill).astype(dtype)).all()
    # a chunk of samples is blanked as in the whole, given the fill (no median per chunk)
    k = shape[1] // 2
    np.testing.assert_array_equal(
        blank_saturation(x[:, k:], threshold, direction=direction, fill=fill), got[:, k:])


def test_nan_is_never_blanked_and_needs_a_fill():
    x = np.array([[np.nan, 1000.0, 3.0]])
    np.testing.assert_array_equal(blank_saturation(x, 500.0, fill=0.0), [[np.nan, 0.0, 3.0]])
    with pytest.raises(ValueError, match="x: contains NaN, so it has no median .* pass fill="):
        blank_saturation(x, 500.0)


def test_bad_input():
    x = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match="direction: expected 'upper', 'lower' or 'both'"):
        blank_saturation(x, 1.0, direction="above")
    for t in (np.nan, np.inf):
        with pytest.raises(ValueError, match="threshold: expected a finite number"):
            blank_saturation(x, t)
    with pytest.raises(TypeError, match="threshold: expected a number"):
        blank_saturation(x, "high")
    with pytest.raises(TypeError, match="threshold: expected a number"):
        blank_saturation(x, None)
    with pytest.raises(ValueError, match="fill: expected a finite number"):
        blank_saturation(x, 1.0, fill=np.nan)
    with pytest.raises(TypeError, match="fill: expected a number"):
        blank_saturation(x, 1.0, fill="median")
    with pytest.raises(ValueError, match="fill: 40000.0 does not fit x's int16 samples"):
        blank_saturation(np.zeros((2, 10), np.int16), 1.0, fill=40000.0)
    with pytest.raises(TypeError, match="x: unsupported dtype uint16"):
        blank_saturation(np.zeros((2, 10), np.uint16), 1.0)
    with pytest.raises(ValueError, match="x: expected a 2-D"):
        blank_saturation(np.zeros(10), 1.0)


def test_exported_at_the_top_level():
    assert dspk.blank_saturation is blank_saturation


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16])
def test_blank_saturation_on_both_backends(xp, dtype):
    x = traces(dtype, seed=3)
    for direction, threshold in (("upper", 400.0), ("lower", -400.0), ("both", 400.0)):
        ref = blank_saturation(x, threshold, direction=direction)
        got = blank_saturation(xp.asarray(x), threshold, direction=direction)
        assert isinstance(got, type(xp.asarray(x))) and got.dtype == dtype
        np.testing.assert_array_equal(to_numpy(got), ref)
