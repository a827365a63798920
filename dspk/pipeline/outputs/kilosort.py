"""A folder that the tools a user sorts with read as it is (`KilosortOutput`,
``format="kilosort"``, OUT a folder): everything Kilosort4, Phy and SpikeInterface need to sort
the processed traces without preprocessing them again.

- ``traces.bin``: the traces, a flat binary [samples, channels] (time-major, no header,
  offset 0), int16 by default. int16 stores round(y / scale): whitened traces (in units of
  the noise's standard deviation) with scale 1/200 — 200 steps per SD, the factor
  Kilosort4 multiplies its whitened data by when it saves them (``temp_wh.dat``) — and
  other traces in steps of 0.1 µV (`dspk.pipeline.outputs.int16_scale`); float32 on request
  stores y itself (µV, or SDs when whitened: the values Kilosort4 thresholds).
- ``chanMap.json`` (Kilosort4's probe: ``chanMap``, ``xc``, ``yc``, ``kcoords``,
  ``n_chan``; ``kilosort.io.load_probe`` reads it), ``chanMap.mat`` (the same for Kilosort
  2 to 4 in MATLAB's form) and ``probe.json`` (probeinterface: SpikeInterface's
  ``read_probeinterface``).
- ``params.py``: Phy's (``dat_path``, ``n_channels_dat``, ``dtype``, ``offset``,
  ``sample_rate``, ``hp_filtered``).
- ``dspk.json``: what the folder holds (`dspk.pipeline.record.kilosort_about`);
  ``fitted.h5``: the pipeline's fitted state (`dspk.pipeline.record.read_fitted` reads it).

The folder is written as ``OUT.partial/`` and renamed ``OUT`` when complete (an empty OUT
is replaced; a non-empty one only with ``overwrite`` and only when it holds a dspk Kilosort
output and nothing else: dspk never deletes files it did not write). A killed job keeps
``OUT.partial/`` with its progress record, and ``resume=True`` continues it, as for HDF5.

Examples
--------
>>> import os, tempfile
>>> import numpy as np, dspk
>>> tmp = tempfile.TemporaryDirectory()
>>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
>>> rec = dspk.open_recording(x, fs=30000.0, geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)])
>>> p = dspk.Pipeline.from_options(whiten="global")
>>> out = p.run(rec, os.path.join(tmp.name, "ks"), format="kilosort", progress=False)
>>> sorted(os.listdir(out))              # doctest: +NORMALIZE_WHITESPACE
['chanMap.json', 'chanMap.mat', 'dspk.json', 'fitted.h5', 'params.py', 'probe.json',
 'traces.bin']
>>> traces = np.fromfile(out / "traces.bin", np.int16).reshape(-1, 4)
>>> traces.shape, round(float(traces.std() / 200), 1)      # whitened: 200 steps per SD
((9000, 4), 1.0)
>>> tmp.cleanup()
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ...io.kilosort import (write_chanmap_mat, write_kilosort_probe, write_phy_params,
                            write_probeinterface)
from ...io.rawio import new_file
from ..record import kilosort_about, plain, write_fitted
from .base import register_output
from .raw import RawTracesOutput

__all__ = ["KILOSORT_STEPS_PER_SD", "KILOSORT_BINARY", "KILOSORT_FILES", "KilosortOutput"]

#: int16 steps per noise SD of whitened traces in a Kilosort folder: Kilosort4 stores its
#: whitened data times 200 (``save_preprocessing``: ``temp_wh.dat``)
KILOSORT_STEPS_PER_SD = 200.0
#: the flat binary of a Kilosort folder
KILOSORT_BINARY = "traces.bin"
#: every file of a Kilosort folder (a folder holding anything else is never replaced)
KILOSORT_FILES = (KILOSORT_BINARY, "chanMap.json", "chanMap.mat", "probe.json", "params.py",
                  "fitted.h5", "dspk.json")


@register_output
class KilosortOutput(RawTracesOutput):
    """A Kilosort folder (see the module's description): ``OUT`` a folder, new or empty, or
    with ``overwrite`` one holding a dspk Kilosort output and nothing else.

    Parameters
    ----------
    out : path
        The output folder.
    overwrite : bool
        Replace the dspk Kilosort output there.

    Examples
    --------
    >>> import os, tempfile
    >>> from dspk.pipeline import PipelineError
    >>> from dspk.pipeline.outputs import KilosortOutput
    >>> tmp = tempfile.TemporaryDirectory()
    >>> _ = open(os.path.join(tmp.name, "notes.txt"), "w").write("mine")
    >>> KilosortOutput(tmp.name, overwrite=True).check(None)          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: ...: holds files dspk did not write (notes.txt); ...
    >>> tmp.cleanup()
    """

    format = "kilosort"
    summary = ("a folder that Kilosort4, Phy and SpikeInterface read as it is (traces.bin "
               "int16 [samples, channels], chanMap.json/.mat, probe.json, params.py, "
               "dspk.json)")
    target = "folder"
    resumes = True
    needs_geometry = True
    layouts = ("samples_channels",)
    reader = "Kilosort"
    uncompressed = "what Kilosort and Phy read"
    default_dtype = np.int16
    whitened_step = 1.0 / KILOSORT_STEPS_PER_SD
    fitted_name = "fitted.h5"
    owned = KILOSORT_FILES + ("events.csv",)       # events.csv: where the input keeps events
    marker = "dspk.json"
    what = "the dspk Kilosort output"

    def begin(self, job: Any, done: int, rows: dict) -> int:
        """A new partial folder with the binary allocated (every sample is written) and the
        fitted state, or the one a killed job left; the traces written into its binary."""
        partial, rec = self.files.partial, job.rec
        binary = partial / KILOSORT_BINARY
        if done == 0:
            partial.mkdir()
            with open(binary, "wb") as f:
                f.truncate(rec.n_samples * rec.n_channels * job.out_dtype.itemsize)
            with new_file(partial / self.fitted_name) as f:
                write_fitted(f, job.pipeline.steps, rec.fs, job.states)
        self.open_traces(job, binary, 0)
        self._job = job
        return done

    def events(self, table: Any, fs: float, source: str = "") -> None:
        """The recording's edges as ``events.csv`` (`dspk.io.events.write_events_csv`:
        bit, edge, sample, seconds): the `~dspk.pipeline.Job`'s hook."""
        from ...io.events import write_events_csv  # noqa: PLC0415

        write_events_csv(self.files.partial / "events.csv", table, fs)

    def commit(self) -> None:
        """The probe (three forms), Phy's params.py and dspk.json beside the binary; then the
        folder named OUT."""
        job = self._job
        folder, rec = self.files.partial, job.rec
        shanks, contact_ids = rec.shank_ids, rec.contact_ids
        write_kilosort_probe(folder / "chanMap.json", rec.geometry, shanks)
        write_chanmap_mat(folder / "chanMap.mat", rec.geometry, shanks, fs=rec.fs)
        write_probeinterface(folder / "probe.json", rec.geometry, shanks,
                             contact_ids=None if contact_ids is None else plain(contact_ids))
        write_phy_params(folder / "params.py", KILOSORT_BINARY, rec.n_channels, job.out_dtype,
                         rec.fs, offset=0, hp_filtered=True)
        about = kilosort_about(rec, KILOSORT_BINARY, job.out_dtype, job.scale,
                               job.pipeline.whitens, job.pipeline.options(), job.job_record)
        (folder / "dspk.json").write_text(json.dumps(about, indent=1) + "\n")
        super().commit()
