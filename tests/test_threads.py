"""Results that do not depend on the BLAS thread count: the engine's CPU products, the
whitening and PCA fits, and a whole preprocessing job in processes with 1, 2 and 3 threads."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits

from dspk.linalg import matmul
from dspk.linalg.candidates_cpu import column_block, cpu_candidates
from dspk.linalg.threads import blas_threads, parallel_blocks, single_threaded_blas
from dspk.ops import PCA, whitening_matrix

engine = importlib.import_module("dspk.linalg.matmul")
ROOT = Path(__file__).resolve().parents[1]
THREADS = (1, 2, 3)


def _under_each_thread_count(fn):
    out = {}
    for t in THREADS:
        with threadpool_limits(t, user_api="blas"):
            out[t] = fn()
    return out


def _same_bits(results):
    first = results[THREADS[0]]
    for t, r in results.items():
        assert r.dtype == first.dtype and r.shape == first.shape
        diff = np.count_nonzero(r.view(np.uint8) != first.view(np.uint8))
        assert diff == 0, f"{t} threads differ from {THREADS[0]} in {diff} bytes"


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 200), k=st.integers(1, 6000), n=st.integers(1, 12_295),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_every_cpu_candidate_gives_the_same_bits_on_any_thread_count(m, k, n, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    p, _ = engine._problem(a, b, None)
    for cand in cpu_candidates():
        if cand.unavailable(p) is not None:
            continue

        def run(cand=cand):
            q, _ = engine._problem(a, b, None)
            cand.run(q)
            return q.out.to_array().copy()

        _same_bits(_under_each_thread_count(run))


def test_column_blocks_depend_on_the_shape_alone():
    """Enough blocks to share a chunk's product among threads, none too small to be worth a
    dispatch; multiples of 256 columns."""
    w = np.zeros((384, 384), np.float32)
    assert 6000 // column_block(w, 6000) >= 2                     # a short chunk is shared
    assert 60_000 // column_block(w, 60_000) >= 8
    assert column_block(np.zeros((4, 4), np.float32), 60_000) >= 60_000   # skinny: one block
    assert all(column_block(w, n) % 256 == 0 for n in (1, 999, 60_000, 10**7))


def test_a_covariance_with_a_long_reduction_gives_the_same_bits(tmp_path, monkeypatch):
    # [384, K]·[K, 384] with K = 30 000: the shape where OpenBLAS's own threads change the bits
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
    engine.forget()
    x = np.random.default_rng(0).standard_normal((384, 30_000)).astype(np.float32)
    matmul(x, x.T)                                   # tuned once: every run below uses the choice
    _same_bits(_under_each_thread_count(lambda: matmul(x, x.T)))
    engine.forget()


def test_whitening_and_pca_fits_give_the_same_bits():
    rng = np.random.default_rng(1)
    mix = np.eye(64) + 0.3 * rng.standard_normal((64, 64))
    x = (mix @ rng.standard_normal((64, 20_000))).astype(np.float32)
    cov = np.cov(x)
    geom = np.c_[np.tile([0.0, 32.0], 32), 20.0 * np.arange(64)]
    _same_bits(_under_each_thread_count(lambda: whitening_matrix(cov)))
    _same_bits(_under_each_thread_count(
        lambda: whitening_matrix(cov, geometry_um=geom, n_neighbors=12)))
    clips = rng.standard_normal((3000, 61)).astype(np.float32)
    _same_bits(_under_each_thread_count(lambda: PCA(3).fit(clips).components_))


def test_blas_is_given_its_thread_count_back_after_nested_and_concurrent_sections():
    with threadpool_limits(2, user_api="blas"):
        assert blas_threads() == 2
        with single_threaded_blas():
            with single_threaded_blas():
                assert blas_threads() == 2           # the count it will be given back

            def inner(i):
                with single_threaded_blas():
                    return i * i

            assert parallel_blocks(inner, range(10)) == [i * i for i in range(10)]
        from threadpoolctl import threadpool_info

        assert all(lib["num_threads"] == 2 for lib in threadpool_info()
                   if lib["user_api"] == "blas")


def test_parallel_blocks_keeps_order_and_raises_a_block_error():
    with threadpool_limits(3, user_api="blas"):
        assert parallel_blocks(lambda i: i + 1, range(20)) == list(range(1, 21))

        def bad(i):
            if i == 7:
                raise ValueError("block 7")
            return i

        with pytest.raises(ValueError, match="block 7"):
            parallel_blocks(bad, range(20))


def test_a_preprocessing_job_writes_the_same_bytes_with_1_2_and_3_blas_threads(tmp_path):
    """The whole job (fit and apply: covariance, whitening, FIR, reference, detection) in fresh
    processes that differ only in OPENBLAS_NUM_THREADS / OMP_NUM_THREADS, sharing a cache."""
    code = (
        "import sys, numpy as np\n"
        "from dspk.io import open_recording\n"
        "from dspk.pipeline import Pipeline\n"
        "rec = open_recording(sys.argv[1])\n"
        "pipe = Pipeline.from_options(whiten='local', detect=True, backend='cpu')\n"
        "pipe.run(rec, sys.argv[2], chunk_s=0.5, progress=False)\n"
    )
    sample = ROOT / "data" / "sample.nwb"
    outs = []
    for threads in (None, "1", "2", "3"):
        env = dict(os.environ, PYTHONPATH=str(ROOT), DSPK_CACHE_DIR=str(tmp_path / "cache"))
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.pop(var, None)
            if threads is not None:
                env[var] = threads
        out = tmp_path / f"out-{threads}.h5"
        subprocess.run([sys.executable, "-c", code, str(sample), str(out)], env=env, check=True,
                       timeout=600)
        outs.append(_datasets(out))
    assert set(outs[0]) >= {"traces", "spikes"}
    for other in outs[1:]:
        assert other.keys() == outs[0].keys()
        for name, data in outs[0].items():
            assert data.tobytes() == other[name].tobytes(), name


def _datasets(path):
    import h5py

    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return found
