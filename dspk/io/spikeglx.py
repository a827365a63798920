"""SpikeGLX recordings: a headerless int16 ``.bin`` ([samples, channels]) with its ``.meta``
(``key=value`` lines) beside it, for imec probe streams (``.ap.bin``, ``.lf.bin``) and the NI-DAQ
stream (``.nidq.bin``); or the same samples compressed by mtscomp, as IBL publishes them
(``.ap.cbin`` with its ``.ap.ch`` and the ``.ap.meta``; `dspk.io.cbin`).

The metadata follow SpikeGLX's documented tags (billkarsh.github.io/SpikeGLX, "Metadata"):
the rate (``imSampRate``/``niSampRate``), the stored channels (``nSavedChans``,
``snsSaveChanSubset``, ``snsApLfSy``/``snsMnMaXaDw``), the µV per bit (V = i · Vmax / Imax /
gain) and the probe geometry (``~snsGeomMap``, or ``~snsShankMap`` with the probe's layout).
Non-signal words (the imec SY sync word, the NI digital words) are stored but are not channels
of the recording: a preprocessing pipeline must never filter, reference or whiten them.

>>> from dspk.io.spikeglx import parse_channel_list
>>> parse_channel_list("0:3,768").tolist()
[0, 1, 2, 3, 768]
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import numpy as np

from ..argnames import arg
from .adc import neuropixels_sample_shifts
from .cbin import CbinReader, ch_path
from .sync import SyncLedger
from .errors import RecordingError, RecordingWarning
from .neuropixels import spikeglx_probe
from .recording import (BinaryRecording, OpenOptions, RecordingSpec, resolved_metadata,
                        source_path)

__all__ = ["SpikeGLXRecording", "meta_path", "read_meta", "parse_channel_list",
           "looks_like_spikeglx"]

log = logging.getLogger("dspk.io")

#: how many samples a .bin without fileSizeBytes may differ from what its fileTimeSecs and
#: rate imply beyond their written precision, before a warning (SpikeGLX writes fileTimeSecs
#: as samples / rate, rounded)
DURATION_TOLERANCE_SAMPLES = 4
#: SpikeGLX's stream file names: run_g0_t0.imec0.ap.bin, .lf.bin, run_g0_t0.nidq.bin,
#: run_g0_t0.obx0.obx.bin (3A: run_g0_t0.imec.ap.bin); compressed by mtscomp: .ap.cbin, ...
_STREAM_NAME = re.compile(r"\.(ap|lf|nidq|obx)\.c?bin$|\.imec\d*\.(.*\.)?c?bin$", re.I)
#: the data files a .meta can describe: SpikeGLX's own, or mtscomp's compression of it
DATA_SUFFIXES = (".bin", ".cbin")

#: imec probe types whose every channel has the fixed gain 80 (NP2.0 families: the IMRO
#: entries have no gain field)
NP2_TYPES = frozenset({21, 24}) | frozenset(range(2000, 3000))
#: the 10-bit NP1.0-like probes: default imMaxInt 512 and per-channel gains in the IMRO table
#: (3A headers carry a serial number: read as type 0)
NP1_TYPES = frozenset({0}) | (frozenset(range(1000, 2000)) - {1110})
#: probe layouts for metadata without ~snsGeomMap (older SpikeGLX): ~snsShankMap gives
#: (shank, col, row) and x = x0[row parity] + col · x_pitch, y = row · y_pitch, shank pitch added
#: per shank. Values (µm) from the SpikeGLX authors' SGLXMetaToCoords tables, keyed by
#: imDatPrb_type: (x0 even rows, x0 odd rows, x_pitch, y_pitch, shank_pitch)
SHANK_LAYOUTS = {
    0: (27.0, 11.0, 32.0, 20.0, 0.0),                      # NP1.0 (and 3A): staggered
    21: (27.0, 27.0, 32.0, 15.0, 0.0),                     # NP2.0 single shank
    24: (27.0, 27.0, 32.0, 15.0, 250.0),                   # NP2.0 four shanks
    1015: (27.0, 27.0, 32.0, 20.0, 0.0),                   # NHP 10 mm, linear
    1022: (11.0, 11.0, 103.0, 20.0, 0.0),                  # NHP 25 mm, 125 µm linear
    1030: (27.0, 11.0, 87.0, 20.0, 0.0),                   # NHP 45 mm, 125 µm staggered
    1031: (27.0, 11.0, 87.0, 20.0, 0.0),
    1032: (11.0, 11.0, 103.0, 20.0, 0.0),                  # NHP 45 mm, 125 µm linear
}
SHANK_LAYOUTS_BY_PART = {"PRB_1_4_0480_1": 0, "PRB_1_4_0480_1_C": 0, "NP1010": 0,
                         "NP1011": 0, "NP1012": 0, "NP1013": 0,
                         "PRB2_1_2_0640_0": 21, "PRB2_1_4_0480_1": 21, "NP2000": 21,
                         "NP2003": 21, "NP2004": 21,
                         "PRB2_4_2_0640_0": 24, "PRB2_4_4_0480_1": 24, "NP2010": 24,
                         "NP2013": 24, "NP2014": 24}


def meta_path(path: str) -> str | None:
    """The ``.meta`` beside a SpikeGLX ``.bin`` or mtscomp ``.cbin``/``.ch`` (same stem), or
    None when there is none."""
    stem, ext = os.path.splitext(path)
    if ext.lower() not in DATA_SUFFIXES + (".ch",):
        return None
    meta = stem + ".meta"
    return meta if os.path.isfile(meta) else None


def looks_like_spikeglx(path: str) -> bool:
    """Whether a file is named as SpikeGLX names its streams' binaries (``*.ap.bin``,
    ``*.lf.bin``, ``*.nidq.bin``, ``*.obx.bin``, ``*.imecN.*.bin``), whether or not its
    ``.meta`` is there.

    Parameters
    ----------
    path : str
        A file name or path.

    Returns
    -------
    bool

    Examples
    --------
    >>> looks_like_spikeglx("run_g0_t0.imec0.ap.bin"), looks_like_spikeglx("kilosort.bin")
    (True, False)
    """
    return bool(_STREAM_NAME.search(os.path.basename(path)))


def read_meta(path: str) -> dict[str, str]:
    """The ``key=value`` lines of a ``.meta`` file as strings; the ``~`` of table keys
    (``~imroTbl``, ``~snsShankMap``, ...) dropped."""
    out = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            if sep and key:
                out[key.strip().lstrip("~")] = value.strip()
    return out


def parse_channel_list(text: str) -> np.ndarray:
    """A SpikeGLX printer-like channel list (``"2,4,8,12:150"``; ranges inclusive).

    Parameters
    ----------
    text : str
        Comma-separated channels and ``first:last`` ranges.

    Returns
    -------
    numpy.ndarray
        The channels, int64, in the order listed.

    Examples
    --------
    >>> parse_channel_list("2,4,8:10").tolist()
    [2, 4, 8, 9, 10]
    """
    out: list[int] = []
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        a, sep, b = item.partition(":")
        if not a.isdigit() or (sep and not b.isdigit()):
            raise ValueError(f"not a channel or first:last range: {item!r}")
        out += list(range(int(a), int(b) + 1)) if sep else [int(a)]
    return np.asarray(out, dtype=np.int64)


def _entries(table: str) -> list[str]:
    """The ``(...)`` groups of a ~table tag, header first."""
    return re.findall(r"\(([^()]*)\)", table)


class SpikeGLXRecording(BinaryRecording):
    """A SpikeGLX ``.bin`` read with its ``.meta``: rate, µV per bit per channel and geometry
    from the metadata; the sync/digital words left out of the channels.

    What is read, and what is assumed where the format leaves a choice:

    - **Channels**: the stored (saved) signal channels in stored order: imec AP then LF
      channels (``snsApLfSy``), NI-DAQ MN, MA then XA channels (``snsMnMaXaDw``). The imec SY
      word and the NI XD digital words are stored but excluded (``excluded_columns``).
    - **µV per bit** = 1e6 · Vmax / Imax / gain. imec: Vmax ``imAiRangeMax``, Imax
      ``imMaxInt`` (default 512 for NP1.0-like probes, 8192 for NP2.0, when absent: older
      files), gain per channel from ``~imroTbl`` (NP1.0-like: the AP or LF gain field of the
      channel's entry, by its acquired channel number; NP2.0 types 21, 24, 20xx: the
      ``imChan0apGain``/``imChan0lfGain`` of newer metadata, else 80; UHD type 1110: the gains
      of the header). NI-DAQ: ``niAiRangeMax``, ``niMaxInt`` (default
      32768), gain ``niMNGain`` (MN), ``niMAGain`` (MA), 1 (XA).
    - **Geometry, shanks, contact ids** (imec only): the probe probeinterface builds for the
      ``.meta`` (``probeinterface.read_spikeglx``: the part number's model, the IMRO table's
      electrodes, the saved channels; `dspk.io.neuropixels`), as SpikeInterface gives them.
      Where probeinterface cannot build it (no or an unknown ``imDatPrb_pn``): from
      ``~snsGeomMap`` when present (header ``(part, shanks, shank pitch, shank width)``,
      entries ``(shank:x:z:used)``; x + shank · pitch, z); else ``~snsShankMap`` entries
      ``(shank:col:row:used)`` laid out as SpikeGLX's own tools do (NP1.0: x = 27 µm on even
      rows, 11 µm on odd rows, + 32 µm per column; 20 µm rows, so the staggered 27/59,
      11/43 µm columns; NP2.0: x = 27 + 32 · col, 15 µm rows, 250 µm between shanks); None
      for probes whose layout is not known (pass ``geometry=``). (probeinterface places
      the same contacts, up to a shift of the x origin: NP1.0's columns at 16/48, 0/32 µm.)
      Entries marked unused (reference sites) are kept as channels; their flags are in
      ``used``.
    - **Size**: the file must be a whole number of ``nSavedChans`` int16 frames and, when
      the meta has ``fileSizeBytes``, exactly that long. Without ``fileSizeBytes`` (older
      files), a sample count that disagrees with ``fileTimeSecs`` × the rate (beyond the
      precision they are written with) is warned about (`RecordingWarning`): whole frames
      missing cannot be told otherwise.

    - **Compressed** (IBL's ``.cbin``, mtscomp): the same, the samples decoded chunk by
      chunk in a thread pool (`dspk.io.cbin.CbinReader`), bit for bit what mtscomp
      decompresses; the ``.ch`` header must agree with the ``.meta`` (``nSavedChans``
      channels of int16, and ``fileSizeBytes`` of the uncompressed file when the ``.meta``
      has it). Blocks are read as [channels, samples] (``samples_first`` False: the layout
      mtscomp stores a chunk in), and ``compressed`` is True.

    Parameters
    ----------
    path : str
        The ``.bin`` or ``.cbin`` (its ``.meta`` has the same stem; a ``.cbin``'s ``.ch``
        too), or the ``.meta`` (of a ``.bin``, or of a ``.cbin`` where there is no ``.bin``).
    fs : float, optional
        Sampling rate in Hz; overrides the meta's.
    gain_to_uv, offset_to_uv : float or per-channel array, optional
        Override the meta's scale (offset default 0).
    geometry : [channels, 2] array, probeinterface Probe or probe file, optional
        Overrides the meta's geometry.

    Attributes
    ----------
    meta : dict
        Every ``key=value`` of the ``.meta``, values as strings (``~`` of keys dropped).
    stream : str
        ``"imec"`` or ``"nidq"``.
    saved_channels : numpy.ndarray
        The probe channel of each recording channel (imec: its index in the IMRO table,
        0..383 on a NP1.0 probe, for AP and LF channels alike; nidq: the acquired channel
        number), from ``snsSaveChanSubset``.
    excluded_columns : numpy.ndarray
        Stored columns not in the recording (sync and digital words).
    used : numpy.ndarray or None
        The geometry map's "used" flag of each channel (False: a reference or disabled site).
    stream_id : str
        The stream as SpikeInterface (neo) names it: ``"imec0.ap"``, ``"imec0.lf"`` (a 3A
        probe's ``"imec.ap"``), ``"nidq"``; from the ``.meta``'s ``fileName`` (the name the
        file had when SpikeGLX wrote it), else this file's name.
    channel_names : list of str or None
        Each channel's SpikeGLX name (``"AP0"``, ``"LF12"``, ``"XA3"``), from
        ``~snsChanMap``; without the map, imec channels ``AP``/``LF`` and their IMRO channel,
        NI-DAQ channels None.
    channel_ids : numpy.ndarray or None
        SpikeInterface's channel ids, ``"{stream_id}#{name}"`` (``"imec0.ap#AP0"``:
        ``spikeinterface.extractors.read_spikeglx`` gives the same); what dspk's outputs
        carry for the channels. None where the names are (NI-DAQ without ``~snsChanMap``).
    shank_ids, contact_ids : numpy.ndarray or None
        imec streams: each channel's shank (0-based) and probeinterface contact id (None
        where probeinterface cannot build the probe).
    sample_shifts : numpy.ndarray or None
        imec streams: each channel's ADC sample shift in samples (k/13 on NP1.0 and its
        variants, k/16 on NP2.0), from the part number (``imDatPrb_pn``; a 3A probe as NP1.0)
        or the probe type and the channel's readout number, as SpikeInterface's reader sets
        ``inter_sample_shift`` (LF channels the same values); None for nidq streams and
        probes whose multiplexing dspk does not know (`dspk.io.adc`).

    Raises
    ------
    RecordingError
        A tag that is needed and missing or malformed (the message names it and the
        ``.meta``), a file size that does not match the meta, a probe type whose gains are not
        known (pass ``gain_to_uv=``).
    FileNotFoundError
        The ``.meta`` of a ``.bin``, or the ``.bin`` of a ``.meta``, missing.

    Warns
    -----
    RecordingWarning
        A ``.meta`` without ``fileSizeBytes`` whose ``fileTimeSecs`` implies another sample
        count than the file holds.

    Examples
    --------
    A NP1.0 AP file of 2 channels plus the sync word (a real one has 384 + 1):

    >>> import os, tempfile
    >>> import numpy as np
    >>> from dspk.io import open_recording
    >>> tmp = tempfile.TemporaryDirectory()
    >>> binpath = os.path.join(tmp.name, "run_g0_t0.imec0.ap.bin")
    >>> data = np.array([[10, -20, 64], [30, 40, 0], [-50, 60, 64]], dtype=np.int16)
    >>> data.tofile(binpath)                              # 3 samples x (2 + SY)
    >>> meta = ["typeThis=imec", "imSampRate=30000", "nSavedChans=3",
    ...         f"fileSizeBytes={data.nbytes}", "snsApLfSy=2,0,1", "acqApLfSy=2,2,1",
    ...         "snsSaveChanSubset=all", "imAiRangeMax=0.6", "imAiRangeMin=-0.6",
    ...         "imMaxInt=512", "imDatPrb_type=0",
    ...         "~imroTbl=(0,2)(0 0 0 500 250 1)(1 0 0 250 250 1)",
    ...         "~snsShankMap=(1,2,480)(0:0:0:1)(0:1:0:1)"]
    >>> with open(binpath[:-4] + ".meta", "w") as f:
    ...     _ = f.write("\\n".join(meta) + "\\n")
    >>> rec = open_recording(binpath)
    >>> rec
    SpikeGLXRecording('...run_g0_t0.imec0.ap.bin', 2 channels x 3 samples int16, 30000 Hz, 0.00 s)
    >>> rec.gain_to_uv                    # 1e6 * 0.6 V / 512 / gain (500 and 250)
    array([2.34375, 4.6875 ])
    >>> rec.geometry
    array([[27.,  0.],
           [59.,  0.]])
    >>> rec.sample_shifts * 13            # channels 0 and 1: first on their two ADCs
    array([0., 0.])
    >>> rec.channel_ids                   # SpikeInterface's ids (no ~snsChanMap: AP + IMRO)
    array(['imec0.ap#AP0', 'imec0.ap#AP1'], dtype='<U12')
    >>> rec.read(scaled=False)            # the sync word is not a channel
    array([[ 10,  30, -50],
           [-20,  40,  60]], dtype=int16)
    >>> del rec
    >>> tmp.cleanup()
    """

    def __init__(self, path: str | os.PathLike, fs: float | None = None,
                 gain_to_uv: Any = None, offset_to_uv: Any = None,
                 geometry: Any = None) -> None:
        path = os.fspath(path)
        if path.lower().endswith(".meta"):
            meta_file, path = path, path[:-5] + ".bin"
            if not os.path.isfile(path) and os.path.isfile(meta_file[:-5] + ".cbin"):
                path = meta_file[:-5] + ".cbin"           # IBL's: only the compressed file
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path}: no such file (the data of {meta_file})")
        else:
            if path.lower().endswith(".ch"):
                path = path[:-3] + ".cbin"
            meta_file = os.path.splitext(path)[0] + ".meta"
            if not os.path.isfile(meta_file):
                raise FileNotFoundError(f"{meta_file}: no such file (SpikeGLX keeps the "
                                        f"metadata of {os.path.basename(path)} there)")
        self.meta = read_meta(meta_file)
        self._meta_file = meta_file
        self.stream = self._stream(path)
        n_saved = self._int("nSavedChans")
        if n_saved < 1:
            raise RecordingError(f"nSavedChans: {meta_file} says {n_saved} channels")
        self._cbin: CbinReader | None = None
        if path.lower().endswith(".cbin"):
            self._cbin = self._open_cbin(path, n_saved)
        else:
            self._check_size(path, n_saved)
        if self.stream == "imec":
            cols, bands, ids = self._imec_channels(n_saved)
            rate_key = "imSampRate"
        else:
            cols, bands, ids = self._nidq_channels(n_saved)
            rate_key = "niSampRate"
        if fs is None:
            fs = self._float(rate_key)
        if gain_to_uv is None:
            gain_to_uv = self._imec_gains(bands, ids) if self.stream == "imec" else \
                self._nidq_gains(bands)
        self.used = None
        probe = None
        if self.stream == "imec":
            own = self._imec_geometry(len(cols))        # the map's flags: `used`
            probe = spikeglx_probe(meta_file, len(cols))
            if geometry is None:
                geometry = own if probe is None else probe.geometry
        try:
            super().__init__(path, n_saved, fs, np.int16, 0, columns=cols,
                             gain_to_uv=gain_to_uv, offset_to_uv=offset_to_uv,
                             geometry=geometry)
        except BaseException:
            if self._cbin is not None:
                self._cbin.close()
            raise
        if self._cbin is not None:
            self.samples_first = False        # a chunk decodes to [channels, samples]
            self.compressed = True
        self.saved_channels = ids
        self.excluded_columns = np.setdiff1d(np.arange(n_saved), cols)
        if self._cbin is not None:          # the sync words' edges kept as chunks decode
            self._cbin.keep_rows = self.excluded_columns
        # a .bin's: kept as blocks are read (the sync word lies between the channels, so a
        # pass of its own would read the whole file again)
        self._sync_ledger = SyncLedger() if self._cbin is None and \
            self.excluded_columns.size else None
        if self.stream == "imec":
            self.sample_shifts = self._imec_sample_shifts(ids)
            self.shank_ids = self._imec_shanks(len(cols)) if probe is None else \
                probe.shank_ids
            self.contact_ids = None if probe is None else probe.contact_ids
        # SpikeInterface's channel ids ("imec0.ap#AP0"): what outputs carry and its readers
        # of them (NWB, Zarr) give back
        self.stream_id = self._stream_id(bands)
        self.channel_names = self._channel_names(cols, bands, ids)
        self.channel_ids = None if self.channel_names is None else \
            np.array([f"{self.stream_id}#{n}" for n in self.channel_names])

    def spec(self) -> RecordingSpec:
        """A `SpikeGLXRecording` of the same ``.bin`` with the metadata resolved here (see
        `dspk.io.Recording.spec`).

        Examples
        --------
        >>> rec = SpikeGLXRecording("run_g0_t0.imec0.ap.bin")       # doctest: +SKIP
        >>> rec.spec().open().n_channels == rec.n_channels          # doctest: +SKIP
        True
        """
        return RecordingSpec(SpikeGLXRecording, dict(path=self.path,
                                                     **resolved_metadata(self)))

    def files(self) -> tuple[Path, ...]:
        """The ``.bin`` (or ``.cbin`` and ``.ch``) and its ``.meta`` (see
        `dspk.io.Recording.files`).

        Examples
        --------
        >>> rec = SpikeGLXRecording("run_g0_t0.imec0.ap.bin")           # doctest: +SKIP
        >>> [p.name for p in rec.files()]                               # doctest: +SKIP
        ['run_g0_t0.imec0.ap.bin', 'run_g0_t0.imec0.ap.meta']
        """
        data = (Path(self.path).resolve(),)
        if self._cbin is not None:
            data += (Path(self._cbin.ch_path).resolve(),)
        return data + (Path(self._meta_file).resolve(),)

    # -- the sync words ----------------------------------------------------------------------
    @property
    def n_sync_words(self) -> int:
        """The stored words that are not channels: the imec SY word(s), the NI-DAQ digital
        words (XD), whose bits `read_sync` gives."""
        return len(self.excluded_columns)

    def decoded_sync_edges(self) -> np.ndarray | None:
        """Every edge of the sync words, from the blocks read so far when they cover the
        recording (a job's pass over the whole file): a .cbin's chunks as they were decoded
        (`dspk.io.cbin.CbinReader.kept_edges`: no second decode), a .bin's blocks as they
        were read (`dspk.io.sync.SyncLedger`: no second read of the file); None when some
        part was not read (`read_sync` then)."""
        if self._cbin is not None:
            return self._cbin.kept_edges()
        return None if self._sync_ledger is None else self._sync_ledger.edges(self.n_samples)

    def read_sync(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The sync words of samples ``start:stop`` (imec: the SY word, bit 6 the sync pulse;
        NI-DAQ: the digital words), [words, samples] uint16 (their bits as stored);
        `dspk.io.sync.sync_events` decodes them to edges.

        Parameters
        ----------
        start, stop : int
            0 <= start <= stop <= n_samples (stop None: to the end).

        Returns
        -------
        numpy.ndarray

        Raises
        ------
        RecordingError
            A range outside the recording, a file that stores no such word.

        Examples
        --------
        >>> rec = SpikeGLXRecording("run_g0_t0.imec0.ap.bin")          # doctest: +SKIP
        >>> rec.read_sync(0, 5)                                        # doctest: +SKIP
        array([[64, 64,  0,  0,  0]], dtype=uint16)
        """
        self._check_open()
        stop = self.n_samples if stop is None else int(stop)
        start = int(start)
        if not 0 <= start <= stop <= self.n_samples:
            raise RecordingError(f"read_sync: expected 0 <= start <= stop <= {self.n_samples}, "
                                 f"got start={start}, stop={stop}")
        cols = self.excluded_columns
        if cols.size == 0:
            raise RecordingError(f"{self.path}: stores no sync or digital word "
                                 f"(snsApLfSy/snsMnMaXaDw)")
        if self._cbin is not None:
            words = self._cbin.read(start, stop, cols)
        else:
            words = np.ascontiguousarray(self._map[start:stop, cols].T)
        return words.view(np.uint16)

    # -- the samples of a .cbin --------------------------------------------------------------
    def _open_cbin(self, path: str, n_saved: int) -> CbinReader:
        """The reader of an mtscomp .cbin, its header checked against the .meta."""
        if not os.path.isfile(ch_path(path)):
            raise FileNotFoundError(f"{ch_path(path)}: no such file (mtscomp keeps the chunk "
                                    f"table of {os.path.basename(path)} there)")
        reader = CbinReader(path)
        try:
            if reader.n_channels != n_saved or reader.dtype != np.int16:
                raise RecordingError(
                    f"nSavedChans: {self._meta_file} says {n_saved} int16 channels, but "
                    f"{reader.ch_path} holds {reader.n_channels} of {reader.dtype}: the .meta "
                    f"and the .cbin are of different files")
            expected = self.meta.get("fileSizeBytes")
            size = reader.n_samples * n_saved * 2
            if expected not in (None, "") and expected.strip().isdigit() and \
                    int(expected) != size:
                raise RecordingError(
                    f"{path}: {reader.n_samples} samples ({size} bytes uncompressed), but its "
                    f".meta says fileSizeBytes={expected}: the .cbin is incomplete (or the "
                    f".meta belongs to another file)")
        except BaseException:
            reader.close()
            raise
        return reader

    def _stored_samples(self, path: str, stored: int, dtype: np.dtype,
                        header_bytes: int) -> int:
        if self._cbin is None:
            return super()._stored_samples(path, stored, dtype, header_bytes)
        return self._cbin.n_samples

    def _map_samples(self, path: str, dtype: np.dtype, header_bytes: int,
                     shape: tuple) -> Any:
        if self._cbin is None:
            return super()._map_samples(path, dtype, header_bytes, shape)
        return None                      # read through the reader (`_read`)

    @property
    def decompress_s(self) -> float:     # type: ignore[override]
        """Seconds spent reading and decoding .cbin chunks so far, summed over threads (0
        for a .bin)."""
        return 0.0 if self._cbin is None else self._cbin.seconds

    def _read(self, start: int, stop: int, idx: np.ndarray) -> np.ndarray:
        if self._cbin is None:
            self._keep_sync(start, stop)
            return super()._read(start, stop, idx)
        return self._cbin.read(start, stop, self.columns[idx])

    def _read_native(self, start: int, stop: int, out: np.ndarray | None) -> np.ndarray:
        if self._cbin is None:
            self._keep_sync(start, stop)
            return super()._read_native(start, stop, out)
        return self._cbin.read(start, stop, self.columns, out=out)

    @property
    def differences_supported(self) -> bool:  # type: ignore[override]
        """A ``.cbin`` of mtscomp's defaults (`dspk.io.cbin.CbinReader.differences_supported`)."""
        return self._cbin is not None and self._cbin.differences_supported

    def _read_native_differences(self, start: int, stop: int,
                                 out: np.ndarray | None) -> np.ndarray:
        return self._cbin.read_differences(start, stop, self.columns, out=out)

    def _keep_sync(self, start: int, stop: int) -> None:
        """A .bin block's sync words into the ledger (the pages the block's read touches)."""
        if self._sync_ledger is not None and stop > start:
            self._sync_ledger.add(start, self._map[start:stop, self.excluded_columns].T
                                  .view(np.uint16))

    def close(self) -> None:
        """Release the memory map, or stop the .cbin reader's threads and close it."""
        if self._cbin is not None:
            self._cbin.close()
        super().close()

    @classmethod
    def recognizes(cls, source: Any, options: OpenOptions) -> bool:
        """A ``.meta``, a ``.bin`` with a ``.meta`` of the same stem beside it, or a file named
        like a SpikeGLX stream (`looks_like_spikeglx`) when no flat-binary option says it is
        to be read as one (see `dspk.io.Recording.recognizes`)."""
        path = source_path(source)
        if path is None or os.path.isdir(path):
            return False
        if path.lower().endswith(".meta") or meta_path(path) is not None:
            return True
        if path.lower().endswith((".cbin", ".ch")):
            return True                  # mtscomp's files: the .meta is named when missing
        return looks_like_spikeglx(path) and not options.flat_binary_given()

    @classmethod
    def from_source(cls, source: Any, options: OpenOptions) -> "SpikeGLXRecording":
        """The stream, ``fs`` and the metadata overrides applied; ``dataset`` refused, the
        flat-binary options refused unless they agree with the ``.meta`` (see
        `dspk.io.Recording.from_source`)."""
        path = os.fspath(source)
        if not path.lower().endswith(".meta") and meta_path(path) is None:
            meta, name = os.path.splitext(path)[0] + ".meta", os.path.basename(path)
            if path.lower().endswith((".cbin", ".ch")):
                raise RecordingError(
                    f"{meta}: missing (no such file). dspk reads mtscomp's .cbin as IBL "
                    f"publishes it, with the SpikeGLX .meta of the recording beside it (its "
                    f"rate, channels, gains and probe); copy it there")
            raise RecordingError(
                f"{meta}: missing (no such file). SpikeGLX keeps the sampling rate, channel "
                f"count and µV scale of {name} in its .meta; copy it beside the .bin, or read "
                f"{name} as a flat binary instead: pass {arg('n_channels')} and {arg('fs')} "
                f"(and {arg('dtype')} if not int16)")
        options.no_dataset("a SpikeGLX file", path)
        return options.check(cls(path, fs=options.fs, **options.meta()), "a SpikeGLX file")

    # -- the channels' names -----------------------------------------------------------------
    def _stream_id(self, bands: np.ndarray) -> str:
        """The stream as SpikeInterface (neo) names it (`stream_id`): the device and band of
        the file name SpikeGLX gave the stream when it recorded it (the ``.meta``'s
        ``fileName``, neo's rule: a renamed file keeps its stream), else of this file's
        name; an imec name that says neither (renamed by hand, no ``fileName``) gives
        ``"imec.ap"`` or ``"imec.lf"`` by the band of the first channel."""
        if self.stream == "nidq":
            return "nidq"
        # the name at acquisition, written on Windows or Linux ("D:/data/run_g0_t0.imec0.ap.bin")
        name = re.split(r"[\\/]", self.meta.get("fileName") or "")[-1] or \
            os.path.basename(self.path)
        parts = re.sub(r"\.c?bin$", "", name, flags=re.I).split(".")
        if len(parts) >= 3 and parts[-1].lower() in ("ap", "lf") and "imec" in parts[-2]:
            return f"imec{parts[-2].split('imec')[-1]}.{parts[-1].lower()}"
        return f"imec.{'lf' if bands[0] else 'ap'}"

    def _channel_names(self, cols: np.ndarray, bands: np.ndarray,
                       ids: np.ndarray) -> list[str] | None:
        """Each channel's SpikeGLX name (``AP0``, ``LF12``, ``MN0``, ``XA3``): its stored
        column's entry in ``~snsChanMap`` (``(AP0;0:0)``: the name before the ``;``), as neo
        and SpikeInterface name the channels. Without a usable map (older or edited
        metadata): imec channels ``AP``/``LF`` and their IMRO channel, which is what SpikeGLX
        writes there; NI-DAQ channels none (their numbering needs the map)."""
        table = _entries(self.meta.get("snsChanMap", ""))[1:]
        names = [e.split(";")[0].strip() for e in table]
        if len(names) >= len(cols) and all(names[c] for c in cols):
            return [names[c] for c in cols]
        if self.stream == "imec":
            return [f"{'LF' if b else 'AP'}{i}" for b, i in zip(bands.tolist(), ids.tolist())]
        return None

    # -- metadata access ---------------------------------------------------------------------
    def _get(self, key: str) -> str:
        value = self.meta.get(key)
        if value is None or value == "":
            raise RecordingError(f"{key}: missing from {self._meta_file} (needed to read the "
                                 f"SpikeGLX file)")
        return value

    def _int(self, key: str) -> int:
        value = self._get(key)               # (RecordingError is a ValueError: not in the try)
        try:
            return int(value)
        except ValueError:
            raise RecordingError(f"{key}: expected an integer in {self._meta_file}, got "
                                 f"{value!r}") from None

    def _float(self, key: str) -> float:
        value = self._get(key)
        try:
            return float(value)
        except ValueError:
            raise RecordingError(f"{key}: expected a number in {self._meta_file}, got "
                                 f"{value!r}") from None

    def _counts(self, key: str, n: int) -> list[int]:
        value = self._get(key)
        try:
            counts = [int(v) for v in value.split(",")]
        except ValueError:
            counts = []
        if len(counts) != n or min(counts) < 0:
            raise RecordingError(f"{key}: expected {n} comma-separated channel counts in "
                                 f"{self._meta_file}, got {value!r}")
        return counts

    def _stream(self, path: str) -> str:
        kind = self.meta.get("typeThis")
        if not kind:           # older metadata: told by the rate tag, then by the file name
            kind = "imec" if "imSampRate" in self.meta else \
                "nidq" if "niSampRate" in self.meta else \
                "nidq" if ".nidq." in os.path.basename(path).lower() else "imec"
        if kind not in ("imec", "nidq"):
            raise RecordingError(f"typeThis: {self._meta_file} describes a {kind!r} stream; "
                                 f"dspk reads imec (probe) and nidq streams")
        return kind

    def _check_size(self, path: str, n_saved: int) -> None:
        size = os.path.getsize(path)
        frame = 2 * n_saved
        expected = self.meta.get("fileSizeBytes")
        if expected is not None:
            try:
                expected_i = int(expected)
            except ValueError:
                raise RecordingError(f"fileSizeBytes: expected an integer in "
                                     f"{self._meta_file}, got {expected!r}") from None
            if size != expected_i:
                raise RecordingError(f"{path}: {size} bytes on disk, but its .meta says "
                                     f"fileSizeBytes={expected_i}: the file is truncated or "
                                     f"incomplete (or the .meta belongs to another file)")
            if size % frame:     # the file is whole: the channel count is what is wrong
                raise RecordingError(f"nSavedChans: {self._meta_file} disagrees with {path}: "
                                     f"nSavedChans={n_saved} implies {frame}-byte int16 "
                                     f"frames, but the file holds {size} bytes (as "
                                     f"fileSizeBytes says), not a whole number of them; the "
                                     f".meta describes another file or was edited")
            return
        if size % frame:
            raise RecordingError(f"{path}: {size} bytes is not a whole number of "
                                 f"{n_saved}-channel int16 frames ({frame} bytes, "
                                 f"nSavedChans={n_saved}): truncated")
        self._check_duration(path, size // frame)

    def _check_duration(self, path: str, found: int) -> None:
        """Warn when a file without fileSizeBytes holds another sample count than
        fileTimeSecs × the rate imply (whole frames cut off leave no other trace)."""
        rate_key = "imSampRate" if self.stream == "imec" else "niSampRate"
        secs_text, rate_text = self.meta.get("fileTimeSecs"), self.meta.get(rate_key)
        if not secs_text or not rate_text:
            return
        try:
            secs, rate = float(secs_text), float(rate_text)
        except ValueError:
            return                          # not needed to read the file: not checked
        if not (np.isfinite(secs) and np.isfinite(rate) and secs > 0 and rate > 0):
            return
        implied = secs * rate
        # both may be written rounded: the implied count is known to half a unit of the last
        # digit of each (fileTimeSecs = samples / rate when SpikeGLX wrote it)
        slack = 0.5 * _last_digit(secs_text) * rate + \
            0.5 * _last_digit(rate_text) * secs + DURATION_TOLERANCE_SAMPLES
        if abs(found - implied) <= slack:
            return
        msg = (f"{path}: {found} samples on disk, but its .meta implies {implied:.0f} "
               f"(fileTimeSecs={secs_text} x {rate_key}={rate_text}) and has no fileSizeBytes "
               f"to tell for certain: the file may be truncated or copied incompletely (or the "
               f".meta belongs to another file)")
        log.warning(msg)
        warnings.warn(msg, RecordingWarning, stacklevel=4)

    def _saved_ids(self, n_saved: int) -> np.ndarray | None:
        """The acquired channel numbers of the stored columns, or None when all are saved."""
        subset = self.meta.get("snsSaveChanSubset", "all").strip()
        if subset.lower() == "all":
            return None
        try:
            ids = parse_channel_list(subset)
        except ValueError as e:
            raise RecordingError(f"snsSaveChanSubset: {e} in {self._meta_file}") from None
        if len(ids) != n_saved:
            raise RecordingError(f"snsSaveChanSubset: lists {len(ids)} channels but "
                                 f"nSavedChans={n_saved} in {self._meta_file}")
        return ids

    # -- imec --------------------------------------------------------------------------------
    def _imec_channels(self, n_saved: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stored columns of the AP and LF channels, their band (0 AP, 1 LF) and IMRO index."""
        n_ap, n_lf, n_sy = self._counts("snsApLfSy", 3)
        if n_ap + n_lf + n_sy != n_saved:
            raise RecordingError(f"snsApLfSy: {n_ap}+{n_lf}+{n_sy} stored channels but "
                                 f"nSavedChans={n_saved} in {self._meta_file}")
        if n_ap + n_lf == 0:
            raise RecordingError(f"snsApLfSy: {self._meta_file} stores no AP or LF channel")
        cols = np.arange(n_ap + n_lf)
        bands = (cols >= n_ap).astype(np.int64)
        ids = self._saved_ids(n_saved)
        if ids is None:                    # all saved: the stored order is the acquired order
            imro = np.where(bands == 0, cols, cols - n_ap)
        else:
            ids = ids[: n_ap + n_lf]
            # acquired numbering: AP 0..A-1, LF A..A+L-1, then SY; A is needed for LF channels
            if "acqApLfSy" in self.meta or n_lf:
                acq_ap = self._counts("acqApLfSy", 3)[0]
            else:
                acq_ap = int(ids.max()) + 1
            imro = np.where(bands == 0, ids, ids - acq_ap)
            if np.any(imro < 0) or np.any(ids[bands == 0] >= acq_ap):
                raise RecordingError(f"snsSaveChanSubset: channel numbers that do not match "
                                     f"snsApLfSy/acqApLfSy in {self._meta_file}")
        return cols, bands, imro.astype(np.int64)

    def _probe_type(self, header: list[str] | None = None) -> int:
        raw = self.meta.get("imDatPrb_type")
        if raw in (None, "") and header:
            raw = header[0]                  # older metadata: the IMRO header's first field
        try:
            t = int(raw) if raw not in (None, "") else 0
        except ValueError:
            raise RecordingError(f"imDatPrb_type: expected an integer in {self._meta_file}, "
                                 f"got {raw!r}") from None
        return 0 if t > 50000 else t        # 3A: the IMRO header holds a serial number

    def _imec_gains(self, bands: np.ndarray, imro: np.ndarray) -> np.ndarray:
        vmax = self._float("imAiRangeMax")
        table = _entries(self._get("imroTbl"))
        if not table:
            raise RecordingError(f"imroTbl: no (header)(entries) in {self._meta_file}")
        header = [v.strip() for v in table[0].split(",")]
        ptype = self._probe_type(header)
        if "imMaxInt" in self.meta:
            imax = self._float("imMaxInt")
        elif ptype in NP1_TYPES or ptype == 1110:
            imax = 512.0                     # 10-bit ADC, before SpikeGLX wrote imMaxInt
        elif ptype in NP2_TYPES:
            imax = 8192.0                    # 14-bit
        else:
            raise RecordingError(f"imMaxInt: missing from {self._meta_file} (probe type "
                                 f"{ptype}: no default known)")
        if ptype in NP2_TYPES:
            # the IMRO entries hold no gain: the .meta's imChan0apGain/imChan0lfGain where
            # SpikeGLX writes them (100 on NP2.0 2013 and 2020 probes), else the fixed 80
            ap, lf = (self._float(k) if k in self.meta else 80.0
                      for k in ("imChan0apGain", "imChan0lfGain"))
            gain = np.where(bands == 0, ap, lf)
        elif ptype == 1110:                  # UHD with switches: one AP/LF gain in the header
            try:
                ap, lf = float(header[3]), float(header[4])
            except (IndexError, ValueError):
                raise RecordingError(f"imroTbl: expected the gains in the type-1110 header of "
                                     f"{self._meta_file}, got ({table[0]})") from None
            gain = np.where(bands == 0, ap, lf)
        elif ptype in NP1_TYPES:
            per_chan = {}
            for e in table[1:]:
                f = e.split()
                try:
                    per_chan[int(f[0])] = (float(f[3]), float(f[4]))
                except (IndexError, ValueError):
                    raise RecordingError(f"imroTbl: expected (channel bank ref apgain lfgain "
                                         f"...) entries in {self._meta_file}, got ({e})") \
                        from None
            missing = sorted(set(imro.tolist()) - set(per_chan))
            if missing:
                raise RecordingError(f"imroTbl: no entry for channel(s) {missing[:10]} in "
                                     f"{self._meta_file}")
            gain = np.array([per_chan[c][b] for c, b in zip(imro.tolist(), bands.tolist())])
        else:
            raise RecordingError(f"imroTbl: probe type {ptype} in {self._meta_file} is not one "
                                 f"whose gains dspk knows; pass {arg('gain_to_uv')}")
        if not np.all(gain > 0):
            raise RecordingError(f"imroTbl: gains must be positive in {self._meta_file}")
        return 1e6 * vmax / imax / gain

    def _imec_sample_shifts(self, readout: np.ndarray) -> np.ndarray | None:
        """The ADC sample shift of each channel from the probe's part number (a 3A probe,
        ``imProbeOpt``, is multiplexed as NP1.0), else its type (``imDatPrb_type`` or the IMRO
        header's): `dspk.io.adc.neuropixels_sample_shifts`. LF channels get the values of
        their readout channel, as SpikeInterface gives them (it reads the AP .meta for them)."""
        part = "NP1010" if self.meta.get("imProbeOpt") else self.meta.get("imDatPrb_pn")
        ptype = None
        if not part:
            table = _entries(self.meta.get("imroTbl", ""))
            header = [v.strip() for v in table[0].split(",")] if table else None
            try:
                if self.meta.get("imDatPrb_type") or header:
                    ptype = self._probe_type(header)
            except RecordingError:
                return None          # a type that cannot be read (gains given): not known
        return neuropixels_sample_shifts(readout, part, ptype)

    def _imec_shanks(self, n: int) -> np.ndarray | None:
        """Each channel's shank (0-based) from ``~snsGeomMap`` or ``~snsShankMap`` (their
        entries' first field); None when the .meta has neither."""
        for key in ("snsGeomMap", "snsShankMap"):
            if self.meta.get(key):
                return self._map_entries(key, n, 4)[1][:, 0].astype(np.int64)
        return None

    def _imec_geometry(self, n: int) -> np.ndarray | None:
        if self.meta.get("snsGeomMap"):
            return self._geom_map(n)
        if self.meta.get("snsShankMap"):
            return self._shank_map(n)
        return None

    def _map_entries(self, key: str, n: int, fields: int) -> tuple[list[str], np.ndarray]:
        table = _entries(self.meta[key])
        rows = [e.split(":") for e in table[1:]]
        # entries for saved channels only, signals first (older files add one for SY: ignored)
        if len(rows) < n or any(len(r) != fields for r in rows[:n]):
            raise RecordingError(f"{key}: expected {n} (a:b:c:d) entries, one per saved "
                                 f"channel, in {self._meta_file}; got {len(rows)}")
        try:
            values = np.array([[float(v) for v in r] for r in rows[:n]])
        except ValueError:
            raise RecordingError(f"{key}: entries must be numbers in {self._meta_file}") \
                from None
        return [h.strip() for h in table[0].split(",")], values

    def _geom_map(self, n: int) -> np.ndarray:
        header, v = self._map_entries("snsGeomMap", n, 4)
        try:
            shank_pitch = float(header[2])
        except (IndexError, ValueError):
            if np.any(v[:, 0] != 0):         # the pitch matters only with several shanks
                raise RecordingError(f"snsGeomMap: expected a (part,shanks,shank pitch,shank "
                                     f"width) header in {self._meta_file}, got "
                                     f"({','.join(header)})") from None
            shank_pitch = 0.0
        self.used = v[:, 3] != 0
        return np.stack([v[:, 1] + v[:, 0] * shank_pitch, v[:, 2]], axis=1)

    def _shank_map(self, n: int) -> np.ndarray | None:
        ptype = self._probe_type(None)
        part = self.meta.get("imDatPrb_pn", "")
        layout = SHANK_LAYOUTS.get(SHANK_LAYOUTS_BY_PART.get(part, ptype))
        if layout is None:
            return None                      # not a layout dspk knows: the user passes one
        _, v = self._map_entries("snsShankMap", n, 4)
        x_even, x_odd, x_pitch, y_pitch, shank_pitch = layout
        shank, col, row = v[:, 0], v[:, 1], v[:, 2]
        x = np.where(row % 2 == 0, x_even, x_odd) + col * x_pitch + shank * shank_pitch
        self.used = v[:, 3] != 0
        return np.stack([x, row * y_pitch], axis=1)

    # -- nidq --------------------------------------------------------------------------------
    def _nidq_channels(self, n_saved: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stored columns of the MN, MA and XA channels, their type (0 MN, 1 MA, 2 XA) and
        acquired number; the XD digital words left out."""
        n_mn, n_ma, n_xa, n_dw = self._counts("snsMnMaXaDw", 4)
        if n_mn + n_ma + n_xa + n_dw != n_saved:
            raise RecordingError(f"snsMnMaXaDw: {n_mn}+{n_ma}+{n_xa}+{n_dw} stored channels "
                                 f"but nSavedChans={n_saved} in {self._meta_file}")
        n = n_mn + n_ma + n_xa
        if n == 0:
            raise RecordingError(f"snsMnMaXaDw: {self._meta_file} stores digital words only, "
                                 f"no analog channel")
        cols = np.arange(n)
        kind = np.repeat([0, 1, 2], [n_mn, n_ma, n_xa])
        ids = self._saved_ids(n_saved)
        return cols, kind, (cols if ids is None else ids[:n])

    def _nidq_gains(self, kind: np.ndarray) -> np.ndarray:
        vmax = self._float("niAiRangeMax")
        imax = self._float("niMaxInt") if "niMaxInt" in self.meta else 32768.0
        gain = np.ones(len(kind))
        if np.any(kind == 0):
            gain[kind == 0] = self._float("niMNGain")
        if np.any(kind == 1):
            gain[kind == 1] = self._float("niMAGain")
        if not np.all(gain > 0):
            raise RecordingError(f"niMNGain/niMAGain: gains must be positive in "
                                 f"{self._meta_file}")
        return 1e6 * vmax / imax / gain


def _last_digit(text: str) -> float:
    """The value of one unit in the last digit of a number as written ("3600.01": 0.01), but
    at most that of its 6th significant digit: a writer rounds to 6 significant digits at the
    coarsest (C's and Qt's default precision), so "0.1" is 0.100000 and exact to 1e-6, while
    a value with more digits is as exact as they say."""
    try:
        value = Decimal(text.strip())
        exponent = value.as_tuple().exponent
    except InvalidOperation:
        return 0.0
    if not isinstance(exponent, int) or value == 0:
        return 0.0
    return min(10.0 ** exponent, 10.0 ** (value.adjusted() - 5))
