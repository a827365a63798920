"""The autotuner: one place decides how a product runs.

A key is (device, dtype, layout of each operand and of the output, power-of-two size class of
batches, M, N and K, symmetric or not). Each candidate's result is checked against a float64
reference of sampled rows, its precision is verified on a zero-mean probe (TF32 or any demotion
errs ~3e-4 there and is rejected; integer candidates must be bit-exact on a probe spanning the
dtype's full range), and the correct candidates are ranked by their measured time. The ranking
is kept in memory and in a versioned JSON cache (``$DSPK_CACHE_DIR``, default
``~/.cache/dspk``) that several processes share and tune at once: they make the same choices
(a candidate's rounding may differ from another's: a shared choice is what keeps outputs
bit-identical).

A key neither in memory nor in the cache file is looked up in the *winners table* of the
device's class (`dspk.linalg.winners`: one JSON file per class shipped with the package,
``dspk/linalg/winners/<class>.json``, keyed without the version stamp): the ranking a thorough
tuning made on a machine of that class. Where the table covers the problem — its tuning
considered every candidate that can run it here, and its winner can — the winner is used
without timing anything: its result is checked on the whole product against the sampled
float64 reference (and its precision probe runs on the GPU, or when another dspk version made
the table), then it is stored in the cache file with ``"tuned": "table"`` and where it was
measured (`dspk.linalg.explain` says so), so that a job's chunks and the processes sharing
the cache run it from the first call on. A winner that fails its check is rejected with a
logged warning and the key is tuned on first use. `Tuner.choose` does the same for whole
operations, checking the table's winner against the reference a first use would use. Bits
can differ between a table's choice and a thorough tuning's on this machine when they pick
different candidates (their roundings differ); within a run, and across processes sharing a
cache, one candidate runs: only an explicit thorough tuning replaces a stored choice.

Tuning is paid where it pays back. An unseen key the table does not cover is tuned *on first
use*,
within a budget of a fraction of the product's own time: each candidate timed on a slice of
the product, then the fastest computes the whole product, checked (and on the CPU timed
against a runner-up whose estimate beats its whole time): the same bits from the first call
on. A *thorough* tuning (`Tuner.thorough`, `dspk.linalg.Engine.thorough`: what ``dspk tune``
and `dspk.Pipeline.tune` are for) times every candidate on the whole product and replaces a
choice tuned on first use or taken from a winners table; nothing else ever replaces a stored
choice, so a job's chunks, and the processes that share a cache, run one candidate.

`Tuner.choose` picks among whole-operation implementations (FIR banks, spatial filters, NCC)
the same way (`Tuner.choose_run` hands the chosen one's result back, saving the caller a run).

A candidate that is unavailable for a problem says why and drops out quietly; one that raises
is rejected with a logged warning naming it (a missing kernel source in an installed package
must not pass unnoticed). One that runs out of device memory (CuPy's ``OutOfMemoryError``, a
cuBLAS/cuFFT allocation failure: `dspk.backend.out_of_memory`) is skipped the same way — the
others are tried, the entry records it as rejected (``"out of device memory: ..."``) and it is
never the stored choice; when every candidate did, nothing is stored and
`dspk.backend.DeviceOutOfMemory` says so (a job then halves its chunk, and the keys of the
smaller chunk are tuned).

``DSPK_TUNE=on`` (default) tunes unseen keys; ``off`` takes the first available candidate in a
fixed order (no cache, no winners table); ``readonly`` uses the cache, then the winners table
(its choice checked as above and kept in memory for the process), but never times or writes
(nor re-tunes thoroughly). ``DSPK_WINNERS`` (or the tuner's ``winners``) names another folder
of tables, or ``off`` for none.

This module is the policy: what to choose, when to tune, the modes. The rest is in modules of
its own, whose names stay importable from here (a test patches a name where it is read):

- `dspk.linalg.tuner_cache`: the cache file — its path, entries, stamps, lock and merge.
- `dspk.linalg.tuner_timing`: how a candidate is measured and checked — the first use's
  budget, the clocks, the check of a result, the precision probe, the slices.
- `dspk.linalg.tuner_products`: how a product's candidates are tried, on first use (on slices,
  within the budget) or thoroughly.
- `dspk.linalg.tuner_operations`: the same for an operation's implementations.
- `dspk.linalg.winners`: the shipped tables of known winners, device classes, and `export`
  (a cache file's thorough entries into a table).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from .problem import Candidate, Problem
from .._version import __version__
from ..caches import shared
from .tuner_cache import (CACHE_SCHEMA, STAMPS, TUNED_BRIEF, TUNED_TABLE, TUNED_THOROUGH,
                          _cache_lock, _entry, _gpu_stamp, _host_stamp, _how, _known,
                          _merge_into_cache, _signature, _stale, _stamp, cache_path, read_cache)
from .tuner_operations import (_NOT_RUN, check_whole, choose_briefly, choose_on_slices,
                               choose_thoroughly)
from .tuner_products import check_table_choice, tune_on_first_use, tune_thoroughly
from .tuner_timing import NonFiniteOperands, Stopwatch
from .winners import device_class, forget_tables, load_table, table_folder, table_key

# What the tuner's parts define stays importable from here, as before they were split off
# (tests and benchmarks import some of it); a test patches a name in the module that reads it.
from .tuner_cache import (  # noqa: F401
    CACHE_FORMAT, TUNED_SLICE, _process_lock, _replaces, _valid_cache, clear_cache)
from .tuner_products import _FirstUse, _Trial  # noqa: F401
from .tuner_timing import (  # noqa: F401
    BUDGET_CAP_S, BUDGET_FLOOR_S, BUDGET_RATIO, CLOSE, MAX_SAMPLES, MIN_SLICE_MACS, PROBE_BLOCK,
    PROBE_MIN, ROTATE_L2_MULTIPLE, ROTATE_MAX_SETS, SAMPLED_COLS, SKIP_RATIO, SLICE_ALIGN,
    SLICE_SHARE, _aligned, _base, _cut, _cut_dim, _cycling, _dim_size, _macs, _make_probe,
    _median_time, _precision, _probe_for, _probe_values, _rotation, _Sampler, _shape,
    _slice_for, _warn_failed, log, precision_tolerance, tuning_budget, OUT_OF_MEMORY)
from .tuner_timing import _failed

__all__ = ["Tuner", "Choice", "TUNE_MODES", "cache_path", "read_cache", "clear_cache",
           "precision_tolerance"]

TUNE_MODES = ("on", "off", "readonly")

#: What importing a module costs a fresh process, in seconds (measured on the 2-core machine:
#: scipy.fft 0.19-0.28 s, scipy.signal 0.76 s; others assumed 0.5 s). A first use leaves
#: untimed a runner whose first run would import a module not yet imported; when the chosen
#: runner then takes `IMPORT_WORTH` times longer than that import, the runner is timed too.
IMPORT_COST_S = {"scipy.fft": 0.2, "scipy.signal": 0.8}
IMPORT_COST_DEFAULT_S = 0.5
#: the chosen runner's whole time over the import's cost from which a deferred runner is
#: timed. That time is the runner's first run in the process (cold: the default filter bank's
#: Toeplitz products, 0.17 s warm, took 0.16-0.38 s on their first run), and the import and
#: the deferred runner's timing should cost at most about half a call: 4. At 1 (the import
#: paying for itself in one call) the filter bank's first call fell on either side by noise,
#: and 4 runs in 7 paid the import and the FFTs' timing: 1.2-1.5 s instead of 0.17-0.21 s, to
#: keep the Toeplitz products all the same (a thorough tuning: 181 ms against the FFTs' 321)
IMPORT_WORTH = 4.0


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
    tuned: str = ""  # "slice", "brief", "thorough", "table", or "" when nothing was tuned
    timed_on: dict[str, list] = field(default_factory=dict)
    untimed: dict[str, str] = field(default_factory=dict)
    table: dict[str, str] = field(default_factory=dict)  # tuned "table": class, device, date


def _choice(c: Candidate, key: str, source: str, entry: dict) -> Choice:
    return Choice(c, key, source, list(entry["ranking"]), entry.get("timings_ms", {}),
                  entry.get("rejected", {}), _how(entry), entry.get("timed_on", {}),
                  entry.get("untimed", {}), entry.get("table", {}))


def _from_winners(entry: dict, source: dict, cls: str) -> dict:
    """The cache entry of a winners table's choice: the table's ranking, timings and the
    candidates it rejected (what its tuning considered: `_known`, so that only a thorough
    tuning, or one that considers a candidate it did not, replaces it), ``"tuned": "table"``,
    and which table, measured where and when."""
    stored = _entry(entry.get("timings_ms", {}), dict(entry.get("rejected", {})), TUNED_TABLE,
                    entry["ranking"])
    if entry.get("untimed"):
        stored["untimed"] = dict(entry["untimed"])
    stored["table"] = {"class": cls, "device": source["device"],
                       "measured": str(entry.get("when") or source["when"])[:10],
                       "dspk": str(source.get("dspk", "?")),
                       "commit": str(source.get("commit", "?"))}
    return stored


def _table_source(cls: str) -> str:
    return f"shipped winners table for {cls}"


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
    winners : str, os.PathLike or False, optional
        The folder of the winners tables (`dspk.linalg.winners`) looked up after the cache
        and before tuning on first use; False: none; default ``DSPK_WINNERS`` (read when
        used: unset, the package's tables).

    Attributes
    ----------
    clock : callable
        The host clock first-use tuning times CPU runs and its budget with
        (`time.perf_counter`; tests give a fake one).
    """

    def __init__(self, candidates: Callable[[bool], list[Candidate]],
                 cache_dir: str | os.PathLike | None = None, mode: str | None = None,
                 winners: str | os.PathLike | bool | None = None):
        if mode is not None and mode not in TUNE_MODES:
            raise ValueError(f"mode: expected one of {TUNE_MODES} or None (DSPK_TUNE), got "
                             f"{mode!r}")
        if winners is True:
            raise ValueError("winners: a folder, False (no table) or None (DSPK_WINNERS)")
        self._candidates = candidates
        self._cache_dir = None if cache_dir is None else Path(cache_dir)
        self._mode = mode
        self._winners = winners
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
            # the winners table's choice, checked, kept in memory (never written)
            choice = self._from_table(p, key, names, run, store=False)
            if choice is not None:
                return choice
            return self._first_available(p, names.values(), key, "DSPK_TUNE=readonly and no cached "
                                         "choice: first available candidate", run)
        with _cache_lock(self.cache_file):
            # another process may have tuned it meanwhile
            choice = self._cached_for(p, key, thorough)
            if choice is not None:
                if run:
                    choice.candidate.run(p)
                return choice
            if not thorough:
                choice = self._from_table(p, key, names, run, store=True)
                if choice is not None:
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

    # -- the winners tables ----------------------------------------------------------------
    def winners_folder(self) -> Path | None:
        """The folder of the winners tables this tuner reads (None: none): the one given,
        else ``DSPK_WINNERS`` now (`dspk.linalg.winners.table_folder`)."""
        if self._winners is None:
            return table_folder()
        return None if self._winners is False else Path(self._winners)

    def _table_entry(self, key: tuple) -> tuple[dict, dict, str] | None:
        """(the winners table's entry for ``key``, its source, the class), or None: no table
        for this device's class, or no entry for the key. The key's stamp (an element that is
        this host's stamp or a GPU's) is replaced by the class."""
        folder = self.winners_folder()
        if folder is None:
            return None
        stamps = {_host_stamp(), *shared(STAMPS, dict).values()}
        stamp = next((k for k in key if isinstance(k, str) and k in stamps), None)
        if stamp is None:
            return None
        cls = device_class(stamp)
        table = load_table(cls, folder)
        if table is None:
            return None
        found = table.lookup(table_key(self.key_str(key), stamp, cls))
        return None if found is None else (*found, cls)

    def _table_winner(self, p: Problem, key: tuple,
                      names: dict[str, Candidate]) -> tuple[Candidate, dict, str] | None:
        """(the winners table's winner for ``p``, the cache entry it makes, the class), when
        the table covers ``p`` here: its tuning considered every candidate that can run ``p``
        (a candidate added since was never measured against it) and its winner can run
        ``p``; else None (tuned on first use). Nothing runs."""
        found = self._table_entry(key)
        if found is None:
            return None
        entry, source, cls = found
        known = _known(entry)
        missing = sorted(n for n, c in names.items()
                         if n not in known and c.unavailable(p) is None)
        winner = names.get(entry["ranking"][0])
        why = (f"its tuning did not consider {', '.join(missing)}" if missing else
               "its winner is not a candidate here" if winner is None else
               winner.unavailable(p))
        if why:
            log.debug("dspk tuner: %s: the winners table for %s does not apply (%s); tuned on "
                      "first use", self.key_str(key), cls, why)
            return None
        return winner, _from_winners(entry, source, cls), cls

    def _from_table(self, p: Problem, key: tuple, names: dict[str, Candidate], run: bool,
                    store: bool) -> Choice | None:
        """The winners table's choice for ``p``, untimed: checked as a first use's winner is
        (`check_table_choice`: the precision probe, then the whole product against the
        sampled reference, which leaves its result in ``p.out`` — computed even when
        ``run`` is False), then stored in the cache file (``store``; ``"readonly"``: kept in
        memory only). None when the table does not cover ``p`` or its choice fails the check
        (a logged warning): the caller tunes on first use."""
        found = self._table_winner(p, key, names)
        if found is None:
            return None
        winner, stored, cls = found
        key_str = self.key_str(key)
        self._stopwatch.tunings += 1     # (its checks spoil an enclosing run's timing)
        # The precision probe (TF32 or any demotion; integers bit-exact over the full range)
        # is a property of a candidate's code, which the table's thorough tuning probed: it
        # runs again where that code may differ (another dspk version made the table), and
        # on the GPU, where which kernel cuBLAS runs is the library's choice. A CPU
        # candidate of this dspk has nothing to demote to: its probe (16-35 ms on 2 cores
        # for the covariance's X·Xᵀ, a third of the product) is left out there.
        probe = p.gpu or stored["table"]["dspk"] != __version__
        bad = check_table_choice(p, winner, key_str, probe)
        if bad:
            log.warning("dspk tuner: the winners table's choice %s for %s (%s) is rejected: "
                        "%s; tuned on first use instead", winner.name, key_str, cls, bad)
            return None
        if not store:
            self._memo()[key] = stored
            return _choice(winner, key_str, _table_source(cls), stored)
        saved = self._save(key, stored)
        if saved is stored:
            return _choice(winner, key_str, _table_source(cls), stored)
        # the file held an entry for the key that names no candidate available here, or
        # that the cache did not give (another process's, kept: processes agree)
        choice = self.cached(p, key)
        if choice is None:
            return _choice(winner, key_str, _table_source(cls), stored)
        if run and choice.candidate is not winner:
            choice.candidate.run(p)
        return choice

    def table_choice(self, p: Problem) -> Choice | None:
        """What the winners table would choose for ``p`` here (None: it does not cover
        ``p``), neither checked nor stored: nothing runs (`dspk.linalg.explain` with
        ``tune=False``). A call checks it before it is used."""
        key = self.key(p)
        found = self._table_winner(p, key, self._names(p.gpu, p.dtype.kind))
        if found is None:
            return None
        winner, stored, cls = found
        return _choice(winner, self.key_str(key),
                       f"{_table_source(cls)} (checked when a call first uses it)", stored)

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
        key_str = self.key_str(key)               # (the key as the log names it)
        unavailable = dict(rejected)
        try:
            entry, done = self._tune_on(p, usable, rejected, key_str, run, thorough)
        except NonFiniteOperands:
            # NaN or inf in the operands: every check against the sampled reference would
            # fail, or pass, depending on where they lie (a cold cache raised, a warm one
            # returned NaN). The choice is made on a probe of the same geometry (finite
            # values, as the precision probe's) and the winner then computes the product:
            # it propagates the NaN as IEEE arithmetic does, the same as with a cached choice
            log.debug("dspk tuner: %s: operands not finite; tuned on a finite probe", key_str)
            rejected = dict(unavailable)
            entry, _ = self._tune_on(_make_probe(p), usable, rejected, key_str, True,
                                     thorough)
            done = False
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

    def _tune_on(self, p: Problem, usable: list[Candidate], rejected: dict[str, str],
                 key_str: str, run: bool, thorough: bool) -> tuple[dict, bool]:
        if thorough:
            return tune_thoroughly(p, usable, rejected, key_str, self._stopwatch)
        return tune_on_first_use(p, usable, rejected, key_str, run, self._stopwatch)

    # -- generic choices (operations above the product engine) ------------------------------
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
            # the winners table's choice, checked, kept in memory (never written)
            got = self._choose_from_table(key, runners, gpu, agree, sliced, imports, jit,
                                          keep, store=False)
            if got is not None:
                return got
            return names[0], "DSPK_TUNE=readonly and no cached choice", _NOT_RUN
        with _cache_lock(self.cache_file):
            # another process may have tuned it meanwhile
            name = self._cached_name(key, runners, thorough, None)
            if name is not None:
                return name, "cache", _NOT_RUN
            if not thorough:
                got = self._choose_from_table(key, runners, gpu, agree, sliced, imports, jit,
                                              keep, store=True)
                if got is not None:
                    return got
            return self._choose_now(key, runners, gpu, agree, sliced, keep, thorough, imports,
                                    jit)

    def _choose_from_table(self, key: tuple, runners: dict[str, Callable[[], Any]], gpu: bool,
                           agree: Callable[[Any, Any], str | None], sliced: Any, imports: Any,
                           jit: Any, keep: bool, store: bool) -> tuple[str, str, Any] | None:
        """`_choose`'s winners table: the table's winner for ``key`` when its tuning
        considered every runner here and its winner is one of them, checked against the
        reference a first use would use — the first other runner whose first run imports
        nothing and (on the GPU) compiles nothing: on a slice (``sliced``), else on the whole
        problem (the winner's result then kept, with ``keep``); none left, no check, as a
        first use's lone runner — then stored (``store``; ``"readonly"``: in memory only).
        None when the table does not cover ``key`` or its winner fails (a logged warning):
        the caller tunes on first use."""
        found = self._table_entry(key)
        if found is None:
            return None
        entry, source, cls = found
        key_str = self.key_str(key)
        missing = sorted(n for n in runners if n not in _known(entry))
        name = entry["ranking"][0]
        why = (f"its tuning did not consider {', '.join(missing)}" if missing else
               None if name in runners else f"its winner {name} is not an implementation here")
        if why:
            log.debug("dspk tuner: %s: the winners table for %s does not apply (%s); tuned on "
                      "first use", key_str, cls, why)
            return None

        def deferred(n: str) -> bool:   # what a first use leaves untimed (see _choose_now)
            return any(m not in sys.modules for m in (imports or {}).get(n, ())) or \
                (gpu and n in jit)

        ref = next((n for n in runners if n != name and not deferred(n)), None)
        self._stopwatch.tunings += 1     # (its checks spoil an enclosing run's timing)
        result, bad = _NOT_RUN, None
        if ref is not None:
            try:
                small = sliced(1.0 / (2 * SLICE_SHARE * len(runners))) if sliced else {}
                if name in small and ref in small:
                    bad = agree(small[name](), small[ref]())
                    bad = f"on a slice: {bad}" if bad else None
                else:
                    reference = runners[ref]()
                    got = runners[name]()
                    bad = agree(got, reference)
                    if keep and not bad:
                        result = got
                    reference = got = None
                small = None
            except Exception as exc:  # a broken implementation (or one out of device memory)
                bad = _failed(name, key_str, exc)
        if bad:
            log.warning("dspk tuner: the winners table's choice %s for %s (%s) is rejected: "
                        "%s; tuned on first use instead", name, key_str, cls, bad)
            return None
        stored = _from_winners(entry, source, cls)
        if not store:
            self._memo()[key] = stored
            return name, _table_source(cls), result
        saved = self._save(key, stored)
        ranking = [n for n in saved["ranking"] if n in runners] or [name]
        if ranking[0] != name:
            result = _NOT_RUN                     # another process's choice: run theirs
        return ranking[0], _table_source(cls), result

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
        watch, key_str = self._stopwatch, self.key_str(key)    # (the key as the log names it)
        if thorough:
            entry, result = choose_thoroughly(key_str, runners, gpu, agree, watch), _NOT_RUN
        elif len(runners) == 1:                   # nothing to rank (nor to check against)
            name = next(iter(runners))
            entry, result = _entry({}, {}, TUNED_BRIEF, [name]), _NOT_RUN
        elif sliced is not None:
            entry, result = choose_on_slices(key_str, runners, gpu, agree, sliced,
                                             watch), _NOT_RUN
            if keep and not gpu:   # (measured on the CPU; the GPU's first use is as before)
                entry, result = check_whole(key_str, entry, runners, gpu, agree, watch)
        else:
            entry, result = choose_briefly(key_str, runners, gpu, agree, keep, watch)
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
        return {n for n in waiting if IMPORT_WORTH * cost(n) < ms / 1e3}, result

    def stamp(self, gpu: bool, device_id: int | None) -> str:
        """The device/version stamp keys start with."""
        return _gpu_stamp(device_id) if gpu else _host_stamp()

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
        """Drop the in-memory choices and candidates (the file and the winners tables are
        read again on next use)."""
        forget_tables()
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

