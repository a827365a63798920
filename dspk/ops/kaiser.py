"""Kaiser-window FIR design: `scipy.signal.kaiserord` and `scipy.signal.firwin` with a Kaiser
window and ``pass_zero=False`` (high-pass and band-pass), written out.

Why by hand: importing scipy.signal costs 0.6-0.7 s per process on 2 cores (measured with
``python -X importtime``, 2026-12-06; scipy.stats is a third of it), paid by every job and
command-line call that designs its high-pass, where the design itself is a few NumPy lines.
scipy.special (for the Bessel function I0, 0.13-0.2 s) is all it needs. The taps are the same
bits as SciPy's (tests/ops/test_fir.py compares them over sampling rates, cutoffs and ripples).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def kaiser_order(ripple_db: float, width: float) -> tuple[int, float]:
    """(taps, beta) of a Kaiser-window design: `scipy.signal.kaiserord`.

    Parameters
    ----------
    ripple_db : float
        Attenuation outside the transition band in dB (>= 8).
    width : float
        Transition width as a fraction of Nyquist.
    """
    a = abs(ripple_db)
    if a < 8:
        raise ValueError(f"ripple_db: expected at least 8 dB for the Kaiser formula, got {a}")
    return int(math.ceil((a - 7.95) / 2.285 / (np.pi * width) + 1)), kaiser_beta(a)


def kaiser_beta(ripple_db: float) -> float:
    """The Kaiser window's shape parameter for an attenuation of ``ripple_db`` dB:
    `scipy.signal.kaiser_beta`.

    Parameters
    ----------
    ripple_db : float
        Attenuation in dB (its absolute value is used).

    Examples
    --------
    >>> from scipy.signal import kaiser_beta as scipy_beta
    >>> [kaiser_beta(a) == scipy_beta(a) for a in (15.0, 33.0, 80.0)]
    [True, True, True]
    """
    a = abs(ripple_db)
    if a > 50:
        return 0.1102 * (a - 8.7)
    if a > 21:
        return 0.5842 * (a - 21) ** 0.4 + 0.07886 * (a - 21)
    return 0.0


def kaiser_firwin(numtaps: int, cutoff_hz: float | Sequence[float], fs: float,
                  beta: float) -> np.ndarray:
    """Windowed-sinc taps whose first band stops: `scipy.signal.firwin` (numtaps, cutoff,
    window=("kaiser", beta), pass_zero=False, fs=fs), scaled to unit gain at Nyquist (one
    cutoff: a high-pass) or at the centre of the first pass band (two: a band-pass).

    Parameters
    ----------
    numtaps : int
        Odd number of taps.
    cutoff_hz : float or sequence of float
        Increasing band edges in Hz, within (0, fs/2).
    fs : float
        Sampling rate in Hz.
    beta : float
        The Kaiser window's shape parameter.

    Examples
    --------
    >>> from scipy.signal import firwin
    >>> h = kaiser_firwin(263, 300.0, 30000.0, 2.3)
    >>> bool((h == firwin(263, 300.0, window=("kaiser", 2.3), pass_zero=False,
    ...                   fs=30000.0)).all())
    True
    """
    from scipy.special import i0  # noqa: PLC0415 (0.15 s: when taps are designed)

    edges = np.atleast_1d(np.asarray(cutoff_hz, dtype=np.float64)) / float(0.5 * fs)
    pass_nyquist = edges.size % 2 == 1
    if pass_nyquist and numtaps % 2 == 0:
        raise ValueError(f"numtaps: a filter that passes Nyquist needs an odd count, got "
                         f"{numtaps}")
    bands = np.concatenate((edges, np.ones(int(pass_nyquist)))).reshape(-1, 2)
    # the same operations in the same order as firwin (the same bits)
    alpha = 0.5 * (numtaps - 1)
    m = np.arange(0, numtaps, dtype=np.float64) - alpha
    h = 0
    for left, right in bands:
        h += right * np.sinc(right * m)
        h -= left * np.sinc(left * m)
    n = np.arange(0, numtaps, dtype=np.float64)
    a = (numtaps - 1) / 2.0
    h *= i0(beta * np.sqrt(1 - ((n - a) / a) ** 2.0)) / i0(np.asarray(beta, dtype=np.float64))
    left, right = bands[0]
    frequency = 1.0 if right == 1 else 0.5 * (left + right)
    h /= np.sum(h * np.cos(np.pi * m * frequency))
    return h
