"""int_matmul: bit-exact integer products on CPU and GPU (the `gpu` params), every integer
candidate on random views with full-range values, K long enough to need chunking, bad input."""

import importlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dspk
from dspk.backend import to_numpy
from dspk.linalg import candidates_int
from dspk.linalg.candidates_int import INT8_K_CHUNK, IntGramFloat64, IntViaFloat64

from tests.strategies import product_operands, reference

engine = importlib.import_module("dspk.linalg.matmul")
INTS = [np.uint8, np.int8, np.int16]
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def full_range(xp, shape, dtype, seed=0):
    info = np.iinfo(dtype)
    host = np.random.default_rng(seed).integers(info.min, int(info.max) + 1, shape, dtype=dtype)
    return xp.asarray(host)


@SETTINGS
@given(data=st.data(), dtype=st.sampled_from(INTS))
def test_every_int_candidate_is_bit_exact_on_random_views(xp, data, dtype):
    a, b = data.draw(product_operands(xp, dtype))
    p, _ = engine.as_problem(a, b, None, allowed=candidates_int.INT_DTYPES, result_dtype=np.int64)
    ref = reference(p.a, p.b)
    ran = 0
    for c in engine.tuner.candidates(p.gpu, "i"):
        if c.unavailable(p) is not None:
            continue
        p.out.to_array()[...] = -1
        c.run(p)
        got = to_numpy(p.out.to_array())
        assert np.array_equal(got, ref), c.name
        ran += 1
    assert ran


@pytest.mark.parametrize("dtype", INTS)
def test_public_call_and_symmetric_product(xp, dtype):
    x = full_range(xp, (9, 3001), dtype, 1)
    got = dspk.int_matmul(x, x.T)
    xh = to_numpy(x).astype(np.int64)
    assert got.dtype == np.int64 and type(got) is type(x)
    assert np.array_equal(to_numpy(got), xh @ xh.T)


def test_extremes_with_k_beyond_one_int32_accumulation(xp):
    """All -32768: every plane product is at its bound, and K exceeds one int8 GEMM's safe
    length, so the K chunking and the int64 recombination are both exercised."""
    k = INT8_K_CHUNK + 1000
    x = xp.full((2, k), -32768, dtype=np.int16)
    got = to_numpy(dspk.int_matmul(x, x.T))
    assert np.all(got == 32768 * 32768 * k)
    # batched (the GPU's K loop instead of split-K), with a column of 32767s
    xb = xp.stack([x, x])
    xb[1, :, 5] = 32767
    want = np.full((2, 2, 2), 32768 * 32768 * k, dtype=np.int64)
    want[1] += 32767 * 32767 - 32768 * 32768
    np.testing.assert_array_equal(to_numpy(dspk.int_matmul(xb, xb.transpose(0, 2, 1))), want)


def test_cpu_float64_path_chunks_k_exactly(monkeypatch):
    monkeypatch.setattr(candidates_int, "float64_k_chunk", lambda dtype: 7)
    x = full_range(np, (3, 50), np.int16, 2)
    p, _ = engine.as_problem(x, x.T, None, allowed=candidates_int.INT_DTYPES,
                           result_dtype=np.int64)
    IntViaFloat64().run(p)
    xh = x.astype(np.int64)
    assert np.array_equal(p.out.to_array()[0], xh @ xh.T)


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(INTS), batches=st.integers(0, 3), m=st.integers(1, 12),
       k=st.integers(1, 400), layout=st.sampled_from(["c", "f", "reversed", "strided"]),
       chunk=st.sampled_from([None, 1, 7, 64]), block=st.sampled_from([1, 5, 4096]),
       seed=st.integers(0, 2**32 - 1))
def test_cpu_float64_gram_is_bit_exact(dtype, batches, m, k, layout, chunk, block, seed):
    """X·Xᵀ through syrk on converted blocks: full-range values, rows and samples in any
    layout (F order, reversed, strided), batched or not, the exactness chunks and the
    conversion blocks at every boundary."""
    with pytest.MonkeyPatch.context() as mp:
        if chunk is not None:
            mp.setattr(candidates_int, "float64_k_chunk", lambda dt: chunk)
        mp.setattr(candidates_int, "GRAM_K_BLOCK", block)
        check_gram(dtype, batches, m, k, layout, seed)


def check_gram(dtype, batches, m, k, layout, seed):
    shape = (batches, m, k) if batches else (m, k)
    x = full_range(np, shape, dtype, seed % 1000)
    if layout == "f":
        x = np.asfortranarray(x)
    elif layout == "reversed":
        x = x[..., ::-1, ::-1]
    elif layout == "strided":
        x = full_range(np, shape[:-1] + (2 * k,), dtype, seed % 1000)[..., ::2]
    xt = np.swapaxes(x, -1, -2)
    p, _ = engine.as_problem(x, xt, None, allowed=candidates_int.INT_DTYPES,
                             result_dtype=np.int64)
    assert p.symmetric and IntGramFloat64().unavailable(p) is None
    p.out.to_array()[...] = -1
    IntGramFloat64().run(p)
    xh = x.astype(np.int64)
    assert np.array_equal(p.out.to_array().reshape(xh.shape[:-1] + (m,)),
                          np.matmul(xh, np.swapaxes(xh, -1, -2)))


def test_cpu_float64_gram_only_for_x_times_its_transpose():
    a = full_range(np, (3, 50), np.int16, 8)
    p, _ = engine.as_problem(a, a.T.copy(), None, allowed=candidates_int.INT_DTYPES,
                             result_dtype=np.int64)
    assert not p.symmetric
    assert "X·Xᵀ" in IntGramFloat64().unavailable(p)


def test_uint8_batched_broadcast(xp):
    a = full_range(xp, (4, 6, 33), np.uint8, 3)
    b = full_range(xp, (33, 5), np.uint8, 4)
    got = to_numpy(dspk.int_matmul(a, b))
    assert np.array_equal(got, to_numpy(a).astype(np.int64) @ to_numpy(b).astype(np.int64))


def test_explain_covers_integers():
    x = full_range(np, (4, 100), np.int8, 5)
    e = dspk.explain(x, x.T)
    # which exact candidate wins is a timing (the tuner's business, not a test's); what
    # explain must say is that integer products go to the integer candidates, all three
    # usable here (K·128² < 2^24, under 4M multiply-adds), and one of them chosen
    assert e.shape == (1, 4, 4, 100)
    assert e.available == {"int_f64gram": "available", "int_f64blas": "available",
                           "int_f32exact": "available", "int_direct": "available"}
    assert e.candidate in e.available


@pytest.mark.gpu
def test_gpu_int16_covariance_384_bit_identical():
    import cupy as cp

    x = full_range(cp, (384, 60000), np.int16, 6)
    got = dspk.int_matmul(x, x.T).get()
    xh = x.get().astype(np.int64)
    assert np.array_equal(got, xh @ xh.T)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", INTS)
def test_gpu_bound_plans_on_new_data_and_out(dtype):
    """Repeated calls of one geometry go through the bound plan: new data, a given ``out``
    (a strided view), X·Xᵀ and A·Bᵀ — each bit-identical to int64; a float call of the same
    geometry never finds the integer plan."""
    import cupy as cp

    for seed in range(3):
        x = full_range(cp, (40, 5003), dtype, 10 + seed)
        y = full_range(cp, (24, 5003), dtype, 20 + seed)
        xh, yh = x.get().astype(np.int64), y.get().astype(np.int64)
        assert np.array_equal(dspk.int_matmul(x, x.T).get(), xh @ xh.T)
        assert np.array_equal(dspk.int_matmul(x, y.T).get(), xh @ yh.T)
        big = cp.full((40, 60), -7, dtype=np.int64)
        dspk.int_matmul(x, y.T, out=big[:, 10:34])
        assert np.array_equal(big[:, 10:34].get(), xh @ yh.T)
        assert (big[:, :10] == -7).all() and (big[:, 34:] == -7).all()
    with pytest.raises(TypeError):
        dspk.linalg.matmul(x, x.T)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("shape", [(1, 1), (5, 33), (40, 5003), (3, 70000)])
def test_int_gram_gives_the_product_and_the_row_sums(xp, dtype, shape):
    """int_gram(x) = (x·xᵀ, row sums), exact; twice (the second call through the bound plan),
    on a view with a row stride and on a new array of the same geometry."""
    for seed in range(2):
        base = full_range(xp, (shape[0], shape[1] + 7), dtype, seed)
        for x in (base[:, 3:3 + shape[1]], xp.ascontiguousarray(base[:, :shape[1]])):
            s_mat, s = dspk.linalg.int_gram(x)
            xh = to_numpy(x).astype(np.int64)
            assert s_mat.dtype == np.int64 and s.dtype == np.int64
            assert type(s_mat) is type(x) and type(s) is type(x)
            assert np.array_equal(to_numpy(s_mat), xh @ xh.T)
            assert np.array_equal(to_numpy(s), xh.sum(axis=1))


def test_int_gram_bad_input(xp):
    with pytest.raises(ValueError, match="x: expected a 2-D"):
        dspk.linalg.int_gram(xp.zeros((2, 3, 4), np.int16))
    with pytest.raises(ValueError, match="x: expected a 2-D"):
        dspk.linalg.int_gram([[1, 2], [3, 4]])
    with pytest.raises(TypeError, match="x: unsupported dtype float32"):
        dspk.linalg.int_gram(xp.zeros((2, 3), np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("ddof", [0, 1])
def test_gpu_int16_covariance_bits_are_the_cpus(center, ddof):
    """The GPU's covariance of int16 (sums from the product's pass, one finishing kernel)
    gives the CPU's float64 bits."""
    import cupy as cp

    for shape in [(384, 60000), (7, 1001), (3, 70000)]:      # n >= 2^16: the checked path
        x = full_range(np, shape, np.int16, 3)
        got = dspk.covariance(cp.asarray(x), center=center, ddof=ddof).get()
        want = dspk.covariance(x, center=center, ddof=ddof)
        assert np.array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", candidates_int.GRAM16_VARIANTS)
def test_gpu_fused_int16_gram_is_bit_exact(variant):
    """The fused int16 X·Xᵀ kernel (every variant the tuner times): rows not a multiple of the
    64-row tile, K not a multiple of a stage, K long enough to need several chunks of at most
    2^15 samples, the extreme values -32768 and 32767 in every row, a row stride wider than the
    rows, S poisoned before the run, and the row sums it forms for int_gram."""
    import cupy as cp

    c = candidates_int.Int16GramFused(*variant)
    rng = np.random.default_rng(sum(variant))
    for m, k in [(1, 1), (5, 7), (63, 100), (64, 64), (65, 3001), (130, 4097), (200, 70001),
                 (384, 60000)]:
        width = -(-k // 8) * 8 + 24                   # rows 16-byte aligned: stride % 8 == 0
        base = rng.integers(-32768, 32768, (m, width), dtype=np.int16)
        base[:, 8] = -32768
        base[:, 9] = 32767
        for x in (cp.asarray(base)[:, 8:8 + k], cp.asarray(np.ascontiguousarray(base[:, 8:8 + k]))):
            p, _ = engine.as_problem(x, x.T, None, allowed=candidates_int.INT_DTYPES,
                                   result_dtype=np.int64)
            if x.strides[0] % 16 and m > 1:        # contiguous rows of k % 8 != 0 samples
                assert "16-byte aligned" in c.unavailable(p)
                continue
            assert c.unavailable(p) is None, (m, k)
            cfg = c.launch_config(p)
            assert cfg["k_chunk"] <= c.MAX_CHUNK and cfg["k_chunk"] % 64 == 0
            # the reference in float64 on the GPU: exact, every partial sum is an integer
            # below K·2^30 < 2^53 (an int64 product on the CPU takes ~10 s at 384 x 60 000)
            xf = x.astype(np.float64)
            want = (xf @ xf.T).astype(np.int64)
            out = p.out.to_array()
            out[...] = -1
            sums = cp.full(m, -1, dtype=np.int64)
            c.bind(p)(p.a.ptr, p.b.ptr, p.out.ptr, sums.data.ptr)
            assert bool((out[0] == want).all()), (c.name, m, k)
            assert np.array_equal(sums.get(), x.get().astype(np.int64).sum(axis=1)), (c.name, m, k)
            out[...] = -1
            c.run(p)                                   # no row sums asked for
            assert bool((out[0] == want).all()), (c.name, m, k)


@pytest.mark.gpu
def test_gpu_fused_int16_gram_says_what_it_cannot_run():
    import cupy as cp

    c = candidates_int.Int16GramFused()
    x = full_range(cp, (16, 1000), np.int16, 1)
    y = full_range(cp, (16, 1000), np.int16, 2)
    u = full_range(cp, (16, 1000), np.uint8, 3)

    def reason(a, b):
        p, _ = engine.as_problem(a, b, None, allowed=candidates_int.INT_DTYPES,
                               result_dtype=np.int64)
        return c.unavailable(p)

    assert reason(x, x.T) is None
    assert "X·Xᵀ of one matrix" in reason(x, y.T)
    assert "int16 operands only" in reason(u, u.T)
    assert "16-byte aligned" in reason(x[:, 1:], x[:, 1:].T)      # rows start 2 bytes in
    wide = full_range(cp, (16, 1003), np.int16, 4)
    assert "16-byte aligned" in reason(wide[:, :1000], wide[:, :1000].T)   # row stride 1003


# -- bad input ---------------------------------------------------------------------------------
def test_float_operands_are_refused(xp):
    with pytest.raises(TypeError, match="a: unsupported dtype float32; int_matmul takes"):
        dspk.int_matmul(xp.ones((2, 2), np.float32), xp.ones((2, 2), np.float32))


def test_mixed_integer_dtypes_are_refused(xp):
    with pytest.raises(TypeError, match="never promotes"):
        dspk.int_matmul(xp.ones((2, 2), np.int16), xp.ones((2, 2), np.int8))


def test_unsupported_integer_dtype(xp):
    with pytest.raises(TypeError, match="a: unsupported dtype int32"):
        dspk.int_matmul(xp.ones((2, 2), np.int32), xp.ones((2, 2), np.int32))


def test_out_must_be_int64(xp):
    with pytest.raises(TypeError, match="out: dtype int32 differs from the result's int64"):
        dspk.int_matmul(xp.ones((2, 3), np.int8), xp.ones((3, 2), np.int8),
                        out=xp.empty((2, 2), np.int32))
