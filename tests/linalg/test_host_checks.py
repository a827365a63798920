"""dspk.linalg.host_checks: the tuner's reads, writes and comparisons on the host give what
NumPy/CuPy indexing gives, on views of any geometry (transposes, ranges, negative and zero
strides), on the CPU and on the GPU (where they go through the gather kernel and memcpy)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspk.linalg import MatrixView
from dspk.linalg.host_checks import (fill_rows, identical, max_relative_difference, read_cols,
                                     read_matrix, read_rows, to_host)

from tests.conftest import xp_params
from tests.strategies import matrix_views

DTYPES = [np.float32, np.float64, np.int16, np.int32, np.int64]


def _module(name):
    if name == "numpy":
        return np
    import cupy

    return cupy


def _reference(v: MatrixView) -> np.ndarray:
    arr = v.to_array()
    return arr.get() if hasattr(arr, "get") else np.array(arr)


@pytest.mark.parametrize("xp_name", xp_params())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), dtype=st.sampled_from(DTYPES),
       shape=st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6)))
def test_reads_match_indexing(xp_name, data, dtype, shape):
    xp = _module(xp_name)
    v = data.draw(matrix_views(xp, dtype, shape))
    ref = _reference(v)
    b, r, c = shape
    batches = sorted(set(data.draw(st.lists(st.integers(0, b - 1), min_size=1, max_size=3))))
    rows = sorted(set(data.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=4))))
    cols = sorted(set(data.draw(st.lists(st.integers(0, c - 1), min_size=1, max_size=4))))
    for got, want in ((read_rows(v, batches, rows), ref[batches][:, rows, :]),
                      (read_cols(v, batches, cols), ref[batches][:, :, cols]),
                      (read_matrix(v, batches), ref[batches])):
        assert isinstance(got, np.ndarray) and got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("xp_name", xp_params())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64]),
       shape=st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6)))
def test_fill_rows_sets_exactly_those_rows(xp_name, data, dtype, shape):
    xp = _module(xp_name)
    v = data.draw(matrix_views(xp, dtype, shape))
    b, r, _ = shape
    batches = sorted(set(data.draw(st.lists(st.integers(0, b - 1), min_size=1, max_size=3))))
    rows = sorted(set(data.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=4))))
    value = np.iinfo(dtype).min if np.dtype(dtype).kind == "i" else np.nan
    # what NumPy's assignment does on a host copy of the same buffer
    host = v.buffer.get() if xp is not np else v.buffer.copy()
    expect = MatrixView(host, v.shape, v.strides, v.offset).to_array()
    for bi in batches:
        expect[bi, rows, :] = value
    fill_rows(v, batches, rows, value)
    got = v.buffer.get() if xp is not np else v.buffer
    np.testing.assert_array_equal(got, host)     # (NaN == NaN here)


@pytest.mark.parametrize("xp_name", xp_params())
def test_to_host_and_comparisons(xp_name):
    xp = _module(xp_name)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    x = xp.asarray(a)
    np.testing.assert_array_equal(to_host(x), a)
    np.testing.assert_array_equal(to_host(x.T), a.T)             # strided: the gather kernel
    np.testing.assert_array_equal(to_host(x[:, ::2]), a[:, ::2])
    y = x.copy()
    assert identical(x, y) and max_relative_difference(x, y) == 0.0
    y[2, 3] += 0.5
    assert not identical(x, y)
    want = 0.5 / float(np.abs(a).max())
    assert max_relative_difference(y, x) == pytest.approx(want, rel=1e-6)
    y[0, 0] = np.nan
    assert np.isnan(max_relative_difference(y, x))
    assert max_relative_difference(xp.zeros((0, 3)), xp.zeros((0, 3))) == 0.0
