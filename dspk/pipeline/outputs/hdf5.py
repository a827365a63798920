"""dspk's own output, an HDF5 file (`HDF5Output`, ``format="hdf5"``): ``/traces`` [samples,
channels] (or [channels, samples]), float32 or int16 with a scale, with the metadata and the
fitted state of `dspk.pipeline.record`; with `Detect` also ``/spikes``, ``/features`` and
``/feature_channels``, row for row (`TraceOutput` writes them chunk by chunk). Written as
``OUT.partial``, renamed when complete; resumable: a killed job's partial file is reopened
and continued from its last recorded chunk, to the bytes of a job that never stopped.

Examples
--------
>>> import os, tempfile
>>> import h5py, numpy as np, dspk
>>> tmp = tempfile.TemporaryDirectory()
>>> rec = dspk.open_recording(np.ones((3000, 2), np.float32), fs=3e4)
>>> out = dspk.Pipeline.from_options(whiten=None, reference="mean").run(
...     rec, os.path.join(tmp.name, "o.h5"), format="hdf5", progress=False)
>>> with h5py.File(out, "r") as f:
...     sorted(f), f["traces"].shape
(['channel_ids', 'fitted', 'traces'], (3000, 2))
>>> tmp.cleanup()
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import numpy as np

from ...io.hdf5 import h5py_module
from ...io.rawio import (RawDatasetWriter, create_contiguous, create_dataset, new_file,
                         raw_offset)
from ..record import write_fitted, write_metadata
from .base import Output, register_output
from .raw import write_traces

__all__ = ["HDF5Output", "TraceOutput"]

log = logging.getLogger("dspk.pipeline")


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
    >>> from dspk.pipeline.outputs.hdf5 import TraceOutput
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


@register_output
class HDF5Output(Output):
    """dspk's HDF5 output (see the module's description): ``OUT`` a file.

    Parameters
    ----------
    out : path
        The output file.
    overwrite : bool
        Replace an existing output (never a file of the input).

    Attributes
    ----------
    offset : int or None
        After `begin`: the byte offset of the contiguous ``/traces``' samples (None when
        compressed), where other processes may write spans (`dspk.dask.run_split`).

    Examples
    --------
    >>> import os, tempfile
    >>> from dspk.pipeline.outputs import HDF5Output
    >>> tmp = tempfile.TemporaryDirectory()
    >>> out = HDF5Output(os.path.join(tmp.name, "o.h5"))
    >>> out.check(None)                       # a new file in a writable folder: accepted
    >>> out.files.partial.name, out.resumes
    ('o.h5.partial', True)
    >>> tmp.cleanup()
    """

    format = "hdf5"
    summary = "dspk's HDF5 output"
    resumes = True
    tables = True
    uncompressed = None
    suffix = ".h5"

    def __init__(self, out: str | os.PathLike | None = None, *, overwrite: bool = False
                 ) -> None:
        super().__init__(out, overwrite=overwrite)
        self._f: Any = None
        self._traces: TraceOutput | None = None
        self.offset: int | None = None

    def begin(self, job: Any, done: int, rows: dict) -> int:
        """The partial file reopened to continue at ``done`` (a partial file that cannot be
        reopened is replaced: the job starts over), or a new one with ``/traces``, the
        metadata and the fitted state; then the sinks' tables (see `Output.begin`)."""
        files, rec = self.files, job.rec
        f = None
        if done:
            try:
                f = h5py_module().File(files.partial, "a")
                if "traces" not in f:
                    f.close()
                    raise OSError("no traces dataset")
            except OSError:
                log.warning("%s: cannot be reopened; starting over", files.partial)
                files.discard()
                f, done, rows = None, 0, {}
        if f is None:
            f = new_file(files.partial)
        self._f = f
        if done == 0:
            # the order of creation is part of the file's bytes (two runs write the same file)
            n, c = rec.n_samples, rec.n_channels
            TraceOutput.create_traces(f, (n, c) if job.layout == "samples_channels" else
                                      (c, n), job.out_dtype, job.layout, job.chunk,
                                      job.compression)
            write_metadata(f, rec, job.job_record, job.pipeline.options(), job.units)
            write_fitted(f, job.pipeline.steps, rec.fs, job.states)  # a resume reads it back
        self._traces = TraceOutput(f, files.partial, job.layout, transposed=job.staged)
        self.offset = raw_offset(self._traces.traces)
        self._traces.open_tables(job.prepared.tables(), rows)
        self.rows = dict(rows)
        return done

    def read_back(self, s0: int, s1: int) -> Any:
        """Samples [s0, s1) of ``/traces`` as stored, in the file's layout (see
        `Output.read_back`)."""
        t = self._traces.traces
        return t[s0:s1] if self._traces.layout == "samples_channels" else t[:, s0:s1]

    def write(self, s0: int, s1: int, block: Any, rows: list) -> None:
        """Chunk [s0, s1): its traces and its rows of each table, flushed to the file before
        `committed` records them."""
        self._traces.write(s0, s1, block)
        self.rows.update(self._traces.append(rows))
        self._f.flush()

    def events(self, table: Any, fs: float, source: str = "") -> None:
        """The recording's edges as ``/events`` (`dspk.io.events.write_events_hdf5`): the
        `~dspk.pipeline.Job`'s hook, called once the traces are written."""
        from ...io.events import write_events_hdf5  # noqa: PLC0415

        if self._f is not None:
            write_events_hdf5(self._f, table, fs, source)
            self._f.flush()
            return
        with h5py_module().File(self.files.partial, "a") as f:    # spans written elsewhere
            write_events_hdf5(f, table, fs, source)

    def close(self) -> None:
        """Close the traces' descriptor, then the file."""
        if self._traces is not None:
            self._traces.close()
            self._traces = None
        if self._f is not None:
            self._f.close()
            self._f = None
