"""The tuner's cache file: where it is, what an entry holds, how processes share it.

The tuned choices are kept in a versioned JSON file (`cache_path`: ``$DSPK_CACHE_DIR``,
default ``~/.cache/dspk``), key -> entry (`_entry`: the ranking, its timings, the candidates
rejected and why, how and when it was tuned), written atomically under a file lock so that
several processes can tune at once (`_merge_into_cache`). Processes that share the file make
the same choices: a miss re-reads the file when another process has changed it (`_signature`),
and tuning holds the file's lock (`_cache_lock`), so a process that needs a key another one is
tuning waits and takes its ranking (a candidate's rounding may differ from another's: a shared
choice is what keeps outputs bit-identical). A stored entry is replaced only by one that
considered a candidate it did not, or by a thorough tuning of one tuned on first use or
taken from a winners table (`_replaces`). Keys start with a stamp of the device and of the
versions that decide what a candidate computes (`_stamp`), so a new driver, library or dspk
tunes anew (the shipped winners tables, `dspk.linalg.winners`, are keyed by a device class
instead).

`dspk.linalg.tuner.Tuner` decides what to look up, tune and store; this module only keeps the
file.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .._version import __version__
from ..backend import cupy_module, device_name
from ..caches import shared
from .problem import Problem

CACHE_FORMAT = "dspk-tuner"
CACHE_SCHEMA = 1

#: How an entry was tuned (its ``"tuned"`` field; entries written before it existed were
#: tuned on the whole product: thorough): on slices of the product on first use, on the whole
#: problem with few samples on first use (`Tuner.choose` without slices, products too small to
#: slice), or thoroughly (every candidate on the whole problem, median of several samples).
TUNED_SLICE, TUNED_BRIEF, TUNED_THOROUGH = "slice", "brief", "thorough"
#: an entry taken from a shipped winners table (`dspk.linalg.winners`: a thorough tuning on a
#: machine of this device class), not timed here; its ``"table"`` field says which table and
#: where it was measured. A thorough tuning replaces it, as it does a first use's.
TUNED_TABLE = "table"


def cache_path() -> Path:
    """The default engine's cache file: ``tuner-v1.json`` in ``DSPK_CACHE_DIR`` (read now), else
    in ``~/.cache/dspk``."""
    base = os.environ.get("DSPK_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "dspk"
    return root / f"tuner-v{CACHE_SCHEMA}.json"


def _stamp(p: Problem) -> str:
    if not p.gpu:
        return _host_stamp()
    return _gpu_stamp(p.device_id)


def _host_stamp() -> str:
    return f"{device_name(None)}|numpy{np.__version__}|dspk{__version__}"


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


# -- entries ---------------------------------------------------------------------------------------
def _entry(timings_ms: dict[str, float], rejected: dict[str, str], how: str,
           ranking: list[str] | None = None) -> dict:
    """A cache entry: the ranking (fastest first, unless given), its timings (ms), the
    candidates rejected and why, how it was tuned, when."""
    if ranking is None:
        ranking = sorted(timings_ms, key=timings_ms.get)
    return {"ranking": list(ranking),
            "timings_ms": {k: round(v, 6) for k, v in timings_ms.items()},
            "rejected": rejected, "tuned": how, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _how(entry: dict) -> str:
    """How a cache entry was tuned (`TUNED_SLICE`, `TUNED_BRIEF`, `TUNED_THOROUGH`, or
    `TUNED_TABLE`)."""
    return entry.get("tuned", TUNED_THOROUGH)


def _known(entry: dict) -> set:
    """The candidates an entry's tuning considered (timed, rejected or left untimed, with the
    reason)."""
    return set(entry.get("timings_ms", {})) | set(entry.get("rejected", {})) | \
        set(entry.get("untimed", {}))


def _stale(entry: dict, names: dict, p: Problem) -> bool:
    """Whether a candidate that can run ``p`` is missing from the entry's tuning (a dspk
    change added it since: same version string during development, or a kernel that became
    available)."""
    known = _known(entry)
    return any(name not in known and c.unavailable(p) is None for name, c in names.items())


def _replaces(new: dict, old: dict) -> bool:
    """Whether ``new`` replaces ``old`` for one key: when ``old`` missed a candidate ``new``
    considered, or when ``new`` is thorough and ``old`` was tuned on first use or taken from
    a winners table (an explicit thorough tuning); never otherwise (another process stored it
    first)."""
    return not _known(old) >= _known(new) or \
        (_how(new) == TUNED_THOROUGH and _how(old) != TUNED_THOROUGH)


# -- reading, clearing, writing under the lock -----------------------------------------------------
def _signature(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _valid_cache(doc: Any) -> bool:
    return (isinstance(doc, dict) and doc.get("format") == CACHE_FORMAT
            and doc.get("schema") == CACHE_SCHEMA and isinstance(doc.get("entries"), dict)
            and all(isinstance(v, dict) and isinstance(v.get("ranking"), list)
                    for v in doc["entries"].values()))


def read_cache(path: str | os.PathLike | None = None, warn: bool = True) -> dict[str, dict]:
    """The tuned choices stored in a cache file: key -> entry (``ranking``, ``timings_ms``,
    ``rejected``, ``when``; ``tuned``: ``"slice"``, ``"brief"``, ``"thorough"`` (entries
    without it were tuned thoroughly) or ``"table"`` (from a shipped winners table, with
    ``table``: its class, the device and date it was measured on), and for first uses
    ``timed_on`` (each candidate's slice) and ``untimed`` (candidates not timed, and why)).

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


def _merge_into_cache(path: Path, key: str, entry: dict) -> dict:
    """Add ``entry`` under ``key`` unless the file already holds that key and ``entry`` does
    not replace it (`_replaces`: another process stored it first: its entry is returned and
    kept). Read-merge-write under the cache lock; the write is a rename, so a reader never
    sees a half-written file and two tuning processes never lose each other's entries."""
    with _cache_lock(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = read_cache(path, warn=False)
        if key in entries and not _replaces(entry, entries[key]):
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

