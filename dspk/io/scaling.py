"""Raw samples to µV: the one conversion every reader of a recording uses, on the host and on the
GPU, so that both give the same float32 bits.

>>> import numpy as np
>>> from dspk.io import to_uv
>>> to_uv(np.array([[2, 4]], np.int16), np.array([0.5]), np.array([1.0]))
array([[2., 3.]], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import array_module

__all__ = ["to_uv"]


def to_uv(raw: Any, gain_to_uv: np.ndarray, offset_to_uv: np.ndarray) -> Any:
    """µV = raw · gain_to_uv + offset_to_uv per channel, in float32, as a new array.

    The arithmetic is fixed, so that every path gives the same bits: the samples cast to
    float32, then multiplied by the gains cast to float32 (skipped when every gain is 1), then
    the offsets cast to float32 added (skipped when every offset is 0). `Recording.read` and
    the GPU pipeline's staging both convert through here.

    Parameters
    ----------
    raw : numpy.ndarray or cupy.ndarray
        [channels, samples], any numeric dtype, any strides (a transposed view of a
        [samples, channels] block, say).
    gain_to_uv, offset_to_uv : numpy.ndarray
        One value per channel (host arrays, float64 as `Recording` holds them).

    Returns
    -------
    numpy.ndarray or cupy.ndarray
        [channels, samples] float32, C-contiguous, never sharing memory with ``raw`` (a float32
        ``raw`` is copied too); in ``raw``'s array module.

    Raises
    ------
    ValueError
        ``raw`` not 2-D, or gains or offsets not one per channel.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import to_uv
    >>> raw = np.array([[0, 32768, 65535]], dtype=np.uint16)   # one unsigned channel
    >>> to_uv(raw, np.array([0.5]), np.array([-16384.0]))      # centred: (raw - 2**15) / 2
    array([[-16384. ,      0. ,  16383.5]], dtype=float32)

    A [samples, channels] block, transposed without a copy:

    >>> block = np.arange(6, dtype=np.int16).reshape(3, 2)
    >>> y = to_uv(block.T, np.array([1.0, 2.0]), np.zeros(2))
    >>> y, y.flags.c_contiguous
    (array([[ 0.,  2.,  4.],
           [ 2.,  6., 10.]], dtype=float32), True)
    """
    if getattr(raw, "ndim", None) != 2:
        raise ValueError(f"raw: expected [channels, samples], got shape "
                         f"{getattr(raw, 'shape', None)}")
    gain = np.asarray(gain_to_uv, dtype=np.float64)
    offset = np.asarray(offset_to_uv, dtype=np.float64)
    for name, v in (("gain_to_uv", gain), ("offset_to_uv", offset)):
        if v.shape != (raw.shape[0],):
            raise ValueError(f"{name}: expected one value per channel ({raw.shape[0]}), got "
                             f"shape {v.shape}")
    xp = array_module(raw)
    out = raw.astype(np.float32, order="C", copy=True)
    if np.any(gain != 1):            # a pass over the block each, skipped when trivial
        out *= xp.asarray(gain.astype(np.float32))[:, None]
    if np.any(offset != 0):
        out += xp.asarray(offset.astype(np.float32))[:, None]
    return out


def check_gains(gain_to_uv: Any, source: str, allow_negative_gain: bool = False) -> None:
    """Refuse gains that make no physical sense: 0 (an all-zero output), not finite, or
    negative (a sign-flipped output, which spike sorters read as inverted spikes) unless
    ``allow_negative_gain`` says the wiring inverts on purpose.

    Parameters
    ----------
    gain_to_uv : array-like
        µV per unit, one value or one per channel.
    source : str
        Named in the message (the recording).
    allow_negative_gain : bool
        Accept negative gains.

    Raises
    ------
    RecordingError
        Naming ``gain_to_uv`` and the first offending channel.

    Examples
    --------
    >>> import numpy as np
    >>> check_gains(np.array([0.195, 0.195]), "rec")
    >>> check_gains(np.array([0.195, 0.0]), "rec")       # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.io.errors.RecordingError: gain_to_uv: 0 µV per unit at channel 1 of rec ...
    """
    from ..argnames import arg                     # noqa: PLC0415 (a light module)
    from .errors import RecordingError             # noqa: PLC0415

    g = np.atleast_1d(np.asarray(gain_to_uv, dtype=np.float64))
    bad = np.flatnonzero(~np.isfinite(g))
    if bad.size:
        raise RecordingError(f"gain_to_uv: not finite ({g[bad[0]]!r}) at channel "
                             f"{int(bad[0])} of {source}; pass {arg('gain_to_uv')}<µV per "
                             f"unit> (SpikeGLX: 1e6 · range / (2^bits · gain))")
    zero = np.flatnonzero(g == 0)
    if zero.size:
        raise RecordingError(f"gain_to_uv: 0 µV per unit at channel {int(zero[0])} of "
                             f"{source} ({zero.size} channel(s)): every sample would read 0 "
                             f"µV; pass the recording's scale, {arg('gain_to_uv')}<µV per "
                             f"unit> (or 1 to keep the stored units)")
    neg = np.flatnonzero(g < 0)
    if neg.size and not allow_negative_gain:
        raise RecordingError(f"gain_to_uv: negative ({g[neg[0]]:g} µV per unit) at channel "
                             f"{int(neg[0])} of {source} ({neg.size} channel(s)): the output "
                             f"would be sign-flipped (spikes upward); pass "
                             f"{arg('allow_negative_gain', True)} if the recording's wiring "
                             f"inverts on purpose, or a positive {arg('gain_to_uv')}")
