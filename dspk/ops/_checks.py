"""Argument checks shared by the ops: the [channels, samples] layout, dtypes, geometry."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..argnames import arg
from ..backend import array_module, is_cupy_array

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def traces(x: Any, name: str = "x", allow_int16: bool = False, min_samples: int = 1) -> Any:
    """Check a [channels, samples] array; returns its array module."""
    if not (isinstance(x, np.ndarray) or is_cupy_array(x)):
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got {type(x).__name__}")
    xp = array_module(x)
    if x.ndim != 2:
        hint = (f" (one channel: {name}[None, :])" if x.ndim == 1 else
                " (one channel at a time, or a batch reshaped to [channels, samples])"
                if x.ndim > 2 else "")
        raise ValueError(f"{name}: expected a 2-D [channels, samples] array, got shape "
                         f"{x.shape}{hint}")
    ok = FLOATS + ((np.dtype(np.int16),) if allow_int16 else ())
    if x.dtype not in ok:
        raise TypeError(f"{name}: unsupported dtype {x.dtype}; expected "
                        f"{', '.join(d.name for d in ok)}")
    if x.shape[0] == 0:
        raise ValueError(f"{name}: empty, no channel: shape {x.shape} (arrays are [channels, "
                         f"samples]; at least 1 channel)")
    if x.shape[1] < min_samples:
        raise ValueError(f"{name}: empty or too short: shape {x.shape} (at least 1 channel and "
                         f"{min_samples} samples)")
    return xp


def channels_first_hint(x: Any, name: str = "x") -> None:
    """A [samples, channels] array passed by mistake has more rows than columns."""
    if x.shape[0] > x.shape[1]:
        raise ValueError(f"{name}: shape {x.shape} has more channels than samples; arrays are "
                         f"[channels, samples] in dspk (did you pass [samples, channels]? use "
                         f"x.T)")


def positions(geometry: Any) -> np.ndarray:
    """[channels, 2] float64 positions in µm from an array (NumPy or CuPy) or a probeinterface
    Probe (its ``contact_positions``): 2-D, two columns, at least one channel, finite."""
    if hasattr(geometry, "contact_positions"):          # a probeinterface Probe
        geometry = geometry.contact_positions
    g = geometry.get() if hasattr(geometry, "get") else geometry
    try:
        g = np.asarray(g, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"geometry: expected [channels, 2] positions in µm, got "
                        f"{type(geometry).__name__}") from None
    if g.ndim != 2 or g.shape[1] != 2 or g.shape[0] == 0:
        raise ValueError(f"geometry: expected [channels, 2] positions in µm (x, y), got shape "
                         f"{g.shape}; pass {arg('geometry')}recording.geometry or a "
                         f"probeinterface Probe")
    bad = np.flatnonzero(~np.isfinite(g).all(axis=1))
    if bad.size:
        raise ValueError(f"geometry: the position of channel {int(bad[0])} is not finite")
    return g


def geometry(geom: Any, n_channels: int, xp: Any) -> Any:
    """[channels, 2] positions in µm (`positions`), one per channel."""
    g = positions(geom)
    if g.shape[0] != n_channels:
        raise ValueError(f"geometry: {g.shape[0]} positions for {n_channels} channels")
    return g


def finite_number(name: str, value: Any) -> float:
    """``value`` as a float, finite; the errors name the argument."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return v


def positive_number(name: str, value: Any) -> float:
    """``value`` as a float, finite and > 0; the errors name the argument."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a positive number, got {value!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}; pass "
                         f"{arg(name)}<a number > 0>")
    return v
