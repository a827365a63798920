"""The CPU's row-block spatial filter (`dspk.ops.spatial_cpu.RowBlocksPlan`) against float64
products: patterns, shapes, strides, thread counts; and `SpatialFilter` offering it only where
it saves work."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits

import dspk
from dspk.ops import spatial_cpu
from dspk.ops.spatial_cpu import MAX_AREA, RowBlocksPlan
from tests.geometry import np1_geometry


def banded(rng: np.random.Generator, n_out: int, n_in: int, width: int,
           empty: float = 0.0) -> np.ndarray:
    """A W whose row r has non-zeros near column r·n_in/n_out (a probe-ordered neighbourhood
    pattern), some of them missing, and a share ``empty`` of rows all zero."""
    w = np.zeros((n_out, n_in))
    for r in range(n_out):
        if rng.random() < empty:
            continue
        mid = int(r * n_in / max(n_out, 1))
        cols = np.arange(max(0, mid - width // 2), min(n_in, mid + width // 2 + 1))
        keep = cols[rng.random(cols.size) < 0.8]
        w[r, keep] = rng.standard_normal(keep.size)
    return w


def check(got: np.ndarray, w: np.ndarray, x: np.ndarray) -> None:
    ref = w.astype(np.float64) @ x.astype(np.float64)
    assert got.shape == ref.shape and got.dtype == x.dtype
    tol = 1e-6 if x.dtype == np.float32 else 1e-14
    # per output: |error| <= tol · Σ_j |w_rj|·max|x| (a sum of rounded products)
    scale = np.abs(w).sum(axis=1)[:, None] * np.abs(x).max(initial=0.0)
    assert np.all(np.abs(got - ref) <= tol * scale * 8 + 1e-30)


@settings(max_examples=60, deadline=None)
@given(n_out=st.integers(1, 40), n_in=st.integers(1, 40), n=st.integers(0, 9000),
       width=st.integers(1, 12), rows=st.integers(1, 17), empty=st.sampled_from([0.0, 0.3, 1.0]),
       f64=st.booleans(), layout=st.sampled_from(["contiguous", "row_stride", "col_stride"]),
       seed=st.integers(0, 2**32 - 1))
def test_row_blocks_match_the_float64_product(n_out, n_in, n, width, rows, empty, f64, layout,
                                              seed):
    """Blocks of any height (the last one shorter), spans clamped at W's last column, empty
    rows and empty blocks, column blocks and their tail (n across COLUMN_BLOCK), x rows with
    a stride and x samples with a stride (copied)."""
    rng = np.random.default_rng(seed)
    dtype = np.float64 if f64 else np.float32
    w = banded(rng, n_out, n_in, width, empty)
    if layout == "contiguous":
        x = rng.standard_normal((n_in, n)).astype(dtype)
    elif layout == "row_stride":
        x = rng.standard_normal((n_in, n + 5)).astype(dtype)[:, 3:3 + n]
    else:
        x = rng.standard_normal((n_in, 2 * n)).astype(dtype)[:, ::2]
    plan = RowBlocksPlan(w, dtype, rows)
    assert 1 <= plan.span <= n_in and plan.starts.size == -(-n_out // rows)
    assert np.all((plan.starts >= 0) & (plan.starts + plan.span <= n_in))
    check(plan(x), w, x)


@pytest.mark.blas_threads
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_thread_count_gives_the_same_bits(dtype):
    rng = np.random.default_rng(1)
    w = banded(rng, 384, 384, 33)
    x = rng.standard_normal((384, 20000)).astype(dtype)
    plan = RowBlocksPlan(w, dtype, 32)
    runs = []
    for threads in (1, 2, 3, 4):
        with threadpool_limits(threads, user_api="blas"):
            runs.append(plan(x))
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])
    check(runs[0], w, x)


def _local_whitening(order: np.ndarray | None = None) -> np.ndarray:
    rng = np.random.default_rng(2)
    geom = np1_geometry(256)
    if order is not None:
        geom = geom[order]
    x = rng.standard_normal((256, 4000))
    return dspk.whitening_matrix(np.cov(x) + np.eye(256), geometry_um=geom, n_neighbors=16)


def test_spatial_filter_offers_row_blocks_where_they_save_work():
    """Probe order: the blocks cover a small share of W, the candidates are offered and agree
    with the dense product; channels in a random order: spans as wide as W, not offered."""
    x = np.random.default_rng(3).standard_normal((256, 5000)).astype(np.float32)
    w = _local_whitening()
    f = dspk.SpatialFilter(w)
    impls = f.implementations(x)
    assert list(impls)[0] == "dense_matmul"
    assert {"row_blocks32", "row_blocks64"} <= set(impls)
    ref = w @ x.astype(np.float64)
    for name in ("row_blocks32", "row_blocks64"):
        got = impls[name]()
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
        assert list(f.implementations(x, only=name)) == [name]
    shuffled = _local_whitening(np.random.default_rng(4).permutation(256))
    g = dspk.SpatialFilter(shuffled)
    assert g.sparse and RowBlocksPlan(shuffled, np.float32, 32).area > MAX_AREA
    assert not any(n.startswith("row_blocks") for n in g.implementations(x))


def test_bad_row_block_arguments():
    with pytest.raises(ValueError, match="w: expected a non-empty 2-D"):
        RowBlocksPlan(np.ones(3), np.float32, 4)
    with pytest.raises(ValueError, match="rows: expected a positive"):
        RowBlocksPlan(np.eye(3), np.float32, 0)
    plan = RowBlocksPlan(np.eye(3), np.float32, 2)
    with pytest.raises(ValueError, match=r"x: expected \[3, samples\] float32"):
        plan(np.ones((4, 5), np.float32))
    with pytest.raises(ValueError, match=r"x: expected \[3, samples\] float32"):
        plan(np.ones((3, 5), np.float64))


def test_examples_in_the_module_run(tmp_path, monkeypatch):
    """dspk.ops.spatial_cpu is private to dspk.ops: its examples run here."""
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
    result = doctest.testmod(spatial_cpu, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
