"""The temporal bank of `dspk.detect_spikes`: the built-in spike shapes (`default_templates`:
analytic, a trough then a slower rebound), a bank learned from the data (`learn_templates`:
isolated threshold crossings clustered by seeded k-means on dspk's engine), and the waveform
window both are cut from (2 ms, the trough at `TROUGH_TAP` at 30 kHz: `_window`, `_clips`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import array_module, to_numpy
from ..linalg import matmul
from ..finite import api, check_finite
from ..ops import pairwise_sqdist


#: the trough of the default templates, in taps from their start (Kilosort4's nt0min)
TROUGH_TAP = 20


def default_templates(fs: float = 30000.0, n: int = 6) -> np.ndarray:
    """The built-in temporal bank: ``n`` extracellular spike shapes (a trough then a slower
    rebound) of trough widths from 0.07 to 0.22 ms, 2 ms long, trough at tap 20 at 30 kHz
    (scaled with fs), each of unit L2 norm. Analytic and deterministic (no data file).

    Parameters
    ----------
    fs : float
        Sampling rate in Hz (> 0): round(2 ms · fs) taps, made odd.
    n : int
        Templates, of trough widths evenly spaced from 0.07 to 0.22 ms (narrowest first).

    Returns
    -------
    numpy.ndarray
        [n, taps] float64.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.detect import default_templates
    >>> bank = default_templates()
    >>> bank.shape, bank.argmin(axis=1).tolist()            # the trough at tap 20
    ((6, 61), [20, 20, 20, 20, 20, 20])
    >>> np.round(np.linalg.norm(bank, axis=1), 6).tolist()
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    >>> default_templates(fs=20000.0, n=3).shape
    (3, 41)
    """
    if not fs > 0:
        raise ValueError(f"fs: expected a positive sampling rate, got {fs}")
    taps = int(round(2e-3 * fs)) | 1
    trough = int(round(TROUGH_TAP * fs / 30000.0))
    t_ms = (np.arange(taps) - trough) / fs * 1e3
    bank = []
    for w in np.linspace(0.07, 0.22, n):
        shape = -np.exp(-0.5 * (t_ms / w) ** 2) + \
            0.3 * np.exp(-0.5 * ((t_ms - 3.5 * w) / (2.5 * w)) ** 2)
        bank.append(shape / np.linalg.norm(shape))
    return np.stack(bank)


def _window(fs: float) -> tuple:
    """(taps, trough tap) of a waveform window at ``fs`` (2 ms, trough at 2/3 ms)."""
    taps = int(round(2e-3 * fs)) | 1
    return taps, int(round(TROUGH_TAP * fs / 30000.0))


def _clips(x: Any, channels: np.ndarray, times: np.ndarray, fs: float) -> Any:
    """[n, len(channels[0]) or 1, taps] float32 waveforms around each trough (zero outside x),
    gathered where x is (NumPy or CuPy; the index arrays are host arrays)."""
    xp = array_module(x)
    taps, trough = _window(fs)
    offsets = np.arange(taps) - trough
    t = np.asarray(times)[:, None] + offsets[None, :]                # [n, taps]
    inside = (t >= 0) & (t < x.shape[1])
    tc = np.clip(t, 0, x.shape[1] - 1)
    ch = channels if channels.ndim == 2 else channels[:, None]
    out = x[xp.asarray(ch)[:, :, None], xp.asarray(tc)[:, None, :]]  # [n, nb, taps]
    return xp.where(xp.asarray(inside)[:, None, :], out, 0).astype(np.float32)


@api
def learn_templates(x: Any, fs: float, n_templates: int = 6, threshold: float = 6.0,
                    isolation_ms: float = 1.0, max_spikes: int = 20000,
                    seed: int = 0) -> np.ndarray:
    """A temporal bank learned from the data: isolated threshold crossings (troughs below
    −``threshold`` noise SDs with no other crossing on the channel within ±``isolation_ms``),
    their unit-norm waveforms clustered by seeded k-means (distances through
    `dspk.pairwise_sqdist`), the cluster means as unit-norm templates.

    Parameters
    ----------
    x : array
        Whitened [channels, samples] (NumPy or CuPy; found, gathered and clustered where it
        is: on the GPU for CuPy, with one host round trip for the crossings' count and one
        every few k-means iterations).
    fs : float
        Sampling rate in Hz.
    n_templates : int
        Templates (k-means clusters) to learn; at least this many crossings are needed.
    threshold : float
        Crossing threshold in noise SDs (a trough below −threshold).
    isolation_ms : float
        A trough must be the channel's minimum within ± this time, with no other trough
        within ± twice it.
    max_spikes : int
        At most this many crossings (a seeded random subset) are clustered.
    seed : int
        Seeds the subset and the k-means initialisation (the result is deterministic).

    Returns
    -------
    numpy.ndarray
        [n_templates, taps] float64, trough at tap 20 at 30 kHz (like `default_templates`),
        sorted by trough width (narrowest first).

    Raises
    ------
    ValueError
        Fewer isolated crossings than ``n_templates``.

    Examples
    --------
    Spikes of two widths, the narrowest and the widest default templates:

    >>> import numpy as np
    >>> from dspk.detect import default_templates, learn_templates
    >>> bank = default_templates()
    >>> x = np.random.default_rng(0).standard_normal((4, 30000)).astype(np.float32)
    >>> for k, t in enumerate(range(200, 29800, 300)):
    ...     w = bank[5 if k % 2 else 0]
    ...     x[k % 4, t - 20:t + 41] += 10 * w / -w.min()
    >>> learned = learn_templates(x, 30000.0, n_templates=2)
    >>> learned.shape
    (2, 61)
    >>> (learned @ bank[[0, 5]].T).argmax(axis=1)               # narrow first, then wide
    array([0, 1])
    """
    xp = array_module(x)
    if xp is np:
        # deferred like every scipy import in dspk: ~0.3 s to import (nothing heavy at import)
        from scipy.ndimage import minimum_filter1d, uniform_filter1d  # noqa: PLC0415
    else:
        from cupyx.scipy.ndimage import minimum_filter1d, uniform_filter1d  # noqa: PLC0415 (CuPy)
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"x: expected [channels, samples], got shape "
                         f"{getattr(x, 'shape', None)}")
    check_finite(x, "x")
    xs = x.astype(np.float32, copy=False)
    iso = max(1, int(round(isolation_ms * 1e-3 * fs)))
    n = xs.shape[1]
    # troughs: below -threshold and the channel's minimum within ±iso
    local = minimum_filter1d(xs, size=2 * iso + 1, axis=1, mode="constant", cval=np.inf)
    trough = (xs < -threshold) & (xs == local)
    # isolated: no other trough on the channel within ±2·iso
    around = uniform_filter1d(trough.astype(np.float32), size=4 * iso + 1, axis=1,
                              mode="constant") * (4 * iso + 1)
    taps, tr = _window(fs)
    ch, t = (to_numpy(v) for v in xp.nonzero(trough & (xp.rint(around) == 1)))  # one sync
    keep = (t >= tr) & (t < n - (taps - tr))
    ch, t = ch[keep], t[keep]
    if len(t) < n_templates:
        raise ValueError(f"x: {len(t)} isolated crossings below -{threshold} SDs; at least "
                         f"n_templates = {n_templates} are needed (lower threshold=?)")
    rng = np.random.default_rng(seed)
    if len(t) > max_spikes:
        pick = np.sort(rng.choice(len(t), max_spikes, replace=False))
        ch, t = ch[pick], t[pick]
    w = _clips(xs, ch, t, fs)[:, 0]                            # [n, taps], where x is
    w /= xp.linalg.norm(w, axis=1, keepdims=True)
    centres = _kmeans(w, w[xp.asarray(rng.choice(len(w), n_templates, replace=False))])
    centres = to_numpy(centres).astype(np.float64)
    centres = centres / np.linalg.norm(centres, axis=1, keepdims=True)
    width = (centres < 0.5 * centres.min(axis=1, keepdims=True)).sum(axis=1)
    return centres[np.argsort(width, kind="stable")].astype(np.float64)


#: Lloyd's iterations of `learn_templates`, at most; convergence is looked at every
#: KMEANS_CHECK of them (one host round trip each, not one per iteration)
KMEANS_ITERATIONS = 50
KMEANS_CHECK = 5


def _kmeans(w: Any, centres: Any) -> Any:
    """Lloyd's k-means of the rows of ``w`` from ``centres``, where ``w`` is (NumPy or CuPy):
    labels from `pairwise_sqdist` (the engine), cluster sums as one product with the one-hot
    labels (onehotᵀ·w, the engine again), an empty cluster keeps its centre. Stops once the
    centres move by at most 1e-7 (checked every `KMEANS_CHECK` iterations; the further
    iterations of a converged run change nothing)."""
    xp = array_module(w)
    k = centres.shape[0]
    ids = xp.arange(k)
    for i in range(KMEANS_ITERATIONS):
        label = pairwise_sqdist(w, centres).argmin(axis=1)
        onehot = (label[:, None] == ids[None, :]).astype(w.dtype)          # [n, k]
        counts = onehot.sum(axis=0)
        sums = matmul(xp.ascontiguousarray(onehot.T), w)                  # [k, taps]
        new = xp.where(counts[:, None] > 0, sums / xp.maximum(counts, 1)[:, None], centres)
        moved = xp.abs(new - centres).max()
        centres = new
        if i % KMEANS_CHECK == KMEANS_CHECK - 1 and float(moved) <= 1e-7:
            break
    return centres
