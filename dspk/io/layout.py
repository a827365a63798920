"""The two storage orders of a recording ([samples, channels] as most files store them,
[channels, samples] as dspk computes), telling which one a 2-D array is, and moving blocks into
dspk's [channels, samples] layout (on the CPU without NumPy's slow strided transpose copy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..argnames import arg
from ..backend import TRANSPOSE_TILE, array_module, blocked_transpose
from .errors import RecordingError

__all__ = ["to_channels_first", "resolve_layout", "channels_first", "LAYOUTS", "TRANSPOSE_TILE"]

#: the storage orders a 2-D recording can have
LAYOUTS = ("samples_channels", "channels_samples")
#: a 1-row array up to this long is ambiguous without a layout: one sample of a probe's
#: channels (Neuropixels: 384), or one channel of a few samples (longer rows, 0.1 s of one
#: channel at 30 kHz in the examples, are one channel)
AMBIGUOUS_SINGLE = 1024


def to_channels_first(block: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """[samples, channels] -> a C-contiguous [channels, samples] copy (`blocked_transpose`;
    any 2-D array: also the way back, for writing [samples, channels] files).

    Parameters
    ----------
    block : numpy.ndarray
        A 2-D host array, any dtype and strides.
    out : numpy.ndarray, optional
        A C-contiguous array of the transposed shape and the same dtype to write into.

    Returns
    -------
    numpy.ndarray
        The transpose, C-contiguous (``out`` when given).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import to_channels_first
    >>> block = np.arange(6, dtype=np.int16).reshape(3, 2)       # 3 samples x 2 channels
    >>> y = to_channels_first(block)
    >>> y, y.flags.c_contiguous
    (array([[0, 2, 4],
           [1, 3, 5]], dtype=int16), True)
    """
    return blocked_transpose(block, out)


def resolve_layout(layout: str | None, shape: tuple, source: str) -> str:
    """The layout given, or told from the shape: channels are the shorter axis when the other
    is at least twice as long (an empty axis is the samples); otherwise the caller must say.

    Parameters
    ----------
    layout : {"samples_channels", "channels_samples"} or None
        What the caller said, if anything.
    shape : tuple of 2 ints
        The stored array's shape.
    source : str
        Named in the error.

    Returns
    -------
    str
        One of `LAYOUTS`.

    Raises
    ------
    RecordingError
        An unknown ``layout``, a shape whose axes are too close to tell apart, an empty
        axis beside more than `AMBIGUOUS_SINGLE` samples (0 channels), or one row of at
        most `AMBIGUOUS_SINGLE` (one sample of a probe, or one
        channel of a few samples?).

    Examples
    --------
    >>> from dspk.io.layout import resolve_layout
    >>> resolve_layout(None, (30000, 384), "x"), resolve_layout(None, (4, 3000), "x")
    ('samples_channels', 'channels_samples')
    >>> resolve_layout(None, (300, 200), "the array")            # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.io.errors.RecordingError: layout: cannot tell samples from channels in the array ...
    """
    if layout is not None:
        if layout not in LAYOUTS:
            raise RecordingError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        return layout
    a, b = shape
    if 0 in (a, b):
        other = max(a, b)
        if other > AMBIGUOUS_SINGLE:
            # more than a probe's channels along the other axis: those are samples, and the
            # empty axis the channels (it was reported as "0 samples")
            raise RecordingError(f"{source} of shape {shape}: 0 channels ({other} samples of "
                                 f"no channel); a recording needs at least 1 channel")
        # a probe's channels and no sample: reported as such (an empty recording)
        return "samples_channels" if a == 0 else "channels_samples"
    if min(a, b) == 1 and max(a, b) <= AMBIGUOUS_SINGLE:
        # one sample of a probe's channels, or one channel of a few ms? (an NWB dataset of
        # one sample read as one channel was misdiagnosed further on)
        raise RecordingError(f"layout: {source} of shape {shape} is 1 sample of {max(a, b)} "
                             f"channels or 1 channel of {max(a, b)} samples; pass "
                             f"{arg('layout', 'samples_channels')} or "
                             f"{arg('layout', 'channels_samples')} (a recording needs at "
                             f"least 2 samples)")
    if max(a, b) >= 2 * min(a, b):
        return "samples_channels" if a > b else "channels_samples"
    raise RecordingError(f"layout: cannot tell samples from channels in {source} of shape "
                         f"{shape}; pass {arg('layout', 'samples_channels')} or "
                         f"{arg('layout', 'channels_samples')}")


def channels_first(block: Any, idx: np.ndarray, n_channels: int, samples_first: bool) -> Any:
    """[channels, samples] of the channels ``idx`` from a block stored samples- or
    channels-first, C-contiguous (a blocked transpose on the CPU; on the GPU, CuPy's).

    Parameters
    ----------
    block : numpy.ndarray or cupy.ndarray
        [samples, n_channels] when ``samples_first``, else [n_channels, samples].
    idx : numpy.ndarray
        The channels wanted, in the order wanted.
    n_channels : int
        The block's channel count (every channel in order needs no gather).
    samples_first : bool
        The block's layout.

    Returns
    -------
    numpy.ndarray or cupy.ndarray
        [len(idx), samples], C-contiguous, of ``block``'s type.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io.layout import channels_first
    >>> block = np.arange(6, dtype=np.int16).reshape(3, 2)       # 3 samples x 2 channels
    >>> channels_first(block, np.array([1]), 2, samples_first=True)
    array([[1, 3, 5]], dtype=int16)
    """
    xp = array_module(block)
    everything = len(idx) == n_channels and bool(np.all(idx == np.arange(n_channels)))
    if samples_first:
        sub = block if everything else block[:, idx]
        if xp is np:
            return to_channels_first(np.asarray(sub))
        return xp.ascontiguousarray(sub.T)
    sub = block if everything else block[idx]
    return xp.ascontiguousarray(sub)
