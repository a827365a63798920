"""One job per output: `OutputLock`, an exclusive lock file ``OUT.lock`` beside the output
that a `dspk.pipeline.Job` takes before any work and holds until its output is committed
or given up. A second job on the same output is refused at once, naming the job that
holds it (its process id, host and start time); the lock of a job whose process is gone
(killed, or its machine restarted) is recognised as stale and taken over, said in the log.

The lock is ``flock`` on the lock file (released by the kernel when the holding process
ends, however it ends); where the file system has no ``flock``, the lock file is created
exclusively (``O_EXCL``) and a stale one recognised by its process id on this host.

Examples
--------
>>> import os, tempfile
>>> from dspk.pipeline.lock import OutputLock, LockedError
>>> tmp = tempfile.TemporaryDirectory()
>>> first = OutputLock(os.path.join(tmp.name, "o.h5.lock")).acquire()
>>> try:
...     OutputLock(os.path.join(tmp.name, "o.h5.lock")).acquire()
... except LockedError as exc:
...     "another job is writing" in str(exc) and f"pid {os.getpid()}" in str(exc)
True
>>> first.release()
>>> os.listdir(tmp.name)
[]
>>> tmp.cleanup()
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

from .errors import PipelineError

try:                                        # POSIX; elsewhere the O_EXCL lock file alone
    import fcntl
except ImportError:                         # pragma: no cover (Windows)
    fcntl = None  # type: ignore[assignment]

__all__ = ["OutputLock", "LockedError", "lock_holder"]

log = logging.getLogger("dspk.pipeline")

#: errors of a file system without flock (the O_EXCL lock file is used there)
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class LockedError(PipelineError):
    """Another job holds the output's lock: the message names it (pid, host, start time)
    and the lock file. Raised by `dspk.pipeline.Pipeline.run` (and every job) before any
    work; importable as ``dspk.pipeline.LockedError``. A `PipelineError`, so code that
    catches that catches this too; catch it first to wait for, or skip, an output that
    another job is writing.

    Parameters
    ----------
    message : str

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, dspk
    >>> from dspk.pipeline import LockedError, PipelineError
    >>> from dspk.pipeline.lock import OutputLock
    >>> issubclass(LockedError, PipelineError)
    True
    >>> tmp = tempfile.TemporaryDirectory()
    >>> out = os.path.join(tmp.name, "o.h5")
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.float32), fs=30000.0)
    >>> p = dspk.Pipeline.from_options(whiten=None)
    >>> with OutputLock(out + ".lock"):           # as another job on o.h5 would hold it
    ...     try:
    ...         p.run(rec, out, progress=False)
    ...     except LockedError as exc:
    ...         print("skipped:", "another job is writing it" in str(exc))
    skipped: True
    >>> tmp.cleanup()
    """


def lock_holder(path: str | os.PathLike) -> dict:
    """What a lock file says of the job that took it: ``pid``, ``host``, ``started`` (UTC,
    ISO 8601) and ``out``; {} when it is empty, missing or unreadable.

    Parameters
    ----------
    path : path
        The lock file.

    Examples
    --------
    >>> from dspk.pipeline.lock import lock_holder
    >>> lock_holder("no such.lock")
    {}
    """
    try:
        with open(path, encoding="utf-8") as f:
            info = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _describe(info: dict) -> str:
    if not info.get("pid"):
        return "a job that is starting"
    return (f"pid {info.get('pid')} on host {info.get('host', '?')}, started "
            f"{info.get('started', '?')}")


def _alive(pid: Any) -> bool:
    """Whether process ``pid`` of this host exists (one of another user's counts)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True             # another user's process, or a pid that says nothing: kept
    return True


class OutputLock:
    """The exclusive lock of one output (``OUT.lock``): `acquire` takes it or raises
    `LockedError` naming the job that holds it; `release` (or the end of a ``with`` block)
    removes it.

    Parameters
    ----------
    path : path
        The lock file (``OUT.lock``, beside OUT and OUT.partial).
    out : path, optional
        The output it protects (for messages; default: ``path`` without ``.lock``).

    Attributes
    ----------
    taken_over : dict
        After `acquire`: what the stale lock that was taken over said (``lock_holder``),
        else {}.

    Examples
    --------
    >>> import os, tempfile
    >>> from dspk.pipeline.lock import OutputLock, lock_holder
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "o.h5.lock")
    >>> with OutputLock(path):
    ...     lock_holder(path)["pid"] == os.getpid()
    True
    >>> os.path.exists(path)
    False
    >>> tmp.cleanup()
    """

    def __init__(self, path: str | os.PathLike, out: str | os.PathLike | None = None
                 ) -> None:
        self.path = Path(path)
        name = self.path.name
        self.out = Path(out) if out is not None else \
            self.path.with_name(name[:-5] if name.endswith(".lock") else name)
        self._fd: int | None = None
        self._exclusive = False          # held as an O_EXCL file (no flock)
        self.taken_over: dict = {}

    # -- taking it -------------------------------------------------------------------------------
    def acquire(self) -> "OutputLock":
        """Take the lock, or raise `LockedError` at once (no waiting) when a live job holds
        it. A stale lock (its process gone) is taken over and said in the log.

        Returns
        -------
        OutputLock
            ``self``.

        Examples
        --------
        >>> import os, tempfile
        >>> from dspk.pipeline.lock import OutputLock
        >>> tmp = tempfile.TemporaryDirectory()
        >>> lock = OutputLock(os.path.join(tmp.name, "o.lock")).acquire()
        >>> lock.held
        True
        >>> lock.release(); tmp.cleanup()
        """
        if self._fd is not None:
            return self
        for _ in range(20):             # the lock file replaced under us: take the new one
            if fcntl is None or not self._flock():
                self._excl()
                break
            if self._fd is not None:
                break
        else:                            # pragma: no cover (a storm of other jobs)
            raise LockedError(f"{self.out}: its lock {self.path} keeps changing; another job "
                              f"is starting on it")
        self._write_holder()
        if self.taken_over:
            log.warning("%s: took over the lock of a job that is gone (%s)", self.out,
                        _describe(self.taken_over))
        return self

    def _flock(self) -> bool:
        """One try with flock; False when the file system has none. Leaves ``_fd`` set when
        the lock is held; None when the file was replaced meanwhile (try again)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                info = lock_holder(self.path)
                raise LockedError(
                    f"{self.out}: another job is writing it ({_describe(info)}; its lock: "
                    f"{self.path}); wait for it to end, or name another output") from None
            if exc.errno in _NO_FLOCK:
                return False
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:                     # released and removed by its holder meanwhile
            os.close(fd)
            return True
        self.taken_over = self._stale_info(fd)
        self._fd = fd
        return True

    def _stale_info(self, fd: int) -> dict:
        """What a lock file we just locked says, when another job wrote it (its process is
        gone: the kernel released its flock)."""
        data = os.pread(fd, 1 << 16, 0)
        try:
            info = json.loads(data.decode("utf-8") or "{}")
        except (ValueError, UnicodeDecodeError):
            return {"pid": None} if data else {}
        return info if isinstance(info, dict) and info.get("pid") else {}

    def _excl(self) -> None:
        """The lock as a file created exclusively; a file left by a process of this host
        that is gone is removed first."""
        for _ in range(3):
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                self._exclusive = True
                return
            except FileExistsError:
                info = lock_holder(self.path)
                if info.get("host") == socket.gethostname() and info.get("pid") and \
                        not _alive(info["pid"]):
                    self.taken_over = info
                    self.path.unlink(missing_ok=True)
                    continue
                raise LockedError(
                    f"{self.out}: another job is writing it ({_describe(info)}; its lock: "
                    f"{self.path}); wait for it to end, or name another output (remove the "
                    f"lock file only if that job is gone)") from None
        raise LockedError(f"{self.out}: its lock {self.path} could not be taken")

    def _write_holder(self) -> None:
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"), "out": str(self.out)}
        data = json.dumps(info).encode("utf-8")
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    # -- giving it back ----------------------------------------------------------------------------
    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file and let the lock go (harmless when not held)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)   # before the unlock: no one locks a dead file
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
