"""A job's output file: refused before any work when it could destroy something
(`check_output`), written as ``OUT.partial`` and renamed when complete (`PartialOutput`), with
what it was made from (`job_record`, `write_metadata`) and its datasets written chunk by chunk
(`TraceOutput`: ``/traces`` and the sinks' tables).

Nothing here knows the steps: `dspk.pipeline.Job` runs a pipeline into these files, and
`dspk.dask` writes its outputs through them too.

Examples
--------
>>> import os, tempfile
>>> from dspk.pipeline.output import PartialOutput
>>> tmp = tempfile.TemporaryDirectory()
>>> files = PartialOutput(os.path.join(tmp.name, "out.h5"))
>>> with files.writing() as partial:          # renamed when the block completes
...     _ = open(partial, "w").write("done")
>>> sorted(os.listdir(tmp.name))
['out.h5']
>>> tmp.cleanup()
"""

from __future__ import annotations

import json
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .._version import __version__
from ..backend import blocked_transpose
from ..io import Recording
from ..io.rawio import RawDatasetWriter, create_contiguous, create_dataset, raw_offset
from .errors import PipelineError

__all__ = ["OUTPUT_DTYPES", "LAYOUTS", "UNITS_UV", "UNITS_WHITENED", "check_output",
           "check_output_options", "int16_scale", "chunk_samples", "PartialOutput",
           "job_record", "write_metadata", "channel_ids", "TraceOutput", "write_traces"]

#: the sample types a job writes
OUTPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.int16))
#: the layouts of ``/traces``
LAYOUTS = ("samples_channels", "channels_samples")
#: the ``units`` attribute of ``/traces``: what ``raw x gain_to_uv`` is in, µV (as
#: SpikeInterface writes it) or, after whitening, the noise's standard deviation
UNITS_UV, UNITS_WHITENED = "uV", "whitened (noise SD)"


# -- before any work ---------------------------------------------------------------------------
def check_output(out: str | os.PathLike, rec: Recording | None, overwrite: bool) -> Path:
    """Refuse an output path before any work: any file of the input recording (its data,
    its SpikeGLX ``.meta``, its Open Ephys ``structure.oebin``, settings and timestamps; any
    spelling, a symbolic or hard link), whether ``overwrite`` is set or not; anything that is
    not a regular file (a directory, a device, a FIFO); an existing file without
    ``overwrite``; a missing or read-only folder. The job's own files beside the output
    (``OUT.partial``, ``OUT.progress.json``) are checked likewise.

    Parameters
    ----------
    out : path
        The output file.
    rec : Recording, optional
        The input (`Recording.files` lists its files).
    overwrite : bool
        Whether an existing output may be replaced.

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    PipelineError

    Examples
    --------
    >>> import tempfile
    >>> from dspk.pipeline.output import check_output
    >>> tmp = tempfile.TemporaryDirectory()
    >>> check_output(tmp.name, None, overwrite=True)          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: ...: is a directory; expected an output file name
    >>> check_output("/dev/null", None, overwrite=True)      # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: /dev/null: is not a regular file (a character device); ...
    >>> tmp.cleanup()
    """
    out = Path(out)
    inputs = _input_files(rec)
    files = PartialOutput(out)
    for path in (out, files.partial, files.progress):
        for f in inputs:
            if _same_file(f, path):
                what = "the input" if path == out else f"the input ({path.name} beside it)"
                raise PipelineError(f"{out}: is {what} ({f}); the input's files are never "
                                    f"written, with --overwrite or without")
        kind = _not_regular(path)
        if kind == "a directory" and path == out:
            raise PipelineError(f"{out}: is a directory; expected an output file name")
        if kind is not None:
            raise PipelineError(f"{path}: is not a regular file ({kind}); the output must be "
                                f"a new or regular file")
    if out.exists() and not overwrite:
        raise PipelineError(f"{out}: exists; pass overwrite=True (--overwrite) to replace it")
    folder = out.parent
    if not folder.is_dir():
        raise PipelineError(f"{out}: its folder {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PipelineError(f"{out}: its folder {folder} is not writable")
    return out


def _input_files(rec: Recording | None) -> tuple:
    """Every file of the input (none for an in-memory one)."""
    if rec is None:
        return ()
    return tuple(rec.files())


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
    >>> from dspk.pipeline.output import check_output_options
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


def int16_scale(out_dtype: Any, scale: float | None, whitened: bool) -> float:
    """The units of one int16 output step (``scale`` when given; else 0.01 for whitened
    traces, in units of the noise's standard deviation, and 0.1 µV otherwise); 1 for float
    output.

    Parameters
    ----------
    out_dtype : float32 or int16
    scale : float, optional
    whitened : bool

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline.output import int16_scale
    >>> int16_scale(np.int16, None, True), int16_scale(np.float32, None, True)
    (0.01, 1.0)
    """
    if np.dtype(out_dtype) != np.int16:
        return 1.0
    return float(scale or (0.01 if whitened else 0.1))


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
    >>> from dspk.pipeline.output import chunk_samples
    >>> chunk_samples(0.5, 30000.0)
    15000
    """
    return max(1, int(round(chunk_s * fs)))


# -- the partial file and its resume record ------------------------------------------------------
class PartialOutput:
    """An output written as ``OUT.partial`` and renamed ``OUT`` when complete, with the resume
    record ``OUT.progress.json`` beside it (a resumable job's; the other writers leave
    none). The one place where outputs are committed or discarded.

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
    >>> from dspk.pipeline.output import PartialOutput
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
        >>> from dspk.pipeline.output import PartialOutput
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
        _write_json(self.progress, {**job, "done": done, "rows": rows})

    def read_record(self) -> dict:
        """The resume record (`OSError` when there is none, `ValueError` when unreadable)."""
        return json.loads(self.progress.read_text())


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


# -- what an output holds ------------------------------------------------------------------------
def job_record(fingerprint: str, rec: Recording, chunk: int, out_dtype: Any, scale: float,
               layout: str, compression: str | None) -> dict:
    """What an output was made from and how (its ``job`` attribute; a resumed job must
    match it).

    Parameters
    ----------
    fingerprint : str
        `Pipeline.fingerprint` of the fitted pipeline.
    rec : Recording
        The input.
    chunk : int
        The chunk length in samples.
    out_dtype, scale, layout, compression :
        How the traces are stored.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.output import job_record
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
    >>> sorted(job_record("f00d", rec, 1500, np.float32, 1.0, "samples_channels", None))
    ... # doctest: +NORMALIZE_WHITESPACE
    ['chunk', 'compression', 'dspk', 'fingerprint', 'input', 'layout', 'n_channels',
     'n_samples', 'output_dtype', 'scale']
    """
    return {"dspk": __version__, "fingerprint": fingerprint, "chunk": chunk,
            "input": getattr(rec, "source", ""), "n_samples": rec.n_samples,
            "n_channels": rec.n_channels, "output_dtype": np.dtype(out_dtype).name,
            "scale": scale, "layout": layout, "compression": compression}


def write_metadata(f: Any, rec: Recording, job: dict, steps: list,
                   units: str = UNITS_UV) -> None:
    """The output's attributes (version, rate, layout, the pipeline's steps, the job record),
    those of ``/traces`` that make the output readable by `dspk.open_recording` and say its
    units, the geometry, and the channels' ids and shanks. The pipeline's fitted state
    follows (`Pipeline.write_fitted`).

    What a reader finds (``dspk.spikeinterface.read_dspk`` reads all of it):

    - ``/traces`` attributes ``fs``, ``layout``, ``gain_to_uv`` (the units of one stored
      step: 1 for float32, the int16 scale), ``geometry`` (when known) and ``units``
      (`UNITS_UV`, or `UNITS_WHITENED`: whitened traces are in units of the noise's standard
      deviation, not µV, whatever ``gain_to_uv`` is called);
    - ``/geometry`` [channels, 2] µm (when known);
    - ``/channel_ids`` [channels]: the input's channel ids (`channel_ids`: int64, or UTF-8
      strings);
    - ``/shank_ids`` [channels] int64, when the input says them (`Recording.shank_ids`).

    Parameters
    ----------
    f : h5py.File
        The output, ``/traces`` created.
    rec : Recording
        The input.
    job : dict
        `job_record`.
    steps : list of dict
        `Pipeline.options`.
    units : str
        The ``units`` attribute of ``/traces`` (`UNITS_UV` or `UNITS_WHITENED`).

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np, dspk
    >>> from dspk.pipeline.output import job_record, write_metadata
    >>> tmp = tempfile.TemporaryDirectory()
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
    >>> job = job_record("f00d", rec, 1500, np.float32, 1.0, "samples_channels", None)
    >>> with h5py.File(os.path.join(tmp.name, "o.h5"), "w") as f:
    ...     _ = f.create_dataset("traces", (3000, 2), np.float32)
    ...     write_metadata(f, rec, job, [])
    ...     float(f["traces"].attrs["fs"]), f.attrs["layout"], f["traces"].attrs["units"]
    ...     f["channel_ids"][()]
    (30000.0, 'samples_channels', 'uV')
    array([0, 1])
    >>> tmp.cleanup()
    """
    if units not in (UNITS_UV, UNITS_WHITENED):
        raise PipelineError(f"units: expected {UNITS_UV!r} or {UNITS_WHITENED!r}, got "
                            f"{units!r}")
    # the order of creation is part of the file's bytes (two runs write the same file)
    f.attrs["dspk_version"] = __version__
    f.attrs["fs"] = rec.fs
    f.attrs["layout"] = job["layout"]
    f.attrs["pipeline"] = json.dumps(steps)
    f.attrs["job"] = json.dumps(job)
    traces = f["traces"]
    traces.attrs["fs"] = rec.fs                 # readable by dspk.open_recording
    traces.attrs["layout"] = job["layout"]
    traces.attrs["gain_to_uv"] = job["scale"]
    if rec.geometry is not None:
        f["traces"].attrs["geometry"] = rec.geometry
        create_dataset(f, "geometry", data=rec.geometry)
    # after what earlier versions wrote (their objects keep their places in the file)
    traces.attrs["units"] = units
    create_dataset(f, "channel_ids", data=channel_ids(rec))
    if rec.shank_ids is not None:
        create_dataset(f, "shank_ids", data=np.asarray(rec.shank_ids, dtype=np.int64))


def channel_ids(rec: Recording) -> np.ndarray:
    """The channel ids an output stores for ``rec``: its `Recording.channel_ids` (integers
    as int64, anything else as fixed-length UTF-8 strings, which h5py stores as such), or
    the channel indices when it names none.

    Parameters
    ----------
    rec : Recording

    Returns
    -------
    numpy.ndarray
        int64, or bytes (``S``) with h5py's UTF-8 string dtype.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.output import channel_ids
    >>> rec = dspk.open_recording(np.zeros((3000, 3), np.int16), fs=30000.0)
    >>> channel_ids(rec)
    array([0, 1, 2])
    >>> rec.channel_ids = np.array(["AP0", "AP1", "µ2"])
    >>> channel_ids(rec)
    array([b'AP0', b'AP1', b'\\xc2\\xb52'], dtype='|S3')
    """
    ids = rec.channel_ids
    if ids is None:
        return np.arange(rec.n_channels, dtype=np.int64)
    ids = np.asarray(ids)
    if ids.shape != (rec.n_channels,):
        raise PipelineError(f"channel_ids: expected one id per channel ({rec.n_channels}), "
                            f"got shape {ids.shape}")
    if ids.dtype.kind in "iu":
        return ids.astype(np.int64)
    encoded = [str(v).encode("utf-8") for v in ids]
    import h5py  # noqa: PLC0415 (h5py deferred: imported when an output is written)

    width = max(1, max((len(v) for v in encoded), default=1))
    return np.array(encoded, dtype=h5py.string_dtype("utf-8", width))


class TraceOutput:
    """The datasets of a job's open HDF5 output, written chunk by chunk in order:
    ``/traces`` (through ``os.pwrite``, outside the GIL, when contiguous; through h5py when
    compressed) and the sinks' tables (`dspk.pipeline.Table`: ``/spikes``, ``/features``,
    ``/feature_channels`` of a detecting job), row for row.

    Parameters
    ----------
    f : h5py.File
        The open partial file.
    path : path
        Its name (the contiguous traces are written through their own descriptor).
    layout : {"samples_channels", "channels_samples"}
    transposed : bool
        Whether the blocks given to `write` are in the file's layout already (the GPU
        transposes on the device), else [channels, samples].

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np
    >>> from dspk.pipeline.output import TraceOutput
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "o.h5")
    >>> with h5py.File(path, "w") as f:
    ...     TraceOutput.create_traces(f, (6, 2), np.float32, "samples_channels", 3, None)
    ...     out = TraceOutput(f, path, "samples_channels", transposed=False)
    ...     out.write(0, 3, np.ones((2, 3), np.float32))      # [channels, samples]
    ...     out.close()
    ...     f["traces"][:4, 0].tolist()
    [1.0, 1.0, 1.0, 0.0]
    >>> tmp.cleanup()
    """

    def __init__(self, f: Any, path: str | os.PathLike, layout: str,
                 transposed: bool) -> None:
        self.f, self.layout, self.transposed = f, layout, transposed
        self.traces = f["traces"]
        self._raw = RawDatasetWriter(str(path), self.traces) \
            if raw_offset(self.traces) is not None else None
        self.tables: list = []

    @staticmethod
    def create_traces(f: Any, shape: tuple, dtype: Any, layout: str, chunk: int,
                      compression: str | None) -> None:
        """``/traces``: contiguous and allocated when uncompressed (each chunk's write lands
        directly), else in HDF5 chunks of the job's chunk length (no write touches part of
        an HDF5 chunk, which would be read back, modified and rewritten)."""
        if compression is None:
            create_contiguous(f, "traces", shape, dtype)
            return
        c = shape[1] if layout == "samples_channels" else shape[0]
        n = shape[0] if layout == "samples_channels" else shape[1]
        rows = min(n, chunk)
        create_dataset(f, "traces", shape=shape, dtype=dtype,
                       chunks=(rows, c) if layout == "samples_channels" else (c, rows),
                       compression=compression)

    def open_tables(self, tables: Sequence[Any], rows: dict) -> None:
        """The sinks' tables (`dspk.pipeline.Table`), made when missing and cut to the rows
        a resume record counts (rows past it were written by chunks after it)."""
        f = self.f
        for t in tables:
            if t.name not in f:
                create_dataset(f, t.name, shape=(0,) + tuple(t.shape),
                               maxshape=(None,) + tuple(t.shape), dtype=t.dtype,
                               chunks=(t.chunk,) + tuple(t.shape))
            f[t.name].resize(int(rows.get(t.name, 0)), axis=0)
        self.tables = list(tables)

    def write(self, s0: int, s1: int, y: np.ndarray) -> None:
        """Samples [s0, s1) of the traces."""
        write_traces(self._raw, self.traces, s0, s1, y, self.layout, self.transposed)

    def append(self, rows: Sequence[np.ndarray]) -> dict:
        """Append a chunk's rows, one array per table (in `open_tables`' order); returns
        each table's rows written so far."""
        f = self.f
        # HDF5 writes (and places) a dataset's cached chunks when the dataset closes, so the
        # order of those closes is part of the file's bytes: the first table (the index:
        # /spikes) is held open while the tables row-aligned with it are written through
        # dataset objects closed at once (the order 0.5.0 wrote them in: the same file)
        held = f[self.tables[0].name] if self.tables else None
        counts = {}
        for k, (t, values) in enumerate(zip(self.tables, rows)):
            total = f[t.name].shape[0] + len(values)
            (held if k == 0 else f[t.name]).resize(total, axis=0)
            (held if k == 0 else f[t.name])[total - len(values):] = values
            counts[t.name] = total
        return counts

    def close(self) -> None:
        """Close the raw writer's descriptor (the file stays open)."""
        if self._raw is not None:
            self._raw.close()


def write_traces(raw: RawDatasetWriter | None, dset: Any, s0: int, s1: int, y: np.ndarray,
                 layout: str, transposed: bool) -> None:
    """A chunk of traces into the output (``raw.write`` when contiguous, else h5py), in the
    file's layout; y is [samples, channels] already when ``transposed``, else [channels,
    samples].

    Parameters
    ----------
    raw : RawDatasetWriter or None
    dset : h5py.Dataset
    s0, s1 : int
    y : numpy.ndarray
    layout : {"samples_channels", "channels_samples"}
    transposed : bool

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline.output import write_traces
    >>> d = np.zeros((4, 2), np.float32)                 # any array-like dataset
    >>> write_traces(None, d, 1, 3, np.ones((2, 2), np.float32), "samples_channels", False)
    >>> d[:, 0].tolist()
    [0.0, 1.0, 1.0, 0.0]
    """
    if layout == "samples_channels":
        rows = y if transposed else blocked_transpose(y)
        if raw is not None:
            raw.write(s0, rows, axis=0)
        else:
            dset[s0:s1] = rows
    elif raw is not None:
        raw.write(s0, y, axis=1)
    else:
        dset[:, s0:s1] = y
