"""The machinery of a batch job, shared by `Pipeline.run`, `Pipeline.run_span` and
`dspk.dask` (`to_hdf5`, `run_split`): it knows files and chunks, not steps.

- `check_output`, `check_output_options`: an output refused before any work;
- `PartialOutput`: ``OUT.partial`` written, renamed ``OUT`` when complete, deleted (or kept
  for a resume) when not; the resume record ``OUT.progress.json`` beside it;
- `job_record`, `write_metadata`: what an output was made from (a resume must match it);
- `TraceOutput`: the HDF5 output's datasets (``/traces``, and ``/spikes``, ``/features``,
  ``/feature_channels`` of a detecting job), appended chunk by chunk in order;
- `Staging`: pinned host buffers for the GPU (raw samples in, output blocks out);
- `ChunkStream`: the chunk loop, reading ahead in threads and writing behind in one;
- `progress_bar`: tqdm counted in seconds of recording (its rate reads as x real time).

A job reports each chunk it has committed through its ``on_chunk`` callback
(``on_chunk(samples_done)``), after the chunk's data is flushed and, for `Pipeline.run`, the
resume record written: a callback that ends the process there (as a kill would) leaves a
partial output that a resumed job completes.

Examples
--------
>>> import os, tempfile
>>> from dspk.pipeline.job import PartialOutput
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
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .._version import __version__
from ..backend import array_module, blocked_transpose, to_numpy
from ..io import Recording, open_recording
from ..io.rawio import RawDatasetWriter, create_contiguous, create_dataset, raw_offset
from .errors import PipelineError

__all__ = ["READ_AHEAD", "READ_AHEAD_COMPRESSED", "OUTPUT_DTYPES", "LAYOUTS", "opened",
           "check_output", "check_output_options", "int16_scale", "chunk_samples",
           "PartialOutput", "job_record", "write_metadata", "TraceOutput", "Staging",
           "raw_transfer", "ChunkStream", "read_block", "output_block", "quantize",
           "resumable", "progress_bar"]

#: chunks read ahead of the one being computed; more for compressed sources, whose chunks
#: are inflated in a thread pool (a 1-s read holds only a few chunks: several reads in flight
#: keep more cores busy; measured on the H200 host, 16 cores, gzip: 2 ahead gave 19x real time)
READ_AHEAD, READ_AHEAD_COMPRESSED = 2, 4
#: the sample types a job writes
OUTPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.int16))
#: the layouts of ``/traces``
LAYOUTS = ("samples_channels", "channels_samples")

#: ``on_chunk(samples_done)``: called after each chunk is committed
OnChunk = Callable[[int], Any]


# -- before any work ---------------------------------------------------------------------------
@contextmanager
def opened(recording: Recording | str | os.PathLike,
           **open_options: Any) -> Iterator[Recording]:
    """The recording, opened with `dspk.open_recording` when given a path (and closed at the
    end of the block, whether it completes or fails); a `Recording` passed in is used as it
    is and left open.

    Parameters
    ----------
    recording : Recording or path
    **open_options
        `dspk.open_recording` keywords, for a path.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.job import opened
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
    >>> with opened(rec) as r:
    ...     r is rec
    True
    >>> rec.closed
    False
    """
    if not isinstance(recording, (str, os.PathLike)):
        yield recording
        return
    with open_recording(recording, **open_options) as rec:
        yield rec


def check_output(out: str | os.PathLike, rec: Recording | None, overwrite: bool) -> Path:
    """Refuse an output path before any work: the input itself (any spelling, a symbolic or
    hard link), a directory, an existing file without ``overwrite``, a missing or read-only
    folder.

    Parameters
    ----------
    out : path
        The output file.
    rec : Recording, optional
        The input (a recording read from a file has ``path``).
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
    >>> from dspk.pipeline.job import check_output
    >>> tmp = tempfile.TemporaryDirectory()
    >>> check_output(tmp.name, None, overwrite=True)          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: ...: is a directory; expected an output file name
    >>> tmp.cleanup()
    """
    out = Path(out)
    source = getattr(rec, "path", None)
    if source is not None and _same_file(source, out):
        raise PipelineError(f"{out}: is the input ({source}); the input is never written")
    if out.is_dir():
        raise PipelineError(f"{out}: is a directory; expected an output file name")
    if out.exists() and not overwrite:
        raise PipelineError(f"{out}: exists; pass overwrite=True (--overwrite) to replace it")
    folder = out.parent
    if not folder.is_dir():
        raise PipelineError(f"{out}: its folder {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PipelineError(f"{out}: its folder {folder} is not writable")
    return out


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
    >>> from dspk.pipeline.job import check_output_options
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
    >>> from dspk.pipeline.job import int16_scale
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
    >>> from dspk.pipeline.job import chunk_samples
    >>> chunk_samples(0.5, 30000.0)
    15000
    """
    return max(1, int(round(chunk_s * fs)))


# -- the partial file and its resume record ------------------------------------------------------
class PartialOutput:
    """An output written as ``OUT.partial`` and renamed ``OUT`` when complete, with the resume
    record ``OUT.progress.json`` beside it (a `Pipeline.run` job's; the other writers leave
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
    >>> from dspk.pipeline.job import PartialOutput
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
        >>> from dspk.pipeline.job import PartialOutput, resumable
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

    def record(self, job: dict, done: int, spikes: int) -> None:
        """Write the resume record: the job, and how far its committed chunks reach
        (atomically: the record is either the old one or the new one)."""
        _write_json(self.progress, {**job, "done": done, "spikes": spikes})

    def read_record(self) -> dict:
        """The resume record (`OSError` when there is none, `ValueError` when unreadable)."""
        return json.loads(self.progress.read_text())


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def resumable(exc: BaseException) -> bool:
    """Whether a job stopped by ``exc`` could get further when resumed: an interruption, or an
    OSError (a full disk, a lost mount) or MemoryError that need not happen again — not an
    error of the input's samples or of the pipeline, which would stop it at the same place.

    Parameters
    ----------
    exc : BaseException

    Examples
    --------
    >>> from dspk.pipeline.job import resumable
    >>> resumable(KeyboardInterrupt()), resumable(ValueError("a NaN sample"))
    (True, False)
    """
    return isinstance(exc, (KeyboardInterrupt, SystemExit, OSError, MemoryError))


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
    >>> from dspk.pipeline.job import job_record
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


def write_metadata(f: Any, rec: Recording, job: dict, steps: list) -> None:
    """The output's attributes (version, rate, layout, the pipeline's steps, the job record),
    those of ``/traces`` that make the output readable by `dspk.open_recording`, and the
    geometry. The pipeline's fitted state follows (`Pipeline.write_fitted`).

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

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np, dspk
    >>> from dspk.pipeline.job import job_record, write_metadata
    >>> tmp = tempfile.TemporaryDirectory()
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
    >>> job = job_record("f00d", rec, 1500, np.float32, 1.0, "samples_channels", None)
    >>> with h5py.File(os.path.join(tmp.name, "o.h5"), "w") as f:
    ...     _ = f.create_dataset("traces", (3000, 2), np.float32)
    ...     write_metadata(f, rec, job, [])
    ...     float(f["traces"].attrs["fs"]), f.attrs["layout"]
    (30000.0, 'samples_channels')
    >>> tmp.cleanup()
    """
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


class TraceOutput:
    """The datasets of a job's open HDF5 output, written chunk by chunk in order:
    ``/traces`` (through ``os.pwrite``, outside the GIL, when contiguous; through h5py when
    compressed) and, for a detecting job, ``/spikes`` with ``/features`` and
    ``/feature_channels`` row for row.

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
    >>> from dspk.pipeline.job import TraceOutput
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

    def spike_datasets(self, spike_dtype: np.dtype, features: tuple | None, keep: int) -> None:
        """``/spikes`` (and, with ``features`` = (neighbours, components), ``/features`` and
        ``/feature_channels``), made when missing and cut to ``keep`` rows (the spikes of the
        chunks a resume record counts: rows past it were written by chunks after it)."""
        f = self.f
        if "spikes" not in f:
            create_dataset(f, "spikes", shape=(0,), maxshape=(None,), dtype=spike_dtype,
                           chunks=(65536,))
        f["spikes"].resize((int(keep),))
        if features is None:
            return
        nn, nc = features
        if "features" not in f:
            # row i: spike i's PCA features on its neighbour channels
            create_dataset(f, "features", shape=(0, nn, nc), maxshape=(None, nn, nc),
                           dtype=np.float32, chunks=(4096, nn, nc))
            create_dataset(f, "feature_channels", shape=(0, nn), maxshape=(None, nn),
                           dtype=np.int32, chunks=(4096, nn))
        f["features"].resize(int(keep), axis=0)
        f["feature_channels"].resize(int(keep), axis=0)

    def write(self, s0: int, s1: int, y: np.ndarray) -> None:
        """Samples [s0, s1) of the traces."""
        write_traces(self._raw, self.traces, s0, s1, y, self.layout, self.transposed)

    def append_spikes(self, spikes: np.ndarray, feats: tuple | None) -> int:
        """Append a chunk's spikes (and their features); returns the spikes written so
        far."""
        f = self.f
        sd = f["spikes"]
        total = sd.shape[0] + len(spikes)
        sd.resize((total,))
        sd[total - len(spikes):] = spikes
        if feats is not None:
            for name, values in zip(("features", "feature_channels"), feats):
                f[name].resize(total, axis=0)
                f[name][total - len(spikes):] = values
        return total

    def close(self) -> None:
        """Close the raw writer's descriptor (the file stays open)."""
        if self._raw is not None:
            self._raw.close()


def write_traces(raw: RawDatasetWriter | None, dset: Any, s0: int, s1: int, y: np.ndarray,
                 layout: str, transposed: bool) -> None:
    """A chunk of traces into the output (``raw.write`` when contiguous, else h5py), in the
    file's layout; y is [samples, channels] already when ``transposed``, else [channels,
    samples]."""
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


# -- reading and computing chunks ----------------------------------------------------------------
def read_block(rec: Recording, s0: int, s1: int, m: int) -> tuple:
    """(first sample read, µV block [channels, b - a]) for [s0 - m, s1 + m) clipped to the
    recording.

    Parameters
    ----------
    rec : Recording
    s0, s1 : int
        The chunk.
    m : int
        Samples of context on each side.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.job import read_block
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
    >>> a, x = read_block(rec, 0, 100, 10)
    >>> a, x.shape
    (0, (2, 110))
    """
    a, b = max(0, s0 - m), min(rec.n_samples, s1 + m)
    return a, rec.read(a, b)


def quantize(xp: Any, y: Any, scale: float) -> Any:
    """int16 output samples: round(y / scale), clipped (the same operations on either
    backend, so the GPU and the CPU write the same integers).

    Parameters
    ----------
    xp : module
        numpy or cupy.
    y : array
    scale : float

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline.job import quantize
    >>> quantize(np, np.array([0.014, 1e9]), 0.01)
    array([    1, 32767], dtype=int16)
    """
    return xp.clip(xp.rint(y / scale), -32768, 32767).astype(np.int16)


def output_block(i: int, y: Any, staging: "Staging | None", out_dtype: Any,
                 scale: float) -> np.ndarray:
    """Chunk i's traces y [channels, samples] as written: in pinned buffer i, transposed to
    the file's layout and quantized on the device, with staging; else a host array
    [channels, samples] in the output dtype.

    Parameters
    ----------
    i : int
        The chunk's index in the job (the pinned buffers rotate).
    y : array
    staging : Staging or None
    out_dtype : float32 or int16
    scale : float
        For int16 output.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline.job import output_block
    >>> output_block(0, np.array([[0.5, 2.0]], np.float32), None, np.int16, 0.1)
    array([[ 5, 20]], dtype=int16)
    """
    if staging is not None:
        return staging.to_host(i, y, scale)
    y = to_numpy(y)
    if out_dtype == np.int16:
        return quantize(np, y, scale)
    return np.ascontiguousarray(y)


def raw_transfer(rec: Recording, xp: Any) -> bool:
    """Whether a job moves the raw samples to the device (integer sources on the GPU; float
    sources take the checked, scaled read).

    Parameters
    ----------
    rec : Recording
    xp : module
        The pipeline's array module.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.job import raw_transfer
    >>> raw_transfer(dspk.open_recording(np.zeros((3000, 2), np.int16), fs=3e4), np)
    False
    """
    return xp is not np and rec.dtype.kind in "iu"


class Staging:
    """Pinned host buffers for the GPU job: raw input blocks as stored (read into directly,
    ``slots`` of them in rotation: the reads in flight and the one being copied) and output
    blocks in the file's layout and dtype (three in rotation: one being filled, one being
    written, one spare).

    Parameters
    ----------
    rec : Recording
        An integer source (`raw_transfer`).
    width : int
        The longest block read: a chunk and its halos.
    slots : int
        Input buffers.
    out_shape : tuple
        (chunk samples, channels) of an output block.
    out_dtype : float32 or int16
    layout : {"samples_channels", "channels_samples"}

    Examples
    --------
    GPU jobs only (not run here):

    >>> staging = Staging(rec, 30262, 4, (30000, 384), np.int16, "samples_channels")
    ... # doctest: +SKIP
    """

    def __init__(self, rec: Recording, width: int, slots: int, out_shape: tuple,
                 out_dtype: np.dtype, layout: str) -> None:
        import cupyx  # noqa: PLC0415 (GPU jobs only)

        self.rec, self.layout, self.out_dtype = rec, layout, out_dtype
        c = rec.n_channels
        self._in = [cupyx.empty_pinned(width * c, dtype=rec.dtype) for _ in range(slots)]
        self._out = [cupyx.empty_pinned(out_shape[0] * c, dtype=out_dtype) for _ in range(3)]
        gain, offset = rec.gain_to_uv, rec.offset_to_uv
        self._gain = gain.astype(np.float32) if np.any(gain != 1) else None
        self._offset = offset.astype(np.float32) if np.any(offset != 0) else None
        self._dev: dict = {}
        self.transfer_s = 0.0        # host <-> device copies (main thread)

    def read(self, k: int, s0: int, s1: int, m: int) -> tuple:
        """(first sample, raw block) of [s0 - m, s1 + m) clipped to the recording, read into
        slot k's buffer."""
        rec = self.rec
        a, b = max(0, s0 - m), min(rec.n_samples, s1 + m)
        buf = self._in[k % len(self._in)][:(b - a) * rec.n_channels]
        shape = (b - a, rec.n_channels) if rec.samples_first else (rec.n_channels, b - a)
        return a, rec.read_native(a, b, out=buf.reshape(shape))

    def to_device(self, raw: tuple, xp: Any) -> tuple:
        """(first sample, µV float32 [channels, samples] on the device): the same operations
        as `Recording.read` (cast, times the gain, plus the offset, in float32)."""
        a, block = raw
        if isinstance(block, np.ndarray):
            # straight from the pinned buffer (cupy.asarray would stage it through a pinned
            # buffer of its own: one more host copy)
            d = xp.empty(block.shape, dtype=block.dtype)
            t = time.perf_counter()
            d.set(block)
            self.transfer_s += time.perf_counter() - t
        else:
            d = xp.asarray(block)
        x = xp.ascontiguousarray(d.T if self.rec.samples_first else d, dtype=np.float32)
        if self._gain is not None:
            x *= self._vec("gain", self._gain, xp)
        if self._offset is not None:
            x += self._vec("offset", self._offset, xp)
        return a, x

    def _vec(self, name: str, v: np.ndarray, xp: Any) -> Any:
        if name not in self._dev:
            self._dev[name] = xp.asarray(v)[:, None]
        return self._dev[name]

    def to_host(self, i: int, y: Any, scale: float) -> np.ndarray:
        """The output block in the file's layout and dtype, in pinned buffer i."""
        xp = array_module(y)
        if self.layout == "samples_channels":
            y = xp.ascontiguousarray(y.T)
        if self.out_dtype == np.int16:
            y = quantize(xp, y, scale)
        else:
            y = xp.ascontiguousarray(y, dtype=self.out_dtype)
        host = self._out[i % len(self._out)][:y.size].reshape(y.shape)
        xp.cuda.get_current_stream().synchronize()    # the chunk's work done: time the copy
        t = time.perf_counter()
        y.get(out=host)
        self.transfer_s += time.perf_counter() - t
        return host


class ChunkStream:
    """The chunk loop of a job over a recording: the next chunks read ahead in threads (their
    halos included; through pinned buffers on the GPU), each computed on the caller's thread,
    and written behind by one writer thread, in order, while the next is computed.

    Parameters
    ----------
    rec : Recording
    xp : module
        The pipeline's array module.
    chunk : int
        Samples per chunk.
    margin : int
        Samples of context read on each side of a chunk.
    out_dtype : float32 or int16
    layout : {"samples_channels", "channels_samples"}

    Attributes
    ----------
    staging : Staging or None
        The pinned buffers of a GPU job that moves raw samples.
    timing : dict
        Seconds spent reading (summed over threads), computing and writing.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.job import ChunkStream
    >>> rec = dspk.open_recording(np.arange(20, dtype=np.int16).reshape(10, 2), fs=1e3,
    ...                           layout="samples_channels")
    >>> stream = ChunkStream(rec, np, chunk=4, margin=0, out_dtype=np.float32,
    ...                      layout="channels_samples")
    >>> got = []
    >>> stream.run([0, 4, 8], 10, lambda i, raw, s0, s1: raw[1],
    ...            lambda s0, s1, y: got.append((s0, s1, y.shape)))
    >>> got
    [(0, 4, (2, 4)), (4, 8, (2, 4)), (8, 10, (2, 2))]
    """

    def __init__(self, rec: Recording, xp: Any, chunk: int, margin: int, out_dtype: Any,
                 layout: str) -> None:
        self.rec, self.xp, self.chunk, self.margin = rec, xp, chunk, margin
        self.ahead = READ_AHEAD_COMPRESSED if getattr(rec, "compressed", False) else READ_AHEAD
        # the GPU moves raw integer samples as stored (half of float32's bytes for int16)
        # through pinned buffers and transposes, scales, quantizes on the device
        n, c = rec.n_samples, rec.n_channels
        self.staging = Staging(rec, chunk + 2 * margin, self.ahead + 2, (min(n, chunk), c),
                               out_dtype, layout) if raw_transfer(rec, xp) else None
        self.timing = {"read_s": 0.0, "compute_s": 0.0, "write_s": 0.0}
        self._lock = threading.Lock()

    def read(self, k: int, s0: int, end: int) -> tuple:
        """Chunk k, [s0, min(end, s0 + chunk)), with its halos: (first sample, block)."""
        t = time.perf_counter()
        s1 = min(end, s0 + self.chunk)
        if self.staging is not None:
            r = self.staging.read(k, s0, s1, self.margin)
        else:
            r = read_block(self.rec, s0, s1, self.margin)
        with self._lock:
            self.timing["read_s"] += time.perf_counter() - t
        return r

    def to_device(self, raw: tuple) -> tuple:
        """A block read by `read` as (first sample, µV block) for the computation: moved and
        scaled on the device with staging, else as read."""
        return self.staging.to_device(raw, self.xp) if self.staging is not None else raw

    def run(self, starts: Sequence[int], end: int, compute: Callable[..., Any],
            write: Callable[..., Any]) -> None:
        """The chunks starting at ``starts`` (each to ``min(end, s0 + chunk)``):
        ``compute(i, raw, s0, s1)`` on this thread, its result passed to
        ``write(s0, s1, result)`` on the writer thread; the first failed write stops the
        loop (raised here)."""
        ahead = self.ahead
        # the next `ahead` chunks are read while this one is computed (decompression of
        # several chunks overlaps), the last one written while the next is computed (one
        # writer thread: chunks are written in order)
        with ThreadPoolExecutor(ahead) as reader, ThreadPoolExecutor(1) as writer:
            queue = deque(reader.submit(self.read, k, starts[k], end)
                          for k in range(min(ahead, len(starts))))
            pending = None
            for i, s0 in enumerate(starts):
                s1 = min(end, s0 + self.chunk)
                raw = queue.popleft().result()
                if i + ahead < len(starts):
                    queue.append(reader.submit(self.read, i + ahead, starts[i + ahead], end))
                t = time.perf_counter()
                result = compute(i, raw, s0, s1)
                self.timing["compute_s"] += time.perf_counter() - t
                if pending is not None:
                    pending.result()        # a failed write stops the job here
                pending = writer.submit(write, s0, s1, result)
            if pending is not None:
                pending.result()


# -- progress ------------------------------------------------------------------------------------
class _Progress:
    """A tqdm bar counted in seconds of recording, so its rate reads as × real time."""

    def __init__(self, total: int, done: int, fs: float) -> None:
        from tqdm import tqdm  # noqa: PLC0415

        self.fs = fs
        self.bar = tqdm(total=round(total / fs, 3), initial=round(done / fs, 3),
                        unit="s", desc="dspk preprocess",
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s of "
                                   "recording [{elapsed}<{remaining}, {rate_fmt}: x real time]")

    def update(self, samples: int) -> None:
        self.bar.update(samples / self.fs)

    def close(self) -> None:
        self.bar.close()


def progress_bar(enabled: bool, total: int, done: int, fs: float) -> Any:
    """A progress bar with ``update(samples)`` and ``close()``, counted in seconds of
    recording (its rate reads as × real time); None when not ``enabled`` or tqdm is not
    installed.

    Parameters
    ----------
    enabled : bool
    total, done : int
        Samples of the job, and done before it starts (a resumed job).
    fs : float
        The sampling rate in Hz.

    Examples
    --------
    >>> from dspk.pipeline.job import progress_bar
    >>> progress_bar(False, 30000, 0, 30000.0) is None
    True
    """
    if not enabled:
        return None
    try:
        return _Progress(total, done, fs)
    except ImportError:
        return None
