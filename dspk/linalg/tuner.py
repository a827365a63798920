"""The autotuner: one place decides how a product runs.

A key is (device, dtype, layout of each operand and of the output, power-of-two size class of
batches, M, N and K, symmetric or not). Each candidate's result is checked against a float64
reference of sampled rows, its precision is verified on a zero-mean probe (TF32 or any demotion
errs ~3e-4 there and is rejected; integer candidates must be bit-exact on a probe spanning the
dtype's full range), and the correct candidates are ranked by their measured time. The ranking
is kept in memory and in a versioned JSON cache (``$DSPK_CACHE_DIR``, default
``~/.cache/dspk``), written atomically under a file lock so that several processes can tune at
once. Processes that share the file make the same choices: a miss re-reads the file when
another process has changed it, and tuning holds the file's lock, so a process that needs a
key another one is tuning waits and takes its ranking (a candidate's rounding may differ from
another's: a shared choice is what keeps outputs bit-identical).

Tuning is paid where it pays back. An unseen key met by a call is tuned *on first use*,
within a budget of a fraction of the product's own time (`BUDGET_RATIO`, at least
`BUDGET_FLOOR_S`; on the GPU at most `BUDGET_CAP_S`): each candidate is timed on a slice of
the product — the longest dimension cut, the other dimensions, layouts and strides as they
are, about 1/(`SLICE_SHARE` · candidates) of the product, grown where a candidate cannot run
less (split-K needs K of 4 chunks) — after its precision probe (a small product of the
slice's K, which also warms the candidate up), and its slice's result is checked; then, while
the budget lasts, a second sample for each and more for those close to the best (each keeps
its best sample: a loaded machine's bursts only ever slow a run down). A candidate that would
take the tuning beyond `SKIP_RATIO` x its budget, and one whose first run would import a
module nothing has imported yet (`dspk.linalg.problem.Candidate.first_use_imports`), is not
timed; the entry says so. The fastest then computes the whole product, checked once more on
sampled entries (one that fails there is rejected and the next one runs), and, on the CPU,
timed: a slice that fits in cache can flatter a memory-bound candidate (measured on 2 cores: a
high-pass by whole-row FFTs estimated at 61 ms from its slice took 128 ms whole, against 50 for
the Toeplitz products it beat), so when a runner-up's estimate is below the winner's whole
time, the runner-up computes the whole product too, in the same call, and the faster of the
two is the choice and the result (``"whole_ms"``): the same bits from the first call on. The
entry records how it was tuned (``"tuned": "slice"``; ``"brief"`` for a product timed whole).
A *thorough*
tuning (`Tuner.thorough`, `dspk.linalg.Engine.thorough`: what ``dspk tune`` and
`dspk.Pipeline.tune` are for) times every candidate on the whole product (warm-up, then the
median of several samples) and replaces a choice tuned on first use; nothing else ever
replaces a stored choice, so a job's chunks, and the processes that share a cache, run one
candidate.

`Tuner.choose` picks among whole-operation implementations (FIR banks, spatial filters, NCC)
the same way: each runs once on the whole problem within the budget, or, when the caller can
give runners on a slice of the problem (``sliced=``), each is checked and timed on the slice
and only the winner computes the whole (`Tuner.choose_run` hands its result back, saving the
caller a run, after the same whole-problem check of a runner-up as for products).

A candidate that is unavailable for a problem says why and drops out quietly; one that raises
is rejected with a logged warning naming it (a missing kernel source in an installed package
must not pass unnoticed).

``DSPK_TUNE=on`` (default) tunes unseen keys; ``off`` takes the first available candidate in a
fixed order; ``readonly`` uses the cache but never times or writes (nor re-tunes thoroughly).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .._version import __version__
from ..backend import device_name
from .problem import Candidate, Problem, prepared
from .tuner_cache import (  # noqa: F401 (the file cache's names, importable here as before)
    CACHE_FORMAT, CACHE_SCHEMA, STAMPS, TUNED_BRIEF, TUNED_SLICE, TUNED_THOROUGH, _cache_lock,
    _entry, _gpu_stamp, _how, _known, _merge_into_cache, _process_lock, _replaces, _signature,
    _stale, _stamp, _valid_cache, cache_path, clear_cache, read_cache)
from .tuner_timing import (  # noqa: F401 (the timing's names, importable here as before)
    BUDGET_CAP_S, BUDGET_FLOOR_S, BUDGET_RATIO, CLOSE, MAX_SAMPLES, MIN_SLICE_MACS, PROBE_BLOCK,
    PROBE_MIN, ROTATE_L2_MULTIPLE, ROTATE_MAX_SETS, SAMPLED_COLS, SKIP_RATIO, SLICE_ALIGN,
    SLICE_SHARE, Stopwatch, _aligned, _base, _cut, _cut_dim, _cycling, _dim_size, _macs,
    _make_probe, _median_time, _precision, _probe_for, _probe_values, _rotation, _Sampler,
    _shape, _slice_for, _warn_failed, precision_tolerance, tuning_budget)

__all__ = ["Tuner", "Choice", "TUNE_MODES", "cache_path", "read_cache", "clear_cache",
           "precision_tolerance"]

log = logging.getLogger(__name__)

TUNE_MODES = ("on", "off", "readonly")

#: What importing a module costs a fresh process, in seconds (measured on the 2-core machine:
#: scipy.fft 0.19 s, scipy.signal 0.76 s; others assumed 0.5 s). A first use leaves untimed a
#: runner whose first run would import a module not yet imported; when the chosen runner then
#: takes longer than that import, the import pays for itself and the runner is timed too.
IMPORT_COST_S = {"scipy.fft": 0.2, "scipy.signal": 0.8}
IMPORT_COST_DEFAULT_S = 0.5

#: what `Tuner.choose` returns as the result when it computed nothing the caller can keep
_NOT_RUN = object()


def tune_mode() -> str:
    mode = (os.environ.get("DSPK_TUNE", "on") or "on").strip().lower()
    if mode not in TUNE_MODES:
        raise ValueError(f"DSPK_TUNE must be one of {TUNE_MODES}, got {mode!r}")
    return mode


def _size_class(n: int) -> int:
    return int(n).bit_length()  # 0 for 0; c for 2^(c-1) <= n < 2^c


@dataclass
class Choice:
    """What runs for a key, and why.

    ``timings_ms`` are the whole product's milliseconds: measured (median) when ``tuned`` is
    ``"thorough"``, else estimated from the best sample on each candidate's slice (its shape
    in ``timed_on``: [batches, M, N, K]). ``untimed``: candidates a first use did not time
    (a thorough tuning does), with the reason."""

    candidate: Candidate
    key: str
    source: str  # "tuned now", "cache (memory)", "cache (file)", "DSPK_TUNE=off", ...
    ranking: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    tuned: str = ""  # "slice", "brief", "thorough", or "" when nothing was tuned
    timed_on: dict[str, list] = field(default_factory=dict)
    untimed: dict[str, str] = field(default_factory=dict)


def _choice(c: Candidate, key: str, source: str, entry: dict) -> Choice:
    return Choice(c, key, source, list(entry["ranking"]), entry.get("timings_ms", {}),
                  entry.get("rejected", {}), _how(entry), entry.get("timed_on", {}),
                  entry.get("untimed", {}))


@dataclass
class _FirstUse:
    """A first use's tuning of ``p`` (started at ``t0``): its trials, samplers and probes by
    geometry, and which candidate's result ``p.out`` holds (None: a slice's, or nothing)."""

    p: Problem
    t0: float
    trials: dict = field(default_factory=dict)
    samplers: dict = field(default_factory=dict)
    probes: dict = field(default_factory=dict)
    wrote: str | None = None


@dataclass
class _Trial:
    """A candidate being timed on its slice ``q`` (``share`` of the product's work)."""

    candidate: Candidate
    q: Problem
    share: float
    call: Callable[[], Any]
    seconds: float               # best sample on the slice
    samples: int = 1

    @property
    def estimate(self) -> float:
        """Seconds for the whole product, from the slice."""
        return self.seconds / self.share


class Tuner:
    """Chooses a candidate per key; see the module docstring.

    Parameters
    ----------
    candidates : callable
        ``candidates(gpu)``: every candidate of a device class, in the order used when tuning
        is off.
    cache_dir : str or os.PathLike, optional
        Folder of the JSON cache; default ``DSPK_CACHE_DIR`` (read when used).
    mode : {"on", "off", "readonly"}, optional
        Default ``DSPK_TUNE`` (read when used).

    Attributes
    ----------
    clock : callable
        The host clock first-use tuning times CPU runs and its budget with
        (`time.perf_counter`; tests give a fake one).
    """

    def __init__(self, candidates: Callable[[bool], list[Candidate]],
                 cache_dir: str | os.PathLike | None = None, mode: str | None = None):
        if mode is not None and mode not in TUNE_MODES:
            raise ValueError(f"mode: expected one of {TUNE_MODES} or None (DSPK_TUNE), got "
                             f"{mode!r}")
        self._candidates = candidates
        self._cache_dir = None if cache_dir is None else Path(cache_dir)
        self._mode = mode
        self._by_name: dict[bool, dict[str, Candidate]] = {}
        self._memory: dict[tuple, dict] = {}
        self._memory_of: tuple | None = None   # the cache the choices in memory belong to
        self._file_seen: tuple | None = None   # (path, stat signature) of the file last read
        self._file_entries: dict[str, dict] = {}
        self._warned_write = False
        self._thorough = 0                     # depth of `thorough` blocks (any thread)
        self._state_lock = threading.Lock()
        self._stopwatch = Stopwatch()          # `clock`, and the tunings started (a nested one
                                               # spoils a timing)

    @property
    def clock(self) -> Callable[[], float]:
        """The host clock first-use tuning times CPU runs and its budget with (settable)."""
        return self._stopwatch.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._stopwatch.clock = clock

    @property
    def mode(self) -> str:
        """``"on"``, ``"off"`` or ``"readonly"``: the one given, else ``DSPK_TUNE`` now."""
        return self._mode if self._mode is not None else tune_mode()

    @property
    def cache_file(self) -> Path:
        """The JSON cache: in the folder given, else in ``DSPK_CACHE_DIR`` now."""
        if self._cache_dir is not None:
            return self._cache_dir / f"tuner-v{CACHE_SCHEMA}.json"
        return cache_path()

    def _memo(self) -> dict[tuple, dict]:
        """The choices in memory, those of the cache in use: emptied when the cache is another
        one than theirs (``DSPK_CACHE_DIR`` changed in this process), so a job never runs a
        choice its cache file does not hold (other processes sharing that file would make
        their own: measured, a resumed job's bits differed from its first run's under load).
        Compares the setting's text, not a path: this is on every product's lookup."""
        where = (self._cache_dir, None if self._cache_dir is not None
                 else os.environ.get("DSPK_CACHE_DIR"))
        if where != self._memory_of:
            self._memory.clear()
            self._memory_of = where
        return self._memory

    # -- thorough tuning -----------------------------------------------------------------------
    @contextmanager
    def thorough(self) -> Iterator["Tuner"]:
        """Within the block (in every thread that uses this tuner), keys are tuned thoroughly:
        every candidate timed on the whole product (warm-up, then the median of several
        samples), checked on the whole product; a choice a first use tuned on a slice (or
        briefly) is tuned again that way and replaced in the cache file, for this process and
        every process that reads the file later (a process that already holds the old choice
        keeps it until it `forget`s). Keys tuned thoroughly before are kept. Nothing happens
        in modes ``"off"`` and ``"readonly"``.

        Bound plans above the tuner (`matmul`'s, per geometry) skip it: use
        `dspk.linalg.Engine.thorough`, which drops them first.

        Examples
        --------
        >>> import numpy as np, tempfile
        >>> from dspk.linalg import Engine, explain
        >>> x = np.random.default_rng(0).standard_normal((4, 3000))
        >>> engine = Engine(cache_dir=tempfile.mkdtemp(), mode="on")
        >>> with engine:
        ...     explain(x, x.T).choice.tuned in ("slice", "brief")
        ...     with engine.tuner.thorough():
        ...         explain(x, x.T).choice.tuned
        True
        'thorough'
        """
        with self._state_lock:
            self._thorough += 1
        try:
            yield self
        finally:
            with self._state_lock:
                self._thorough -= 1

    @property
    def tuning_thoroughly(self) -> bool:
        """Whether unseen (or first-use-tuned) keys are tuned thoroughly now: inside a
        `thorough` block, in mode ``"on"``."""
        return self._thorough > 0 and self.mode == "on"

    # -- keys ----------------------------------------------------------------------------------
    @staticmethod
    def key(p: Problem) -> tuple:
        return (_stamp(p), p.dtype.name, p.a.layout(), p.b.layout(), p.out.layout(),
                _size_class(p.batches), _size_class(p.m), _size_class(p.n), _size_class(p.k),
                "sym" if p.symmetric else "gen")

    @staticmethod
    def key_str(key: tuple) -> str:
        return "|".join(str(k) for k in key)

    def candidates(self, gpu: bool, kind: str = "f") -> list[Candidate]:
        return list(self._names(gpu, kind).values())

    def _names(self, gpu: bool, kind: str = "f") -> dict[str, Candidate]:
        """Candidates for a device class and a dtype kind (float "f"; integers "i"/"u")."""
        key = (gpu, "f" if kind == "f" else "i")
        d = self._by_name.get(key)
        if d is None:
            d = {c.name: c for c in self._candidates(gpu) if key[1] in c.kinds}
            self._by_name[key] = d
        return d

    # -- selection -----------------------------------------------------------------------------
    def select(self, p: Problem, run: bool = False) -> Choice:
        """The candidate for ``p``. With ``run=True`` the product is also computed into
        ``p.out`` (tuning computes it anyway)."""
        mode = self.mode
        names = self._names(p.gpu, p.dtype.kind)
        key = self.key(p)
        if mode == "off":
            return self._first_available(p, names.values(), key, "DSPK_TUNE=off: first available "
                                                                 "candidate in fixed order", run)
        thorough = self.tuning_thoroughly
        choice = self._cached_for(p, key, thorough)
        if choice is not None:
            if run:
                choice.candidate.run(p)
            return choice
        if mode == "readonly":
            return self._first_available(p, names.values(), key, "DSPK_TUNE=readonly and no cached "
                                         "choice: first available candidate", run)
        with _cache_lock(self.cache_file):
            # another process may have tuned it meanwhile
            choice = self._cached_for(p, key, thorough)
            if choice is not None:
                if run:
                    choice.candidate.run(p)
                return choice
            return self._tune(p, key, names, run, thorough)

    def _cached_for(self, p: Problem, key: tuple, thorough: bool) -> Choice | None:
        """`cached`, but while tuning thoroughly a choice tuned on first use is a miss unless
        the file now holds a thorough one (another process's)."""
        choice = self.cached(p, key)
        if choice is None or not thorough or choice.tuned == TUNED_THOROUGH:
            return choice
        self._memory.pop(key, None)
        choice = self.cached(p, key)              # the file's entry, read again if it changed
        return choice if choice is not None and choice.tuned == TUNED_THOROUGH else None

    def cached(self, p: Problem, key: tuple | None = None) -> Choice | None:
        """The cached choice for ``p`` (memory, then the file), or None; never times anything."""
        key = self.key(p) if key is None else key
        names = self._names(p.gpu, p.dtype.kind)
        entry = self._memo().get(key)
        source = "cache (memory)"
        if entry is None:
            entry = self._from_file(key)
            source = "cache (file)"
            if entry is not None and self.mode == "on" and _stale(entry, names, p):
                # tuned before a candidate that can run this product existed: tune again (the
                # new entry replaces it in the file); "readonly" keeps using it
                self._memory.pop(key, None)
                return None
        if entry is None:
            return None
        for name in entry["ranking"]:
            c = names.get(name)
            if c is not None and c.unavailable(p) is None:
                return _choice(c, self.key_str(key), source, entry)
        return None

    def first_available(self, p: Problem, why: str) -> Choice:
        """The first available candidate in the fixed order (no timing)."""
        return self._first_available(p, self._names(p.gpu, p.dtype.kind).values(), self.key(p),
                                     why, False)

    def _first_available(self, p: Problem, cands: Any, key: tuple, why: str, run: bool) -> Choice:
        rejected = {}
        for c in cands:
            reason = c.unavailable(p)
            if reason is None:
                if run:
                    c.run(p)
                return Choice(c, self.key_str(key), why, rejected=rejected)
            rejected[c.name] = reason
        raise RuntimeError(f"no candidate can compute this product: {rejected}")

    # -- tuning --------------------------------------------------------------------------------
    def _tune(self, p: Problem, key: tuple, names: dict[str, Candidate], run: bool = True,
              thorough: bool = False) -> Choice:
        """Tune ``key`` on ``p`` (on first use, or thoroughly), store the ranking, and (with
        ``run``) leave the chosen candidate's product in ``p.out``."""
        self._stopwatch.tunings += 1
        rejected: dict[str, str] = {}
        usable = []
        for c in names.values():
            reason = c.unavailable(p)
            if reason is None:
                usable.append(c)
            else:
                rejected[c.name] = f"unavailable: {reason}"
        if not usable:
            raise RuntimeError(f"no candidate can compute this product: {rejected}")
        if thorough:
            entry, done = self._tune_whole(p, usable, rejected, key)
        else:
            entry, done = self._tune_first_use(p, usable, rejected, key, run)
        saved = self._save(key, entry)
        if saved is entry:
            best = names[entry["ranking"][0]]
            if run and not done:
                best.run(p)  # leave the winner's result in p.out
            return _choice(best, self.key_str(key), "tuned now", entry)
        # another process stored this key first: its ranking is the choice (outputs agree)
        choice = self.cached(p, key)
        if choice is None:  # pragma: no cover - theirs names no candidate available here
            choice = _choice(names[entry["ranking"][0]], self.key_str(key), "tuned now", entry)
        if run:
            choice.candidate.run(p)
        choice.source = "tuned now"
        return choice

    def _tune_whole(self, p: Problem, usable: list[Candidate], rejected: dict[str, str],
                    key: tuple) -> tuple[dict, bool]:
        """Thorough: every candidate on the whole product, checked on sampled rows (every
        column), precision on a probe of the whole geometry, timed with a warm-up and the
        median of several samples. Returns (entry, whether p.out holds the winner's result:
        never)."""
        sampler = _Sampler(p)
        rotation = _rotation(p)
        probe = _make_probe(p)
        probe_sampler = _Sampler(probe)
        timings: dict[str, float] = {}
        for c in usable:
            try:
                sampler.poison()
                c.run(p)
                bad = sampler.check_result()
                if bad:
                    rejected[c.name] = f"wrong result: {bad}"
                    continue
                bad = _precision(c.run, probe, probe_sampler, p.dtype)
                if bad:
                    rejected[c.name] = bad
                    continue
                timings[c.name] = _median_time(_cycling(c, rotation), p.gpu,
                                               clock=self.clock) * 1e3
            except Exception as exc:  # a candidate that breaks is rejected, not fatal
                rejected[c.name] = f"failed: {type(exc).__name__}: {exc}"
                _warn_failed(c.name, self.key_str(key), exc)
        if not timings:
            raise RuntimeError(f"every candidate failed for this product: {rejected}")
        return _entry(timings, rejected, TUNED_THOROUGH), False

    def _tune_first_use(self, p: Problem, usable: list[Candidate], rejected: dict[str, str],
                        key: tuple, run: bool) -> tuple[dict, bool]:
        """First use: each candidate checked and timed on its slice within the budget (module
        docstring), then (with ``run``) the fastest computes ``p``, checked on sampled entries;
        one that fails there is rejected and the next one runs. Returns (entry, whether p.out
        holds the winner's checked result)."""
        gpu = p.gpu
        clock = self.clock
        t0 = clock()
        work = _macs(p)
        untimed: dict[str, str] = {}
        # a candidate whose first run would import a module nothing has imported yet is left
        # for a thorough tuning (when another one can run the product)
        deferred = [c for c in usable if any(m not in sys.modules for m in c.first_use_imports)]
        if len(deferred) == len(usable):
            deferred = []
        for c in deferred:
            missing = ", ".join(m for m in c.first_use_imports if m not in sys.modules)
            untimed[c.name] = (f"not timed on first use: its first run would import {missing}, "
                               f"which costs more than the product; a thorough tuning (dspk "
                               f"tune) times it")
        timed = [c for c in usable if c not in deferred]
        target = max(MIN_SLICE_MACS[gpu], work // (SLICE_SHARE * len(timed)))
        dim = _cut_dim(p)
        if len(timed) == 1 or dim is None or work <= MIN_SLICE_MACS[gpu]:
            slices = [(c, p) for c in timed]      # (one candidate: nothing to rank)
        else:
            slices = [(c, _slice_for(p, dim, target, c)) for c in timed]
        # cheapest slices first: the best estimate is known before a large slice is weighed
        order = sorted(range(len(slices)), key=lambda i: (_macs(slices[i][1]), i))
        state = _FirstUse(p, t0)
        smallest = _macs(slices[order[0]][1])
        for i in order:
            c, q = slices[i]
            # Every candidate after the first is timed only while the tuning stays within
            # SKIP_RATIO x its budget, counting its slice at the best one's speed: slices of
            # the target's size cost about 1/SLICE_SHARE of the product together, and pass
            # unless the candidates before them cost far more than their work (setup costs,
            # cold runs, a loaded machine). On the GPU, where products take a fraction of a
            # millisecond and the tuning's own Python is most of its cost, only a slice grown
            # beyond the target (for the candidate to run it at all) is weighed.
            weigh = bool(state.trials) and (not gpu or _macs(q) > smallest)
            reason = self._first_trial(c, q, state, rejected, key, weigh)
            if reason:
                untimed[c.name] = reason
        if not state.trials:                      # nothing else could: those deferred, then
            for c in deferred:
                untimed.pop(c.name)
                self._first_trial(c, p, state, rejected, key, False)
        trials = state.trials
        if not trials:
            raise RuntimeError(f"every candidate failed for this product: {rejected}")
        self._more_samples(trials, gpu, state)
        ranking = sorted(trials, key=lambda n: trials[n].estimate)
        log.debug("dspk tuner: ranking %s after %.3g ms (samples %s)", ranking,
                  (clock() - t0) * 1e3, {n: t.samples for n, t in trials.items()})
        done, whole = False, {}
        if run:
            ranking, done, seconds = self._run_checked(p, ranking, trials, rejected,
                                                       state.wrote, key)
            if seconds is not None:               # (timed on the CPU only)
                ranking, whole = self._whole_check_product(p, ranking, trials, rejected, key,
                                                           seconds)
        timings = {n: trials[n].estimate * 1e3 for n in ranking}
        how = TUNED_SLICE if any(t.q is not p for t in trials.values()) else TUNED_BRIEF
        entry = _entry(timings, rejected, how, ranking)
        if whole:
            entry["whole_ms"] = whole
        if how == TUNED_SLICE:
            entry["timed_on"] = {n: list(_shape(trials[n].q)) for n in ranking}
        if untimed:
            entry["untimed"] = untimed
        return entry, done

    def _first_trial(self, c: Candidate, q: Problem, state: "_FirstUse",
                     rejected: dict[str, str], key: tuple, weigh: bool) -> str | None:
        """``c``'s precision probe (which also warms it up: imports, kernels loaded, plans
        made, so that the timed run is not its very first), then one timed run on its slice
        ``q``, checked on sampled entries: a `_Trial` in ``state``, or a reason in
        ``rejected``. With ``weigh``, each of the two runs is made only if the tuning would
        stay within its cap (SKIP_RATIO x the budget) with this slice at the best speed so
        far; returns why it was not timed, or None."""
        p = state.p
        share = _macs(q) / _macs(p)
        try:
            for step in ("probe", "run"):
                if weigh:
                    best = min(t.estimate for t in state.trials.values())
                    cap = SKIP_RATIO * tuning_budget(best, p.gpu)
                    if self.clock() - state.t0 + best * share > cap:
                        what = "its slice" if step == "probe" else "its slice, after its probe,"
                        return (f"not timed on first use: {what} {_shape(q)} would take the "
                                f"tuning beyond its budget (~{cap * 1e3:.3g} ms); a thorough "
                                f"tuning (dspk tune) times it")
                if step == "run":
                    break
                probe, probe_sampler = _probe_for(q, c, state.probes)
                bad = _precision(lambda pr: prepared(c, pr)(), probe, probe_sampler, p.dtype)
                if bad:
                    rejected[c.name] = bad
                    return None
            sampler = state.samplers.get(_shape(q))
            if sampler is None:
                sampler = state.samplers[_shape(q)] = _Sampler(q, SAMPLED_COLS)
            call = prepared(c, q)
            sampler.poison()
            seconds = self._stopwatch.seconds(call, p.gpu)
            state.wrote = c.name if q is p else None
            bad = sampler.check_result()
            if bad:
                where = "" if q is p else f" on the slice {_shape(q)}"
                rejected[c.name] = f"wrong result{where}: {bad}"
                return None
            state.trials[c.name] = _Trial(c, q, share, call, seconds)
            log.debug("dspk tuner: %s on %s: %.3g ms (%.3g ms estimated for %s), %.3g ms "
                      "into the tuning", c.name, _shape(q), seconds * 1e3,
                      seconds / share * 1e3, _shape(p), (self.clock() - state.t0) * 1e3)
        except Exception as exc:  # a candidate that breaks is rejected, not fatal
            rejected[c.name] = f"failed: {type(exc).__name__}: {exc}"
            _warn_failed(c.name, self.key_str(key), exc)
        return None

    def _more_samples(self, trials: dict[str, _Trial], gpu: bool, state: "_FirstUse") -> None:
        """More samples while the budget lasts, each trial keeping its best (the minimum is
        what a loaded machine's noise leaves least biased): a second one for every candidate
        (a first sample can be spoilt by another process's burst), then rounds over those
        within `CLOSE` of the best. Cheaper samples first. On the GPU a sample repeats a
        short run to 0.2 ms and cycles through copies of small operands (`_rotation`)."""
        if len(trials) < 2:
            return
        calls: dict[str, tuple[Callable[[], Any], int]] = {}
        for round_ in range(MAX_SAMPLES - 1):
            best = min(t.estimate for t in trials.values())
            budget = tuning_budget(best, gpu)
            names = [n for n, t in trials.items() if round_ == 0 or t.estimate <= CLOSE * best]
            if len(names) < 2:
                return
            for name in sorted(names, key=lambda n: trials[n].seconds):
                t = trials[name]
                if name not in calls:
                    reps = max(1, min(200, int(2e-4 / max(t.seconds, 1e-7)))) if gpu else 1
                    sets = _rotation(t.q) if gpu else [t.q]
                    calls[name] = (t.call if len(sets) == 1 else _cycling(t.candidate, sets),
                                   reps)
                call, reps = calls[name]
                if self.clock() - state.t0 + t.seconds * reps > budget:
                    return
                t.seconds = min(t.seconds, self._stopwatch.seconds(call, gpu, reps))
                t.samples += 1
                state.wrote = name if t.q is state.p else None

    def _whole_check_product(self, p: Problem, ranking: list[str], trials: dict[str, _Trial],
                             rejected: dict[str, str], key: tuple,
                             seconds: float) -> tuple[list[str], dict[str, float]]:
        """`_whole_check` for a product: the winner has computed ``p`` in ``seconds``; a
        runner-up whose estimate is below that computes it too (checked on sampled entries,
        the winner's result kept aside), and the faster one's result stays in ``p.out``.
        Returns (the ranking, the whole times in ms)."""
        name = ranking[0]
        whole = {name: seconds * 1e3}
        rival = next((n for n in ranking[1:] if trials[n].estimate < seconds), None)
        if rival is None:
            return ranking, {name: round(whole[name], 6)}
        kept = p.out.to_array().copy()
        sampler = _Sampler(p, SAMPLED_COLS)
        try:
            sampler.poison()
            t = self._stopwatch.seconds(prepared(trials[rival].candidate, p), p.gpu)
            bad = sampler.check_result()
        except Exception as exc:  # a candidate that breaks is rejected, not fatal
            bad = f"failed: {type(exc).__name__}: {exc}"
            _warn_failed(rival, self.key_str(key), exc)
        if bad:
            rejected[rival] = f"wrong result on the whole product: {bad}"
            ranking = [n for n in ranking if n != rival]
        else:
            whole[rival] = t * 1e3
        if bad or t >= seconds:
            p.out.to_array()[...] = kept          # the winner's result stands
        ranking = sorted(whole, key=whole.get) + [n for n in ranking if n not in whole]
        return ranking, {n: round(v, 6) for n, v in whole.items()}

    def _run_checked(self, p: Problem, ranking: list[str], trials: dict[str, _Trial],
                     rejected: dict[str, str], wrote: str | None,
                     key: tuple) -> tuple[list[str], bool, float | None]:
        """The best candidate computes ``p``, its result checked on sampled entries; one
        that fails is rejected and the next one runs. Returns (the ranking without those
        rejected, True, the seconds of that whole run — None when the result was there)."""
        sampler = None
        ranking = list(ranking)
        while ranking:
            name = ranking[0]
            if wrote == name:
                return ranking, True, None        # its checked result is in p.out already
            if sampler is None:
                sampler = _Sampler(p, SAMPLED_COLS)
            try:
                sampler.poison()
                call = prepared(trials[name].candidate, p)
                if p.gpu:                         # (the whole-problem check is the CPU's)
                    call()
                    seconds = None
                else:
                    seconds = self._stopwatch.seconds(call, False)
                bad = sampler.check_result()
            except Exception as exc:  # a candidate that breaks is rejected, not fatal
                bad = f"failed: {type(exc).__name__}: {exc}"
                _warn_failed(name, self.key_str(key), exc)
            if not bad:
                return ranking, True, seconds
            rejected[name] = f"wrong result on the whole product: {bad}"
            ranking.pop(0)
        raise RuntimeError(f"every candidate failed for this product: {rejected}")

    def choose(self, key: tuple, runners: dict[str, Callable[[], Any]], gpu: bool,
               agree: Callable[[Any, Any], str | None],
               sliced: Callable[[float], dict[str, Callable[[], Any]]] | None = None,
               imports: dict[str, tuple[str, ...]] | None = None,
               jit: Any = ()) -> tuple[str, str]:
        """Pick among whole-operation implementations (an NCC bank, say) the way `select` picks
        among product candidates: the cached ranking, else each runner is run, its result
        checked against the first runner's (the reference) with ``agree`` (None, or why not),
        timed, and the ranking stored under ``key``. Returns (name, why); the caller runs
        ``runners[name]`` (`choose_run` runs it, and saves a run on first use).

        Parameters
        ----------
        key : tuple
            The cache key (operation, `stamp`, dtype, size classes...).
        runners : dict
            Name -> zero-argument call computing the whole operation; the first is the
            reference (and what runs with ``DSPK_TUNE=off``).
        gpu : bool
            Time with CUDA events (the runners' work is on the current device).
        agree : callable
            ``agree(result, reference)``: None, or why the result is wrong.
        sliced : callable, optional
            ``sliced(fraction)``: runners with the same names computing the same operation on
            about ``fraction`` of the problem (that fraction of the channels, say: cut where
            the cost per element is that of the whole), each returning its result. A first
            use then checks and times those (each runs twice: a warm-up checked against the
            first one's result, then timed; more samples for close ones while the budget
            lasts), and only the winner computes the whole problem: the cost of tuning stays
            about that of one run (`BUDGET_RATIO`). Without it each runner runs once on the
            whole problem (more samples only when runs are short against the budget).
            A thorough tuning (`thorough`) always times the whole ``runners``.
        imports : dict, optional
            Name -> modules its first run imports when nothing has yet (``scipy.signal``:
            about 2 s on 2 cores): a first use leaves such a runner for a thorough tuning
            while another one can run (the first runner left is then the reference; one left
            alone is chosen without a run).
        jit : collection of str, optional
            Names of runners whose first run in a process makes CuPy compile kernels of its
            own with NVRTC (0.1-1.5 s each on a machine whose CuPy cache is empty; cupyx's
            overlap-add, cuSPARSE's CSR through cupyx, cupy.median): on the GPU a first use
            leaves them for a thorough tuning, as ``imports``.

        Returns
        -------
        tuple
            (name, why): why is ``"cache"``, ``"tuned now"`` or the mode's reason.
        """
        name, why, _ = self._choose(key, runners, gpu, agree, sliced, imports, jit, keep=False)
        return name, why

    def choose_run(self, key: tuple, runners: dict[str, Callable[[], Any]], gpu: bool,
                   agree: Callable[[Any, Any], str | None],
                   sliced: Callable[[float], dict[str, Callable[[], Any]]] | None = None,
                   imports: dict[str, tuple[str, ...]] | None = None, jit: Any = ()
                   ) -> tuple[str, str, Any]:
        """`choose`, and the chosen runner's result: (name, why, result). On first use without
        ``sliced`` the result is the one the tuning computed (no further run); otherwise the
        chosen runner runs once more, on the whole problem.

        Examples
        --------
        >>> import numpy as np, tempfile
        >>> from dspk.linalg.tuner import Tuner
        >>> t = Tuner(lambda gpu: [], cache_dir=tempfile.mkdtemp(), mode="on")
        >>> x = np.arange(6.0)
        >>> runners = {"sum": lambda: x.sum(), "dot": lambda: x @ np.ones(6)}
        >>> name, why, total = t.choose_run(("total", 6), runners, False,
        ...                                 lambda got, ref: None if got == ref else "differs")
        >>> name in runners, why, float(total)
        (True, 'tuned now', 15.0)
        >>> t.choose_run(("total", 6), runners, False, lambda got, ref: None)[1]
        'cache'
        """
        name, why, result = self._choose(key, runners, gpu, agree, sliced, imports, jit,
                                         keep=True)
        if result is _NOT_RUN:
            result = runners[name]()
        return name, why, result

    def _choose(self, key: tuple, runners: dict[str, Callable[[], Any]], gpu: bool,
                agree: Callable[[Any, Any], str | None], sliced: Any, imports: Any,
                jit: Any, keep: bool) -> tuple[str, str, Any]:
        mode = self.mode
        names = list(runners)
        if mode == "off":
            return names[0], "DSPK_TUNE=off: first implementation", _NOT_RUN
        thorough = self.tuning_thoroughly
        name = self._cached_name(key, runners, thorough, self._memo().get(key))
        if name is not None:
            return name, "cache", _NOT_RUN
        if mode == "readonly":
            return names[0], "DSPK_TUNE=readonly and no cached choice", _NOT_RUN
        with _cache_lock(self.cache_file):
            # another process may have tuned it meanwhile
            name = self._cached_name(key, runners, thorough, None)
            if name is not None:
                return name, "cache", _NOT_RUN
            return self._choose_now(key, runners, gpu, agree, sliced, keep, thorough, imports,
                                    jit)

    def _cached_name(self, key: tuple, runners: dict, thorough: bool,
                     entry: dict | None) -> str | None:
        """The first name of the cached ranking that is in ``runners`` (``entry``, else the
        file's); while tuning thoroughly only a thorough entry counts."""
        if entry is None or (thorough and _how(entry) != TUNED_THOROUGH):
            entry = self._from_file(key)
        if entry is None or (thorough and _how(entry) != TUNED_THOROUGH):
            return None
        return next((n for n in entry["ranking"] if n in runners), None)

    def _choose_now(self, key: tuple, runners: dict[str, Callable[[], Any]], gpu: bool,
                    agree: Callable[[Any, Any], str | None], sliced: Any = None,
                    keep: bool = False, thorough: bool = False,
                    imports: dict[str, tuple[str, ...]] | None = None,
                    jit: Any = ()) -> tuple[str, str, Any]:
        self._stopwatch.tunings += 1
        untimed = {}
        every, every_sliced = runners, sliced
        if not thorough and (imports or (gpu and jit)):
            deferred = {}
            for n in runners:
                missing = ", ".join(m for m in (imports or {}).get(n, ()) if m not in sys.modules)
                if missing:
                    deferred[n] = f"its first run would import {missing}"
                elif gpu and n in jit:
                    deferred[n] = "its first run would have CuPy compile kernels (NVRTC)"
            if len(deferred) < len(runners):
                untimed = {n: f"not timed on first use: {why}, which costs more than the "
                              f"operation; a thorough tuning (dspk tune) times it"
                           for n, why in deferred.items()}
                runners = {n: r for n, r in runners.items() if n not in deferred}
                if sliced is not None:
                    sliced = _only(sliced, set(runners))
        if thorough:
            entry, result = self._choose_whole(key, runners, gpu, agree), _NOT_RUN
        elif len(runners) == 1:                   # nothing to rank (nor to check against)
            name = next(iter(runners))
            entry, result = _entry({}, {}, TUNED_BRIEF, [name]), _NOT_RUN
        elif sliced is not None:
            entry, result = self._choose_sliced(key, runners, gpu, agree, sliced), _NOT_RUN
            if keep and not gpu:   # (measured on the CPU; the GPU's first use is as before)
                entry, result = self._whole_check(key, entry, runners, gpu, agree)
        else:
            entry, result = self._choose_brief(key, runners, gpu, agree, keep)
        worth, result = self._imports_worth(entry, result, runners, untimed, imports, gpu)
        if worth:
            # the chosen runner costs more than importing what a deferred one needs: time
            # those too (this call pays the imports once; the choice is then the fastest)
            kept = {n: r for n, r in every.items() if n in runners or n in worth}
            return self._choose_now(key, kept, gpu, agree, _only(every_sliced, set(kept))
                                    if every_sliced is not None else None, keep, thorough,
                                    None, jit)
        if untimed:
            entry["untimed"] = {**entry.get("untimed", {}), **untimed}
        saved = self._save(key, entry)
        ranking = [n for n in saved["ranking"] if n in runners] or entry["ranking"]
        if saved is not entry and ranking[0] != entry["ranking"][0]:
            result = _NOT_RUN                     # another process's choice: run theirs
        return ranking[0], "tuned now", result

    def _whole_check(self, key: tuple, entry: dict, runners: dict[str, Callable[[], Any]],
                     gpu: bool, agree: Callable[[Any, Any], str | None]) -> tuple[dict, Any]:
        """The sliced ranking's winner computes the whole problem, timed (the caller's
        result). A slice that fits in cache can make a memory-bound runner look fast (on 2
        cores: a high-pass by whole-row FFTs estimated at 61 ms from its slice took 128 ms
        whole, against 50 for the Toeplitz products it beat): when a runner-up's estimate is
        below the winner's whole time, the runner-up also computes the whole problem, timed and
        checked against the winner's result, and the faster of the two is the choice and the
        result. Both runs are in this first call, so every later call runs the same choice
        (the same bits). Returns (the entry with ``whole_ms``, the chosen runner's result)."""
        name = entry["ranking"][0]
        result, seconds, clean = self._stopwatch.sample(runners[name], gpu)
        if not clean:                             # a tuning ran inside: no measure of it
            return entry, result
        whole = {name: seconds * 1e3}
        estimates = entry["timings_ms"]
        rival = next((n for n in entry["ranking"][1:] if estimates[n] < whole[name]), None)
        if rival is not None:
            try:
                other, t, clean = self._stopwatch.sample(runners[rival], gpu)
                bad = agree(other, result)
                if bad:
                    entry["rejected"][rival] = f"on the whole problem: {bad}"
                elif clean:
                    whole[rival] = t * 1e3
                    if t < seconds:
                        result = other
                other = None
            except Exception as exc:  # a broken implementation is rejected, not fatal
                entry["rejected"][rival] = (f"failed on the whole problem: "
                                            f"{type(exc).__name__}: {exc}")
                _warn_failed(rival, self.key_str(key), exc)
        entry["whole_ms"] = {n: round(v, 6) for n, v in whole.items()}
        entry["ranking"] = sorted(whole, key=whole.get) + \
            [n for n in entry["ranking"] if n not in whole and n not in entry["rejected"]]
        return entry, result

    def _choose_whole(self, key: tuple, runners: dict[str, Callable[[], Any]], gpu: bool,
                      agree: Callable[[Any, Any], str | None]) -> dict:
        """Thorough: each runner checked, then timed with a warm-up and the median of several
        samples, on the whole problem."""
        ref = runners[next(iter(runners))]()
        timings: dict[str, float] = {}
        rejected: dict[str, str] = {}
        for name, run in runners.items():
            try:
                bad = agree(run(), ref)
                if bad:
                    rejected[name] = bad
                    continue
                timings[name] = _median_time(run, gpu, clock=self.clock) * 1e3
            except Exception as exc:  # a broken implementation is rejected, not fatal
                rejected[name] = f"failed: {type(exc).__name__}: {exc}"
                _warn_failed(name, self.key_str(key), exc)
        if not timings:
            raise RuntimeError(f"every implementation failed: {rejected}")
        return _entry(timings, rejected, TUNED_THOROUGH)

    def _imports_worth(self, entry: dict, result: Any, runners: dict, untimed: dict,
                       imports: dict | None, gpu: bool) -> tuple[set, Any]:
        """(the runners left untimed for an import, on the CPU, whose imports cost less than
        the chosen runner's time on the whole problem; the chosen runner's result). That time
        is measured here when the tuning did not run it whole (a lone runner): its run is
        then the call's result, so it runs once."""
        waiting = [n for n in untimed if "would import" in untimed[n]]
        if gpu or not waiting or not imports:
            return set(), result
        name = entry["ranking"][0]
        ms = entry.get("whole_ms", {}).get(name)
        if ms is None and result is _NOT_RUN and len(runners) == 1:
            result, seconds, clean = self._stopwatch.sample(runners[name], gpu)
            ms = seconds * 1e3 if clean else None
        if ms is None:
            ms = entry.get("timings_ms", {}).get(name)
        if ms is None:
            return set(), result

        def cost(n: str) -> float:
            return sum(IMPORT_COST_S.get(m, IMPORT_COST_DEFAULT_S)
                       for m in imports.get(n, ()) if m not in sys.modules)
        return {n for n in waiting if cost(n) < ms / 1e3}, result

    def _choose_brief(self, key: tuple, runners: dict[str, Callable[[], Any]], gpu: bool,
                      agree: Callable[[Any, Any], str | None], keep: bool) -> tuple[dict, Any]:
        """First use without slices: each runner once on the whole problem (the first one's
        run is the reference and its first sample; a run inside which a nested tuning ran is
        repeated for a clean sample), more samples of close ones while the budget lasts.
        Returns (entry, the winner's result when ``keep`` and it was kept, else `_NOT_RUN`)."""
        t0 = self.clock()
        seconds: dict[str, float] = {}
        rejected: dict[str, str] = {}
        kept_name, kept = None, _NOT_RUN
        ref = _NOT_RUN
        for name, run in runners.items():
            try:
                result, t, clean = self._stopwatch.sample(run, gpu)
                if ref is _NOT_RUN:
                    ref = result
                else:
                    bad = agree(result, ref)
                    if bad:
                        rejected[name] = bad
                        continue
                if not clean:
                    result, t, _ = self._stopwatch.sample(run, gpu)
                if keep and (kept_name is None or t < seconds[kept_name]):
                    kept_name, kept = name, result   # the fastest so far: its result is kept
                seconds[name] = t
                result = None
            except Exception as exc:  # a broken implementation is rejected, not fatal
                if ref is _NOT_RUN:
                    raise                         # no reference: the operation itself fails
                rejected[name] = f"failed: {type(exc).__name__}: {exc}"
                _warn_failed(name, self.key_str(key), exc)
        ref = None
        if not seconds:
            raise RuntimeError(f"every implementation failed: {rejected}")
        self._resample(seconds, {n: runners[n] for n in seconds}, gpu, t0, 1.0, MAX_SAMPLES - 1)
        log.debug("dspk tuner: %s: %s ms after %.3g ms", self.key_str(key),
                  {n: round(t * 1e3, 3) for n, t in seconds.items()}, (self.clock() - t0) * 1e3)
        entry = _entry({n: t * 1e3 for n, t in seconds.items()}, rejected, TUNED_BRIEF)
        if kept_name != entry["ranking"][0]:
            kept = _NOT_RUN                       # overtaken by a later sample
        return entry, kept

    def _resample(self, seconds: dict[str, float], runs: dict[str, Callable[[], Any]],
                  gpu: bool, t0: float, fraction: float, rounds: int) -> None:
        """Up to ``rounds`` more samples of the runners within `CLOSE` of the best, round by
        round, while the budget of the whole operation (the best time / ``fraction``) lasts;
        each keeps its best sample."""
        for _ in range(rounds):
            best = min(seconds.values())
            close = sorted((n for n in seconds if seconds[n] <= CLOSE * best), key=seconds.get)
            if len(close) < 2:
                return
            for name in close:
                if self.clock() - t0 + seconds[name] > tuning_budget(best / fraction, gpu):
                    return
                _, t, _ = self._stopwatch.sample(runs[name], gpu)
                seconds[name] = min(seconds[name], t)

    def _choose_sliced(self, key: tuple, runners: dict[str, Callable[[], Any]], gpu: bool,
                       agree: Callable[[Any, Any], str | None],
                       sliced: Callable[[float], dict[str, Callable[[], Any]]]) -> dict:
        """First use with slices: each sliced runner runs on its slice as a warm-up checked
        against the first one's result (its time a first sample, unless a tuning ran inside
        it), then a timed run — fastest warm-up first; after the first, only while the tuning
        stays within SKIP_RATIO x its budget — then close ones again while the budget lasts.
        Runners without a sliced version are not timed."""
        t0 = self.clock()
        fraction = 1.0 / (2 * SLICE_SHARE * len(runners))   # two runs each
        small = sliced(fraction)
        seconds: dict[str, float] = {}
        clean: dict[str, bool] = {}
        rejected: dict[str, str] = {}
        untimed = {n: "not timed on first use: no sliced runner (a thorough tuning times it)"
                   for n in runners if n not in small}
        ref = _NOT_RUN
        for name in (n for n in runners if n in small):
            try:
                result, seconds[name], clean[name] = self._stopwatch.sample(small[name], gpu)
                if ref is _NOT_RUN:
                    ref = result
                else:
                    bad = agree(result, ref)
                    if bad:
                        rejected[name] = f"on a slice: {bad}"
                        del seconds[name]
                result = None
            except Exception as exc:  # a broken implementation is rejected, not fatal
                if ref is _NOT_RUN:
                    raise                         # no reference: the operation itself fails
                seconds.pop(name, None)
                rejected[name] = f"failed on a slice: {type(exc).__name__}: {exc}"
                _warn_failed(name, self.key_str(key), exc)
        ref = None
        if not seconds:
            raise RuntimeError(f"every implementation failed: {rejected}")
        # the timed runs: a warm-up spoilt by a tuning inside it first (it says nothing), then
        # the fastest; the others while the tuning stays within its cap
        order = sorted(seconds, key=lambda n: (clean[n], seconds[n]))
        for i, name in enumerate(order):
            best = min(seconds[n] for n in seconds if clean[n] or n == name)
            cap = SKIP_RATIO * tuning_budget(best / fraction, gpu)
            if i and clean[name] and self.clock() - t0 + seconds[name] > cap:
                continue                          # its warm-up sample stands
            _, t, _ = self._stopwatch.sample(small[name], gpu)
            seconds[name] = t if not clean[name] else min(seconds[name], t)
            clean[name] = True
        self._resample(seconds, small, gpu, t0, fraction, MAX_SAMPLES - 2)
        log.debug("dspk tuner: %s on %.3g of the problem: %s ms after %.3g ms",
                  self.key_str(key), fraction, {n: round(t * 1e3, 3) for n, t in seconds.items()},
                  (self.clock() - t0) * 1e3)
        entry = _entry({n: t / fraction * 1e3 for n, t in seconds.items()}, rejected,
                       TUNED_SLICE)
        entry["slice_fraction"] = fraction
        if untimed:
            entry["untimed"] = untimed
        return entry

    def stamp(self, gpu: bool, device_id: int | None) -> str:
        """The device/version stamp keys start with."""
        return _gpu_stamp(device_id) if gpu else \
            f"{device_name(None)}|numpy{np.__version__}|dspk{__version__}"

    # -- the cache file ------------------------------------------------------------------------
    def _from_file(self, key: tuple) -> dict | None:
        """The file's entry for ``key``. Called on a miss in memory, so a long-lived process
        sees what other processes stored since it last looked: the file is read again whenever
        its stat signature changed (one ``stat`` per miss otherwise)."""
        path = self.cache_file
        seen = (path, _signature(path))
        if seen != self._file_seen:
            self._file_entries = read_cache(path)
            self._file_seen = seen
        entry = self._file_entries.get(self.key_str(key))
        if entry is not None:
            self._memo()[key] = entry
        return entry

    def _save(self, key: tuple, entry: dict) -> dict:
        """Store ``entry`` unless another process stored ``key`` first; returns the entry kept
        (then also in memory), so that processes sharing the file agree."""
        path = self.cache_file
        try:
            entry = _merge_into_cache(path, self.key_str(key), entry)
        except OSError as exc:
            if not self._warned_write:
                warnings.warn(f"dspk tuner: cannot write its cache {path}: {exc}; choices are "
                              f"kept in memory only", RuntimeWarning, stacklevel=3)
                self._warned_write = True
        self._memo()[key] = entry
        return entry

    def forget(self) -> None:
        """Drop the in-memory choices and candidates (the file is read again on next use)."""
        self._memory.clear()
        self._memory_of = None
        self._file_seen = None
        self._file_entries = {}
        self._by_name.clear()

    def entries_in_memory(self) -> int:
        """Choices held in memory (those looked up or tuned, and the file's last reading)."""
        return len(self._memory) + len(self._file_entries)


def _only(sliced: Callable[[float], dict], names: set) -> Callable[[float], dict]:
    """``sliced`` keeping only the runners in ``names``."""
    def only(fraction: float) -> dict:
        return {n: r for n, r in sliced(fraction).items() if n in names}

    return only

