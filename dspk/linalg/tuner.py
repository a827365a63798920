"""The autotuner: one place decides how a product runs.

A key is (device, dtype, layout of each operand and of the output, power-of-two size class of
batches, M, N and K, symmetric or not). For an unseen key every available candidate runs on the
real operands: its result is checked against a float64 reference of sampled rows, its precision
is verified on a zero-mean probe of the same shape (TF32 or any demotion errs ~3e-4 there and is
rejected), and it is timed (warm-up, then the median of several samples, CUDA events on the GPU).
The ranking of the correct candidates is kept in memory and in a versioned JSON cache
(``$DSPK_CACHE_DIR``, default ``~/.cache/dspk``), written atomically under a file lock so that
several processes can tune at once. Processes that share the file make the same choices: a miss
re-reads the file when another process has changed it, and tuning holds the file's lock, so a
process that needs a key another one is tuning waits and takes its ranking (a candidate's
rounding may differ from another's: a shared choice is what keeps outputs bit-identical).

A candidate that is unavailable for a problem says why and drops out quietly; one that raises
is rejected with a logged warning naming it (a missing kernel source in an installed package
must not pass unnoticed).

``DSPK_TUNE=on`` (default) tunes unseen keys; ``off`` takes the first available candidate in a
fixed order; ``readonly`` uses the cache but never times or writes.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .._version import __version__
from ..backend import cupy_module, device_name
from ..caches import shared
from .problem import Candidate, Problem, prepared
from .view import MatrixView

__all__ = ["Tuner", "Choice", "TUNE_MODES", "cache_path", "read_cache", "clear_cache",
           "precision_tolerance"]

log = logging.getLogger(__name__)

TUNE_MODES = ("on", "off", "readonly")
CACHE_FORMAT = "dspk-tuner"
CACHE_SCHEMA = 1


def tune_mode() -> str:
    mode = (os.environ.get("DSPK_TUNE", "on") or "on").strip().lower()
    if mode not in TUNE_MODES:
        raise ValueError(f"DSPK_TUNE must be one of {TUNE_MODES}, got {mode!r}")
    return mode


def cache_path() -> Path:
    """The default engine's cache file: ``tuner-v1.json`` in ``DSPK_CACHE_DIR`` (read now), else
    in ``~/.cache/dspk``."""
    base = os.environ.get("DSPK_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "dspk"
    return root / f"tuner-v{CACHE_SCHEMA}.json"


def precision_tolerance(dtype: Any, k: int) -> float:
    """Largest relative Frobenius error accepted on the zero-mean probe for a candidate that
    computes in ``dtype``. TF32 (10-bit mantissa) gives ~3e-4 there; float32 ~1e-7·√K·c."""
    if np.dtype(dtype) == np.float32:
        return min(1e-4, max(2e-5, 1.2e-7 * np.sqrt(k)))
    return max(1e-12, 1e-15 * np.sqrt(k))


def _size_class(n: int) -> int:
    return int(n).bit_length()  # 0 for 0; c for 2^(c-1) <= n < 2^c


def _stamp(p: Problem) -> str:
    if not p.gpu:
        return f"{device_name(None)}|numpy{np.__version__}|dspk{__version__}"
    return _gpu_stamp(p.device_id)


#: the process-wide store (`dspk.caches`) of the GPUs' stamps, by device
STAMPS = "tuner_gpu_stamps"


def _gpu_stamp(device_id: int) -> str:
    stamps = shared(STAMPS, dict)
    s = stamps.get(device_id)
    if s is None:
        cp = cupy_module()
        rt = cp.cuda.runtime
        try:
            from cupy_backends.cuda.libs import cublas  # noqa: PLC0415 (needs CuPy)

            with cp.cuda.Device(device_id):
                blas = cublas.getVersion(cp.cuda.device.get_cublas_handle())
        except Exception:  # pragma: no cover - version query unavailable
            blas = "?"
        s = (f"{device_name(device_id)}|driver{rt.driverGetVersion()}|runtime"
             f"{rt.runtimeGetVersion()}|cublas{blas}|cupy{cp.__version__}|dspk{__version__}")
        stamps[device_id] = s
    return s


@dataclass
class Choice:
    """What runs for a key, and why."""

    candidate: Candidate
    key: str
    source: str  # "tuned now", "cache (memory)", "cache (file)", "DSPK_TUNE=off", ...
    ranking: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)


class Tuner:
    """Chooses a candidate per key; see the module docstring."""

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
        self._file_seen: tuple | None = None   # (path, stat signature) of the file last read
        self._file_entries: dict[str, dict] = {}
        self._warned_write = False

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
        choice = self.cached(p, key)
        if choice is not None:
            if run:
                choice.candidate.run(p)
            return choice
        if mode == "readonly":
            return self._first_available(p, names.values(), key, "DSPK_TUNE=readonly and no cached "
                                         "choice: first available candidate", run)
        with _cache_lock(self.cache_file):
            choice = self.cached(p, key)          # another process may have tuned it meanwhile
            if choice is not None:
                choice.candidate.run(p)
                return choice
            return self._tune(p, key, names)

    def cached(self, p: Problem, key: tuple | None = None) -> Choice | None:
        """The cached choice for ``p`` (memory, then the file), or None; never times anything."""
        key = self.key(p) if key is None else key
        names = self._names(p.gpu, p.dtype.kind)
        entry = self._memory.get(key)
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
                return Choice(c, self.key_str(key), source, entry["ranking"],
                              entry.get("timings_ms", {}), entry.get("rejected", {}))
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
    def _tune(self, p: Problem, key: tuple, names: dict[str, Candidate]) -> Choice:
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
        sampler = _Sampler(p)
        rotation = _rotation(p)
        probe = _make_probe(p)
        probe_sampler = _Sampler(probe)
        exact = p.dtype.kind in "iu"
        tol = 0.0 if exact else precision_tolerance(p.dtype, p.k)
        timings: dict[str, float] = {}
        for c in usable:
            try:
                sampler.poison()
                c.run(p)
                bad = sampler.check_result()
                if bad:
                    rejected[c.name] = f"wrong result: {bad}"
                    continue
                probe_sampler.poison()
                c.run(probe)
                if exact:
                    bad = probe_sampler.check_result()
                    if bad:
                        rejected[c.name] = f"not bit-exact on a full-range probe: {bad}"
                        continue
                else:
                    err = probe_sampler.relative_error()
                    if not err <= tol:
                        rejected[c.name] = (f"precision check failed: relative error {err:.2e} "
                                            f"> {tol:.1e} on a zero-mean probe (not computed in "
                                            f"{p.dtype.name}?)")
                        continue
                timings[c.name] = _median_time(_cycling(c, rotation), p.gpu) * 1e3
            except Exception as exc:  # a candidate that breaks is rejected, not fatal
                rejected[c.name] = f"failed: {type(exc).__name__}: {exc}"
                _warn_failed(c.name, self.key_str(key), exc)
        if not timings:
            raise RuntimeError(f"every candidate failed for this product: {rejected}")
        ranking = sorted(timings, key=timings.get)
        entry = {"ranking": ranking, "timings_ms": {k: round(v, 6) for k, v in timings.items()},
                 "rejected": rejected, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        entry = self._save(key, entry)
        ranking = [n for n in entry["ranking"] if n in timings] or ranking
        best = names[ranking[0]]
        best.run(p)  # leave the winner's result in p.out
        return Choice(best, self.key_str(key), "tuned now", ranking, entry["timings_ms"], rejected)

    # -- generic choices (operations above the product engine) ------------------------------
    def choose(self, key: tuple, runners: dict[str, Callable[[], Any]], gpu: bool,
               agree: Callable[[Any, Any], str | None]) -> tuple[str, str]:
        """Pick among whole-operation implementations (an NCC bank, say) the way `select` picks
        among product candidates: cached ranking, else each runner is run, its result checked
        against the first runner's (the reference) with ``agree`` (None, or why not), timed,
        and the ranking stored under ``key``. Returns (name, why)."""
        mode = self.mode
        names = list(runners)
        if mode == "off":
            return names[0], "DSPK_TUNE=off: first implementation"
        entry = self._memory.get(key) or self._from_file(key)
        if entry is not None:
            for name in entry["ranking"]:
                if name in runners:
                    return name, "cache"
        if mode == "readonly":
            return names[0], "DSPK_TUNE=readonly and no cached choice"
        with _cache_lock(self.cache_file):
            entry = self._from_file(key)          # another process may have tuned it meanwhile
            for name in (entry or {}).get("ranking", []):
                if name in runners:
                    return name, "cache"
            return self._choose_now(key, runners, gpu, agree)

    def _choose_now(self, key: tuple, runners: dict[str, Callable[[], Any]], gpu: bool,
                    agree: Callable[[Any, Any], str | None]) -> tuple[str, str]:
        ref = runners[next(iter(runners))]()
        timings: dict[str, float] = {}
        rejected: dict[str, str] = {}
        for name, run in runners.items():
            try:
                bad = agree(run(), ref)
                if bad:
                    rejected[name] = bad
                    continue
                timings[name] = _median_time(run, gpu) * 1e3
            except Exception as exc:  # a broken implementation is rejected, not fatal
                rejected[name] = f"failed: {type(exc).__name__}: {exc}"
                _warn_failed(name, self.key_str(key), exc)
        ranking = sorted(timings, key=timings.get)
        if not ranking:
            raise RuntimeError(f"every implementation failed: {rejected}")
        entry = {"ranking": ranking, "timings_ms": {k: round(v, 6) for k, v in timings.items()},
                 "rejected": rejected, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        entry = self._save(key, entry)
        ranking = [n for n in entry["ranking"] if n in timings] or ranking
        return ranking[0], "tuned now"

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
            self._memory[key] = entry
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
        self._memory[key] = entry
        return entry

    def forget(self) -> None:
        """Drop the in-memory choices and candidates (the file is read again on next use)."""
        self._memory.clear()
        self._file_seen = None
        self._file_entries = {}
        self._by_name.clear()

    def entries_in_memory(self) -> int:
        """Choices held in memory (those looked up or tuned, and the file's last reading)."""
        return len(self._memory) + len(self._file_entries)


def _signature(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _warn_failed(name: str, key: str, exc: Exception) -> None:
    log.warning("dspk tuner: candidate %s raised %s: %s; rejected for %s", name,
                type(exc).__name__, exc, key)


def _valid_cache(doc: Any) -> bool:
    return (isinstance(doc, dict) and doc.get("format") == CACHE_FORMAT
            and doc.get("schema") == CACHE_SCHEMA and isinstance(doc.get("entries"), dict)
            and all(isinstance(v, dict) and isinstance(v.get("ranking"), list)
                    for v in doc["entries"].values()))


def read_cache(path: str | os.PathLike | None = None, warn: bool = True) -> dict[str, dict]:
    """The tuned choices stored in a cache file: key -> entry (``ranking``, ``timings_ms``,
    ``rejected``, ``when``).

    Parameters
    ----------
    path : str or os.PathLike, optional
        The file; default `cache_path` (the default engine's).
    warn : bool
        Warn (RuntimeWarning) when the file cannot be read or is not a dspk tuner cache of
        this schema.

    Returns
    -------
    dict
        Empty when the file is missing, unreadable or not a cache of this schema.
    """
    path = cache_path() if path is None else Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        if warn:
            warnings.warn(f"dspk tuner: cannot read {path}: {exc}; ignored", RuntimeWarning,
                          stacklevel=4)
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not _valid_cache(doc):
        if warn:
            warnings.warn(f"dspk tuner: {path} is corrupt or not a dspk tuner cache (schema "
                          f"{CACHE_SCHEMA}); ignored, and rewritten on the next tuning",
                          RuntimeWarning, stacklevel=4)
        return {}
    return doc["entries"]


def clear_cache(path: str | os.PathLike | None = None) -> bool:
    """Remove a cache file (``dspk tune-cache clear``). Engines keep what they hold in memory
    until they `forget` it.

    Parameters
    ----------
    path : str or os.PathLike, optional
        The file; default `cache_path` (the default engine's).

    Returns
    -------
    bool
        Whether a file was removed.
    """
    path = cache_path() if path is None else Path(path)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


_process_lock = threading.RLock()
_lock_depth = 0


@contextmanager
def _cache_lock(path: Path) -> Iterator[None]:
    """The cache file's exclusive lock, for tuning and writing. Re-entrant within a process (a
    tuning run may tune a product it needs, and flock on a second descriptor would wait for
    itself); other threads and processes wait. Without a writable cache folder: no lock."""
    global _lock_depth
    with _process_lock:
        if _lock_depth:
            _lock_depth += 1
            try:
                yield
            finally:
                _lock_depth -= 1
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(path.with_suffix(path.suffix + ".lock"), "a+")
        except OSError:
            lock = None
        try:
            if lock is not None:
                try:
                    import fcntl  # noqa: PLC0415 (POSIX only)

                    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                except ImportError:  # pragma: no cover - Windows: rename is still atomic
                    pass
            _lock_depth = 1
            yield
        finally:
            _lock_depth = 0
            if lock is not None:
                lock.close()


def _known(entry: dict) -> set:
    """The candidates an entry's tuning considered (timed or rejected, with the reason)."""
    return set(entry.get("timings_ms", {})) | set(entry.get("rejected", {}))


def _stale(entry: dict, names: dict, p: Problem) -> bool:
    """Whether a candidate that can run ``p`` is missing from the entry's tuning (a dspk
    change added it since: same version string during development, or a kernel that became
    available)."""
    known = _known(entry)
    return any(name not in known and c.unavailable(p) is None for name, c in names.items())


def _merge_into_cache(path: Path, key: str, entry: dict) -> dict:
    """Add ``entry`` under ``key`` unless the file already holds that key from a tuning that
    considered every candidate this one did (another process stored it first: its entry is
    returned and kept); an entry missing candidates is replaced. Read-merge-write under the
    cache lock; the write is a rename, so a reader never sees a half-written file and two
    tuning processes never lose each other's entries."""
    with _cache_lock(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = read_cache(path, warn=False)
        if key in entries and _known(entries[key]) >= _known(entry):
            return entries[key]
        entries[key] = entry
        doc = {"format": CACHE_FORMAT, "schema": CACHE_SCHEMA, "dspk": __version__,
               "entries": entries}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            return entry
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


# -- checking and timing ------------------------------------------------------------------------
class _Sampler:
    """Sampled rows of a product and their float64 reference."""

    MAX_ROWS = 8

    def __init__(self, p: Problem):
        self.p = p
        B, M = p.batches, p.m
        self.batches = sorted({0, B // 2, B - 1})
        self.rows = sorted({int(r) for r in np.linspace(0, M - 1, min(M, self.MAX_ROWS))})
        xp = p.a.xp
        self.exact = p.dtype.kind in "iu"
        ref_t = np.int64 if self.exact else np.float64
        a = p.a.to_array()[self.batches][:, self.rows, :].astype(ref_t)
        b = p.b.to_array()[self.batches].astype(ref_t)
        if self.exact and xp is not np:  # the int64 reference on the host: certainly exact
            a, b = a.get(), b.get()
        self.ref = np.matmul(a, b) if self.exact else xp.matmul(a, b)
        self.absprod = None if self.exact else xp.matmul(xp.abs(a), xp.abs(b))
        self.xp = xp

    def _out_rows(self) -> Any:
        return self.p.out.to_array()[self.batches][:, self.rows, :]

    def poison(self) -> None:
        out = self.p.out.to_array()
        for bi in self.batches:
            out[bi, self.rows, :] = np.iinfo(np.int64).min if self.exact else np.nan

    def relative_error(self) -> float:
        xp = self.xp
        diff = self._out_rows().astype(np.float64) - self.ref
        return float(xp.linalg.norm(diff) / max(float(xp.linalg.norm(self.ref)), 1e-300))

    def check_result(self) -> str | None:
        if self.exact:
            got = self._out_rows()
            got = got.get() if self.xp is not np else got
            wrong = int(np.count_nonzero(got != self.ref))
            return None if wrong == 0 else (f"{wrong} of {got.size} sampled outputs differ from "
                                            f"the int64 reference")
        xp = self.xp
        got = self._out_rows().astype(np.float64)
        eps = float(np.finfo(self.p.dtype).eps)
        k = max(self.p.k, 1)
        bound = min(k, 64 * np.sqrt(k)) * eps * self.absprod + 1e-30
        err = xp.abs(got - self.ref)
        ok = bool(xp.all(err <= bound))  # NaN (an unwritten output) fails here
        if ok:
            return None
        worst = float(xp.nanmax(err / bound)) if bool(xp.isfinite(got).all()) else float("nan")
        return (f"sampled outputs differ from the float64 reference beyond the rounding bound "
                f"(worst {worst:.3g}x the bound; NaN means an output was not written)")


def _make_probe(p: Problem) -> Problem:
    """Operands of the same geometry filled with zero-mean normal values."""
    xp = p.a.xp
    rng = xp.random.default_rng(12345)
    new: dict[tuple, Any] = {}

    def clone(v: MatrixView, fill: bool) -> MatrixView:
        # Views over the same memory (X and X.T) get the same probe buffer.
        base = v.buffer.data.ptr if v.is_gpu else v.buffer.ctypes.data
        ident = (base, v.buffer.size, fill)
        buf = new.get(ident)
        if buf is None:
            if not fill:
                buf = xp.empty(v.buffer.size, dtype=v.dtype)
            elif v.dtype.kind in "iu":  # the full range: extremes exercise every correction
                info = np.iinfo(v.dtype)
                host = np.random.default_rng(12345).integers(info.min, int(info.max) + 1,
                                                             v.buffer.size, dtype=v.dtype)
                buf = xp.asarray(host)
            else:
                buf = rng.standard_normal(v.buffer.size, dtype=v.dtype)
            new[ident] = buf
        return MatrixView(buf, v.shape, v.strides, v.offset, v.name)

    a = clone(p.a, True)
    b = clone(p.b, True)
    out = clone(p.out, False)
    return Problem(a, b, out, p.symmetric)


#: Operand bytes the tuner's timing cycles through, in multiples of the GPU's L2 cache, and
#: the most operand sets it makes to get there. Timed back to back on one set, a product whose
#: operands fit in L2 (W·X of 64 channels, a 61 -> 6 projection) reads them from L2, and the
#: candidate that wins there is not the one that wins on operands fresh from memory, which is
#: what a pipeline's chunk is and what the benchmarks time: measured on an H200 for the
#: projection, direct_wxv2k16 0.0140 ms against direct_wxtile128c1s6w16 0.0116 with inputs
#: rotated beyond L2, while the L2-hot timing ranked them the other way.
ROTATE_L2_MULTIPLE = 4
ROTATE_MAX_SETS = 8


def _rotation(p: Problem) -> list[Problem]:
    """``p`` and copies of its operands (same values, strides and 256-byte alignment, fresh
    outputs) enough that timing cycles through ROTATE_L2_MULTIPLE times the GPU's L2: ``[p]``
    on the CPU, when the operands alone are that large, or when memory for copies is short."""
    if not p.gpu:
        return [p]
    cp = cupy_module()
    views = {id(v): v for v in (p.a, p.b, p.out)}
    footprint = sum((v.extent()[1] - v.extent()[0] + 1) * v.itemsize for v in views.values())
    l2 = int(cp.cuda.runtime.getDeviceProperties(p.a.device_id).get("l2CacheSize", 0))
    if footprint == 0 or l2 == 0 or footprint >= ROTATE_L2_MULTIPLE * l2:
        return [p]
    sets = min(ROTATE_MAX_SETS, -(-ROTATE_L2_MULTIPLE * l2 // footprint))
    out = [p]
    try:
        for _ in range(sets - 1):
            copies: dict[tuple, Any] = {}

            def clone(v: MatrixView, fill: bool) -> MatrixView:
                lo, hi = v.extent()
                addr = v.buffer.data.ptr + lo * v.itemsize
                shift = (addr % 256) // v.itemsize        # keep the address modulo 256
                ident = (v.buffer.data.ptr, lo, hi)       # X and X.T share one copy
                buf = copies.get(ident)
                if buf is None:
                    buf = cp.empty(shift + hi - lo + 1, dtype=v.dtype)
                    if fill:
                        buf[shift:] = v.buffer[lo:hi + 1]
                    copies[ident] = buf
                return MatrixView(buf, v.shape, v.strides, v.offset - lo + shift, v.name)

            if any(v.buffer.data.ptr % v.itemsize for v in views.values()):
                return [p]
            out.append(Problem(clone(p.a, True), clone(p.b, True), clone(p.out, False),
                               p.symmetric))
    except cp.cuda.memory.OutOfMemoryError:
        pass                                   # time on the sets made so far
    return out


def _cycling(c: Candidate, sets: list[Problem]) -> Callable[[], None]:
    """``c`` bound on each operand set, one call per set in turn."""
    calls = [prepared(c, q) for q in sets]
    if len(calls) == 1:
        return calls[0]
    state = [0]

    def run() -> None:
        i = state[0]
        state[0] = i + 1 if i + 1 < len(calls) else 0
        calls[i]()

    return run


def _median_time(fn: Callable[[], None], gpu: bool, budget_s: float = 0.25) -> float:
    """Median seconds per call of ``fn`` after a warm-up."""
    if gpu:
        cp = cupy_module()
        start, stop = cp.cuda.Event(), cp.cuda.Event()

        def timed(n: int) -> float:
            start.record()
            for _ in range(n):
                fn()
            stop.record()
            stop.synchronize()
            return cp.cuda.get_elapsed_time(start, stop) * 1e-3 / n
    else:
        def timed(n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) / n

    fn()
    one = max(timed(1), 1e-7)
    n = int(min(200, max(1, (2e-4 if gpu else 2e-3) / one)))
    samples = max(3, min(9, int(budget_s / (one * n))))
    return float(np.median([timed(n) for _ in range(samples)]))
