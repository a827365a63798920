"""A recording's events as one table of edges, whatever stored them: SpikeGLX's sync words
(the imec SY word, the NI-DAQ XD words: `dspk.io.sync.sync_events`) or Open Ephys' TTL
events (the ``events/<stream>/TTL/`` folder of a binary-format recording: ``states.npy``,
±line for a rising/falling edge of the 1-based line, and ``sample_numbers.npy`` on the
stream's clock). Each edge is a row of `dspk.io.sync.EVENT_DTYPE` (sample, bit, polarity,
time in seconds from the recording's first sample), sorted by sample then bit; an Open
Ephys TTL line L is bit L − 1, so that bits are numbered from 0 as SpikeGLX's and CatGT's
are.

`write_events_csv` writes the table as ``dspk events`` exports it (``bit,edge,sample,
seconds``: CatGT's edges, one row each, ``edge`` rising or falling).

Examples
--------
>>> import numpy as np
>>> from dspk.io import open_recording
>>> from dspk.io.events import recording_events
>>> rec = open_recording(np.zeros((100, 2), np.int16), fs=1000.0)
>>> recording_events(rec) is None                      # an array keeps no events
True
"""

from __future__ import annotations

import csv
import json
import os
from typing import Any

import numpy as np

from .errors import RecordingError
from .sync import EVENT_DTYPE, sync_events

__all__ = ["recording_events", "openephys_events", "has_events", "write_events_csv",
           "write_events_hdf5", "read_events_hdf5", "EVENTS_GROUP", "pulses",
           "write_events_nwb",
           "read_events_csv", "edge_counts", "EDGE_NAMES", "EVENTS_CSV_COLUMNS"]

#: the ``edge`` column's words for a polarity
EDGE_NAMES = {1: "rising", -1: "falling"}
#: the columns of `write_events_csv`
EVENTS_CSV_COLUMNS = ("bit", "edge", "sample", "seconds")


def _empty(fs: float | None = None) -> np.ndarray:
    return np.zeros(0, dtype=EVENT_DTYPE)


def _oe_event_folders(oebin: str, stream: str) -> list[str]:
    """The TTL event folders of ``stream`` in ``oebin``'s ``events`` list (its folder name's
    first part, or its ``stream_name``, the continuous stream's)."""
    with open(oebin, encoding="utf-8") as f:
        structure = json.load(f)
    streams = {str(s.get("folder_name", "")).strip().rstrip("/\\"): s
               for s in structure.get("continuous") or []}
    stream_name = str(streams.get(stream, {}).get("stream_name", "") or "")
    rec_dir = os.path.dirname(os.path.abspath(oebin))
    found = []
    for info in structure.get("events") or []:
        folder = str(info.get("folder_name", "")).strip().strip("/\\")
        first = folder.replace("\\", "/").split("/")[0]
        if first != stream and not (stream_name and info.get("stream_name") == stream_name
                                    and first == stream_name):
            continue
        path = os.path.join(rec_dir, "events", folder)
        if os.path.isfile(os.path.join(path, "states.npy")) or \
                os.path.isfile(os.path.join(path, "channel_states.npy")):
            found.append(path)
    return found


def _first_sample(recording: Any) -> int:
    """The stream's first sample number (``sample_numbers.npy``, or 0.5's
    ``timestamps.npy`` of integers; 0 without either)."""
    stream_dir = os.path.dirname(recording.path) if hasattr(recording, "path") else \
        os.path.join(os.path.dirname(recording.oebin), "continuous", recording.stream)
    for name in ("sample_numbers.npy", "timestamps.npy"):
        npy = os.path.join(stream_dir, name)
        if os.path.isfile(npy):
            first = np.load(npy, mmap_mode="r")[:1]
            if first.size and first.dtype.kind in "iu":
                return int(first[0])
    return 0


def openephys_events(recording: Any) -> np.ndarray:
    """The TTL edges of an Open Ephys recording's stream (its ``events/<stream>/TTL*/``
    folders named in ``structure.oebin``), in the sync table's form.

    ``states.npy`` (GUI ≥ 0.6; ``channel_states.npy`` before) holds +L for a rising and −L
    for a falling edge of TTL line L (1-based, as Neo reads it); ``sample_numbers.npy``
    (0.5: ``timestamps.npy``) the sample number on the stream's clock, from which the
    stream's first sample number (its own ``sample_numbers.npy``) is subtracted.

    Parameters
    ----------
    recording : OpenEphysRecording
        The stream (``oebin`` and ``stream`` attributes).

    Returns
    -------
    numpy.ndarray
        `dspk.io.sync.EVENT_DTYPE` rows (bit = line − 1), sorted by sample then bit; empty
        when the stream has no TTL events.

    Raises
    ------
    RecordingError
        A TTL folder whose states and sample numbers differ in length, or a state 0.

    Examples
    --------
    >>> import json, os, tempfile
    >>> import numpy as np
    >>> from dspk.io import open_recording
    >>> from dspk.io.events import openephys_events
    >>> tmp = tempfile.TemporaryDirectory()
    >>> rec_dir = os.path.join(tmp.name, "recording1")
    >>> stream = "Neuropix-PXI-100.ProbeA-AP"
    >>> os.makedirs(os.path.join(rec_dir, "continuous", stream))
    >>> os.makedirs(os.path.join(rec_dir, "events", stream, "TTL"))
    >>> chans = [{"channel_name": f"CH{i}", "bit_volts": 0.195} for i in (1, 2)]
    >>> with open(os.path.join(rec_dir, "structure.oebin"), "w") as f:
    ...     json.dump({"continuous": [{"folder_name": stream + "/", "sample_rate": 1000.0,
    ...                "num_channels": 2, "channels": chans}],
    ...                "events": [{"folder_name": stream + "/TTL/"}]}, f)
    >>> np.zeros((50, 2), np.int16).tofile(os.path.join(rec_dir, "continuous", stream,
    ...                                                  "continuous.dat"))
    >>> np.save(os.path.join(rec_dir, "continuous", stream, "sample_numbers.npy"),
    ...         np.arange(1000, 1050))
    >>> ttl = os.path.join(rec_dir, "events", stream, "TTL")
    >>> np.save(os.path.join(ttl, "states.npy"), np.array([1, -1, 3], np.int16))
    >>> np.save(os.path.join(ttl, "sample_numbers.npy"), np.array([1010, 1020, 1030]))
    >>> ev = openephys_events(open_recording(rec_dir))
    >>> ev[["sample", "bit", "polarity"]].tolist(), ev["time"].tolist()
    ([(10, 0, 1), (20, 0, -1), (30, 2, 1)], [0.01, 0.02, 0.03])
    >>> tmp.cleanup()
    """
    folders = _oe_event_folders(recording.oebin, recording.stream)
    first = _first_sample(recording)
    parts = []
    for path in folders:
        states_npy = os.path.join(path, "states.npy")
        if not os.path.isfile(states_npy):
            states_npy = os.path.join(path, "channel_states.npy")
        samples_npy = os.path.join(path, "sample_numbers.npy")
        if not os.path.isfile(samples_npy):
            samples_npy = os.path.join(path, "timestamps.npy")
        if not os.path.isfile(samples_npy):
            raise RecordingError(f"{path}: TTL states without sample_numbers.npy (or "
                                 f"timestamps.npy): the events cannot be placed")
        states = np.asarray(np.load(states_npy)).astype(np.int64).reshape(-1)
        samples = np.asarray(np.load(samples_npy)).reshape(-1)
        if samples.dtype.kind not in "iu":
            raise RecordingError(f"{samples_npy}: expected integer sample numbers, got "
                                 f"{samples.dtype}")
        if len(states) != len(samples):
            raise RecordingError(f"{path}: {len(states)} TTL states but {len(samples)} "
                                 f"sample numbers: the events folder looks damaged")
        if (states == 0).any():
            raise RecordingError(f"{states_npy}: a state 0 (expected +line for a rising, "
                                 f"-line for a falling edge)")
        ev = np.zeros(len(states), EVENT_DTYPE)
        ev["sample"] = samples.astype(np.int64) - first
        ev["bit"] = np.abs(states) - 1
        ev["polarity"] = np.sign(states)
        parts.append(ev)
    ev = np.concatenate(parts) if parts else _empty()
    ev = ev[np.lexsort((ev["bit"], ev["sample"]))]
    ev["time"] = ev["sample"] / float(recording.fs)
    return ev


def has_events(recording: Any) -> bool:
    """Whether a recording keeps events `recording_events` reads: sync words (SpikeGLX) or an
    Open Ephys stream (whose TTL folders may be empty).

    Parameters
    ----------
    recording : Recording

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import open_recording
    >>> from dspk.io.events import has_events
    >>> has_events(open_recording(np.zeros((10, 2), np.float32), fs=1e3))
    False
    """
    if int(getattr(recording, "n_sync_words", 0) or 0) > 0:
        return True
    parent = getattr(recording, "parent", None)
    if parent is not None:
        return has_events(parent)
    return hasattr(recording, "oebin") and hasattr(recording, "stream")


def recording_events(recording: Any, bits: Any = None) -> np.ndarray | None:
    """Every edge a recording keeps: its sync words' (`dspk.io.sync.sync_events`) or its Open
    Ephys TTL events (`openephys_events`); for a part of a recording (``--time``), the
    part's, numbered from its start.

    Parameters
    ----------
    recording : Recording
    bits : int or sequence of int, optional
        Only these bits (default: all).

    Returns
    -------
    numpy.ndarray or None
        `dspk.io.sync.EVENT_DTYPE` rows sorted by sample then bit; None for a recording that
        keeps no events (`has_events`).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import open_recording
    >>> from dspk.io.events import recording_events
    >>> print(recording_events(open_recording(np.zeros((10, 2), np.float32), fs=1e3)))
    None
    """
    if not has_events(recording):
        return None
    if int(getattr(recording, "n_sync_words", 0) or 0) > 0:
        return sync_events(recording, bits)
    parent = getattr(recording, "parent", None)
    if parent is not None:
        ev = recording_events(parent)
        start = int(getattr(recording, "start", 0) or 0)
        ev = ev[(ev["sample"] >= start) & (ev["sample"] < start + recording.n_samples)].copy()
        ev["sample"] -= start
        ev["time"] = ev["sample"] / float(recording.fs)
    else:
        ev = openephys_events(recording)
    if bits is not None:
        ev = ev[np.isin(ev["bit"], np.atleast_1d(np.asarray(bits)))]
    return ev


def edge_counts(events: np.ndarray) -> dict:
    """Each bit's rising and falling edges counted (what ``dspk info`` lists).

    Parameters
    ----------
    events : numpy.ndarray
        `dspk.io.sync.EVENT_DTYPE` rows.

    Returns
    -------
    dict
        ``{bit: (rising, falling)}``, by bit.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import sync_edges
    >>> from dspk.io.events import edge_counts
    >>> edge_counts(sync_edges(np.array([0, 64, 0, 65], np.int16)))
    {0: (1, 0), 6: (2, 1)}
    """
    out = {}
    for b in np.unique(events["bit"]).tolist():
        pol = events["polarity"][events["bit"] == b]
        out[int(b)] = (int((pol > 0).sum()), int((pol < 0).sum()))
    return out


def write_events_csv(path: str | os.PathLike, events: np.ndarray, fs: float) -> None:
    """The edges as a CSV file: a header ``bit,edge,sample,seconds``, then one row per edge
    (``edge`` rising or falling; ``seconds`` the sample over ``fs``, printed with Python's
    shortest round-tripping repr).

    Parameters
    ----------
    path : path
    events : numpy.ndarray
        `dspk.io.sync.EVENT_DTYPE` rows.
    fs : float
        The sampling rate of the samples, in Hz.

    Raises
    ------
    ValueError
        ``fs`` not a positive number.

    Examples
    --------
    >>> import io, os, tempfile
    >>> import numpy as np
    >>> from dspk.io import sync_edges
    >>> from dspk.io.events import write_events_csv
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "events.csv")
    >>> write_events_csv(path, sync_edges(np.array([0, 64, 0], np.int16)), fs=30000.0)
    >>> print(open(path).read().strip())
    bit,edge,sample,seconds
    6,rising,1,3.3333333333333335e-05
    6,falling,2,6.666666666666667e-05
    >>> tmp.cleanup()
    """
    if isinstance(fs, bool) or not isinstance(fs, (int, float, np.number)) or not fs > 0:
        raise ValueError(f"fs: expected a positive sampling rate in Hz, got {fs!r}")
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(EVENTS_CSV_COLUMNS)
        for s, b, p in zip(events["sample"].tolist(), events["bit"].tolist(),
                           events["polarity"].tolist()):
            w.writerow((b, EDGE_NAMES[p], s, repr(s / float(fs))))


def read_events_csv(path: str | os.PathLike) -> np.ndarray:
    """A CSV written by `write_events_csv` read back into `dspk.io.sync.EVENT_DTYPE` rows.

    Parameters
    ----------
    path : path

    Raises
    ------
    RecordingError
        A file without the ``bit,edge,sample,seconds`` header or with an unknown edge.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from dspk.io import sync_edges
    >>> from dspk.io.events import read_events_csv, write_events_csv
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "events.csv")
    >>> write_events_csv(path, sync_edges(np.array([0, 64, 0], np.int16)), fs=1000.0)
    >>> read_events_csv(path)[["sample", "bit", "polarity"]].tolist()
    [(1, 6, 1), (2, 6, -1)]
    >>> tmp.cleanup()
    """
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or tuple(rows[0]) != EVENTS_CSV_COLUMNS:
        raise RecordingError(f"{path}: expected the header {','.join(EVENTS_CSV_COLUMNS)}")
    out = np.zeros(len(rows) - 1, EVENT_DTYPE)
    polarity = {v: k for k, v in EDGE_NAMES.items()}
    for i, (b, e, s, t) in enumerate(rows[1:]):
        if e not in polarity:
            raise RecordingError(f"{path}: row {i + 2}: edge {e!r}, expected rising or "
                                 f"falling")
        out[i] = (int(s), int(b), polarity[e], float(t))
    return out


#: the group of a dspk HDF5 output that holds the events
EVENTS_GROUP = "events"


def write_events_hdf5(f: Any, events: np.ndarray, fs: float, source: str = "") -> None:
    """The edges into an open HDF5 file as the group ``/events``: datasets ``sample``
    (int64, the recording's samples at ``fs``), ``bit`` (int16), ``polarity`` (int8, +1
    rising, −1 falling) and ``seconds`` (float64), row for row, with attributes ``fs`` and
    ``source``; an existing ``/events`` is replaced.

    Parameters
    ----------
    f : h5py.File
        Open for writing.
    events : numpy.ndarray
        `dspk.io.sync.EVENT_DTYPE` rows.
    fs : float
        The rate of ``sample``, in Hz.
    source : str
        Where the events come from (the recording), for the record.

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np
    >>> from dspk.io import sync_edges
    >>> from dspk.io.events import read_events_hdf5, write_events_hdf5
    >>> tmp = tempfile.TemporaryDirectory()
    >>> with h5py.File(os.path.join(tmp.name, "o.h5"), "w") as f:
    ...     write_events_hdf5(f, sync_edges(np.array([0, 64, 0], np.int16)), fs=1000.0)
    ...     sorted(f["events"]), read_events_hdf5(f)["sample"].tolist()
    (['bit', 'polarity', 'sample', 'seconds'], [1, 2])
    >>> tmp.cleanup()
    """
    if EVENTS_GROUP in f:
        del f[EVENTS_GROUP]
    g = f.create_group(EVENTS_GROUP)
    g.create_dataset("sample", data=np.asarray(events["sample"], np.int64))
    g.create_dataset("bit", data=np.asarray(events["bit"], np.int16))
    g.create_dataset("polarity", data=np.asarray(events["polarity"], np.int8))
    g.create_dataset("seconds", data=np.asarray(events["sample"], np.float64) / float(fs))
    g.attrs["fs"] = float(fs)
    g.attrs["source"] = str(source)
    g.attrs["description"] = ("edges of the recording's sync bits / TTL lines: sample, "
                              "bit (0-based), polarity (+1 rising, -1 falling), seconds")


def read_events_hdf5(f: Any) -> np.ndarray | None:
    """The ``/events`` group of an open HDF5 file (`write_events_hdf5`) as
    `dspk.io.sync.EVENT_DTYPE` rows; None without one.

    Parameters
    ----------
    f : h5py.File

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py
    >>> from dspk.io.events import read_events_hdf5
    >>> tmp = tempfile.TemporaryDirectory()
    >>> with h5py.File(os.path.join(tmp.name, "o.h5"), "w") as f:
    ...     print(read_events_hdf5(f))
    None
    >>> tmp.cleanup()
    """
    if EVENTS_GROUP not in f:
        return None
    g = f[EVENTS_GROUP]
    out = np.zeros(g["sample"].shape[0], EVENT_DTYPE)
    out["sample"], out["bit"], out["polarity"] = g["sample"][()], g["bit"][()], \
        g["polarity"][()]
    out["time"] = g["seconds"][()]
    return out


def pulses(events: np.ndarray, duration_s: float) -> np.ndarray:
    """Each bit's high periods from its edges: a rising edge to the bit's next falling one
    (a falling edge with none before it: high from 0; a rising edge with none after it: high
    to ``duration_s``).

    Parameters
    ----------
    events : numpy.ndarray
        `dspk.io.sync.EVENT_DTYPE` rows sorted by sample (their ``time`` in seconds).
    duration_s : float
        The recording's length in seconds.

    Returns
    -------
    numpy.ndarray
        Structured ``start_time``, ``stop_time`` (float64 s), ``bit`` (int16), sorted by start
        time then bit.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import sync_edges
    >>> from dspk.io.events import pulses
    >>> ev = sync_edges(np.array([64, 0, 0, 65, 65, 64], np.int16), previous=0, fs=1.0)
    >>> pulses(ev, 6.0).tolist()
    [(0.0, 1.0, 6), (3.0, 5.0, 0), (3.0, 6.0, 6)]
    """
    dtype = np.dtype([("start_time", np.float64), ("stop_time", np.float64),
                      ("bit", np.int16)])
    rows = []
    for b in np.unique(events["bit"]).tolist():
        mine = events[events["bit"] == b]
        start = None
        for i, (t, p) in enumerate(zip(mine["time"].tolist(), mine["polarity"].tolist())):
            if p > 0:
                start = t
            else:
                rows.append((0.0 if start is None and i == 0 else
                             (start if start is not None else t), t, b))
                start = None
        if start is not None:
            rows.append((start, float(duration_s), b))
    out = np.array(rows, dtype=dtype)
    return out[np.lexsort((out["bit"], out["start_time"]))] if out.size else out


def write_events_nwb(path: str | os.PathLike, events: np.ndarray, duration_s: float,
                     name: str = EVENTS_GROUP) -> None:
    """The edges into an NWB file as a ``TimeIntervals`` table (``/intervals/<name>``): each
    bit's high periods (`pulses`: ``start_time``, ``stop_time`` in seconds, and ``bit``),
    written with pynwb in append mode.

    Parameters
    ----------
    path : path
        An NWB file pynwb can append to.
    events : numpy.ndarray
        `dspk.io.sync.EVENT_DTYPE` rows, ``time`` in seconds.
    duration_s : float
        The recording's length (a last rising edge's period ends there).
    name : str
        The table's name.

    Examples
    --------
    >>> import os, tempfile
    >>> from datetime import datetime, timezone
    >>> import numpy as np, pynwb
    >>> from dspk.io import sync_edges
    >>> from dspk.io.events import write_events_nwb
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "o.nwb")
    >>> nwb = pynwb.NWBFile("s", "id", datetime(2024, 1, 1, tzinfo=timezone.utc))
    >>> with pynwb.NWBHDF5IO(path, "w") as io:
    ...     io.write(nwb)
    >>> write_events_nwb(path, sync_edges(np.array([0, 64, 0], np.int16), fs=1.0), 3.0)
    >>> with pynwb.NWBHDF5IO(path, "r") as io:
    ...     table = io.read().intervals["events"]
    ...     [table[k][:].tolist() for k in ("start_time", "stop_time", "bit")]
    [[1.0], [2.0], [6]]
    >>> tmp.cleanup()
    """
    from .nwb import pynwb_module  # noqa: PLC0415 (optional)

    pynwb = pynwb_module()
    from pynwb.epoch import TimeIntervals  # noqa: PLC0415

    table = pulses(events, duration_s)
    with pynwb.NWBHDF5IO(os.fspath(path), "a") as io:
        nwb = io.read()
        ti = TimeIntervals(name=name, description="the high periods of the recording's sync "
                           "bits / TTL lines (dspk: rising edge to the next falling one; bit "
                           "0-based)")
        # typed when empty (no edges): pynwb cannot tell an empty list's type
        ti.add_column("bit", "the sync bit (SpikeGLX: 16*word + bit; Open Ephys: line - 1)",
                      **({} if len(table) else {"data": np.zeros(0, np.int64)}))
        for start, stop, bit in table.tolist():
            ti.add_row(start_time=start, stop_time=stop, bit=int(bit))
        nwb.add_time_intervals(ti)
        io.write(nwb)
