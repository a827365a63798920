"""FIR filters on [channels, samples] traces: design (Kaiser windows by `dspk.ops.kaiser`, the
Butterworth response through scipy.signal), per-channel filtering and filter banks.

Convention: a filter's output at sample t is aligned with its input (the group delay of the
linear-phase taps is removed: ``taps`` of odd length are centred on their middle tap). Outside
the data the signal is taken as zero, unless the caller gives ``halo`` samples on each side
(streaming: the output then covers only the inner ``samples − 2·halo`` and equals the one-shot
result there exactly as long as ``halo >= len(taps) // 2``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..linalg.engine import current_engine
from ..linalg.host_checks import max_relative_difference
from ..argnames import arg
from ..finite import api, check_finite
from ._checks import traces
from ._parallel import blocks
from ._traces_gpu import fir_direct, fir_reason
from .fir_cpu import toeplitz_correlate
from .kaiser import kaiser_firwin, kaiser_order

__all__ = ["highpass_taps", "bandpass_taps", "zero_phase_taps", "fir_filter", "fir_bank",
           "DEFAULT_HIGHPASS_HZ"]

DEFAULT_HIGHPASS_HZ = 300.0
#: the longest filter `highpass_taps` and `bandpass_taps` design: 2^20 taps (35 s at 30 kHz,
#: 8 MiB of float64). A 0.01 Hz high-pass needs 7.9 M taps at 30 kHz, and a job then asked
#: for 168 TiB before failing; a cut-off so low is a drift correction, not a FIR's work
MAX_TAPS = 1 << 20


def _check_length(numtaps: int, fs: float, band: str, edge: float, transition: float,
                  given: bool) -> None:
    """Refuse a Kaiser design longer than `MAX_TAPS`, saying what it would need and which
    cut-off or transition fits."""
    if numtaps <= MAX_TAPS:
        return
    # taps grow as 1/transition: the transition (and, by default, the cut-off) that fits
    fits = transition * numtaps / MAX_TAPS
    instead = (f"a wider {arg('transition')} (at least {fits:.3g} Hz)" if given else
               f"a cut-off of at least {fits * 1.5:.3g} Hz (its transition, 2/3 of the "
               f"cut-off, sets the length)")
    raise ValueError(f"cutoff: a {band} at {edge:g} Hz with a {transition:.3g} Hz transition "
                     f"band needs {numtaps:,} taps at {fs:g} Hz ({numtaps / fs:.3g} s of "
                     f"signal per output sample), more than the {MAX_TAPS:,} (MAX_TAPS) dspk "
                     f"designs; use {instead}, or remove slow drifts another way (a "
                     f"decimated signal, scipy.signal.sosfiltfilt)")


def _check_fs(fs: float, *cutoffs: float) -> None:
    if not fs > 0:
        raise ValueError(f"fs: expected a positive sampling rate in Hz, got {fs}")
    for c in cutoffs:
        if not 0 < c < fs / 2:
            raise ValueError(f"cutoff {c} Hz: expected 0 < cutoff < fs/2 = {fs / 2} Hz")


def highpass_taps(fs: float, cutoff: float = DEFAULT_HIGHPASS_HZ,
                  transition: float | None = None, ripple_db: float = 33.0) -> np.ndarray:
    """Linear-phase high-pass FIR taps (Kaiser window: scipy.signal.firwin's bits), odd length.

    The gain is 0.5 at ``cutoff``; the transition band is ``cutoff ± transition/2`` (default
    2/3 of the cutoff: 200–400 Hz for 300 Hz), outside which the ripple is at most
    10^(−ripple_db/20) (33 dB: ≤ 2.3%). With the defaults at 30 kHz: ``|H|`` ≤ 0.03 at 200 Hz
    and below, ≥ 0.97 from 400 Hz up — more selective than Kilosort4's 3rd-order
    forward-backward Butterworth (``|H|`` ≈ 0.08 at 200 Hz, 0.85 at 400 Hz).

    Parameters
    ----------
    fs : float
        Sampling rate in Hz (> 0).
    cutoff : float
        The -6 dB frequency in Hz, 0 < cutoff < fs/2 (default 300).
    transition : float, optional
        Width of the transition band in Hz, 0 < transition < 2·cutoff (default 2/3 of
        ``cutoff``). The number of taps grows as fs / transition.
    ripple_db : float
        Attenuation outside the transition band, in dB (Kaiser window design).

    Returns
    -------
    numpy.ndarray
        float64 taps, odd length (type I, symmetric), for `fir_filter`.

    Raises
    ------
    ValueError
        A non-positive ``fs``, a cutoff outside (0, fs/2), a transition out of range, a
        design longer than `MAX_TAPS` (a cut-off far below the spike band: the message says
        which cut-off or transition fits).

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.signal import freqz
    >>> from dspk.ops import highpass_taps
    >>> taps = highpass_taps(30000.0)              # 300 Hz
    >>> len(taps), taps.dtype
    (263, dtype('float64'))
    >>> _, h = freqz(taps, worN=[200.0, 300.0, 400.0], fs=30000.0)
    >>> np.round(np.abs(h), 2)                     # |H| at 200, 300 and 400 Hz
    array([0.03, 0.49, 0.98])
    """
    given = transition is not None
    transition = (2.0 / 3.0) * cutoff if transition is None else float(transition)
    _check_fs(fs, cutoff)
    if not 0 < transition < 2 * cutoff:
        raise ValueError(f"transition: expected 0 < transition < 2*cutoff, got {transition}")
    numtaps, beta = kaiser_order(ripple_db, transition / (0.5 * fs))
    numtaps |= 1  # odd: a high-pass needs a middle tap (type I)
    _check_length(numtaps, fs, "high-pass", cutoff, transition, given)
    return kaiser_firwin(numtaps, cutoff, fs, beta)


def bandpass_taps(fs: float, low: float, high: float, transition: float | None = None,
                  ripple_db: float = 33.0) -> np.ndarray:
    """Linear-phase band-pass FIR taps (Kaiser window), odd length; gain 0.5 at ``low`` and
    ``high``, transition width default 2/3 of ``low``.

    Parameters
    ----------
    fs : float
        Sampling rate in Hz.
    low, high : float
        The band edges (gain 0.5) in Hz, 0 < low < high < fs/2.
    transition : float, optional
        Width of both transition bands in Hz (default 2/3 of ``low``).
    ripple_db : float
        Attenuation outside the transition bands, in dB.

    Returns
    -------
    numpy.ndarray
        float64 taps, odd length, for `fir_filter`.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.signal import freqz
    >>> from dspk.ops import bandpass_taps
    >>> taps = bandpass_taps(30000.0, 300.0, 6000.0)
    >>> _, h = freqz(taps, worN=[100.0, 300.0, 3000.0, 6000.0, 9000.0], fs=30000.0)
    >>> np.round(np.abs(h), 2)
    array([0.  , 0.49, 1.  , 0.5 , 0.  ])
    """
    _check_fs(fs, low, high)
    if not low < high:
        raise ValueError(f"low ({low} Hz) must be below high ({high} Hz)")
    given = transition is not None
    transition = (2.0 / 3.0) * low if transition is None else float(transition)
    if not 0 < transition < 2 * low:
        raise ValueError(f"transition: expected 0 < transition < 2*low, got {transition}")
    numtaps, beta = kaiser_order(ripple_db, transition / (0.5 * fs))
    _check_length(numtaps | 1, fs, "band-pass", low, transition, given)
    return kaiser_firwin(numtaps | 1, [low, high], fs, beta)


def zero_phase_taps(fs: float, cutoff: float = DEFAULT_HIGHPASS_HZ, order: int = 3,
                    tolerance: float = 1e-6) -> np.ndarray:
    """The impulse response of a Butterworth high-pass run forward and backward
    (scipy.signal.filtfilt), as symmetric FIR taps: for matching Kilosort4's high-pass. The
    response is truncated where every remaining tap is below ``tolerance`` times the largest.

    Parameters
    ----------
    fs : float
        Sampling rate in Hz.
    cutoff : float
        The Butterworth filter's cutoff in Hz (its gain there, run twice: 0.5).
    order : int
        The Butterworth filter's order (Kilosort4: 3).
    tolerance : float
        Truncation, relative to the largest tap.

    Returns
    -------
    numpy.ndarray
        float64 taps, odd length, symmetric about the middle one (zero phase).

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.signal import butter, sosfiltfilt
    >>> from dspk.ops import fir_filter, zero_phase_taps
    >>> taps = zero_phase_taps(30000.0)
    >>> len(taps), bool(np.array_equal(taps, taps[::-1]))
    (629, True)
    >>> x = np.random.default_rng(0).standard_normal((2, 20000))
    >>> ref = sosfiltfilt(butter(3, 300.0, btype="highpass", fs=30000.0, output="sos"), x)
    >>> y = fir_filter(x, taps)                    # away from the edges (filtfilt pads them)
    >>> bool(np.abs(y - ref)[:, 2000:-2000].max() < 1e-4)
    True
    """
    from scipy.signal import butter, sosfilt  # noqa: PLC0415 (slow import: when used)

    _check_fs(fs, cutoff)
    sos = butter(order, cutoff, btype="highpass", fs=fs, output="sos")
    n = int(20 * fs / cutoff) | 1
    imp = np.zeros(n)
    imp[0] = 1.0
    h = sosfilt(sos, imp)                       # causal response
    # forward-backward = h convolved with its time reverse: symmetric around lag 0
    full = np.convolve(h, h[::-1])
    mid = len(full) // 2
    keep = np.flatnonzero(np.abs(full) >= tolerance * np.abs(full).max())
    half = max(mid - keep.min(), keep.max() - mid)
    return full[mid - half: mid + half + 1]


def _check_taps(taps: Any, n_samples: int, name: str = "taps",
                n_rows: int | None = None) -> np.ndarray:
    t = np.asarray(taps.get() if hasattr(taps, "get") else taps, dtype=np.float64)
    if t.ndim != 1 or t.size == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D array of taps, got shape {t.shape}")
    if t.size > n_samples:
        hint = ""
        if n_rows is not None and n_rows > n_samples:
            hint = (f"; x has more rows ({n_rows}) than columns: arrays are [channels, "
                    f"samples] in dspk (did you pass [samples, channels]? use x.T)")
        raise ValueError(f"{name}: {t.size} taps are longer than the data ({n_samples} "
                         f"samples): the filter needs at least {t.size} samples; pass a "
                         f"longer block, or design fewer taps (a higher cut-off or a wider "
                         f"transition){hint}")
    return t


def _correlate_same(xp: Any, x: Any, kernel: Any) -> Any:
    """Per row of x, Σ_j kernel[j] x[t + j − c] with c = len(kernel) // 2 (zero outside)."""
    if xp is np:
        from scipy.signal import oaconvolve  # noqa: PLC0415 (slow import: when used)
    else:
        from cupyx.scipy.signal import oaconvolve  # noqa: PLC0415 (CuPy input)
    k = kernel[::-1]                      # correlation = convolution with the reversed taps
    c = (len(kernel) - 1) - len(kernel) // 2
    n = x.shape[1]

    def rows(a: int, b: int) -> Any:
        return oaconvolve(x[a:b], k[None, :], mode="full", axes=1)[:, c:c + n]

    if xp is not np:
        return rows(0, x.shape[0])
    # channel blocks in threads: 384 x 60 000 float32 high-pass, 2 cores: 240 -> about 160 ms
    return blocks(rows, x.shape[0], x.size, axis=0)


#: the blocked Toeplitz products (C·n·taps multiply-adds per filter) are a CPU candidate up to
#: this many taps: on 2 cores (64 x 30 000 float32, one filter) they took 11 ms at 255 taps
#: against 17 for whole-row FFTs, 49 against 15 at 1023 and 266 against 19 at 4095; timing
#: them on a first call of a 31 000-tap band-pass (`--preset ibl-lfp`) took ~40 s
TOEPLITZ_MAX_TAPS = 1024


def bank_implementations(xp: Any, x: Any, weights: np.ndarray) -> dict:
    """The ways `fir_bank` can compute ``[C, k, n]``, every row of x correlated with every row
    of ``weights`` [k, taps] (float64 host array), Σ_j weights[i, j]·x[t + j − taps//2], zero
    outside: by name, each a callable of no argument; the first is the reference the tuner
    checks the others against (overlap-add, scipy.signal.oaconvolve / cupyx's).

    On the CPU also whole-row real FFTs (scipy.fft workers) and blocked Toeplitz products
    (BLAS, `dspk.ops.fir_cpu`); on the GPU the direct kernel of dspk/kernels/traces.cu (all
    filters from one read of x; the better choice for short filters, when few outputs share
    each input), where it can run.

    Parameters
    ----------
    xp : module
        x's array module.
    x : array
        [channels, samples], float32 or float64.
    weights : numpy.ndarray
        [k, taps] float64, taps <= samples.

    Returns
    -------
    dict
        name -> callable returning [channels, k, samples] in x's dtype and array type.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops.fir import bank_implementations
    >>> x = np.random.default_rng(0).standard_normal((2, 500)).astype(np.float32)
    >>> impls = bank_implementations(np, x, np.ones((3, 11)))
    >>> list(impls)
    ['oaconvolve', 'rfft_rows', 'toeplitz_gemm']
    >>> ref = impls["oaconvolve"]()
    >>> all(bool(np.allclose(f(), ref, atol=1e-4)) for f in impls.values())
    True
    """
    k, taps = weights.shape
    C, n = x.shape

    def fft() -> Any:
        out = xp.empty((C, k, n), dtype=x.dtype)
        for i in range(k):
            out[:, i] = _correlate_same(xp, x, xp.asarray(weights[i].astype(x.dtype)))
        return out

    impls = {"oaconvolve": fft}
    if xp is np:
        impls["rfft_rows"] = lambda: _rfft_bank(x, weights)
        if taps <= TOEPLITZ_MAX_TAPS:
            impls["toeplitz_gemm"] = lambda: toeplitz_correlate(x, weights)
    elif fir_reason(x, k, taps) is None:
        impls["direct"] = lambda: fir_direct(x, weights, taps // 2)
    return impls


def _correlate_bank(xp: Any, x: Any, weights: np.ndarray) -> Any:
    """[C, k, n]: every row of x correlated with every row of ``weights`` [k, taps] (float64
    host array), Σ_j weights[i, j]·x[t + j − taps//2], zero outside, by the implementation
    the tuner chose for this size class (`bank_implementations`), results checked against
    overlap-add before a choice is kept."""
    k, taps = weights.shape
    C, n = x.shape
    gpu = xp is not np
    impls = bank_implementations(xp, x, weights)
    if len(impls) == 1:
        return impls["oaconvolve"]()
    tuner = current_engine().tuner
    key = ("fir", tuner.stamp(gpu, x.device.id if gpu else None), x.dtype.name,
           *(int(v).bit_length() for v in (C, n, taps, k)))
    tol = 1e-4 if x.dtype == np.float32 else 1e-10

    def agree(got: Any, ref: Any) -> str | None:
        worst = max_relative_difference(got, ref)   # (on the host: nothing compiled)
        return None if worst <= tol else f"differs from the FFT result by {worst:.1e} (relative)"

    def sliced(fraction: float) -> dict:
        # the first channels: each channel costs what it costs in the whole bank
        m = max(1, min(C, -(-C * fraction // 1)))
        return bank_implementations(xp, x[:int(m)], weights)

    # scipy.signal's import (0.6-2 s on 2 cores) for the overlap-add reference, and
    # scipy.fft's for the whole-row FFTs (0.18 s, and 0.07 s more in its first transform) are
    # not paid on a first use when nothing else imported them: a thorough tuning (dspk tune)
    # times those candidates
    imports = None if gpu else {"oaconvolve": ("scipy.signal",), "rfft_rows": ("scipy.fft",)}
    # on the GPU cupyx's overlap-add imports scipy.fft/scipy.sparse (0.6 s) and compiles
    # kernels with NVRTC in its first run: left for a thorough tuning too
    return tuner.choose_run(key, impls, gpu, agree, sliced=sliced, imports=imports,
                            jit=("oaconvolve",))[2]


def _rfft_bank(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The CPU bank by whole-row real FFTs (scipy.fft, all cores): one transform of x serves
    every filter; on 2 cores a 263-tap high-pass of 384 x 30 262 float32 took 57 ms against
    77 ms for overlap-add in channel blocks."""
    import scipy.fft as sf  # noqa: PLC0415 (slow import: only when used)

    k, taps = weights.shape
    C, n = x.shape
    size = sf.next_fast_len(n + taps - 1, real=True)
    workers = os.cpu_count() or 1
    spec = sf.rfft(x, size, axis=1, workers=workers)
    out = np.empty((C, k, n), dtype=x.dtype)
    c = taps // 2
    for i in range(k):
        # correlation = convolution with the reversed taps; output t sits at index t + taps-1-c
        h = sf.rfft(weights[i, ::-1].astype(x.dtype), size)
        y = sf.irfft(spec * h, size, axis=1, workers=workers)
        out[:, i] = y[:, taps - 1 - c:taps - 1 - c + n]
    return out


@api
def fir_filter(x: Any, taps: Any, zero_phase: bool = False, halo: int = 0) -> Any:
    """Filter every channel of ``x`` [channels, samples] with ``taps``.

    Parameters
    ----------
    x : array
        float32 or float64 (the filter runs in x's precision).
    taps : array-like
        1-D FIR taps; odd-length linear-phase taps keep the output aligned with the input.
    zero_phase : bool
        Filter forward and backward (the taps' response squared, zero phase).
    halo : int
        Samples of context on each side of x that are not returned (streaming).

    Returns
    -------
    array
        [channels, samples − 2·halo], x's dtype and array type.

    Notes
    -----
    The output is the convolution with ``taps`` centred on the middle tap:
    ``y[c, t] = Σ_j taps[j]·x[c, t + (len(taps) − 1)//2 − j]``, zero outside x. Implementations
    (overlap-add in channel blocks, whole-row real FFTs, on the CPU blocked Toeplitz products
    through BLAS, on the GPU a direct kernel) are chosen by the tuner, so results agree within
    float rounding, not to the bit.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import fir_filter
    >>> x = np.zeros((1, 7), dtype=np.float32)
    >>> x[0, 3] = 1.0                              # an impulse
    >>> np.round(fir_filter(x, [1.0, 2.0, 3.0]), 5) + 0.0
    array([[0., 0., 1., 2., 3., 0., 0.]], dtype=float32)
    >>> np.round(fir_filter(x, [1.0, 2.0, 3.0], halo=2), 5) + 0.0
    array([[1., 2., 3.]], dtype=float32)
    >>> np.round(fir_filter(x, [1.0, 2.0, 3.0], zero_phase=True), 5) + 0.0
    array([[ 0.,  3.,  8., 14.,  8.,  3.,  0.]], dtype=float32)
    """
    xp = traces(x)
    t = _check_taps(taps, x.shape[1], n_rows=x.shape[0])
    check_finite(x, "x")
    if zero_phase:
        t = np.convolve(t, t[::-1])
    halo = int(halo)
    if not (0 <= halo and 2 * halo < x.shape[1]):
        raise ValueError(f"halo: expected 0 <= halo < samples/2, got {halo}")
    k = t[::-1].copy()                                 # correlation kernel of a convolution
    y = _correlate_bank(xp, x, k[None])[:, 0]
    return y[:, halo:x.shape[1] - halo] if halo else y


@api
def fir_bank(x: Any, bank: Any) -> Any:
    """Correlate every channel with every filter of ``bank`` [k, taps]: out[c, i, t] =
    Σ_j bank[i, j]·x[c, t + j − taps//2] (zero outside) — Kilosort4's template correlation.

    Parameters
    ----------
    x : array
        [channels, samples], float32 or float64 (NumPy or CuPy).
    bank : array-like
        [k, taps] filters (correlated, not convolved: not reversed), at most as long as x.

    Returns
    -------
    array
        [channels, k, samples], x's dtype and array type.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import fir_bank
    >>> x = np.zeros((1, 7), dtype=np.float32)
    >>> x[0, 3] = 1.0
    >>> out = fir_bank(x, [[1.0, 2.0, 3.0], [0.0, 1.0, 0.0]])
    >>> out.shape
    (1, 2, 7)
    >>> np.round(out[0], 5) + 0.0                  # correlation: the first filter reversed
    array([[0., 0., 3., 2., 1., 0., 0.],
           [0., 0., 0., 1., 0., 0., 0.]], dtype=float32)
    """
    xp = traces(x)
    b = np.asarray(bank.get() if hasattr(bank, "get") else bank, dtype=np.float64)
    if b.ndim != 2 or b.shape[0] == 0 or b.shape[1] == 0:
        raise ValueError(f"bank: expected [filters, taps], got shape {b.shape}")
    check_finite(b, "bank", ("filter", "tap"))
    check_finite(x, "x")
    if b.shape[1] > x.shape[1]:
        _check_taps(b[0], x.shape[1], "bank", n_rows=x.shape[0])
        raise ValueError(f"bank: {b.shape[1]} taps are longer than the data "
                         f"({x.shape[1]} samples)")
    return _correlate_bank(xp, x, b)
