"""How the tuner tries a product's candidates (`dspk.linalg.tuner.Tuner.select`): on first use,
within a budget, or thoroughly.

Tuning is paid where it pays back. An unseen key met by a call is tuned *on first use*
(`tune_on_first_use`), within a budget of a fraction of the product's own time
(`BUDGET_RATIO`, at least `BUDGET_FLOOR_S`; on the GPU at most `BUDGET_CAP_S`): each candidate
is timed on a slice of the product — the longest dimension cut, the other dimensions, layouts
and strides as they are, about 1/(`SLICE_SHARE` · candidates) of the product, grown where a
candidate cannot run less (split-K needs K of 4 chunks) — after its precision probe (a small
product of the slice's K, which also warms the candidate up), and its slice's result is
checked; then, while the budget lasts, a second sample for each and more for those close to
the best (each keeps its best sample: a loaded machine's bursts only ever slow a run down). A
candidate that would take the tuning beyond `SKIP_RATIO` x its budget, and one whose first run
would import a module nothing has imported yet
(`dspk.linalg.problem.Candidate.first_use_imports`), is not timed; the entry says so. The
fastest then computes the whole product, checked once more on sampled entries (one that fails
there is rejected and the next one runs), and, on the CPU, timed: a slice that fits in cache
can flatter a memory-bound candidate (measured on 2 cores: a high-pass by whole-row FFTs
estimated at 61 ms from its slice took 128 ms whole, against 50 for the Toeplitz products it
beat), so when a runner-up's estimate is below the winner's whole time, the runner-up computes
the whole product too, in the same call, and the faster of the two is the choice and the
result (``"whole_ms"``): the same bits from the first call on. The entry records how it was
tuned (``"tuned": "slice"``; ``"brief"`` for a product timed whole).

A *thorough* tuning (`tune_thoroughly`; `dspk.linalg.tuner.Tuner.thorough`,
`dspk.linalg.Engine.thorough`: what ``dspk tune`` and `dspk.Pipeline.tune` are for) times every
candidate on the whole product (warm-up, then the median of several samples).

Both take the problem ``p``, the candidates that can run it (``usable``), the reasons of those
rejected so far (``rejected``, added to), ``key``, the key as the log names it
(`dspk.linalg.tuner.Tuner.key_str`), and ``watch``, the tuner's `Stopwatch`; both return a
cache entry (`dspk.linalg.tuner_cache`) and leave storing it to the tuner.
`dspk.linalg.tuner_operations` is the same ladder for whole operations.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from .problem import Candidate, Problem, prepared
from .tuner_cache import TUNED_BRIEF, TUNED_SLICE, TUNED_THOROUGH, _entry
from ..backend import out_of_memory
from .tuner_timing import (CLOSE, MAX_SAMPLES, MIN_SLICE_MACS, SAMPLED_COLS, SKIP_RATIO,
                           SLICE_SHARE, NonFiniteOperands, Stopwatch, _cut_dim, _cycling,
                           _failed, _macs, _make_probe, _median_time, _none_left, _precision,
                           _probe_for, _rotation, _Sampler, _shape, _slice_for, log,
                           tuning_budget)


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


def tune_thoroughly(p: Problem, usable: list[Candidate], rejected: dict[str, str], key: str,
                    watch: Stopwatch) -> tuple[dict, bool]:
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
                                           clock=watch.clock) * 1e3
        except Exception as exc:  # a candidate that breaks (or runs out of memory) is
            rejected[c.name] = _failed(c.name, key, exc)       # rejected, not fatal
    if not timings:
        raise _none_left(f"every candidate failed for this product: {rejected}", rejected)
    return _entry(timings, rejected, TUNED_THOROUGH), False


def check_table_choice(p: Problem, c: Candidate, key: str, probe: bool = True) -> str | None:
    """A winners table's choice ``c`` (`dspk.linalg.winners`) checked as a first use checks
    its winner, without timing anything: its precision probe (on the smallest slice of
    ``p``'s geometry a first use times, cut further on the CPU: `_probe_for`), then the whole
    product, its sampled entries against the float64 (int64) reference. Returns None, ``p.out``
    holding ``c``'s result, or why ``c`` is rejected (the tuner then tunes on first use).
    Operands that are not finite have no reference to check against: the probe decides, as it
    does a first use's choice (`dspk.linalg.tuner.Tuner._tune`). Without ``probe`` only the
    whole product is checked (see `dspk.linalg.tuner.Tuner._from_table` for when)."""
    try:
        if probe:
            # on the smallest slice a first use would time (grown until c can run it): the
            # check costs a fraction of the product, not a second product
            dim = _cut_dim(p)
            q = p if dim is None or _macs(p) <= MIN_SLICE_MACS[p.gpu] else \
                _slice_for(p, dim, MIN_SLICE_MACS[p.gpu], c)
            made, probe_sampler = _probe_for(q, c, {})
            bad = _precision(lambda pr: prepared(c, pr)(), made, probe_sampler, p.dtype)
            if bad:
                return bad
        try:
            sampler = _Sampler(p, SAMPLED_COLS)
        except NonFiniteOperands:
            sampler = None
        if sampler is not None:
            sampler.poison()
        prepared(c, p)()
        bad = sampler.check_result() if sampler is not None else None
        return f"wrong result on the whole product: {bad}" if bad else None
    except Exception as exc:  # a candidate that breaks (or runs out of memory) is rejected
        return _failed(c.name, key, exc)


def tune_on_first_use(p: Problem, usable: list[Candidate], rejected: dict[str, str], key: str,
                      run: bool, watch: Stopwatch) -> tuple[dict, bool]:
    """First use: each candidate checked and timed on its slice within the budget (module
    docstring), then (with ``run``) the fastest computes ``p``, checked on sampled entries;
    one that fails there is rejected and the next one runs. Returns (entry, whether p.out
    holds the winner's checked result)."""
    gpu = p.gpu
    clock = watch.clock
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
        reason = _first_trial(c, q, state, rejected, key, weigh, watch)
        if reason:
            untimed[c.name] = reason
    if not state.trials:                      # nothing else could: those deferred, then
        for c in deferred:
            untimed.pop(c.name)
            _first_trial(c, p, state, rejected, key, False, watch)
    trials = state.trials
    if not trials:
        raise _none_left(f"every candidate failed for this product: {rejected}", rejected)
    _more_samples(trials, gpu, state, rejected, key, watch)
    if not trials:                            # each ran out of device memory in a sample
        raise _none_left(f"every candidate failed for this product: {rejected}", rejected)
    ranking = sorted(trials, key=lambda n: trials[n].estimate)
    log.debug("dspk tuner: ranking %s after %.3g ms (samples %s)", ranking,
              (clock() - t0) * 1e3, {n: t.samples for n, t in trials.items()})
    done, whole = False, {}
    if run:
        ranking, done, seconds = _run_checked(p, ranking, trials, rejected, state.wrote, key,
                                              watch)
        if seconds is not None:               # (timed on the CPU only)
            ranking, whole = _whole_check_product(p, ranking, trials, rejected, key, seconds,
                                                  watch)
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


def _first_trial(c: Candidate, q: Problem, state: _FirstUse, rejected: dict[str, str], key: str,
                 weigh: bool, watch: Stopwatch) -> str | None:
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
                if watch.clock() - state.t0 + best * share > cap:
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
        seconds = watch.seconds(call, p.gpu)
        state.wrote = c.name if q is p else None
        bad = sampler.check_result()
        if bad:
            where = "" if q is p else f" on the slice {_shape(q)}"
            rejected[c.name] = f"wrong result{where}: {bad}"
            return None
        state.trials[c.name] = _Trial(c, q, share, call, seconds)
        log.debug("dspk tuner: %s on %s: %.3g ms (%.3g ms estimated for %s), %.3g ms "
                  "into the tuning", c.name, _shape(q), seconds * 1e3,
                  seconds / share * 1e3, _shape(p), (watch.clock() - state.t0) * 1e3)
    except NonFiniteOperands:                 # the data's, not the candidate's: see _tune
        raise
    except Exception as exc:  # a candidate that breaks (or runs out of memory) is rejected,
        rejected[c.name] = _failed(c.name, key, exc)         # not fatal
    return None


def _more_samples(trials: dict[str, _Trial], gpu: bool, state: _FirstUse,
                  rejected: dict[str, str], key: str, watch: Stopwatch) -> None:
    """More samples while the budget lasts, each trial keeping its best (the minimum is
    what a loaded machine's noise leaves least biased): a second one for every candidate
    (a first sample can be spoilt by another process's burst), then rounds over those
    within `CLOSE` of the best. Cheaper samples first. On the GPU a sample repeats a
    short run to 0.2 ms and cycles through copies of small operands (`_rotation`). A
    candidate that runs out of device memory in a sample is dropped (``rejected``): it is
    never the choice for the key."""
    if len(trials) < 2:
        return
    calls: dict[str, tuple[Callable[[], Any], int]] = {}
    for round_ in range(MAX_SAMPLES - 1):
        if len(trials) < 2:
            return
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
            if watch.clock() - state.t0 + t.seconds * reps > budget:
                return
            try:
                t.seconds = min(t.seconds, watch.seconds(call, gpu, reps))
            except Exception as exc:
                if not out_of_memory(exc):
                    raise
                rejected[name] = _failed(name, key, exc)
                del trials[name], calls[name]
                state.wrote = None            # (p.out may hold a part of its failed run)
                continue
            t.samples += 1
            state.wrote = name if t.q is state.p else None


def _whole_check_product(p: Problem, ranking: list[str], trials: dict[str, _Trial],
                         rejected: dict[str, str], key: str, seconds: float,
                         watch: Stopwatch) -> tuple[list[str], dict[str, float]]:
    """`dspk.linalg.tuner_operations.check_whole` for a product: the winner has computed
    ``p`` in ``seconds``; a runner-up whose estimate is below that computes it too (checked
    on sampled entries, the winner's result kept aside), and the faster one's result stays in
    ``p.out``. Returns (the ranking, the whole times in ms)."""
    name = ranking[0]
    whole = {name: seconds * 1e3}
    rival = next((n for n in ranking[1:] if trials[n].estimate < seconds), None)
    if rival is None:
        return ranking, {name: round(whole[name], 6)}
    kept = p.out.to_array().copy()
    sampler = _Sampler(p, SAMPLED_COLS)
    try:
        sampler.poison()
        t = watch.seconds(prepared(trials[rival].candidate, p), p.gpu)
        bad = sampler.check_result()
        if bad:
            bad = f"wrong result on the whole product: {bad}"
    except Exception as exc:  # a candidate that breaks (or runs out of memory) is rejected
        bad = f"on the whole product: {_failed(rival, key, exc)}"
    if bad:
        rejected[rival] = bad
        ranking = [n for n in ranking if n != rival]
    else:
        whole[rival] = t * 1e3
    if bad or t >= seconds:
        p.out.to_array()[...] = kept          # the winner's result stands
    ranking = sorted(whole, key=whole.get) + [n for n in ranking if n not in whole]
    return ranking, {n: round(v, 6) for n, v in whole.items()}


def _run_checked(p: Problem, ranking: list[str], trials: dict[str, _Trial],
                 rejected: dict[str, str], wrote: str | None, key: str,
                 watch: Stopwatch) -> tuple[list[str], bool, float | None]:
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
                seconds = watch.seconds(call, False)
            bad = sampler.check_result()
            if bad:
                bad = f"wrong result on the whole product: {bad}"
        except Exception as exc:  # a candidate that breaks (or runs out of memory: the
            # whole product needs more than its slice did) is rejected, the next one runs
            bad = f"on the whole product: {_failed(name, key, exc)}"
        if not bad:
            return ranking, True, seconds
        rejected[name] = bad
        ranking.pop(0)
    raise _none_left(f"every candidate failed for this product: {rejected}", rejected)
