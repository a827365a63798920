"""Flushing a job's partial output to the disk while the job writes it.

A job flushes its output before naming it (issue 45: a power cut never leaves an output that
looks complete and is not). Flushed at the end only, the disk's whole write-back waits for
the commit: ~1.2 s for a 2.8 GB float32 output on the H100 machine, whose job ran 0.93 s
without it. `EarlyFlush` asks the kernel to write the partial output back during the job
(``os.fdatasync`` every `EVERY` bytes written, on a thread of its own), so the disk works
while the job computes and the commit's flush finds little left. It is worth it where the
host has cores to spare (a GPU job's host): on 2 busy cores the flushes during the job cost
more than they saved (measured: `benchmarks/NOTES.md`), so by default it is used from
`MIN_CPUS` cores (`early_flush_default`).

The commit's own flush is unchanged: the early flushes only move work earlier; durability
never depends on them (their errors are left to the commit's flush to raise).

Examples
--------
>>> import os, tempfile
>>> from dspk.pipeline.flush import EarlyFlush
>>> tmp = tempfile.TemporaryDirectory()
>>> path = os.path.join(tmp.name, "out.partial")
>>> with open(path, "wb") as f, EarlyFlush(path, every=1 << 20) as flush:
...     for _ in range(4):                  # a job's writer thread: write, then count
...         _ = f.write(bytes(1 << 19))
...         flush.wrote(1 << 19)            # every 2nd block wakes the flushing thread
>>> os.path.getsize(path)
2097152
>>> tmp.cleanup()
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["EVERY", "MIN_CPUS", "EarlyFlush", "early_flush_default"]

#: bytes written between two early flushes
EVERY = 256 << 20
#: cores from which a job flushes early by default
MIN_CPUS = 8


def early_flush_default() -> bool:
    """Whether a job that flushes its output (``fsync``) also flushes it early: as
    ``DSPK_EARLY_FLUSH`` says (``on``/``off``), else where the host has at least `MIN_CPUS`
    cores.

    Examples
    --------
    >>> import os
    >>> from dspk.pipeline.flush import early_flush_default, MIN_CPUS
    >>> os.environ.get("DSPK_EARLY_FLUSH") is not None or \\
    ...     early_flush_default() == ((os.cpu_count() or 1) >= MIN_CPUS)
    True
    """
    said = os.environ.get("DSPK_EARLY_FLUSH", "").strip().lower()
    if said in ("1", "on", "true", "yes"):
        return True
    if said in ("0", "off", "false", "no"):
        return False
    return (os.cpu_count() or 1) >= MIN_CPUS


def _files(path: Path) -> list:
    """A partial file, or a partial folder's regular files."""
    if path.is_dir():
        return [p for p in path.rglob("*") if p.is_file()]
    return [path] if path.is_file() else []


class EarlyFlush:
    """Flushes a partial output (a file, or a folder's files) to the disk on a thread of its
    own each time `EVERY` more bytes have been written (`wrote`). A context manager: leaving
    it stops the thread (after the flush in progress, if any).

    Parameters
    ----------
    path : path
        The partial file or folder.
    every : int
        Bytes written between two flushes.

    Attributes
    ----------
    flushes : int
        Flushes done.
    seconds : float
        Time spent in them (on the flushing thread).
    """

    def __init__(self, path: str | os.PathLike, every: int = EVERY) -> None:
        self.path = Path(path)
        self.every = int(every)
        self.flushes = 0
        self.seconds = 0.0
        self._pending = 0
        self._wake = threading.Condition()
        self._due = False
        self._stop = False
        self._thread = threading.Thread(target=self._work, name="dspk-flush", daemon=True)
        self._thread.start()

    def __enter__(self) -> "EarlyFlush":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def wrote(self, nbytes: int) -> None:
        """Count ``nbytes`` written; wake the thread when `every` bytes have gathered."""
        self._pending += int(nbytes)
        if self._pending >= self.every:
            self._pending = 0
            with self._wake:
                self._due = True
                self._wake.notify()

    def close(self) -> None:
        """Stop the thread (the flush in progress ends first)."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join()

    def _work(self) -> None:
        sync = getattr(os, "fdatasync", os.fsync)     # (macOS has no fdatasync)
        while True:
            with self._wake:
                while not (self._due or self._stop):
                    self._wake.wait()
                if self._stop:
                    return
                self._due = False
            t = time.perf_counter()
            for f in _files(self.path):
                try:
                    fd = os.open(f, os.O_RDONLY)
                    try:
                        sync(fd)
                    finally:
                        os.close(fd)
                except OSError:      # the commit's own flush raises what matters
                    pass
            self.flushes += 1
            self.seconds += time.perf_counter() - t
