"""Outputs that the tools a user sorts with read as they are: a Kilosort folder and an NWB
file (`Pipeline.run` with ``format="kilosort"`` or ``"nwb"``; ``dspk preprocess --format``).

**Kilosort** (``format="kilosort"``, OUT a folder): everything Kilosort4, Phy and
SpikeInterface need to sort the processed traces without preprocessing them again:

- ``traces.bin``: the traces, a flat binary [samples, channels] (time-major, no header,
  offset 0), int16 by default. int16 stores round(y / scale): whitened traces (in units of
  the noise's standard deviation) with scale 1/200 — 200 steps per SD, the factor
  Kilosort4 multiplies its whitened data by when it saves them (``temp_wh.dat``) — and
  other traces in steps of 0.1 µV (`dspk.pipeline.output.int16_scale`); float32 on request
  stores y itself (µV, or SDs when whitened: the values Kilosort4 thresholds).
- ``chanMap.json`` (Kilosort4's probe: ``chanMap``, ``xc``, ``yc``, ``kcoords``,
  ``n_chan``; ``kilosort.io.load_probe`` reads it), ``chanMap.mat`` (the same for Kilosort
  2 to 4 in MATLAB's form) and ``probe.json`` (probeinterface: SpikeInterface's
  ``read_probeinterface``).
- ``params.py``: Phy's (``dat_path``, ``n_channels_dat``, ``dtype``, ``offset``,
  ``sample_rate``, ``hp_filtered``).
- ``dspk.json``: what the folder holds (``scale`` and ``units``: one stored step is
  ``scale`` of ``units``), the channel ids and shanks, the pipeline's steps and the job's
  record; ``fitted.h5``: the pipeline's fitted state (`Pipeline.read_fitted` reads it).

The folder is written as ``OUT.partial/`` and renamed ``OUT`` when complete (an empty OUT
is replaced; a non-empty one only with ``overwrite`` and only when it holds a dspk Kilosort
output and nothing else: dspk never deletes files it did not write). A killed job keeps
``OUT.partial/`` with its progress record, and ``resume=True`` continues it, as for HDF5.

**NWB** (``format="nwb"``, OUT a file): a processed ``ElectricalSeries`` in the
``ecephys`` processing module (`dspk.io.nwb`), written through pynwb with its electrodes
table (channel ids, shanks, positions), its samples written chunk by chunk into the
allocated dataset; ``conversion`` is scale × 1e-6, so that data × conversion × 1e6 is in µV
(in noise SDs when whitened: NWB fixes the unit to volts, the series' description says so).
Written as ``OUT.partial``, renamed when complete; not resumable.

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
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..argnames import arg
from ..io import Recording, SubsetRecording
from ..io.kilosort import (write_chanmap_mat, write_kilosort_probe, write_phy_params,
                           write_probeinterface)
from ..io.nwb import create_processed_series, input_metadata, pynwb_module
from ..io.rawio import new_file
from .errors import PipelineError
from .job import Job, JobInterrupted, OnChunk, progress_bar, resumable
from .output import LAYOUTS, UNITS_UV, UNITS_WHITENED, PartialOutput, check_output

__all__ = ["FORMATS", "KILOSORT_STEPS_PER_SD", "KILOSORT_BINARY", "KILOSORT_FILES",
           "UNITS_UV", "UNITS_WHITENED", "check_format", "format_dtype", "check_folder",
           "FolderOutput", "run_kilosort", "run_nwb"]

log = logging.getLogger("dspk.pipeline")

#: what `Pipeline.run` writes: an HDF5 file, a Kilosort folder, an NWB file
FORMATS = ("hdf5", "kilosort", "nwb")
#: int16 steps per noise SD of whitened traces in a Kilosort folder: Kilosort4 stores its
#: whitened data times 200 (``save_preprocessing``: ``temp_wh.dat``)
KILOSORT_STEPS_PER_SD = 200.0
#: the flat binary of a Kilosort folder
KILOSORT_BINARY = "traces.bin"
#: every file of a Kilosort folder (a folder holding anything else is never replaced)
KILOSORT_FILES = (KILOSORT_BINARY, "chanMap.json", "chanMap.mat", "probe.json", "params.py",
                  "fitted.h5", "dspk.json")
#: the resume record inside a partial Kilosort folder
_PROGRESS = "progress.json"


# -- before any work ---------------------------------------------------------------------------
def check_format(format: str, layout: str, compression: str | None, resume: bool,
                 pipeline: Any) -> str:
    """``format``, after refusing the options it cannot honour: an unknown format; for
    ``"kilosort"`` and ``"nwb"``, a layout other than [samples, channels], compression, a
    detecting pipeline (its spikes belong in an HDF5 output); ``resume`` for ``"nwb"``.

    Parameters
    ----------
    format : {"hdf5", "kilosort", "nwb"}
    layout, compression, resume :
        As for `Pipeline.run`.
    pipeline : Pipeline

    Raises
    ------
    PipelineError
        Naming the option and what it takes.

    Examples
    --------
    >>> import dspk
    >>> from dspk.pipeline.handoff import check_format
    >>> p = dspk.Pipeline.from_options(whiten=None)
    >>> check_format("kilosort", "samples_channels", None, False, p)
    'kilosort'
    >>> check_format("phy", "samples_channels", None, False, p)      # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: format: expected one of 'hdf5', 'kilosort', 'nwb', got 'phy'
    """
    if format not in FORMATS:
        raise PipelineError(f"format: expected one of {', '.join(map(repr, FORMATS))}, got "
                            f"{format!r}")
    if format == "hdf5":
        return format
    said = arg("format", format)
    if layout != LAYOUTS[0]:
        raise PipelineError(f"layout: {said} writes [samples, channels] as "
                            f"{'Kilosort' if format == 'kilosort' else 'NWB'} reads it; leave "
                            f"{arg('layout')} out")
    if compression is not None:
        why = "what Kilosort and Phy read" if format == "kilosort" else "written in place"
        raise PipelineError(f"compression: {said} writes the traces uncompressed ({why}); "
                            f"leave {arg('compression')} out")
    if pipeline.sinks:
        raise PipelineError(f"detect: {said} holds the traces only; the spikes of "
                            f"{arg('detect', True)} are written to an HDF5 output (leave "
                            f"{arg('format')} out, or {arg('detect')} out: Kilosort detects "
                            f"its own)")
    if format == "nwb" and resume:
        raise PipelineError(f"resume: {said} is written in one go and cannot be resumed; "
                            f"leave {arg('resume')} out")
    return format


def format_dtype(format: str, output_dtype: Any) -> np.dtype:
    """The sample type an output of ``format`` stores: ``output_dtype`` when given, else
    int16 for a Kilosort folder (what Kilosort and Phy expect) and float32 otherwise.

    Examples
    --------
    >>> from dspk.pipeline.handoff import format_dtype
    >>> format_dtype("kilosort", None), format_dtype("hdf5", None), format_dtype("nwb", "int16")
    (dtype('int16'), dtype('float32'), dtype('int16'))
    """
    if output_dtype is None:
        return np.dtype(np.int16 if format == "kilosort" else np.float32)
    return np.dtype(output_dtype)


def _inside(path: Any, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies below it (links resolved)."""
    p, d = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return p == d or d in p.parents


def check_folder(out: str | os.PathLike, rec: Recording | None, overwrite: bool) -> Path:
    """Refuse a Kilosort output folder before any work: one that is or holds a file of the
    input (with ``overwrite`` or without); a path that exists and is not a folder; a
    folder that is not empty, unless ``overwrite`` and it holds a dspk Kilosort output and
    nothing else; a partial folder beside it that is not a dspk one; a missing or read-only
    parent folder.

    Parameters
    ----------
    out : path
        The output folder.
    rec : Recording, optional
        The input (`Recording.files`).
    overwrite : bool
        Whether an earlier dspk Kilosort output there may be replaced.

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    PipelineError

    Examples
    --------
    >>> import os, tempfile
    >>> from dspk.pipeline.handoff import check_folder
    >>> tmp = tempfile.TemporaryDirectory()
    >>> _ = open(os.path.join(tmp.name, "notes.txt"), "w").write("mine")
    >>> check_folder(tmp.name, None, overwrite=True)          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: ...: holds files dspk did not write (notes.txt); ...
    >>> check_folder(os.path.join(tmp.name, "notes.txt"), None, False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: ...notes.txt: is a file; format='kilosort' writes a folder: ...
    >>> tmp.cleanup()
    """
    out = Path(out)
    files = FolderOutput(out)
    for f in (() if rec is None else rec.files()):
        for folder in (out, files.partial):
            if _inside(f, folder):
                raise PipelineError(f"{folder}: is or holds a file of the input ({f}); the "
                                    f"input's files are never written, with "
                                    f"{arg('overwrite', True)} or without")
    if out.exists() and not out.is_dir():
        raise PipelineError(f"{out}: is a file; {arg('format', 'kilosort')} writes a folder: "
                            f"name a new or empty folder")
    if out.is_dir():
        found = sorted(p.name for p in out.iterdir())
        foreign = [name for name in found if name not in KILOSORT_FILES]
        if found and not overwrite:
            raise PipelineError(f"{out}: exists and is not empty; name a new or empty folder, "
                                f"or pass {arg('overwrite', True)} to replace the dspk "
                                f"Kilosort output there")
        if found and (foreign or "dspk.json" not in found):
            listed = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "") \
                if foreign else "no dspk.json"
            raise PipelineError(f"{out}: holds files dspk did not write ({listed}); dspk "
                                f"never deletes them, with {arg('overwrite', True)} or "
                                f"without: name another folder")
    partial = files.partial
    if partial.exists() and not partial.is_dir():
        raise PipelineError(f"{partial}: is a file where a job keeps its partial output "
                            f"folder; remove it or name another output")
    if partial.is_dir():
        foreign = [p.name for p in partial.iterdir()
                   if p.name not in KILOSORT_FILES + (_PROGRESS, _PROGRESS + ".tmp")]
        if foreign:
            raise PipelineError(f"{partial}: is not a dspk partial output (it holds "
                                f"{', '.join(sorted(foreign)[:5])}); remove it or name "
                                f"another output")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise PipelineError(f"{out}: its folder {parent} does not exist (create it first)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PipelineError(f"{out}: its folder {parent} is not writable")
    return out


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
    >>> from dspk.pipeline.handoff import FolderOutput
    >>> tmp = tempfile.TemporaryDirectory()
    >>> files = FolderOutput(os.path.join(tmp.name, "ks"))
    >>> with files.writing() as partial:
    ...     partial.mkdir()
    ...     _ = (partial / "params.py").write_text("offset = 0\\n")
    >>> sorted(os.listdir(tmp.name)), os.listdir(files.out)
    (['ks'], ['params.py'])
    >>> tmp.cleanup()
    """

    def __init__(self, out: str | os.PathLike) -> None:
        super().__init__(out)
        self.progress = self.partial / _PROGRESS

    def discard(self) -> None:
        """Delete the partial folder (`check_folder` refused one holding other files)."""
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


# -- the Kilosort folder -------------------------------------------------------------------------
def _plain(values: Any) -> list:
    """A per-channel array as JSON values (ints stay ints, anything else a string)."""
    v = np.asarray(values)
    return v.astype(np.int64).tolist() if v.dtype.kind in "iu" else [str(x) for x in v]


def _channel_ids(rec: Recording) -> list:
    return list(range(rec.n_channels)) if rec.channel_ids is None else _plain(rec.channel_ids)


def _resume_point(files: FolderOutput, job: Job, pipeline: Any) -> tuple:
    """(samples done, fitted states or None) of the partial folder a resumed job continues,
    or (0, None) to start over (said in the log)."""
    if not files.progress.is_file():
        log.warning("%s: nothing to resume (no partial output with a progress record); the "
                    "job starts from the beginning", files.partial)
        return 0, None
    try:
        record = files.read_record()
        states = pipeline.states if pipeline.is_fitted else \
            pipeline.read_fitted(files.partial / "fitted.h5")
        expected = job.record(states)
        if {k: record.get(k) for k in expected} != expected or \
                not all(s.is_fitted(st) for s, st in zip(pipeline.steps, states)):
            log.warning("%s: a partial job with other parameters; starting over",
                        files.partial)
            return 0, None
        done = int(record["done"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s: unreadable partial job (%s); starting over", files.partial, exc)
        return 0, None
    return done, None if pipeline.is_fitted else states


def run_kilosort(pipeline: Any, rec: Recording, out: str | os.PathLike, *,
                 chunk_s: float = 1.0, output_dtype: Any = None,
                 output_scale: float | None = None, overwrite: bool = False,
                 resume: bool = False, progress: bool = True,
                 on_chunk: OnChunk | None = None) -> tuple[Path, Job]:
    """Process ``rec`` into a Kilosort folder (see the module's description); checked
    before any work (`check_folder`, the job's options, what the stages need, and the
    geometry Kilosort's probe needs). `Pipeline.run` with ``format="kilosort"`` calls it.

    Parameters
    ----------
    pipeline : Pipeline
        Fitted first when it is not (or with the fitted state of the partial folder a
        resumed job continues).
    rec : Recording
    out : path
        The output folder.
    chunk_s, overwrite, resume, progress, on_chunk :
        As for `Pipeline.run`.
    output_dtype : int16 or float32, optional
        Default int16.
    output_scale : float, optional
        The units of one int16 step (default: 1/`KILOSORT_STEPS_PER_SD` of the noise SD when
        whitened, else 0.1 µV).

    Returns
    -------
    (pathlib.Path, Job)
        The folder, and the job that wrote it (its ``timing``: `Job.run_span`'s).
    """
    files = FolderOutput(check_folder(out, rec, overwrite))
    if rec.geometry is None:
        raise PipelineError(f"geometry: {arg('format', 'kilosort')} writes Kilosort's probe, "
                            f"which needs the channel positions: pass {arg('geometry')}")
    out_dtype = format_dtype("kilosort", output_dtype)
    whitened = pipeline.whitens
    if out_dtype == np.int16 and output_scale is None and whitened:
        output_scale = 1.0 / KILOSORT_STEPS_PER_SD
    job = Job(pipeline, rec, chunk_s=chunk_s, output_dtype=out_dtype,
              output_scale=output_scale)
    done, stored = _resume_point(files, job, pipeline) if resume else (0, None)
    if not resume and files.partial.exists():
        log.warning("%s: discarding the partial output of an earlier job (resume=True, "
                    "--resume on the command line, continues it instead)", files.partial)
    if stored is not None:
        for k, st in enumerate(stored):          # the fit the partial output was made with
            pipeline.set_fitted(k, st)
        log.info("%s: resuming at sample %d with the fitted state stored there", files.partial,
                 done)
    states = job.fitted_states()
    record = job.record(states)
    n = rec.n_samples
    binary = files.partial / KILOSORT_BINARY
    reached = [done]
    bar = progress_bar(progress, n, done, rec.fs)

    def chunk_done(samples: int) -> None:
        s1 = done + samples
        files.record(record, s1, {})            # committed: a resume starts after s1
        if bar is not None:
            bar.update(s1 - reached[0])
        reached[0] = s1
        if on_chunk is not None:
            on_chunk(s1)

    try:
        with files.writing(keep=lambda exc: resumable(exc) and files.progress.exists()):
            if done == 0:
                files.discard()
                files.partial.mkdir()
                with open(binary, "wb") as f:        # allocated: every sample is written
                    f.truncate(n * rec.n_channels * out_dtype.itemsize)
                with new_file(files.partial / "fitted.h5") as f:
                    pipeline.write_fitted(f, rec.fs, states)
            try:
                job.timing = job.run_span(binary, 0, done, n, on_chunk=chunk_done)
            finally:
                if bar is not None:
                    bar.close()
            _write_kilosort_files(files.partial, rec, job, record, pipeline.options(),
                                  whitened)
    except KeyboardInterrupt as exc:
        raise JobInterrupted(files.out, reached[0], n, rec.fs,
                             files.progress.exists()) from exc
    return files.out, job


def _write_kilosort_files(folder: Path, rec: Recording, job: Job, record: dict, steps: list,
                          whitened: bool) -> None:
    """The probe (three forms), Phy's params.py and dspk.json beside the binary."""
    shanks = rec.shank_ids
    contact_ids = rec.contact_ids
    write_kilosort_probe(folder / "chanMap.json", rec.geometry, shanks)
    write_chanmap_mat(folder / "chanMap.mat", rec.geometry, shanks, fs=rec.fs)
    write_probeinterface(folder / "probe.json", rec.geometry, shanks,
                         contact_ids=None if contact_ids is None else _plain(contact_ids))
    write_phy_params(folder / "params.py", KILOSORT_BINARY, rec.n_channels, job.out_dtype,
                     rec.fs, offset=0, hp_filtered=True)
    about = {"format": "kilosort", "dspk": __version__, "binary": KILOSORT_BINARY,
             "dtype": job.out_dtype.name, "offset": 0, "layout": LAYOUTS[0],
             "n_samples": rec.n_samples, "n_channels": rec.n_channels, "fs": rec.fs,
             "scale": job.scale, "units": UNITS_WHITENED if whitened else UNITS_UV,
             "whitened": whitened, "source": rec.source, "channel_ids": _channel_ids(rec),
             "shank_ids": None if shanks is None else _plain(shanks),
             "pipeline": steps, "job": record}
    (folder / "dspk.json").write_text(json.dumps(about, indent=1) + "\n")


# -- the NWB file --------------------------------------------------------------------------------
def _steps_text(steps: list) -> str:
    """The pipeline's steps as one line: ``HighPass(cutoff_hz=300.0) -> ...``."""
    def one(s: dict) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in s.items() if k != "step")
        return f"{s['step']}({fields})"
    return " -> ".join(one(s) for s in steps) or "no steps"


def run_nwb(pipeline: Any, rec: Recording, out: str | os.PathLike, *, chunk_s: float = 1.0,
            output_dtype: Any = None, output_scale: float | None = None,
            overwrite: bool = False, progress: bool = True,
            on_chunk: OnChunk | None = None) -> tuple[Path, Job]:
    """Process ``rec`` into an NWB file (see the module's description); checked before any
    work (`dspk.pipeline.output.check_output`, the job's options, what the stages need).
    `Pipeline.run` with ``format="nwb"`` calls it.

    Parameters
    ----------
    pipeline : Pipeline
        Fitted first when it is not.
    rec : Recording
    out : path
        The output file (``.nwb``).
    chunk_s, overwrite, progress, on_chunk :
        As for `Pipeline.run`.
    output_dtype : float32 or int16, optional
        Default float32.
    output_scale : float, optional
        The units of one int16 step (`dspk.pipeline.output.int16_scale`).

    Returns
    -------
    (pathlib.Path, Job)
        The file, and the job that wrote it (its ``timing``: `Job.run_span`'s).
    """
    files = PartialOutput(check_output(out, rec, overwrite))
    pynwb_module()                              # before any work: a clear error without it
    out_dtype = format_dtype("nwb", output_dtype)
    job = Job(pipeline, rec, chunk_s=chunk_s, output_dtype=out_dtype,
              output_scale=output_scale)
    if files.partial.exists():
        log.warning("%s: discarding the partial output of an earlier job", files.partial)
    states = job.fitted_states()
    steps = pipeline.options()
    whitened = pipeline.whitens
    unit = "the noise's standard deviation (whitened), not volts" if whitened else "µV"
    description = (f"{rec.source} processed by dspk {__version__}; data x conversion x 1e6 "
                   f"is in {unit}")
    start = rec.start if isinstance(rec, SubsetRecording) else 0
    n = rec.n_samples
    bar = progress_bar(progress, n, 0, rec.fs)
    reached = [0]

    def chunk_done(samples: int) -> None:
        if bar is not None:
            bar.update(samples - reached[0])
        reached[0] = samples
        if on_chunk is not None:
            on_chunk(samples)

    try:
        with files.writing():
            files.discard()
            offset = create_processed_series(
                files.partial, n_samples=n, fs=rec.fs, dtype=out_dtype,
                conversion=job.scale * 1e-6, description=description,
                filtering=f"dspk {__version__}: {_steps_text(steps)} (fingerprint "
                          f"{job.record(states)['fingerprint'][:16]})",
                geometry=rec.geometry, shank_ids=rec.shank_ids,
                channel_ids=_channel_ids(rec), starting_time=start / rec.fs,
                session_description=f"{rec.source}, processed by dspk",
                **input_metadata(rec.files()))
            try:
                job.timing = job.run_span(files.partial, offset, 0, n,
                                          on_chunk=chunk_done)
            finally:
                if bar is not None:
                    bar.close()
    except KeyboardInterrupt:
        log.warning("%s: interrupted; an NWB output is not resumable and nothing was kept",
                    files.out)
        raise
    return files.out, job
