"""Recordings on disk and in memory (HDF5 datasets, NWB ElectricalSeries, SpikeGLX and Open
Ephys recordings, flat binaries, arrays), read as [channels, samples], and probe files.
``io`` reads and converts to µV; it never computes.

>>> import numpy as np
>>> from dspk.io import open_recording
>>> rec = open_recording(np.zeros((3000, 4), np.int16), fs=30000.0)
>>> rec.n_channels, rec.n_samples, rec.read(0, 10).shape
(4, 3000, (4, 10))
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..backend import is_cupy_array
from .layout import to_channels_first
from .openephys import OEBIN, OpenEphysRecording, find_oebins
from .probe import read_probe
from .recording import (MAX_CHANNELS, MAX_READ_BYTES, ArrayRecording, BinaryRecording,
                        Recording, RecordingError, RecordingSpec, SpikeInterfaceRecording)
from .spikeglx import SpikeGLXRecording, meta_path

__all__ = ["open_recording", "read_probe", "Recording", "RecordingError", "RecordingSpec",
           "ArrayRecording",
           "BinaryRecording", "SpikeGLXRecording", "OpenEphysRecording",
           "SpikeInterfaceRecording", "HDF5Recording", "electrical_series",
           "to_channels_first",
           "MAX_CHANNELS", "MAX_READ_BYTES"]

BINARY_SUFFIXES = (".bin", ".dat", ".raw")


def open_recording(source: Any, dataset: str | None = None, fs: float | None = None,
                   layout: str | None = None, gain_to_uv: Any = None, offset_to_uv: Any = None,
                   geometry: Any = None, n_channels: int | None = None, dtype: Any = None,
                   header_bytes: int = 0, allow_external_links: bool = False) -> Recording:
    """Open a recording; the common formats need no options.

    Parameters
    ----------
    source : path or array
        One of:

        - a SpikeGLX ``.bin`` (``.ap.bin``, ``.lf.bin``, ``.nidq.bin``, any ``.bin`` with a
          ``.meta`` of the same stem beside it) or that ``.meta``: rate, µV per bit and
          geometry from the metadata, the sync/digital words left out (`SpikeGLXRecording`);
        - an Open Ephys binary-format recording: its ``structure.oebin``, its folder, a
          folder above it (Record Node, experiment) with exactly one recording below, or a
          stream's ``continuous.dat``; ADC/AUX channels left out (`OpenEphysRecording`);
        - an HDF5 file (a dataset, or an NWB ElectricalSeries found under /acquisition or
          /processing);
        - a flat binary (``.bin``/``.dat``/``.raw`` without metadata, or any non-HDF5 file
          when ``n_channels`` is given: [samples, channels] as Kilosort writes it);
        - a NumPy/CuPy array (``fs`` required), or a SpikeInterface recording (its first
          segment; gains, offsets and channel locations taken from it).
    dataset : str, optional
        Path inside the HDF5 file (a 2-D dataset or an ElectricalSeries group), or the Open
        Ephys stream (its folder name, or index as a string). Needed when the file holds
        several series or streams and none is clearly the neural one (the error lists them).
    fs : float, optional
        Sampling rate in Hz; overrides the file's.
    layout : {"samples_channels", "channels_samples"}, optional
        Storage order; told from the shape when one axis is at least twice the other (NWB:
        samples first), otherwise required.
    gain_to_uv, offset_to_uv : float or per-channel array, optional
        µV = raw · gain_to_uv + offset_to_uv; override the file's. Unsigned data without an
        offset is centred (uint16: −32768·gain), never cast to a signed type.
    geometry : [channels, 2] array, probeinterface Probe or ProbeGroup, or a probe file
        Contact positions in µm, row i for channel i; overrides the file's. A Probe's contacts
        are ordered by its ``device_channel_indices`` when set; a path is read with
        `read_probe` (probeinterface JSON, ``.prb``, CSV).
    n_channels, dtype, header_bytes :
        For flat binaries (dtype default int16). Not needed for SpikeGLX and Open Ephys files
        (refused when they contradict the metadata).
    allow_external_links : bool
        Follow HDF5 external links (refused by default: they can point outside the file).

    Returns
    -------
    Recording
        With ``fs``, ``n_channels``, ``n_samples``, ``dtype``, ``geometry``, ``gain_to_uv``,
        ``offset_to_uv`` and ``read(start, stop, channels=None, scaled=True)``.

    Raises
    ------
    FileNotFoundError
        A path that does not exist.
    RecordingError
        A file that is neither HDF5 nor a described binary, a truncated or damaged file, a
        missing dataset (the datasets found are listed), several ElectricalSeries or streams
        and no choice, a folder with no or several Open Ephys recordings (listed), a SpikeGLX
        ``.meta`` without a tag that is needed (named), a layout that cannot be told, absurd
        dimensions, an external link, fewer than 2 samples, wrong metadata.

    See Also
    --------
    SpikeGLXRecording, OpenEphysRecording : What is read from those formats, with examples.
    read_probe : Probe files for ``geometry=``.

    Examples
    --------
    An array (the layout told from the shape: samples are the longer axis):

    >>> import os, tempfile
    >>> import h5py, numpy as np
    >>> from dspk.io import open_recording
    >>> rec = open_recording(np.zeros((3000, 4), dtype=np.int16), fs=30000.0)
    >>> rec.n_channels, rec.n_samples, rec.read(0, 10).shape, rec.read(0, 10).dtype
    (4, 3000, (4, 10), dtype('float32'))

    An HDF5 dataset whose attributes carry the rate, the µV scale and the geometry:

    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rec.h5")
    >>> with h5py.File(path, "w") as f:
    ...     d = f.create_dataset("traces", data=np.full((3000, 4), 10, dtype=np.int16))
    ...     d.attrs["fs"] = 30000.0
    ...     d.attrs["gain_to_uv"] = 0.25
    ...     d.attrs["geometry"] = np.c_[np.zeros(4), 20.0 * np.arange(4)]
    >>> rec = open_recording(path)
    >>> rec                                                   # doctest: +ELLIPSIS
    HDF5Recording('...rec.h5:/traces', 4 channels x 3000 samples int16, 30000 Hz, 0.10 s)
    >>> rec.read(0, 2)                                        # float32 µV, [channels, samples]
    array([[2.5, 2.5],
           [2.5, 2.5],
           [2.5, 2.5],
           [2.5, 2.5]], dtype=float32)
    >>> rec.close()

    A flat binary, [samples, channels] int16 (Kilosort, SpikeGLX):

    >>> raw = os.path.join(tmp.name, "rec.bin")
    >>> np.arange(24, dtype=np.int16).reshape(6, 4).tofile(raw)
    >>> rec = open_recording(raw, n_channels=4, fs=30000.0)
    >>> rec.read(0, 3, scaled=False)
    array([[ 0,  4,  8],
           [ 1,  5,  9],
           [ 2,  6, 10],
           [ 3,  7, 11]], dtype=int16)
    >>> del rec
    >>> tmp.cleanup()
    """
    meta = dict(gain_to_uv=gain_to_uv, offset_to_uv=offset_to_uv, geometry=geometry)
    if isinstance(source, np.ndarray) or is_cupy_array(source):
        if fs is None:
            raise RecordingError("fs: an array recording needs its sampling rate (fs=)")
        return ArrayRecording(source, fs, layout, **meta)
    if hasattr(source, "get_traces") and hasattr(source, "get_sampling_frequency"):
        return SpikeInterfaceRecording(source, fs=fs, **meta)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source: expected a path or an array, got {type(source).__name__}")
    path = os.fspath(source)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    oe_stream = _open_ephys_stream(path)
    if os.path.isdir(path) and not find_oebins(path):
        raise RecordingError(_not_a_recording_folder(path))
    if os.path.isdir(path) or os.path.basename(path) == OEBIN or oe_stream is not None:
        if oe_stream is not None and dataset not in (None, oe_stream[1]):
            raise RecordingError(f"dataset: {path} is the data of stream {oe_stream[1]!r}, "
                                 f"not {dataset!r}")
        rec = OpenEphysRecording(path if oe_stream is None else oe_stream[0],
                                 dataset if oe_stream is None else oe_stream[1], fs=fs, **meta)
        _no_flat_options(path, "an Open Ephys recording", n_channels, dtype, header_bytes,
                         layout, allowed=(rec.n_stored, rec.n_channels))
        return rec
    if path.lower().endswith(".meta") or meta_path(path) is not None:
        if dataset is not None:
            raise RecordingError(f"dataset: a SpikeGLX file ({path}) holds one stream; "
                                 f"dataset= does not apply")
        rec = SpikeGLXRecording(path, fs=fs, **meta)
        _no_flat_options(path, "a SpikeGLX file", n_channels, dtype, header_bytes, layout,
                         allowed=(rec.n_stored, rec.n_channels))
        return rec
    from .hdf5 import HDF5Recording, _h5py  # noqa: PLC0415 (h5py on first use)

    if _h5py().is_hdf5(path):
        rec = HDF5Recording(path, dataset, fs, layout, allow_external_links=allow_external_links,
                            **meta)
        if n_channels is not None and rec.n_channels != int(n_channels):
            rec.close()
            raise RecordingError(f"n_channels: {path} has {rec.n_channels} channels, not "
                                 f"{n_channels}")
        return rec
    if n_channels is None and not path.lower().endswith(BINARY_SUFFIXES):
        raise RecordingError(f"{path}: not an HDF5 file; a flat binary needs n_channels= "
                             f"and fs= (and dtype= if not int16)")
    if n_channels is None:
        raise RecordingError(f"n_channels: a flat binary ({path}) needs its channel count")
    if layout not in (None, "samples_channels"):
        raise RecordingError("layout: flat binaries are [samples, channels]")
    return BinaryRecording(path, n_channels, fs, np.int16 if dtype is None else dtype,
                           header_bytes, **meta)


def _open_ephys_stream(path: str) -> tuple[str, str] | None:
    """(structure.oebin, stream) when ``path`` is an Open Ephys stream's continuous.dat."""
    if os.path.basename(path) != "continuous.dat":
        return None
    stream_dir = os.path.dirname(os.path.abspath(path))
    oebin = os.path.join(os.path.dirname(os.path.dirname(stream_dir)), OEBIN)
    return (oebin, os.path.basename(stream_dir)) if os.path.isfile(oebin) else None


def _not_a_recording_folder(path: str, most: int = 8) -> str:
    """The message for a folder that is no Open Ephys recording, naming the SpikeGLX files
    below it (a run folder is often what users pass)."""
    sglx = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        sglx += [os.path.relpath(os.path.join(root, f), path) for f in sorted(files)
                 if f.lower().endswith(".bin") and meta_path(os.path.join(root, f))]
        if len(sglx) > most:
            break
    msg = f"{path}: a directory with no {OEBIN} (Open Ephys) in or below it"
    if not sglx:
        return msg + "; pass a recording file"
    return msg + "; SpikeGLX files below it (open one of them):\n  " + "\n  ".join(sglx[:most])


def _no_flat_options(path: str, what: str, n_channels: int | None, dtype: Any,
                     header_bytes: int, layout: str | None, allowed: tuple = ()) -> None:
    """The flat-binary options describe what the metadata already say: refused unless they
    agree (a mismatch means the metadata belong to another file, or a wrong guess)."""
    if n_channels is not None and int(n_channels) not in allowed:
        said = f" ({' or '.join(map(str, allowed))})" if allowed else ""
        raise RecordingError(f"n_channels: {path} is {what} whose metadata give the channel "
                             f"count{said}; leave n_channels out (got {n_channels})")
    if dtype is not None and np.dtype(dtype) != np.int16:
        raise RecordingError(f"dtype: {path} is {what}, int16; got {np.dtype(dtype)}")
    if header_bytes:
        raise RecordingError(f"header_bytes: {path} is {what}, with no header; got "
                             f"{header_bytes}")
    if layout not in (None, "samples_channels"):
        raise RecordingError(f"layout: {path} is {what}, stored [samples, channels]")


def __getattr__(name: str) -> Any:
    if name in ("HDF5Recording", "electrical_series"):
        from . import hdf5  # noqa: PLC0415

        return getattr(hdf5, name)
    raise AttributeError(name)
