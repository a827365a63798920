"""A time range and a subset of channels of a recording, read through it (nothing copied):
what ``dspk preprocess --time START END --channels IDS`` runs on."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ..argnames import arg
from .errors import RecordingError
from .recording import Recording, RecordingSpec

__all__ = ["SubsetRecording", "parse_channels"]


class SubsetRecording(Recording):
    """Samples ``start:stop`` of channels ``channels`` of ``parent``: a `Recording` whose
    reads go to the parent's (its gains, offsets, geometry, sample shifts and shanks are the
    parent's rows of those channels, in the order given).

    Parameters
    ----------
    parent : Recording or RecordingSpec
        The recording (a spec is opened, and then closed with this one).
    start, stop : int
        The sample range, ``0 <= start < stop <= parent.n_samples`` (stop None: to the end),
        at least 2 samples.
    channels : sequence of int, optional
        Channel indices of the parent (0-based, distinct), in the order wanted; None: all.
    own : bool
        Close the parent when this one is closed (a parent given as a spec always is).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import open_recording
    >>> from dspk.io.subset import SubsetRecording
    >>> rec = open_recording(np.arange(40, dtype=np.int16).reshape(10, 4), fs=1000.0,
    ...                      layout="samples_channels")
    >>> sub = SubsetRecording(rec, 2, 6, channels=[3, 1])
    >>> sub.n_channels, sub.n_samples, sub.read(0, 2, scaled=False).tolist()
    (2, 4, [[11, 15], [9, 13]])
    """

    def __init__(self, parent: Any, start: int = 0, stop: int | None = None,
                 channels: Any = None, own: bool = False) -> None:
        if isinstance(parent, RecordingSpec):
            parent, own = parent.open(), True
        n = parent.n_samples
        stop = n if stop is None else int(stop)
        start = int(start)
        if not 0 <= start < stop <= n or stop - start < 2:
            raise RecordingError(f"{arg('time')}: the range covers samples {start}:{stop}, "
                                 f"outside the recording's 0:{n} (or under 2 samples)")
        idx = np.arange(parent.n_channels) if channels is None else \
            np.asarray(channels, dtype=np.int64).reshape(-1)
        if idx.size == 0 or idx.min() < 0 or idx.max() >= parent.n_channels:
            raise RecordingError(f"{arg('channels')}: expected channel indices in "
                                 f"0..{parent.n_channels - 1}, got {channels!r}")
        if len(np.unique(idx)) != idx.size:
            raise RecordingError(f"{arg('channels')}: a channel is named twice in {channels!r}")
        where = f"samples {start}:{stop}" + ("" if channels is None else
                                              f", {idx.size} of {parent.n_channels} channels")
        super().__init__(fs=parent.fs, n_channels=int(idx.size), n_samples=stop - start,
                         dtype=parent.dtype, gain_to_uv=parent.gain_to_uv[idx],
                         offset_to_uv=parent.offset_to_uv[idx],
                         geometry=None if parent.geometry is None else parent.geometry[idx],
                         source=f"{parent.source} [{where}]")
        self.parent, self.start, self.channel_indices, self._own = parent, start, idx, own
        shifts, shanks = parent.sample_shifts, parent.shank_ids
        self.sample_shifts = None if shifts is None else np.asarray(shifts)[idx]
        self.shank_ids = None if shanks is None else np.asarray(shanks)[idx]
        # the parent's ids of these channels, or their indices in it where it names none
        self.channel_ids = idx.copy() if parent.channel_ids is None else \
            np.asarray(parent.channel_ids)[idx]
        self.contact_ids = None if parent.contact_ids is None else \
            np.asarray(parent.contact_ids)[idx]
        self.samples_first = parent.samples_first
        self.compressed = parent.compressed
        self._all = idx.size == parent.n_channels and bool((idx == np.arange(idx.size)).all())

    def _read(self, start: int, stop: int, idx: np.ndarray) -> Any:
        return self.parent._read(start + self.start, stop + self.start,
                                 self.channel_indices[idx])

    def _read_native(self, start: int, stop: int, out: np.ndarray | None) -> Any:
        if self._all:                     # every channel in order: the parent's own read
            return self.parent._read_native(start + self.start, stop + self.start, out)
        return super()._read_native(start, stop, out)

    @property
    def n_sync_words(self) -> int:
        """The parent's sync words (a part of a recording keeps all of them)."""
        return int(getattr(self.parent, "n_sync_words", 0))

    def read_sync(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The parent's sync words of this part's samples ``start:stop`` (see
        `dspk.io.SpikeGLXRecording.read_sync`).

        Parameters
        ----------
        start, stop : int
            In this part's samples.

        Examples
        --------
        >>> part = SubsetRecording(rec, start=30000, stop=60000)        # doctest: +SKIP
        >>> part.read_sync(0, 3).shape                                  # doctest: +SKIP
        (1, 3)
        """
        stop = self.n_samples if stop is None else int(stop)
        if not 0 <= int(start) <= stop <= self.n_samples:
            raise RecordingError(f"read_sync: expected 0 <= start <= stop <= {self.n_samples}, "
                                 f"got start={start}, stop={stop}")
        if self.n_sync_words == 0:
            raise RecordingError(f"{self.source}: no sync channel")
        return self.parent.read_sync(int(start) + self.start, stop + self.start)

    def files(self) -> tuple[Path, ...]:
        """The parent's files (an output must not be one of them either)."""
        return self.parent.files()

    def spec(self) -> RecordingSpec:
        """The parent's spec with this range and these channels (a worker opens both)."""
        return RecordingSpec(cls=SubsetRecording, kwargs=dict(
            parent=self.parent.spec(), start=self.start, stop=self.start + self.n_samples,
            channels=self.channel_indices))

    def close(self) -> None:
        """Closes the parent too when this recording owns it."""
        if self._own:
            self.parent.close()
        super().close()


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_channels(text: str) -> np.ndarray:
    """Channel indices from ``"0-95,100,120-127"`` (0-based, ranges inclusive), in the order
    written.

    Raises
    ------
    RecordingError
        A part that is not an index or a range ``A-B`` with A <= B (the message names
        ``--channels``).

    Examples
    --------
    >>> from dspk.io.subset import parse_channels
    >>> parse_channels("4-6,0").tolist()
    [4, 5, 6, 0]
    """
    out: list[int] = []
    for part in str(text).split(","):
        m = _RANGE.match(part)
        if m is None or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise RecordingError(f"{arg('channels')}: expected indices and ranges such as "
                                 f"0-95,100 (0-based, inclusive), got {text!r}")
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else int(m.group(2))
        out.extend(range(lo, hi + 1))
    return np.asarray(out, dtype=np.int64)
