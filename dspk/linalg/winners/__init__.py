"""Known winners: the tuner's thorough choices, measured once per device class and shipped.

A tuner key starts with a stamp of the device and of the versions that decide what a candidate
computes (`dspk.linalg.tuner_cache._stamp`): a new NumPy, driver or dspk tunes anew, so a
table keyed by the stamp would never apply on a user's machine. A *winners table* is keyed by
the rest of the key with the stamp replaced by the device's *class* (`device_class`): one JSON
file per class, ``<class>.json`` in this package's folder (or in ``DSPK_WINNERS``), mapping
``"<op>|<class>|<dtype>|<layouts>|<size classes>|<sym>"`` to the ranking a thorough tuning
(``dspk tune``, `dspk.linalg.Engine.thorough`) made on a machine of that class, its timings,
the candidates it rejected, and where, when and with what it was measured (``sources``: the
device, the full stamp, dspk's version and commit).

The tuner (`dspk.linalg.tuner.Tuner`) looks a key up in memory, then in the cache file, then
here — used without timing when the table's winner can run the problem here and the table's
tuning considered every candidate that can (a dspk that added a candidate since is not
covered), its result checked against the sampled float64 reference as a first use's is —
and tunes on first use only what the table does not cover. The choice is stored in the cache
with ``"tuned": "table"``; a thorough tuning replaces it as it does a first use's.

A table is made by `export` (``python -m dspk.linalg.winners export``) from a cache file's
thorough entries for one device, merged into the existing table of its class;
``benchmarks/bench_coldstart.py --thorough-export`` tunes the standard calls thoroughly and
exports them, in one process.

``DSPK_WINNERS``: unset, the package's tables; ``off`` (or ``0``, ``none``), no table; a
folder, the tables in it instead of the package's.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..._version import __version__

__all__ = ["FORMAT", "SCHEMA", "WinnersTable", "device_class", "gpu_class", "host_class",
           "table_folder", "load_table", "table_key", "validate", "export"]

FORMAT = "dspk-winners"
SCHEMA = 1

#: the folder of the tables shipped with the package
PACKAGE_FOLDER = Path(__file__).resolve().parent

#: GPU models with a class, by a pattern of their CUDA device name (first match wins; the
#: name has dspk's " ccXY smN" appended: `dspk.backend.device_name`). A model not listed gets
#: no class and so no table: its winners are not known.
GPU_MODELS = (
    (r"\bGH200\b", "gh200"), (r"\bH200\b", "h200"), (r"\bH100\b", "h100"),
    (r"\bB200\b", "b200"), (r"\bA100\b", "a100"), (r"\bL40S\b", "l40s"), (r"\bL4\b", "l4"),
)


def gpu_class(name: str) -> str | None:
    """The class of a GPU from its `dspk.backend.device_name` (``"NVIDIA H100 80GB HBM3 cc90
    sm132"``): ``"nvidia-h100-sm132"``, None for a model not in `GPU_MODELS`.

    Which candidate wins a product on a GPU is decided by the model (its tensor cores, caches
    and memory, which the name gives) and by how many SMs fill a grid: the count is part of
    the class, so a MIG slice, or another board of the model with fewer SMs (an H100 PCIe has
    114 of the SXM's 132), is another class — with no table until one is measured there. The
    form factor is kept where the name says it (``-nvl``, ``-pcie``): same SMs, other memory
    and clocks. The driver, CUDA and library versions are not: they change a winner's speed
    less than a tuning on first use costs, and the tuner checks every table choice's result.

    Examples
    --------
    >>> from dspk.linalg.winners import gpu_class
    >>> gpu_class("NVIDIA H100 80GB HBM3 cc90 sm132"), gpu_class("NVIDIA H200 NVL cc90 sm132")
    ('nvidia-h100-sm132', 'nvidia-h200-nvl-sm132')
    >>> gpu_class("NVIDIA GeForce GTX 1080 cc61 sm20") is None
    True
    """
    for pattern, model in GPU_MODELS:
        if re.search(pattern, name, re.IGNORECASE):
            break
    else:
        return None
    form = next((f"-{f}" for f in ("nvl", "pcie") if re.search(rf"\b{f}\b", name, re.I)), "")
    sms = re.search(r"\bsm(\d+)\s*$", name)
    return f"nvidia-{model}{form}" + (f"-sm{sms.group(1)}" if sms else "")


@lru_cache(maxsize=None)
def host_class() -> str | None:
    """The class of this host for the CPU's choices: ``cpu-<machine>-<N>cpu-<BLAS>-<its
    kernel architecture>``, e.g. ``"cpu-x86_64-2cpu-openblas-skylakex"`` (CI's 2-core
    runners); None when NumPy's BLAS cannot be told (threadpoolctl finds none).

    The CPU candidates are BLAS calls of various shapes against NumPy's loops and dspk's own
    blocks, so what decides a winner is the BLAS library (its vendor: OpenBLAS, MKL, BLIS,
    Accelerate), the kernels it runs on this core (OpenBLAS's core type, which also tells the
    SIMD width: SkylakeX for AVX-512, Haswell for AVX2, Zen...), and how many CPUs its
    threads and dspk's blocks share (the logical CPUs, as the tuner key's stamp counts them:
    `os.cpu_count`). The CPU model and its clock are left out: they scale every candidate
    alike far more than they reorder them, and the tuner checks every table choice's result.
    """
    from ..threads import _numpy_blas, _state  # noqa: PLC0415 (threadpoolctl: on use only)

    state = _state()
    with state.lock:
        lib = _numpy_blas(state)
    if lib is None:
        return None
    vendor = str(getattr(lib.ctl, "internal_api", "") or "")
    arch = str(getattr(lib.ctl, "architecture", "") or "")
    if not vendor:
        return None
    parts = ["cpu", platform.machine() or "unknown", f"{os.cpu_count()}cpu", vendor] + \
        ([arch] if arch else [])
    return _safe("-".join(parts))


def _safe(text: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", text.lower()).strip("-")


def device_class(stamp: str) -> str | None:
    """The class of the device a tuner stamp names (`dspk.linalg.tuner_cache._host_stamp`:
    ``"cpu:..."``, this host's `host_class`; a GPU's `_gpu_stamp`: `gpu_class` of its name),
    or None (no table applies)."""
    if stamp.startswith("cpu:"):
        return host_class()
    return gpu_class(stamp.split("|", 1)[0])


def table_key(key_str: str, stamp: str, cls: str) -> str | None:
    """A cache key (`dspk.linalg.tuner.Tuner.key_str`) with its stamp, whole ``|``-separated
    fields, replaced by the class ``cls``; None when the key does not hold ``stamp``."""
    padded, mark = f"|{key_str}|", f"|{stamp}|"
    at = padded.find(mark)
    if at < 0:
        return None
    return (padded[:at] + f"|{cls}|" + padded[at + len(mark):])[1:-1]


# -- the tables ------------------------------------------------------------------------------------
def table_folder() -> Path | None:
    """Where the tables are read from: ``DSPK_WINNERS`` (a folder; ``off``, ``0``, ``none``:
    no table), else the package's folder."""
    setting = (os.environ.get("DSPK_WINNERS") or "").strip()
    if setting.lower() in ("off", "0", "none", "no", "false"):
        return None
    return Path(setting) if setting else PACKAGE_FOLDER


@dataclass
class WinnersTable:
    """One class's table: its file, its entries (table key -> entry), its sources."""

    cls: str
    path: Path
    entries: dict[str, dict]
    sources: list[dict]

    def lookup(self, key: str) -> tuple[dict, dict] | None:
        """(entry, its source: device, stamp, when, dspk, commit) for a table key, or None."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        return entry, self.sources[entry.get("source", 0)]


def validate(doc: Any, cls: str | None = None) -> list[str]:
    """What is wrong with a winners table (``doc``, the parsed JSON; ``cls``, the class its
    file is named for): an empty list when nothing is.

    Examples
    --------
    >>> from dspk.linalg.winners import validate
    >>> validate({"format": "dspk-winners", "schema": 1, "class": "c", "sources": [
    ...     {"device": "d", "when": "2026-12-07"}], "entries": {"k|c|x": {
    ...     "ranking": ["a"], "timings_ms": {"a": 1.0}, "rejected": {}, "source": 0}}})
    []
    >>> validate({"format": "dspk-winners", "schema": 2})[0]
    'schema is 2, expected 1'
    """
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    problems = []
    if doc.get("format") != FORMAT:
        problems.append(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
    if doc.get("schema") != SCHEMA:
        problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA}")
    if problems:
        return problems
    if not isinstance(doc.get("class"), str) or not doc["class"]:
        problems.append("no class")
    elif cls is not None and doc["class"] != cls:
        problems.append(f"class is {doc['class']!r}, the file is named for {cls!r}")
    sources = doc.get("sources")
    if not isinstance(sources, list) or not sources or not all(
            isinstance(s, dict) and isinstance(s.get("device"), str)
            and isinstance(s.get("when"), str) for s in sources):
        problems.append("sources: expected a non-empty list of {device, when, ...}")
        sources = []
    entries = doc.get("entries")
    if not isinstance(entries, dict):
        return problems + ["entries: expected an object"]
    for key, e in entries.items():
        why = _entry_problem(key, e, doc.get("class"), len(sources))
        if why:
            problems.append(f"entry {key!r}: {why}")
            if len(problems) > 5:
                break
    return problems


def _entry_problem(key: str, e: Any, cls: Any, n_sources: int) -> str | None:
    if not isinstance(e, dict):
        return "not an object"
    if isinstance(cls, str) and cls not in key.split("|"):
        return f"the key does not name the class {cls!r}"
    ranking = e.get("ranking")
    if not isinstance(ranking, list) or not ranking or \
            not all(isinstance(n, str) for n in ranking):
        return "ranking: expected a non-empty list of candidate names"
    timings = e.get("timings_ms", {})
    if not isinstance(timings, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in timings.values()):
        return "timings_ms: expected {name: ms}"
    for field in ("rejected", "untimed"):
        if not isinstance(e.get(field, {}), dict):
            return f"{field}: expected {{name: why}}"
    source = e.get("source", 0)
    if not isinstance(source, int) or isinstance(source, bool) or not 0 <= source < n_sources:
        return f"source {source!r} is not an index of sources"
    return None


_loaded: dict[Path, tuple[Any, WinnersTable | None]] = {}
_loaded_lock = threading.Lock()


def load_table(cls: str | None, folder: Path | None = None) -> WinnersTable | None:
    """The table of class ``cls`` (in `table_folder`, unless ``folder``), or None: no class,
    no table for it, tables off, or a file that is not a valid table (a RuntimeWarning says
    what is wrong, once per version of the file; it is then ignored). Read once per version
    of the file (its stat signature)."""
    if cls is None:
        return None
    folder = table_folder() if folder is None else folder
    if folder is None:
        return None
    path = folder / f"{cls}.json"
    try:
        st = path.stat()
    except OSError:
        return None
    signature = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _loaded_lock:
        seen = _loaded.get(path)
        if seen is not None and seen[0] == signature:
            return seen[1]
        table = _read(path, cls)
        _loaded[path] = (signature, table)
        return table


def _read(path: Path, cls: str) -> WinnersTable | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        warnings.warn(f"dspk tuner: the winners table {path} cannot be read ({exc}); ignored "
                      f"(keys are tuned on first use)", RuntimeWarning, stacklevel=4)
        return None
    problems = validate(doc, cls)
    if problems:
        warnings.warn(f"dspk tuner: the winners table {path} is not valid ("
                      f"{'; '.join(problems[:3])}); ignored (keys are tuned on first use)",
                      RuntimeWarning, stacklevel=4)
        return None
    return WinnersTable(cls, path, doc["entries"], doc["sources"])


def forget_tables() -> None:
    """Drop the tables read (read again on next use)."""
    with _loaded_lock:
        _loaded.clear()


# -- making a table from a cache file ------------------------------------------------------------
def _commit() -> str:
    """The git commit of this dspk's source tree (``git describe --always --dirty``), or
    ``"unknown"`` (an installed package)."""
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE_FOLDER), "describe", "--always",
                              "--dirty", "--abbrev=12"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def export(cache_file: str | os.PathLike, out: str | os.PathLike | None = None,
           stamp: str | None = None, cls: str | None = None, gpu: int | None = None,
           merge: bool = True, commit: str | None = None) -> dict:
    """Write the thorough entries a cache file holds for one device into the winners table of
    its class, merged with the table already there (an entry exported now replaces the
    table's for the same key; the others are kept).

    Parameters
    ----------
    cache_file : str or os.PathLike
        The tuner's cache file (``tuner-v1.json``).
    out : str or os.PathLike, optional
        The table to write; default ``<class>.json`` in the package's folder.
    stamp : str, optional
        The device's stamp in the keys; default this host's (`gpu` None) or GPU ``gpu``'s.
    cls : str, optional
        The class; default `device_class` of the stamp (for the host: this host's class, so
        export on the machine that tuned).
    gpu : int, optional
        Export GPU ``gpu``'s entries (its stamp and class) rather than the host's.
    merge : bool
        Merge with the table at ``out`` (False: replace it).
    commit : str, optional
        dspk's commit to record; default ``git describe`` of the source tree.

    Returns
    -------
    dict
        ``path``, ``class``, ``exported`` (entries exported), ``entries`` (in the table now),
        ``skipped`` (the stamp's entries not tuned thoroughly).
    """
    from ..tuner_cache import (TUNED_THOROUGH, _gpu_stamp, _host_stamp, _how,  # noqa: PLC0415
                               read_cache)

    if stamp is None:
        stamp = _host_stamp() if gpu is None else _gpu_stamp(gpu)
    cls = device_class(stamp) if cls is None else cls
    if not cls:
        raise ValueError(f"no device class for {stamp.split('|', 1)[0]!r}: see "
                         f"dspk.linalg.winners.GPU_MODELS and host_class")
    out = PACKAGE_FOLDER / f"{cls}.json" if out is None else Path(out)
    entries = read_cache(cache_file)
    source = {"device": stamp.split("|", 1)[0], "stamp": stamp, "dspk": __version__,
              "commit": commit or _commit(), "when": ""}
    new: dict[str, dict] = {}
    skipped = 0
    whens = []
    for key, entry in sorted(entries.items()):
        tkey = table_key(key, stamp, cls)
        if tkey is None:
            continue
        if _how(entry) != TUNED_THOROUGH:
            skipped += 1
            continue
        e = {"ranking": list(entry["ranking"]), "timings_ms": dict(entry.get("timings_ms", {})),
             "rejected": dict(entry.get("rejected", {}))}
        if entry.get("untimed"):
            e["untimed"] = dict(entry["untimed"])
        if entry.get("when"):
            e["when"] = entry["when"]
            whens.append(entry["when"])
        new[tkey] = e
    source["when"] = max(whens) if whens else time.strftime("%Y-%m-%dT%H:%M:%S%z")
    old_entries: dict[str, dict] = {}
    old_sources: list[dict] = []
    if merge and out.exists():
        doc = json.loads(out.read_text())
        problems = validate(doc, cls)
        if problems:
            raise ValueError(f"{out} is not a valid winners table of class {cls!r} "
                             f"({'; '.join(problems[:3])}): give merge=False (--replace) to "
                             f"replace it")
        old_entries, old_sources = doc["entries"], doc["sources"]
    sources = list(old_sources)
    if new:
        sources.append(source)
        for e in new.values():
            e["source"] = len(sources) - 1
    merged = {**old_entries, **new}
    # sources no entry refers to any more are dropped, the others renumbered in order
    used = sorted({e.get("source", 0) for e in merged.values()})
    renumber = {old: i for i, old in enumerate(used)}
    sources = [sources[i] for i in used]
    for key, e in merged.items():
        merged[key] = {**e, "source": renumber[e.get("source", 0)]}
    doc = {"format": FORMAT, "schema": SCHEMA, "class": cls,
           "about": "the tuner's thorough choices for this device class (dspk.linalg.winners)",
           "sources": sources, "entries": dict(sorted(merged.items()))}
    problems = validate(doc, cls) if merged else []
    if problems:  # pragma: no cover - what export writes is valid
        raise AssertionError(f"export made an invalid table: {problems}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, out)
    return {"path": str(out), "class": cls, "exported": len(new), "entries": len(merged),
            "skipped": skipped}


def main(argv: list[str] | None = None) -> int:
    """``python -m dspk.linalg.winners``: ``class`` (this machine's classes), ``show``
    (a table), ``export`` (a cache file's thorough entries into a table)."""
    import argparse  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m dspk.linalg.winners",
                                 description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("class", help="this host's class (and GPU 0's, with --gpu)").add_argument(
        "--gpu", type=int, default=None, metavar="ID")
    show = sub.add_parser("show", help="the entries of a class's table")
    show.add_argument("cls", nargs="?", default=None, metavar="CLASS",
                      help="default: this host's class")
    ex = sub.add_parser("export", help="a cache file's thorough entries for one device into "
                                       "the table of its class (merged)")
    ex.add_argument("--cache", default=None, help="the cache file (default: this user's, "
                                                  "DSPK_CACHE_DIR)")
    ex.add_argument("--out", default=None, help="the table (default: the package's file for "
                                                "the class)")
    ex.add_argument("--gpu", type=int, default=None, metavar="ID",
                    help="export this GPU's entries (default: the host's)")
    ex.add_argument("--stamp", default=None, help="the device stamp of the keys to export")
    ex.add_argument("--class", dest="cls", default=None, help="the class to write")
    ex.add_argument("--commit", default=None, help="dspk's commit to record")
    ex.add_argument("--replace", action="store_true", help="replace the table, not merge")
    args = ap.parse_args(argv)
    if args.action == "class":
        print(f"host: {host_class()}")
        if args.gpu is not None:
            from ..tuner_cache import _gpu_stamp  # noqa: PLC0415

            print(f"gpu {args.gpu}: {device_class(_gpu_stamp(args.gpu))}")
        return 0
    if args.action == "show":
        cls = args.cls or host_class()
        table = load_table(cls)
        if table is None:
            print(f"no winners table for {cls} in {table_folder()}")
            return 1
        for key, e in table.entries.items():
            src = table.sources[e.get("source", 0)]
            print(f"{key}\n    -> {e['ranking'][0]} (ranking {json.dumps(e['ranking'])}; "
                  f"measured on {src['device']} {str(e.get('when', src['when']))[:10]})")
        return 0
    from ..tuner_cache import cache_path  # noqa: PLC0415

    got = export(args.cache or cache_path(), args.out, stamp=args.stamp, cls=args.cls,
                 gpu=args.gpu, merge=not args.replace, commit=args.commit)
    print(f"{got['exported']} thorough entries exported into {got['path']} (class "
          f"{got['class']}, {got['entries']} entries; {got['skipped']} of the device's "
          f"entries not tuned thoroughly were left out)")
    return 0

