"""Decimation of [channels, samples] traces by an integer factor behind an anti-alias FIR:
``scipy.signal.decimate(x, q, ftype="fir", zero_phase=True)`` (a Hamming-windowed low-pass
of ``20·q + 1`` taps applied by ``resample_poly``, every q-th output kept), as a polyphase
product on the engine (`dspk.linalg.matmul`): the wideband stream of a Neuropixels 2.0
probe to the LFP band's 2.5 kHz, say.

The polyphase form: output k is ``Σ_i g[i]·x[kq − P + i]`` (g the taps reversed, P the
samples before the centre tap), so with the taps cut in M blocks of q, ``G[p, m] =
g[mq + p]``, and x cut in rows of q samples, ``X[j, p] = x[jq − P + p]``, the output is
``y[k] = Σ_m (X·G)[k + m, m]``: one product ``[channels·rows, q] × [q, M]`` (only the kept
outputs computed, q times fewer than filtering then dropping) and M shifted sums.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..caches import shared
from ..finite import api, check_finite
from ..linalg.matmul import matmul
from ._checks import traces

__all__ = ["decimate", "decimate_taps"]

#: the product's rows per call on the CPU (its [rows, M] result kept near the cache)
ROWS_PER_BLOCK = 1 << 16


def _check_q(q: Any) -> int:
    if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or q < 1:
        raise ValueError(f"q: expected a whole decimation factor >= 1, got {q!r}")
    return int(q)


def _taps(q: int, n: int) -> np.ndarray:
    """The taps, designed once per (q, n) in the process (a streamed decimation asks for
    them every block), kept read-only in a registered store (`dspk.caches.shared`)."""
    store = shared("decimate_taps", dict)
    h = store.get((q, n))
    if h is None:
        from scipy.signal import firwin  # noqa: PLC0415 (slow import: when used)

        h = firwin(n + 1, 1.0 / q, window="hamming")
        h.flags.writeable = False
        store[(q, n)] = h
    return h


def decimate_taps(q: int, n: int | None = None) -> np.ndarray:
    """The anti-alias FIR of `decimate`: ``scipy.signal.firwin(n + 1, 1/q,
    window="hamming")``, what ``scipy.signal.decimate(ftype="fir")`` designs (n: the order,
    default ``20·q``).

    Its response (q = 2 to 12, measured on a grid of 200 000 frequencies): within 0.33 % of 1
    up to 0.8 of the output's Nyquist frequency, 0.5 at it, at most 0.0024 (−52.7 dB) from
    1.2 of it up: what lies between 0.8 and 1.2 of the output's Nyquist is partly aliased.

    Parameters
    ----------
    q : int
        The decimation factor (>= 2).
    n : int, optional
        The filter's order (taps − 1), >= 1.

    Returns
    -------
    numpy.ndarray
        float64 taps, read-only.

    Examples
    --------
    >>> from dspk.ops import decimate_taps
    >>> h = decimate_taps(12)
    >>> len(h), round(float(h.sum()), 12)
    (241, 1.0)
    """
    q = _check_q(q)
    if q < 2:
        raise ValueError(f"q: a decimation by {q} needs no filter; expected q >= 2")
    n = 20 * q if n is None else n
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n: expected the filter's order, an integer >= 1, got {n!r}")
    return _taps(q, int(n))


@api
def decimate(x: Any, q: int, n: int | None = None, *, halo: int = 0) -> Any:
    """Every q-th sample of each channel of ``x`` after an anti-alias low-pass:
    ``scipy.signal.decimate(x, q, n, ftype="fir", axis=-1, zero_phase=True)``.

    The same filter (`decimate_taps`) and the same alignment as the reference
    (``resample_poly(x, 1, q, window=taps)``: output k is centred on input sample k·q,
    zeros outside x, ``ceil(samples / q)`` outputs), computed as a polyphase product on the
    engine (module notes). Against the reference on the same data (white noise and
    band-limited noise, q = 2, 3, 12, 25, tests/ops/test_decimate.py): largest difference over
    the output's largest value 2.2e-15 in float64; in float32 2.3e-7 against the
    reference's float64 result (the reference's own float32 result: 7.6e-7). The filter's
    own error (what makes the result differ from an ideal decimation): its passband ripple
    and stopband leakage, in `decimate_taps`.

    Parameters
    ----------
    x : array
        [channels, samples], float32 or float64 (NumPy or CuPy); the product runs in x's
        precision.
    q : int
        The decimation factor (>= 1; 12 takes 30 kHz to 2.5 kHz; 1 returns a copy of x's
        inner samples, where the reference's filter design fails).
    n : int, optional
        The filter's order (default ``20·q``, the reference's).
    halo : int
        Samples of context on each side of x that are not part of the output (streaming):
        the output covers x's inner ``samples − 2·halo`` samples (its first output at
        sample ``halo``) and equals the one-shot result there when ``halo`` is at least
        the filter's half length (``10·q``) and the blocks start at multiples of q.

    Returns
    -------
    array
        [channels, ceil((samples − 2·halo) / q)], x's dtype and array type.

    Raises
    ------
    ValueError
        A bad ``q``, ``n`` or ``halo``.
    TypeError
        x not a float32/float64 NumPy or CuPy array.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.signal import decimate as scipy_decimate
    >>> from dspk.ops import decimate
    >>> t = np.arange(30000) / 30000.0
    >>> x = np.stack([np.sin(2 * np.pi * 10 * t), np.sin(2 * np.pi * 5000 * t)])
    >>> y = decimate(x, 12)                                # 30 kHz -> 2.5 kHz
    >>> y.shape, np.round(np.abs(y[:, 500:2000]).max(axis=1), 3)   # 10 Hz kept, 5 kHz gone
    ((2, 2500), array([1., 0.]))
    >>> bool(np.abs(y - scipy_decimate(x, 12, ftype="fir")).max() < 1e-12)
    True
    """
    xp = traces(x)
    q = _check_q(q)
    check_finite(x, "x")
    N = x.shape[1]
    if isinstance(halo, bool) or not isinstance(halo, (int, np.integer)) or \
            not 0 <= halo or 2 * halo >= N:
        raise ValueError(f"halo: expected an integer with 0 <= halo < samples/2 ({N} "
                         f"samples), got {halo!r}")
    halo = int(halo)
    if q == 1:
        return x[:, halo:N - halo].copy()      # nothing to filter (the reference refuses)
    taps = decimate_taps(q, n)
    L = len(taps)
    H = (L - 1) // 2                            # the centre tap (resample_poly's half_len)
    P = L - 1 - H                               # samples before it, in the reversed taps
    M = -(-L // q)
    C = x.shape[0]
    K = -(-(N - 2 * halo) // q)                 # outputs
    J = K + M - 1                               # rows of q samples the outputs read
    g = np.zeros(M * q)
    g[:L] = taps[::-1]
    G = xp.asarray(g.reshape(M, q).T.astype(x.dtype))            # [q, M]
    s0 = halo - P                               # x's sample at row 0, column 0
    out = xp.empty((C, K), dtype=x.dtype)
    # channel blocks: the product's [rows, M] result of a block stays small
    per = max(1, ROWS_PER_BLOCK // J) if xp is np else C
    for c0 in range(0, C, per):
        c1 = min(C, c0 + per)
        buf = xp.zeros((c1 - c0, J * q), dtype=x.dtype)
        a, b = max(0, s0), min(N, s0 + J * q)
        if b > a:
            buf[:, a - s0:b - s0] = x[c0:c1, a:b]
        Z = matmul(buf.reshape((c1 - c0) * J, q), G).reshape(c1 - c0, J, M)
        y = out[c0:c1]
        y[...] = Z[:, 0:K, 0]
        for m in range(1, M):
            y += Z[:, m:m + K, m]
    return out


def decimated_length(samples: int, q: int) -> int:
    """``ceil(samples / q)``: the outputs of `decimate` (and of the reference).

    Examples
    --------
    >>> from dspk.ops.decimate import decimated_length
    >>> decimated_length(30001, 12)
    2501
    """
    return int(math.ceil(samples / q))
