"""Writing NWB files through pynwb (which, with hdmf, is then what reads them back): a
processed ``ElectricalSeries`` in the ``ecephys`` processing module, with its electrodes
table, devices and electrode groups, whose samples are written afterwards, chunk by chunk.

`create_processed_series` writes the file with the series' data allocated and empty
(contiguous, uncompressed) and returns where its samples start in the file: the job that
fills them writes there with ``os.pwrite`` (`dspk.pipeline.Pipeline.run_span`), so no
recording is ever held in memory. Needs pynwb (``pip install pynwb``), imported when an NWB
file is written. dspk reads NWB files with h5py alone (`dspk.io.HDF5Recording`).

Examples
--------
>>> from dspk.io.nwb import SERIES_PATH
>>> SERIES_PATH
'/processing/ecephys/FilteredEphys/ElectricalSeriesProcessed'
"""

from __future__ import annotations

import os
import uuid
import warnings
from datetime import datetime, timezone
from typing import Any, Sequence

import numpy as np

from .._version import __version__
from .errors import RecordingError
from .hdf5 import h5py_module, is_hdf5
from .rawio import raw_offset

__all__ = ["create_processed_series", "input_metadata", "SUBJECT_TEXT", "pynwb_module", "MODULE",
           "CONTAINER", "SERIES", "SERIES_PATH", "NWB_DTYPES"]

#: the processing module, its container of filtered series and the series' name
MODULE, CONTAINER, SERIES = "ecephys", "FilteredEphys", "ElectricalSeriesProcessed"
#: where the series is in the file
SERIES_PATH = f"/processing/{MODULE}/{CONTAINER}/{SERIES}"
#: the sample types the series may hold
NWB_DTYPES = (np.dtype(np.float32), np.dtype(np.int16))


def pynwb_module() -> Any:
    """pynwb, or a clear error naming the package to install (NWB output needs it)."""
    try:
        import pynwb  # noqa: PLC0415 (optional: only NWB output needs it)
    except ImportError:
        raise RecordingError("writing NWB needs pynwb: pip install pynwb") from None
    return pynwb


def input_metadata(files: Sequence[Any]) -> dict:
    """What an NWB output takes over from an NWB input: the first NWB file among ``files``
    (a recording's `dspk.io.Recording.files`) gives its ``session_start_time`` (time-zone
    aware: UTC when the file's has no zone) and its subject (the text fields of
    ``/general/subject``, and ``date_of_birth``); an empty dict when none is an NWB file.

    Parameters
    ----------
    files : sequence of paths

    Returns
    -------
    dict
        ``session_start`` (datetime) and ``subject`` (pynwb ``Subject`` keywords), those
        the file has.

    Examples
    --------
    >>> from dspk.io.nwb import input_metadata
    >>> input_metadata([])
    {}
    """
    h5py = h5py_module()
    for path in files:
        if not (os.path.isfile(path) and is_hdf5(path)):
            continue
        with h5py.File(path, "r") as f:
            if _text(f.attrs.get("neurodata_type", "")) != "NWBFile":
                continue
            found: dict = {}
            when = _datetime(f.get("session_start_time"))
            if when is not None:
                found["session_start"] = when
            subject = f.get("general/subject")
            if subject is not None:
                fields = {k: _text(subject[k][()]) for k in SUBJECT_TEXT
                          if k in subject and subject[k].shape == ()}
                born = _datetime(subject.get("date_of_birth"))
                if born is not None:
                    fields["date_of_birth"] = born
                if fields:
                    found["subject"] = fields
            return found
    return {}


#: the text fields of an NWB subject that an output takes over
SUBJECT_TEXT = ("subject_id", "species", "sex", "age", "description", "genotype", "strain",
                "weight")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _datetime(dset: Any) -> datetime | None:
    """An NWB ISO 8601 date-time dataset, time-zone aware (UTC when it has no zone)."""
    if dset is None or dset.shape != ():
        return None
    try:
        when = datetime.fromisoformat(_text(dset[()]))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def create_processed_series(path: str | os.PathLike, *, n_samples: int, fs: float,
                            dtype: Any, conversion: float, description: str,
                            filtering: str, geometry: Any = None, shank_ids: Any = None,
                            channel_ids: Sequence[Any] | None = None,
                            starting_time: float = 0.0,
                            session_description: str = "processed by dspk",
                            session_start: datetime | None = None,
                            subject: dict | None = None,
                            device_description: str = "extracellular probe") -> int:
    """An NWB file holding one processed `ElectricalSeries` (``SERIES_PATH``) whose
    [samples, channels] data is allocated and not yet written; returns the byte offset of
    its samples (contiguous, in this machine's byte order) for the writer that fills them.

    The electrodes table has one row per channel: ``location`` ("unknown": dspk does not
    know the brain area), ``group`` / ``group_name`` (one electrode group per shank,
    ``shank0``, ``shank1``, ...), ``channel_name`` (the channel ids, which SpikeInterface's
    NWB reader takes as its channel ids) and, with a geometry, ``rel_x``, ``rel_y`` (µm:
    SpikeInterface's channel locations). The series stores ``conversion`` (volts per stored
    unit), ``rate`` and ``starting_time``, and the file records dspk as what generated it.

    Parameters
    ----------
    path : path
        The file to write (replaced when it exists).
    n_samples : int
    fs : float
        The sampling rate in Hz.
    dtype : float32 or int16
        The stored sample type.
    conversion : float
        Volts per stored unit (NWB's ``conversion``).
    description, filtering : str
        The series' ``description`` and ``filtering`` (what was done to the traces).
    geometry : [channels, 2] array, optional
        Contact positions in µm.
    shank_ids : [channels] int array, optional
        Each channel's shank (default: all on shank 0).
    channel_ids : sequence, optional
        Each channel's id (default: its index); one entry per channel, which also gives the
        channel count.
    starting_time : float
        Seconds from the session's start to the first sample.
    session_description : str
    session_start : datetime.datetime, optional
        Time-zone aware (default: now, in UTC).
    subject : dict, optional
        pynwb ``Subject`` keywords (``subject_id``, ``species``, ``sex``, ``age``, ...):
        dspk does not know the subject of a recording that does not say it (DANDI and
        nwbinspector require one; an NWB input's is taken over: `input_metadata`).
    device_description : str

    Returns
    -------
    int
        The byte offset of the series' samples in the file.

    Raises
    ------
    RecordingError
        pynwb missing, or arguments that do not describe one recording.

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np
    >>> from dspk.io.nwb import SERIES_PATH, create_processed_series
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "out.nwb")
    >>> offset = create_processed_series(
    ...     path, n_samples=3000, fs=30000.0, dtype=np.float32, conversion=1e-6,
    ...     description="high-passed", filtering="FIR high-pass 300 Hz",
    ...     geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)], channel_ids=range(4))
    >>> with h5py.File(path, "r") as f:
    ...     f[SERIES_PATH + "/data"].shape
    (3000, 4)
    >>> tmp.cleanup()
    """
    dtype = np.dtype(dtype)
    if dtype not in NWB_DTYPES:
        raise RecordingError(f"dtype: expected float32 or int16 samples, got {dtype}")
    if channel_ids is None:
        if geometry is None:
            raise RecordingError("channel_ids: give the channel ids or the geometry (the "
                                 "channel count)")
        channel_ids = range(len(np.asarray(geometry)))
    names = [str(v) for v in channel_ids]
    n_channels = len(names)
    if n_channels < 1 or int(n_samples) < 1:
        raise RecordingError(f"n_samples, channel_ids: expected at least one sample and one "
                             f"channel, got {n_samples} x {n_channels}")
    if not (np.isfinite(fs) and fs > 0):
        raise RecordingError(f"fs: expected a positive sampling rate in Hz, got {fs}")
    if not (np.isfinite(conversion) and conversion > 0):
        raise RecordingError(f"conversion: expected positive volts per unit, got {conversion}")
    xy = None if geometry is None else np.asarray(geometry, dtype=np.float64)
    if xy is not None and xy.shape != (n_channels, 2):
        raise RecordingError(f"geometry: expected [{n_channels}, 2] positions in µm, got "
                             f"shape {xy.shape}")
    shanks = np.zeros(n_channels, np.int64) if shank_ids is None else np.asarray(shank_ids)
    if shanks.shape != (n_channels,) or shanks.dtype.kind not in "iu":
        raise RecordingError(f"shank_ids: expected {n_channels} integers (one shank per "
                             f"channel), got {shanks.dtype} of shape {shanks.shape}")
    pynwb = pynwb_module()
    # hdmf comes with pynwb: its H5DataIO allocates the data without values
    from hdmf.backends.hdf5.h5_utils import H5DataIO  # noqa: PLC0415
    from pynwb.ecephys import FilteredEphys  # noqa: PLC0415

    nwb = pynwb.NWBFile(session_description=session_description,
                        identifier=str(uuid.uuid4()),
                        session_start_time=session_start or datetime.now(timezone.utc),
                        was_generated_by=[["dspk", __version__]],
                        subject=None if subject is None else pynwb.file.Subject(**subject))
    device = nwb.create_device(name="probe", description=device_description)
    groups = {int(s): nwb.create_electrode_group(name=f"shank{int(s)}",
                                                 description=f"the contacts of shank {int(s)}",
                                                 location="unknown", device=device)
              for s in np.unique(shanks)}
    nwb.add_electrode_column(name="channel_name", description="the channel's id")
    for i in range(n_channels):
        position = {} if xy is None else {"rel_x": float(xy[i, 0]), "rel_y": float(xy[i, 1])}
        nwb.add_electrode(group=groups[int(shanks[i])], location="unknown",
                          channel_name=names[i], **position)
    container = FilteredEphys(name=CONTAINER)
    nwb.create_processing_module(name=MODULE, description="extracellular traces processed "
                                 "by dspk").add(container)
    region = nwb.create_electrode_table_region(region=list(range(n_channels)),
                                               description="every channel")
    container.create_electrical_series(
        name=SERIES, data=H5DataIO(data=None, shape=(int(n_samples), n_channels), dtype=dtype),
        electrodes=region, starting_time=float(starting_time), rate=float(fs),
        conversion=float(conversion), description=description, filtering=filtering)
    with warnings.catch_warnings():
        # the job writes OUT.partial, renamed OUT (.nwb) when complete
        warnings.filterwarnings("ignore", message=".*does not end in '.nwb'")
        with pynwb.NWBHDF5IO(os.fspath(path), "w") as io:
            io.write(nwb)
    return _allocate(path)


def _allocate(path: str | os.PathLike) -> int:
    """Allocate the series' contiguous data (HDF5 allocates it at its first write; no fill
    values are written) and return its byte offset."""
    with h5py_module().File(path, "r+") as f:
        data = f[SERIES_PATH + "/data"]
        data[0] = np.zeros(data.shape[1], data.dtype)      # the first row: overwritten later
        offset = raw_offset(data)
    if offset is None:
        raise RecordingError(f"{path}: the series' data is not one contiguous block; cannot "
                             f"write it in place")
    return offset
