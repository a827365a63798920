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
  ``sample_rate``, ``hp_filtered``), and in comments the Kilosort4 call below.
- ``kilosort_settings.json`` (`kilosort_settings`): Kilosort4's ``settings`` (``n_chan_bin``,
  ``fs``, ``scale`` of whitened int16, ``nblocks=0`` when dspk corrected the drift) and its
  other arguments (the probe's file name, ``data_dtype``, ``do_CAR``), so that
  ``run_kilosort(settings=ks["settings"], probe=load_probe(OUT / ks["probe"]), data_dir=OUT,
  data_dtype=ks["data_dtype"], do_CAR=ks["do_CAR"])`` needs nothing copied by hand.
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
['chanMap.json', 'chanMap.mat', 'dspk.json', 'fitted.h5', 'kilosort_settings.json',
 'params.py', 'probe.json', 'traces.bin']
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

__all__ = ["KILOSORT_STEPS_PER_SD", "KILOSORT_BINARY", "KILOSORT_FILES", "KILOSORT_SETTINGS",
           "KilosortOutput", "kilosort_settings"]

#: int16 steps per noise SD of whitened traces in a Kilosort folder: Kilosort4 stores its
#: whitened data times 200 (``save_preprocessing``: ``temp_wh.dat``)
KILOSORT_STEPS_PER_SD = 200.0
#: the flat binary of a Kilosort folder
KILOSORT_BINARY = "traces.bin"
#: every file of a Kilosort folder (a folder holding anything else is never replaced)
#: Kilosort4's settings and arguments for the folder (`kilosort_settings`)
KILOSORT_SETTINGS = "kilosort_settings.json"
KILOSORT_FILES = (KILOSORT_BINARY, "chanMap.json", "chanMap.mat", "probe.json", "params.py",
                  "fitted.h5", "dspk.json", KILOSORT_SETTINGS)
#: the 116-byte text header of ``chanMap.mat`` (scipy's holds the time it was written: a
#: fixed one makes two runs write the same bytes)
MAT_HEADER = b"MATLAB 5.0 MAT-file, Platform: posix, written by dspk".ljust(116, b" ")


def kilosort_settings(n_channels: int, fs: float, out_dtype: Any, scale: float,
                      steps: list) -> dict:
    """What Kilosort4 needs to sort a Kilosort folder, as ``kilosort_settings.json`` holds
    it: ``settings`` (``run_kilosort``'s dictionary: ``n_chan_bin``, ``fs``; ``scale``, the
    noise SDs of one int16 step, for whitened int16 traces, which SpikeInterface's wrapper
    with ``skip_kilosort_preprocessing=True`` needs; ``nblocks=0`` when the pipeline
    corrected the drift, so that Kilosort4 does not estimate it again), ``probe`` (the file
    ``kilosort.io.load_probe`` reads), ``filename``, ``data_dtype``, ``do_CAR`` (False when
    the pipeline referenced the traces) and ``skip_kilosort_preprocessing`` (whitened:
    SpikeInterface's ``run_sorter("kilosort4", ...)`` option).

    Parameters
    ----------
    n_channels : int
    fs : float
    out_dtype : int16 or float32
        The binary's sample type.
    scale : float
        The units of one stored step (noise SDs when whitened).
    steps : list of dict
        `dspk.Pipeline.options`.

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        ``n_channels`` < 1 or a sampling rate that is not positive.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.outputs.kilosort import kilosort_settings
    >>> steps = dspk.Pipeline.from_options(motion="rigid").options()
    >>> ks = kilosort_settings(32, 30000.0, np.int16, 0.005, steps)
    >>> ks["settings"]
    {'n_chan_bin': 32, 'fs': 30000.0, 'scale': 0.005, 'nblocks': 0}
    >>> ks["probe"], ks["data_dtype"], ks["do_CAR"]
    ('chanMap.json', 'int16', False)
    """
    if int(n_channels) < 1:
        raise ValueError(f"n_channels: expected at least 1 channel, got {n_channels!r}")
    if not (np.isfinite(fs) and fs > 0):
        raise ValueError(f"fs: expected a positive sampling rate in Hz, got {fs!r}")
    names = [s["step"] for s in steps]
    whitened = "Whiten" in names
    settings: dict = {"n_chan_bin": int(n_channels), "fs": float(fs)}
    if whitened and np.dtype(out_dtype) == np.int16:
        settings["scale"] = float(scale)
    if "Motion" in names:
        settings["nblocks"] = 0
    return {"settings": settings, "probe": "chanMap.json", "filename": KILOSORT_BINARY,
            "data_dtype": np.dtype(out_dtype).name, "do_CAR": "Reference" not in names,
            "skip_kilosort_preprocessing": whitened}


#: the lines added to Phy's params.py (comments: Phy executes the file)
_PARAMS_HINT = """
# Kilosort4 on this folder (its settings in kilosort_settings.json, nothing to copy):
#   import json; from pathlib import Path
#   from kilosort import run_kilosort; from kilosort.io import load_probe
#   ks = json.loads(Path("FOLDER/kilosort_settings.json").read_text())
#   run_kilosort(settings=ks["settings"], probe=load_probe(Path("FOLDER") / ks["probe"]),
#                data_dir="FOLDER", data_dtype=ks["data_dtype"], do_CAR=ks["do_CAR"],
#                results_dir="ks_out")
"""


def _fixed_mat_header(path: Any) -> None:
    """Replace the time scipy writes into a .mat file's header by `MAT_HEADER`."""
    with open(path, "r+b") as f:
        head = f.read(116)
        if not head.startswith(b"MATLAB 5.0 MAT-file"):
            raise ValueError(f"{path}: not a MATLAB 5 file")
        f.seek(0)
        f.write(MAT_HEADER)


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
        """The probe (three forms), Phy's params.py, Kilosort4's settings and dspk.json
        beside the binary; then the folder named OUT."""
        job = self._job
        folder, rec = self.files.partial, job.rec
        shanks, contact_ids = rec.shank_ids, rec.contact_ids
        write_kilosort_probe(folder / "chanMap.json", rec.geometry, shanks)
        write_chanmap_mat(folder / "chanMap.mat", rec.geometry, shanks, fs=rec.fs)
        _fixed_mat_header(folder / "chanMap.mat")
        write_probeinterface(folder / "probe.json", rec.geometry, shanks,
                             contact_ids=None if contact_ids is None else plain(contact_ids))
        write_phy_params(folder / "params.py", KILOSORT_BINARY, rec.n_channels, job.out_dtype,
                         rec.fs, offset=0, hp_filtered=True)
        with open(folder / "params.py", "a") as f:
            f.write(_PARAMS_HINT)
        ks = kilosort_settings(rec.n_channels, rec.fs, job.out_dtype, job.scale,
                               job.pipeline.options())
        (folder / KILOSORT_SETTINGS).write_text(json.dumps(ks, indent=1) + "\n")
        about = kilosort_about(rec, KILOSORT_BINARY, job.out_dtype, job.scale,
                               job.pipeline.whitens, job.pipeline.options(), job.job_record)
        (folder / "dspk.json").write_text(json.dumps(about, indent=1) + "\n")
        super().commit()
