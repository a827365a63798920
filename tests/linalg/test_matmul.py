"""matmul on CPU and GPU (the `gpu` params): random views against a float64 reference, the
accuracy targets, and every bad input the engine must refuse before launching anything."""

import importlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dspk
from dspk.linalg import MatrixView, matmul

from tests.strategies import product_operands, reference

matmul_module = importlib.import_module("dspk.linalg.matmul")

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def realistic(xp, channels, samples, dtype=np.float32, seed=0):
    """Correlated, non-zero-mean channels, like raw extracellular traces (in µV)."""
    rng = np.random.default_rng(seed)
    sources = rng.standard_normal((channels // 4 + 2, samples))
    mixing = rng.standard_normal((channels, sources.shape[0])) * 20
    offsets = rng.uniform(-300, 300, (channels, 1))
    x = mixing @ sources + offsets + 5 * rng.standard_normal((channels, samples))
    return xp.asarray(x.astype(dtype))


def rel_err(got, ref):
    got = np.asarray(got.get() if hasattr(got, "get") else got, dtype=np.float64)
    return np.linalg.norm(got - ref) / np.linalg.norm(ref)


@SETTINGS
@given(data=st.data(), dtype=st.sampled_from([np.float32, np.float64]))
def test_random_views_give_reference_product(xp, data, dtype, monkeypatch):
    # Tuning every random shape would time every candidate; test_candidates runs them all.
    monkeypatch.setenv("DSPK_TUNE", "off")
    a, b = data.draw(product_operands(xp, dtype))
    got = matmul(a, b)
    ref = reference(a, b)
    assert got.shape == ref.shape
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert rel_err(got, ref) <= tol


@SETTINGS
@given(data=st.data(), where=st.sampled_from(["low", "high"]), which=st.sampled_from(["a", "b"]))
def test_out_of_bounds_views_are_refused_before_launch(xp, data, where, which, monkeypatch):
    a, b = data.draw(product_operands(xp, np.float32))
    v = a if which == "a" else b
    lo, hi = v.extent()
    shift = -(lo + 1) if where == "low" else v.buffer.size - hi
    bad = MatrixView(v.buffer, v.shape, v.strides, v.offset + shift, v.name)
    a, b = (bad, b) if which == "a" else (a, bad)

    def launched(*args, **kw):  # pragma: no cover - the point is that it never runs
        raise AssertionError("a candidate was launched on an invalid view")

    monkeypatch.setattr(matmul_module.tuner, "select", launched)
    with pytest.raises(ValueError, match=f"^{which}: (lowest|highest) element"):
        matmul(a, b)


def test_returns_the_array_type_given(xp):
    a = xp.ones((3, 5), np.float32)
    b = xp.ones((5, 2), np.float32)
    c = matmul(a, b)
    assert type(c) is type(a) and c.shape == (3, 2) and c.dtype == np.float32
    c3 = matmul(a[None], b)
    assert c3.shape == (1, 3, 2)


def test_broadcast_single_batch(xp):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 6))
    x = rng.standard_normal((5, 6, 7))
    got = matmul(xp.asarray(w), xp.asarray(x))
    np.testing.assert_allclose(dspk.backend.to_numpy(got), w @ x, rtol=1e-12, atol=1e-12)


def test_out_parameter(xp):
    a = xp.asarray(np.random.default_rng(1).standard_normal((2, 3, 4)))
    b = xp.asarray(np.random.default_rng(2).standard_normal((2, 4, 5)))
    out = xp.full((2, 3, 5), np.nan)
    assert matmul(a, b, out=out) is out
    np.testing.assert_allclose(dspk.backend.to_numpy(out),
                               np.matmul(dspk.backend.to_numpy(a), dspk.backend.to_numpy(b)),
                               rtol=1e-12)


def test_out_strided_view(xp):
    a = xp.asarray(np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32))
    b = xp.asarray(np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32))
    big = xp.zeros((3, 12), np.float32)
    out = MatrixView.of(big).T.rows(1, 7)  # [6, 3] written down the columns of `big`
    matmul(a, b, out=out)
    ref = np.matmul(dspk.backend.to_numpy(a).astype(float), dspk.backend.to_numpy(b))
    np.testing.assert_allclose(dspk.backend.to_numpy(big).T[1:7], ref, rtol=1e-5, atol=1e-5)
    assert float(abs(big[:, 0]).sum()) == 0.0 and float(abs(big[:, 7:]).sum()) == 0.0


def test_empty_and_zero_k(xp):
    a = xp.ones((3, 0), np.float32)
    b = xp.ones((0, 4), np.float32)
    c = matmul(a, b)
    assert c.shape == (3, 4) and float(abs(c).sum()) == 0.0
    assert matmul(xp.ones((0, 2)), xp.ones((2, 3))).shape == (0, 3)


def test_symmetric_detection_and_exact_symmetry(xp):
    x = realistic(xp, 16, 5000)
    c = matmul(x, x.T)
    c = dspk.backend.to_numpy(c)
    ref = dspk.backend.to_numpy(x).astype(np.float64)
    ref = ref @ ref.T
    assert rel_err(c, ref) <= 1e-6


def test_covariance_384_accuracy(xp):
    """Acceptance: float32 X·Xᵀ on realistic [384, 60000] data within 1e-6 of float64."""
    x = realistic(xp, 384, 60000)
    c = matmul(x, x.T)
    xh = dspk.backend.to_numpy(x).astype(np.float64)
    assert rel_err(c, xh @ xh.T) <= 1e-6


@pytest.mark.parametrize("shape", [(4, 60000), (64, 60000)])
def test_small_covariance_accuracy(xp, shape):
    x = realistic(xp, *shape, seed=5)
    c = matmul(x, x.T)
    xh = dspk.backend.to_numpy(x).astype(np.float64)
    assert rel_err(c, xh @ xh.T) <= 1e-6


def test_needs_more_than_tf32(xp):
    """Operands whose products need more than TF32's 10 mantissa bits: zero-mean data, where
    TF32 errs near 3e-4. Must stay at float32 accuracy."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((256, 2048)).astype(np.float32)
    b = rng.standard_normal((2048, 192)).astype(np.float32)
    got = matmul(xp.asarray(a), xp.asarray(b))
    assert rel_err(got, a.astype(np.float64) @ b) <= 1e-5


# -- bad input -------------------------------------------------------------------------------
def test_wrong_ndim(xp):
    with pytest.raises(ValueError, match="a: expected a 2-D"):
        matmul(xp.ones(3, np.float32), xp.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="b: expected a 2-D"):
        matmul(xp.ones((3, 2), np.float32), xp.ones((1, 1, 2, 2), np.float32))


def test_not_an_array():
    with pytest.raises(TypeError, match="a: expected a NumPy or CuPy array"):
        matmul([[1.0]], np.ones((1, 1)))


def test_inner_mismatch(xp):
    with pytest.raises(ValueError, match="inner dimensions differ"):
        matmul(xp.ones((3, 4), np.float32), xp.ones((5, 2), np.float32))


def test_batch_mismatch(xp):
    with pytest.raises(ValueError, match="batch counts differ: a has 2, b has 3"):
        matmul(xp.ones((2, 3, 4)), xp.ones((3, 4, 2)))


@pytest.mark.parametrize("dtype", [np.int16, np.float16, np.complex64, np.int64])
def test_unsupported_dtype(xp, dtype):
    with pytest.raises(TypeError, match="a: unsupported dtype"):
        matmul(xp.ones((2, 2), dtype), xp.ones((2, 2), dtype))


def test_mixed_dtypes_never_promote(xp):
    with pytest.raises(TypeError, match="never promotes or demotes silently"):
        matmul(xp.ones((2, 2), np.float32), xp.ones((2, 2), np.float64))


def test_out_wrong_shape_dtype(xp):
    a, b = xp.ones((2, 3)), xp.ones((3, 4))
    with pytest.raises(ValueError, match=r"out: shape \(4, 2\) does not hold"):
        matmul(a, b, out=xp.empty((4, 2)))
    with pytest.raises(TypeError, match="out: dtype float32 differs"):
        matmul(a, b, out=xp.empty((2, 4), np.float32))


def test_out_overlapping_input(xp):
    buf = xp.ones((4, 4))
    with pytest.raises(ValueError, match="out overlaps a"):
        matmul(buf, xp.ones((4, 4)), out=buf)
    with pytest.raises(ValueError, match="out overlaps b"):
        matmul(xp.ones((2, 4)), buf, out=buf[:2])


def test_out_read_only():
    out = np.empty((2, 2))
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: array is read-only"):
        matmul(np.ones((2, 2)), np.ones((2, 2)), out=out)


@pytest.mark.gpu
def test_numpy_and_cupy_mixed():
    import cupy as cp

    with pytest.raises(TypeError, match="mix NumPy and CuPy"):
        matmul(np.ones((2, 2)), cp.ones((2, 2)))
    with pytest.raises(ValueError, match="out: must be on the operands' device"):
        matmul(cp.ones((2, 2)), cp.ones((2, 2)), out=np.empty((2, 2)))


@pytest.mark.gpu
def test_arrays_on_different_gpus():
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    with cp.cuda.Device(0):
        a = cp.ones((2, 2))
    with cp.cuda.Device(1):
        b = cp.ones((2, 2))
    with pytest.raises(ValueError, match="a is on GPU 0 but b is on GPU 1"):
        matmul(a, b)
