"""The `Recording` interface and the sources that need no HDF5: in-memory arrays and flat
binaries (Kilosort / SpikeGLX: int16 [samples, channels]); the options
`dspk.io.open_recording` hands to the format that recognises a source. SpikeInterface's
recordings: `dspk.io.spikeinterface_recording`."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..argnames import arg
from ..backend import array_module, is_cupy_array
from .errors import RecordingError
from .layout import LAYOUTS, channels_first, resolve_layout
from .probe import check_distinct_positions, probe_positions, read_probe
from .scaling import to_uv

__all__ = ["Recording", "RecordingSpec", "OpenOptions", "ArrayRecording", "BinaryRecording",
           "RecordingError", "resolved_metadata", "source_path",
           "MAX_CHANNELS", "MAX_READ_BYTES", "LAYOUTS", "RAW_DTYPES", "BINARY_SUFFIXES"]

#: more channels than this is taken for a wrong axis or a corrupt header, not a probe
MAX_CHANNELS = 65536
#: one read() may return at most this many bytes (float32 when scaled): larger requests are
#: refused before allocating (read in chunks, or use dspk.pipeline)
MAX_READ_BYTES = 8 << 30
RAW_DTYPES = tuple(np.dtype(d) for d in (np.int16, np.uint16, np.int32, np.float32,
                                         np.float64, np.int8, np.uint8))
#: the suffixes of a flat binary read without metadata (other files need n_channels=)
BINARY_SUFFIXES = (".bin", ".dat", ".raw")

_R = TypeVar("_R", bound="Recording")


def source_path(source: Any) -> str | None:
    """``source`` as a path string when it is one (str or path-like), else None.

    Parameters
    ----------
    source : object
        What `dspk.io.open_recording` was given.

    Examples
    --------
    >>> from pathlib import Path
    >>> from dspk.io.recording import source_path
    >>> source_path(Path("rec.bin")), source_path(3)
    ('rec.bin', None)
    """
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else None


@dataclass(frozen=True)
class OpenOptions:
    """The keywords of `dspk.io.open_recording`, handed to the format that recognises the
    source (``recognizes``) and opens it (``from_source``). A format uses those that apply to
    it and refuses the others when they contradict what it read (`check`): a flat-binary
    ``n_channels`` that is not the file's, say, means the metadata belong to another file or
    the guess was wrong.

    Parameters
    ----------
    dataset, fs, layout, gain_to_uv, offset_to_uv, geometry : optional
        As for `dspk.io.open_recording`.
    n_channels, dtype, header_bytes, allow_external_links : optional
        As for `dspk.io.open_recording`.

    Examples
    --------
    >>> from dspk.io.recording import OpenOptions
    >>> opts = OpenOptions(fs=30000.0, n_channels=4)
    >>> opts.flat_binary_given(), sorted(opts.meta())
    (True, ['gain_to_uv', 'geometry', 'offset_to_uv'])
    """

    dataset: str | None = None
    fs: float | None = None
    layout: str | None = None
    gain_to_uv: Any = None
    offset_to_uv: Any = None
    geometry: Any = None
    n_channels: int | None = None
    dtype: Any = None
    header_bytes: int = 0
    allow_external_links: bool = False

    def meta(self) -> dict:
        """The metadata overrides every format takes: gains, offsets, geometry."""
        return dict(gain_to_uv=self.gain_to_uv, offset_to_uv=self.offset_to_uv,
                    geometry=self.geometry)

    def flat_binary_given(self) -> bool:
        """Whether any option that describes a flat binary (``n_channels``, ``dtype``,
        ``header_bytes``) was given."""
        return self.n_channels is not None or self.dtype is not None or bool(self.header_bytes)

    def no_dataset(self, what: str, source: str) -> None:
        """Refuse ``dataset`` for a source that holds one stream."""
        if self.dataset is not None:
            raise RecordingError(f"dataset: {what} ({source}) holds one stream; "
                                 f"{arg('dataset')} does not apply (got {self.dataset!r})")

    def check(self, rec: "Recording", what: str, layout: bool = True,
              header_bytes: bool = True) -> "Recording":
        """``rec``, or closed and refused when ``n_channels``, ``dtype``, ``header_bytes``
        or ``layout`` contradict it (those the format does not itself take: ``layout=False``
        or ``header_bytes=False`` leave them to the format).

        Parameters
        ----------
        rec : Recording
            As opened.
        what : str
            The format, for messages ("a SpikeGLX file").
        layout, header_bytes : bool
            Whether to check those two (False: the format used them).
        """
        try:
            self._check(rec, what, layout, header_bytes)
        except RecordingError:
            rec.close()
            raise
        return rec

    def _check(self, rec: "Recording", what: str, layout: bool, header_bytes: bool) -> None:
        path = rec.source
        if self.n_channels is not None:
            allowed = tuple(dict.fromkeys((rec.n_channels, getattr(rec, "n_stored",
                                                                   rec.n_channels))))
            if int(self.n_channels) not in allowed:
                said = " or ".join(map(str, allowed))
                raise RecordingError(f"n_channels: {path} is {what} whose metadata give the "
                                     f"channel count ({said}); leave {arg('n_channels')} out "
                                     f"(got {self.n_channels})")
        if self.dtype is not None and np.dtype(self.dtype) != rec.dtype:
            raise RecordingError(f"dtype: {path} is {what}, {rec.dtype}; got "
                                 f"{np.dtype(self.dtype)}")
        if header_bytes and self.header_bytes:
            raise RecordingError(f"header_bytes: {path} is {what}, with no header; got "
                                 f"{self.header_bytes}")
        if layout and self.layout not in (None, "samples_channels"):
            raise RecordingError(f"layout: {path} is {what}, stored [samples, channels]")


class Recording:
    """A multi-channel extracellular recording.

    The interface every source implements (`ArrayRecording`, `BinaryRecording`,
    `HDF5Recording`, `SpikeInterfaceRecording`; `open_recording` picks one): metadata checked
    once when it is made, and `read` for [channels, samples] blocks. A subclass implements
    ``_read(start, stop, idx)`` (and may override ``_read_native``; one that holds a file
    overrides `close`, `spec` and `files`). A format that `open_recording` dispatches to
    says whether a source is its own (`recognizes`) and opens it with the caller's options
    (`from_source`).

    Every recording is a context manager that closes it (`close`: the file handle, memory
    map or reader threads it holds; nothing for an in-memory one), and says how to open it
    again in another process (`spec`, `reopen`): a worker of a cluster opens its own handle
    instead of receiving this one.

    Parameters
    ----------
    fs : float
        Sampling rate in Hz (finite, > 0).
    n_channels : int
        1 to `MAX_CHANNELS`.
    n_samples : int
        At least 2.
    dtype : numpy dtype
        The stored sample type: int16, uint16, int32, float32, float64, int8 or uint8.
    gain_to_uv, offset_to_uv : float or per-channel array, optional
        µV = raw · gain_to_uv + offset_to_uv (default gain 1; default offset 0, or
        −2^(bits−1)·gain for unsigned samples, which centres them).
    geometry : [channels, 2] array, probeinterface Probe or ProbeGroup, or a probe file, optional
        Contact positions in µm, row i for channel i: a Probe's contacts are ordered by its
        ``device_channel_indices`` when set (unconnected contacts, −1, dropped); a path is
        read with `dspk.io.read_probe`.
    source : str
        Where the samples come from, for messages and provenance.

    Attributes
    ----------
    fs : float
        Sampling rate in Hz.
    n_channels, n_samples : int
    dtype : numpy.dtype
        The stored (raw) sample type.
    gain_to_uv, offset_to_uv : numpy.ndarray
        Per channel, float64: µV = raw · gain_to_uv + offset_to_uv.
    geometry : numpy.ndarray or None
        [channels, 2] contact positions in µm.
    sample_shifts : numpy.ndarray or None
        Per channel, in samples: how late its ADC sampled it within each sample period (the
        Neuropixels ADC shifts that `dspk.ops.phase_shift` corrects: k/13 on NP1.0, k/16 on
        NP2.0), what SpikeInterface calls ``inter_sample_shift``; None where the format does
        not say (SpikeGLX imec streams, Open Ephys Neuropixels streams with their settings,
        dspk outputs whose shifts were not corrected, NWB files with an
        ``inter_sample_shift`` electrodes column and SpikeInterface recordings that carry
        the property say it).
    shank_ids : numpy.ndarray or None
        Per channel, the shank of its contact (int, 0-based) where the format says it
        (SpikeGLX imec streams: the .meta's shank or geometry map; Open Ephys: the probe of
        its settings; dspk outputs; NWB: electrode groups named ``shank<k>``;
        SpikeInterface recordings: their ``group`` property); None otherwise.
    channel_ids : numpy.ndarray or None
        Per channel, its name where the format gives one, as SpikeInterface's reader of the
        format names it (SpikeGLX: ``"imec0.ap#AP0"``; Open Ephys: ``"CH0"``; an NWB
        series: its electrodes' ``channel_name``; a dspk output: the ids it stores;
        SpikeInterface recordings: their channel ids, int or str); None otherwise (the
        channels are then known by index).
    contact_ids : numpy.ndarray or None
        Per channel, the id of its probe contact (probeinterface's ``contact_ids``:
        ``"e12"``, ``"s1e40"``) where the format says it (SpikeGLX and Open Ephys Neuropixels
        probes, dspk outputs, NWB files with a ``contact_id`` column); None otherwise.
    source : str
        Where the samples come from (file and dataset), for provenance.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import Recording, open_recording
    >>> raw = np.zeros((3000, 4), dtype=np.uint16) + 32770
    >>> rec = open_recording(raw, fs=30000.0, gain_to_uv=0.5)
    >>> isinstance(rec, Recording), rec.dtype, rec.duration_s
    (True, dtype('uint16'), 0.1)
    >>> rec.offset_to_uv                                    # unsigned: centred on 2**15
    array([-16384., -16384., -16384., -16384.])
    >>> rec.read(0, 3, channels=[0])                        # (32770 - 32768) * 0.5 µV
    array([[1., 1., 1.]], dtype=float32)
    >>> with rec.reopen() as again:                       # the same samples, its own handle
    ...     again.read(0, 3, channels=[0])
    array([[1., 1., 1.]], dtype=float32)
    """

    #: whether `close` was called (reading a closed recording raises `RecordingError`)
    closed: bool = False
    # per channel, the ADC sample shift in samples, or None where the format does not say
    sample_shifts: np.ndarray | None = None
    # per channel, its contact's shank (0-based), or None where the format does not say
    shank_ids: np.ndarray | None = None
    # per channel, its id (int or str) as the format names it, or None where it names none
    channel_ids: np.ndarray | None = None
    # per channel, the id of its probe contact (str, probeinterface's contact_ids: "e12",
    # "s1e40"), or None where the format does not say
    contact_ids: np.ndarray | None = None

    def __init__(self, *, fs: float, n_channels: int, n_samples: int, dtype: Any,
                 gain_to_uv: Any = None, offset_to_uv: Any = None, geometry: Any = None,
                 source: str = "") -> None:
        self.source = source
        if fs is None:
            raise RecordingError(f"fs: the sampling rate of {source or 'the recording'} is "
                                 f"unknown; pass {arg('fs')}")
        fs = float(fs)
        if not (np.isfinite(fs) and fs > 0):
            raise RecordingError(f"fs: expected a positive sampling rate in Hz, got {fs}")
        if not 1 <= n_channels <= MAX_CHANNELS:
            raise RecordingError(f"{source}: {n_channels} channels is outside 1..{MAX_CHANNELS} "
                                 f"(wrong layout or a corrupt file?)")
        if n_samples < 2:
            raise RecordingError(f"{source}: {n_samples} sample(s); a recording needs at least "
                                 f"2")
        self.fs = fs
        self.n_channels = int(n_channels)
        self.n_samples = int(n_samples)
        self.dtype = np.dtype(dtype)
        if self.dtype not in RAW_DTYPES:
            raise RecordingError(f"{source}: unsupported sample type {self.dtype}")
        self.gain_to_uv = self._per_channel("gain_to_uv", 1.0 if gain_to_uv is None else
                                            gain_to_uv)
        if offset_to_uv is None:
            # unsigned samples are centred on 2^(bits-1): the offset puts that at 0 µV
            # (never a cast to a signed type, which would wrap)
            mid = 2 ** (8 * self.dtype.itemsize - 1) if self.dtype.kind == "u" else 0
            offset_to_uv = -mid * self.gain_to_uv
        self.offset_to_uv = self._per_channel("offset_to_uv", offset_to_uv)
        self.geometry = None if geometry is None else self._geometry(geometry)

    # -- metadata checks ---------------------------------------------------------------------
    def _per_channel(self, name: str, value: Any) -> np.ndarray:
        v = np.asarray(value, dtype=np.float64)
        if v.ndim == 0:
            v = np.full(self.n_channels, float(v))
        if v.shape != (self.n_channels,):
            raise RecordingError(f"{name}: expected one value or {self.n_channels} (one per "
                                 f"channel), got shape {v.shape}")
        if not np.all(np.isfinite(v)):
            raise RecordingError(f"{name}: values must be finite")
        return v

    def _geometry(self, geom: Any) -> np.ndarray:
        if isinstance(geom, (str, os.PathLike)) or hasattr(geom, "contact_positions") or \
                hasattr(geom, "probes"):
            # a probe file, or a probeinterface Probe/ProbeGroup: rows in device-channel order
            # (checked there: shape, finite, distinct)
            return read_probe(geom, self.n_channels) if isinstance(geom, (str, os.PathLike)) \
                else probe_positions(geom, self.n_channels)
        g = np.asarray(geom, dtype=np.float64)
        if g.ndim != 2 or g.shape != (self.n_channels, 2):
            raise RecordingError(f"geometry: expected [{self.n_channels}, 2] positions in µm, "
                                 f"got shape {g.shape}")
        if not np.all(np.isfinite(g)):
            raise RecordingError("geometry: positions must be finite")
        return check_distinct_positions(g, "geometry")

    @property
    def duration_s(self) -> float:
        """n_samples / fs, in seconds."""
        return self.n_samples / self.fs

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.source!r}, {self.n_channels} channels x "
                f"{self.n_samples} samples {self.dtype}, {self.fs:g} Hz, "
                f"{self.duration_s:.2f} s)")

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Release what the recording holds open (a file, a memory map, reader threads);
        reading it afterwards raises `RecordingError`. Closing twice is harmless.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.io import open_recording
        >>> with open_recording(np.zeros((3000, 2), np.int16), fs=30000.0) as rec:
        ...     rec.read(0, 2).shape
        (2, 2)
        >>> rec.closed
        True
        """
        self.closed = True

    def files(self) -> tuple[Path, ...]:
        """Every file on disk that belongs to the recording: its samples and its metadata
        (absolute, symbolic links resolved). An output must never be one of them. Empty for a
        recording that holds no file (an array, a SpikeInterface object).

        Returns
        -------
        tuple of pathlib.Path

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np
        >>> from dspk.io import open_recording
        >>> open_recording(np.zeros((3000, 2), np.int16), fs=30000.0).files()
        ()
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = os.path.join(tmp.name, "rec.bin")
        >>> np.zeros((10, 2), np.int16).tofile(path)
        >>> with open_recording(path, n_channels=2, fs=1000.0) as rec:
        ...     [p.name for p in rec.files()]
        ['rec.bin']
        >>> tmp.cleanup()
        """
        return ()

    @classmethod
    def recognizes(cls, source: Any, options: OpenOptions) -> bool:
        """Whether ``source`` (what `open_recording` was given: a path, an array, ...) is
        this format, given the caller's ``options``; cheap, reading at most a file's name, a
        folder listing or a few header bytes. `open_recording` asks the formats in order and
        opens the source with the first that recognises it.

        Parameters
        ----------
        source : object
            A path (str or path-like; it exists) or an object.
        options : OpenOptions
            The caller's keywords.

        Returns
        -------
        bool

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.io import ArrayRecording, BinaryRecording
        >>> from dspk.io.recording import OpenOptions
        >>> x = np.zeros((3000, 2), np.int16)
        >>> ArrayRecording.recognizes(x, OpenOptions()), BinaryRecording.recognizes(x,
        ...                                                                        OpenOptions())
        (True, False)
        """
        return False

    @classmethod
    def from_source(cls, source: Any, options: OpenOptions) -> "Recording":
        """The recording of a source this format `recognizes`, opened with the options
        that apply to it; those that do not are refused when they contradict what was read.

        Parameters
        ----------
        source : object
            As given to `recognizes`.
        options : OpenOptions
            The caller's keywords.

        Returns
        -------
        Recording

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.io import ArrayRecording
        >>> from dspk.io.recording import OpenOptions
        >>> rec = ArrayRecording.from_source(np.zeros((3000, 2), np.int16),
        ...                                  OpenOptions(fs=30000.0))
        >>> rec.n_channels
        2
        """
        raise NotImplementedError(f"{cls.__name__} is not opened from a source by "
                                  f"open_recording; construct it")

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def spec(self) -> "RecordingSpec":
        """How to open this recording again, as a small picklable object: the class and the
        resolved arguments (sampling rate, gains, offsets, geometry: what the file said or
        the caller overrode) of a recording that reads a file, or the recording itself for
        one that holds no file (an array: it travels whole). ``spec().open()`` in a worker
        process gives a recording of the same samples and metadata with its own handle.

        Returns
        -------
        RecordingSpec

        Examples
        --------
        >>> import pickle
        >>> import numpy as np
        >>> from dspk.io import open_recording
        >>> rec = open_recording(np.arange(8, dtype=np.int16).reshape(4, 2), fs=1000.0,
        ...                      layout="samples_channels")
        >>> again = pickle.loads(pickle.dumps(rec.spec())).open()   # as in a worker
        >>> again.read(0, 2, scaled=False)
        array([[0, 2],
               [1, 3]], dtype=int16)
        """
        return RecordingSpec(recording=self)

    def reopen(self) -> "Recording":
        """A recording of the same samples and metadata with its own file handle
        (``self.spec().open()``; for an in-memory recording, a shallow copy sharing its
        samples). Close it when done; this one stays open.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.io import open_recording
        >>> rec = open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
        >>> with rec.reopen() as again:
        ...     again.n_samples
        3000
        >>> rec.closed
        False
        """
        spec = self.spec()
        if spec.recording is not None:
            again = copy.copy(spec.recording)
            again.closed = False
            return again
        return spec.open()

    def _check_open(self) -> None:
        if self.closed:
            raise RecordingError(f"{self.source or 'the recording'}: closed")

    # -- reading -----------------------------------------------------------------------------
    def read(self, start: int = 0, stop: int | None = None, channels: Any = None,
             scaled: bool = True) -> Any:
        """Samples ``start:stop`` as [channels, samples].

        Parameters
        ----------
        start, stop : int
            Sample range, 0 <= start <= stop <= n_samples (stop None: to the end).
        channels : slice, sequence of int or None
            A subset of channels, in the order given.
        scaled : bool
            float32 µV (raw · gain_to_uv + offset_to_uv) when True, the stored type otherwise.

        Returns
        -------
        array
            [len(channels), stop − start], a NumPy array (a CuPy array for an
            `ArrayRecording` of one).

        Raises
        ------
        RecordingError
            A range outside the recording, channel indices out of range, a request larger than
            MAX_READ_BYTES, or non-finite float samples (the message names channel and sample).

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.io import open_recording
        >>> rec = open_recording(np.arange(12, dtype=np.int16).reshape(4, 3).T.copy(),
        ...                      fs=1000.0, layout="samples_channels")
        >>> rec.read(1, 3, channels=[3, 0], scaled=False)
        array([[10, 11],
               [ 1,  2]], dtype=int16)
        """
        self._check_open()
        stop = self.n_samples if stop is None else int(stop)
        start = int(start)
        if not 0 <= start <= stop <= self.n_samples:
            raise RecordingError(f"read: expected 0 <= start <= stop <= {self.n_samples}, got "
                                 f"start={start}, stop={stop}")
        idx = self._channels(channels)
        nbytes = len(idx) * (stop - start) * (4 if scaled else self.dtype.itemsize)
        if nbytes > MAX_READ_BYTES:
            raise RecordingError(f"read: {nbytes / 2**30:.1f} GiB in one call exceeds "
                                 f"MAX_READ_BYTES ({MAX_READ_BYTES / 2**30:.0f} GiB); read in "
                                 f"chunks or run a dspk.pipeline")
        raw = self._read(start, stop, idx)          # [len(idx), stop - start], stored type
        if raw.dtype.kind == "f":
            self._check_finite(raw, start, idx)
        if not scaled:
            return raw
        return to_uv(raw, self.gain_to_uv[idx], self.offset_to_uv[idx])

    #: whether the source stores samples first ([samples, channels]); see `read_native`
    samples_first: bool = True
    #: whether reading decompresses (a pipeline then reads more chunks ahead)
    compressed: bool = False
    #: seconds spent decompressing so far, summed over threads (sources that decompress)
    decompress_s: float = 0.0

    def read_native(self, start: int, stop: int, out: np.ndarray | None = None) -> Any:
        """Raw samples ``start:stop`` of every channel as stored, without scaling or
        transposing: [samples, channels] when ``samples_first``, else [channels, samples], in
        the stored dtype. For a GPU pipeline, which moves the raw bytes (half of float32's for
        int16) and transposes and scales on the device. ``out`` (a host array of that shape
        and dtype, a pinned buffer say) receives the samples where the source can read into
        it; the array returned holds them either way."""
        start, stop = self._native_request("read_native", start, stop, out,
                                           self.samples_first)
        block = self._read_native(start, stop, out)
        if block.dtype.kind == "f":
            xp = array_module(block)
            if not bool(xp.isfinite(block).all()):
                self._check_finite(block if not self.samples_first else block.T, start,
                                   np.arange(self.n_channels))
        return block

    @property
    def differences_supported(self) -> bool:
        """Whether `read_native_differences` reads this source: one stored as differences
        along time (mtscomp's ``.cbin``)."""
        return False

    def read_native_differences(self, start: int, stop: int,
                                out: np.ndarray | None = None) -> Any:
        """`read_native`'s block [channels, samples] as differences along time, whose
        cumulative sum in the stored dtype (wrapping) is that block exactly, for a source
        stored so (`differences_supported`): the decode's sums, which hold NumPy's GIL, are
        then left to the caller (a GPU job sums on the device).

        Parameters
        ----------
        start, stop : int
        out : numpy.ndarray, optional
            [channels, stop − start] of the stored dtype.

        Raises
        ------
        RecordingError
            A source not stored as differences, a range out of bounds.

        Examples
        --------
        >>> import numpy as np, dspk
        >>> rec = dspk.open_recording(np.zeros((100, 2), np.int16), fs=3e4)
        >>> rec.differences_supported
        False
        """
        if not self.differences_supported:
            raise RecordingError(f"{self!r}: not stored as differences along time: "
                                 f"read_native reads it")
        start, stop = self._native_request("read_native_differences", start, stop, out,
                                           False)
        return self._read_native_differences(start, stop, out)

    def _native_request(self, name: str, start: int, stop: int, out: np.ndarray | None,
                        samples_first: bool) -> tuple[int, int]:
        """(start, stop) of a stored-form read ``name``, checked: the recording open, the
        range inside it, ``out`` of the block's shape and the stored dtype."""
        self._check_open()
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.n_samples:
            raise RecordingError(f"{name}: expected 0 <= start <= stop <= "
                                 f"{self.n_samples}, got start={start}, stop={stop}")
        shape = (stop - start, self.n_channels) if samples_first else \
            (self.n_channels, stop - start)
        if out is not None and (out.shape != shape or out.dtype != self.dtype):
            raise RecordingError(f"out: expected {shape} {self.dtype}, got {out.shape} "
                                 f"{out.dtype}")
        return start, stop

    def _read_native_differences(self, start: int, stop: int,
                                 out: np.ndarray | None) -> Any:
        raise RecordingError(f"{self!r}: not stored as differences along time")

    def _read_native(self, start: int, stop: int, out: np.ndarray | None) -> Any:
        """Default: through `_read` (channels first) and back."""
        block = self._read(start, stop, np.arange(self.n_channels))
        if self.samples_first:
            block = block.T
        if out is None:
            return block
        out[...] = array_module(block).asnumpy(block) if array_module(block) is not np \
            else block
        return out

    def _channels(self, channels: Any) -> np.ndarray:
        if channels is None:
            return np.arange(self.n_channels)
        if isinstance(channels, slice):
            return np.arange(self.n_channels)[channels]
        idx = np.asarray(channels)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise RecordingError(f"channels: expected a slice or a 1-D sequence of channel "
                                 f"indices, got {channels!r}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_channels):
            raise RecordingError(f"channels: indices must be in [0, {self.n_channels})")
        return idx.astype(np.int64)

    def _check_finite(self, raw: Any, start: int, idx: np.ndarray) -> None:
        xp = array_module(raw)
        bad = ~xp.isfinite(raw)
        if bool(bad.any()):
            c, s = (int(v) for v in xp.argwhere(bad)[0])
            raise RecordingError(f"{self.source}: non-finite sample ({float(raw[c, s])}) at "
                                 f"channel {int(idx[c])}, sample {start + s}")

    def _read(self, start: int, stop: int, idx: np.ndarray) -> Any:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class RecordingSpec:
    """How to open a recording again, in this process or another: picklable and small (no
    file handle, no samples of a file). Made by `Recording.spec`.

    Parameters
    ----------
    cls : type, optional
        The `Recording` class that reads the file (pickled by reference).
    kwargs : dict
        Its constructor's arguments (path, dataset, sampling rate, gains, geometry, ...).
    recording : Recording, optional
        Instead of ``cls``: a recording that holds no file (an array), returned by `open`.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from dspk.io import open_recording
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rec.bin")
    >>> np.arange(12, dtype=np.int16).tofile(path)
    >>> with open_recording(path, n_channels=2, fs=1000.0, gain_to_uv=0.5) as rec:
    ...     spec = rec.spec()
    >>> spec.cls.__name__, spec.kwargs["n_channels"]
    ('BinaryRecording', 2)
    >>> with spec.open() as again:                  # its own memory map
    ...     again.read(0, 3)
    array([[0. , 1. , 2. ],
           [0.5, 1.5, 2.5]], dtype=float32)
    >>> tmp.cleanup()
    """

    cls: type | None = None
    kwargs: dict = field(default_factory=dict)
    recording: Any = None

    def open(self) -> Recording:
        """The recording: ``cls(**kwargs)``, or ``recording``.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.io import RecordingSpec, open_recording
        >>> rec = open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
        >>> RecordingSpec(recording=rec).open() is rec
        True
        """
        if self.cls is None:
            return self.recording
        return self.cls(**self.kwargs)

    def __repr__(self) -> str:
        what = self.cls.__name__ if self.cls is not None else repr(self.recording)
        path = self.kwargs.get("path")
        return f"RecordingSpec({what}{'' if path is None else f', {path!r}'})"


def resolved_metadata(rec: Recording) -> dict:
    """The metadata of an opened recording as constructor keywords (``fs``, ``gain_to_uv``,
    ``offset_to_uv``, ``geometry``): a reopened file gives these values whatever its
    attributes or the caller's overrides said (what `Recording.spec` hands on).

    Parameters
    ----------
    rec : Recording
        An opened recording.

    Returns
    -------
    dict

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import open_recording
    >>> from dspk.io.recording import resolved_metadata
    >>> rec = open_recording(np.zeros((3000, 2), np.int16), fs=30000.0, gain_to_uv=0.5)
    >>> meta = resolved_metadata(rec)
    >>> meta["fs"], meta["gain_to_uv"], meta["geometry"]
    (30000.0, array([0.5, 0.5]), None)
    """
    return {"fs": rec.fs, "gain_to_uv": rec.gain_to_uv, "offset_to_uv": rec.offset_to_uv,
            "geometry": rec.geometry}


class ArrayRecording(Recording):
    """A NumPy or CuPy array as a recording (no copy; reads return the array's type).

    Parameters
    ----------
    array : numpy.ndarray or cupy.ndarray
        2-D samples of any dtype `Recording` takes.
    fs : float
        Sampling rate in Hz.
    layout : {"samples_channels", "channels_samples"}, optional
        Told from the shape when one axis is at least twice the other, otherwise required.
    **meta
        ``gain_to_uv``, ``offset_to_uv``, ``geometry``, ``source`` (as for `Recording`).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import ArrayRecording
    >>> x = np.random.default_rng(0).standard_normal((4, 3000)).astype(np.float32)
    >>> rec = ArrayRecording(x, 30000.0, geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)])
    >>> rec                                   # [channels, samples]: told from the shape
    ArrayRecording('array (4, 3000)', 4 channels x 3000 samples float32, 30000 Hz, 0.10 s)
    >>> bool(np.array_equal(rec.read(100, 200), x[:, 100:200]))
    True
    """

    def __init__(self, array: Any, fs: float, layout: str | None = None, **meta: Any) -> None:
        if getattr(array, "ndim", None) != 2:
            raise RecordingError(f"array: expected a 2-D array, got shape "
                                 f"{getattr(array, 'shape', None)}")
        layout = resolve_layout(layout, array.shape, "the array")
        self._samples_first = layout == "samples_channels"
        n, c = array.shape if self._samples_first else array.shape[::-1]
        super().__init__(fs=fs, n_channels=c, n_samples=n, dtype=array.dtype,
                         source=meta.pop("source", f"array {array.shape}"), **meta)
        self._array = array
        self.samples_first = self._samples_first

    @classmethod
    def recognizes(cls, source: Any, options: OpenOptions) -> bool:
        """A NumPy or CuPy array (see `Recording.recognizes`)."""
        return isinstance(source, np.ndarray) or is_cupy_array(source)

    @classmethod
    def from_source(cls, source: Any, options: OpenOptions) -> "ArrayRecording":
        """The array with ``fs`` (required), ``layout`` and the metadata overrides; the
        flat-binary options are refused unless they describe the array (see
        `Recording.from_source`)."""
        if options.fs is None:
            raise RecordingError(f"fs: an array recording needs its sampling rate "
                                 f"({arg('fs')})")
        options.no_dataset("an array", f"shape {source.shape}")
        return options.check(cls(source, options.fs, options.layout, **options.meta()),
                             "an array", layout=False)

    def _read(self, start: int, stop: int, idx: np.ndarray) -> Any:
        a = self._array
        block = a[start:stop] if self._samples_first else a[:, start:stop]
        return channels_first(block, idx, self.n_channels, self._samples_first)

    def _read_native(self, start: int, stop: int, out: np.ndarray | None) -> Any:
        a = self._array
        block = a[start:stop] if self._samples_first else a[:, start:stop]
        if out is None or array_module(block) is not np:
            return block
        np.copyto(out, block)
        return out


class BinaryRecording(Recording):
    """A flat binary file of interleaved samples, [samples, channels] (Kilosort, SpikeGLX),
    memory-mapped read-only; optionally a subset of the stored channels (``columns``), so
    that stored channels which are not signals (a sync word, digital inputs) stay out of the
    recording.

    Parameters
    ----------
    path : str
        The file; its size after ``header_bytes`` must be a whole number of frames.
    n_channels : int
        Channels per stored frame (all of them, including any left out by ``columns``).
    fs : float
        Sampling rate in Hz.
    dtype : numpy dtype
        The sample type (default int16).
    header_bytes : int
        Bytes before the first sample.
    columns : sequence of int, optional
        The stored channels (0 to ``n_channels`` − 1, each at most once) that are the
        recording's channels, in the recording's order: channel i is stored column
        ``columns[i]``. Default: every stored channel.
    **meta
        ``gain_to_uv``, ``offset_to_uv``, ``geometry`` (as for `Recording`; one value per
        recording channel).

    Attributes
    ----------
    n_stored : int
        Channels per stored frame.
    columns : numpy.ndarray
        The stored column of each recording channel.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from dspk.io import BinaryRecording
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rec.bin")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"HDR!")                                  # a 4-byte header
    ...     np.arange(24, dtype=np.int16).reshape(6, 4).tofile(f)   # 6 samples x 4 channels
    >>> rec = BinaryRecording(path, n_channels=4, fs=30000.0, header_bytes=4,
    ...                       gain_to_uv=0.5)
    >>> rec.n_samples, rec.read(0, 2)
    (6, array([[0. , 2. ],
           [0.5, 2.5],
           [1. , 3. ],
           [1.5, 3.5]], dtype=float32))

    The first three stored channels only (the fourth, say, a sync word):

    >>> rec = BinaryRecording(path, n_channels=4, fs=30000.0, header_bytes=4,
    ...                       columns=[0, 1, 2])
    >>> rec.n_channels, rec.read(0, 2, scaled=False)
    (3, array([[0, 4],
           [1, 5],
           [2, 6]], dtype=int16))
    >>> del rec
    >>> tmp.cleanup()
    """

    def __init__(self, path: str, n_channels: int, fs: float, dtype: Any = np.int16,
                 header_bytes: int = 0, columns: Any = None, **meta: Any) -> None:
        dtype = np.dtype(dtype)
        if n_channels is None or int(n_channels) < 1:
            raise RecordingError(f"n_channels: a flat binary ({path}) needs its channel count "
                                 f"(at least 1; got {n_channels}); pass {arg('n_channels')}")
        stored = int(n_channels)
        n_samples = self._stored_samples(str(path), stored, dtype, int(header_bytes))
        cols = _stored_columns(columns, stored, str(path))
        super().__init__(fs=fs, n_channels=len(cols), n_samples=n_samples,
                         dtype=dtype, source=str(path), **meta)
        self._map = self._map_samples(str(path), dtype, int(header_bytes),
                                      (self.n_samples, stored))
        self.path, self.header_bytes = str(path), int(header_bytes)
        self.n_stored, self.columns = stored, cols
        # a run of consecutive columns is a basic slice (a view of the map, no gather); the
        # common case: signals first, the sync or digital words last
        consecutive = bool(np.all(np.diff(cols) == 1))
        self._cols: Any = slice(int(cols[0]), int(cols[-1]) + 1) if consecutive else cols
        self._all = consecutive and len(cols) == stored

    def _stored_samples(self, path: str, stored: int, dtype: np.dtype,
                        header_bytes: int) -> int:
        """The samples the file holds (its size after the header over the frame's), checked
        to be whole frames. A subclass that stores its samples otherwise (compressed, say)
        overrides this and `_map_samples`."""
        size = os.path.getsize(path) - header_bytes
        frame = stored * dtype.itemsize
        if size < 0 or size % frame:
            raise RecordingError(f"{path}: {size} bytes of samples is not a whole number of "
                                 f"{stored}-channel {dtype} frames ({frame} bytes): "
                                 f"truncated, or wrong n_channels/dtype/header_bytes")
        return size // frame

    def _map_samples(self, path: str, dtype: np.dtype, header_bytes: int,
                     shape: tuple) -> Any:
        """The samples as a read-only [samples, stored channels] memory map."""
        return np.memmap(path, dtype=dtype, mode="r", offset=header_bytes, shape=shape)

    @classmethod
    def recognizes(cls, source: Any, options: OpenOptions) -> bool:
        """A file named ``.bin``, ``.dat`` or ``.raw``, or any file when ``n_channels`` is
        given (see `Recording.recognizes`); asked last, after every format with metadata."""
        path = source_path(source)
        return path is not None and os.path.isfile(path) and \
            (options.n_channels is not None or path.lower().endswith(BINARY_SUFFIXES))

    @classmethod
    def from_source(cls, source: Any, options: OpenOptions) -> "BinaryRecording":
        """The file as [samples, channels] frames of ``n_channels`` (required) ``dtype``
        samples (default int16) after ``header_bytes`` (see `Recording.from_source`)."""
        path = os.fspath(source)
        if options.n_channels is None:
            raise RecordingError(f"n_channels: a flat binary ({path}) needs its channel "
                                 f"count; pass {arg('n_channels')} and {arg('fs')} (and "
                                 f"{arg('dtype')} if not int16)")
        if options.layout not in (None, "samples_channels"):
            raise RecordingError("layout: flat binaries are [samples, channels]")
        options.no_dataset("a flat binary", path)
        return cls(path, options.n_channels, options.fs,
                   np.int16 if options.dtype is None else options.dtype,
                   options.header_bytes, **options.meta())

    def files(self) -> tuple[Path, ...]:
        """The file (see `Recording.files`)."""
        return (Path(self.path).resolve(),)

    def close(self) -> None:
        """Drop the memory map (the file is unmapped once no array read from it is left)."""
        self._map = None
        super().close()

    def spec(self) -> RecordingSpec:
        """A `BinaryRecording` of the same file, columns and metadata (see `Recording.spec`).

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np
        >>> from dspk.io import BinaryRecording
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = os.path.join(tmp.name, "rec.bin")
        >>> np.zeros((10, 3), np.int16).tofile(path)
        >>> rec = BinaryRecording(path, n_channels=3, fs=1000.0, columns=[0, 1])
        >>> rec.spec().open().n_channels
        2
        >>> del rec
        >>> tmp.cleanup()
        """
        return RecordingSpec(BinaryRecording, dict(
            path=self.path, n_channels=self.n_stored, dtype=self.dtype,
            header_bytes=self.header_bytes, columns=self.columns, **resolved_metadata(self)))

    def _read(self, start: int, stop: int, idx: np.ndarray) -> np.ndarray:
        if isinstance(self._cols, slice):     # a view of the run of columns: no gather
            return channels_first(self._map[start:stop, self._cols], idx, self.n_channels, True)
        return channels_first(self._map[start:stop], self.columns[idx], self.n_stored, True)

    def _read_native(self, start: int, stop: int, out: np.ndarray | None) -> np.ndarray:
        block = self._map[start:stop] if self._all else self._map[start:stop, self._cols]
        if out is None:
            return np.array(block)
        np.copyto(out, block)
        return out


def _stored_columns(columns: Any, stored: int, source: str) -> np.ndarray:
    """``columns`` checked: 1-D integers in [0, stored), none twice, at least one."""
    if columns is None:
        return np.arange(stored, dtype=np.int64)
    cols = np.asarray(columns)
    if cols.ndim != 1 or cols.size == 0 or (cols.dtype.kind not in "iu"):
        raise RecordingError(f"columns: expected a non-empty 1-D sequence of stored channel "
                             f"indices for {source}, got {columns!r}")
    if cols.min() < 0 or cols.max() >= stored:
        raise RecordingError(f"columns: stored channel indices of {source} must be in "
                             f"[0, {stored}), got {cols.min()}..{cols.max()}")
    if len(np.unique(cols)) != len(cols):
        raise RecordingError(f"columns: a stored channel of {source} is listed twice")
    return cols.astype(np.int64)
