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

import logging
import os
import uuid
import warnings
from datetime import datetime, timezone
from typing import Any, Sequence

import numpy as np

from .._version import __version__
from ..argnames import arg
from .errors import RecordingError
from .hdf5 import h5py_module, is_hdf5
from .rawio import raw_offset
from .spikeglx import read_meta

log = logging.getLogger("dspk.io")

__all__ = ["create_processed_series", "input_metadata", "subject_fields", "SUBJECT_TEXT",
           "COLUMNS",
           "pynwb_module", "MODULE", "CONTAINER", "SERIES", "SERIES_PATH", "NWB_DTYPES"]

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
    """What an NWB output takes over from its input's files (a recording's
    `dspk.io.Recording.files`), from the first that says it:

    - an NWB file: its ``session_start_time`` (time-zone aware: UTC when the file's has no
      zone) and its subject (the text fields of ``/general/subject``, and
      ``date_of_birth``);
    - a SpikeGLX ``.meta``: the session's start from ``fileCreateTime`` (when SpikeGLX
      created the file, the acquisition computer's local time; CatGT's output keeps the
      acquisition's as ``fileCreateTime_original``, which wins). SpikeGLX writes no time
      zone and NWB requires one: the time is stored as written, marked UTC (not converted
      from this machine's zone, so that two machines write the same file). A ``.meta``
      without it, with an empty or unreadable one, or with the ``0000-00-00`` date that
      anonymised recordings carry gives no start: the output's session then starts when it
      is written, as for an input that does not say it (logged as a warning);
    - an Open Ephys recording's ``sync_messages.txt``: the session's start from its
      ``Software Time (milliseconds since midnight Jan 1st 1970 UTC)`` line (the GUI 0.6
      and later: the recording's start, in UTC); else its experiment's ``settings.xml``
      (`dspk.io.neuropixels.openephys_settings`) ``<INFO><DATE>`` (``"11 Sep 2025
      9:57:24"``: when the settings were saved, local time, marked UTC as SpikeGLX's is —
      what neuroconv takes).

    An empty dict when no file says anything.

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
    >>> import os, tempfile
    >>> from dspk.io.nwb import input_metadata
    >>> input_metadata([])
    {}
    >>> tmp = tempfile.TemporaryDirectory()
    >>> meta = os.path.join(tmp.name, "run_g0_t0.imec0.ap.meta")
    >>> _ = open(meta, "w").write("typeThis=imec\\nfileCreateTime=2024-03-01T10:00:00\\n")
    >>> input_metadata([meta])
    {'session_start': datetime.datetime(2024, 3, 1, 10, 0, tzinfo=datetime.timezone.utc)}
    >>> tmp.cleanup()
    """
    files = [os.fspath(p) for p in files if os.path.isfile(os.fspath(p))]
    for path in files:
        if path.lower().endswith(".meta"):
            return _spikeglx_metadata(path)
        if is_hdf5(path):
            found = _nwb_metadata(path)
            if found is not None:
                return found
    # Open Ephys: the recording's own start first, its experiment's settings' date else
    oebins = [p for p in files if os.path.basename(p) == "structure.oebin"]
    if oebins:
        from .neuropixels import openephys_settings  # noqa: PLC0415

        sync = os.path.join(os.path.dirname(oebins[0]), "sync_messages.txt")
        when = _openephys_software_time(sync) if os.path.isfile(sync) else None
        settings = openephys_settings(oebins[0])
        if when is None and settings is not None:
            when = _openephys_settings_date(settings)
        if when is not None:
            return {"session_start": when}
    return {}


def _openephys_software_time(path: str) -> datetime | None:
    """``sync_messages.txt``'s ``Software Time (milliseconds since midnight Jan 1st 1970
    UTC): N`` (Open Ephys GUI 0.6 and later), as a UTC datetime; None where it has none
    (the 0.5 GUI's ``Software time: N@1000Hz`` counts from the GUI's start)."""
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("Software Time") and "1970" in line:
                try:
                    ms = int(line.rsplit(":", 1)[1].strip())
                except ValueError:
                    return None
                return datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)
    return None


def _openephys_settings_date(path: str) -> datetime | None:
    """An Open Ephys ``settings.xml``'s ``<INFO><DATE>`` (``"11 Sep 2025 9:57:24"``, local
    time), marked UTC; None where it has none or it does not read."""
    import xml.etree.ElementTree as ET  # noqa: PLC0415

    try:
        date = ET.parse(path).getroot().findtext("INFO/DATE")
        return None if not date else \
            datetime.strptime(date.strip(), "%d %b %Y %H:%M:%S").replace(tzinfo=timezone.utc)
    except (ET.ParseError, ValueError):
        return None


def _nwb_metadata(path: str) -> dict | None:
    """An NWB file's session start and subject (`input_metadata`); None for another HDF5
    file."""
    with h5py_module().File(path, "r") as f:
        if _text(f.attrs.get("neurodata_type", "")) != "NWBFile":
            return None
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


def _spikeglx_metadata(meta_file: str) -> dict:
    """A SpikeGLX ``.meta``'s session start (`input_metadata`): ``fileCreateTime_original``
    (CatGT's) or ``fileCreateTime``, marked UTC; none (and a warning) where neither reads."""
    meta = read_meta(meta_file)
    key = "fileCreateTime_original" if meta.get("fileCreateTime_original") else \
        "fileCreateTime"
    text = meta.get(key, "").strip()
    try:
        when = datetime.fromisoformat(text) if text else None
    except ValueError:                          # "0000-00-00T00:00:00": anonymised, or edited
        when = None
    if when is None:
        log.warning("%s: %s %s; an NWB output's session_start_time is the time it is written",
                    meta_file, key, f"is {text!r}, not a date and time" if text else
                    "missing")
        return {}
    return {"session_start": when if when.tzinfo is not None else
            when.replace(tzinfo=timezone.utc)}


#: the optional columns of the electrodes table dspk writes and reads (with `channel_name`)
COLUMNS = {"contact_id": "the probe contact's id (probeinterface's contact_ids)",
           "inter_sample_shift": "the channel's ADC sample shift, in samples: how late its "
                                 "ADC sampled it within each sample period (SpikeInterface's "
                                 "inter_sample_shift)"}

#: the text fields of an NWB subject that an output takes over
SUBJECT_TEXT = ("subject_id", "species", "sex", "age", "description", "genotype", "strain",
                "weight")


def subject_fields(subject: dict) -> dict:
    """A subject for an NWB output, checked: pynwb ``Subject`` keywords, the text fields
    `SUBJECT_TEXT` (``subject_id``, ``species``, ``sex``, ``age``: an ISO 8601 duration such
    as ``"P90D"``, ...) as text and ``date_of_birth`` a datetime or its ISO 8601 text (UTC
    when it has no zone). DANDI and nwbinspector require a subject with a species and an age
    or a date of birth; dspk never invents one.

    Parameters
    ----------
    subject : dict

    Returns
    -------
    dict
        The same fields, ``date_of_birth`` a time-zone aware datetime.

    Raises
    ------
    RecordingError
        A field pynwb's ``Subject`` does not have (named, with those it has), or a date of
        birth that is not one.

    Examples
    --------
    >>> from dspk.io.nwb import subject_fields
    >>> subject_fields({"species": "Mus musculus", "age": "P90D"})
    {'species': 'Mus musculus', 'age': 'P90D'}
    """
    if not isinstance(subject, dict):
        raise RecordingError(f"subject: expected a dict of NWB Subject fields ({arg('subject')}), "
                             f"got {type(subject).__name__}")
    out: dict = {}
    for key, value in subject.items():
        if key == "date_of_birth":
            when = value
            if isinstance(value, str):
                try:
                    when = datetime.fromisoformat(value)
                except ValueError:
                    when = None
            if not isinstance(when, datetime):
                raise RecordingError(f"subject: date_of_birth: expected an ISO 8601 date and "
                                     f"time ({arg('subject')}), got {value!r}")
            out[key] = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
        elif key in SUBJECT_TEXT:
            out[key] = str(value)
        else:
            raise RecordingError(f"subject: {key!r} is not a field of an NWB Subject "
                                 f"({arg('subject')}); expected "
                                 f"{', '.join(SUBJECT_TEXT + ('date_of_birth',))}")
    return out


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
                            contact_ids: Sequence[Any] | None = None,
                            sample_shifts: Any = None,
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
    NWB reader takes as its channel ids), with a geometry ``rel_x``, ``rel_y`` (µm:
    SpikeInterface's channel locations), with contact ids ``contact_id`` (probeinterface's)
    and with sample shifts ``inter_sample_shift`` (the ADC shifts in samples: SpikeInterface's
    reader makes each column a property of that name). The series stores ``conversion``
    (volts per stored unit), ``rate`` and ``starting_time``, and the file records dspk as
    what generated it. `dspk.io.HDF5Recording` reads the channel ids, shanks, contact ids
    and sample shifts back.

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
    contact_ids : sequence, optional
        Each channel's probe contact id (text; no column without them).
    sample_shifts : [channels] array, optional
        Each channel's ADC sample shift in samples (no column without them).
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
    columns: dict = {}                     # the optional columns, each one value per channel
    if contact_ids is not None:
        columns["contact_id"] = [str(v) for v in contact_ids]
    if sample_shifts is not None:
        shifts = np.asarray(sample_shifts, dtype=np.float64)
        if shifts.shape != (n_channels,) or not np.all(np.isfinite(shifts)):
            raise RecordingError(f"sample_shifts: expected {n_channels} finite shifts (one per "
                                 f"channel), got shape {shifts.shape}")
        columns["inter_sample_shift"] = shifts.tolist()
    for key, values in columns.items():
        if len(values) != n_channels:
            raise RecordingError(f"{key}: expected {n_channels} values (one per channel), got "
                                 f"{len(values)}")
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
    for key in columns:
        nwb.add_electrode_column(name=key, description=COLUMNS[key])
    for i in range(n_channels):
        position = {} if xy is None else {"rel_x": float(xy[i, 0]), "rel_y": float(xy[i, 1])}
        nwb.add_electrode(group=groups[int(shanks[i])], location="unknown",
                          channel_name=names[i], **position,
                          **{key: values[i] for key, values in columns.items()})
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
