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

from ..argnames import arg
from .errors import RecordingError, RecordingWarning
from .hdf5 import HDF5Recording, electrical_series
from .layout import to_channels_first
from .openephys import OEBIN, OpenEphysRecording
from .probe import read_probe
from .recording import (BINARY_SUFFIXES, MAX_CHANNELS, MAX_READ_BYTES, ArrayRecording,
                        BinaryRecording, OpenOptions, Recording, RecordingSpec, source_path)
from .scaling import check_gains, to_uv
from .spikeinterface_recording import SpikeInterfaceRecording
from .spikeglx import SpikeGLXRecording, meta_path
from .subset import SubsetRecording
from .sync import sync_edges, sync_events
from .events import recording_events, write_events_csv
from .cbin import CbinReader

__all__ = ["open_recording", "read_probe", "Recording", "RecordingError", "RecordingWarning",
           "RecordingSpec", "ArrayRecording",
           "BinaryRecording", "SpikeGLXRecording", "OpenEphysRecording",
           "SpikeInterfaceRecording", "HDF5Recording", "SubsetRecording", "electrical_series",
           "to_channels_first", "to_uv", "recording_formats", "sync_edges", "sync_events",
           "recording_events", "write_events_csv",
           "CbinReader",
           "MAX_CHANNELS", "MAX_READ_BYTES", "BINARY_SUFFIXES"]


def open_recording(source: Any, dataset: str | None = None, fs: float | None = None,
                   layout: str | None = None, gain_to_uv: Any = None, offset_to_uv: Any = None,
                   geometry: Any = None, n_channels: int | None = None, dtype: Any = None,
                   header_bytes: int = 0, allow_external_links: bool = False,
                   allow_negative_gain: bool = False) -> Recording:
    """Open a recording; the common formats need no options.

    Parameters
    ----------
    source : path or array
        One of:

        - a SpikeGLX ``.bin`` (``.ap.bin``, ``.lf.bin``, ``.nidq.bin``, any ``.bin`` with a
          ``.meta`` of the same stem beside it) or that ``.meta``: rate, µV per bit and
          geometry from the metadata, the sync/digital words left out (`SpikeGLXRecording`;
          their edges: `sync_events`); or the same compressed by mtscomp as IBL publishes
          it (``.ap.cbin`` + ``.ap.ch`` + ``.ap.meta``), decoded in parallel (`CbinReader`);
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
    allow_negative_gain : bool
        Accept negative gains (refused by default: they flip the signal's sign, spikes
        upward). Gains of 0 and non-finite gains, given or read from the file, are always
        refused.

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
        A file that is neither HDF5 nor a described binary, a truncated or damaged file (an
        Open Ephys ``continuous.dat`` with fewer or more samples than its
        ``sample_numbers.npy``), a missing dataset (the datasets found are listed), several
        ElectricalSeries or streams and no choice, a folder with no or several Open Ephys
        recordings (listed), a SpikeGLX ``.meta`` without a tag that is needed (named), a file
        named like a SpikeGLX stream without its ``.meta`` (named), a layout that cannot be
        told, absurd dimensions, an external link, fewer than 2 samples, no channel, a gain
        of 0, not finite or (without ``allow_negative_gain``) negative, wrong metadata, a
        geometry with two channels at one position, an option that contradicts the file.
    TypeError
        A source that is neither a path, an array nor a SpikeInterface recording.

    Warns
    -----
    RecordingWarning
        A SpikeGLX ``.bin`` whose ``.meta`` has no ``fileSizeBytes`` and whose length
        disagrees with the ``.meta``'s ``fileTimeSecs``.

    See Also
    --------
    SpikeGLXRecording, OpenEphysRecording : What is read from those formats, with examples.
    read_probe : Probe files for ``geometry=``.
    recording_formats : The formats asked, in order, whether a source is theirs.

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
    options = OpenOptions(dataset=dataset, fs=fs, layout=layout, gain_to_uv=gain_to_uv,
                          offset_to_uv=offset_to_uv, geometry=geometry, n_channels=n_channels,
                          dtype=dtype, header_bytes=header_bytes,
                          allow_external_links=allow_external_links)
    path = source_path(source)
    if path is not None and not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    for fmt in recording_formats():
        if fmt.recognizes(source, options):
            rec = fmt.from_source(source, options)
            try:        # before any work: a zero gain zeroes the output, a negative one flips it
                check_gains(rec.gain_to_uv, rec.source, allow_negative_gain)
            except RecordingError:
                rec.close()
                raise
            return rec
    if path is None:
        raise TypeError(f"source: expected a path or an array, got {type(source).__name__}")
    if os.path.isdir(path):
        raise RecordingError(_not_a_recording_folder(path))
    raise RecordingError(f"{path}: not an HDF5 file; a flat binary needs {arg('n_channels')} "
                         f"and {arg('fs')} (and {arg('dtype')} if not int16)")


def recording_formats() -> tuple[type[Recording], ...]:
    """The formats `open_recording` asks, in order, whether a source is theirs
    (`Recording.recognizes`): objects first, then the files whose metadata say what they
    are, then HDF5, and the flat binary last (any file, given its channel count).

    Returns
    -------
    tuple of Recording subclasses

    Examples
    --------
    >>> from dspk.io import recording_formats
    >>> [f.__name__ for f in recording_formats()]                 # doctest: +NORMALIZE_WHITESPACE
    ['ArrayRecording', 'SpikeInterfaceRecording', 'OpenEphysRecording', 'SpikeGLXRecording',
     'HDF5Recording', 'BinaryRecording']
    """
    return (ArrayRecording, SpikeInterfaceRecording, OpenEphysRecording, SpikeGLXRecording,
            HDF5Recording, BinaryRecording)


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
