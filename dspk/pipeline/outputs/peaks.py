"""Detection alone (`PeaksOutput`, ``format="peaks"``): a job's `Detect` spikes kept as
SpikeInterface's peaks and peak locations (`dspk.detect.spikes_to_peaks`: the signed value of
the processed trace at each spike's trough on its channel as the amplitude), and no traces.
Kept in memory (OUT None: `dspk.pipeline.detect_peaks`) or written into a folder, as
``dspk detect`` does: ``peaks.npy``, ``peak_locations.npy`` (the names SpikeInterface's
motion tools use) and ``detect.json`` (`dspk.pipeline.record.peaks_about`), as
``OUT.partial/`` renamed when complete.

Examples
--------
>>> import os, tempfile
>>> import numpy as np, dspk
>>> from dspk.pipeline.outputs import PeaksOutput
>>> tmp = tempfile.TemporaryDirectory()
>>> x = np.random.default_rng(0).standard_normal((4, 3000)).astype(np.float32)
>>> rec = dspk.open_recording(x, fs=3e4, geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)])
>>> p = dspk.Pipeline.from_options(whiten="none", detect=True)
>>> out = p.run(rec, os.path.join(tmp.name, "peaks"), format="peaks", progress=False)
>>> sorted(os.listdir(out))
['detect.json', 'peak_locations.npy', 'peaks.npy']
>>> tmp.cleanup()
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ...detect import spikes_to_peaks
from ..record import UNITS_UV, UNITS_WHITENED, peaks_about
from ..sinks import Detect
from .base import Output, register_output

__all__ = ["DETECT_FILES", "PeaksOutput"]

#: what a peaks folder holds (SpikeInterface's names for the first two: its
#: ``save_motion_info`` and ``load_motion_info`` use them)
DETECT_FILES = ("peaks.npy", "peak_locations.npy", "detect.json")


@register_output
class PeaksOutput(Output):
    """The peaks of a detecting pipeline (see the module's description).

    Parameters
    ----------
    out : path, optional
        The folder (new, empty, or with ``overwrite`` one that ``dspk detect`` wrote); None:
        the peaks are kept in memory only (`peaks`, `locations`).
    overwrite : bool
        Replace the peaks in ``out``.
    units : str, optional
        The units of the input's traces when it is a dspk output (the amplitudes' units,
        unless the pipeline whitens): `dspk.pipeline.record.UNITS_UV` by default.
    segment_index : int
        The ``segment_index`` of every peak.

    Attributes
    ----------
    peaks, locations : numpy.ndarray
        After the job: `dspk.detect.PEAK_DTYPE` and `dspk.detect.PEAK_LOCATION_DTYPE`,
        row for row, by sample.

    Examples
    --------
    >>> from dspk.pipeline.outputs import PeaksOutput
    >>> PeaksOutput("somewhere/peaks").check(None)             # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: somewhere/peaks: its folder ... does not exist (create it first)
    """

    format = "peaks"
    target = "folder"
    traces = False
    tables = True
    detects = True
    uncompressed = None                 # nothing is compressed: no traces are stored
    owned = DETECT_FILES
    marker = "detect.json"
    writer = "dspk detect"
    what = "the peaks of dspk detect"

    def __init__(self, out: str | os.PathLike | None = None, *, overwrite: bool = False,
                 units: str | None = None, segment_index: int = 0) -> None:
        if out is None:
            self.target = None              # kept in memory: no folder to check or commit
        super().__init__(out, overwrite=overwrite)
        self.units, self.segment_index = units, segment_index
        self.peaks: Any = []
        self.locations: Any = []

    def folder_said(self) -> str:
        """What OUT is, said as ``dspk detect`` names it."""
        return f"OUTDIR is the folder dspk detect writes {', '.join(DETECT_FILES)} into"

    def begin(self, job: Any, done: int, rows: dict) -> int:
        """Where the `Detect` sink's spikes are among the sinks' rows; the partial folder."""
        run = job.prepared
        index = [k for k, (s, _, _) in enumerate(run.sinks) if isinstance(s, Detect)][0]
        self._spikes = sum(len(s.tables(run.ctx, st)) for s, _, st in run.sinks[:index])
        self.peaks, self.locations = [], []
        self._job = job
        if self.files is not None:
            self.files.partial.mkdir()
        return done

    def rows_of(self, run: Any, full: Any, s0: int, s1: int, m: int) -> list:
        """The chunk's peaks and their locations, the amplitudes read in the processed block
        (on its device)."""
        spikes = run.rows(full, s0, s1, m)[self._spikes]
        return list(spikes_to_peaks(spikes, full, start=s0 - m,
                                    segment_index=self.segment_index))

    def write(self, s0: int, s1: int, block: Any, rows: list) -> None:
        """Keep the chunk's peaks and locations."""
        self.peaks.append(rows[0])
        self.locations.append(rows[1])

    def commit(self) -> None:
        """The peaks in one array (a recording has a chunk); in OUT with ``detect.json``."""
        self.peaks, self.locations = np.concatenate(self.peaks), np.concatenate(self.locations)
        if self.files is None:
            return
        partial, job = self.files.partial, self._job
        np.save(partial / DETECT_FILES[0], self.peaks)
        np.save(partial / DETECT_FILES[1], self.locations)
        units = UNITS_WHITENED if job.pipeline.whitens else (self.units or UNITS_UV)
        about = peaks_about(job.rec, job.pipeline.options(), len(self.peaks), units,
                            DETECT_FILES)
        with open(partial / DETECT_FILES[2], "w") as fh:
            json.dump(about, fh, indent=1)
        super().commit()
