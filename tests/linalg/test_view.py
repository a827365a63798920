import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspk.linalg import MatrixView

from tests.strategies import matrix_views


def test_of_wraps_without_copy():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    v = MatrixView.of(x)
    assert v.shape == (2, 3, 4) and v.strides == (12, 4, 1) and v.offset == 0
    assert np.shares_memory(v.to_array(), x)
    np.testing.assert_array_equal(v.to_array(), x)


def test_of_2d_and_negative_strides():
    x = np.arange(20, dtype=np.float64).reshape(4, 5)[::-1, ::2]
    v = MatrixView.of(x)
    assert v.shape == (1, 4, 3)
    np.testing.assert_array_equal(v.to_array()[0], x)
    assert np.shares_memory(v.to_array(), x)


def test_transpose_and_ranges():
    x = np.arange(12.0).reshape(3, 4)
    v = MatrixView.of(x)
    np.testing.assert_array_equal(v.T.to_array()[0], x.T)
    np.testing.assert_array_equal(v.cols(1, 3).to_array()[0], x[:, 1:3])
    np.testing.assert_array_equal(v.rows(1, 2).to_array()[0], x[1:2])
    np.testing.assert_array_equal(v.T.cols(0, 2).to_array()[0], x.T[:, :2])


def test_range_outside_is_refused():
    v = MatrixView.of(np.zeros((3, 4)), "w")
    with pytest.raises(ValueError, match=r"w: cols range \[2, 5\) is outside \[0, 4\)"):
        v.cols(2, 5)


def test_bad_buffer_and_ndim():
    with pytest.raises(TypeError, match="buffer must be a 1-D"):
        MatrixView(np.zeros((2, 2)), (2, 2), (2, 1))
    with pytest.raises(ValueError, match="expected a 2-D"):
        MatrixView.of(np.zeros(5), "x")
    with pytest.raises(TypeError, match="expected a NumPy or CuPy array"):
        MatrixView.of([[1.0]], "x")


def test_check_names_view_and_bound():
    buf = np.zeros(10, np.float32)
    with pytest.raises(ValueError,
                       match=r"a: highest element reached is buffer index 11 >= buffer size 10"):
        MatrixView(buf, (3, 4), (4, 1), 0, "a").check()
    with pytest.raises(ValueError, match=r"b: lowest element reached is buffer index -1 < 0"):
        MatrixView(buf, (2, 2), (-2, 1), 1, "b").check()


def test_check_32_bit_bound():
    buf = np.zeros(4, np.float32)
    # A view whose highest index passes 2^31 (the buffer check would also fail; the 32-bit
    # check must name its own bound when the buffer is large enough, which we fake here).
    v = MatrixView(buf, (1, 2, 2), (0, 2**31, 1), 0, "x")
    with pytest.raises(ValueError):
        v.check(index_bits=32)
    assert not v.fits_int32()


def test_layouts():
    x = np.zeros((5, 7), np.float32)
    assert MatrixView.of(x).layout() == "R"
    assert MatrixView.of(x.T).layout() == "C"
    assert MatrixView.of(x[:, ::2]).layout() == "S"
    assert MatrixView.of(x[:, 1:4]).layout() == "R"


def test_contiguous_gathers_in_row_major():
    x = np.arange(60.0).reshape(3, 4, 5)[:, ::-1, ::2]
    g = MatrixView.of(x).contiguous()
    assert g.strides == (12, 3, 1) and g.offset == 0
    np.testing.assert_array_equal(g.to_array(), x)


def test_aligned_keeps_blas_ready_views():
    x = np.zeros((4, 8), np.float64)
    v = MatrixView.of(x)
    assert v.aligned() is v
    s = MatrixView.of(x[:, ::2])
    assert s.aligned() is not s and s.aligned().layout() == "R"


def test_is_transpose_of():
    x = np.zeros((4, 8), np.float32)
    a, b = MatrixView.of(x), MatrixView.of(x.T)
    assert b.is_transpose_of(a) and a.is_transpose_of(b)
    assert not MatrixView.of(x[:, :4]).is_transpose_of(MatrixView.of(x[:4, :].T.copy()))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), shape=st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 6)),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_random_views_roundtrip(data, shape, dtype):
    v = data.draw(matrix_views(np, dtype, shape))
    v.check()
    arr = v.to_array()
    # Element [b, i, j] is buffer[offset + b*sb + i*sr + j*sc], by definition.
    b, i, j = (data.draw(st.integers(0, n - 1)) for n in shape)
    idx = v.offset + b * v.strides[0] + i * v.strides[1] + j * v.strides[2]
    assert arr[b, i, j] == v.buffer[idx]
    np.testing.assert_array_equal(v.contiguous().to_array(), arr)
    np.testing.assert_array_equal(v.T.to_array(), np.swapaxes(arr, 1, 2))
