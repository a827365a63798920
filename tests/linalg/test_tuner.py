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
ROOT = Path(__file__).resolve().parents[2]


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


def test_choices_in_memory_belong_to_their_cache_file(fresh_cache, tmp_path_factory,
                                                      monkeypatch):
    """A choice tuned while DSPK_CACHE_DIR named one folder is not used once it names another
    (whose file does not hold it): processes sharing that file would choose on their own.
    Back in the first folder, its file's choice is read again."""
    a, b = operands()
    matmul(a, b)
    assert explain(a, b, tune=False).choice.source == "cache (memory)"
    other = tmp_path_factory.mktemp("other-cache")
    monkeypatch.setenv("DSPK_CACHE_DIR", str(other))
    e = explain(a, b, tune=False)
    assert e.choice is None or e.choice.source not in ("cache (memory)", "cache (file)")
    monkeypatch.setenv("DSPK_CACHE_DIR", str(fresh_cache))
    assert explain(a, b, tune=False).choice.source == "cache (file)"


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


def test_a_choice_tuned_before_a_candidate_existed_is_tuned_again(fresh_cache, monkeypatch):
    """The version string does not change between development builds, nor when a kernel
    becomes available: an entry that never considered a candidate able to run the product is
    tuned again (and replaced in the file) in mode "on", and still used as it is in
    "readonly". Timed on a fake clock: on a loaded machine the real one could leave the new
    candidate untimed (beyond the first use's budget), which is not what is tested here."""
    clock = FakeClock()

    def tuner(*names):
        costs = {"numpy": 1e-9, "fake_new_exact": 2e-9}
        return clocked([Costed(n, clock, costs[n]) for n in names], clock)

    a, b = operands(16, 2000, 16)
    old = tuner("numpy")
    p, _ = engine.as_problem(a, b, None)
    assert old.select(p, run=True).source == "tuned now"
    key = old.key_str(old.key(p))
    assert set(json.loads(cache_path().read_text())["entries"][key]["timings_ms"]) == {"numpy"}
    monkeypatch.setenv("DSPK_TUNE", "readonly")
    stale = tuner("numpy", "fake_new_exact").select(p, run=True)
    assert stale.source == "cache (file)" and stale.candidate.name == "numpy"
    monkeypatch.setenv("DSPK_TUNE", "on")
    new = tuner("numpy", "fake_new_exact")
    assert new.select(p, run=True).source == "tuned now"
    entry = json.loads(cache_path().read_text())["entries"][key]
    assert set(entry["timings_ms"]) == {"numpy", "fake_new_exact"}
    again = tuner("numpy", "fake_new_exact").select(p, run=True)
    assert again.source == "cache (file)"
    # a tuning that knew fewer candidates never overwrites one that knew more
    assert tuner("numpy").select(p).source == "cache (file)"
    assert set(json.loads(cache_path().read_text())["entries"][key]["timings_ms"]) == \
        {"numpy", "fake_new_exact"}


# -- first use: tuning on slices within a budget; thorough tuning on request ------------------
tuner_mod = importlib.import_module("dspk.linalg.tuner")


class FakeClock:
    """The tuner's host clock, advanced only by the candidates' modelled costs: budgets and
    rankings that do not depend on the machine's load."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Costed(Candidate):
    """np.matmul whose run costs ``fixed + per_mac * multiply-adds`` seconds on a fake clock;
    records the [batches, M, N, K] of every run. ``min_n``: unavailable on fewer columns;
    ``wrong_beyond_n``: garbage when N exceeds it (correct on slices, wrong on the whole)."""

    def __init__(self, name, clock, per_mac, fixed=0.0, min_n=0, wrong_beyond_n=None,
                 imports=()):
        self.name, self.clock, self.per_mac, self.fixed = name, clock, per_mac, fixed
        self.min_n, self.wrong_beyond_n = min_n, wrong_beyond_n
        self.first_use_imports = tuple(imports)
        self.summary = f"fake, {per_mac:g} s per multiply-add"
        self.runs = []

    def unavailable(self, p):
        return f"N < {self.min_n}" if p.n < self.min_n else None

    def run(self, p):
        shape = (p.batches, p.m, p.n, p.k)
        self.runs.append(shape)
        self.clock.now += self.fixed + self.per_mac * np.prod(shape, dtype=np.float64)
        out = p.out.to_array()
        out[...] = np.matmul(p.a.to_array(), p.b.to_array())
        if self.wrong_beyond_n is not None and p.n > self.wrong_beyond_n:
            out[..., -1] += 1.0


def clocked(cands, clock, **kw):
    t = Tuner(lambda gpu: cands, **kw)
    t.clock = clock
    return t


def wide(m=64, k=256, n=20000, seed=3):
    """W·X large enough to be tuned on slices of its columns (N)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    return a, b


def test_first_use_stays_within_its_budget_and_runs_the_whole_product_once(fresh_cache):
    """Counted on a fake clock: every candidate is timed on a slice, the tuning costs no more
    than BUDGET_RATIO x the winner's time on the whole product, and only the winner computes
    the whole product, once; a candidate whose smallest slice is the whole is not timed."""
    clock = FakeClock()
    fast, mid, slow = (Costed(n, clock, c) for n, c in (("fast", 1e-9), ("mid", 2e-9),
                                                         ("slow", 3e-9)))
    whole_only = Costed("whole_only", clock, 0.5e-9, min_n=16000)
    t = clocked([slow, mid, whole_only, fast], clock)
    a, b = wide()
    p, _ = engine.as_problem(a, b, None)
    full = (1, 64, 20000, 256)
    whole_time = 1e-9 * np.prod(full, dtype=np.float64)
    choice = t.select(p, run=True)
    assert choice.candidate.name == "fast" and choice.tuned == "slice"
    assert choice.ranking == ["fast", "mid", "slow"]
    for c in (slow, mid):
        assert full not in c.runs and len(c.runs) >= 2          # probe and slice, at least
    assert fast.runs[-1] == full and fast.runs.count(full) == 1
    assert whole_only.runs == [] and "not timed on first use" in choice.untimed["whole_only"]
    tuning = clock.now - whole_time
    assert 0 < tuning <= tuner_mod.BUDGET_RATIO * whole_time
    ref = a.astype(np.float64) @ b
    assert np.abs(p.out.to_array()[0] - ref).max() < 1e-3
    entry = json.loads(cache_path().read_text())["entries"][choice.key]
    assert entry["tuned"] == "slice" and entry["ranking"] == ["fast", "mid", "slow"]
    assert entry["timed_on"]["fast"][:3] == [1, 64, 64 * -(-entry["timed_on"]["fast"][2] // 64)]
    assert set(entry["untimed"]) == {"whole_only"}
    # estimates for the whole product from the slices: the fake costs are linear, so exact
    assert entry["timings_ms"]["mid"] == pytest.approx(2 * whole_time * 1e3, rel=1e-6)


def test_a_candidate_costing_far_more_than_its_work_ends_the_first_use(fresh_cache):
    """A setup cost of 0.2 s per run (the product: 0.33 s) takes the tuning beyond its
    budget with its probe: neither it nor the candidates after it are timed, and the entry
    says why."""
    clock = FakeClock()
    fast, mid = Costed("fast", clock, 1e-9), Costed("mid", clock, 2e-9)
    hog = Costed("hog", clock, 1e-9, fixed=0.2)
    t = clocked([fast, hog, mid], clock)
    a, b = wide()
    p, _ = engine.as_problem(a, b, None)
    whole_time = 1e-9 * 64 * 20000 * 256
    choice = t.select(p, run=True)
    assert choice.candidate.name == "fast" and mid.runs == []
    assert "beyond its budget" in choice.untimed["mid"] and len(hog.runs) == 1
    assert "after its probe" in choice.untimed["hog"]
    cap = tuner_mod.SKIP_RATIO * tuner_mod.BUDGET_RATIO * whole_time
    assert clock.now - whole_time <= cap + 0.2


def test_a_slice_tuned_choice_is_persisted_and_used_without_timing(fresh_cache):
    clock = FakeClock()
    fast, slow = Costed("fast", clock, 1e-9), Costed("slow", clock, 2e-9)
    a, b = wide()
    p, _ = engine.as_problem(a, b, None)
    assert clocked([slow, fast], clock).select(p, run=True).candidate.name == "fast"
    runs = len(slow.runs), len(fast.runs)
    again = clocked([slow, fast], clock).select(p, run=True)      # a fresh tuner: the file
    assert again.source == "cache (file)" and again.candidate.name == "fast"
    assert again.tuned == "slice" and (len(slow.runs), len(fast.runs)) == (runs[0], runs[1] + 1)


def test_the_whole_product_check_rejects_a_candidate_right_only_on_slices(fresh_cache):
    clock = FakeClock()
    sneaky = Costed("sneaky", clock, 0.5e-9, wrong_beyond_n=10000)
    honest = Costed("honest", clock, 1e-9)
    t = clocked([sneaky, honest], clock)
    a, b = wide()
    p, _ = engine.as_problem(a, b, None)
    choice = t.select(p, run=True)
    assert choice.candidate.name == "honest" and choice.ranking == ["honest"]
    assert "wrong result on the whole product" in choice.rejected["sneaky"]
    np.testing.assert_allclose(p.out.to_array()[0], a.astype(np.float64) @ b, rtol=1e-4,
                               atol=1e-3)


def test_slice_checks_reject_tf32_and_wrong_results(fresh_cache):
    """The precision probe and the result check run on slices and still catch both."""
    a, b = wide(48, 1024, 12000)
    t = Tuner(lambda gpu: [RoundsToTF32(), Wrong(), NumpyMatmul()])
    p, _ = engine.as_problem(a, b, None)
    choice = t.select(p, run=True)
    assert choice.candidate.name == "numpy" and choice.tuned == "slice"
    assert choice.timed_on["numpy"][2] < 12000                   # timed on a slice of N
    assert "precision check failed" in choice.rejected["fake_tf32"]
    assert "wrong result" in choice.rejected["fake_wrong"]
    ref = a.astype(np.float64) @ b
    assert np.linalg.norm(p.out.to_array()[0] - ref) / np.linalg.norm(ref) < 1e-6


class IntThroughFloat32(Candidate):
    """Integer products through float32 BLAS: exact for small values only."""

    name = "fake_int_f32"
    kinds = "iu"
    summary = "float32 BLAS without the 2^24 guard (must be rejected)"

    def unavailable(self, p):
        return None

    def run(self, p):
        a = p.a.to_array().astype(np.float32)
        b = p.b.to_array().astype(np.float32)
        p.out.to_array()[...] = np.rint(np.matmul(a, b)).astype(np.int64)


def test_integer_candidates_must_be_exact_on_a_full_range_slice_probe(fresh_cache):
    from dspk.linalg.candidates_int import IntViaFloat64

    rng = np.random.default_rng(5)
    a = rng.integers(-100, 100, (32, 2048), dtype=np.int16)   # float32-exact on these values
    b = rng.integers(-100, 100, (2048, 8000), dtype=np.int16)
    p, _ = engine.as_problem(a, b, None, allowed=(np.dtype(np.int16),),
                             result_dtype=np.int64)
    t = Tuner(lambda gpu: [IntThroughFloat32(), IntViaFloat64()])
    choice = t.select(p, run=True)
    assert choice.candidate.name == "int_f64blas" and choice.tuned == "slice"
    assert "not bit-exact on a full-range probe" in choice.rejected["fake_int_f32"]
    assert np.array_equal(p.out.to_array()[0], a.astype(np.int64) @ b.astype(np.int64))


def test_a_thorough_tuning_replaces_a_slice_tuned_choice(fresh_cache):
    """A candidate with a fixed cost per run loses on slices and wins on the whole product:
    the first use keeps the slice's winner (and the file says so); a thorough tuning times
    both on the whole product, replaces the entry, and a later first use takes it as is."""
    clock = FakeClock()
    lean = Costed("lean", clock, 1e-9)
    setup = Costed("setup", clock, 0.5e-9, fixed=0.05)
    a, b = wide()
    p, _ = engine.as_problem(a, b, None)
    first = clocked([lean, setup], clock).select(p, run=True)
    assert first.candidate.name == "lean" and first.tuned == "slice"
    t = clocked([lean, setup], clock)
    with t.thorough():
        assert t.tuning_thoroughly
        full = len(setup.runs)
        deep = t.select(p, run=True)
        assert deep.source == "tuned now" and deep.candidate.name == "setup"
        assert deep.tuned == "thorough" and setup.runs[full:].count((1, 64, 20000, 256)) >= 4
        assert t.select(p).source == "cache (memory)"          # tuned once per key
    assert not t.tuning_thoroughly
    entry = json.loads(cache_path().read_text())["entries"][deep.key]
    assert entry["tuned"] == "thorough" and entry["ranking"][0] == "setup"
    later = clocked([lean, setup], clock).select(p, run=True)
    assert later.source == "cache (file)" and later.candidate.name == "setup"
    # a first use's entry never replaces a thorough one (another process's, stored first)
    assert not tuner_mod._replaces(first_entry := {"ranking": ["lean"], "timings_ms": {
        "lean": 1.0, "setup": 2.0}, "rejected": {}, "tuned": "slice"}, entry)
    assert tuner_mod._replaces(entry, first_entry)


def test_thorough_does_nothing_readonly_or_off(fresh_cache, monkeypatch):
    clock = FakeClock()
    lean = Costed("lean", clock, 1e-9)
    a, b = wide()
    p, _ = engine.as_problem(a, b, None)
    clocked([lean], clock).select(p, run=True)
    before = cache_path().read_text()
    for mode in ("readonly", "off"):
        monkeypatch.setenv("DSPK_TUNE", mode)
        t = clocked([lean], clock)
        with t.thorough():
            assert not t.tuning_thoroughly
            choice = t.select(p, run=True)
        assert choice.tuned in ("brief", "") and not choice.source.startswith("tuned")
    assert cache_path().read_text() == before


def test_a_candidate_needing_a_slow_import_is_not_timed_on_first_use(fresh_cache):
    clock = FakeClock()
    heavy = Costed("heavy", clock, 0.5e-9, imports=("dspk_test_module_never_imported",))
    lean = Costed("lean", clock, 1e-9)
    a, b = wide()
    p, _ = engine.as_problem(a, b, None)
    choice = clocked([heavy, lean], clock).select(p, run=True)
    assert choice.candidate.name == "lean" and heavy.runs == []
    assert "would import dspk_test_module_never_imported" in choice.untimed["heavy"]
    engine.forget()
    alone = clocked([heavy], clock).select(p, run=True)          # the only one: timed anyway
    assert alone.candidate.name == "heavy" and heavy.runs


def test_explain_says_a_choice_was_tuned_on_slices(fresh_cache):
    x = np.random.default_rng(7).standard_normal((96, 40000)).astype(np.float32)
    text = str(explain(x, x.T))
    assert "because: tuned now" in text and "tuned: on first use, on slices" in text
    assert "estimated for the whole product" in text
    engine.forget()
    text = str(explain(x, x.T, tune=False))
    assert "because: cache (file)" in text and "tuned: on first use, on slices" in text


def test_a_slice_tuned_choice_is_shared_with_another_process(fresh_cache):
    x = np.random.default_rng(0).standard_normal((48, 20000)).astype(np.float32)
    mine = explain(x, x.T)
    assert mine.choice.tuned == "slice"
    code = ("import numpy as np, dspk\n"
            "from dspk.linalg import explain\n"
            "x = np.random.default_rng(0).standard_normal((48, 20000)).astype(np.float32)\n"
            "e = explain(x, x.T, tune=False)\n"
            "print(e.candidate, e.choice.source.replace(' ', '_'), e.choice.tuned)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         timeout=300).stdout.split()
    assert out == [mine.candidate, "cache_(file)", "slice"]


# -- Tuner.choose: whole operations ---------------------------------------------------------
class Op:
    """A runner of a whole operation: each call costs ``cost`` seconds on the fake clock and
    returns ``value``; counts its calls."""

    def __init__(self, clock, cost, value=1.0):
        self.clock, self.cost, self.value, self.calls = clock, cost, value, 0

    def __call__(self):
        self.calls += 1
        self.clock.now += self.cost
        return np.full(4, self.value)


def same(got, ref):
    return None if np.array_equal(got, ref) else "differs"


def test_choose_runs_each_long_implementation_once_and_keeps_the_winners_result(fresh_cache):
    clock = FakeClock()
    t = clocked([], clock)
    ref, quick, off = Op(clock, 1.0), Op(clock, 0.5), Op(clock, 0.1, value=2.0)
    name, why, result = t.choose_run(("op", 1), {"ref": ref, "quick": quick, "off": off},
                                     False, same)
    assert (name, why) == ("quick", "tuned now") and np.array_equal(result, np.ones(4))
    assert (ref.calls, quick.calls, off.calls) == (1, 1, 1)      # no re-run of the winner
    entry = json.loads(cache_path().read_text())["entries"]["op|1"]
    assert entry["tuned"] == "brief" and entry["rejected"] == {"off": "differs"}
    # the plain `choose` (the caller runs the winner) runs each once too
    refs = Op(clock, 1.0), Op(clock, 0.5)
    assert t.choose(("op", 2), dict(zip(("ref", "quick"), refs)), False, same) == \
        ("quick", "tuned now")
    assert [r.calls for r in refs] == [1, 1]
    assert t.choose(("op", 2), dict(zip(("ref", "quick"), refs)), False, same) == \
        ("quick", "cache")


def test_choose_samples_short_implementations_again_within_the_budget(fresh_cache):
    clock = FakeClock()
    t = clocked([], clock)
    a, b = Op(clock, 1e-4), Op(clock, 1.1e-4)
    t.choose(("op", 3), {"a": a, "b": b}, False, same)
    assert a.calls > 1 and b.calls > 1
    assert clock.now <= tuner_mod.BUDGET_FLOOR_S[False] + 2.2e-4


def test_choose_on_slices_runs_only_the_winner_on_the_whole(fresh_cache):
    clock = FakeClock()
    t = clocked([], clock)
    whole = {"ref": Op(clock, 1.0), "quick": Op(clock, 0.6)}
    fractions, small = [], {}

    def sliced(fraction):
        fractions.append(fraction)
        small.update(ref=Op(clock, 1.0 * fraction), quick=Op(clock, 0.6 * fraction))
        return small

    name, why, _ = t.choose_run(("op", 4), whole, False, same, sliced=sliced)
    assert name == "quick" and fractions == [1 / (2 * tuner_mod.SLICE_SHARE * 2)]
    assert (whole["ref"].calls, whole["quick"].calls) == (0, 1)
    assert small["ref"].calls >= 2 and small["quick"].calls >= 2
    assert clock.now - 0.6 <= tuner_mod.BUDGET_RATIO * 0.6 + 0.6 * fractions[0]
    entry = json.loads(cache_path().read_text())["entries"]["op|4"]
    assert entry["tuned"] == "slice"
    # thorough: both timed on the whole problem, the entry replaced
    with t.thorough():
        assert t.choose(("op", 4), whole, False, same, sliced=sliced)[1] == "tuned now"
        assert whole["ref"].calls >= 4
    assert json.loads(cache_path().read_text())["entries"]["op|4"]["tuned"] == "thorough"


def test_a_choice_on_slices_is_checked_on_the_whole_problem_in_the_first_call(fresh_cache):
    """A slice that fits in cache can make a memory-bound implementation look fastest: the
    winner's whole run is timed, and a runner-up whose estimate beats it runs the whole
    problem too, in the same first call; the faster is the choice and the result, so every
    later call runs it (the same bits from the first call on)."""
    clock = FakeClock()
    t = clocked([], clock)
    # on slices "memory" looks twice as fast as "blocked"; whole, it is 2.5x slower
    whole = {"blocked": Op(clock, 0.05, value=1.0), "memory": Op(clock, 0.125, value=1.0)}

    def sliced(fraction):
        return {"blocked": Op(clock, 0.05 * fraction), "memory": Op(clock, 0.025 * fraction)}

    ran = [t.choose_run(("op", 9), whole, False, same, sliced=sliced)[:2] for _ in range(3)]
    assert ran == [("blocked", "tuned now"), ("blocked", "cache"), ("blocked", "cache")]
    assert (whole["blocked"].calls, whole["memory"].calls) == (3, 1)
    entry = json.loads(cache_path().read_text())["entries"]["op|9"]
    assert entry["ranking"] == ["blocked", "memory"]
    assert entry["whole_ms"] == {"memory": 125.0, "blocked": 50.0}

    # the right choice on slices: only it runs whole
    clock2 = FakeClock()
    t2 = clocked([], clock2)
    whole2 = {"a": Op(clock2, 0.1), "b": Op(clock2, 0.05)}

    def sliced2(fraction):
        return {"a": Op(clock2, 0.1 * fraction), "b": Op(clock2, 0.05 * fraction)}

    assert [t2.choose_run(("op", 10), whole2, False, same, sliced=sliced2)[0]
            for _ in range(3)] == ["b", "b", "b"]
    assert whole2["a"].calls == 0


class CacheBound(Costed):
    """Costs ``whole_factor`` times more per multiply-add on the whole problem than on a
    slice (a memory-bound product whose slices fit in cache)."""

    def __init__(self, *args, whole_n, whole_factor, **kw):
        super().__init__(*args, **kw)
        self.whole_n, self.whole_factor = whole_n, whole_factor

    def run(self, p):
        before = self.clock.now
        super().run(p)
        if p.n >= self.whole_n:
            self.clock.now += (self.whole_factor - 1) * (self.clock.now - before)


def test_a_product_choice_on_slices_is_checked_on_the_whole_product(fresh_cache):
    """matmul's first use ranks on slices; the winner computes the product, timed, and a
    runner-up whose estimate beats that computes it too, in the same call: the faster one's
    result is returned and is the choice from then on."""
    clock = FakeClock()
    a, b = wide()
    cached = CacheBound("cached", clock, 0.8e-9, whole_n=b.shape[1], whole_factor=3.0)
    steady = Costed("steady", clock, 1e-9)
    t = clocked([cached, steady], clock)
    p, _ = engine.as_problem(a, b, None)
    choice = t.select(p, run=True)
    assert choice.candidate.name == "steady" and choice.ranking == ["steady", "cached"]
    full = (1, 64, 20000, 256)
    assert cached.runs.count(full) == 1 and steady.runs.count(full) == 1
    ref = a.astype(np.float64) @ b
    assert np.abs(p.out.to_array()[0] - ref).max() < 1e-3
    entry = json.loads(cache_path().read_text())["entries"][choice.key]
    assert set(entry["whole_ms"]) == {"steady", "cached"}
    # a runner-up wrong on the whole product (right on its slice): rejected, and the
    # winner's result, kept aside, is what the call returns
    clock2 = FakeClock()
    winner = CacheBound("winner", clock2, 0.8e-9, whole_n=b.shape[1], whole_factor=1.5)
    wrong = Costed("wrong", clock2, 1e-9, wrong_beyond_n=b.shape[1] - 1)
    t2 = clocked([wrong, winner], clock2)
    p2, _ = engine.as_problem(a, b, None)
    choice2 = t2.select(p2, run=True)
    assert choice2.candidate.name == "winner" and choice2.ranking == ["winner"]
    assert "whole product" in choice2.rejected["wrong"] and wrong.runs.count(full) == 1
    assert np.abs(p2.out.to_array()[0] - ref).max() < 1e-3


def test_choose_times_again_a_run_that_tuned_a_product_inside(fresh_cache):
    """The first run of an operation built on matmul tunes the product: that run is no
    measure of the operation, and is timed again."""
    from dspk.linalg import Engine

    clock = FakeClock()
    with Engine(cache_dir=fresh_cache / "e") as eng:
        eng.tuner.clock = clock
        x = np.ones((3, 50), np.float32)
        calls = []

        def dense():
            calls.append(1)
            matmul(x, x.T)                       # tunes once, inside the first call
            clock.now += 10.0 if len(calls) == 1 else 1.0
            return np.ones(4)

        name, _ = eng.tuner.choose(("op", 5), {"dense": dense, "other": Op(clock, 2.0)},
                                   False, same)
    assert name == "dense" and len(calls) == 2


def test_tuner_doctests():
    import doctest

    result = doctest.testmod(tuner_mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_choose_leaves_a_runner_needing_a_slow_import_to_a_thorough_tuning(fresh_cache):
    clock = FakeClock()
    t = clocked([], clock)
    # (the runners cost less than the import, assumed IMPORT_COST_DEFAULT_S = 0.5 s)
    ref, own, other = Op(clock, 0.1), Op(clock, 0.05), Op(clock, 0.07)
    imports = {"ref": ("dspk_test_module_never_imported",)}
    name, _, _ = t.choose_run(("op", 6), {"ref": ref, "own": own, "other": other}, False,
                              same, imports=imports)
    assert name == "own" and ref.calls == 0 and (own.calls, other.calls) == (1, 1)
    entry = json.loads(cache_path().read_text())["entries"]["op|6"]
    assert "would import dspk_test_module_never_imported" in entry["untimed"]["ref"]
    # left alone, a runner is chosen without a run (choose_run runs it once)
    alone, lone = Op(clock, 0.1), Op(clock, 0.05)
    assert t.choose_run(("op", 7), {"ref": alone, "own": lone}, False, same,
                        imports=imports)[0] == "own"
    assert (alone.calls, lone.calls) == (0, 1)
    # every runner needing one: none is left out
    both = {"ref": Op(clock, 0.1), "own": Op(clock, 0.05)}
    t.choose(("op", 8), both, False, same, imports={n: imports["ref"] for n in both})
    assert [r.calls for r in both.values()] == [1, 1]
    # thorough: timed
    with t.thorough():
        t.choose(("op", 6), {"ref": ref, "own": own, "other": other}, False, same,
                 imports=imports)
    assert ref.calls > 1


def test_choose_times_a_runner_needing_an_import_when_the_choice_costs_more(fresh_cache):
    """Left untimed for its import, a runner is timed after all when the runner chosen
    without it takes `IMPORT_WORTH` times longer on the whole problem than that import (a
    3001-tap FIR's Toeplitz products took 0.94 s where whole-row FFTs, which import scipy.fft
    (0.2 s), take 0.15 s); not when the choice costs less than that."""
    clock = FakeClock()
    t = clocked([], clock)
    near = {"slow": Op(clock, 1.5), "fast": Op(clock, 0.1)}              # 3x the import
    assert t.choose_run(("op", 10), near, False, same,
                        imports={"fast": ("dspk_test_module_never_imported",)})[0] == "slow"
    assert near["fast"].calls == 0
    slow, fast = Op(clock, 2.5), Op(clock, 0.1)                          # 5x
    imports = {"fast": ("dspk_test_module_never_imported",)}    # assumed to cost 0.5 s
    name, _, _ = t.choose_run(("op", 9), {"slow": slow, "fast": fast}, False, same,
                              imports=imports)
    assert name == "fast" and fast.calls >= 1
    entry = json.loads(cache_path().read_text())["entries"]["op|9"]
    assert entry["ranking"][0] == "fast" and "fast" not in entry.get("untimed", {})


# -- a candidate that runs out of device memory (issue 45: a fake CuPy OutOfMemoryError) ---------
class OutOfMemoryError(MemoryError):
    """What CuPy raises when its pool cannot allocate (recognised by its name)."""


class Hungry(Costed):
    """A `Costed` candidate that runs out of device memory on more than ``fits_n`` columns
    (its slices fit, the whole product does not: None, never), or from its ``oom_from``-th run
    on (a fuller device at a later sample)."""

    def __init__(self, *args, fits_n=None, oom_from=None, **kw):
        super().__init__(*args, **kw)
        self.fits_n, self.oom_from = fits_n, oom_from

    def run(self, p):
        if (self.fits_n is not None and p.n > self.fits_n) or \
                (self.oom_from is not None and len(self.runs) + 1 >= self.oom_from):
            self.runs.append("oom")
            raise OutOfMemoryError("Out of memory allocating 1,234,567,168 bytes")
        super().run(p)


def test_a_candidate_out_of_device_memory_is_skipped_and_never_stored(fresh_cache, caplog):
    """Fastest on its slices, it runs out of memory on the whole product: the next one
    computes it, the entry records why, and a fresh tuner reading the file never runs it."""
    clock = FakeClock()
    big = Hungry("big", clock, 0.5e-9, fits_n=10000)
    honest = Costed("honest", clock, 1e-9)
    t = clocked([big, honest], clock)
    a, b = wide()
    p, _ = engine.as_problem(a, b, None)
    with caplog.at_level("WARNING", logger="dspk.linalg.tuner"):
        choice = t.select(p, run=True)
    assert choice.candidate.name == "honest" and choice.ranking == ["honest"]
    assert choice.rejected["big"].startswith("on the whole product: out of device memory: "
                                             "OutOfMemoryError")
    assert "ran out of device memory" in caplog.text and "the others are tried" in caplog.text
    np.testing.assert_allclose(p.out.to_array()[0], a.astype(np.float64) @ b, rtol=1e-4,
                               atol=1e-3)
    entry = json.loads(cache_path().read_text())["entries"][choice.key]
    assert entry["ranking"] == ["honest"] and "out of device memory" in entry["rejected"]["big"]
    runs = len(big.runs)
    again = clocked([big, honest], clock).select(p, run=True)
    assert again.candidate.name == "honest" and len(big.runs) == runs


def test_a_candidate_out_of_memory_on_its_slice_or_in_a_sample_is_dropped(fresh_cache):
    clock = FakeClock()
    never = Hungry("never", clock, 0.3e-9, fits_n=0)            # not even its probe fits
    later = Hungry("later", clock, 0.5e-9, oom_from=3)          # probe, slice, then no more
    honest = Costed("honest", clock, 1e-9)
    choice = clocked([never, later, honest], clock).select(p := engine.as_problem(
        *wide(), None)[0], run=True)
    assert choice.candidate.name == "honest" and choice.ranking == ["honest"]
    assert "out of device memory" in choice.rejected["never"]
    assert "out of device memory" in choice.rejected["later"] and "oom" in later.runs
    assert p.out.to_array().any()


def test_every_candidate_out_of_memory_stores_nothing_and_says_so(fresh_cache):
    """Nothing fits: DeviceOutOfMemory (what a job halves its chunk on), no entry stored;
    thoroughly too."""
    from dspk.backend import DeviceOutOfMemory, out_of_memory

    clock = FakeClock()
    cands = [Hungry("h1", clock, 1e-9, fits_n=0), Hungry("h2", clock, 2e-9, fits_n=0)]
    p, _ = engine.as_problem(*wide(), None)
    t = clocked(cands, clock)
    with pytest.raises(DeviceOutOfMemory, match="every candidate failed .*ran out of memory") \
            as info:
        t.select(p, run=True)
    assert out_of_memory(info.value)
    assert not cache_path().exists() or not json.loads(cache_path().read_text())["entries"]
    with t.thorough(), pytest.raises(DeviceOutOfMemory):
        t.select(p, run=True)
    # a thorough tuning skips one that runs out, as a first use does
    clock2 = FakeClock()
    t2 = clocked([Hungry("big", clock2, 0.5e-9, fits_n=0), Costed("ok", clock2, 1e-9)], clock2)
    with t2.thorough():
        choice = t2.select(p, run=True)
    assert choice.candidate.name == "ok" and "out of device memory" in choice.rejected["big"]


class HungryOp(Op):
    """An `Op` whose calls from the ``oom_from``-th on run out of device memory."""

    def __init__(self, clock, cost, oom_from=1, value=1.0):
        super().__init__(clock, cost, value)
        self.oom_from = oom_from

    def __call__(self):
        if self.calls + 1 >= self.oom_from:
            self.calls += 1
            raise OutOfMemoryError("Out of memory allocating 512 bytes")
        return super().__call__()


def test_choose_skips_an_implementation_out_of_device_memory(fresh_cache):
    """Whole operations: a runner out of memory on its first run, on a later sample, or on
    the whole problem after winning on slices, is rejected and never the choice; when the
    reference itself runs out, the error goes on (the operation is too big) and nothing is
    stored."""
    from dspk.backend import out_of_memory

    clock = FakeClock()
    t = clocked([], clock)
    ref, hungry = Op(clock, 1.0), HungryOp(clock, 0.1)
    name, why, result = t.choose_run(("op", 20), {"ref": ref, "hungry": hungry}, False, same)
    assert (name, why) == ("ref", "tuned now") and np.array_equal(result, np.ones(4))
    entry = json.loads(cache_path().read_text())["entries"]["op|20"]
    assert entry["ranking"] == ["ref"] and "out of device memory" in entry["rejected"]["hungry"]
    # short runs are sampled again: one that runs out on its second sample is dropped
    a, b = Op(clock, 1e-4), HungryOp(clock, 0.9e-4, oom_from=2)
    assert t.choose(("op", 21), {"a": a, "b": b}, False, same) == ("a", "tuned now")
    assert b.calls == 2 and "out of device memory" in \
        json.loads(cache_path().read_text())["entries"]["op|21"]["rejected"]["b"]
    # on slices "fast" wins, then runs out of memory on the whole problem: "slow" computes it
    whole = {"slow": Op(clock, 0.2, value=1.0), "fast": HungryOp(clock, 0.05)}

    def sliced(fraction):
        return {"slow": Op(clock, 0.2 * fraction), "fast": Op(clock, 0.05 * fraction)}

    name, why, result = t.choose_run(("op", 22), whole, False, same, sliced=sliced)
    assert name == "slow" and np.array_equal(result, np.ones(4))
    entry = json.loads(cache_path().read_text())["entries"]["op|22"]
    assert entry["ranking"] == ["slow"] and "out of device memory" in entry["rejected"]["fast"]
    # the reference out of memory: the operation's own error, nothing stored
    with pytest.raises(OutOfMemoryError) as info:
        t.choose(("op", 23), {"ref": HungryOp(clock, 1.0), "b": Op(clock, 0.5)}, False, same)
    assert out_of_memory(info.value)
    assert "op|23" not in json.loads(cache_path().read_text())["entries"]
