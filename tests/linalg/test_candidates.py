"""Every candidate (CPU and GPU), run directly, on random views and on the shapes it was written
for, against a float64 reference; the tuner's choice is only as good as these."""

import importlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspk.linalg import MatrixView
from dspk.linalg.problem import Problem

from tests.strategies import product_operands, reference

engine = importlib.import_module("dspk.linalg.matmul")


def run_all(a, b, out=None, symmetric_ok=True):
    """Run every available candidate for a·b; returns {name: (result, reference)}."""
    p, result = engine.as_problem(a, b, out)
    ref = reference(p.a, p.b)
    results = {}
    for c in engine.tuner.candidates(p.gpu):
        if c.unavailable(p) is not None:
            continue
        p.out.to_array()[...] = np.nan
        c.run(p)
        got = p.out.to_array()
        got = np.asarray(got.get() if hasattr(got, "get") else got, dtype=np.float64)
        results[c.name] = got
    return results, ref


def assert_close(results, ref, dtype, tol=None):
    tol = tol or (2e-6 if dtype == np.float32 else 1e-13)
    scale = np.linalg.norm(ref) or 1.0
    for name, got in results.items():
        assert np.isfinite(got).all(), f"{name}: outputs not written"
        err = np.linalg.norm(got - ref) / scale
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol}"


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), dtype=st.sampled_from([np.float32, np.float64]))
def test_every_candidate_on_random_views(xp, data, dtype):
    a, b = data.draw(product_operands(xp, dtype))
    results, ref = run_all(a, b)
    assert results  # at least one candidate always applies
    assert_close(results, ref, dtype)


def seed_array(xp, shape, dtype, seed=0, mean=0.0):
    rng = np.random.default_rng(seed)
    return xp.asarray((rng.standard_normal(shape) + mean).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", [
    ("cov", 4, 60000), ("cov", 7, 3001), ("cov", 64, 60000), ("cov", 50, 20000),
    ("cov", 384, 6000), ("cov", 300, 4000),
    ("wx", 4, 4, 60000), ("wx", 64, 64, 60000), ("wx", 6, 61, 100000), ("wx", 3, 17, 1001),
])
def test_candidates_on_seed_shapes(xp, case, dtype):
    if case[0] == "cov":
        _, c, n = case
        x = seed_array(xp, (c, n), dtype, mean=2.0)
        results, ref = run_all(x, x.T)
        names = set(results)
        if xp.__name__ == "cupy" and c <= 8:
            assert "direct_gram_small" in names
        if xp.__name__ == "cupy" and 8 < c <= 64:
            assert "direct_gram_tiled4" in names
        if xp.__name__ == "cupy" and c >= 256:
            assert any(n.startswith("cublas_symblock") for n in names)
    else:
        _, m, k, n = case
        w = seed_array(xp, (m, k), dtype, 1)
        x = seed_array(xp, (k, n), dtype, 2)
        results, ref = run_all(w, x)
        if xp.__name__ == "cupy":
            assert "direct_wx1" in results
            if n % 4 == 0:
                assert any(name.startswith("direct_wxv") for name in results)
        # the mirrored shape, X·W with W small on the right
        results_t, ref_t = run_all(x.T, w.T)
        if xp.__name__ == "cupy":
            assert "direct_wx1" in results_t
        assert_close(results_t, ref_t, dtype)
    assert_close(results, ref, dtype)


def test_batched_broadcast_and_strided_out(xp):
    w = seed_array(xp, (1, 5, 9), np.float32, 3)
    x = seed_array(xp, (4, 9, 700), np.float32, 4)
    big = xp.zeros((4, 700, 8), np.float32)
    out = MatrixView.of(big).T.rows(1, 6)  # [4, 5, 700] written across `big`'s rows
    results, ref = run_all(w, x, out=out)
    assert len(results) >= (2 if xp.__name__ == "cupy" else 1)
    assert_close(results, ref, np.float32)


@pytest.mark.gpu
def test_gpu_gather_kernel_applies_offset_and_strides():
    import cupy as cp

    host = np.arange(5000, dtype=np.float32)
    v = MatrixView(cp.asarray(host), (3, 7, 11), (-1000, 3, 50), 2100, "g")
    g = v.contiguous()
    ref = np.lib.stride_tricks.as_strided(host[2100:], (3, 7, 11), (-4000, 12, 200))
    np.testing.assert_array_equal(g.to_array().get(), ref)
    assert g.ptr % 256 == 0


@pytest.mark.gpu
def test_gpu_direct_kernels_reject_views_beyond_32_bits():
    import cupy as cp

    from dspk.linalg.candidates_gpu import GramSmall

    x = MatrixView(cp.zeros(16, cp.float32), (1, 2, 2), (0, 2**31, 1), 0, "a")
    p = Problem(x, x.T, x, True)
    assert "32-bit" in GramSmall().unavailable(p)
    with pytest.raises(ValueError):
        GramSmall().run(p)


@pytest.mark.gpu
def test_gpu_fp64_accumulation_variants_follow_the_device():
    import cupy as cp

    from dspk.linalg.candidates_gpu import GramSmall, _fp64_ratio

    x = cp.ones((4, 1000), cp.float32)
    p, _ = engine.as_problem(x, x.T, None)
    reason = GramSmall("f64").unavailable(p)
    if _fp64_ratio(0) <= 2:
        assert reason is None
    else:
        assert "1/" in reason


@pytest.mark.gpu
def test_gpu_symblock_stays_fp32_when_the_shared_handle_is_set_to_tf32():
    """s/dgemmBatched have no compute-type argument: the candidate must force the handle's
    math mode itself (TF32 on CuPy's shared handle would otherwise err ~3e-4)."""
    import cupy as cp
    from cupy_backends.cuda.libs import cublas

    from dspk.linalg.candidates_gpu import CublasSymBlocks

    x = seed_array(cp, (256, 8192), np.float32, 9)  # zero-mean: TF32 would show
    p, _ = engine.as_problem(x, x.T, None)
    handle = cp.cuda.device.get_cublas_handle()
    old = cublas.getMathMode(handle)
    cublas.setMathMode(handle, 3)  # CUBLAS_TF32_TENSOR_OP_MATH
    try:
        CublasSymBlocks(128, 2).run(p)
        assert cublas.getMathMode(handle) == 3  # put back
    finally:
        cublas.setMathMode(handle, old)
    xh = x.get().astype(np.float64)
    ref = xh @ xh.T
    got = p.out.to_array().get()[0].astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
