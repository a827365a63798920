"""The shipped winners tables (dspk.linalg.winners): a table's choice used without timing,
checked, stored as "table"; one that is wrong, unavailable or not covering falls back to
first-use tuning; a thorough tuning replaces it; explain() says where it came from; export
makes a table from a cache file; a bad table file is ignored with a warning."""

import importlib
import json
import logging

import numpy as np
import pytest

from dspk.linalg import Engine, explain
from dspk.linalg import winners
from dspk.linalg.candidates_cpu import NumpyMatmul
from dspk.linalg.tuner import Tuner, read_cache
from dspk.linalg.tuner_timing import Stopwatch

from .test_tuner import Costed, FakeClock, Op, RoundsToTF32, Wrong, same, wide

tuner_mod = importlib.import_module("dspk.linalg.tuner")
tuner_products = importlib.import_module("dspk.linalg.tuner_products")
tuner_operations = importlib.import_module("dspk.linalg.tuner_operations")
matmul_mod = importlib.import_module("dspk.linalg.matmul")

#: the class every stamp maps to in these tests (the host's real class depends on its BLAS)
CLS = "test-class"
SOURCE = {"device": "cpu:test-machine:2", "stamp": "cpu:test-machine:2|numpy0|dspk0",
          "dspk": winners.__version__, "commit": "abc123", "when": "2026-12-07T10:00:00+0000"}


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """A folder of winners tables for class `CLS` (every device's class here), an empty cache
    folder; ``write(entries)`` writes the table."""
    folder = tmp_path / "winners"
    folder.mkdir()
    monkeypatch.setattr(tuner_mod, "device_class", lambda stamp: CLS)
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DSPK_WINNERS", str(folder))
    winners.forget_tables()
    matmul_mod.forget()

    def write(entries, sources=(SOURCE,), raw=None):
        doc = {"format": winners.FORMAT, "schema": winners.SCHEMA, "class": CLS,
               "sources": list(sources), "entries": entries}
        (folder / f"{CLS}.json").write_text(raw if raw is not None else json.dumps(doc))
        winners.forget_tables()

    yield folder, write
    winners.forget_tables()
    matmul_mod.forget()


def tkey(t, p):
    """The table key of problem ``p`` for tuner ``t``."""
    return winners.table_key(t.key_str(t.key(p)), t.stamp(False, None), CLS)


def entry(ranking, timings=None, rejected=None, **extra):
    timings = timings if timings is not None else {n: float(i + 1) for i, n in
                                                   enumerate(ranking)}
    return {"ranking": list(ranking), "timings_ms": timings, "rejected": rejected or {},
            "source": 0, **extra}


def no_timing(monkeypatch):
    """Make every way the tuner times a candidate fail the test."""
    def timed(*a, **k):
        raise AssertionError("a candidate was timed")

    monkeypatch.setattr(Stopwatch, "seconds", timed)
    monkeypatch.setattr(Stopwatch, "sample", timed)
    monkeypatch.setattr(tuner_products, "_median_time", timed)
    monkeypatch.setattr(tuner_operations, "_median_time", timed)
    monkeypatch.setattr(tuner_mod, "tune_on_first_use", timed)
    monkeypatch.setattr(tuner_mod, "tune_thoroughly", timed)


def clocked(cands, clock, **kw):
    t = Tuner(lambda gpu: cands, **kw)
    t.clock = clock
    return t


def problem(m=64, k=256, n=20000):
    a, b = wide(m, k, n)
    p, _ = matmul_mod.as_problem(a, b, None)
    return a, b, p


def check_product(p, a, b):
    np.testing.assert_allclose(p.out.to_array()[0], a.astype(np.float64) @ b, rtol=1e-4,
                               atol=1e-3)


# -- products -------------------------------------------------------------------------------------
def test_a_table_choice_is_used_without_timing_and_stored_as_table(tables, monkeypatch):
    """The table names the candidate that is slower here: it runs, nothing is timed, and the
    cache records it as a table choice with where it was measured; a fresh tuner reads it
    from the cache file."""
    _, write = tables
    clock = FakeClock()
    fast, slow = Costed("fast", clock, 1e-9), Costed("slow", clock, 3e-9)
    t = clocked([fast, slow], clock)
    a, b, p = problem()
    write({tkey(t, p): entry(["slow", "fast"], when="2026-12-06T09:00:00+0000")})
    no_timing(monkeypatch)
    choice = t.select(p, run=True)
    assert choice.candidate.name == "slow" and choice.tuned == "table"
    assert choice.source == f"shipped winners table for {CLS}"
    assert fast.runs == [] and slow.runs == [(1, 64, 20000, 256)]   # the whole product, once
    check_product(p, a, b)
    stored = read_cache()[choice.key]
    assert stored["tuned"] == "table" and stored["ranking"] == ["slow", "fast"]
    assert stored["table"] == {"class": CLS, "device": "cpu:test-machine:2",
                               "measured": "2026-12-06", "dspk": winners.__version__,
                               "commit": "abc123"}
    again = clocked([fast, slow], clock).select(p, run=True)      # a fresh tuner: the file
    assert again.source == "cache (file)" and again.tuned == "table"
    assert again.candidate.name == "slow" and fast.runs == []


def test_the_precision_probe_runs_for_a_table_of_another_dspk_version(tables, monkeypatch):
    """A table measured with another dspk: the candidate's code may differ, so its precision
    probe runs again, and one that computes in TF32 is rejected: first-use tuning."""
    _, write = tables
    t = Tuner(lambda gpu: [RoundsToTF32(), NumpyMatmul()])
    a, b, p = problem(48, 1024, 12000)
    write({tkey(t, p): entry(["fake_tf32", "numpy"])}, sources=({**SOURCE, "dspk": "0.0.1"},))
    choice = t.select(p, run=True)
    assert choice.candidate.name == "numpy" and choice.tuned in ("slice", "brief")
    assert "precision" in choice.rejected["fake_tf32"]


def test_a_wrong_table_winner_is_rejected_with_a_warning_and_tuned_on_first_use(tables,
                                                                                 caplog):
    _, write = tables
    clock = FakeClock()
    honest = Costed("honest", clock, 1e-9)
    t = clocked([Wrong(), honest], clock)
    a, b, p = problem()
    write({tkey(t, p): entry(["fake_wrong", "honest"])})
    with caplog.at_level(logging.WARNING, logger="dspk.linalg.tuner"):
        choice = t.select(p, run=True)
    assert choice.candidate.name == "honest" and choice.tuned in ("slice", "brief")
    assert "winners table's choice fake_wrong" in caplog.text and "rejected" in caplog.text
    assert read_cache()[choice.key]["tuned"] in ("slice", "brief")
    check_product(p, a, b)


@pytest.mark.parametrize("case", ["unavailable", "not a candidate", "not covering"])
def test_a_table_that_does_not_cover_the_problem_here_is_not_used(tables, case):
    """The table's winner cannot run this problem here, is no candidate of this dspk, or the
    table's tuning never considered a candidate that can run it (added since): tuned on first
    use."""
    _, write = tables
    clock = FakeClock()
    fast = Costed("fast", clock, 1e-9)
    picky = Costed("picky", clock, 0.5e-9, min_n=10 ** 6)           # unavailable here
    new = Costed("new", clock, 2e-9)
    t = clocked([fast, picky, new], clock)
    a, b, p = problem()
    ranking = {"unavailable": ["picky", "fast", "new"], "not a candidate": ["gone", "fast",
                                                                            "new", "picky"],
               "not covering": ["fast", "picky"]}[case]
    write({tkey(t, p): entry(ranking)})
    choice = t.select(p, run=True)
    assert choice.tuned in ("slice", "brief") and choice.candidate.name == "fast"
    check_product(p, a, b)


def test_an_unknown_device_class_gets_first_use_tuning(tables, monkeypatch):
    _, write = tables
    clock = FakeClock()
    fast, slow = Costed("fast", clock, 1e-9), Costed("slow", clock, 3e-9)
    t = clocked([fast, slow], clock)
    a, b, p = problem()
    write({tkey(t, p): entry(["slow", "fast"])})
    monkeypatch.setattr(tuner_mod, "device_class", lambda stamp: None)
    choice = t.select(p, run=True)
    assert choice.candidate.name == "fast" and choice.tuned in ("slice", "brief")


def test_tables_off(tables, monkeypatch):
    """DSPK_WINNERS=off, or a tuner given winners=False: no table."""
    _, write = tables
    clock = FakeClock()
    fast, slow = Costed("fast", clock, 1e-9), Costed("slow", clock, 3e-9)
    a, b, p = problem()
    write({tkey(clocked([fast, slow], clock), p): entry(["slow", "fast"])})
    assert clocked([fast, slow], clock, winners=False).select(p).candidate.name == "fast"
    matmul_mod.forget()
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tables[0].parent / "cache2"))
    monkeypatch.setenv("DSPK_WINNERS", "off")
    assert clocked([fast, slow], clock).select(p).candidate.name == "fast"


def test_a_thorough_tuning_replaces_a_table_choice(tables):
    _, write = tables
    clock = FakeClock()
    fast, slow = Costed("fast", clock, 1e-9), Costed("slow", clock, 3e-9)
    t = clocked([fast, slow], clock)
    a, b, p = problem()
    write({tkey(t, p): entry(["slow", "fast"])})
    assert t.select(p, run=True).tuned == "table"
    with t.thorough():
        deep = t.select(p, run=True)
    assert deep.tuned == "thorough" and deep.candidate.name == "fast"
    stored = read_cache()[deep.key]
    assert stored["tuned"] == "thorough" and "table" not in stored
    # and a first use never does
    assert clocked([fast, slow], clock).select(p).tuned == "thorough"


def test_readonly_uses_the_table_without_writing(tables, monkeypatch):
    _, write = tables
    clock = FakeClock()
    fast, slow = Costed("fast", clock, 1e-9), Costed("slow", clock, 3e-9)
    t = clocked([fast, slow], clock, mode="readonly")
    a, b, p = problem()
    write({tkey(t, p): entry(["slow", "fast"])})
    no_timing(monkeypatch)
    choice = t.select(p, run=True)
    assert choice.candidate.name == "slow" and choice.tuned == "table"
    assert not t.cache_file.exists()
    check_product(p, a, b)
    assert t.select(p, run=True).source == "cache (memory)"
    # off: the fixed order, no table
    assert clocked([fast, slow], clock, mode="off").select(p).candidate.name == "fast"


def test_explain_says_a_choice_came_from_the_shipped_table(tables, tmp_path):
    _, write = tables
    x = np.random.default_rng(1).standard_normal((8, 3000)).astype(np.float32)
    with Engine(cache_dir=tmp_path / "c", mode="on") as engine:
        p, _ = matmul_mod.as_problem(x, x.T, None)
        names = [c.name for c in engine.tuner.candidates(False, "f")]
        ranking = ["numpy"] + [n for n in names if n != "numpy"]
        write({tkey(engine.tuner, p): entry(ranking, when="2026-12-05T08:00:00+0000")})
        before = explain(x, x.T, tune=False)
        assert before.candidate == "numpy" and "checked when a call first uses it" in \
            before.choice.source
        text = str(explain(x, x.T))
    assert f"because: shipped winners table for {CLS}" in text
    assert (f"tuned: from the shipped table for {CLS} (measured on cpu:test-machine:2 "
            f"2026-12-05") in text
    assert "measured on the table's machine (median ms per call)" in text


def test_an_engine_names_its_table_folder(tables, tmp_path):
    folder, _ = tables
    assert Engine(winners=False).tuner.winners_folder() is None
    assert Engine(winners=tmp_path).tuner.winners_folder() == tmp_path
    assert Engine().tuner.winners_folder() == folder              # DSPK_WINNERS
    with pytest.raises(ValueError, match="winners"):
        Tuner(lambda gpu: [], winners=True)


# -- operations (Tuner.choose) --------------------------------------------------------------------
def op_key(t, n=1):
    return ("op", t.stamp(False, None), n)


def op_tkey(t, n=1):
    return winners.table_key(t.key_str(op_key(t, n)), t.stamp(False, None), CLS)


def test_a_table_choice_for_an_operation_is_checked_against_the_reference(tables):
    """Without slices: the reference and the table's winner each run once, the winner's
    result is the call's; with slices, both run on a slice and only the winner runs whole."""
    _, write = tables
    clock = FakeClock()
    t = clocked([], clock)
    write({op_tkey(t, 1): entry(["quick", "ref"]), op_tkey(t, 2): entry(["quick", "ref"])})
    ref, quick = Op(clock, 1.0), Op(clock, 0.5)
    name, why, result = t.choose_run(op_key(t, 1), {"ref": ref, "quick": quick}, False, same)
    assert (name, why) == ("quick", f"shipped winners table for {CLS}")
    assert (ref.calls, quick.calls) == (1, 1) and np.array_equal(result, np.ones(4))
    assert read_cache()[t.key_str(op_key(t, 1))]["tuned"] == "table"
    small = {"ref": Op(clock, 0.1), "quick": Op(clock, 0.05)}
    whole = {"ref": Op(clock, 1.0), "quick": Op(clock, 0.5)}
    name, why, _ = t.choose_run(op_key(t, 2), whole, False, same, sliced=lambda f: small)
    assert name == "quick" and (whole["ref"].calls, whole["quick"].calls) == (0, 1)
    assert (small["ref"].calls, small["quick"].calls) == (1, 1)
    assert t.choose(op_key(t, 2), whole, False, same) == ("quick", "cache")


def test_a_wrong_table_choice_for_an_operation_falls_back(tables, caplog):
    _, write = tables
    clock = FakeClock()
    t = clocked([], clock)
    write({op_tkey(t): entry(["off", "quick", "ref"])})
    runners = {"ref": Op(clock, 1.0), "quick": Op(clock, 0.5), "off": Op(clock, 0.1, 2.0)}
    with caplog.at_level(logging.WARNING, logger="dspk.linalg.tuner"):
        name, why, _ = t.choose_run(op_key(t), runners, False, same)
    assert (name, why) == ("quick", "tuned now") and "winners table's choice off" in caplog.text
    # an implementation the table never measured: not covered
    write({op_tkey(t, 3): entry(["quick", "ref"])})
    runners["newer"] = Op(clock, 0.2)
    assert t.choose_run(op_key(t, 3), runners, False, same)[1] == "tuned now"


def test_a_table_choice_deferred_by_imports_is_checked_against_one_that_is_not(tables):
    """The reference a first use would use: the first runner whose first run imports
    nothing new (here the second one, the first imports a module never imported)."""
    _, write = tables
    clock = FakeClock()
    t = clocked([], clock)
    write({op_tkey(t): entry(["quick", "heavy", "plain"])})
    runners = {"heavy": Op(clock, 1.0), "plain": Op(clock, 0.8), "quick": Op(clock, 0.5)}
    name, _, _ = t.choose_run(op_key(t), runners, False, same,
                              imports={"heavy": ("dspk_no_such_module",)})
    assert name == "quick" and runners["heavy"].calls == 0 and runners["plain"].calls == 1


# -- export and the table files -------------------------------------------------------------------
def test_export_round_trip(tables, tmp_path):
    """A cache's thorough entries for the device become the table of its class (first-use
    ones are left out); a fresh tuner with an empty cache then uses them; a second export
    merges into the table."""
    folder, _ = tables
    clock = FakeClock()
    fast, slow = Costed("fast", clock, 1e-9), Costed("slow", clock, 3e-9)
    t = clocked([fast, slow], clock, winners=False)
    a, b, p = problem()
    _, _, p2 = problem(64, 256, 5000)
    with t.thorough():
        t.select(p, run=True)
    t.select(p2, run=True)                                         # first use: not exported
    stamp = t.stamp(False, None)
    out = folder / f"{CLS}.json"
    got = winners.export(t.cache_file, out, stamp=stamp, cls=CLS, commit="c0ffee")
    assert (got["exported"], got["entries"], got["skipped"]) == (1, 1, 1)
    doc = json.loads(out.read_text())
    assert winners.validate(doc, CLS) == []
    (key, e), = doc["entries"].items()
    assert key == tkey(t, p) and e["ranking"] == ["fast", "slow"] and e["source"] == 0
    assert doc["sources"][0]["commit"] == "c0ffee" and doc["sources"][0]["stamp"] == stamp
    # a fresh cache: the table's choice, untimed
    fresh = clocked([fast, slow], clock, cache_dir=tmp_path / "fresh")
    winners.forget_tables()
    assert fresh.select(p, run=True).tuned == "table"
    # the second export (through the command) merges: both keys, one source each
    with t.thorough():
        t.select(p2, run=True)
    assert winners.main(["export", "--cache", str(t.cache_file), "--out", str(out),
                         "--stamp", stamp, "--class", CLS, "--commit", "d00d"]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["entries"]) == 2 and winners.validate(doc, CLS) == []
    assert [s["commit"] for s in doc["sources"]] == ["d00d"]   # the first one is replaced
    with pytest.raises(ValueError, match="no device class"):
        winners.export(t.cache_file, out, stamp="Some GPU cc10 sm1|driver1", gpu=None)


@pytest.mark.parametrize("bad", [
    "{not json", json.dumps({"format": "dspk-tuner", "schema": 1}),
    json.dumps({"format": "dspk-winners", "schema": 1, "class": CLS, "sources": [SOURCE],
                "entries": {"k|test-class|x": {"ranking": "fast", "source": 0}}}),
    json.dumps({"format": "dspk-winners", "schema": 1, "class": "other", "sources": [SOURCE],
                "entries": {}}),
    json.dumps({"format": "dspk-winners", "schema": 1, "class": CLS, "sources": [SOURCE],
                "entries": {"k|test-class|x": {"ranking": ["fast"], "source": 3}}}),
])
def test_a_bad_table_file_is_ignored_with_a_warning(tables, bad):
    _, write = tables
    clock = FakeClock()
    fast, slow = Costed("fast", clock, 1e-9), Costed("slow", clock, 3e-9)
    t = clocked([fast, slow], clock)
    a, b, p = problem()
    write({}, raw=bad)
    with pytest.warns(RuntimeWarning, match="winners table .* (not valid|cannot be read)"):
        choice = t.select(p, run=True)
    assert choice.candidate.name == "fast" and choice.tuned in ("slice", "brief")


def test_the_shipped_tables_are_valid():
    found = sorted(winners.PACKAGE_FOLDER.glob("*.json"))
    for path in found:
        doc = json.loads(path.read_text())
        assert winners.validate(doc, path.stem) == [], path
        assert all(s.get("stamp") and s.get("commit") for s in doc["sources"]), path


def test_device_classes():
    assert winners.gpu_class("NVIDIA H100 80GB HBM3 cc90 sm132") == "nvidia-h100-sm132"
    assert winners.gpu_class("NVIDIA H100 PCIe cc90 sm114") == "nvidia-h100-pcie-sm114"
    assert winners.gpu_class("NVIDIA H200 cc90 sm132") == "nvidia-h200-sm132"
    assert winners.gpu_class("Tesla T4 cc75 sm40") is None
    host = winners.host_class()
    assert host is None or host.startswith("cpu-")
    assert winners.table_key("fir|cpu:x|numpy1|dspk2|float32|3", "cpu:x|numpy1|dspk2",
                             "c") == "fir|c|float32|3"
    assert winners.table_key("cpu:x|numpy1|dspk2|float32", "cpu:y|numpy1|dspk2", "c") is None


def test_the_command_line_says_where_choices_came_from(tables, capsys):
    """`dspk info` names each device's class and its table; `dspk tune-cache show` says a
    choice came from a table."""
    from dspk import cli

    folder, write = tables
    clock = FakeClock()
    t = clocked([Costed("fast", clock, 1e-9), Costed("slow", clock, 3e-9)], clock)
    a, b, p = problem()
    assert cli.main(["info"]) == 0
    assert f"winners table (host): {winners.host_class() or 'no class'}: no table in " \
        f"{folder}" in capsys.readouterr().out
    write({tkey(t, p): entry(["slow", "fast"])})
    assert t.select(p).tuned == "table"
    assert cli.main(["tune-cache", "show"]) == 0
    assert f"tuned: table {CLS}" in capsys.readouterr().out
