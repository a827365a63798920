"""Destriping: the spatial high-pass of IBL's ``kfilt`` as SpikeInterface's
``highpass_spatial_filter`` computes it, lowered to one [channels, channels] matrix applied
with `dspk.ops.spatial_filter` and an automatic gain control (AGC) whose moving window is a
FIR on `dspk.ops.fir_filter`.

Why a matrix: at each time sample the reference reorders the channels by depth, pads them by
reflection, tapers them, runs a Butterworth high-pass forward and backward along the channels
(``scipy.signal.sosfiltfilt``) and crops the padding. Every one of these is linear in the
channel vector and the same at every sample, so together they are one matrix W: its column k
is the reference's output for the k-th unit vector (the filter's impulse response, padding,
reflection and taper included). The AGC (a division by a moving average of ``|x|`` before
the filter, a multiplication by it after) is element-wise around W.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..argnames import arg
from ..finite import api, check_finite
from ._checks import positions, traces
from .fir import fir_filter
from .spatial import spatial_filter

__all__ = ["highpass_spatial_filter", "highpass_spatial_matrix", "agc_window"]

DIRECTIONS = ("x", "y")
#: the largest n_channel_pad taken (a group pads at most its own channel count anyway)
MAX_PAD = 1 << 20
OUTPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int16))


def _positions_and_groups(geometry: Any, groups: Any) -> tuple[np.ndarray, np.ndarray]:
    """[channels, 2] float64 positions, and one integer group label per channel."""
    shanks = getattr(geometry, "shank_ids", None) \
        if hasattr(geometry, "contact_positions") else None       # a probeinterface Probe
    g = positions(geometry)
    if groups is None:
        # a Probe's shanks, as SpikeInterface's set_probe makes them the channel groups
        if shanks is not None and len(shanks) == len(g) and all(str(s) != "" for s in shanks):
            groups = shanks
        else:
            return g, np.zeros(len(g), dtype=np.intp)
    lab = np.asarray(groups.get() if hasattr(groups, "get") else groups)
    if lab.shape != (len(g),):
        raise ValueError(f"groups: expected one label per channel ({len(g)}), got shape "
                         f"{lab.shape}")
    return g, np.unique(lab, return_inverse=True)[1].reshape(-1)


def _count(name: str, value: Any, upper: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an integer number of channels, got {value!r}")
    if not 0 <= value <= upper:
        raise ValueError(f"{name}: expected 0 <= {name} <= {upper} ({what}), got {value}")
    return int(value)


def _taper(length: int, n_taper: int) -> np.ndarray:
    """The reference's cosine ramps: up over the first ``n_taper`` padded channels, down over
    the last, each ``(1 − cos(π·(i − a)/(b − a)))/2`` clamped to [0, 1] outside [a, b]."""
    i = np.arange(length, dtype=np.float64)

    def ramp(a: float, b: float) -> np.ndarray:
        r = (1.0 - np.cos((i - a) / (b - a) * np.pi)) / 2.0
        r[i < a] = 0.0
        r[i > b] = 1.0
        return r

    return ramp(0.0, n_taper) * (1.0 - ramp(length - n_taper, length))


def _group_order(pos: np.ndarray, dim: int) -> np.ndarray:
    """The reference's order: as given when the positions along ``direction`` already rise,
    else by y, ties by x (``order_channels_by_depth(dimensions=("x", "y"))``)."""
    depth = pos[:, dim]
    if np.array_equal(np.sort(depth), depth):
        return np.arange(len(pos))
    return np.lexsort((pos[:, 0], pos[:, 1]))


def _matrix(geometry: Any, groups: Any, n_channel_pad: Any, n_channel_taper: Any,
            direction: Any, order: Any, wn: Any, n_channels: int | None = None) -> np.ndarray:
    """The checked arguments of `highpass_spatial_matrix`, W from the cache (``n_channels``:
    the channels of the traces it is for)."""
    g, lab = _positions_and_groups(geometry, groups)
    if n_channels is not None and len(g) != n_channels:
        raise ValueError(f"geometry: {len(g)} positions for the {n_channels} channels of x")
    if not isinstance(direction, str) or direction not in DIRECTIONS:
        raise ValueError(f"direction: expected 'x' or 'y' (the axis the filter runs along), "
                         f"got {direction!r}")
    smallest = int(np.bincount(lab).min())
    # the padding is capped at each group's channel count, as IBL's kfilt caps it
    # (``ntr_pad = min(ntr_pad, nx)``): its default of 60 then works on fewer channels (a
    # 32-channel probe), where SpikeInterface's filter asserts n_channel_pad <= channels and
    # refuses its own default; within that bound the two agree
    pad = 0 if n_channel_pad is None else _count(
        "n_channel_pad", n_channel_pad, MAX_PAD, "channels reflected at each end of a group")
    # (-1: as many as each group's padding)
    taper = -1 if n_channel_taper is None else _count(
        "n_channel_taper", n_channel_taper, smallest, "the channels of the smallest group")
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order < 1:
        raise ValueError(f"highpass_butter_order: expected a positive integer, got {order!r}")
    try:
        cut = float(wn)
    except (TypeError, ValueError):
        raise TypeError(f"highpass_butter_wn: expected a number in (0, 1), got "
                        f"{type(wn).__name__}") from None
    if not 0.0 < cut < 1.0:
        raise ValueError(f"highpass_butter_wn: expected a cut-off in (0, 1) of the spatial "
                         f"Nyquist frequency, got {wn!r}")
    return _cached_matrix(g.tobytes(), len(g), lab.astype(np.intp).tobytes(), pad, taper,
                          DIRECTIONS.index(direction), int(order), cut)


@functools.lru_cache(maxsize=16)
def _cached_matrix(key: bytes, n: int, labels: bytes, pad: int, taper: int, dim: int,
                   order: int, cut: float) -> np.ndarray:
    from scipy.signal import butter, sosfiltfilt  # noqa: PLC0415 (slow import: when used)
    g = np.frombuffer(key, dtype=np.float64).reshape(n, 2)
    lab = np.frombuffer(labels, dtype=np.intp)
    direction = DIRECTIONS[dim]
    sos = butter(order, cut, btype="highpass", output="sos")
    # scipy's sosfiltfilt extends the (padded) sequence by this much and needs it longer
    ntaps = 2 * len(sos) + 1 - min(int((sos[:, 2] == 0).sum()), int((sos[:, 5] == 0).sum()))
    edge = 3 * ntaps
    sizes = np.bincount(lab)
    w = np.zeros((n, n))
    for k in range(len(sizes)):
        idx = np.flatnonzero(lab == k)
        pos = g[idx]
        if len(idx) > 1 and np.ptp(pos[:, dim]) == 0:
            raise ValueError(f"geometry: the {len(idx)} channels of group {k} all have "
                             f"{direction} = {pos[0, dim]:g} µm: the spatial high-pass runs "
                             f"along depth and needs positions that vary in {direction} "
                             f"(pass {arg('direction')} or {arg('groups')} to match the probe)")
        m = len(idx)
        p = min(pad, m)                       # IBL's kfilt: ntr_pad = min(ntr_pad, nx)
        t = p if taper < 0 else taper
        length = m + 2 * p
        if length <= edge:
            if 3 * m <= edge:                 # even padded by all its channels
                raise ValueError(
                    f"geometry: a group of {m} channels is too small for the spatial "
                    f"high-pass: padded by its own {m} channels on each side (the most "
                    f"IBL's kfilt pads) it gives {length}, not more than the {edge} the "
                    f"forward-backward filter extends by; it needs at least "
                    f"{edge // 3 + 1} channels per group: use a common reference instead "
                    f"(Reference('median'), --reference median) or fewer "
                    f"{arg('groups')}")
            raise ValueError(f"n_channel_pad: a group of {m} channels padded by {p} on each "
                             f"side gives {length} channels, not more than the {edge} the "
                             f"forward-backward filter extends by; pass a larger "
                             f"{arg('n_channel_pad')} (or fewer {arg('groups')})")
        # the unit vectors, padded by reflection (edge channel repeated) and tapered: the
        # columns of the result are the reference's spatial filter's impulse responses
        eye = np.eye(m)
        padded = np.concatenate([eye[:p][::-1], eye, eye[m - p:][::-1]], axis=0)
        if t > 0:
            padded *= _taper(length, t)[:, None]
        block = sosfiltfilt(sos, padded, axis=0)[p:p + m]
        o = idx[_group_order(pos, dim)]
        w[np.ix_(o, o)] = block
    w.setflags(write=False)
    return w


def highpass_spatial_matrix(geometry: Any, *, n_channel_pad: int | None = 60,
                            n_channel_taper: int | None = 0, direction: str = "y",
                            highpass_butter_order: int = 3, highpass_butter_wn: float = 0.01,
                            groups: Any = None) -> np.ndarray:
    """W [channels, channels]: the spatial part of SpikeInterface's ``highpass_spatial_filter``
    (spikeinterface.preprocessing, version 0.105; IBL's ``kfilt`` in ``ibldsp.voltage``) as a
    matrix, so that ``spatial_filter(W, x)`` equals the reference's filter without AGC
    (``apply_agc=False``) on traces x, to float rounding.

    Within each group of channels (one group by default, as the reference requires; the shanks
    of a probeinterface Probe; or ``groups``), the reference orders the channels by depth
    (kept as given when their positions along ``direction`` already rise, else sorted by y
    with ties by x), pads ``n_channel_pad`` channels at each end by reflection (the edge
    channel repeated), multiplies by a cosine taper over ``n_channel_taper`` padded channels at
    each end, runs a Butterworth high-pass of ``highpass_butter_order`` and cut-off
    ``highpass_butter_wn`` (of the spatial Nyquist frequency, one cycle per two channels)
    forward and backward along the channels (``scipy.signal.sosfiltfilt``, odd extension),
    crops the padding and restores the order. Column k of W's block is that sequence applied
    to the k-th unit vector; W is block-diagonal over the groups.

    The channels of all columns of a probe are filtered as one sequence ordered by depth, as
    the reference does (it does not split columns); pass ``groups=geometry[:, 0]`` to filter
    each column alone.

    Parameters
    ----------
    geometry : array-like or probeinterface Probe
        [channels, 2] contact positions in µm (x, y), finite, in the traces' channel order.
        A Probe with shank ids groups its channels by shank.
    n_channel_pad : int or None
        Channels padded by reflection at each end of each group (default 60; None: 0). A
        group pads at most its own channel count, as IBL's ``kfilt`` caps its ``ntr_pad``
        (``min(ntr_pad, channels)``), so the default works on probes of fewer than 60
        channels; SpikeInterface's filter refuses a padding above the channel count (it
        gives the same result as this one with ``n_channel_pad`` = the channels).
    n_channel_taper : int or None
        Padded channels tapered by a cosine ramp at each end (default 0; None: as many as
        each group pads), at most the channels of the smallest group.
    direction : {"x", "y"}
        The axis along which the reference checks that the channels are already in order
        (default "y", depth); a group whose positions do not vary along it is an error.
    highpass_butter_order : int
        Order of the spatial Butterworth high-pass (default 3).
    highpass_butter_wn : float
        Its cut-off in (0, 1), a fraction of the spatial Nyquist frequency (default 0.01).
    groups : array-like, optional
        One label per channel (shank or group ids); each group is filtered alone, as
        SpikeInterface's filter on ``recording.split_by("group")``.

    Returns
    -------
    numpy.ndarray
        W [channels, channels], float64, read-only (the same array for the same arguments:
        give it ``cupy.asarray(W)`` for CuPy traces).

    Raises
    ------
    ValueError
        geometry not [channels, 2] or not finite, a group without variation along
        ``direction``, ``n_channel_pad`` or ``n_channel_taper`` out of range (or a padded
        group too short for the forward-backward filter: a group of fewer than 5 channels
        with the default filter, whatever its padding), an unknown ``direction``, a bad
        order or cut-off, ``groups`` of the wrong length.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import highpass_spatial_matrix, spatial_filter
    >>> geom = np.c_[np.zeros(64), 20.0 * np.arange(64)]          # one column, 20 µm pitch
    >>> w = highpass_spatial_matrix(geom, n_channel_pad=20)
    >>> w.shape, bool(np.abs(w.sum(axis=1)).max() < 0.05)        # a constant is removed
    ((64, 64), True)
    >>> x = np.ones((64, 3), dtype=np.float32) * 100.0              # a common-mode stripe
    >>> bool(np.abs(spatial_filter(w, x)).max() < 5.0)
    True
    """
    return _matrix(geometry, groups, n_channel_pad, n_channel_taper, direction,
                   highpass_butter_order, highpass_butter_wn)


def agc_window(fs: float, agc_window_length_s: float = 0.1) -> np.ndarray:
    """The AGC's moving window: a Hann window of ``round(agc_window_length_s·fs/2)·2 + 1``
    samples (odd) normalised to sum 1, as SpikeInterface's ``highpass_spatial_filter`` builds
    it; its half length is the halo a chunk needs.

    Parameters
    ----------
    fs : float
        Sampling rate in Hz.
    agc_window_length_s : float
        The window's length in seconds (default 0.1).

    Returns
    -------
    numpy.ndarray
        The taps, float64.

    Examples
    --------
    >>> from dspk.ops import agc_window
    >>> w = agc_window(30000.0)
    >>> len(w), len(w) // 2, float(round(w.sum(), 12))
    (3001, 1500, 1.0)
    """
    try:
        f, t = float(fs), float(agc_window_length_s)
    except (TypeError, ValueError):
        raise TypeError(f"fs, agc_window_length_s: expected numbers, got {fs!r} and "
                        f"{agc_window_length_s!r}") from None
    if not (math.isfinite(f) and f > 0):
        raise ValueError(f"fs: expected a positive sampling rate in Hz, got {fs!r}")
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"agc_window_length_s: expected a positive duration in seconds, "
                         f"got {agc_window_length_s!r}")
    # the reference's arithmetic (a division by the sampling interval), for the same rounding
    n = int(np.round(t / (1.0 / f) / 2) * 2 + 1)
    window = np.hanning(n)
    if n == 1:                                  # numpy's one-point Hann window is [1]
        return window
    return window / window.sum()


def _moving_gain(xp: Any, a: Any, taps: np.ndarray, halo: int) -> Any:
    """Σ_j taps[j]·a[:, t + c − j] (zeros outside a), as fftconvolve(mode="same") gives it."""
    n = a.shape[1]
    if len(taps) > n:                           # fir_filter wants taps no longer than the data
        a = xp.concatenate([a, xp.zeros((a.shape[0], len(taps) - n), dtype=a.dtype)], axis=1)
        return fir_filter(a, taps)[:, halo:n - halo]
    return fir_filter(a, taps, halo=halo)


@api
def highpass_spatial_filter(x: Any, geometry: Any, fs: float | None = None, *,
                            n_channel_pad: int | None = 60, n_channel_taper: int | None = 0,
                            direction: str = "y", apply_agc: bool = True,
                            agc_window_length_s: float = 0.1, highpass_butter_order: int = 3,
                            highpass_butter_wn: float = 0.01, epsilon: float = 0.003,
                            rms_values: Any = None, groups: Any = None, dtype: Any = None,
                            halo: int = 0) -> Any:
    """Destripe ``x``: SpikeInterface's ``highpass_spatial_filter`` (spikeinterface.preprocessing,
    version 0.105), the spatial Butterworth high-pass along depth with automatic gain control
    of IBL's ``kfilt`` (``ibldsp.voltage``, used by IBL's ``destripe``), on an array.

    The computation is the reference's: with AGC, the gain ``g = h ∗ |x|`` (h the Hann
    window of `agc_window`, zeros beyond x's ends, as the reference's
    ``fftconvolve(mode="same")``), ``x / max(ε, g)`` filtered in space, multiplied by g again;
    ε = ``epsilon · rms_values`` per channel. The spatial filter is
    `highpass_spatial_matrix`'s W, applied with `spatial_filter`, equal to the reference's
    padding, taper and ``sosfiltfilt`` along the depth-ordered channels of each group.

    What differs from the reference: it computes in x's precision (float64 input stays
    float64; the reference rounds every input to float32 and its AGC-normalised traces to
    float32, then filters in float64); ``rms_values`` defaults to each channel's RMS over x
    (the reference measures it on random chunks of the recording: pass the same values, or
    one set for every chunk of a stream); where ``max(ε, g)`` is 0 (ε = 0 on a silent
    stretch) the normalised trace is 0 (the reference gives 0 for a channel silent over its
    whole chunk, NaN otherwise); several groups are filtered in one call (the reference takes
    one group: ``recording.split_by("group")``).

    Agreement with SpikeInterface 0.105.3 (``NumpyRecording`` with a probe, ``get_traces``,
    the same ``rms_values``) on 4000 samples of a 384-channel NP1.0 layout, a 192-channel
    2-column layout and 4 shanks of 96 channels (each shank through ``split_by("group")``),
    integer-valued coloured noise plus a common-mode stripe larger than it, the largest
    absolute difference over the reference's largest value: without AGC 1.8e-13 in float64
    (exact on integer-valued input: the reference's float32 rounding of its input and of
    sosfiltfilt's odd extension loses nothing there) and 1.4e-6 in float32; with AGC 1.8e-6
    in float32 and 3.7e-7 in float64 (the reference rounds its AGC-normalised traces to
    float32). tests/ops/test_destripe.py checks these (with margins), other paddings, tapers,
    orders, both directions and unsorted channels.

    Parameters
    ----------
    x : array
        [channels, samples], float32 or float64 (NumPy or CuPy), finite.
    geometry : array-like or probeinterface Probe
        [channels, 2] contact positions in µm (x, y) in x's channel order (a Probe's shank
        ids group its channels).
    fs : float, optional
        Sampling rate in Hz; needed with AGC (its window is in seconds).
    n_channel_pad, n_channel_taper, direction, highpass_butter_order, highpass_butter_wn, \
groups
        The spatial filter's, as in `highpass_spatial_matrix` (defaults the reference's:
        60, 0, "y", 3, 0.01; one group).
    apply_agc : bool
        Apply the automatic gain control (default True).
    agc_window_length_s : float
        Length of the AGC's Hann window in seconds (default 0.1).
    epsilon : float
        ε per channel is ``epsilon · rms_values`` (default 0.003), the floor of the gain.
    rms_values : array-like, optional
        [channels] RMS of each channel in x's units (default: over x itself).
    dtype : numpy dtype, optional
        Output dtype: float32, float64 or int16 (rounded, as the reference writes integers);
        default x's.
    halo : int
        Samples of context on each side of x that are not returned (streaming): the output
        is ``[channels, samples − 2·halo]`` and equals the one-shot result there when halo
        is at least the AGC window's half length (``len(agc_window(fs, ...)) // 2``: 1500
        samples at 30 kHz) and ``rms_values`` is given; 0 suffices without AGC.

    Returns
    -------
    array
        [channels, samples − 2·halo], ``dtype`` (x's by default), x's array type.

    Raises
    ------
    ValueError
        NaN or infinity in x, geometry not [channels, 2] or of another number of channels,
        a group without depth variation, ``n_channel_pad``/``n_channel_taper`` out of
        range, AGC without ``fs``, a bad window, ε, ``rms_values``, ``dtype`` or ``halo``.
    TypeError
        x not a float32/float64 NumPy or CuPy array.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import highpass_spatial_filter
    >>> rng = np.random.default_rng(0)
    >>> geom = np.c_[np.tile([16.0, 48.0], 48), 20.0 * (np.arange(96) // 2)]   # 2 columns
    >>> noise = rng.normal(0, 10, (96, 3000))
    >>> stripe = 200.0 * np.sin(np.linspace(0, 20, 3000))         # on every channel
    >>> x = (noise + stripe).astype(np.float32)
    >>> y = highpass_spatial_filter(x, geom, 30000.0)
    >>> y.shape, y.dtype
    ((96, 3000), dtype('float32'))
    >>> float(np.std(x - noise)) > 100, float(np.std(y[10:-10] - noise[10:-10])) < 5
    (True, True)
    """
    xp = traces(x)
    n_ch, n = x.shape
    if isinstance(halo, bool) or not isinstance(halo, (int, np.integer)) or \
            not 0 <= halo or 2 * halo >= n:
        raise ValueError(f"halo: expected an integer with 0 <= halo < samples/2 "
                         f"({n} samples), got {halo!r}")
    halo = int(halo)
    out_dtype = x.dtype if dtype is None else np.dtype(dtype)
    if out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"dtype: expected float32, float64 or int16 (or None: x's), got "
                        f"{out_dtype}")
    w = _matrix(geometry, groups, n_channel_pad, n_channel_taper, direction,
                highpass_butter_order, highpass_butter_wn, n_channels=n_ch)
    check_finite(x, "x")               # (the spatial filter would spread it over every channel)
    inner = x[:, halo:n - halo] if halo else x
    w_x = w if xp is np else xp.asarray(w)
    if not apply_agc:
        y = spatial_filter(w_x, inner)
    else:
        if fs is None:
            raise ValueError(f"fs: the AGC's window is in seconds: pass {arg('fs')} (the "
                             f"sampling rate in Hz) or {arg('apply_agc', False)}")
        taps = agc_window(fs, agc_window_length_s)
        try:
            e = float(epsilon)
        except (TypeError, ValueError):
            raise TypeError(f"epsilon: expected a number, got {epsilon!r}") from None
        if not (math.isfinite(e) and e >= 0):
            raise ValueError(f"epsilon: expected a finite number >= 0, got {epsilon!r}")
        if rms_values is None:
            rms = xp.sqrt(xp.mean(xp.square(x, dtype=np.float64), axis=1))
        else:
            r = np.asarray(rms_values.get() if hasattr(rms_values, "get") else rms_values,
                           dtype=np.float64)
            if r.shape != (n_ch,) or not (np.isfinite(r).all() and (r >= 0).all()):
                raise ValueError(f"rms_values: expected {n_ch} finite values >= 0 (one per "
                                 f"channel), got shape {r.shape}")
            rms = xp.asarray(r)
        floor = (e * rms).astype(x.dtype)[:, None]
        gain = _moving_gain(xp, xp.abs(x), taps, halo)
        divisor = xp.maximum(floor, gain)
        if not bool((floor > 0).all()):
            # a channel without a floor: 0 where it is silent, as the reference's dead channel
            divisor = xp.where(divisor > 0, divisor, xp.asarray(np.inf, dtype=x.dtype))
        y = spatial_filter(w_x, inner / divisor)
        y *= gain
    if out_dtype.kind == "i":
        y = xp.round(y)
    return y if y.dtype == out_dtype else y.astype(out_dtype)
