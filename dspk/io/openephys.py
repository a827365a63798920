"""Open Ephys recordings in the GUI's binary format: a recording folder
(``Record Node N/experimentE/recordingR/``) holding ``structure.oebin`` (JSON describing each
stream) and ``continuous/<stream>/continuous.dat`` (int16, [samples, channels]).

The layout follows the Open Ephys GUI documentation ("Binary format"): per continuous stream,
``folder_name``, ``sample_rate``, ``num_channels`` and per channel ``channel_name`` and
``bit_volts`` (µV per bit for headstage channels, V per bit for ADC channels; the channel's
``units`` says which).

>>> from dspk.io.openephys import is_auxiliary
>>> [is_auxiliary(n) for n in ("CH1", "AUX1", "ADC3")]
[False, True, True]
"""

from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..argnames import arg
from .errors import RecordingError
from .neuropixels import openephys_probe
from .recording import (BinaryRecording, OpenOptions, RecordingSpec, resolved_metadata,
                        source_path)

__all__ = ["OpenEphysRecording", "find_oebins", "find_oebin", "stream_of_dat", "is_auxiliary",
           "choose_stream", "OEBIN"]

OEBIN = "structure.oebin"
#: µV per unit of a channel's ``units``
UNITS_UV = {"uv": 1.0, "µv": 1.0, "μv": 1.0, "mv": 1e3, "v": 1e6}
#: stream names that hold no neural channels (NI-DAQ and ADC boards, analog inputs)
_NON_NEURAL = re.compile(r"ADC|NI-DAQ|NIDAQ|AUX|ANALOG", re.I)
#: the spike band of a probe: an "AP" token (ProbeA-AP, Neuropix-PXI-100.ProbeA-AP)
_AP = re.compile(r"(?<![A-Za-z])AP(?![A-Za-z])")
#: the files beside a stream's continuous.dat that hold one entry per sample (GUI >= 0.6:
#: sample_numbers.npy int64 and timestamps.npy float64 seconds; 0.5: timestamps.npy, sample
#: numbers)
PER_SAMPLE_FILES = ("sample_numbers.npy", "timestamps.npy")


def is_auxiliary(channel_name: str) -> bool:
    """Whether a channel is an auxiliary (accelerometer, ``AUX``) or analog input (``ADC``)
    channel, or a Neuropixels stream's sync word (a name with ``SYNC``: ``AP_SYNC``,
    ``CH_SYNC``; Neo, and so SpikeInterface, keep it apart too), rather than an electrode,
    by its Open Ephys name.

    Parameters
    ----------
    channel_name : str
        The channel's ``channel_name`` in ``structure.oebin``.

    Returns
    -------
    bool

    Examples
    --------
    >>> is_auxiliary("ADC1"), is_auxiliary("CH12"), is_auxiliary("AP_SYNC")
    (True, False, True)
    """
    name = channel_name.strip().upper()
    return name.startswith(("ADC", "AUX")) or "SYNC" in name


def find_oebins(folder: str) -> list[str]:
    """Every ``structure.oebin`` in or below ``folder``, sorted; the folder's own alone when
    it has one (a recording folder)."""
    here = os.path.join(folder, OEBIN)
    if os.path.isfile(here):
        return [here]
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        if OEBIN in files:
            found.append(os.path.join(root, OEBIN))
    return found


def find_oebin(path: str) -> str:
    """The ``structure.oebin`` of a recording: ``path`` itself, the one in the folder, or the
    only one below it (Record Node / experiment / recording folders)."""
    if os.path.isfile(path):
        return path
    found = find_oebins(path)
    if len(found) == 1:
        return found[0]
    if not found:
        raise RecordingError(f"{path}: a directory with no {OEBIN} (Open Ephys binary format) "
                             f"in or below it; pass a recording file or folder")
    listed = "\n  ".join(os.path.relpath(f, path) for f in found)
    raise RecordingError(f"{path}: {len(found)} Open Ephys recordings below this folder; open "
                         f"one of them (its folder or {OEBIN}):\n  {listed}")


def stream_of_dat(path: str) -> tuple[str, str] | None:
    """(structure.oebin, stream folder name) when ``path`` is the ``continuous.dat`` of a
    stream of an Open Ephys recording (``<recording>/continuous/<stream>/continuous.dat``),
    else None.

    Parameters
    ----------
    path : str
        Any path.

    Returns
    -------
    tuple of str, or None

    Examples
    --------
    >>> stream_of_dat("/data/kilosort/temp_wh.dat") is None
    True
    """
    if os.path.basename(path) != "continuous.dat":
        return None
    stream_dir = os.path.dirname(os.path.abspath(path))
    oebin = os.path.join(os.path.dirname(os.path.dirname(stream_dir)), OEBIN)
    return (oebin, os.path.basename(stream_dir)) if os.path.isfile(oebin) else None


def _stream_name(s: dict) -> str:
    return str(s.get("folder_name", "")).strip().rstrip("/\\")


def _describe(streams: list[dict]) -> str:
    return "; ".join(f"{i}: {_stream_name(s)!r} ({s.get('num_channels', '?')} channels, "
                     f"{s.get('sample_rate', '?')} Hz)" for i, s in enumerate(streams))


def _neural(s: dict) -> bool:
    names = [str(c.get("channel_name", "")) for c in s.get("channels", []) or []]
    if names and all(is_auxiliary(n) for n in names):
        return False
    return not _NON_NEURAL.search(f"{_stream_name(s)} {s.get('stream_name', '')}")


def choose_stream(streams: list[dict], dataset: str | None, source: str) -> int:
    """The index of the continuous stream to read: ``dataset`` (a folder_name, stream_name or
    index), else the only stream, else the neural one (see `OpenEphysRecording`)."""
    if not streams:
        raise RecordingError(f"{source}: no continuous stream in the recording")
    if dataset is not None:
        key = str(dataset).strip().rstrip("/\\")
        for i, s in enumerate(streams):
            if key in (_stream_name(s), str(s.get("stream_name", "")), str(i)):
                return i
        raise RecordingError(f"dataset: no stream {dataset!r} in {source}; its streams: "
                             f"{_describe(streams)}")
    if len(streams) == 1:
        return 0
    neural = [i for i, s in enumerate(streams) if _neural(s)]
    ap = [i for i in neural
          if _AP.search(f"{_stream_name(streams[i])} {streams[i].get('stream_name', '')}")]
    for pick in (ap, neural):
        if len(pick) == 1:
            return pick[0]
    # older Neuropixels naming (".0" spike band, ".1" LFP band): the one fastest stream
    pool = neural or list(range(len(streams)))
    rates = [float(streams[i].get("sample_rate", 0) or 0) for i in pool]
    fastest = [i for i, r in zip(pool, rates) if r == max(rates)]
    if len(fastest) == 1 and len(pool) > 1:
        return fastest[0]
    raise RecordingError(f"dataset: {source} holds {len(streams)} continuous streams and none "
                         f"is clearly the neural (AP) band; choose one with {arg('dataset')} "
                         f"(its folder name or index): {_describe(streams)}")


class OpenEphysRecording(BinaryRecording):
    """One continuous stream of an Open Ephys binary-format recording, memory-mapped.

    What is read, and what is assumed where the format leaves a choice:

    - **Which file**: ``path`` is ``structure.oebin``, the recording folder holding it, or
      any folder above (a Record Node, an experiment) with exactly one recording below; with
      several, the error lists them.
    - **Which stream** (when ``dataset`` is not given): the only one; else the only neural
      stream whose name has an ``AP`` token (``ProbeA-AP``); else the only neural stream;
      else the one fastest neural stream (older Neuropixels folders ``...-100.0`` spike band
      and ``...-100.1`` LFP band). Neural: not all channels ADC/AUX and no ``ADC``,
      ``NI-DAQ``, ``AUX`` or ``ANALOG`` in its name. Otherwise the error lists the streams.
    - **Channels**: the stream's channels without the ``ADC*``/``AUX*`` ones and the sync
      word (``*SYNC*``; analog inputs, accelerometers and sync words are not electrodes: they
      must not be referenced or whitened with them); a stream of only such channels is read
      whole.
    - **µV per bit**: each channel's ``bit_volts``, in its ``units`` (µV when absent).
    - **Geometry, shanks, contact ids**: a Neuropixels probe's, from the experiment's
      ``settings.xml`` in the GUI's layout (the Record Node's ``settings.xml`` for
      experiment 1, ``settings_E.xml`` for experiment E), read by probeinterface
      (``read_openephys_neuropixels`` for the stream, as SpikeInterface reads it;
      `dspk.io.neuropixels`). Otherwise none (the .oebin has no positions): pass
      ``geometry=`` (an array, a probeinterface Probe or a probe file).
    - **Channel ids**: the channels' names (``channel_ids``, as `channel_names`).

    Parameters
    ----------
    path : str
        ``structure.oebin`` or a folder at or above it.
    dataset : str, optional
        The stream: its ``folder_name`` (``"Neuropix-PXI-100.ProbeA-AP"``), ``stream_name``
        or index as a string.
    fs : float, optional
        Sampling rate in Hz; overrides ``sample_rate``.
    gain_to_uv, offset_to_uv : float or per-channel array, optional
        Override ``bit_volts`` (offset default 0).
    geometry : [channels, 2] array, probeinterface Probe or probe file, optional
        Contact positions in µm.

    Attributes
    ----------
    oebin : str
        The ``structure.oebin`` read.
    stream : str
        The stream's folder name.
    channel_names : list of str
        The recording's channels' names.
    excluded_columns : numpy.ndarray
        Stored columns not in the recording (ADC/AUX channels and sync words).
    shank_ids, contact_ids : numpy.ndarray or None
        Each channel's shank (0-based) and probeinterface contact id, where the settings
        give the probe.

    Raises
    ------
    RecordingError
        No or several recordings below a folder, several streams and none clearly neural, an
        unknown ``dataset``, a key missing from the stream (named), a data file that is not a
        whole number of frames, or one that holds another number of samples than the
        stream's ``sample_numbers.npy`` or ``timestamps.npy`` (a truncated copy).
    FileNotFoundError
        A stream whose ``continuous.dat`` is missing.

    Examples
    --------
    A recording folder with one 4-channel stream (2 electrodes, 1 AUX, 1 ADC):

    >>> import json, os, tempfile
    >>> import numpy as np
    >>> from dspk.io import open_recording
    >>> tmp = tempfile.TemporaryDirectory()
    >>> rec_dir = os.path.join(tmp.name, "Record Node 101", "experiment1", "recording1")
    >>> os.makedirs(os.path.join(rec_dir, "continuous", "Acquisition_Board-100.Rhythm Data"))
    >>> chans = [{"channel_name": n, "bit_volts": b, "units": u}
    ...          for n, b, u in [("CH1", 0.195, "uV"), ("CH2", 0.195, "uV"),
    ...                          ("AUX1", 3.74e-05, "V"), ("ADC1", 0.00015, "V")]]
    >>> with open(os.path.join(rec_dir, "structure.oebin"), "w") as f:
    ...     json.dump({"GUI version": "0.6.7", "continuous": [{
    ...         "folder_name": "Acquisition_Board-100.Rhythm Data/", "sample_rate": 30000.0,
    ...         "num_channels": 4, "channels": chans}], "events": [], "spikes": []}, f)
    >>> data = np.arange(12, dtype=np.int16).reshape(3, 4)          # 3 samples x 4
    >>> data.tofile(os.path.join(rec_dir, "continuous", "Acquisition_Board-100.Rhythm Data",
    ...                          "continuous.dat"))
    >>> rec = open_recording(tmp.name)                 # found below the top folder
    >>> rec.n_channels, rec.fs, rec.channel_names, rec.gain_to_uv
    (2, 30000.0, ['CH1', 'CH2'], array([0.195, 0.195]))
    >>> rec.read(scaled=False)
    array([[0, 4, 8],
           [1, 5, 9]], dtype=int16)
    >>> del rec
    >>> tmp.cleanup()
    """

    def __init__(self, path: str | os.PathLike, dataset: str | None = None,
                 fs: float | None = None, gain_to_uv: Any = None, offset_to_uv: Any = None,
                 geometry: Any = None) -> None:
        oebin = find_oebin(os.fspath(path))
        try:
            with open(oebin, encoding="utf-8") as f:
                structure = json.load(f)
        except (OSError, ValueError) as e:
            raise RecordingError(f"{oebin}: not a readable structure.oebin ({e})") from None
        streams = structure.get("continuous") if isinstance(structure, dict) else None
        if not isinstance(streams, list):
            raise RecordingError(f"continuous: missing from {oebin} (expected a list of "
                                 f"streams)")
        s = streams[choose_stream(streams, dataset, oebin)]
        name = _stream_name(s)

        def need(key: str) -> Any:
            if s.get(key) in (None, ""):
                raise RecordingError(f"{key}: missing from stream {name!r} of {oebin}")
            return s[key]

        try:
            n_stored = int(need("num_channels"))
        except (TypeError, ValueError):
            raise RecordingError(f"num_channels: expected a channel count in stream {name!r} "
                                 f"of {oebin}, got {s.get('num_channels')!r}") from None
        if n_stored < 1:
            # (a frame of 0 channels: a modulo by zero further on)
            raise RecordingError(f"num_channels: stream {name!r} of {oebin} has "
                                 f"num_channels={n_stored}; a stream needs at least 1 channel "
                                 f"(a damaged or hand-edited structure.oebin?)")
        channels = s.get("channels") or []
        if len(channels) != n_stored:
            raise RecordingError(f"channels: stream {name!r} of {oebin} describes "
                                 f"{len(channels)} channels but num_channels={n_stored}")
        names = [str(c.get("channel_name", f"CH{i + 1}")) for i, c in enumerate(channels)]
        keep = [i for i, n in enumerate(names) if not is_auxiliary(n)] or list(range(n_stored))
        if fs is None:
            fs = float(need("sample_rate"))
        if gain_to_uv is None:
            gain_to_uv = [self._uv_per_bit(channels[i], name, oebin) for i in keep]
        dat = os.path.join(os.path.dirname(oebin), "continuous", name, "continuous.dat")
        if not os.path.isfile(dat):
            raise FileNotFoundError(f"{dat}: no such file (the data of stream {name!r} in "
                                    f"{oebin})")
        _check_length(dat, n_stored, name)
        probe = openephys_probe(oebin, name, len(keep))
        if geometry is None and probe is not None:
            geometry = probe.geometry
        super().__init__(dat, n_stored, fs, np.int16, 0, columns=keep, gain_to_uv=gain_to_uv,
                         offset_to_uv=offset_to_uv, geometry=geometry)
        self.oebin, self.stream = oebin, name
        self.channel_names = [names[i] for i in keep]
        self.channel_ids = np.array(self.channel_names)
        self.excluded_columns = np.setdiff1d(np.arange(n_stored), keep)
        if probe is not None:
            self.shank_ids, self.contact_ids = probe.shank_ids, probe.contact_ids
            # the Neuropix-PXI settings give each channel's ADC sampling order
            self.sample_shifts = probe.sample_shifts

    def spec(self) -> RecordingSpec:
        """An `OpenEphysRecording` of the same stream with the metadata resolved here (see
        `dspk.io.Recording.spec`).

        Examples
        --------
        >>> rec = OpenEphysRecording("Record Node 101")               # doctest: +SKIP
        >>> rec.spec().open().stream == rec.stream                     # doctest: +SKIP
        True
        """
        return RecordingSpec(OpenEphysRecording, dict(path=self.oebin, dataset=self.stream,
                                                      **resolved_metadata(self)))

    def files(self) -> tuple[Path, ...]:
        """Every file of the recording (see `dspk.io.Recording.files`): every file below the
        recording folder (``structure.oebin``, each stream's ``continuous.dat``,
        ``sample_numbers.npy`` and ``timestamps.npy``, the events, ``sync_messages.txt``,
        ...) and, in the GUI's layout (``<Record Node>/experimentN/recordingM``), the
        ``settings*.xml`` of the Record Node and of the experiment folder.

        Examples
        --------
        >>> rec = OpenEphysRecording("Record Node 101")                  # doctest: +SKIP
        >>> sorted(p.name for p in rec.files())                          # doctest: +SKIP
        ['continuous.dat', 'sample_numbers.npy', 'settings.xml', 'structure.oebin', ...]
        """
        rec_dir = os.path.dirname(os.path.abspath(self.oebin))
        found = [os.path.join(root, f) for root, dirs, names in os.walk(rec_dir)
                 for f in names]
        experiment = os.path.dirname(rec_dir)
        if re.fullmatch(r"experiment\d*", os.path.basename(experiment)):
            for folder in (experiment, os.path.dirname(experiment)):
                found += glob.glob(os.path.join(glob.escape(folder), "settings*.xml"))
        return tuple(dict.fromkeys(Path(f).resolve() for f in sorted(found)))

    @classmethod
    def recognizes(cls, source: Any, options: OpenOptions) -> bool:
        """``structure.oebin``, a folder with one in or below it, or a stream's
        ``continuous.dat`` (see `dspk.io.Recording.recognizes`)."""
        path = source_path(source)
        if path is None:
            return False
        if os.path.isdir(path):
            return bool(find_oebins(path))
        return os.path.basename(path) == OEBIN or stream_of_dat(path) is not None

    @classmethod
    def from_source(cls, source: Any, options: OpenOptions) -> "OpenEphysRecording":
        """The stream (``dataset``, or the one a stream's ``continuous.dat`` is the data of),
        ``fs`` and the metadata overrides applied; the flat-binary options refused unless
        they agree with ``structure.oebin`` (see `dspk.io.Recording.from_source`)."""
        path = os.fspath(source)
        dataset = options.dataset
        of_dat = stream_of_dat(path)
        if of_dat is not None:
            if dataset not in (None, of_dat[1]):
                raise RecordingError(f"dataset: {path} is the data of stream {of_dat[1]!r}, "
                                     f"not {dataset!r}")
            path, dataset = of_dat
        rec = cls(path, dataset, fs=options.fs, **options.meta())
        return options.check(rec, "an Open Ephys recording")

    @staticmethod
    def _uv_per_bit(channel: dict, stream: str, oebin: str) -> float:
        bv = channel.get("bit_volts")
        if bv is None:
            raise RecordingError(f"bit_volts: missing from channel "
                                 f"{channel.get('channel_name', '?')!r} of stream {stream!r} "
                                 f"in {oebin}")
        units = str(channel.get("units") or "uV").strip().lower()
        if units not in UNITS_UV:
            raise RecordingError(f"units: channel {channel.get('channel_name', '?')!r} of "
                                 f"{oebin} is in {units!r}; expected uV, mV or V")
        return float(bv) * UNITS_UV[units]


def _check_length(dat: str, n_stored: int, stream: str) -> None:
    """A stream's continuous.dat must be whole frames, as many as its per-sample files
    (sample_numbers.npy, timestamps.npy) have entries: a copy cut short is otherwise read
    without a word. Only the .npy files' headers are read."""
    size, frame = os.path.getsize(dat), 2 * n_stored
    if size % frame:
        raise RecordingError(f"{dat}: {size} bytes is not a whole number of {n_stored}-channel "
                             f"int16 frames ({frame} bytes, num_channels={n_stored} of stream "
                             f"{stream!r}): truncated or copied incompletely")
    n = size // frame
    for name in PER_SAMPLE_FILES:
        npy = os.path.join(os.path.dirname(dat), name)
        if not os.path.isfile(npy):
            continue
        count = _npy_length(npy)
        if count != n:
            raise RecordingError(f"{dat} holds {n} samples ({size} bytes of {n_stored}-channel "
                                 f"int16 frames) but {npy} has {count} entries: the recording "
                                 f"looks truncated or copied incompletely")


def _npy_length(npy: str) -> int:
    """The first dimension of a .npy file, from its header, checked against the file's size
    (a copy cut short keeps the whole header)."""
    try:
        with open(npy, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
            data_start = f.tell()
    except (OSError, ValueError) as exc:
        raise RecordingError(f"{npy}: cannot be read as a .npy array ({exc}): the recording "
                             f"looks damaged or copied incompletely") from None
    if not shape:
        raise RecordingError(f"{npy}: a scalar, expected one entry per sample")
    need = data_start + int(np.prod(shape)) * dtype.itemsize
    have = os.path.getsize(npy)
    if have < need:
        raise RecordingError(f"{npy}: its header says {shape[0]} entries ({need} bytes) but "
                             f"the file holds {have} bytes: truncated or copied incompletely")
    return int(shape[0])
