"""How the tuner tries an operation's implementations (`dspk.linalg.tuner.Tuner.choose`).

`dspk.linalg.tuner.Tuner.choose` picks among whole-operation implementations (FIR banks,
spatial filters, NCC), each a runner (a call computing the whole operation), the way
`dspk.linalg.tuner_products` tries a product's candidates: each runner's result is checked
against the first runner's (the reference) with the caller's ``agree``, and the correct ones
are ranked by their time. On first use each runs once on the whole problem within the budget
(`choose_briefly`: more samples only when runs are short against it), or, when the caller can
give runners on a slice of the problem (``sliced=``), each is checked and timed on the slice
(`choose_on_slices`) and only the winner computes the whole (`check_whole`, on the CPU: a
runner-up whose estimate is below the winner's whole time computes the whole too, as for
products; `dspk.linalg.tuner.Tuner.choose_run` hands the result back, saving the caller a
run). A thorough tuning times each runner on the whole problem (`choose_thoroughly`: warm-up,
then the median of several samples).

A runner inside which a product was tuned (an operation built on `dspk.linalg.matmul`, run for
the first time) is timed again: that run is no measure of it (`Stopwatch.sample`).

The functions take ``key``, the key as the log names it (`dspk.linalg.tuner.Tuner.key_str`),
``watch``, the tuner's `Stopwatch`, and the runners, ``gpu``, ``agree`` and ``sliced`` as
`dspk.linalg.tuner.Tuner.choose` does; each returns a cache entry (`dspk.linalg.tuner_cache`)
that the tuner stores.
"""

from __future__ import annotations

from typing import Any, Callable

from .tuner_cache import TUNED_BRIEF, TUNED_SLICE, TUNED_THOROUGH, _entry
from ..backend import out_of_memory
from .tuner_timing import (CLOSE, MAX_SAMPLES, SKIP_RATIO, SLICE_SHARE, Stopwatch, _failed,
                           _median_time, _none_left, log, tuning_budget)

#: what `Tuner.choose` returns as the result when it computed nothing the caller can keep
_NOT_RUN = object()


def choose_thoroughly(key: str, runners: dict[str, Callable[[], Any]], gpu: bool,
                      agree: Callable[[Any, Any], str | None], watch: Stopwatch) -> dict:
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
            timings[name] = _median_time(run, gpu, clock=watch.clock) * 1e3
        except Exception as exc:  # a broken implementation (or one that runs out of device
            rejected[name] = _failed(name, key, exc)     # memory) is rejected, not fatal
    if not timings:
        raise _none_left(f"every implementation failed: {rejected}", rejected)
    return _entry(timings, rejected, TUNED_THOROUGH)


def choose_briefly(key: str, runners: dict[str, Callable[[], Any]], gpu: bool,
                   agree: Callable[[Any, Any], str | None], keep: bool,
                   watch: Stopwatch) -> tuple[dict, Any]:
    """First use without slices: each runner once on the whole problem (the first one's
    run is the reference and its first sample; a run inside which a nested tuning ran is
    repeated for a clean sample), more samples of close ones while the budget lasts.
    Returns (entry, the winner's result when ``keep`` and it was kept, else `_NOT_RUN`)."""
    t0 = watch.clock()
    seconds: dict[str, float] = {}
    rejected: dict[str, str] = {}
    kept_name, kept = None, _NOT_RUN
    ref = _NOT_RUN
    for name, run in runners.items():
        try:
            result, t, clean = watch.sample(run, gpu)
            if ref is _NOT_RUN:
                ref = result
            else:
                bad = agree(result, ref)
                if bad:
                    rejected[name] = bad
                    continue
            if not clean:
                result, t, _ = watch.sample(run, gpu)
            if keep and (kept_name is None or t < seconds[kept_name]):
                kept_name, kept = name, result   # the fastest so far: its result is kept
            seconds[name] = t
            result = None
        except Exception as exc:  # a broken implementation (or one that runs out of device
            if ref is _NOT_RUN:       # memory) is rejected, not fatal
                raise                 # no reference: the operation itself fails (too big)
            rejected[name] = _failed(name, key, exc)
    ref = None
    if not seconds:
        raise _none_left(f"every implementation failed: {rejected}", rejected)
    _resample(seconds, {n: runners[n] for n in seconds}, gpu, t0, 1.0, MAX_SAMPLES - 1, watch,
              rejected, key)
    if not seconds:
        raise _none_left(f"every implementation failed: {rejected}", rejected)
    log.debug("dspk tuner: %s: %s ms after %.3g ms", key,
              {n: round(t * 1e3, 3) for n, t in seconds.items()}, (watch.clock() - t0) * 1e3)
    entry = _entry({n: t * 1e3 for n, t in seconds.items()}, rejected, TUNED_BRIEF)
    if kept_name != entry["ranking"][0]:
        kept = _NOT_RUN                       # overtaken by a later sample
    return entry, kept


def choose_on_slices(key: str, runners: dict[str, Callable[[], Any]], gpu: bool,
                     agree: Callable[[Any, Any], str | None],
                     sliced: Callable[[float], dict[str, Callable[[], Any]]],
                     watch: Stopwatch) -> dict:
    """First use with slices: each sliced runner runs on its slice as a warm-up checked
    against the first one's result (its time a first sample, unless a tuning ran inside
    it), then a timed run — fastest warm-up first; after the first, only while the tuning
    stays within SKIP_RATIO x its budget — then close ones again while the budget lasts.
    Runners without a sliced version are not timed."""
    t0 = watch.clock()
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
            result, seconds[name], clean[name] = watch.sample(small[name], gpu)
            if ref is _NOT_RUN:
                ref = result
            else:
                bad = agree(result, ref)
                if bad:
                    rejected[name] = f"on a slice: {bad}"
                    del seconds[name]
            result = None
        except Exception as exc:  # a broken implementation (or one that runs out of device
            if ref is _NOT_RUN:       # memory) is rejected, not fatal
                raise                 # no reference: the operation itself fails (too big)
            seconds.pop(name, None)
            rejected[name] = f"on a slice: {_failed(name, key, exc)}"
    ref = None
    if not seconds:
        raise _none_left(f"every implementation failed: {rejected}", rejected)
    # the timed runs: a warm-up spoilt by a tuning inside it first (it says nothing), then
    # the fastest; the others while the tuning stays within its cap
    order = sorted(seconds, key=lambda n: (clean[n], seconds[n]))
    for i, name in enumerate(order):
        best = min(seconds[n] for n in seconds if clean[n] or n == name)
        cap = SKIP_RATIO * tuning_budget(best / fraction, gpu)
        if i and clean[name] and watch.clock() - t0 + seconds[name] > cap:
            continue                          # its warm-up sample stands
        t = _sample_or_drop(name, small[name], gpu, watch, seconds, rejected, key)
        if t is None:
            continue
        seconds[name] = t if not clean[name] else min(seconds[name], t)
        clean[name] = True
    _resample(seconds, small, gpu, t0, fraction, MAX_SAMPLES - 2, watch, rejected, key)
    if not seconds:                           # each ran out of device memory in a sample
        raise _none_left(f"every implementation failed: {rejected}", rejected)
    log.debug("dspk tuner: %s on %.3g of the problem: %s ms after %.3g ms",
              key, fraction, {n: round(t * 1e3, 3) for n, t in seconds.items()},
              (watch.clock() - t0) * 1e3)
    entry = _entry({n: t / fraction * 1e3 for n, t in seconds.items()}, rejected,
                   TUNED_SLICE)
    entry["slice_fraction"] = fraction
    if untimed:
        entry["untimed"] = untimed
    return entry


def _resample(seconds: dict[str, float], runs: dict[str, Callable[[], Any]], gpu: bool,
              t0: float, fraction: float, rounds: int, watch: Stopwatch,
              rejected: dict[str, str], key: str) -> None:
    """Up to ``rounds`` more samples of the runners within `CLOSE` of the best, round by
    round, while the budget of the whole operation (the best time / ``fraction``) lasts;
    each keeps its best sample (one that runs out of device memory is dropped, with the
    reason in ``rejected``)."""
    for _ in range(rounds):
        if len(seconds) < 2:
            return
        best = min(seconds.values())
        close = sorted((n for n in seconds if seconds[n] <= CLOSE * best), key=seconds.get)
        if len(close) < 2:
            return
        for name in close:
            if watch.clock() - t0 + seconds[name] > tuning_budget(best / fraction, gpu):
                return
            t = _sample_or_drop(name, runs[name], gpu, watch, seconds, rejected, key)
            if t is not None:
                seconds[name] = min(seconds[name], t)


def _sample_or_drop(name: str, run: Callable[[], Any], gpu: bool, watch: Stopwatch,
                    seconds: dict[str, float], rejected: dict[str, str],
                    key: str) -> float | None:
    """One more timed sample of runner ``name`` (seconds); None when it ran out of device
    memory (a copy made in this sample, a fuller device than at its first run): it is then
    dropped from ``seconds`` and rejected (never the choice for the key). Any other error
    goes on."""
    try:
        _, t, _ = watch.sample(run, gpu)
        return t
    except Exception as exc:
        if not out_of_memory(exc):
            raise
        seconds.pop(name, None)
        rejected[name] = _failed(name, key, exc)
    return None


def check_whole(key: str, entry: dict, runners: dict[str, Callable[[], Any]], gpu: bool,
                agree: Callable[[Any, Any], str | None], watch: Stopwatch) -> tuple[dict, Any]:
    """The sliced ranking's winner computes the whole problem, timed (the caller's
    result). A slice that fits in cache can make a memory-bound runner look fast (on 2
    cores: a high-pass by whole-row FFTs estimated at 61 ms from its slice took 128 ms
    whole, against 50 for the Toeplitz products it beat): when a runner-up's estimate is
    below the winner's whole time, the runner-up also computes the whole problem, timed and
    checked against the winner's result, and the faster of the two is the choice and the
    result. Both runs are in this first call, so every later call runs the same choice
    (the same bits). Returns (the entry with ``whole_ms``, the chosen runner's result)."""
    ranking = list(entry["ranking"])
    while True:
        name = ranking[0]
        try:
            result, seconds, clean = watch.sample(runners[name], gpu)
            break
        except Exception as exc:
            # the winner on its slice may need more device memory than is left for the
            # whole problem: the next one computes it (the last one's error goes on)
            if not out_of_memory(exc) or len(ranking) == 1:
                raise
            entry["rejected"][name] = f"on the whole problem: {_failed(name, key, exc)}"
            ranking.pop(0)
    entry["ranking"] = ranking
    if not clean:                             # a tuning ran inside: no measure of it
        return entry, result
    whole = {name: seconds * 1e3}
    estimates = entry["timings_ms"]
    rival = next((n for n in entry["ranking"][1:] if estimates[n] < whole[name]), None)
    if rival is not None:
        try:
            other, t, clean = watch.sample(runners[rival], gpu)
            bad = agree(other, result)
            if bad:
                entry["rejected"][rival] = f"on the whole problem: {bad}"
            elif clean:
                whole[rival] = t * 1e3
                if t < seconds:
                    result = other
            other = None
        except Exception as exc:  # a broken implementation (or one that runs out of device
            # memory) is rejected, not fatal
            entry["rejected"][rival] = f"on the whole problem: {_failed(rival, key, exc)}"
    entry["whole_ms"] = {n: round(v, 6) for n, v in whole.items()}
    entry["ranking"] = sorted(whole, key=whole.get) + \
        [n for n in entry["ranking"] if n not in whole and n not in entry["rejected"]]
    return entry, result
