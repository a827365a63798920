"""SpikeInterface's recordings as dspk's: `SpikeInterfaceRecording` reads one segment
through its ``get_traces``, with its gains, locations, shanks and ADC shifts."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import RecordingError
from .layout import to_channels_first
from .probe import stored_geometry
from .recording import OpenOptions, Recording

__all__ = ["SpikeInterfaceRecording"]


class SpikeInterfaceRecording(Recording):
    """A SpikeInterface recording (one segment) read through its ``get_traces``; its gains,
    offsets and channel locations carried over, its ``inter_sample_shift`` property (the
    Neuropixels ADC shifts its readers set) as `sample_shifts`, its channel ids as
    `channel_ids`, its ``group`` property (the shank of each channel when a probe is
    attached by shank) as `shank_ids` and its probe's contact ids as `contact_ids`. Needs
    spikeinterface (optional).

    Parameters
    ----------
    si_recording : spikeinterface BaseRecording
        Any object with SpikeInterface's recording methods (``get_traces``,
        ``get_sampling_frequency``, ``get_num_channels``, ...).
    segment : int
        The segment to read.
    **meta
        ``fs``, ``gain_to_uv``, ``offset_to_uv``, ``geometry``: override the recording's
        (its gains and offsets are taken only when it has scaleable traces; its channel
        locations when a probe is attached).

    Examples
    --------
    With SpikeInterface installed (`open_recording` recognises its recordings; not run
    here: spikeinterface is optional):

    >>> import spikeinterface.core as si                          # doctest: +SKIP
    >>> rec = open_recording(si.generate_recording(num_channels=4))   # doctest: +SKIP

    Any object with the same methods works; a minimal one:

    >>> import numpy as np
    >>> from dspk.io import SpikeInterfaceRecording
    >>> class Tiny:
    ...     data = np.arange(12, dtype=np.int16).reshape(6, 2)       # [samples, channels]
    ...     def get_num_segments(self): return 1
    ...     def has_scaleable_traces(self): return True
    ...     def get_channel_gains(self): return np.array([0.5, 0.5])
    ...     def get_channel_offsets(self): return np.zeros(2)
    ...     def get_channel_locations(self): return np.array([[0.0, 0.0], [0.0, 20.0]])
    ...     def get_sampling_frequency(self): return 30000.0
    ...     def get_num_channels(self): return 2
    ...     def get_num_samples(self, segment_index=0): return 6
    ...     def get_dtype(self): return self.data.dtype
    ...     def get_channel_ids(self): return np.array(["a", "b"])
    ...     def get_traces(self, segment_index, start_frame, end_frame, channel_ids):
    ...         cols = [list(self.get_channel_ids()).index(c) for c in channel_ids]
    ...         return self.data[start_frame:end_frame][:, cols]
    >>> rec = SpikeInterfaceRecording(Tiny())
    >>> rec.fs, rec.geometry[1].tolist(), rec.read(0, 3)
    (30000.0, [0.0, 20.0], array([[0. , 1. , 2. ],
           [0.5, 1.5, 2.5]], dtype=float32))
    """

    def __init__(self, si_recording: Any, segment: int = 0, **meta: Any) -> None:
        r = si_recording
        nseg = r.get_num_segments()
        if not 0 <= segment < nseg:
            raise RecordingError(f"segment: the SpikeInterface recording has {nseg} "
                                 f"segment(s), got {segment}")
        gains = offsets = geometry = None
        if r.has_scaleable_traces():
            gains, offsets = r.get_channel_gains(), r.get_channel_offsets()
        try:
            geometry = stored_geometry(r.get_channel_locations()[:, :2],
                                       f"SpikeInterface {type(r).__name__}")
        except Exception:   # SpikeInterface raises when no probe is attached
            geometry = None
        for key, value in (("gain_to_uv", gains), ("offset_to_uv", offsets),
                           ("geometry", geometry)):
            if meta.get(key) is None:
                meta[key] = value
        super().__init__(fs=meta.pop("fs", None) or r.get_sampling_frequency(),
                         n_channels=r.get_num_channels(),
                         n_samples=r.get_num_samples(segment_index=segment),
                         dtype=r.get_dtype(), source=f"SpikeInterface {type(r).__name__}",
                         **meta)
        self._si, self._segment = r, segment
        self.channel_ids = np.asarray(r.get_channel_ids())
        keys = getattr(r, "get_property_keys", None)       # a minimal look-alike has none
        if keys is not None and "inter_sample_shift" in keys():
            self.sample_shifts = self._shifts(r.get_property("inter_sample_shift"))
        if keys is not None and "group" in keys():
            self.shank_ids = self._groups(r.get_property("group"))
        self.contact_ids = self._contacts(r)

    def _contacts(self, r: Any) -> np.ndarray | None:
        """The attached probe's contact ids in channel order (each probe's
        ``device_channel_indices``); None without a probe, or where a channel has no wired
        contact or a contact no id."""
        has_probe = getattr(r, "has_probe", None)
        if has_probe is None or not has_probe():
            return None
        ids = np.full(self.n_channels, "", dtype=object)
        for probe in r.get_probegroup().probes:
            wired = probe.device_channel_indices
            if wired is None:
                return None
            wired = np.asarray(wired)
            named = np.asarray(probe.contact_ids, dtype=str)
            ok = (wired >= 0) & (wired < self.n_channels)
            ids[wired[ok]] = named[ok]
        return None if any(v == "" for v in ids) else ids.astype(str)

    def _shifts(self, value: Any) -> np.ndarray | None:
        """SpikeInterface's ``inter_sample_shift`` property, one finite value per channel."""
        if value is None:
            return None
        v = np.asarray(value, dtype=np.float64)
        if v.shape != (self.n_channels,) or not np.all(np.isfinite(v)):
            raise RecordingError(f"inter_sample_shift: the SpikeInterface recording's property "
                                 f"must hold one finite shift per channel ({self.n_channels}), "
                                 f"got shape {v.shape}")
        return v

    def _groups(self, value: Any) -> np.ndarray | None:
        """SpikeInterface's ``group`` property as shank numbers: integers as they are; labels
        (an NWB file's electrode group names, ``"shank0"``) numbered in sorted order."""
        if value is None:
            return None
        v = np.asarray(value)
        if v.shape != (self.n_channels,) or v.dtype.kind not in "iuUSO":
            raise RecordingError(f"group: the SpikeInterface recording's property must hold "
                                 f"one group (an integer or a label) per channel "
                                 f"({self.n_channels}), got {v.dtype} of shape {v.shape}")
        if v.dtype.kind in "iu":
            return v.astype(np.int64)
        return np.unique(v.astype(str), return_inverse=True)[1].astype(np.int64)

    @classmethod
    def recognizes(cls, source: Any, options: OpenOptions) -> bool:
        """An object with SpikeInterface's recording methods (see `Recording.recognizes`)."""
        return hasattr(source, "get_traces") and hasattr(source, "get_sampling_frequency")

    @classmethod
    def from_source(cls, source: Any, options: OpenOptions) -> "SpikeInterfaceRecording":
        """Its first segment, ``fs`` and the metadata overrides applied (see
        `Recording.from_source`)."""
        what = "a SpikeInterface recording"
        options.no_dataset(what, type(source).__name__)
        return options.check(cls(source, fs=options.fs, **options.meta()), what)

    def _read(self, start: int, stop: int, idx: np.ndarray) -> np.ndarray:
        ids = self._si.get_channel_ids()[idx]
        # unscaled by default (the keyword for scaling was renamed across SpikeInterface
        # versions: not passed)
        block = self._si.get_traces(segment_index=self._segment, start_frame=start,
                                    end_frame=stop, channel_ids=ids)
        return to_channels_first(np.asarray(block))
