"""A Butterworth filter run forward and backward (``scipy.signal.sosfiltfilt``) as symmetric
FIR taps: its zero-phase impulse response (the causal response convolved with its time
reverse), truncated where every remaining tap is below a tolerance of the largest. What the
International Brain Laboratory's LFP destripe filters with (``ibldsp.voltage.destripe_lfp``:
order 3, band-pass 0.5–300 Hz), in a form that streams exactly: `dspk.fir_filter` with these
taps, on chunks with half the taps of context each side, gives the one-shot result.

The taps differ from ``sosfiltfilt`` on a finite array only near its ends (``sosfiltfilt``
extends the array by odd reflection; the FIR sees zeros outside the recording) and by the
truncated tail (at the default 1e-7: its absolute sum is 5e-5 of the DC gain for IBL's
LFP band at 2.5 kHz).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..caches import shared
from ..finite import api, check_finite
from ._checks import traces
from .fir import _correlate_same

__all__ = ["butter_zero_phase_taps", "butter_zero_phase"]

#: the default truncation, relative to the largest tap
ZERO_PHASE_TOLERANCE = 1e-7


def butter_zero_phase_taps(fs: float, low_hz: float | None, high_hz: float | None,
                           order: int = 3, tolerance: float = ZERO_PHASE_TOLERANCE
                           ) -> np.ndarray:
    """The taps of ``sosfiltfilt(butter(order, band, fs=fs, output="sos"), x)``: a band-pass
    (``low_hz`` and ``high_hz``), a high-pass (``high_hz`` None) or a low-pass (``low_hz``
    None), as symmetric FIR taps.

    Parameters
    ----------
    fs : float
        Sampling rate in Hz.
    low_hz, high_hz : float or None
        The band's edges in Hz (each Butterworth filter's −3 dB point; run twice: gain 0.5
        there); ``0 < low_hz < high_hz < fs/2``.
    order : int
        The Butterworth filter's order (IBL's LFP destripe: 3).
    tolerance : float
        Truncation, relative to the largest tap (0 < tolerance < 1).

    Returns
    -------
    numpy.ndarray
        float64 taps, odd length, symmetric (read-only; designed once per arguments in the
        process).

    Raises
    ------
    ValueError
        A band outside (0, fs/2), an order < 1, a tolerance outside (0, 1).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops.butter import butter_zero_phase_taps
    >>> taps = butter_zero_phase_taps(2500.0, 0.5, 300.0)      # IBL's LFP band
    >>> len(taps), bool(np.array_equal(taps, taps[::-1]))
    (31019, True)
    >>> bool(abs(taps.sum()) < 2e-5)             # a band-pass: no DC (but the cut tail)
    True
    """
    for name, v in (("fs", fs), ("low_hz", low_hz), ("high_hz", high_hz)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, np.number))
                              or not np.isfinite(v) or v <= 0):
            raise ValueError(f"{name}: expected a positive frequency in Hz, got {v!r}")
    if low_hz is None and high_hz is None:
        raise ValueError("low_hz, high_hz: give at least one band edge")
    nyq = fs / 2.0
    for name, v in (("low_hz", low_hz), ("high_hz", high_hz)):
        if v is not None and v >= nyq:
            raise ValueError(f"{name}: {v:g} Hz is not below the Nyquist frequency "
                             f"({nyq:g} Hz at fs={fs:g})")
    if low_hz is not None and high_hz is not None and not low_hz < high_hz:
        raise ValueError(f"low_hz, high_hz: expected low_hz < high_hz, got {low_hz:g}, "
                         f"{high_hz:g}")
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order < 1:
        raise ValueError(f"order: expected an integer >= 1, got {order!r}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance: expected 0 < tolerance < 1, got {tolerance!r}")
    key = (float(fs), low_hz, high_hz, int(order), float(tolerance))
    store = shared("butter_zero_phase_taps", dict)
    taps = store.get(key)
    if taps is None:
        taps = _design(*key)
        taps.flags.writeable = False
        store[key] = taps
    return taps


def _design(fs: float, low: Any, high: Any, order: int, tolerance: float) -> np.ndarray:
    from scipy.signal import butter, sosfilt  # noqa: PLC0415 (slow import: when used)

    if low is not None and high is not None:
        sos = butter(order, [low, high], btype="bandpass", fs=fs, output="sos")
    elif low is not None:
        sos = butter(order, low, btype="highpass", fs=fs, output="sos")
    else:
        sos = butter(order, high, btype="lowpass", fs=fs, output="sos")
    slowest = min(v for v in (low, high) if v is not None)
    n = int(40 * fs / slowest) | 1                 # the causal response, long decayed
    imp = np.zeros(n)
    imp[0] = 1.0
    h = sosfilt(sos, imp)
    from scipy.signal import fftconvolve  # noqa: PLC0415

    full = fftconvolve(h, h[::-1])               # forward-backward: h * reverse(h)
    mid = len(full) // 2
    a = np.abs(full)
    keep = np.flatnonzero(a >= tolerance * a.max())
    half = max(mid - keep.min(), keep.max() - mid)
    taps = full[mid - half:mid + half + 1]
    return 0.5 * (taps + taps[::-1])             # exactly symmetric (fftconvolve's rounding)


@api
def butter_zero_phase(x: Any, fs: float, low_hz: float | None, high_hz: float | None,
                      order: int = 3, *, halo: int = 0,
                      tolerance: float = ZERO_PHASE_TOLERANCE) -> Any:
    """``scipy.signal.sosfiltfilt(butter(order, band, fs=fs, output="sos"), x)`` as a
    zero-phase FIR (`butter_zero_phase_taps`) applied by overlap-add FFTs
    (``scipy.signal.oaconvolve``, cupyx's on the GPU): zeros outside x instead of
    ``sosfiltfilt``'s odd extension, so that blocks with ``halo`` = half the taps of context
    give the one-shot result.

    Parameters
    ----------
    x : array
        [channels, samples], float32 or float64 (NumPy or CuPy).
    fs : float
        Sampling rate in Hz.
    low_hz, high_hz : float or None
        The band (see `butter_zero_phase_taps`).
    order : int
        The Butterworth filter's order.
    halo : int
        Samples of context on each side of x that are not returned.
    tolerance : float
        The taps' truncation, relative to the largest.

    Returns
    -------
    array
        [channels, samples − 2·halo], x's dtype and array type.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.signal import butter, sosfiltfilt
    >>> from dspk.ops.butter import butter_zero_phase
    >>> x = np.random.default_rng(0).standard_normal((2, 60000))
    >>> sos = butter(3, [0.5, 300.0], btype="bandpass", fs=2500.0, output="sos")
    >>> ref = sosfiltfilt(sos, x)                # IBL's LFP band-pass
    >>> y = butter_zero_phase(x, 2500.0, 0.5, 300.0)
    >>> bool(np.abs(y - ref)[:, 20000:-20000].max() < 1e-4 * np.abs(ref).max())  # away from
    True
    """
    xp = traces(x)
    check_finite(x, "x")
    taps = butter_zero_phase_taps(fs, low_hz, high_hz, order, tolerance)
    n = x.shape[1]
    if isinstance(halo, bool) or not isinstance(halo, (int, np.integer)) or \
            not 0 <= halo or 2 * halo >= n:
        raise ValueError(f"halo: expected an integer with 0 <= halo < samples/2 ({n} "
                         f"samples), got {halo!r}")
    y = _correlate_same(xp, x, xp.asarray(taps.astype(x.dtype)))   # symmetric taps
    return y[:, halo:n - halo] if halo else y
