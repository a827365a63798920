"""A span of a file another job prepared (`SpanOutput`, ``format="span"``): samples [s0, s1)
of its contiguous traces, written at their place with ``os.pwrite`` and nothing else — no
HDF5 here, so several processes fill disjoint spans of one file at once
(`dspk.dask.run_split`, whose job prepares the file with `dspk.pipeline.Job.allocate` and
commits it when every span is in). `Pipeline.run_span` writes one.

Examples
--------
>>> import os, tempfile
>>> import h5py, numpy as np, dspk
>>> from dspk.io.rawio import create_contiguous, raw_offset
>>> from dspk.pipeline.outputs import SpanOutput
>>> tmp = tempfile.TemporaryDirectory()
>>> path = os.path.join(tmp.name, "o.h5")
>>> with h5py.File(path, "w") as f:
...     offset = raw_offset(create_contiguous(f, "traces", (3000, 2), np.float32))
>>> rec = dspk.open_recording(np.ones((3000, 2), np.float32), fs=3e4)
>>> p = dspk.Pipeline.from_options(highpass=None, reference="none", whiten="none")
>>> _ = p.run(rec, SpanOutput(path, offset=offset, s0=1000, s1=2000), progress=False)
>>> with h5py.File(path, "r") as f:
...     f["traces"][[999, 1000, 1999, 2000], 0].tolist()
[0.0, 1.0, 1.0, 0.0]
>>> tmp.cleanup()
"""

from __future__ import annotations

import os
from typing import Any

from .base import register_output
from .raw import RawTracesOutput

__all__ = ["SpanOutput"]


@register_output
class SpanOutput(RawTracesOutput):
    """Samples [s0, s1) of the traces of a prepared file (see the module's description):
    nothing of its own to check, record or commit — the file belongs to the job that
    prepared it.

    Parameters
    ----------
    out : path
        The prepared file.
    overwrite : bool
        Unused (the file is written in place).
    offset : int
        The byte offset of its traces' samples (`dspk.io.rawio.raw_offset`).
    s0, s1 : int, optional
        The span (default: the whole recording).

    Examples
    --------
    >>> from dspk.pipeline.outputs import SpanOutput
    >>> SpanOutput("o.h5", offset=2048, s0=0, s1=100).samples(90)
    Traceback (most recent call last):
    ...
    ValueError: s0, s1: expected 0 <= s0 <= s1 <= 90, got 0, 100
    """

    format = "span"
    target = None

    def __init__(self, out: str | os.PathLike, *, overwrite: bool = False, offset: int = 0,
                 s0: int = 0, s1: int | None = None) -> None:
        super().__init__(out, overwrite=overwrite)
        self.offset, self.s0, self.s1 = int(offset), int(s0), s1

    def samples(self, n: int) -> tuple[int, int]:
        """The span, checked against the recording's ``n`` samples."""
        s1 = n if self.s1 is None else int(self.s1)
        if not 0 <= self.s0 <= s1 <= n:
            raise ValueError(f"s0, s1: expected 0 <= s0 <= s1 <= {n}, got {self.s0}, {s1}")
        return self.s0, s1

    def begin(self, job: Any, done: int, rows: dict) -> int:
        """The traces written into the prepared file at its offset."""
        self.open_traces(job, self.out, self.offset)
        return done
