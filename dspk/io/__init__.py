"""Recordings on disk and in memory (HDF5 datasets, NWB ElectricalSeries, flat binaries,
arrays), read as [channels, samples]. ``io`` reads and converts to µV; it never computes.

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
from .recording import (MAX_CHANNELS, MAX_READ_BYTES, ArrayRecording, BinaryRecording,
                        Recording, RecordingError, SpikeInterfaceRecording)

__all__ = ["open_recording", "Recording", "RecordingError", "ArrayRecording",
           "BinaryRecording", "SpikeInterfaceRecording", "HDF5Recording", "electrical_series",
           "to_channels_first",
           "MAX_CHANNELS", "MAX_READ_BYTES"]

BINARY_SUFFIXES = (".bin", ".dat", ".raw")


def open_recording(source: Any, dataset: str | None = None, fs: float | None = None,
                   layout: str | None = None, gain_to_uv: Any = None, offset_to_uv: Any = None,
                   geometry: Any = None, n_channels: int | None = None, dtype: Any = None,
                   header_bytes: int = 0, allow_external_links: bool = False) -> Recording:
    """Open a recording.

    Parameters
    ----------
    source : path or array
        An HDF5 file (a dataset, or an NWB ElectricalSeries found under /acquisition or
        /processing), a flat binary (``.bin``/``.dat``/``.raw``, or any non-HDF5 file when
        ``n_channels`` is given: [samples, channels] as Kilosort and SpikeGLX write it), or a
        NumPy/CuPy array (``fs`` required), or a SpikeInterface recording (its first segment;
        gains, offsets and channel locations taken from it).
    dataset : str, optional
        Path inside the HDF5 file: a 2-D dataset or an ElectricalSeries group. Needed when the
        file holds several series (the error lists them).
    fs : float, optional
        Sampling rate in Hz; overrides the file's.
    layout : {"samples_channels", "channels_samples"}, optional
        Storage order; told from the shape when one axis is at least twice the other (NWB:
        samples first), otherwise required.
    gain_to_uv, offset_to_uv : float or per-channel array, optional
        µV = raw · gain_to_uv + offset_to_uv; override the file's. Unsigned data without an
        offset is centred (uint16: −32768·gain), never cast to a signed type.
    geometry : [channels, 2] array or probeinterface Probe, optional
        Contact positions in µm.
    n_channels, dtype, header_bytes :
        For flat binaries (dtype default int16).
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
        missing dataset (the datasets found are listed), several ElectricalSeries and no choice,
        a layout that cannot be told, absurd dimensions, an external link, fewer than 2
        samples, wrong metadata.

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
    if os.path.isdir(path):
        raise RecordingError(f"{path}: a directory, not a recording file")
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


def __getattr__(name: str) -> Any:
    if name in ("HDF5Recording", "electrical_series"):
        from . import hdf5  # noqa: PLC0415

        return getattr(hdf5, name)
    raise AttributeError(name)
