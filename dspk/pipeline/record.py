"""What a dspk output says about itself, in one place: the fitted state of the pipeline that
wrote it (`write_fitted`, `read_fitted`; a pipeline's own file: `save_pipeline`,
`read_pipeline`), the job's record (`job_record`, its `fingerprint`: a resumed job must
match it), the metadata beside the traces (`write_metadata` for HDF5, `kilosort_about` for a
Kilosort folder's ``dspk.json``, `peaks_about` for ``dspk detect``'s ``detect.json``), and
`describe`, which reads any of them back (``dspk info``, `dspk.spikeinterface.read_dspk`).

Every output carries the input's channel metadata, each where its readers look for it
(`channel_metadata`): the channel ids (SpikeInterface's: ``"imec0.ap#AP0"`` for SpikeGLX,
``"CH0"`` for Open Ephys), the shanks, the probe's contact ids and the ADC sample shifts (not
once a ``PhaseShift`` step has corrected them: `output_sample_shifts`).

The writers here decide the order in which HDF5 objects and JSON keys are written: that order
is part of an output's bytes (two runs of one job write the same file), so it changes only
with a new version of the format.

Examples
--------
>>> import os, tempfile
>>> import numpy as np, dspk
>>> from dspk.pipeline.record import describe
>>> tmp = tempfile.TemporaryDirectory()
>>> rec = dspk.open_recording(np.ones((3000, 2), np.float32), fs=3e4)
>>> out = dspk.Pipeline.from_options(whiten="global").run(rec, os.path.join(tmp.name, "o.h5"),
...                                                       progress=False)
>>> about = describe(out)
>>> about["format"], about["steps"], about["n_samples"], about["units"]
('hdf5', ['HighPass', 'Reference', 'Whiten'], 3000, 'whitened (noise SD)')
>>> sorted(about["fitted"]["step2_Whiten"])
['W']
>>> tmp.cleanup()
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from typing import Any, Sequence

import numpy as np

from .._version import __version__
from ..io import Recording, RecordingError
from ..io.hdf5 import h5py_module, is_hdf5, output_channels, pipeline_steps
from ..io.rawio import create_dataset
from . import registry
from .errors import PipelineError

__all__ = ["UNITS_UV", "UNITS_WHITENED", "FITTED_GROUP", "stage_options", "write_fitted",
           "read_fitted", "save_pipeline", "read_pipeline", "fingerprint", "job_record",
           "write_metadata", "channel_ids", "utf8", "plain", "json_channel_ids",
           "output_sample_shifts", "channel_metadata", "kilosort_about", "zarr_about",
           "peaks_about", "describe", "is_output"]

#: the ``units`` of stored traces: what ``raw x gain_to_uv`` is in, µV (as SpikeInterface
#: writes it) or, after whitening, the noise's standard deviation
UNITS_UV, UNITS_WHITENED = "uV", "whitened (noise SD)"
#: the group of an HDF5 output (or of a Kilosort folder's ``fitted.h5``) holding the fitted
#: state: ``fitted/step{k}_{Name}/{key}``
FITTED_GROUP = "fitted"


def stage_options(steps: Sequence[Any]) -> list:
    """The stages as JSON-able dicts, ``{"step": class name, **its fields}`` each: what an
    output and a saved pipeline store of them (`Pipeline.options`).

    Parameters
    ----------
    steps : sequence of Stage

    Examples
    --------
    >>> from dspk.pipeline import Reference
    >>> from dspk.pipeline.record import stage_options
    >>> stage_options([Reference("mean")])
    [{'step': 'Reference', 'operator': 'mean', 'groups': 'none'}]
    """
    return [{"step": type(s).__name__, **asdict(s)} for s in steps]


# -- the fitted state ------------------------------------------------------------------------------
def write_fitted(f: Any, steps: Sequence[Any], fs: float, states: Sequence[dict]) -> None:
    """The fitted state into an open HDF5 output: ``/fitted/step{k}_{Name}/{key}`` for each
    fitted array of each stage, and what a stage writes for the record (a filter's taps at
    ``fs``); `read_fitted` reads it back.

    Parameters
    ----------
    f : h5py.File or Group
    steps : sequence of Stage
        The pipeline's stages.
    fs : float
        The sampling rate (of the taps).
    states : sequence of dict
        One fitted state per stage.

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np
    >>> from dspk.pipeline import Whiten
    >>> from dspk.pipeline.record import read_fitted, write_fitted
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "o.h5")
    >>> with h5py.File(path, "w") as f:
    ...     write_fitted(f, [Whiten("global")], 30000.0, [{"W": np.eye(2)}])
    >>> read_fitted([Whiten("global")], path)[0]["W"].shape
    (2, 2)
    >>> tmp.cleanup()
    """
    for k, (step, st) in enumerate(zip(steps, states)):
        group = f"{FITTED_GROUP}/step{k}_{type(step).__name__}"
        for key in step.fitted:
            if key in st:
                create_dataset(f, f"{group}/{key}", data=st[key])
        for key, value in step.record(fs).items():
            create_dataset(f, f"{group}/{key}", data=value)


def read_fitted(steps: Sequence[Any], path: str | os.PathLike) -> list:
    """The fitted state that `write_fitted` stored in a file, one dict per stage of
    ``steps`` (float64 arrays; a stage's key the file does not hold is left out).

    Parameters
    ----------
    steps : sequence of Stage
    path : path
        An output (or its partial file), or a Kilosort folder's ``fitted.h5``.

    Returns
    -------
    list of dict

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.record import read_fitted
    >>> tmp = tempfile.TemporaryDirectory()
    >>> p = dspk.Pipeline.from_options(whiten="global")
    >>> rec = dspk.open_recording(np.random.default_rng(0).standard_normal((2, 3000)), fs=3e4)
    >>> out = p.run(rec, os.path.join(tmp.name, "o.h5"), progress=False)
    >>> bool(np.array_equal(read_fitted(p.steps, out)[-1]["W"], p.states[-1]["W"]))
    True
    >>> tmp.cleanup()
    """
    states: list = [{} for _ in steps]
    with h5py_module().File(path, "r") as f:
        for k, step in enumerate(steps):
            group = f.get(f"{FITTED_GROUP}/step{k}_{type(step).__name__}")
            for key in step.fitted:
                if group is not None and key in group:
                    states[k][key] = np.asarray(group[key][()], dtype=np.float64)
    return states


def _fitted_groups(f: Any) -> dict:
    """Every array under an open file's ``/fitted``, by group (``"step2_Whiten"``)."""
    fitted = f.get(FITTED_GROUP)
    if fitted is None:
        return {}
    return {name: {key: fitted[name][key][()] for key in fitted[name]} for name in fitted}


# -- a pipeline's file ----------------------------------------------------------------------------
def save_pipeline(path: str | os.PathLike, steps: Sequence[Any], states: Sequence[dict],
                  **meta: Any) -> None:
    """A pipeline's stages and fitted arrays to an .npz file (`Pipeline.save`): ``meta``
    (JSON: the stages' options, ``backend``, ``dtype``, ``fs``, the version) and each
    fitted array as ``{key}{k}`` (no pickles).

    Parameters
    ----------
    path : path
    steps : sequence of Stage
    states : sequence of dict
    **meta
        ``backend``, ``dtype``, ``fs``.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from dspk.pipeline import Whiten
    >>> from dspk.pipeline.record import read_pipeline, save_pipeline
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "p.npz")
    >>> save_pipeline(path, [Whiten("global")], [{"W": np.eye(2)}], backend="cpu",
    ...               dtype="float32", fs=3e4)
    >>> meta, steps, states = read_pipeline(path)
    >>> meta["fs"], steps, states[0]["W"].shape
    (30000.0, [Whiten(mode='global', n_neighbors=32, eps=None, groups='none')], (2, 2))
    >>> tmp.cleanup()
    """
    arrays = {f"{key}{k}": st[key] for k, (step, st) in enumerate(zip(steps, states))
              for key in step.fitted if key in st}
    meta = {"steps": stage_options(steps),
            "backend": meta["backend"], "dtype": meta["dtype"], "fs": meta["fs"],
            "dspk": __version__}
    np.savez(path, meta=json.dumps(meta), **arrays)


def read_pipeline(path: str | os.PathLike) -> tuple:
    """What `save_pipeline` stored: (meta, the stages — registered classes, by name — and
    their fitted states).

    Parameters
    ----------
    path : path
    """
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        steps = []
        for spec in meta["steps"]:
            spec = dict(spec)
            steps.append(registry.stage_class(spec.pop("step"), str(path))(**spec))
        states: list = [{} for _ in steps]
        for k, step in enumerate(steps):
            for key in step.fitted:
                if f"{key}{k}" in z:
                    states[k][key] = z[f"{key}{k}"]
    return meta, steps, states


# -- the job's record and the metadata -------------------------------------------------------------
def fingerprint(steps: Sequence[Any], states: Sequence[dict], dtype: Any) -> str:
    """A digest of a pipeline's stages (their options), its processing dtype and its fitted
    arrays: the job record's ``fingerprint`` (a resumed job must match it).

    Parameters
    ----------
    steps : sequence of Stage
    states : sequence of dict
    dtype : numpy dtype

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline import Whiten
    >>> from dspk.pipeline.record import fingerprint
    >>> a = fingerprint([Whiten("global")], [{"W": np.eye(2)}], np.float32)
    >>> len(a), a == fingerprint([Whiten("global")], [{"W": 2 * np.eye(2)}], np.float32)
    (64, False)
    """
    h = hashlib.sha256(json.dumps(stage_options(steps), sort_keys=True).encode())
    h.update(str(np.dtype(dtype)).encode())
    for step, st in zip(steps, states):
        for key in step.fitted:
            if key in st:
                h.update(np.ascontiguousarray(st[key]).tobytes())
    return h.hexdigest()


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
    >>> from dspk.pipeline.record import job_record
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
    follows (`write_fitted`).

    What a reader finds (`describe` and ``dspk.spikeinterface.read_dspk`` read all of it):

    - ``/traces`` attributes ``fs``, ``layout``, ``gain_to_uv`` (the units of one stored
      step: 1 for float32, the int16 scale), ``geometry`` (when known) and ``units``
      (`UNITS_UV`, or `UNITS_WHITENED`: whitened traces are in units of the noise's standard
      deviation, not µV, whatever ``gain_to_uv`` is called);
    - ``/geometry`` [channels, 2] µm (when known);
    - ``/channel_ids`` [channels]: the input's channel ids (`channel_ids`: int64, or UTF-8
      strings);
    - ``/shank_ids`` [channels] int64, when the input says them (`Recording.shank_ids`);
    - ``/contact_ids`` [channels] UTF-8 strings, the probe's contact ids, when the input says
      them (`Recording.contact_ids`: SpikeGLX and Open Ephys Neuropixels probes);
    - ``/sample_shifts`` [channels] float64, the ADC sample shifts in samples (SpikeInterface's
      ``inter_sample_shift``), when the input says them and no ``PhaseShift`` step corrected
      them (`output_sample_shifts`).

    `dspk.io.HDF5Recording` reads these four back (`dspk.open_recording` of the output).

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
    >>> from dspk.pipeline.record import job_record, write_metadata
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
    # after the shanks (an input without these two writes the bytes it wrote before)
    if rec.contact_ids is not None:
        create_dataset(f, "contact_ids", data=utf8(rec.contact_ids))
    shifts = output_sample_shifts(rec, steps)
    if shifts is not None:
        create_dataset(f, "sample_shifts", data=shifts)


def channel_ids(rec: Recording) -> np.ndarray:
    """The channel ids an HDF5 output stores for ``rec``: its `Recording.channel_ids`
    (integers as int64, anything else as fixed-length UTF-8 strings, which h5py stores as
    such), or the channel indices when it names none.

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
    >>> from dspk.pipeline.record import channel_ids
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
    return utf8(ids)


def utf8(values: Any) -> np.ndarray:
    """Per-channel text as an HDF5 output stores it: fixed-length UTF-8 strings (h5py's
    string dtype, as wide as the longest), which h5py, pynwb and MATLAB read as text.

    Parameters
    ----------
    values : array-like
        Anything with a text form (each value's ``str``).

    Returns
    -------
    numpy.ndarray
        bytes (``S``) with h5py's UTF-8 string dtype.

    Examples
    --------
    >>> from dspk.pipeline.record import utf8
    >>> utf8(["e0", "s1e40"])
    array([b'e0', b's1e40'], dtype='|S5')
    """
    encoded = [str(v).encode("utf-8") for v in np.asarray(values).tolist()]
    h5py = h5py_module()
    width = max(1, max((len(v) for v in encoded), default=1))
    return np.array(encoded, dtype=h5py.string_dtype("utf-8", width))


def plain(values: Any) -> list:
    """A per-channel array as JSON values: integers stay integers, anything else a string.

    Parameters
    ----------
    values : array-like

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline.record import plain
    >>> plain(np.array([3, 5], np.int32)), plain(["a", 1])
    ([3, 5], ['a', '1'])
    """
    v = np.asarray(values)
    return v.astype(np.int64).tolist() if v.dtype.kind in "iu" else [str(x) for x in v]


def json_channel_ids(rec: Recording) -> list:
    """The channel ids as JSON values (`plain`; the channel indices when the recording names
    none): a Kilosort folder's and an NWB file's.

    Parameters
    ----------
    rec : Recording

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.record import json_channel_ids
    >>> json_channel_ids(dspk.open_recording(np.zeros((10, 2), np.int16), fs=3e4))
    [0, 1]
    """
    return list(range(rec.n_channels)) if rec.channel_ids is None else plain(rec.channel_ids)


def output_sample_shifts(rec: Recording, steps: Sequence[dict]) -> np.ndarray | None:
    """The ADC sample shifts an output carries for its channels (float64, in samples of the
    output: a decimated recording's are the input's / q): the input's
    `Recording.sample_shifts`, or None where it has none or where a ``PhaseShift`` step
    corrected them (the traces are then aligned; a reader that shifted them again would
    misalign them, so SpikeInterface's property is dropped too).

    Parameters
    ----------
    rec : Recording
        The input (as the output sees it).
    steps : sequence of dict
        `Pipeline.options`.

    Returns
    -------
    numpy.ndarray or None

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.record import output_sample_shifts
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=3e4)
    >>> rec.sample_shifts = np.array([0.0, 1 / 13])
    >>> output_sample_shifts(rec, [{"step": "HighPass"}]) * 13
    array([0., 1.])
    >>> output_sample_shifts(rec, [{"step": "PhaseShift"}]) is None
    True
    """
    shifts = rec.sample_shifts
    if shifts is None or any(s.get("step") == "PhaseShift" for s in steps):
        return None
    return np.asarray(shifts, dtype=np.float64)


def channel_metadata(rec: Recording, steps: Sequence[dict]) -> dict:
    """The channel metadata every output carries, as JSON values (a Kilosort or Zarr
    folder's ``dspk.json``, an NWB file's electrodes columns): ``channel_ids``
    (`json_channel_ids`), ``shank_ids`` (integers), ``contact_ids`` (strings) and
    ``sample_shifts`` (`output_sample_shifts`, floats), each None where the input does not
    say it (the channel ids are then the indices).

    Parameters
    ----------
    rec : Recording
        The input.
    steps : sequence of dict
        `Pipeline.options`.

    Returns
    -------
    dict

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.record import channel_metadata
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=3e4)
    >>> channel_metadata(rec, [])
    {'channel_ids': [0, 1], 'shank_ids': None, 'contact_ids': None, 'sample_shifts': None}
    """
    shanks, contacts = rec.shank_ids, rec.contact_ids
    shifts = output_sample_shifts(rec, steps)
    return {"channel_ids": json_channel_ids(rec),
            "shank_ids": None if shanks is None else plain(shanks),
            "contact_ids": None if contacts is None else [str(v) for v in
                                                          np.asarray(contacts).tolist()],
            "sample_shifts": None if shifts is None else [float(v) for v in shifts]}


def kilosort_about(rec: Recording, binary: str, out_dtype: Any, scale: float, whitened: bool,
                   steps: list, job: dict) -> dict:
    """A Kilosort folder's ``dspk.json``: what it holds (``scale`` and ``units``: one stored
    step is ``scale`` of ``units``), the channels' ids, shanks, contact ids and sample shifts
    (`channel_metadata`), the pipeline's steps and the job's record (`describe` reads it
    back).

    Parameters
    ----------
    rec : Recording
        The input.
    binary : str
        The flat binary's name in the folder.
    out_dtype : int16 or float32
    scale : float
        The units of one stored step.
    whitened : bool
    steps : list of dict
        `Pipeline.options`.
    job : dict
        `job_record`.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.record import kilosort_about
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=3e4)
    >>> about = kilosort_about(rec, "traces.bin", np.int16, 0.005, True, [], {})
    >>> about["units"], about["channel_ids"], about["offset"]
    ('whitened (noise SD)', [0, 1], 0)
    """
    # the order of the keys is the order of the file's lines (two runs write the same file)
    return {"format": "kilosort", "dspk": __version__, "binary": binary,
            "dtype": np.dtype(out_dtype).name, "offset": 0, "layout": "samples_channels",
            "n_samples": rec.n_samples, "n_channels": rec.n_channels, "fs": rec.fs,
            "scale": scale, "units": UNITS_WHITENED if whitened else UNITS_UV,
            "whitened": whitened, "source": rec.source, **channel_metadata(rec, steps),
            "pipeline": steps, "job": job}


def zarr_about(rec: Recording, traces: str, out_dtype: Any, scale: float, units: str,
               whitened: bool, steps: list, job: dict) -> dict:
    """A Zarr folder's ``dspk.json`` (``format="zarr"``): what it holds (``scale`` of
    ``units`` per stored step), the channels' ids, shanks, contact ids and sample shifts
    (`channel_metadata`), the pipeline's steps and the job's record (`describe` reads it
    back).

    Parameters
    ----------
    rec : Recording
        The input.
    traces : str
        The traces' array in the folder (``traces_seg0``).
    out_dtype : int16 or float32
    scale : float
        The units of one stored step.
    units : str
        `UNITS_UV` or `UNITS_WHITENED`.
    whitened : bool
    steps : list of dict
        `Pipeline.options`.
    job : dict
        `job_record`.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.record import zarr_about
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=3e4)
    >>> about = zarr_about(rec, "traces_seg0", np.float32, 1.0, "uV", False, [], {})
    >>> about["format"], about["traces"], about["channel_ids"]
    ('zarr', 'traces_seg0', [0, 1])
    """
    # the order of the keys is the order of the file's lines (two runs write the same file)
    return {"format": "zarr", "dspk": __version__, "traces": traces,
            "dtype": np.dtype(out_dtype).name, "layout": "samples_channels",
            "n_samples": rec.n_samples, "n_channels": rec.n_channels, "fs": rec.fs,
            "scale": scale, "units": units, "whitened": whitened, "source": rec.source,
            **channel_metadata(rec, steps), "pipeline": steps, "job": job}


def peaks_about(rec: Recording, steps: list, n_peaks: int, units: str, files: Sequence[str]
                ) -> dict:
    """``dspk detect``'s ``detect.json``: the input, its rate and channel ids, the steps that
    ran, the peaks' count and the units of their amplitudes, and the files beside it.

    Parameters
    ----------
    rec : Recording
        The input.
    steps : list of dict
        `Pipeline.options`.
    n_peaks : int
    units : str
        The amplitudes' units (`UNITS_UV` or `UNITS_WHITENED`).
    files : sequence of str
        The peaks' and their locations' file names.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.record import peaks_about
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=3e4)
    >>> peaks_about(rec, [], 0, "uV", ("peaks.npy", "peak_locations.npy"))["channel_ids"]
    [0, 1]
    """
    ids = rec.channel_ids
    # each id as itself: an integer stays one, anything else its text
    jsonable = list(range(rec.n_channels)) if ids is None else \
        [int(v) if np.asarray(v).dtype.kind in "iu" else str(v) for v in ids]
    return {"dspk": __version__, "input": rec.source, "fs": rec.fs,
            "n_samples": rec.n_samples, "n_channels": rec.n_channels,
            "channel_ids": jsonable, "pipeline": steps, "n_peaks": int(n_peaks),
            "amplitude_units": units, "peaks": files[0], "peak_locations": files[1]}


# -- reading an output back ------------------------------------------------------------------------
def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _describe_hdf5(path: str, fitted: bool) -> dict:
    h5py = h5py_module()
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise RecordingError(f"{path} is not an HDF5 file ({exc})") from exc
    with f:
        steps = pipeline_steps(f)
        traces = f.get("traces")
        if steps is None or not isinstance(traces, h5py.Dataset) or traces.ndim != 2:
            raise RecordingError(f"{path} is not a dspk output (no /traces written by dspk); "
                                 f"open other files with dspk.open_recording or "
                                 f"SpikeInterface's readers")
        a = traces.attrs
        layout = _text(a.get("layout", "samples_channels"))
        n, c = traces.shape if layout == "samples_channels" else traces.shape[::-1]
        # outputs written before the attribute: whitened when a Whiten step ran
        units = _text(a["units"]) if "units" in a else \
            UNITS_WHITENED if "Whiten" in steps else UNITS_UV
        channels = output_channels(f, int(c), path)
        geometry = f["geometry"][()] if "geometry" in f else a.get("geometry")
        job = json.loads(_text(f.attrs["job"])) if "job" in f.attrs else None
        return {"format": "hdf5", "path": path, "steps": steps,
                "pipeline": json.loads(_text(f.attrs["pipeline"])),
                "fs": float(a["fs"]), "n_samples": int(n), "n_channels": int(c),
                "dtype": traces.dtype, "layout": layout,
                "scale": float(a.get("gain_to_uv", 1.0)), "units": units,
                "geometry": None if geometry is None else np.asarray(geometry, np.float64),
                **_channels(channels, int(c)),
                "job": job, "fitted": _fitted_groups(f) if fitted else None}


def _channels(found: dict, n_channels: int) -> dict:
    """`describe`'s channel metadata from what an output stores (None where it stores
    nothing): ``channel_ids`` (the indices for an output written before dspk stored them),
    ``shank_ids`` int64, ``contact_ids`` str, ``sample_shifts`` float64."""
    ids, shanks = found.get("channel_ids"), found.get("shank_ids")
    contacts, shifts = found.get("contact_ids"), found.get("sample_shifts")
    return {"channel_ids": np.arange(n_channels) if ids is None else np.asarray(ids),
            "shank_ids": None if shanks is None else np.asarray(shanks, np.int64),
            "contact_ids": None if contacts is None else np.asarray(contacts, dtype=str),
            "sample_shifts": None if shifts is None else np.asarray(shifts, np.float64)}


def _read_about(folder: str, fmt: str) -> dict:
    """A folder output's ``dspk.json``, refused when it says another format."""
    with open(os.path.join(folder, "dspk.json"), encoding="utf-8") as fh:
        about = json.load(fh)
    if about.get("format", "kilosort") != fmt:
        raise RecordingError(f"{folder} is not a dspk {fmt.capitalize()} folder (its dspk.json "
                             f"says format {about.get('format')!r})")
    return about


def _folder_fitted(folder: str, fitted: bool) -> dict | None:
    """The fitted state of a folder output's ``fitted.h5`` (empty without the file; None
    when not asked for)."""
    if not fitted:
        return None
    path = os.path.join(folder, "fitted.h5")
    if not os.path.isfile(path):
        return {}
    with h5py_module().File(path, "r") as f:
        return _fitted_groups(f)


def _about_common(about: dict, folder: str, fmt: str, fitted: bool) -> dict:
    """What `describe` gives of a Kilosort or Zarr folder from its ``dspk.json``."""
    steps = about.get("pipeline", [])
    c = int(about["n_channels"])
    return {"format": fmt, "path": folder, "dspk": about.get("dspk", "?"),
            "steps": [s["step"] for s in steps], "pipeline": steps, "fs": float(about["fs"]),
            "n_samples": int(about["n_samples"]), "n_channels": c,
            "dtype": np.dtype(about["dtype"]), "layout": about.get("layout", "samples_channels"),
            "scale": float(about["scale"]), "units": about.get("units", UNITS_UV),
            **_channels(about, c), "job": about.get("job"),
            "fitted": _folder_fitted(folder, fitted)}


def _describe_kilosort(folder: str, fitted: bool) -> dict:
    about = _read_about(folder, "kilosort")
    out = _about_common(about, folder, "kilosort", fitted)
    if about.get("channel_ids") is None:       # written before dspk stored them
        out["channel_ids"] = None
    out["geometry"] = None
    probe = os.path.join(folder, "chanMap.json")
    if os.path.isfile(probe):
        with open(probe, encoding="utf-8") as fh:
            ks = json.load(fh)
        out["geometry"] = np.c_[np.asarray(ks["xc"], float), np.asarray(ks["yc"], float)]
        # Kilosort's kcoords (floats) are the shanks: dspk.json's when it has them
        if out["shank_ids"] is None:
            out["shank_ids"] = np.asarray(ks.get("kcoords", np.zeros(len(out["geometry"]))),
                                          float).astype(np.int64)
    out.update(binary=about["binary"], offset=int(about.get("offset", 0)))
    return out


def _describe_zarr(folder: str, fitted: bool) -> dict:
    about = _read_about(folder, "zarr")
    out = _about_common(about, folder, "zarr", fitted)
    # the positions: the probe SpikeInterface's read_zarr reads (the root's .zattrs, JSON in
    # zarr v2: read without zarr), contact i on channel device_channel_indices[i]
    out["geometry"] = None
    attrs = os.path.join(folder, ".zattrs")
    if os.path.isfile(attrs):
        with open(attrs, encoding="utf-8") as fh:
            probes = (json.load(fh).get("probegroup") or {}).get("probes") or []
        if len(probes) == 1:
            xy = np.asarray(probes[0]["contact_positions"], np.float64)
            wired = np.asarray(probes[0].get("device_channel_indices", np.arange(len(xy))))
            geometry = np.full((out["n_channels"], 2), np.nan)
            geometry[wired[wired >= 0]] = xy[wired >= 0]
            out["geometry"] = geometry
    out["traces"] = about.get("traces", "traces_seg0")
    return out


def describe(path: str | os.PathLike, fitted: bool = True) -> dict:
    """What a dspk output holds, read back from its metadata: an HDF5 output (`Pipeline.run`,
    ``dspk preprocess``), a Kilosort folder (``format="kilosort"``) or a Zarr folder
    (``format="zarr"``).

    Parameters
    ----------
    path : path
        The output file or folder.
    fitted : bool
        Read the fitted state too (``"fitted"``; None when False).

    Returns
    -------
    dict
        ``format`` ("hdf5", "kilosort" or "zarr"), ``path``, ``steps`` (the stages'
        names, in order), ``pipeline`` (`Pipeline.options`), ``fs``, ``n_samples``,
        ``n_channels``, ``dtype`` and ``layout`` of the stored traces, ``scale`` (the units
        of one stored step) and ``units`` (`UNITS_UV` or `UNITS_WHITENED`), ``geometry``
        [channels, 2] µm, the channels' metadata (`channel_metadata`: ``channel_ids``,
        ``shank_ids`` int64, ``contact_ids`` str, ``sample_shifts`` float64; None where not
        stored), ``job`` (`job_record`), ``fitted`` (every fitted array by group,
        ``{"step2_Whiten": {"W": ...}}``); a Kilosort folder adds ``binary``, ``offset``
        and ``dspk`` (the version that wrote it), a Zarr folder ``traces`` (its array) and
        ``dspk``.

    Raises
    ------
    FileNotFoundError
        Nothing at ``path``.
    dspk.io.RecordingError
        A file that is not HDF5, or not a dspk output (the message begins with the path).

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.record import describe
    >>> tmp = tempfile.TemporaryDirectory()
    >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
    >>> rec = dspk.open_recording(x, fs=3e4, geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)])
    >>> out = dspk.Pipeline.from_options(whiten="global").run(
    ...     rec, os.path.join(tmp.name, "ks"), format="kilosort", progress=False)
    >>> about = describe(out)
    >>> about["format"], about["binary"], about["dtype"], about["scale"]
    ('kilosort', 'traces.bin', dtype('int16'), 0.005)
    >>> about["geometry"][:, 1].tolist()
    [0.0, 20.0, 40.0, 60.0]
    >>> tmp.cleanup()
    """
    path = os.fspath(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "dspk.json")):
        with open(os.path.join(path, "dspk.json"), encoding="utf-8") as fh:
            fmt = json.load(fh).get("format", "kilosort")
        return _describe_zarr(path, fitted) if fmt == "zarr" else \
            _describe_kilosort(path, fitted)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.isdir(path) or not is_hdf5(path):
        raise RecordingError(f"{path} is not an HDF5 file (nor a dspk Kilosort or Zarr "
                             f"folder)")
    return _describe_hdf5(path, fitted)


def is_output(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a dspk output that `describe` reads (an HDF5 file that dspk wrote,
    or a Kilosort or Zarr folder: one holding its ``dspk.json``).

    Parameters
    ----------
    path : path

    Examples
    --------
    >>> from dspk.pipeline.record import is_output
    >>> is_output("no such file")
    False
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "dspk.json"))
    if not (os.path.isfile(path) and is_hdf5(path)):
        return False
    with h5py_module().File(path, "r") as f:
        return pipeline_steps(f) is not None and "traces" in f
