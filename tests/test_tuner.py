"""The tuner: choices persisted and reused, precision verified, modes, a corrupt or foreign cache,
several processes tuning at once."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dspk.linalg import explain, matmul
from dspk.linalg.candidates_cpu import NumpyMatmul
from dspk.linalg.problem import Candidate
from dspk.linalg.tuner import Tuner, cache_path

engine = importlib.import_module("dspk.linalg.matmul")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
    engine.forget()
    yield tmp_path
    engine.forget()


def operands(m=8, k=300, n=5, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    return a, rng.standard_normal((k, n)).astype(np.float32)


class RoundsToTF32(Candidate):
    """A fast-looking candidate that computes with 10-bit mantissas, as TF32 tensor cores do."""

    name = "fake_tf32"
    summary = "rounds operands to TF32 (must be rejected)"

    def unavailable(self, p):
        return None

    def run(self, p):
        def tf32(x):
            bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
            return ((bits + 0x1000) & 0xFFFFE000).view(np.float32)

        a, b = tf32(p.a.to_array()), tf32(p.b.to_array())
        p.out.to_array()[...] = np.matmul(a, b)


class Wrong(Candidate):
    name = "fake_wrong"
    summary = "writes garbage"

    def unavailable(self, p):
        return None

    def run(self, p):
        p.out.to_array()[...] = 1.0


def test_tuned_choice_persists_and_is_reused(fresh_cache):
    a, b = operands()
    matmul(a, b)
    doc = json.loads(cache_path().read_text())
    assert doc["format"] == "dspk-tuner" and len(doc["entries"]) == 1
    entry = next(iter(doc["entries"].values()))
    assert entry["ranking"] and all(t > 0 for t in entry["timings_ms"].values())
    engine.forget()
    e = explain(a, b, tune=False)
    assert e.choice.source == "cache (file)"
    assert e.candidate == entry["ranking"][0]


def test_precision_check_rejects_tf32_and_wrong_results(fresh_cache):
    t = Tuner(lambda gpu: [RoundsToTF32(), Wrong(), NumpyMatmul()])
    a, b = operands(16, 2000, 16)
    p, _ = engine.as_problem(a, b, None)
    choice = t.select(p, run=True)
    assert choice.candidate.name == "numpy"
    assert "precision check failed" in choice.rejected["fake_tf32"]
    assert "wrong result" in choice.rejected["fake_wrong"]
    ref = a.astype(np.float64) @ b
    assert np.linalg.norm(p.out.to_array()[0] - ref) / np.linalg.norm(ref) < 1e-6


def test_mode_off_takes_first_available(fresh_cache, monkeypatch):
    monkeypatch.setenv("DSPK_TUNE", "off")
    a, b = operands()
    e = explain(a, b)
    assert e.candidate == "numpy" and "DSPK_TUNE=off" in e.choice.source
    matmul(a, b)
    assert not cache_path().exists()


def test_mode_readonly_never_writes(fresh_cache, monkeypatch):
    monkeypatch.setenv("DSPK_TUNE", "readonly")
    a, b = operands()
    matmul(a, b)
    assert not cache_path().exists()


def test_bad_mode(fresh_cache, monkeypatch):
    monkeypatch.setenv("DSPK_TUNE", "sometimes")
    with pytest.raises(ValueError, match="DSPK_TUNE must be one of"):
        matmul(*operands())


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": "other", "entries": {}}),
                                     json.dumps({"format": "dspk-tuner", "schema": 1,
                                                 "entries": {"k": "not a dict"}})])
def test_corrupt_or_foreign_cache_is_ignored_with_warning_and_rewritten(fresh_cache, content):
    cache_path().parent.mkdir(parents=True, exist_ok=True)
    cache_path().write_text(content)
    a, b = operands()
    with pytest.warns(RuntimeWarning, match="corrupt or not a dspk tuner cache"):
        matmul(a, b)
    doc = json.loads(cache_path().read_text())
    assert doc["format"] == "dspk-tuner" and len(doc["entries"]) == 1


def test_explain_lists_candidates_and_reasons(fresh_cache):
    a, b = operands(4, 100, 4)
    text = str(explain(a, b))
    assert "runs:" in text and "because: tuned now" in text
    assert "numpy_splitk16384: K=100 shorter" in text


def test_processes_tuning_at_once_keep_every_entry(fresh_cache):
    code = (
        "import sys, numpy as np, dspk\n"
        "k = int(sys.argv[1])\n"
        "for m in (3, 20, 70):\n"
        "    a = np.ones((m, k), np.float32); dspk.matmul(a, np.ones((k, 2), np.float32))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(k)], env=env)
             for k in (10, 100, 1000, 5000)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    doc = json.loads(cache_path().read_text())
    assert len(doc["entries"]) == 12  # 4 K classes x 3 M classes, none lost


class Raises(Candidate):
    """A candidate that is available but breaks when run (a kernel source missing from an
    installed package, say)."""

    name = "fake_raises"
    summary = "raises FileNotFoundError"

    def unavailable(self, p):
        return None

    def run(self, p):
        raise FileNotFoundError("skinny.cu")


def test_a_candidate_that_raises_is_rejected_with_a_warning_naming_it(fresh_cache, caplog):
    t = Tuner(lambda gpu: [Raises(), NumpyMatmul()])
    p, _ = engine.as_problem(*operands(), None)
    with caplog.at_level("WARNING", logger="dspk.linalg.tuner"):
        choice = t.select(p, run=True)
    assert choice.candidate.name == "numpy"
    assert "FileNotFoundError" in choice.rejected["fake_raises"]
    assert any("fake_raises" in r.getMessage() and "skinny.cu" in r.getMessage()
               for r in caplog.records if r.levelname == "WARNING")


def test_an_unavailable_candidate_drops_out_quietly(fresh_cache, caplog):
    class Unavailable(Raises):
        name = "fake_unavailable"

        def unavailable(self, p):
            return "not on this device"

    t = Tuner(lambda gpu: [Unavailable(), NumpyMatmul()])
    p, _ = engine.as_problem(*operands(), None)
    with caplog.at_level("WARNING", logger="dspk.linalg.tuner"):
        choice = t.select(p, run=True)
    assert choice.rejected["fake_unavailable"] == "unavailable: not on this device"
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def _other_process_tunes(m, k, n):
    code = ("import sys, numpy as np, dspk\n"
            "m, k, n = map(int, sys.argv[1:])\n"
            "dspk.matmul(np.ones((m, k), np.float32), np.ones((k, n), np.float32))\n")
    subprocess.run([sys.executable, "-c", code, str(m), str(k), str(n)], check=True,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)


def test_a_long_lived_process_sees_what_another_stored_since(fresh_cache):
    """A miss re-reads the file when it changed: a process that had already read the cache
    takes the choice another process stored later, instead of tuning it again."""
    matmul(*operands(8, 300, 5))                  # this process has read (and written) the file
    _other_process_tunes(3, 40, 2)                # another one adds a key
    doc = json.loads(cache_path().read_text())
    assert len(doc["entries"]) == 2
    a = np.ones((3, 40), np.float32)
    e = explain(a, np.ones((40, 2), np.float32), tune=False)
    assert e.choice is not None and e.choice.source == "cache (file)"


def test_two_processes_tuning_one_key_keep_the_first_ranking(fresh_cache, monkeypatch):
    """The first ranking stored wins: a process that tuned the same key a moment later adopts
    it (and reports it), so processes sharing a cache run the same candidate."""
    mod = importlib.import_module("dspk.linalg.tuner")
    a, b = operands(4, 100, 4)
    p, _ = engine.as_problem(a, b, None)
    t = Tuner(lambda gpu: [c for c in engine.tuner.candidates(False)
                           if c.name in ("numpy", "direct_einsum")])
    key = t.key_str(t.key(p))
    stored = {"ranking": ["direct_einsum", "numpy"], "timings_ms": {"numpy": 1.0,
              "direct_einsum": 0.5}, "rejected": {}, "when": "earlier"}
    real_merge = mod._merge_into_cache

    def merge_after_another_process(path, k, entry):
        real_merge(path, key, stored)             # the other process got there first
        return real_merge(path, k, entry)

    monkeypatch.setattr(mod, "_merge_into_cache", merge_after_another_process)
    choice = t.select(p, run=True)
    assert choice.ranking == ["direct_einsum", "numpy"]
    assert choice.candidate.name == "direct_einsum"
    assert json.loads(cache_path().read_text())["entries"][key]["when"] == "earlier"
    np.testing.assert_allclose(p.out.to_array()[0], a.astype(np.float64) @ b, rtol=1e-5)


def test_processes_needing_one_key_at_once_run_the_same_candidate(fresh_cache):
    """Tuning holds the cache's lock: the processes that need a key another is tuning wait for
    its ranking instead of timing their own (which could differ, and with it the bits)."""
    code = (
        "import numpy as np, dspk\n"
        "from dspk.linalg import explain\n"
        "x = np.random.default_rng(0).standard_normal((48, 20000)).astype(np.float32)\n"
        "e = explain(x, x.T)\n"
        "print(e.candidate, e.choice.source.replace(' ', '_'))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    outs = [p.communicate(timeout=300)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len({o[0] for o in outs}) == 1, outs
    assert sorted(o[1] for o in outs) == ["cache_(file)"] * 3 + ["tuned_now"], outs
    doc = json.loads(cache_path().read_text())
    (entry,) = doc["entries"].values()
    assert entry["ranking"][0] == outs[0][0]


@pytest.mark.gpu
def test_timing_rotates_copies_of_operands_that_fit_in_l2():
    """The tuner times small products on copies of their operands, cycled, so that no
    candidate is timed on operands hot in L2: the copies hold the same values at the same
    addresses modulo 256 (alignment decides some kernels), X·Xᵀ stays one shared copy, and an
    operand as large as the rotation target is timed as it is."""
    cp = pytest.importorskip("cupy")
    from dspk.linalg.matmul import as_problem
    from dspk.linalg.tuner import ROTATE_L2_MULTIPLE, ROTATE_MAX_SETS, _rotation

    l2 = cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]
    base = cp.asarray(np.random.default_rng(1).standard_normal(64 * 6001 + 3, np.float32))
    x = base[3:].reshape(64, 6001)[:, 1:]                 # 16 bytes in, strided rows
    w = cp.asarray(np.random.default_rng(2).standard_normal((8, 64), np.float32))
    p, _ = as_problem(w, x, None)
    sets = _rotation(p)
    assert sets[0] is p and 2 <= len(sets) <= ROTATE_MAX_SETS
    for q in sets[1:]:
        for v, u in ((q.a, p.a), (q.b, p.b)):
            assert v.ptr % 256 == u.ptr % 256 and v.strides == u.strides
            assert cp.array_equal(v.to_array(), u.to_array())
        assert q.out.ptr != p.out.ptr and q.b.buffer.data.ptr != p.b.buffer.data.ptr
    g, _ = as_problem(x, x.T, None)
    assert g.symmetric
    for q in _rotation(g)[1:]:
        assert q.symmetric and q.a.buffer is q.b.buffer
    big = cp.empty((1024, -(-ROTATE_L2_MULTIPLE * l2 // 4 // 1024)), np.float32)
    pb, _ = as_problem(cp.ones((4, 1024), np.float32), big, None)
    assert _rotation(pb) == [pb]


class NewExact(Candidate):
    """A correct candidate that a later dspk adds (np.matmul in float64, rounded once)."""

    name = "fake_new_exact"
    summary = "float64 product rounded to the operands' dtype"

    def unavailable(self, p):
        return None

    def run(self, p):
        a, b = p.a.to_array(), p.b.to_array()
        p.out.to_array()[...] = np.matmul(a.astype(np.float64), b.astype(np.float64))


def test_a_choice_tuned_before_a_candidate_existed_is_tuned_again(fresh_cache, monkeypatch):
    """The version string does not change between development builds, nor when a kernel
    becomes available: an entry that never considered a candidate able to run the product is
    tuned again (and replaced in the file) in mode "on", and still used as it is in
    "readonly"."""
    a, b = operands(16, 2000, 16)
    old = Tuner(lambda gpu: [NumpyMatmul()])
    p, _ = engine.as_problem(a, b, None)
    assert old.select(p, run=True).source == "tuned now"
    key = old.key_str(old.key(p))
    assert set(json.loads(cache_path().read_text())["entries"][key]["timings_ms"]) == {"numpy"}
    monkeypatch.setenv("DSPK_TUNE", "readonly")
    stale = Tuner(lambda gpu: [NumpyMatmul(), NewExact()]).select(p, run=True)
    assert stale.source == "cache (file)" and stale.candidate.name == "numpy"
    monkeypatch.setenv("DSPK_TUNE", "on")
    new = Tuner(lambda gpu: [NumpyMatmul(), NewExact()])
    assert new.select(p, run=True).source == "tuned now"
    entry = json.loads(cache_path().read_text())["entries"][key]
    assert set(entry["timings_ms"]) == {"numpy", "fake_new_exact"}
    again = Tuner(lambda gpu: [NumpyMatmul(), NewExact()]).select(p, run=True)
    assert again.source == "cache (file)"
    # a tuning that knew fewer candidates never overwrites one that knew more
    assert Tuner(lambda gpu: [NumpyMatmul()]).select(p).source == "cache (file)"
    assert set(json.loads(cache_path().read_text())["entries"][key]["timings_ms"]) == \
        {"numpy", "fake_new_exact"}
