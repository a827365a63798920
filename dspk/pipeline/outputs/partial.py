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
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["PartialOutput", "FolderOutput"]


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
    out, partial, progress : pathlib.Path
        The output, its partial file and its resume record.

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

    def discard(self) -> None:
        """Delete the partial file and the resume record (those that exist)."""
        for p in (self.partial, self.progress):
            p.unlink(missing_ok=True)

    def commit(self) -> Path:
        """Rename the partial file to the output (atomically) and drop the resume record."""
        self.partial.replace(self.out)
        self.progress.unlink(missing_ok=True)
        return self.out

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
        """Write the resume record: the job, how far its committed chunks reach and the rows
        of each table written by then (atomically: the old record or the new one)."""
        tmp = self.progress.with_name(self.progress.name + ".tmp")
        tmp.write_text(json.dumps({**job, "done": done, "rows": rows}))
        os.replace(tmp, self.progress)

    def read_record(self) -> dict:
        """The resume record (`OSError` when there is none, `ValueError` when unreadable)."""
        return json.loads(self.progress.read_text())


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

    def commit(self) -> Path:
        """Drop the resume record and rename the partial folder to the output: in place of
        an empty folder, or of an earlier dspk output (moved aside, then deleted)."""
        self.progress.unlink(missing_ok=True)
        out = self.out
        if out.is_dir() and any(out.iterdir()):
            aside = Path(tempfile.mkdtemp(prefix=out.name + ".replaced-", dir=out.parent))
            out.rename(aside / out.name)
            self.partial.rename(out)
            shutil.rmtree(aside)
            return out
        if out.is_dir():
            out.rmdir()
        self.partial.rename(out)
        return out
