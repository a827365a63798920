"""The CPU's blocked Toeplitz FIR candidate (`dspk.ops.fir_cpu`) against float64 references:
shapes, strides, block edges, thread counts, chunk boundaries."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import signal
from threadpoolctl import threadpool_limits

import dspk
from dspk.ops import fir_cpu
from dspk.ops.fir_cpu import (ToeplitzBank, gemm, toeplitz_block, toeplitz_correlate,
                              toeplitz_matrices)


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[C, k, n] float64: Σ_j w[i, j]·x[c, t + j − T//2], zero outside (scipy, float64)."""
    c, n = x.shape
    k, t = w.shape
    out = np.zeros((c, k, n))
    for ci in range(c):
        for i in range(k):
            full = signal.correlate(x[ci].astype(np.float64), w[i], mode="full")
            out[ci, i] = full[t - 1 - t // 2:t - 1 - t // 2 + n]
    return out


def check(got: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    ref = reference(x, w)
    assert got.shape == ref.shape and got.dtype == x.dtype
    tol = 2e-6 if x.dtype == np.float32 else 1e-14
    # per output: |error| <= tol · Σ_j |w_j|·max|x| (a sum of T rounded products)
    scale = np.abs(x).max(initial=0.0) * np.abs(w).sum(axis=1)[None, :, None]
    assert np.all(np.abs(got - ref) <= tol * scale + 1e-30)


@settings(max_examples=60, deadline=None)
@given(channels=st.integers(1, 5), n=st.integers(1, 700), taps=st.integers(1, 130),
       k=st.integers(1, 4), block=st.sampled_from([None, 1, 3, 16, 64, 200]),
       f64=st.booleans(), layout=st.sampled_from(["contiguous", "row_stride", "col_stride"]),
       seed=st.integers(0, 2**32 - 1))
def test_toeplitz_matches_float64_correlation(channels, n, taps, k, block, f64, layout, seed):
    """Every block length against the edges (taps longer than a block, a tail longer than a
    block, no full block at all), rows with a stride, samples with a stride (copied)."""
    taps = min(taps, n)
    dtype = np.float64 if f64 else np.float32
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, taps))
    if layout == "contiguous":
        x = rng.standard_normal((channels, n)).astype(dtype)
    elif layout == "row_stride":                 # a column range of a wider array
        x = rng.standard_normal((channels, n + 9)).astype(dtype)[:, 5:5 + n]
    else:                                         # every other sample
        x = rng.standard_normal((channels, 2 * n)).astype(dtype)[:, ::2]
    check(toeplitz_correlate(x, w, block), x, w)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(200, 3000), taps=st.sampled_from([1, 2, 61, 64, 65, 199]),
       k=st.integers(1, 6), f64=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_toeplitz_on_a_probe_matches_float64(n, taps, k, f64, seed):
    """A probe's channels (hundreds of rows per product: BLAS's large-matrix kernels), more
    windows than `fir_cpu.BLOCKS` groups."""
    rng = np.random.default_rng(seed)
    dtype = np.float64 if f64 else np.float32
    x = rng.standard_normal((300, n)).astype(dtype)
    w = rng.standard_normal((k, taps))
    got = toeplitz_correlate(x, w)
    sub = rng.choice(300, 7, replace=False)               # the reference on a few rows
    check(got[sub], x[sub], w)


@pytest.mark.blas_threads
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_thread_count_gives_the_same_bits(dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((384, 2500)).astype(dtype)
    w = rng.standard_normal((6, 61))
    runs = []
    for threads in (1, 2, 3, 4):
        with threadpool_limits(threads, user_api="blas"):
            runs.append(toeplitz_correlate(x, w))
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])
    check(runs[0][:4], x[:4], w)


@settings(max_examples=20, deadline=None)
@given(start=st.integers(0, 900), width=st.integers(61, 1500), block=st.sampled_from([8, 64]))
def test_a_chunk_with_halos_equals_the_whole(start, width, block):
    """Streaming: a chunk's outputs whose windows lie inside it equal the one-shot result
    (within float rounding; the block grid moves with the chunk)."""
    rng = np.random.default_rng(start * 7 + width)
    x = rng.standard_normal((3, 2500)).astype(np.float32)
    w = rng.standard_normal((2, 61))
    whole = toeplitz_correlate(x, w, block)
    part = toeplitz_correlate(x[:, start:start + width], w, block)
    inner = slice(30, part.shape[2] - 30)
    got = part[:, :, inner]
    ref = whole[:, :, start + 30:start + part.shape[2] - 30]
    scale = np.abs(x).max() * np.abs(w).sum()
    assert np.abs(got - ref).max(initial=0.0) <= 2e-6 * scale


def test_toeplitz_matrices_and_block_lengths():
    w = np.array([[1.0, 2.0, 3.0]])
    h = toeplitz_matrices(w, 2, np.float32)
    assert h.dtype == np.float32
    np.testing.assert_array_equal(h[0], [[1, 0], [2, 1], [3, 2], [0, 3]])
    assert toeplitz_block(61) == 64 and toeplitz_block(263) == 32


def test_bad_toeplitz_arguments():
    x = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match="x: expected a 2-D float32/float64"):
        toeplitz_correlate(x.astype(np.int16), np.ones((1, 3)))
    with pytest.raises(ValueError, match="x: expected a 2-D float32/float64"):
        toeplitz_correlate(np.zeros(10, np.float32), np.ones((1, 3)))
    with pytest.raises(ValueError, match=r"weights: expected \[k, taps\]"):
        toeplitz_correlate(x, np.ones((1, 11)))
    with pytest.raises(ValueError, match=r"weights: expected \[k, taps\]"):
        toeplitz_correlate(x, np.ones(3))
    with pytest.raises(ValueError, match="block: expected a positive"):
        toeplitz_correlate(x, np.ones((1, 3)), block=0)


@pytest.mark.parametrize("n_filters,taps", [(6, 61), (1, 263)])
def test_fir_bank_and_fir_filter_offer_the_toeplitz_candidate(n_filters, taps, monkeypatch):
    """The tuner times the candidate for the CPU's fir_bank / fir_filter and keeps it only if
    it agrees with the reference; forced here, the public functions give its result."""
    from dspk.linalg.engine import current_engine

    rng = np.random.default_rng(9)
    x = rng.standard_normal((8, 4000)).astype(np.float32)
    bank = rng.standard_normal((n_filters, taps))
    seen = {}
    tuner = current_engine().tuner

    def pick(key, impls, gpu, agree, sliced=None, imports=None, jit=()):
        seen.update(impls)
        ref = impls[next(iter(impls))]()
        assert agree(impls["toeplitz_gemm"](), ref) is None
        assert list(sliced(0.25)) == list(impls)          # the same candidates on a slice
        return "toeplitz_gemm", "test", impls["toeplitz_gemm"]()

    monkeypatch.setattr(tuner, "choose_run", pick)
    got = dspk.fir_bank(x, bank)
    assert list(seen)[0] == "oaconvolve" and "toeplitz_gemm" in seen
    np.testing.assert_array_equal(got, toeplitz_correlate(x, bank))
    y = dspk.fir_filter(x, bank[0])
    np.testing.assert_array_equal(y, toeplitz_correlate(x, bank[:1, ::-1])[:, 0])


def test_examples_in_the_module_run(tmp_path, monkeypatch):
    """dspk.ops.fir_cpu is private to dspk.ops (not in tests/project/test_doctests.py's public
    list): its examples run here."""
    import doctest

    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
    result = doctest.testmod(fir_cpu, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


# --- ToeplitzBank: the pieces spike detection reduces in cache --------------------------------



@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), c=st.integers(1, 9), n=st.integers(1, 700),
       k=st.integers(1, 7), taps=st.sampled_from([1, 3, 5, 21, 61]),
       length=st.sampled_from([None, 1, 5, 16, 64]),
       dtype=st.sampled_from([np.float32, np.float64]), win=st.integers(1, 9))
def test_toeplitz_bank_pieces_are_toeplitz_correlate_bits(seed, c, n, k, taps, length, dtype,
                                                          win):
    """Interior, edges and arbitrary windows (at the row's ends too): toeplitz_correlate's
    values whatever the block length, row count or window length."""
    taps = min(taps, n if n % 2 else max(1, n - 1))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((c, n)).astype(dtype)
    w = rng.standard_normal((k, taps))
    ref = toeplitz_correlate(x, w)
    tb = ToeplitzBank(w, n, dtype, length)
    got = np.empty((c, k, n), dtype=dtype)
    got[:, :, :tb.half] = tb.span(x, 0, tb.half)
    got[:, :, tb.stop:] = tb.span(x, tb.stop, n)
    out = np.empty((max(tb.blocks, 1), k * tb.length), dtype=dtype)
    for r in range(c):
        tb.interior(x, r, out[:tb.blocks])
        got[r, :, tb.half:tb.stop] = out[:tb.blocks].reshape(
            tb.blocks, k, tb.length).transpose(1, 0, 2).reshape(k, -1)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    # tiny products can go to OpenBLAS's small-matrix kernels (other orders): within rounding
    # (the bits at detection's sizes: test_toeplitz_bank_bits_at_detection_sizes)
    np.testing.assert_allclose(got, ref, **tol)
    win = min(win, n)
    starts = rng.integers(0, n - win + 1, 6)
    starts[:2] = (0, n - win)                              # both ends: zeros outside
    rows = rng.integers(0, c, 6)
    wins = tb.windows(x, rows, starts, win)
    want = np.stack([ref[r, :, s:s + win] for r, s in zip(rows, starts)])
    one = tb.windows(x, rows[:1], starts[:1], win)         # one window: one row of product
    # six windows make a tiny product (OpenBLAS's small-matrix kernels): within rounding here;
    # detection's are thousands of windows (test_detect_cpu checks its scores to the bit)
    np.testing.assert_allclose(wins, want, **tol)
    np.testing.assert_allclose(one, want[:1], **tol)


def test_gemm_pads_single_rows_and_columns():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1, 70)), rng.standard_normal((70, 1))
    assert gemm(a, b).shape == (1, 1)
    np.testing.assert_allclose(gemm(a, b), a @ b, rtol=1e-12)
    stacked = rng.standard_normal((3, 70, 4))
    assert gemm(a, stacked).shape == (3, 1, 4)
    np.testing.assert_allclose(gemm(a, stacked), np.matmul(a, stacked), rtol=1e-12)


def test_toeplitz_bank_bad_input():
    with pytest.raises(ValueError, match=r"weights: expected \[k, taps\]"):
        ToeplitzBank(np.ones((2, 11)), 10, np.float32)
    with pytest.raises(ValueError, match=r"weights: expected \[k, taps\]"):
        ToeplitzBank(np.ones(11), 100, np.float32)
    with pytest.raises(ValueError, match="dtype: expected float32 or float64"):
        ToeplitzBank(np.ones((2, 11)), 100, np.int16)
    with pytest.raises(ValueError, match="length: expected a positive block length"):
        ToeplitzBank(np.ones((2, 11)), 100, np.float32, length=0)


@pytest.mark.parametrize("dtype", [np.float32])   # (float64's dgemm kernels: not checked)
def test_toeplitz_bank_bits_at_detection_sizes(dtype):
    """At detection's sizes (channel blocks of 4 rows, 6 x 61 taps, thousands of windows) the
    pieces are toeplitz_correlate's bits: one-thread ?gemm sums in the inner order, and the
    band's zeros add nothing."""
    rng = np.random.default_rng(3)
    c, n, k = 24, 3001, 6
    x = rng.standard_normal((c, n)).astype(dtype)
    w = rng.standard_normal((k, 61))
    ref = toeplitz_correlate(x, w)
    tb = ToeplitzBank(w, n, dtype)
    for c0 in range(0, c, 4):
        rows = x[c0:c0 + 4]
        np.testing.assert_array_equal(tb.span(rows, 0, tb.half), ref[c0:c0 + 4, :, :tb.half])
        np.testing.assert_array_equal(tb.span(rows, tb.stop, n), ref[c0:c0 + 4, :, tb.stop:])
    out = np.empty((tb.blocks, k * tb.length), dtype=dtype)
    for r in range(c):
        tb.interior(x, r, out)
        mid = out.reshape(tb.blocks, k, tb.length).transpose(1, 0, 2).reshape(k, -1)
        np.testing.assert_array_equal(mid, ref[r, :, tb.half:tb.stop])
    rows_, starts = rng.integers(0, c, 3000), rng.integers(0, n - 7, 3000)
    starts[:2] = (0, n - 8)
    wins = tb.windows(x, rows_, starts, 8)
    want = np.stack([ref[r, :, s:s + 8] for r, s in zip(rows_, starts)])
    np.testing.assert_array_equal(wins, want)


def test_long_filters_leave_the_toeplitz_products_out():
    """Beyond TOEPLITZ_MAX_TAPS the Toeplitz products (C·n·taps) are not even timed: a
    31 000-tap band-pass's first call spent ~40 s on them."""
    from dspk.ops.fir import TOEPLITZ_MAX_TAPS, bank_implementations

    x = np.zeros((2, 4 * TOEPLITZ_MAX_TAPS), np.float32)
    assert "toeplitz_gemm" in bank_implementations(np, x, np.ones((1, TOEPLITZ_MAX_TAPS)))
    assert list(bank_implementations(np, x, np.ones((1, TOEPLITZ_MAX_TAPS + 1)))) == \
        ["oaconvolve", "rfft_rows"]
