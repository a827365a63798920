"""The engine context: one object holds the tuner, the bound plans and the prepared operands;
another engine is used inside a ``with`` block, with its own cache folder or mode."""

import json
import os
import threading

import numpy as np
import pytest

import dspk
from dspk.backend import to_numpy
from dspk.linalg import Engine, current_engine, default_engine


def _cache_keys(folder) -> set:
    path = folder / "tuner-v1.json"
    if not path.exists():
        return set()
    return set(json.loads(path.read_text())["entries"])


def test_a_with_block_uses_its_engine_and_restores_the_default(tmp_path, xp):
    x = xp.asarray(np.random.default_rng(0).standard_normal((5, 3001)).astype(np.float32))
    default = current_engine()
    assert default is default_engine()
    before = {k: len(v) for k, v in default.plans.items()}
    with Engine(cache_dir=tmp_path) as engine:
        assert current_engine() is engine
        c = dspk.matmul(x, x.T)
        s_mat = dspk.int_matmul(x.astype(np.int16), x.astype(np.int16).T)
        assert len(engine.plans["matmul"]) == 1              # bound in this engine
        if xp is not np:                                       # (CPU integer candidates
            assert len(engine.plans["int_matmul"]) == 1        # have no bound runner)
    assert current_engine() is default
    assert {k: len(v) for k, v in default.plans.items()} == before
    assert _cache_keys(tmp_path), "the engine's tuner writes its own cache folder"
    ref = to_numpy(x).astype(np.float64)
    np.testing.assert_allclose(to_numpy(c), ref @ ref.T, rtol=1e-5)
    xi = to_numpy(x).astype(np.int16).astype(np.int64)
    assert np.array_equal(to_numpy(s_mat), xi @ xi.T)


def test_engines_nest_and_survive_exceptions(tmp_path):
    outer, inner = Engine(cache_dir=tmp_path / "a"), Engine(cache_dir=tmp_path / "b")
    with outer:
        with pytest.raises(RuntimeError):
            with inner:
                assert current_engine() is inner
                raise RuntimeError("inside")
        assert current_engine() is outer
        with outer:                                  # re-entered: still outer after
            pass
        assert current_engine() is outer
    assert current_engine() is default_engine()


def test_a_thread_started_inside_a_block_begins_with_the_default(tmp_path):
    seen = []
    with Engine(cache_dir=tmp_path):
        t = threading.Thread(target=lambda: seen.append(current_engine()))
        t.start()
        t.join()
    assert seen == [default_engine()]


def test_readonly_engine_times_nothing_and_writes_nothing(tmp_path):
    x = np.random.default_rng(1).standard_normal((6, 2000))
    with Engine(cache_dir=tmp_path, mode="readonly") as engine:
        e = dspk.explain(x, x.T)
        assert e.mode == "readonly" and "readonly" in e.choice.source and not e.choice.timings_ms
        dspk.matmul(x, x.T)
        assert engine.mode == "readonly"
    assert not (tmp_path / "tuner-v1.json").exists()


def test_engine_mode_off_and_bad_mode(tmp_path):
    x = np.ones((4, 100), np.float32)
    with Engine(cache_dir=tmp_path, mode="off"):
        assert "DSPK_TUNE=off" in dspk.explain(x, x.T).choice.source
    with pytest.raises(ValueError, match="mode: expected one of"):
        Engine(mode="sometimes")


def test_tuned_operations_above_the_engine_use_its_tuner(tmp_path):
    """spatial_filter's choice among implementations (dense, CSR) is stored in the cache
    folder of the engine in use, and its prepared filters are that engine's."""
    rng = np.random.default_rng(2)
    geom = np.c_[np.tile([0.0, 32.0], 48), 20.0 * np.arange(96)]
    w = dspk.whitening_matrix(np.cov(rng.standard_normal((96, 4000))), geometry_um=geom,
                              n_neighbors=8).astype(np.float32)
    x = rng.standard_normal((96, 5000)).astype(np.float32)
    with Engine(cache_dir=tmp_path) as engine:
        for _ in range(3):
            y = dspk.spatial_filter(w, x)
        store = engine.prepared("spatial_filter_cpu", lambda: None)
        assert len(store) == 1
    assert any(k.startswith("spatial_filter|") for k in _cache_keys(tmp_path))
    np.testing.assert_allclose(y, w.astype(np.float64) @ x, rtol=1e-4, atol=1e-4)
    engine.forget()
    assert len(store) == 0 and not any(engine.plans.values())


def test_forget_drops_the_plans_of_the_engine_in_use(tmp_path):
    x = np.random.default_rng(3).standard_normal((3, 700))
    with Engine(cache_dir=tmp_path) as engine:
        dspk.matmul(x, x.T)
        n = len(engine.plans["matmul"])
        dspk.linalg.forget()
        assert not engine.plans["matmul"]
        assert n == 1


def test_one_engine_entered_by_two_threads_at_once(tmp_path):
    """Each thread unwinds its own block, in any order of exits."""
    engine = Engine(cache_dir=tmp_path)
    order = threading.Barrier(2, timeout=20)
    seen, errors = {}, []

    def worker(name, first_out):
        try:
            with engine:
                order.wait()                       # both inside
                if not first_out:
                    order.wait()                   # the other one has left
                seen[name] = current_engine() is engine
            if first_out:
                order.wait()
            seen[name + " after"] = current_engine() is default_engine()
        except Exception as exc:                   # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=("a", True)),
               threading.Thread(target=worker, args=("b", False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(seen.values()) and len(seen) == 4


def test_engine_repr_names_mode_and_cache(tmp_path):
    r = repr(Engine(cache_dir=tmp_path, mode="off"))
    assert "mode='off'" in r and str(tmp_path) in r


@pytest.mark.gpu
def test_gpu_products_on_a_device_that_is_not_current():
    """int_matmul, int_gram, matmul and covariance of arrays on GPU 1 while GPU 0 is current
    (the shared product path switches device; int_matmul had lost that switch)."""
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    rng = np.random.default_rng(4)
    h = rng.integers(-30000, 30000, (24, 5001), dtype=np.int16)
    with cp.cuda.Device(1):
        x = cp.asarray(h)
        xf = x.astype(cp.float32)
    with cp.cuda.Device(0):
        got = dspk.int_matmul(x, x.T)
        s_mat, s = dspk.linalg.int_gram(x)
        c = dspk.matmul(xf, xf.T)
        cov = dspk.covariance(x)
    assert cov.device.id == 1
    np.testing.assert_array_equal(cov.get(), dspk.covariance(h))
    h64 = h.astype(np.int64)
    assert got.device.id == 1 and np.array_equal(got.get(), h64 @ h64.T)
    assert np.array_equal(s_mat.get(), h64 @ h64.T) and np.array_equal(s.get(), h64.sum(1))
    np.testing.assert_allclose(c.get(), h64 @ h64.T, rtol=1e-5)


def test_environment_is_read_when_used(tmp_path, monkeypatch):
    """The default engine follows DSPK_CACHE_DIR and DSPK_TUNE as they are at use."""
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DSPK_TUNE", "readonly")
    t = default_engine().tuner
    assert t.cache_file == tmp_path / "tuner-v1.json" and t.mode == "readonly"
    monkeypatch.setenv("DSPK_TUNE", "off")
    assert t.mode == "off"
    assert os.environ["DSPK_CACHE_DIR"] == str(tmp_path)


def test_a_thorough_block_drops_the_bound_plans_and_tunes_again(tmp_path):
    """What `dspk tune` runs: inside `Engine.thorough` a call reaches the tuner again (the
    plan bound to a first use's choice is dropped) and its key is tuned on the whole product;
    the stored choice is then the thorough one."""
    x = np.random.default_rng(5).standard_normal((96, 40000)).astype(np.float32)
    with Engine(cache_dir=tmp_path) as engine:
        c = dspk.matmul(x, x.T)
        assert len(engine.plans["matmul"]) == 1
        (entry,) = json.loads((tmp_path / "tuner-v1.json").read_text())["entries"].values()
        assert entry["tuned"] == "slice"
        with engine.thorough() as same:
            assert same is engine and not engine.plans["matmul"]
            assert engine.tuner.tuning_thoroughly
            c2 = dspk.matmul(x, x.T)
            assert dspk.explain(x, x.T).choice.tuned == "thorough"
        assert not engine.tuner.tuning_thoroughly
    (entry,) = json.loads((tmp_path / "tuner-v1.json").read_text())["entries"].values()
    assert entry["tuned"] == "thorough" and "timed_on" not in entry
    ref = x.astype(np.float64) @ x.T.astype(np.float64)
    for got in (c, c2):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-2)
