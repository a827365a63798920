"""Traces written as bytes at their place in a file (`write_traces`), and the outputs that
hold nothing else while a job writes them (`RawTracesOutput`): the flat binary of a Kilosort
folder, the allocated dataset of an NWB file, a span of a file another job prepared
(`dspk.dask.run_split`). ``os.pwrite`` writes with the GIL released, and processes writing
disjoint spans of one file need no lock.

Examples
--------
>>> import numpy as np
>>> from dspk.pipeline.outputs.raw import write_traces
>>> d = np.zeros((2, 4), np.float32)                  # [channels, samples]: any array-like
>>> write_traces(None, d, 1, 3, np.ones((2, 2), np.float32), "channels_samples", False)
>>> d[0].tolist()
[0.0, 1.0, 1.0, 0.0]
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...backend import blocked_transpose
from ...io.rawio import RawDatasetWriter
from .base import Output

__all__ = ["write_traces", "RawTracesOutput"]


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
    >>> from dspk.pipeline.outputs.raw import write_traces
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


class RawTracesOutput(Output):
    """An output whose traces a job writes straight into one file at a byte offset, in the
    job's layout (`write_traces`): a subclass's `begin` prepares the file and calls
    `open_traces`.

    Parameters
    ----------
    out : path, optional
    overwrite : bool
        As for `Output`.

    Examples
    --------
    >>> from dspk.pipeline.outputs import output_class
    >>> from dspk.pipeline.outputs.raw import RawTracesOutput
    >>> issubclass(output_class("kilosort"), RawTracesOutput)
    True
    """

    def __init__(self, out: str | os.PathLike | None = None, *, overwrite: bool = False
                 ) -> None:
        super().__init__(out, overwrite=overwrite)
        self._raw: RawDatasetWriter | None = None
        self._path: str | None = None
        self._layout, self._transposed = "samples_channels", False

    def open_traces(self, job: Any, path: str | os.PathLike, offset: int) -> None:
        """Write the job's traces [samples, channels] (or [channels, samples], the job's
        layout) into ``path`` from byte ``offset`` on.

        Parameters
        ----------
        job : Job
        path : path
        offset : int
        """
        n, c = job.rec.n_samples, job.rec.n_channels
        self._layout, self._transposed = job.layout, job.staged
        self._path = str(path)
        self._raw = RawDatasetWriter(str(path), offset=offset,
                                     shape=(n, c) if job.layout == "samples_channels"
                                     else (c, n), dtype=job.out_dtype)

    def read_back(self, s0: int, s1: int) -> Any:
        """Samples [s0, s1) of the traces as stored, in the job's layout (see
        `Output.read_back`); short or missing bytes read as a block that fails its check."""
        raw = self._raw
        if raw is None or self._path is None:
            return None
        n, c = raw.shape if self._layout == "samples_channels" else raw.shape[::-1]
        item = raw.dtype.itemsize
        with open(self._path, "rb") as f:
            if self._layout == "samples_channels":
                f.seek(raw.offset + s0 * c * item)
                data = np.frombuffer(f.read((s1 - s0) * c * item), raw.dtype)
                return data if data.size != (s1 - s0) * c else data.reshape(s1 - s0, c)
            rows = []
            for ch in range(c):
                f.seek(raw.offset + (ch * n + s0) * item)
                rows.append(np.frombuffer(f.read((s1 - s0) * item), raw.dtype))
            if any(r.size != s1 - s0 for r in rows):
                return np.concatenate(rows)
            return np.stack(rows)

    def write(self, s0: int, s1: int, block: Any, rows: list) -> None:
        """Chunk [s0, s1) of the traces at its place (see `Output.write`)."""
        write_traces(self._raw, None, s0, s1, block, self._layout, self._transposed)

    def close(self) -> None:
        """Close the file's descriptor."""
        if self._raw is not None:
            self._raw.close()
            self._raw = None
