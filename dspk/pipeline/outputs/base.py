"""The contract of an output (`Output`) and the registry of formats (`register_output`), as
the stages have theirs: a `dspk.pipeline.Job` runs one lifecycle for every output, and the
output says only what is its own — where it lies and what it refuses (class attributes read
by the one `Output.check`), what a killed job left of it (`Output.stored`), how it starts
(`Output.begin`), how a chunk is stored (`Output.write`, on the job's writer thread) and how
it is completed (`Output.commit`) or thrown away (`Output.discard`).

An output that lies in the file system is written as ``OUT.partial`` beside ``OUT`` (a file,
`dspk.pipeline.outputs.PartialOutput`, or a folder, `dspk.pipeline.outputs.FolderOutput`) and
renamed when complete; a resumable one records its progress after every chunk
(`Output.committed`).

Examples
--------
>>> from dspk.pipeline.outputs import formats, output_class
>>> formats(listed=True)
('hdf5', 'kilosort', 'nwb', 'zarr')
>>> output_class("kilosort").resumes, output_class("nwb").resumes
(True, False)
"""

from __future__ import annotations

import os
import stat
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

import numpy as np

from ...argnames import arg
from ...io import Recording
from ..checksum import committed_blocks
from ..errors import PipelineError
from ..record import read_fitted
from .partial import FolderOutput, PartialOutput

__all__ = ["Output", "register_output", "unregister_output", "output_class", "formats",
           "OUTPUT_DTYPES", "LAYOUTS", "check_output_options", "int16_scale", "chunk_samples",
           "read_files"]

#: the sample types a job writes
OUTPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.int16))
#: the layouts of stored traces
LAYOUTS = ("samples_channels", "channels_samples")


# -- the job's options for stored traces -----------------------------------------------------------
def check_output_options(output_dtype: Any, layout: str, compression: str | None = None,
                         chunk_s: float = 1.0) -> np.dtype:
    """The output's sample type, after checking the job's output options.

    Parameters
    ----------
    output_dtype : float32 or int16
    layout : {"samples_channels", "channels_samples"}
    compression : None, "gzip" or "lzf"
    chunk_s : float
        The chunk length in seconds (positive).

    Returns
    -------
    numpy.dtype

    Raises
    ------
    PipelineError
        Naming the option and what it takes.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline.outputs import check_output_options
    >>> check_output_options(np.int16, "channels_samples", "gzip", 0.5)
    dtype('int16')
    """
    out_dtype = np.dtype(output_dtype)
    if out_dtype not in OUTPUT_DTYPES:
        raise PipelineError(f"output_dtype: expected float32 or int16, got {out_dtype}")
    if layout not in LAYOUTS:
        raise PipelineError(f"layout: expected 'samples_channels' or 'channels_samples', "
                            f"got {layout!r}")
    if compression not in (None, "gzip", "lzf"):
        raise PipelineError(f"compression: expected None, 'gzip' or 'lzf', got "
                            f"{compression!r}")
    if not (chunk_s > 0):
        raise PipelineError(f"chunk_s: expected a positive chunk length in seconds, got "
                            f"{chunk_s}")
    return out_dtype


def int16_scale(out_dtype: Any, scale: float | None, whitened: bool,
                whitened_step: float = 0.01) -> float:
    """The units of one int16 output step (``scale`` when given; else ``whitened_step`` for
    whitened traces, in units of the noise's standard deviation, and 0.1 µV otherwise); 1
    for float output.

    Parameters
    ----------
    out_dtype : float32 or int16
    scale : float, optional
    whitened : bool
    whitened_step : float
        The default step of whitened traces (the output's: `Output.whitened_step`).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline.outputs import int16_scale
    >>> int16_scale(np.int16, None, True), int16_scale(np.float32, None, True)
    (0.01, 1.0)
    """
    if np.dtype(out_dtype) != np.int16:
        return 1.0
    return float(scale or (whitened_step if whitened else 0.1))


def chunk_samples(chunk_s: float, fs: float) -> int:
    """The chunk length in samples (at least 1).

    Parameters
    ----------
    chunk_s : float
        Seconds.
    fs : float
        The sampling rate in Hz.

    Examples
    --------
    >>> from dspk.pipeline.outputs import chunk_samples
    >>> chunk_samples(0.5, 30000.0)
    15000
    """
    return max(1, int(round(chunk_s * fs)))


# -- the contract ----------------------------------------------------------------------------------
class Output:
    """What a job writes into, and the one place its rules are applied: a subclass is one
    format (its name, `format`, and one `register_output` call make it a format of
    `Pipeline.run` and, when it has a `summary`, of ``dspk preprocess --format``).

    A `dspk.pipeline.Job` drives it: `check` before any work; `stored` when resuming; then
    `begin`, `write` for every chunk in order on the writer thread, each followed by
    `committed`; `close`; and `commit` — or `discard` when the job fails (a resumable
    output's partial is kept instead when a resume could get past the error). `rows`, on the
    compute thread, is what the output keeps of a chunk besides its traces.

    Parameters
    ----------
    out : path, optional
        Where it is written: a file or a folder (`target`); None for an output that lies
        nowhere (one kept in memory).
    overwrite : bool
        Replace an existing output (never a file of the input).

    Attributes
    ----------
    out : pathlib.Path or None
    files : PartialOutput or None
        Its partial file or folder and resume record (None when `target` is None).
    rows : dict
        Each table's rows written so far (what `committed` records).
    blocks : dict
        The committed chunks (what `committed` records and a resume verifies): ``ends``,
        ``crc`` (each chunk's traces' checksum as written: `dspk.pipeline.checksum`),
        ``rows`` (each table's rows after it), ``order`` (one letter a chunk: "s" when its
        checksum was computed over [samples, channels], "c" over [channels, samples]) and
        ``checksum`` (its name: a record with another is not resumed).
    fsync : bool
        Whether `commit` flushes the output to the disk before naming it OUT (default).

    Examples
    --------
    An output of your own (see ``tests/pipeline/test_outputs.py`` for one that resumes): a text file
    of each channel's largest sample.

    >>> import os, tempfile
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.outputs import Output, register_output, unregister_output
    >>> class Peak(Output):
    ...     format = "peak"
    ...     def begin(self, job, done, rows):
    ...         self.top = np.full(job.rec.n_channels, -np.inf)
    ...         return done
    ...     def write(self, s0, s1, block, rows):       # [channels, samples] float32
    ...         self.top = np.maximum(self.top, block.max(axis=1))
    ...     def commit(self):
    ...         np.savetxt(self.files.partial, self.top)
    ...         super().commit()
    >>> _ = register_output(Peak)
    >>> tmp = tempfile.TemporaryDirectory()
    >>> rec = dspk.open_recording(np.eye(3, 3000, dtype=np.float32), fs=3e4)
    >>> p = dspk.Pipeline.from_options(highpass=None, reference="none", whiten="none")
    >>> out = p.run(rec, os.path.join(tmp.name, "peak.txt"), format="peak", progress=False)
    >>> np.loadtxt(out).tolist()
    [1.0, 1.0, 1.0]
    >>> unregister_output("peak")
    >>> tmp.cleanup()
    """

    #: the format's name: ``Pipeline.run(format=...)``
    format: ClassVar[str] = ""
    #: one line for ``dspk preprocess --format``'s help; None: not offered there
    summary: ClassVar[str | None] = None
    #: what OUT is: "file", "folder", or None (nothing of its own to check or commit)
    target: ClassVar[str | None] = "file"
    #: whether a killed job's partial output is continued by ``resume=True`` (its progress
    #: is recorded after every chunk)
    resumes: ClassVar[bool] = False
    #: whether it stores the traces (else a job computes no output blocks for it)
    traces: ClassVar[bool] = True
    #: whether it stores the sinks' rows (else a pipeline with a sink is refused)
    tables: ClassVar[bool] = False
    #: whether it needs the `Detect` sink (its spikes are what it keeps)
    detects: ClassVar[bool] = False
    #: whether it needs the channel positions
    needs_geometry: ClassVar[bool] = False
    #: the layouts it stores, and the reader that fixes them (named when one is refused)
    layouts: ClassVar[tuple] = LAYOUTS
    reader: ClassVar[str] = ""
    #: why it stores no compressed traces (None: it compresses as asked)
    uncompressed: ClassVar[str | None] = "written in place"
    #: its sample type when none is asked, and the int16 step of whitened traces
    default_dtype: ClassVar[Any] = np.float32
    whitened_step: ClassVar[float] = 0.01
    #: a recording's output name is its stem and this (`dspk.dask.preprocess_many`)
    suffix: ClassVar[str] = ""
    #: the file of a folder output that holds the fitted state (None: the partial file)
    fitted_name: ClassVar[str | None] = None
    #: a folder output's files, the one that marks a folder as its own, the program that
    #: writes it and what it is (said by `check`: a folder holding anything else is never
    #: replaced)
    owned: ClassVar[tuple] = ()
    marker: ClassVar[str] = ""
    writer: ClassVar[str] = "dspk"
    what: ClassVar[str] = ""

    def __init__(self, out: str | os.PathLike | None = None, *, overwrite: bool = False
                 ) -> None:
        self.out = None if out is None else Path(out)
        self.overwrite = overwrite
        kind = FolderOutput if self.target == "folder" else PartialOutput
        self.files = None if self.target is None or out is None else kind(out)
        self.rows: dict = {}
        # flush the output to the disk before it is named OUT (`dspk.pipeline.Job`'s fsync)
        self.fsync = True
        # the committed blocks (`committed`): each one's end, crc32 and tables' rows after it
        self.blocks: dict = committed_blocks()

    # -- before any work ---------------------------------------------------------------------------
    def said(self) -> str:
        """How messages name this output: ``format='kilosort'`` (``--format kilosort`` on
        the command line)."""
        return arg("format", self.format)

    @classmethod
    def check_options(cls, pipeline: Any, layout: str, compression: str | None,
                      resume: bool) -> None:
        """Refuse the options this format cannot honour, before the recording is opened:
        a layout it does not store, compression where it writes in place, a pipeline whose
        sinks it would drop (or without the `Detect` it needs), ``resume`` where it does not
        resume.

        Parameters
        ----------
        pipeline : Pipeline
        layout, compression, resume :
            As for `Pipeline.run`.

        Raises
        ------
        PipelineError
            Naming the option and what to do instead.
        """
        said = arg("format", cls.format)
        if layout not in cls.layouts:
            raise PipelineError(f"layout: {said} writes [samples, channels] as {cls.reader} "
                                f"reads it; leave {arg('layout')} out")
        if compression is not None and cls.uncompressed is not None:
            raise PipelineError(f"compression: {said} writes the traces uncompressed "
                                f"({cls.uncompressed}); leave {arg('compression')} out")
        if pipeline.sinks and not cls.tables:
            raise PipelineError(f"detect: {said} holds the traces only; the spikes of "
                                f"{arg('detect', True)} are written to an HDF5 output (leave "
                                f"{arg('format')} out, or {arg('detect')} out: Kilosort "
                                f"detects its own)")
        if cls.detects and pipeline.detector is None:
            raise PipelineError(f"pipeline: has no Detect step ({arg('detect', True)}) to "
                                f"find peaks with")
        if resume and not cls.resumes:
            raise PipelineError(f"resume: {said} is written in one go and cannot be resumed; "
                                f"leave {arg('resume')} out")

    def check(self, rec: Recording | None, inputs: Any = None) -> None:
        """Refuse OUT before any work: any file of the input (any spelling, a symbolic or
        hard link; a folder holding one) or any other file the job reads (``inputs``: a
        probe file, a sidecar), whether ``overwrite`` is set or not; a file where a
        folder is written or anything but a regular file where a file is (OUT and the job's
        own files beside it); an existing output without ``overwrite``; a folder holding
        files the output does not write, or a partial folder holding them; a missing or
        read-only parent folder; and what the format needs of the recording.

        Parameters
        ----------
        rec : Recording, optional
            The input (`Recording.files` lists its files; None: not known yet).
        inputs : mapping or sequence of paths, optional
            Other files the job reads (`read_files`): ``{"--probe": "probe.json"}`` names
            each by its option in the message; a sequence names them "an input".

        Raises
        ------
        PipelineError
        """
        if self.target is not None and self.out is None:
            raise PipelineError(f"out_path: {self.said()} writes a {self.target}: name it")
        if self.files is not None:
            folder = self.target == "folder"
            self._check_inputs(rec, folder)
            self.check_read(inputs)
            files = self.files
            if files.lock.exists() and _not_regular(files.lock) is not None:
                raise PipelineError(f"{files.lock}: is not a regular file ("
                                    f"{_not_regular(files.lock)}); a job keeps its lock "
                                    f"there: remove it or name another output")
            (self._check_folder if folder else self._check_file)()
            out = self.out
            # a folder "." has no name of its own: its parent is the absolute one's
            parent = out.absolute().parent if folder else out.parent
            if not parent.is_dir():
                raise PipelineError(f"{out}: its folder {parent} does not exist (create it "
                                    f"first)")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise PipelineError(f"{out}: its folder {parent} is not writable")
        if self.needs_geometry and rec is not None and rec.geometry is None:
            raise PipelineError(f"geometry: {self.said()} writes {self.reader}'s probe, which "
                                f"needs the channel positions: pass {arg('geometry')}")

    def _check_inputs(self, rec: Recording | None, folder: bool) -> None:
        files = self.files
        own = (files.out, files.partial, files.lock) if folder else \
            (files.out, files.partial, files.progress, files.lock)
        for f in (() if rec is None else rec.files()):
            for path in own:
                if folder and _inside(f, path):
                    raise PipelineError(f"{path}: is or holds a file of the input ({f}); the "
                                        f"input's files are never written, with "
                                        f"{arg('overwrite', True)} or without")
                if not folder and _same_file(f, path):
                    what = "the input" if path == files.out else \
                        f"the input ({path.name} beside it)"
                    raise PipelineError(f"{files.out}: is {what} ({f}); the input's files are "
                                        f"never written, with --overwrite or without")

    def check_read(self, inputs: Any) -> None:
        """Refuse OUT when it is, or (a folder) holds, any other file the job reads —
        ``inputs``: a probe file, a sidecar, a file named by an option — or when one of them
        is a file the job writes beside OUT (``OUT.partial``, its progress record, its lock),
        with ``overwrite`` or without. The part of `check` that needs no recording: a caller
        that starts many jobs (`dspk.dask.preprocess_many`) refuses them all with it before
        any starts, and each job checks again (`check`).

        Parameters
        ----------
        inputs : mapping or sequence of paths, optional
            The files (`read_files`): ``{"--probe": "probe.json"}`` names each by its option
            in the message; a sequence names them "an input".

        Raises
        ------
        PipelineError
            Naming the option and the file.

        Examples
        --------
        >>> import os, tempfile
        >>> from dspk.pipeline.outputs import output_class
        >>> tmp = tempfile.TemporaryDirectory()
        >>> out = output_class("hdf5")(os.path.join(tmp.name, "o.h5"), overwrite=True)
        >>> out.check_read({"--probe": os.path.join(tmp.name, "p.json")})     # accepted
        >>> out.check_read({"--probe": os.path.join(tmp.name, "o.h5.progress.json")})
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dspk.pipeline.PipelineError: --probe: ... is o.h5.progress.json beside OUT ...
        >>> tmp.cleanup()
        """
        files = self.files
        if files is None:                       # an output kept in memory: no file to be
            return
        folder = self.target == "folder"
        own = (files.out, files.partial, files.lock) if folder else \
            (files.out, files.partial, files.progress, files.lock)
        for option, paths in read_files(inputs).items():
            for f in paths:
                for path in own:
                    if (_inside(f, path) if folder else _same_file(f, path)):
                        what = "OUT" if path == files.out else f"{path.name} beside OUT"
                        raise PipelineError(
                            f"{option}: {f} is {'in ' if folder else ''}{what} ({path}); the "
                            f"files a job reads are never written, with "
                            f"{arg('overwrite', True)} or without: name another output")

    def _check_file(self) -> None:
        files = self.files
        for path in (files.out, files.partial, files.progress):
            kind = _not_regular(path)
            if kind == "a directory" and path == files.out:
                raise PipelineError(f"{path}: is a directory; expected an output file name")
            if kind is not None:
                raise PipelineError(f"{path}: is not a regular file ({kind}); the output "
                                    f"must be a new or regular file")
        if files.out.exists() and not self.overwrite:
            raise PipelineError(f"{files.out}: exists; pass overwrite=True (--overwrite) to "
                                f"replace it")

    def _check_folder(self) -> None:
        out, partial = self.files.out, self.files.partial
        if out.exists() and not out.is_dir():
            raise PipelineError(f"{out}: is a file; {self.folder_said()}: name a new or empty "
                                f"folder")
        found = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
        foreign = [name for name in found if name not in self.owned]
        if found and not self.overwrite:
            raise PipelineError(f"{out}: exists and is not empty; name a new or empty folder, "
                                f"or pass {arg('overwrite', True)} to replace {self.what} "
                                f"there")
        if found and (foreign or self.marker not in found):
            listed = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "") \
                if foreign else f"no {self.marker}"
            raise PipelineError(f"{out}: holds files {self.writer} did not write ({listed}); "
                                f"dspk never deletes them, with {arg('overwrite', True)} or "
                                f"without: name another folder")
        if partial.exists() and not partial.is_dir():
            raise PipelineError(f"{partial}: is a file where a job keeps its partial output "
                                f"folder; remove it or name another output")
        if partial.is_dir():
            progress = FolderOutput.PROGRESS
            stray = [p.name for p in partial.iterdir()
                     if p.name not in self.owned + (progress, progress + ".tmp")]
            if stray:
                raise PipelineError(f"{partial}: is not a dspk partial output (it holds "
                                    f"{', '.join(sorted(stray)[:5])}); remove it or name "
                                    f"another output")

    def folder_said(self) -> str:
        """How the folder check names what a folder output is (after "is a file; ")."""
        return f"{self.said()} writes a folder"

    def samples(self, n: int) -> tuple[int, int]:
        """The samples [start, stop) of a recording of ``n`` samples that it holds.

        Parameters
        ----------
        n : int
        """
        return 0, n

    # -- a killed job's partial output -------------------------------------------------------------
    def stored(self, steps: Any = None) -> tuple[dict, list | None]:
        """(progress record, fitted states) of the partial output a killed job left: the
        record `committed` wrote and, given the pipeline's ``steps``, the fitted state stored
        with it (None without them).

        Parameters
        ----------
        steps : sequence of Stage, optional

        Raises
        ------
        OSError, ValueError
            No record, or one that cannot be read.
        """
        record = self.files.read_record()
        if steps is None:
            return record, None
        partial = self.files.partial
        return record, read_fitted(steps, partial if self.fitted_name is None
                                   else partial / self.fitted_name)

    def has_partial(self) -> bool:
        """Whether a partial output lies beside OUT."""
        return self.files is not None and self.files.partial.exists()

    def has_progress(self) -> bool:
        """Whether the partial output records progress (a resume can continue it)."""
        return self.resumes and self.files is not None and self.files.progress.exists()

    # -- the lifecycle -----------------------------------------------------------------------------
    def begin(self, job: Any, done: int, rows: dict) -> int:
        """Start writing: a new partial output (``done`` at `samples`' start), or the partial
        output a killed job left, reopened to continue at ``done`` with ``rows`` of each
        table written. Returns the sample the job continues from (its start, when what was
        left cannot be reopened). ``job`` (`dspk.pipeline.Job`) says what is written: its
        recording, pipeline, fitted ``states``, ``record``, prepared pipeline and the stored
        traces' dtype, scale, layout and compression.

        Parameters
        ----------
        job : Job
        done : int
        rows : dict
        """
        return done

    def rows_of(self, run: Any, full: Any, s0: int, s1: int, m: int) -> list:
        """What the output keeps of chunk [s0, s1) besides its traces, on the compute thread
        (where the processed block ``full``, with its halo of ``m`` samples, lies): the
        sinks' rows (`dspk.pipeline.prepared.PreparedPipeline.rows`), for `write`.

        Parameters
        ----------
        run : PreparedPipeline
        full : array [channels, s1 - s0 + 2 m]
        s0, s1, m : int
        """
        return run.rows(full, s0, s1, m)

    def write(self, s0: int, s1: int, block: Any, rows: list) -> None:
        """Store chunk [s0, s1), on the job's writer thread, chunks in order: ``block``, its
        traces as the job's staging left them (None when the output stores no traces), and
        ``rows`` (`rows_of`).

        Parameters
        ----------
        s0, s1 : int
        block : numpy.ndarray or None
        rows : list
        """

    def committed(self, record: dict, done: int, crc: int | None = None,
                  order: str = "channels_samples") -> None:
        """The chunks before ``done`` are stored: a resumable output records it with the
        job's ``record``, the rows written and the committed blocks (`blocks`: the last one
        ends at ``done``, its traces' checksum ``crc``) — after their data, so a resume never
        starts past what is written.

        Parameters
        ----------
        record : dict
            The job's record (`dspk.pipeline.record.job_record`).
        done : int
        crc : int, optional
            crc32 of the chunk's traces as written (None: not checked on a resume).
        order : {"channels_samples", "samples_channels"}
            The order of the samples ``crc`` was computed over.
        """
        blocks = self.blocks
        blocks["ends"].append(int(done))
        blocks["crc"].append(crc)
        blocks["rows"].append(dict(self.rows))
        blocks["order"] += order[0]
        if self.resumes:
            self.files.record({**record, "blocks": blocks}, done, self.rows)

    def read_back(self, s0: int, s1: int) -> Any:
        """The traces of samples [s0, s1) as stored in the open output, in the file's layout
        (after `begin`; a resume checks them against their recorded crc32), or None where the
        output cannot read them back (the blocks are then not verified).

        Parameters
        ----------
        s0, s1 : int
        """
        return None

    def close(self) -> None:
        """Close what `begin` opened, whether the job completes or stops — also when `begin`
        itself failed, and again harmlessly."""

    def commit(self) -> None:
        """Complete the output: rename the partial output to OUT (flushed to the disk first
        unless `fsync` is False)."""
        if self.files is not None:
            self.files.commit(fsync=self.fsync)

    def discard(self) -> None:
        """Delete what a job left of this output (its partial output and record)."""
        if self.files is not None:
            self.files.discard()

    @contextmanager
    def writing(self, keep: Callable[[BaseException], bool] | None = None
                ) -> Iterator["Output"]:
        """A block that writes this output: closed and committed when the block completes;
        when it raises, closed and discarded — unless ``keep(exception)`` says a resume could
        get past the error — and the error goes on.

        Parameters
        ----------
        keep : callable, optional
            ``keep(exc) -> bool``: keep the partial output for a resume.
        """
        try:
            yield self
            self.close()
            self.commit()
        except BaseException as exc:
            self.close()
            if keep is None or not keep(exc):
                self.discard()
            raise


def read_files(inputs: Any) -> dict:
    """``inputs`` (other files a job reads) as {what names them: [paths]}: a mapping's keys
    are its options (``"--probe"``, ``"geometry"``); a path or a sequence of paths are "an
    input"; None values are left out.

    Parameters
    ----------
    inputs : mapping, path, sequence of paths or None

    Examples
    --------
    >>> from dspk.pipeline.outputs.base import read_files
    >>> read_files({"--probe": "p.json", "--events": None})
    {'--probe': ['p.json']}
    >>> read_files(["a.csv"])
    {'inputs': ['a.csv']}
    """
    if inputs is None:
        return {}
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not hasattr(inputs, "items"):
        inputs = {"inputs": list(inputs)}
    named: dict = {}
    for option, paths in inputs.items():
        if paths is None:
            continue
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        try:
            listed = [p for p in paths if p is not None]
        except TypeError:
            raise PipelineError(f"inputs: expected paths by option, got {option}={paths!r}"
                                ) from None
        for p in listed:
            if not isinstance(p, (str, os.PathLike)):
                raise PipelineError(f"inputs: expected paths, got {option}={p!r}")
        if listed:
            named[str(option)] = listed
    return named


def _inside(path: Any, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies below it (links resolved)."""
    p, d = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return p == d or d in p.parents


def _not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists and is not a regular file (links followed), else
    None."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:      # a dangling or looping link, no permission: not writable
        return f"cannot be examined: {exc.strerror}"
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def _same_file(a: Any, b: Any) -> bool:
    """Whether two paths name one file: the same real path (links and ``..`` resolved), or
    the same inode (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:     # one of them does not exist
        return False


# -- the registry ----------------------------------------------------------------------------------
_OUTPUTS: dict[str, type] = {}
_LOCK = threading.Lock()


def register_output(cls: type) -> type:
    """Add an output class to the registry under its `Output.format` name: `Pipeline.run`
    writes it (``format=``), and ``dspk preprocess --format`` offers it when it has a
    `Output.summary`.

    Parameters
    ----------
    cls : type
        An `Output` subclass.

    Returns
    -------
    type
        ``cls``.

    Raises
    ------
    PipelineError
        Not an `Output` class, no format name, or a name already registered.

    Examples
    --------
    >>> from dspk.pipeline.outputs import Output, formats, register_output, unregister_output
    >>> class Nothing(Output):
    ...     format, target = "nothing", None
    >>> _ = register_output(Nothing)
    >>> formats()[-1]
    'nothing'
    >>> unregister_output("nothing")
    """
    if not (isinstance(cls, type) and issubclass(cls, Output)):
        raise PipelineError(f"register_output: {cls!r} is not an Output class")
    if not isinstance(cls.format, str) or not cls.format:
        raise PipelineError(f"register_output: {cls.__name__} has no format name")
    with _LOCK:
        if cls.format in _OUTPUTS:
            raise PipelineError(f"register_output: a format named {cls.format!r} is "
                                f"registered ({_OUTPUTS[cls.format].__name__})")
        _OUTPUTS[cls.format] = cls
    return cls


def unregister_output(format: str) -> None:
    """Remove a format from the registry (a test's own, say).

    Parameters
    ----------
    format : str

    Examples
    --------
    >>> from dspk.pipeline.outputs import unregister_output
    >>> unregister_output("not registered")          # nothing to remove: nothing happens
    """
    with _LOCK:
        _OUTPUTS.pop(format, None)


def output_class(format: str) -> type:
    """The output class registered under ``format``.

    Parameters
    ----------
    format : str

    Raises
    ------
    PipelineError
        An unknown format (the message lists the registered ones).

    Examples
    --------
    >>> from dspk.pipeline.outputs import output_class
    >>> output_class("hdf5").__name__
    'HDF5Output'
    >>> output_class("phy")          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: format: expected one of 'hdf5', 'kilosort', 'nwb', ..., got 'phy'
    """
    with _LOCK:
        cls = _OUTPUTS.get(format) if isinstance(format, str) else None
        if cls is None:
            raise PipelineError(f"format: expected one of "
                                f"{', '.join(map(repr, _OUTPUTS))}, got {format!r}")
    return cls


def formats(listed: bool = False) -> tuple:
    """The registered formats, in the order they were registered.

    Parameters
    ----------
    listed : bool
        Only those ``dspk preprocess --format`` offers (with a `Output.summary`).

    Examples
    --------
    >>> from dspk.pipeline.outputs import formats
    >>> formats()[:3]
    ('hdf5', 'kilosort', 'nwb')
    """
    with _LOCK:
        return tuple(name for name, cls in _OUTPUTS.items()
                     if not listed or cls.summary is not None)
