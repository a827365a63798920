"""Saturation blanking on [channels, samples] traces: samples at or beyond a threshold replaced
by a fill value, as SpikeInterface's ``blank_saturation`` does (an element-wise mask and fill;
Kilosort4's ``artifact_threshold`` zeroes whole batches instead)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..argnames import arg
from ..finite import api
from ._checks import traces

__all__ = ["blank_saturation"]

DIRECTIONS = ("upper", "lower", "both")


@api
def blank_saturation(x: Any, threshold: float, *, direction: str = "upper",
                     fill: float | None = None) -> Any:
    """Replace the samples of ``x`` at or beyond ``threshold`` by ``fill``: SpikeInterface's
    ``blank_saturation(recording, abs_threshold=threshold, direction=direction,
    fill_value=fill)`` (spikeinterface.preprocessing, version 0.105), on an array.

    The same comparisons as the reference, in x's units (µV if x is scaled, raw counts if
    not), both inclusive: ``"upper"`` blanks ``x >= threshold``; ``"lower"`` blanks
    ``x <= threshold`` (the threshold as given, with its sign: pass a negative one for
    negative saturation); ``"both"`` blanks ``x <= −threshold`` and ``x >= threshold``.

    What differs from the reference: the default fill is the median of all of x (the
    reference takes the median of 50 random chunks of 500 samples of the recording: on an
    array they are x itself), so a streamed recording should pass ``fill`` (or the
    threshold's fill of a first pass) to give every chunk the same value; the reference's
    ``quantile_threshold`` is not offered (pass ``threshold=numpy.quantile(x, 1 − q)``), nor
    its chunk sampling arguments (``num_chunks_per_segment``, ``chunk_size``, ``seed``).

    Parameters
    ----------
    x : array
        [channels, samples], float32, float64 or int16 (NumPy or CuPy). A NaN is never
        blanked (it compares false); with ``fill=None`` it is an error (no median).
    threshold : float
        The saturation level in x's units (finite).
    direction : {"upper", "lower", "both"}
        Which side saturates (default "upper", as the reference).
    fill : float, optional
        The value written in place of saturated samples (default: the median of x). For
        int16 x it is converted as NumPy assigns a float to an int16 array (truncated toward
        zero), as the reference writes it into int16 traces.

    Returns
    -------
    array
        A new array of x's shape, dtype and array type (x is not modified).

    Raises
    ------
    ValueError
        A threshold or fill that is not finite (or a fill int16 cannot hold), an unknown
        direction, NaN in x with ``fill=None``.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import blank_saturation
    >>> x = np.array([[-600.0, 10.0, 500.0], [20.0, 700.0, -30.0]], dtype=np.float32)
    >>> blank_saturation(x, 500.0, fill=0.0)                  # upper, inclusive
    array([[-600.,   10.,    0.],
           [  20.,    0.,  -30.]], dtype=float32)
    >>> blank_saturation(x, 500.0, direction="both", fill=0.0)
    array([[  0.,  10.,   0.],
           [ 20.,   0., -30.]], dtype=float32)
    >>> blank_saturation(x, -500.0, direction="lower")       # fill: the median of x (15)
    array([[ 15.,  10., 500.],
           [ 20., 700., -30.]], dtype=float32)
    """
    xp = traces(x, allow_int16=True)
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected 'upper', 'lower' or 'both', got {direction!r}")
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise TypeError(f"threshold: expected a number in x's units, got "
                        f"{type(threshold).__name__}") from None
    if not math.isfinite(t):
        raise ValueError(f"threshold: expected a finite number in x's units, got {threshold!r}")
    if fill is None:
        if x.dtype.kind == "f" and bool(xp.isnan(x).any()):
            raise ValueError(f"x: contains NaN, so it has no median to fill with; pass "
                             f"{arg('fill')} (the value for saturated samples)")
        fill = float(xp.median(x))
    try:
        f = float(fill)
    except (TypeError, ValueError):
        raise TypeError(f"fill: expected a number, got {type(fill).__name__}") from None
    if not math.isfinite(f):
        raise ValueError(f"fill: expected a finite number, got {fill!r}")
    if x.dtype.kind == "i":
        info = np.iinfo(x.dtype)
        if not info.min <= math.trunc(f) <= info.max:
            raise ValueError(f"fill: {f!r} does not fit x's {x.dtype} samples")
    value = np.asarray(f).astype(x.dtype)[()]   # float -> int16 truncates, as an assignment
    # compared with a Python float, as the reference compares with its float threshold
    if direction == "upper":
        mask = x >= t
    elif direction == "lower":
        mask = x <= t
    else:
        mask = (x <= -t) | (x >= t)
    out = x.copy()
    out[mask] = value
    return out
