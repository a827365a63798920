"""Per-channel fractional delays on [channels, samples] traces: the ADC phase shift of
Neuropixels probes (SpikeInterface's ``phase_shift``, IBL's ``fshift``, CatGT's ``-tshift``),
lowered to windowed-sinc FIR filters on the FIR engine (`dspk.ops.fir_filter`), one filter per
group of channels that share a shift.

Why a FIR and not the FFT of the references: the channels of a Neuropixels probe share a few
shifts (NP1.0: 12 values k/13 for 32 ADCs x 12 channels; NP2.0: 16 values k/16 for 24 ADCs x
16 channels), a 63-tap filter reaches 31-32 samples where SpikeInterface asks for 40 ms (1200
samples at 30 kHz) of margin on each side of every chunk, and the filters run on the tuned
engine on both backends. On the GPU the groups go through one launch of the direct FIR
kernel with a filter per channel (``fir_rows``): a call per group of 32 channels, each a
gather, a pad, a filter and a scatter, took 9.2 ms per 384 x 33 000 block on an H100, most of
it launches (benchmarks/profiles/profile_run.py).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..argnames import arg
from ..finite import api, check_finite
from ._checks import traces
from ._traces_gpu import fir_reason, fir_rows
from .fir import fir_filter
from .kaiser import kaiser_beta

__all__ = ["fractional_delay_taps", "phase_shift", "DEFAULT_DELAY_TAPS", "DELAY_PASSBAND"]

#: taps of the default fractional-delay filter (odd)
DEFAULT_DELAY_TAPS = 63
#: the band, as a fraction of the Nyquist frequency, that the Kaiser window is designed for:
#: its transition band is centred on Nyquist (where a fractional delay's response cannot be
#: met by any real filter) and reaches down to here (12 kHz at 30 kHz)
DELAY_PASSBAND = 0.8
EDGES = ("zeros", "reflect")


def _window_beta(taps: int) -> float:
    """Kaiser's formula solved for the attenuation a ``taps``-long window reaches with a
    transition band from DELAY_PASSBAND·π to (2 − DELAY_PASSBAND)·π (rad/sample)."""
    width = 2.0 * math.pi * (1.0 - DELAY_PASSBAND)
    return kaiser_beta(2.285 * (taps - 1) * width + 7.95)


def _check_taps(taps: Any) -> int:
    if isinstance(taps, bool) or not isinstance(taps, (int, np.integer)) or taps < 3 or \
            taps % 2 == 0:
        raise ValueError(f"taps: expected an odd number of taps >= 3, got {taps!r}; pass "
                         f"{arg('taps')}{DEFAULT_DELAY_TAPS} (the default) or another odd count")
    return int(taps)


def fractional_delay_taps(shift: float, taps: int = DEFAULT_DELAY_TAPS) -> np.ndarray:
    """FIR taps that delay a band-limited signal by ``shift`` samples: a Kaiser-windowed sinc,
    ``h[k] = sinc(k − shift)·w(k − shift)``, for `fir_filter` (centred: odd length, the
    middle tap at lag 0).

    The shift is split into its nearest integer ``n`` and a fraction ``f = shift − n`` in
    [−0.5, 0.5]; the ``taps`` non-zero taps sit at lags ``n − taps//2 .. n + taps//2``, centred
    on the fraction (the window is centred on ``f``, so every fraction is delayed as
    accurately), and the array is zero-padded to be centred on lag 0: its length is
    ``taps + 2·|n|``. The taps sum to 1 (DC passes exactly); a whole shift gives a single 1.

    Design error, ``max |H(ω) − exp(−iω·shift)|`` for ω up to 0.8 of Nyquist (12 kHz at
    30 kHz), over the NP1.0 and NP2.0 fractions k/13 and k/16 (measured on a grid of 2000
    frequencies): 33 taps 3.3e-5, 49 taps 1.8e-7, 63 taps (the default) 2.1e-9, 81 taps
    5.7e-12; it is below these values at lower frequencies and grows toward Nyquist (63 taps:
    2.4e-4 at 0.85, 2.1e-2 at 0.9 of Nyquist), where no FIR can follow a fractional delay.

    Parameters
    ----------
    shift : float
        The delay in samples (finite; positive: the output is late, ``y[t] = x(t − shift)``).
    taps : int
        Odd number of non-zero taps, >= 3 (default `DEFAULT_DELAY_TAPS`, 63). The window's
        shape parameter follows from it by Kaiser's formula, for a transition band from
        0.8 of Nyquist (`DELAY_PASSBAND`) through Nyquist.

    Returns
    -------
    numpy.ndarray
        float64 taps, odd length ``taps + 2·|round(shift)|``.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import fir_filter, fractional_delay_taps
    >>> h = fractional_delay_taps(0.25)
    >>> len(h), round(float(h.sum()), 12)
    (63, 1.0)
    >>> fractional_delay_taps(2.0, taps=5)          # a whole shift: a single 1, at lag 2
    array([0., 0., 0., 0., 0., 0., 1., 0., 0.])
    >>> t = np.arange(3000.0)
    >>> x = np.sin(2 * np.pi * 3000.0 / 30000.0 * t)[None]     # 3 kHz at 30 kHz
    >>> y = fir_filter(x, h)
    >>> want = np.sin(2 * np.pi * 3000.0 / 30000.0 * (t - 0.25))
    >>> bool(np.abs(y[0, 100:-100] - want[100:-100]).max() < 1e-8)
    True
    """
    taps = _check_taps(taps)
    s = float(shift)
    if not math.isfinite(s):
        raise ValueError(f"shift: expected a finite delay in samples, got {shift!r}")
    n = int(round(s))
    f = s - n                                   # in [-0.5, 0.5]
    c = taps // 2
    reach = c + abs(n)
    out = np.zeros(2 * reach + 1)
    if f == 0.0:
        out[reach + n] = 1.0                    # exactly: sinc(k) is 1e-17, not 0, off lag 0
        return out
    u = np.arange(-c, c + 1, dtype=np.float64) - f
    beta = _window_beta(taps)
    # the window on the continuous lag u = k − f, half-width c + 1/2 (every |u| <= c + 1/2)
    w = np.i0(beta * np.sqrt(np.maximum(1.0 - (u / (c + 0.5)) ** 2, 0.0))) / np.i0(beta)
    h = np.sinc(u) * w
    out[reach + n - c: reach + n + c + 1] = h / h.sum()
    return out


@functools.lru_cache(maxsize=256)
def _cached_taps(shift: float, taps: int) -> np.ndarray:
    """`fractional_delay_taps`, kept read-only for the next chunk (a job asks for the same
    dozen filters every chunk: their Kaiser windows were 8 % of a GPU pipeline's fit)."""
    h = fractional_delay_taps(shift, taps)
    h.flags.writeable = False
    return h


def _check_shifts(shifts: Any, n_channels: int) -> np.ndarray:
    s = shifts.get() if hasattr(shifts, "get") else shifts
    try:
        s = np.asarray(s, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"shifts: expected one number per channel (in samples), got "
                        f"{type(shifts).__name__}") from None
    if s.ndim == 0:
        s = np.full(n_channels, float(s))
    if s.shape != (n_channels,):
        raise ValueError(f"shifts: expected one shift per channel ({n_channels}), got shape "
                         f"{s.shape}; pass {arg('shifts')} in the channel order of x (for a "
                         f"recording: recording.sample_shifts)")
    bad = np.flatnonzero(~np.isfinite(s))
    if bad.size:
        raise ValueError(f"shifts: not finite at channel {int(bad[0])} ({s[bad[0]]!r}); "
                         f"expected shifts in samples")
    return s


def _pad(xp: Any, x: Any, width: int, edges: str) -> Any:
    """x [channels, samples] with ``width`` samples on each side: zeros or x's reflection
    (numpy.pad's "reflect": the edge sample is not repeated)."""
    if edges == "reflect":
        return xp.pad(x, ((0, 0), (width, width)), mode="reflect")
    out = xp.zeros((x.shape[0], x.shape[1] + 2 * width), dtype=x.dtype)
    out[:, width:width + x.shape[1]] = x
    return out


@api
def phase_shift(x: Any, shifts: Any, *, taps: int = DEFAULT_DELAY_TAPS, edges: str = "zeros",
                halo: int = 0) -> Any:
    """Delay every channel of ``x`` by its own fraction of a sample: the correction of
    Neuropixels' ADC sample shifts, as SpikeInterface's ``phase_shift(recording,
    inter_sample_shift=shifts)`` (spikeinterface.preprocessing, version 0.105) computes it
    in the frequency domain, here with a windowed-sinc FIR per group of channels that share
    a shift (`fractional_delay_taps`), on `fir_filter`.

    The sign is SpikeInterface's (and IBL's ``fshift``): ``y[c, t] = x_c(t − shifts[c])``, the
    band-limited signal of channel c delayed by ``shifts[c]`` samples; a recording's
    ``sample_shifts`` (how late each channel's ADC sampled it, as a fraction of a sample) is
    what SpikeInterface passes.

    Agreement with SpikeInterface 0.105.3's ``phase_shift`` (63 taps) on 300-6000 Hz
    band-limited noise (white noise through a 5th-order Butterworth band-pass, forward and
    backward), 26 channels with the shifts k/13 and k/16, 60 000 samples at 30 kHz: the
    largest absolute difference over the signal's RMS is 3.6e-9 in float64 and 1.1e-6 in
    float32 on every sample when the data are tapered to zero at both ends (Tukey window,
    3000 samples); on untapered data 1.0e-4 at 3000 samples from the ends and 1.8e-5 at
    15 000, a difference that is the reference's: its FFT rings from the step at the ends
    (decaying as 1/distance), where the FIR reaches 31 samples. 33 taps: 4.9e-5 (tapered);
    49 taps: 4.0e-7. On a SpikeGLX NP1.0 file (int16 counts, RMS 3000) read by both: 5.9e-5,
    the rounding's white noise near Nyquist. A sine of 1-5 kHz delayed by k/13 or k/16
    agrees with the analytically delayed sine to 9.7e-10 beyond 100 samples from the ends.
    tests/ops/test_delay.py checks these (with margins).

    Parameters
    ----------
    x : array
        [channels, samples], float32 or float64 (NumPy or CuPy; the filters run in x's
        precision). Finite: a NaN or infinity is an error (it would spread over
        ``taps`` samples; over SpikeInterface's whole chunk). Integer traces: convert them
        first (``x.astype(np.float32)``, scaled to µV or not: the delay is linear).
    shifts : array-like
        [channels] delays in samples, finite, in x's channel order (a single number applies
        to every channel). Channels with the same value are filtered together; a whole
        number of samples is an exact move, a zero shift an exact copy.
    taps : int
        Odd number of non-zero taps per filter (default 63; the design error of each count
        is in `fractional_delay_taps`).
    edges : {"zeros", "reflect"}
        The signal outside x: zeros (default: as SpikeInterface at the ends of a recording,
        where it pads zeros before its FFT), or x reflected about its first and last samples
        (numpy.pad's "reflect"; less ringing from the step at the ends). Only the first and
        last ``taps//2 + |round(shift)|`` output samples depend on it.
    halo : int
        Samples of context on each side of x that are not returned (streaming, as in
        `fir_filter`): the output is ``[channels, samples − 2·halo]`` and equals the one-shot
        result there (to rounding) when ``halo`` is at least the filters' reach,
        ``taps//2 + max|round(shifts)|`` (32 for the default taps and shifts in [0, 1)).

    Returns
    -------
    array
        [channels, samples − 2·halo], x's dtype and array type, channels in x's order.

    Raises
    ------
    ValueError
        ``shifts`` of the wrong length or not finite, x not finite, a bad ``taps``,
        ``edges`` or ``halo``.
    TypeError
        x not a float32/float64 NumPy or CuPy array.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import phase_shift
    >>> t = np.arange(2000.0)
    >>> x = np.vstack([np.sin(2 * np.pi * 0.1 * t)] * 3)         # 3 kHz at 30 kHz
    >>> y = phase_shift(x, [0.0, 0.5, 1.0])
    >>> bool((y[0] == x[0]).all()), bool((y[2, 1:] == x[2, :-1]).all())   # exact copies
    (True, True)
    >>> want = np.sin(2 * np.pi * 0.1 * (t - 0.5))                 # half a sample late
    >>> bool(np.abs(y[1, 50:-50] - want[50:-50]).max() < 1e-8)
    True

    In chunks with a halo of the filters' reach (31 + 1 samples), as one call:

    >>> parts = [phase_shift(x[:, max(s - 32, 0):s + 532], [0.0, 0.5, 1.0], halo=32)
    ...          for s in (32, 532, 1032)]
    >>> bool(np.allclose(np.hstack(parts), y[:, 32:1532], rtol=0, atol=1e-12))
    True
    """
    xp = traces(x)
    taps = _check_taps(taps)
    if edges not in EDGES:
        raise ValueError(f"edges: expected 'zeros' or 'reflect', got {edges!r}")
    s = _check_shifts(shifts, x.shape[0])
    n = x.shape[1]
    if isinstance(halo, bool) or not isinstance(halo, (int, np.integer)) or \
            not 0 <= halo or 2 * halo >= n:
        raise ValueError(f"halo: expected an integer with 0 <= halo < samples/2 "
                         f"({n} samples), got {halo!r}")
    halo = int(halo)
    check_finite(x, "x")               # (the delay would spread a NaN over its neighbours)
    values, group = np.unique(s, return_inverse=True)
    if xp is not np and len(values) > 1 and edges == "zeros":
        y = _per_channel_gpu(x, values, group, taps, halo)
        if y is not None:
            return y
    out = None if len(values) == 1 else xp.empty((x.shape[0], n - 2 * halo), dtype=x.dtype)
    for i, value in enumerate(values):
        h = _cached_taps(float(value), taps)
        reach = len(h) // 2
        rows = np.flatnonzero(group == i)
        block = x if out is None else x[xp.asarray(rows)]
        padded = _pad(xp, block, reach, edges)
        shift = int(round(value))
        if value == shift:                      # a whole number of samples: moved, exactly
            y = padded[:, reach - shift + halo: reach - shift + n - halo]
        else:
            y = fir_filter(padded, h, halo=reach + halo)
        if out is None:
            return xp.ascontiguousarray(y)
        out[xp.asarray(rows)] = y
    return out


def _per_channel_gpu(x: Any, values: np.ndarray, group: np.ndarray, taps: int,
                     halo: int) -> Any:
    """`phase_shift` of CuPy traces with zeros outside: every channel through its group's
    filter in one kernel launch (`fir_rows`), the filters centred in one bank (zeros around
    the shorter ones: the same products plus exact zeros); None when the kernel cannot take
    them (the per-group path runs)."""
    hs = [_cached_taps(float(v), taps) for v in values]
    length = max(len(h) for h in hs)
    centre = length // 2
    bank = np.zeros((len(hs), length))
    for i, h in enumerate(hs):
        r = len(h) // 2
        bank[i, centre - r:centre + r + 1] = h[::-1]    # correlation taps of the convolution
    if fir_reason(x, 1, length) is not None:
        return None
    y = fir_rows(x, bank, group.astype(np.int32), centre)
    return y[:, halo:x.shape[1] - halo].copy() if halo else y
