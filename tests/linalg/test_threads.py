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
from dspk.linalg import candidates_cpu
from dspk.linalg.candidates_cpu import blocked_matmul, column_block, cpu_candidates
from dspk.linalg.threads import blas_threads, gemm_batch, parallel_blocks, single_threaded_blas
from dspk.ops import PCA, whitening_matrix

engine = importlib.import_module("dspk.linalg.matmul")
ROOT = Path(__file__).resolve().parents[2]
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
@pytest.mark.blas_threads
def test_every_cpu_candidate_gives_the_same_bits_on_any_thread_count(m, k, n, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    p, _ = engine.as_problem(a, b, None)
    for cand in cpu_candidates():
        if cand.unavailable(p) is not None:
            continue

        def run(cand=cand):
            q, _ = engine.as_problem(a, b, None)
            cand.run(q)
            return q.out.to_array().copy()

        _same_bits(_under_each_thread_count(run))


@pytest.mark.blas_threads
def test_column_blocks_depend_on_the_shape_alone():
    """A power of two of blocks (even shares among 2, 4, 8, 16 threads), enough to share a
    chunk's product, none too narrow to be worth packing W again; multiples of 64 columns."""
    w = np.zeros((384, 384), np.float32)
    for n in (6000, 60_000):
        assert -(-n // column_block(w, n)) >= 2                   # a chunk's product is shared
    assert -(-60_000 // column_block(w, 60_000)) == 16
    assert column_block(w, 6000) >= 2048                          # wide blocks for a large K
    assert column_block(np.zeros((4, 4), np.float32), 60_000) >= 60_000   # skinny: one block
    assert column_block(np.zeros((64, 64), np.float32), 2000) < 2000      # 16 MFLOP: two
    assert column_block(np.zeros((64, 64), np.float32), 1000) >= 1000     # 8 MFLOP: one
    for shape in ((384, 384), (64, 64), (32, 64), (6, 61), (4, 4)):
        a = np.zeros(shape, np.float32)
        for n in (1, 999, 2000, 6000, 60_000, 100_000, 10**7):
            cols = column_block(a, n)
            assert cols % 64 == 0
            if cols < n:
                blocks = -(-n // cols)
                assert blocks & (blocks - 1) == 0 and blocks <= 16, (shape, n, blocks)


SHAPES = [(384, 384, 6000), (384, 384, 60_000), (64, 64, 60_000), (32, 64, 60_000),
          (4, 4, 60_000), (6, 61, 100_000), (384, 3000, 384), (64, 64, 2000), (64, 64, 2001),
          (64, 64, 4097), (100, 256, 10_001), (7, 300, 3), (64, 64, 500), (1, 1, 1)]


def _blocked(a, b, fill=np.nan):
    out = np.full(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]),
                  fill, a.dtype)
    blocked_matmul(a, b, out)
    return out


def _same_bits_over_1_to_4(fn):
    outs = []
    for t in (1, 2, 3, 4):
        with threadpool_limits(t, user_api="blas"):
            outs.append(fn())
    for t, r in zip((2, 3, 4), outs[1:]):
        diff = np.count_nonzero(r.view(np.uint8) != outs[0].view(np.uint8))
        assert diff == 0, f"{t} threads differ from 1 in {diff} bytes"
    return outs[0]


@pytest.mark.blas_threads
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_blocked_matmul_gives_the_same_bits_on_1_to_4_blas_threads(m, k, n, dtype):
    rng = np.random.default_rng(m * 7 + k * 3 + n)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    got = _same_bits_over_1_to_4(lambda: _blocked(a, b))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    tol = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.sqrt(k) * 4)


@pytest.mark.parametrize("case", ["batched", "broadcast_w", "x_transposed", "w_transposed",
                                  "strided_out", "public_matmul"])
@pytest.mark.blas_threads
def test_batched_and_transposed_operands_give_the_same_bits(case, tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    w3 = rng.standard_normal((3, 64, 64)).astype(np.float32)
    x3 = rng.standard_normal((3, 64, 20_000)).astype(np.float32)
    w = rng.standard_normal((64, 300)).astype(np.float32)
    x = rng.standard_normal((300, 9000)).astype(np.float32)
    if case == "batched":
        fn = lambda: _blocked(w3, x3)                                   # noqa: E731
        ref = np.einsum("bmk,bkn->bmn", w3.astype(float), x3.astype(float))
    elif case == "broadcast_w":
        fn = lambda: _blocked(w3[:1], x3)                               # noqa: E731
        ref = np.einsum("mk,bkn->bmn", w3[0].astype(float), x3.astype(float))
    elif case == "x_transposed":
        xt = np.ascontiguousarray(x.T)
        fn = lambda: _blocked(w, xt.T)                                  # noqa: E731
        ref = w.astype(float) @ x.astype(float)
    elif case == "w_transposed":
        wf = np.asfortranarray(w)
        fn = lambda: _blocked(wf, x)                                    # noqa: E731
        ref = w.astype(float) @ x.astype(float)
    elif case == "strided_out":
        big = np.zeros((64, 9500), np.float32)

        def fn():
            big[...] = np.nan
            blocked_matmul(w, x, big[:, 100:9100])
            return big.copy()
        ref = np.full((64, 9500), np.nan)
        ref[:, 100:9100] = w.astype(float) @ x.astype(float)
    else:
        monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
        engine.forget()
        fn = lambda: matmul(w3, x3)                                     # noqa: E731
        ref = np.einsum("bmk,bkn->bmn", w3.astype(float), x3.astype(float))
    got = _same_bits_over_1_to_4(fn)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
    engine.forget()


@pytest.mark.blas_threads
def test_the_batch_path_is_taken_where_numpy_s_openblas_has_one():
    """The bits above would also be the same on the slower pool path: make sure the tests
    exercise the batch where this NumPy's OpenBLAS offers it (>= 0.3.30)."""
    from threadpoolctl import threadpool_info

    blas = [lib for lib in threadpool_info() if lib["user_api"] == "blas"]
    has_batch = gemm_batch(np.float32) is not None
    if any(lib["internal_api"] == "openblas" and lib["threading_layer"] == "pthreads"
           and tuple(int(v) for v in lib["version"].split(".")[:3]) >= (0, 3, 30)
           and "numpy" in lib["filepath"] for lib in blas):
        assert has_batch
    if not has_batch:
        pytest.skip("no ?gemm_batch in this NumPy's BLAS")
    a = np.ones((64, 64), np.float32)
    b = np.ones((64, 60_000), np.float32)
    out = np.empty((64, 60_000), np.float32)
    blocked_matmul(a, b, out)
    assert candidates_cpu._batch_plan(a[None], b[None], out[None], column_block(a, 60_000))
    assert (out == 64).all()


@pytest.mark.blas_threads
def test_threads_multiplying_one_geometry_at_once_each_get_their_own_product():
    """The batch plan of a geometry is shared; the members' addresses are not: threads that
    multiply different data of one shape at the same time (a pipeline's workers, a Dask
    worker's threads) each get their own product, bit for bit the one computed alone."""
    import threading

    rng = np.random.default_rng(11)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    xs = [rng.standard_normal((64, 4096)).astype(np.float32) for _ in range(6)]
    alone = [_blocked(a, x) for x in xs]
    bad: list[int] = []

    def work(i: int) -> None:
        for _ in range(300):
            if not np.array_equal(_blocked(a, xs[i]), alone[i]):
                bad.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


@pytest.mark.blas_threads
def test_the_pool_path_gives_the_same_bits_too(monkeypatch):
    """Where BLAS has no batch (MKL, an older OpenBLAS), dspk threads over the blocks itself."""
    monkeypatch.setattr(candidates_cpu, "gemm_batch", lambda dtype: None)
    plans: dict = {}                             # the process's plans, as if none were made
    monkeypatch.setattr(candidates_cpu, "_plans", lambda: plans)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((384, 384)).astype(np.float32)
    b = rng.standard_normal((384, 6000)).astype(np.float32)
    got = _same_bits_over_1_to_4(lambda: _blocked(a, b))
    assert plans and not any(plans.values())
    np.testing.assert_allclose(got, a.astype(float) @ b.astype(float), rtol=1e-5, atol=1e-3)


def _blas_counts():
    from threadpoolctl import threadpool_info

    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


@pytest.mark.blas_threads
def test_the_user_s_own_numpy_calls_keep_their_thread_count():
    """dspk's products leave BLAS's process-wide thread count as they found it, after a
    pinned one-block product, a batch and the pool path, and after an error."""
    rng = np.random.default_rng(6)
    small = rng.standard_normal((4, 4)).astype(np.float32), \
        rng.standard_normal((4, 60_000)).astype(np.float32)
    big = rng.standard_normal((64, 64)).astype(np.float32), \
        rng.standard_normal((64, 60_000)).astype(np.float32)
    for t in (2, 3):
        with threadpool_limits(t, user_api="blas"):
            for a, b in (small, big):
                _blocked(a, b)
                assert set(_blas_counts()) == {t}
            with pytest.raises(ValueError):
                blocked_matmul(big[0], big[1], np.empty((64, 59_999), np.float32))
            assert set(_blas_counts()) == {t}


@pytest.mark.blas_threads
def test_single_threaded_blas_pins_blas_from_any_python_thread():
    """threadpoolctl's OpenBLAS control does nothing when called from a thread other than the
    first that used it; dspk's pinning must hold from every thread (a Dask thread, a user's
    pool), and give the count back."""
    import threading

    seen = {}
    with threadpool_limits(2, user_api="blas"):
        with single_threaded_blas():                 # this thread uses the control first
            pass

        def other():
            with single_threaded_blas():
                seen["inside"] = _blas_counts()
            seen["after"] = _blas_counts()

        t = threading.Thread(target=other)
        t.start()
        t.join()
        # a long reduction: the product whose bits change with OpenBLAS's own threads
        x = np.random.default_rng(7).standard_normal((384, 3000)).astype(np.float32)
        res = {}

        def in_thread(key):
            res[key] = _blocked(x, x.T)

        with threadpool_limits(1, user_api="blas"):
            in_thread("one")
        t = threading.Thread(target=in_thread, args=("other",))
        t.start()
        t.join()
    assert set(seen["inside"]) == {1} and set(seen["after"]) == {2}
    assert res["one"].tobytes() == res["other"].tobytes()


@pytest.mark.blas_threads
def test_a_covariance_with_a_long_reduction_gives_the_same_bits(tmp_path, monkeypatch):
    # [384, K]·[K, 384] with K = 30 000: the shape where OpenBLAS's own threads change the bits
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
    engine.forget()
    x = np.random.default_rng(0).standard_normal((384, 30_000)).astype(np.float32)
    matmul(x, x.T)                                   # tuned once: every run below uses the choice
    _same_bits(_under_each_thread_count(lambda: matmul(x, x.T)))
    engine.forget()


@pytest.mark.blas_threads
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


@pytest.mark.blas_threads
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


@pytest.mark.blas_threads
def test_parallel_blocks_keeps_order_and_raises_a_block_error():
    with threadpool_limits(3, user_api="blas"):
        assert parallel_blocks(lambda i: i + 1, range(20)) == list(range(1, 21))

        def bad(i):
            if i == 7:
                raise ValueError("block 7")
            return i

        with pytest.raises(ValueError, match="block 7"):
            parallel_blocks(bad, range(20))


@pytest.mark.slow
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


@pytest.mark.blas_threads
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["rows", "fortran", "row_slice", "batched"])
@pytest.mark.parametrize("m,k", [(96, 5000), (383, 2000), (200, 701)])
def test_symmetric_cpu_candidates_give_the_same_symmetric_bits_on_any_thread_count(
        m, k, dtype, layout):
    """X·Xᵀ through every CPU candidate that takes it (the row-block tiles among them, batched
    through OpenBLAS or through dspk's pool): the same bits on 1, 2 and 3 threads, symmetric to
    the bit, and the float64 product within float rounding."""
    rng = np.random.default_rng(m + k)
    base = rng.standard_normal((3 if layout == "batched" else 1, m, k + 9)).astype(dtype)
    x = {"rows": base[0, :, :k], "fortran": np.asfortranarray(base[0, :, :k]),
         "row_slice": base[0, :, 5:k + 5], "batched": base[:, :, :k]}[layout]
    p, _ = engine.as_problem(x, np.swapaxes(x, -1, -2), None)
    assert p.symmetric
    names = []
    for cand in cpu_candidates():
        if cand.unavailable(p) is not None:
            continue
        names.append(cand.name)

        def run(cand=cand):
            q, _ = engine.as_problem(x, np.swapaxes(x, -1, -2), None)
            cand.run(q)
            return q.out.to_array().copy()

        got = _under_each_thread_count(run)
        _same_bits(got)
        r = got[THREADS[0]].reshape(-1, m, m)
        assert all(np.array_equal(s, s.T) for s in r), f"{cand.name}: not symmetric"
        x3 = x.reshape(-1, m, k).astype(np.float64)
        ref = x3 @ np.swapaxes(x3, -1, -2)
        err = np.linalg.norm(r - ref) / np.linalg.norm(ref)
        assert err <= (1e-6 if dtype == np.float32 else 1e-14), f"{cand.name}: {err:.2g}"
    if m >= 96:
        assert {"numpy_symblock3"} <= set(names)
