"""Where an output lies while a job writes it: ``OUT.partial`` beside ``OUT`` — a file
(`PartialOutput`) or a folder (`FolderOutput`) — renamed ``OUT`` when complete, with the
resume record of a resumable job; the one place where output files are committed or
discarded (`dspk.pipeline.outputs.Output` holds one).

Examples
--------
>>> import os, tempfile
>>> from dspk.pipeline.outputs import PartialOutput
>>> tmp = tempfile.TemporaryDirectory()
>>> files = PartialOutput(os.path.join(tmp.name, "out.h5"))
>>> files.record({"chunk": 3000}, 6000, {})
>>> files.read_record()["done"], sorted(os.listdir(tmp.name))
(6000, ['out.h5.progress.json'])
>>> tmp.cleanup()
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["PartialOutput", "FolderOutput", "fsync_path", "record_check"]


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file, or a folder's entries, to the disk (``os.fsync``): after it, a power cut
    cannot lose what was written to it (or the names made in it).

    Parameters
    ----------
    path : path
        A file or a folder.

    Examples
    --------
    >>> import tempfile
    >>> from dspk.pipeline.outputs.partial import fsync_path
    >>> with tempfile.TemporaryDirectory() as d:
    ...     fsync_path(d)
    """
    folder = os.path.isdir(path)
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if folder else 0))
    try:
        os.fsync(fd)
    except OSError:               # a folder some file systems cannot fsync: nothing to do
        if not folder:
            raise
    finally:
        os.close(fd)


def record_check(record: dict) -> int:
    """The checksum of a resume record (crc32 of its JSON, keys sorted, without its own
    ``check``): a record edited by hand or damaged no longer matches it.

    Parameters
    ----------
    record : dict

    Examples
    --------
    >>> from dspk.pipeline.outputs.partial import record_check
    >>> record_check({"done": 3000}) == record_check({"done": 3000, "check": 1})
    True
    >>> record_check({"done": 3000}) == record_check({"done": 6000})
    False
    """
    body = {k: v for k, v in record.items() if k != "check"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode("utf-8"))


class PartialOutput:
    """An output written as ``OUT.partial`` and renamed ``OUT`` when complete, with the resume
    record ``OUT.progress.json`` beside it (a resumable job's; the other writers leave
    none). The one place where output files are committed or discarded.

    Parameters
    ----------
    out : path
        The final output file.

    Attributes
    ----------
    out, partial, progress, lock : pathlib.Path
        The output, its partial file, its resume record and the lock of the job writing it
        (`dspk.pipeline.lock.OutputLock`).

    Examples
    --------
    >>> import os, tempfile
    >>> from dspk.pipeline.outputs import PartialOutput
    >>> tmp = tempfile.TemporaryDirectory()
    >>> files = PartialOutput(os.path.join(tmp.name, "out.h5"))
    >>> files.partial.name, files.progress.name
    ('out.h5.partial', 'out.h5.progress.json')
    >>> try:
    ...     with files.writing() as partial:      # a failure: nothing that looks complete
    ...         _ = open(partial, "w").write("half")
    ...         raise OSError("disk full")
    ... except OSError:
    ...     pass
    >>> os.listdir(tmp.name)
    []
    >>> tmp.cleanup()
    """

    def __init__(self, out: str | os.PathLike) -> None:
        self.out = Path(out)
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.progress = self.out.with_name(self.out.name + ".progress.json")
        self.lock = self.out.with_name(self.out.name + ".lock")

    def discard(self) -> None:
        """Delete the partial file and the resume record (those that exist)."""
        for p in (self.partial, self.progress):
            p.unlink(missing_ok=True)

    def commit(self, fsync: bool = True) -> Path:
        """Rename the partial file to the output (atomically) and drop the resume record;
        with ``fsync``, the partial file and its folder are flushed to the disk first, and
        the folder again after the rename, so that a power cut never leaves an output that
        looks complete and is not (nor loses the rename).

        Parameters
        ----------
        fsync : bool
        """
        if fsync:
            fsync_path(self.partial)
            fsync_path(self.out.absolute().parent)
        self.partial.replace(self.out)
        self.progress.unlink(missing_ok=True)
        if fsync:
            fsync_path(self.out.absolute().parent)
        return self.out

    def sizes(self) -> dict:
        """The sizes in bytes of the partial output's files (by name; a resume checks that
        none is shorter than its record says)."""
        try:
            return {self.partial.name: self.partial.stat().st_size}
        except OSError:
            return {}

    @contextmanager
    def writing(self, keep: Callable[[BaseException], bool] | None = None) -> Iterator[Path]:
        """A block that writes the partial file (its path is yielded): committed when the
        block completes; when it raises, the partial file is discarded — unless
        ``keep(exception)`` says a resume could get past the error — and the error goes on.

        Parameters
        ----------
        keep : callable, optional
            ``keep(exc) -> bool``: keep the partial file and record for a resume.

        Examples
        --------
        >>> import os, tempfile
        >>> from dspk.pipeline.job import resumable
        >>> from dspk.pipeline.outputs import PartialOutput
        >>> tmp = tempfile.TemporaryDirectory()
        >>> files = PartialOutput(os.path.join(tmp.name, "out.h5"))
        >>> try:
        ...     with files.writing(keep=resumable):
        ...         _ = open(files.partial, "w").write("half")
        ...         raise KeyboardInterrupt
        ... except KeyboardInterrupt:
        ...     pass
        >>> os.listdir(tmp.name)                  # kept for a resume
        ['out.h5.partial']
        >>> tmp.cleanup()
        """
        try:
            yield self.partial
        except BaseException as exc:
            if keep is None or not keep(exc):
                self.discard()
            raise
        self.commit()

    def record(self, job: dict, done: int, rows: dict) -> None:
        """Write the resume record: the job (with the committed ``blocks`` an output keeps
        there: each one's end, crc32 and the tables' rows after it, which
        `dspk.pipeline.Job` verifies on a resume), how far its committed chunks reach, the
        rows of each table written by then, the sizes of the partial output's files and the
        record's own checksum (`record_check`) — atomically: the old record or the new one.

        Parameters
        ----------
        job : dict
        done : int
        rows : dict
        """
        record = {**job, "done": done, "rows": rows, "sizes": self.sizes()}
        record["check"] = record_check(record)
        tmp = self.progress.with_name(self.progress.name + ".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.progress)

    def read_record(self) -> dict:
        """The resume record (`OSError` when there is none, `ValueError` when unreadable or
        when its checksum says it was edited or damaged)."""
        record = json.loads(self.progress.read_text())
        if not isinstance(record, dict):
            raise ValueError("not a resume record")
        if "check" not in record:
            raise ValueError("it has no checksum (a record of an older dspk, or edited)")
        if record.get("check") != record_check(record):
            raise ValueError("its checksum does not match: the record was edited or damaged")
        return record


class FolderOutput(PartialOutput):
    """An output folder written as ``OUT.partial/`` and renamed ``OUT`` when complete, its
    resume record ``progress.json`` inside the partial folder (`PartialOutput` for a
    folder: `writing`, `record` and `read_record` work the same way).

    Parameters
    ----------
    out : path
        The final output folder.

    Examples
    --------
    >>> import os, tempfile
    >>> from dspk.pipeline.outputs import FolderOutput
    >>> tmp = tempfile.TemporaryDirectory()
    >>> files = FolderOutput(os.path.join(tmp.name, "ks"))
    >>> with files.writing() as partial:
    ...     partial.mkdir()
    ...     _ = (partial / "params.py").write_text("offset = 0\\n")
    >>> sorted(os.listdir(tmp.name)), os.listdir(files.out)
    (['ks'], ['params.py'])
    >>> tmp.cleanup()
    """

    #: the resume record's name inside the partial folder
    PROGRESS = "progress.json"

    def __init__(self, out: str | os.PathLike) -> None:
        super().__init__(out)
        self.progress = self.partial / self.PROGRESS

    def discard(self) -> None:
        """Delete the partial folder (`dspk.pipeline.outputs.Output.check` refused one
        holding other files)."""
        if self.partial.is_dir():
            shutil.rmtree(self.partial)

    def commit(self, fsync: bool = True) -> Path:
        """Drop the resume record and rename the partial folder to the output: in place of
        an empty folder, or of an earlier dspk output (moved aside, then deleted). With
        ``fsync``, every file of the partial folder, the folder itself and its parent are
        flushed to the disk first, and the parent again after the rename.

        Parameters
        ----------
        fsync : bool
        """
        self.progress.unlink(missing_ok=True)
        if fsync:
            for root, _, names in os.walk(self.partial):
                for name in names:
                    fsync_path(os.path.join(root, name))
                fsync_path(root)
            fsync_path(self.out.absolute().parent)
        out = self.out
        if out.is_dir() and any(out.iterdir()):
            aside = Path(tempfile.mkdtemp(prefix=out.name + ".replaced-", dir=out.parent))
            out.rename(aside / out.name)
            self.partial.rename(out)
            shutil.rmtree(aside)
        else:
            if out.is_dir():
                out.rmdir()
            self.partial.rename(out)
        if fsync:
            fsync_path(out.absolute().parent)
        return out

    def sizes(self) -> dict:
        """The sizes in bytes of the partial folder's files, by name (the resume record's
        own left out)."""
        found = {}
        if self.partial.is_dir():
            for p in self.partial.iterdir():
                if p.is_file() and not p.name.startswith(self.PROGRESS):
                    found[p.name] = p.stat().st_size
        return found
