"""Outputs that the tools a user sorts with read as they are — a Kilosort folder and an NWB
file — as they were called before `dspk.pipeline.outputs` held them
(`dspk.pipeline.outputs.KilosortOutput`, `dspk.pipeline.outputs.NWBOutput`): `run_kilosort`
and `run_nwb` are `Pipeline.run` with ``format="kilosort"`` or ``"nwb"``, the job returned
too; the other names are importable from here as before.

Examples
--------
>>> import os, tempfile
>>> import numpy as np, dspk
>>> from dspk.pipeline.handoff import run_kilosort
>>> tmp = tempfile.TemporaryDirectory()
>>> rec = dspk.open_recording(np.ones((3000, 2), np.float32), fs=3e4,
...                           geometry=np.c_[np.zeros(2), [0.0, 20.0]])
>>> out, job = run_kilosort(dspk.Pipeline.from_options(whiten="global"), rec,
...                         os.path.join(tmp.name, "ks"), progress=False)
>>> out.name, job.out_dtype
('ks', dtype('int16'))
>>> tmp.cleanup()
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..io import Recording
from .job import Job, OnChunk
from .outputs import (KILOSORT_BINARY, KILOSORT_FILES, KILOSORT_STEPS_PER_SD, FolderOutput,
                      KilosortOutput, NWBOutput, Output, formats, output_class)
from .record import UNITS_UV, UNITS_WHITENED

__all__ = ["FORMATS", "KILOSORT_STEPS_PER_SD", "KILOSORT_BINARY", "KILOSORT_FILES",
           "UNITS_UV", "UNITS_WHITENED", "check_format", "format_dtype", "check_folder",
           "FolderOutput", "run_kilosort", "run_nwb"]

#: what ``dspk preprocess --format`` offers (a snapshot at import:
#: `dspk.pipeline.outputs.formats` gives the registered formats)
FORMATS = formats(listed=True)


def check_format(format: str, layout: str, compression: str | None, resume: bool,
                 pipeline: Any) -> str:
    """``format``, after refusing the options it cannot honour
    (`dspk.pipeline.outputs.Output.check_options`).

    Parameters
    ----------
    format : str
        A registered format.
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
    >>> check_format("kilosort", "samples_channels", None, False,
    ...              dspk.Pipeline.from_options(whiten=None))
    'kilosort'
    """
    output_class(format).check_options(pipeline, layout, compression, resume)
    return format


def format_dtype(format: str, output_dtype: Any) -> np.dtype:
    """The sample type an output of ``format`` stores: ``output_dtype`` when given, else the
    format's (`dspk.pipeline.outputs.Output.default_dtype`).

    Examples
    --------
    >>> from dspk.pipeline.handoff import format_dtype
    >>> format_dtype("kilosort", None), format_dtype("hdf5", None), format_dtype("nwb", "int16")
    (dtype('int16'), dtype('float32'), dtype('int16'))
    """
    return np.dtype(output_class(format).default_dtype if output_dtype is None
                    else output_dtype)


def check_folder(out: str | os.PathLike, rec: Recording | None, overwrite: bool) -> Path:
    """Refuse a Kilosort output folder before any work (`dspk.pipeline.outputs.Output.check`
    of a `dspk.pipeline.outputs.KilosortOutput`).

    Parameters
    ----------
    out : path
        The output folder.
    rec : Recording, optional
        The input.
    overwrite : bool
        Whether an earlier dspk Kilosort output there may be replaced.

    Examples
    --------
    >>> import os, tempfile
    >>> from dspk.pipeline.handoff import check_folder
    >>> tmp = tempfile.TemporaryDirectory()
    >>> _ = open(os.path.join(tmp.name, "notes.txt"), "w").write("mine")
    >>> check_folder(os.path.join(tmp.name, "notes.txt"), None, False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: ...notes.txt: is a file; format='kilosort' writes a folder: ...
    >>> tmp.cleanup()
    """
    KilosortOutput(out, overwrite=overwrite).check(rec)
    return Path(out)


def _run(output: Output, pipeline: Any, rec: Recording, resume: bool, progress: bool,
         on_chunk: OnChunk | None, **job_options: Any) -> tuple[Path, Job]:
    output.check_options(pipeline, "samples_channels", None, resume)
    job = Job(pipeline, rec, output, **job_options)
    out = job.run(resume=resume, progress=progress, on_chunk=on_chunk)
    pipeline.last_run = job.timing
    return out, job


def run_kilosort(pipeline: Any, rec: Recording, out: str | os.PathLike, *,
                 chunk_s: float = 1.0, output_dtype: Any = None,
                 output_scale: float | None = None, overwrite: bool = False,
                 resume: bool = False, progress: bool = True,
                 on_chunk: OnChunk | None = None) -> tuple[Path, Job]:
    """Process ``rec`` into a Kilosort folder: `Pipeline.run` with ``format="kilosort"``.

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
        The folder, and the job that wrote it (its ``timing``).
    """
    return _run(KilosortOutput(out, overwrite=overwrite), pipeline, rec, resume, progress,
                on_chunk, chunk_s=chunk_s, output_dtype=output_dtype,
                output_scale=output_scale)


def run_nwb(pipeline: Any, rec: Recording, out: str | os.PathLike, *, chunk_s: float = 1.0,
            output_dtype: Any = None, output_scale: float | None = None,
            overwrite: bool = False, progress: bool = True,
            on_chunk: OnChunk | None = None) -> tuple[Path, Job]:
    """Process ``rec`` into an NWB file: `Pipeline.run` with ``format="nwb"``.

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
        The units of one int16 step (`dspk.pipeline.outputs.int16_scale`).

    Returns
    -------
    (pathlib.Path, Job)
        The file, and the job that wrote it (its ``timing``).
    """
    return _run(NWBOutput(out, overwrite=overwrite), pipeline, rec, False, progress,
                on_chunk, chunk_s=chunk_s, output_dtype=output_dtype,
                output_scale=output_scale)
