"""`detect_spikes` and the unit of its threshold, the noise of each template's output
(`template_noise`): the arguments checked, the neighbourhoods of each position (kept with the
engine), and the three paths to the same spikes: the fused kernels for CuPy input
(`dspk.detect._gpu`), the bounded path for NumPy input (`dspk.detect.spikes_cpu`), and the
engine path, every score through `dspk.matmul` (`_engine_scores`, `_local_maxima`: the
reference, and CuPy input the kernels cannot take).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..backend import array_module, to_numpy
from ..linalg import current_engine, matmul
from ..finite import api, check_finite
from ..ops import fir_bank
from ..ops.distance import probe_sqdist
from ._gpu import fused_reason
from .noise import (MAD_TO_SD, NOISE_BLOCK_BYTES, _abs_median, _inverse_noise, _noise_check,
                    _noise_samples)
from .spikes_cpu import _cpu_noise, _cpu_spikes
from .templates import TROUGH_TAP, default_templates

log = logging.getLogger("dspk.detect")

SPIKE_DTYPE = np.dtype([("sample_index", np.int64), ("channel_index", np.int64),
                        ("amplitude", np.float32), ("template_index", np.int64),
                        ("x", np.float32), ("y", np.float32)])


def _checks(x: Any, geometry: Any, fs: float, templates: Any, threshold: float) -> tuple:
    if getattr(x, "ndim", None) != 2 or x.dtype.kind != "f":
        raise ValueError(f"x: expected whitened float [channels, samples], got "
                         f"{getattr(x, 'dtype', type(x).__name__)} "
                         f"{getattr(x, 'shape', None)}")
    c, n = x.shape
    if geometry is None:
        raise ValueError("geometry: detection needs the channel positions ([channels, 2] µm)")
    g = np.asarray(to_numpy(geometry), dtype=np.float64)
    if g.shape != (c, 2):
        raise ValueError(f"geometry: expected [{c}, 2] positions in µm, got shape {g.shape}")
    if not threshold > 0:
        raise ValueError(f"threshold: expected a positive number of noise SDs, got "
                         f"{threshold}")
    bank = default_templates(fs) if templates is None else \
        np.asarray(to_numpy(templates), dtype=np.float64)
    if bank.ndim != 2 or bank.shape[0] == 0 or bank.shape[1] % 2 == 0:
        raise ValueError(f"templates: expected [k, taps] with an odd number of taps, got "
                         f"shape {bank.shape}")
    if bank.shape[1] > n:
        raise ValueError(f"templates: {bank.shape[1]} taps are longer than the data "
                         f"({n} samples)")
    norms = np.linalg.norm(bank, axis=1)
    if np.any(norms == 0):
        raise ValueError("templates: a template is all zeros")
    return g, bank / norms[:, None]


@api
def template_noise(x: Any, fs: float, templates: Any = None) -> np.ndarray:
    """The robust noise SD of every channel's output of every template: the median absolute
    value of ``fir_bank(x, templates)`` / 0.6745 over `NOISE_SAMPLES` evenly spaced samples (all
    of them in a shorter batch). Spikes are rare, so the median sees the noise.

    Parameters
    ----------
    x : array
        Whitened [channels, samples] float32/float64 traces, NumPy or CuPy.
    fs : float
        Sampling rate in Hz (for the default templates).
    templates : array, optional
        [k, taps] temporal templates (scaled to unit norm, as `detect_spikes` does). Default:
        `default_templates(fs)`.

    Returns
    -------
    numpy.ndarray
        [channels, k] float64, the noise SD of each channel's output of each template: 1 for
        white unit-variance noise, more when the noise power sits where the template's does.
        Pass it as `detect_spikes`'s ``noise`` to detect other batches in the same units.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.detect import template_noise
    >>> x = np.random.default_rng(0).standard_normal((4, 60000)).astype(np.float32)
    >>> sd = template_noise(x, 30000.0)
    >>> sd.shape, bool(np.all(np.abs(sd - 1) < 0.05))
    ((4, 6), True)
    """
    g = np.zeros((x.shape[0], 2)) if getattr(x, "ndim", None) == 2 else None
    _, bank = _checks(x, g, fs, templates, 1.0)
    check_finite(x, "x")
    return _template_noise(x, bank)


def _template_noise(x: Any, bank: np.ndarray, b: Any = None) -> np.ndarray:
    """[C, k] noise SDs of fir_bank(x, bank) at `_noise_samples` (``b``: that output, when the
    caller has it already; else computed in channel blocks of `NOISE_BLOCK_BYTES`)."""
    xp = array_module(x)
    c, n = x.shape
    k, taps = bank.shape
    idx = _noise_samples(n, taps)
    if b is not None:
        out = b[:, :, idx] if xp is not np else np.take(b, idx, axis=2)     # [C, k, m]
    elif xp is np:                          # the bank in channel blocks, never whole
        return _cpu_noise(x, bank)
    else:
        rows = max(1, NOISE_BLOCK_BYTES // max(1, k * n * x.itemsize))
        take = xp.asarray(idx)
        out = xp.concatenate([fir_bank(x[c0:c0 + rows], bank.astype(x.dtype))[:, :, take]
                              for c0 in range(0, c, rows)])
    return np.asarray(to_numpy(_abs_median(xp, out)), dtype=np.float64) / MAD_TO_SD


def detection_margin(fs: float, dead_time_ms: float = 0.67) -> int:
    """Samples of context a block needs on each side for `detect_spikes` (default templates)
    to find in it exactly the spikes of the whole recording: half the templates, the dead
    time and one sample.

    Parameters
    ----------
    fs : float
    dead_time_ms : float

    Examples
    --------
    >>> from dspk.detect import detection_margin
    >>> detection_margin(30000.0)
    51
    """
    return default_templates(fs).shape[1] // 2 + \
        max(1, int(round(dead_time_ms * 1e-3 * fs))) + 1


def detection_lag(fs: float) -> int:
    """Samples from a spike's trough to the sample its detection score peaks at, for the
    default templates.

    Parameters
    ----------
    fs : float

    Examples
    --------
    >>> from dspk.detect import detection_lag
    >>> detection_lag(30000.0)
    10
    """
    return default_templates(fs).shape[1] // 2 - int(round(TROUGH_TAP * fs / 30000.0))


@api
def detect_spikes(x: Any, geometry: Any, fs: float, templates: Any = None,
                  threshold: float = 7.0, n_neighbors: int = 10,
                  widths_um: tuple = (10.0, 20.0, 30.0, 40.0, 50.0),
                  dead_time_ms: float = 0.67, memory_bytes: int = 128 << 20,
                  shank_ids: Any = None, noise: Any = None) -> np.ndarray:
    """Spikes in whitened [channels, samples] traces.

    Parameters
    ----------
    x : array
        Whitened traces (noise SD 1 per channel), float32 or float64, NumPy or CuPy.
    geometry : array
        [channels, 2] contact positions in µm.
    fs : float
        Sampling rate in Hz.
    templates : array, optional
        [k, taps] temporal templates (odd taps, trough at tap 20 at 30 kHz like the default);
        each is scaled to unit norm. Default: `default_templates(fs)`.
    threshold : float
        In noise SDs of the combined score (> 0): each channel's output of each template is
        divided by its measured noise SD (``noise``) before the channels are combined with
        unit-norm weights, so the score has unit noise whatever the noise spectrum.
    n_neighbors : int
        Channels combined around each position (the nearest, itself included).
    widths_um : tuple of float
        Widths of the Gaussian spatial weights; the best per position and sample is kept.
    dead_time_ms : float
        A spike must be the largest score within ± this time and among the neighbouring
        positions.
    memory_bytes : int
        Bound on the intermediate products (time is processed in blocks).
    shank_ids : array, optional
        [channels] shank of each channel: channels of other shanks are never combined, and
        a spike on one shank does not suppress one on another.
    noise : array, optional
        [channels, k] noise SD of each channel's output of each template (`template_noise`,
        e.g. measured once on a recording's fit chunks). Default: measured on ``x`` itself.

    Returns
    -------
    numpy.ndarray
        `SPIKE_DTYPE`, sorted by sample then channel: ``sample_index`` (the trough),
        ``channel_index`` (the position's channel), ``amplitude`` (the score, in noise SDs),
        ``template_index``, ``x``, ``y`` (the position, µm). Empty (of that dtype) when there
        is no spike.

    Warns
    -----
    UserWarning
        When x does not look whitened (a robust noise SD, the median over channels, outside
        0.5–2).

    Examples
    --------
    Three spikes injected on channels 2–4 (largest on 3) of unit-noise traces:

    >>> import numpy as np
    >>> from dspk.detect import default_templates, detect_spikes
    >>> geom = np.c_[np.zeros(8), 20.0 * np.arange(8)]        # a column, 20 µm pitch
    >>> x = np.random.default_rng(0).standard_normal((8, 3000)).astype(np.float32)
    >>> w = default_templates()[2]
    >>> w = w / -w.min()                                       # trough -1
    >>> for t in (500, 1500, 2500):
    ...     x[2:5, t - 20:t + 41] += np.array([[6.0], [12.0], [6.0]]) * w
    >>> spikes = detect_spikes(x, geom, fs=30000.0)
    >>> spikes[["sample_index", "channel_index"]].tolist()
    [(500, 3), (1500, 3), (2500, 3)]
    >>> spikes["y"], bool(spikes["amplitude"].min() > 7.0)
    (array([60., 60., 60.], dtype=float32), True)
    >>> spikes.dtype.names
    ('sample_index', 'channel_index', 'amplitude', 'template_index', 'x', 'y')
    """
    g, bank = _checks(x, geometry, fs, templates, threshold)
    check_finite(x, "x")
    c, n = x.shape
    if not int(n_neighbors) >= 1:
        raise ValueError(f"n_neighbors: expected at least 1 channel per neighbourhood, got "
                         f"{n_neighbors}")
    if len(widths_um) == 0 or not all(float(v) > 0 for v in widths_um):
        raise ValueError(f"widths_um: expected one or more positive widths in µm, got "
                         f"{tuple(widths_um)}")
    if noise is not None:
        inv_sd = _inverse_noise(noise, c, bank.shape[0])
    sh = None
    if shank_ids is not None:
        sh = np.asarray(to_numpy(shank_ids))
        if sh.shape != (c,):
            raise ValueError(f"shank_ids: expected one shank per channel ({c}), got shape "
                             f"{sh.shape}")
    xp = array_module(x)
    _noise_check(x)
    k, taps = bank.shape
    nbr, w = _neighbourhoods(g, n_neighbors, widths_um, sh)
    dt = x.dtype
    dead = max(1, int(round(dead_time_ms * 1e-3 * fs)))
    reason = "NumPy input" if xp is np else \
        fused_reason(x, k, w.shape[1], nbr.shape[1], dead)
    if reason is None:                                          # CuPy: the fused kernels
        from ._gpu import peaks, scores  # noqa: PLC0415 (GPU-only)

        if noise is None:
            inv_sd = _inverse_noise(_template_noise(x, bank), c, k)

        score, best_k = scores(x, bank.astype(dt), nbr, w.astype(dt), inv_sd, memory_bytes)
        p, t = peaks(score, nbr, threshold, dead)
    elif xp is np:                                              # scored where they can peak
        p, t, amp, tk = _cpu_spikes(x, bank, nbr, w, None if noise is None else inv_sd,
                                    threshold, dead, memory_bytes)
    else:
        log.debug("detect_spikes: engine path on the GPU (%s)", reason)
        score, best_k = _engine_scores(xp, x, bank, nbr, w, None if noise is None else inv_sd,
                                       memory_bytes)
        p, t = (to_numpy(v) for v in _local_maxima(xp, score, xp.asarray(nbr), threshold,
                                                     dead))
    order = np.lexsort((p, t))
    p, t = p[order], t[order]
    if xp is np:
        amp, tk = amp[order], tk[order]
    else:
        amp = to_numpy(score[xp.asarray(p), xp.asarray(t)]) if len(t) else []
        tk = to_numpy(best_k[xp.asarray(p), xp.asarray(t)]) if len(t) else []
    out = np.empty(len(t), dtype=SPIKE_DTYPE)
    shift = taps // 2 - int(round(TROUGH_TAP * fs / 30000.0))   # correlation peak -> trough
    out["sample_index"] = t - shift
    out["channel_index"] = p
    out["amplitude"] = amp
    out["template_index"] = tk
    out["x"], out["y"] = g[p, 0], g[p, 1]
    return out


#: probes whose neighbourhoods the engine keeps (the oldest goes first)
NEIGHBOURHOOD_PROBES = 8


def _neighbourhoods(g: np.ndarray, n_neighbors: int, widths_um: tuple,
                    shanks: np.ndarray | None) -> tuple:
    """(nbr [P, N] the nearest channels of each position (itself first unless another channel
    sits at the same place), w [P, S, N] float64 Gaussian weights of unit norm per width).
    With ``shanks``, only channels of the position's shank (N is at most the smallest shank's
    channel count). Kept with the engine in use (``current_engine().prepared``, dropped by
    ``Engine.forget``) for the last `NEIGHBOURHOOD_PROBES` probes: batch after batch of one
    recording share them (a few ms of host work for 384 channels)."""
    key = (g.tobytes(), g.shape, int(n_neighbors), tuple(float(v) for v in widths_um),
           None if shanks is None else (shanks.tobytes(), shanks.dtype.str))
    store = current_engine().prepared("detect.neighbourhoods", dict)
    hit = store.get(key)
    if hit is None:
        hit = _neighbourhoods_of(g, n_neighbors, widths_um, shanks)
        for a in hit:
            a.setflags(write=False)        # shared between calls: never modified
        for old in list(store)[:max(0, len(store) - NEIGHBOURHOOD_PROBES + 1)]:
            store.pop(old, None)           # (a list of the keys: other threads may insert)
        store[key] = hit
    return hit


def _neighbourhoods_of(g: np.ndarray, n_neighbors: int, widths_um: tuple,
                       shanks: np.ndarray | None) -> tuple:
    c = len(g)
    nn = min(int(n_neighbors), c)
    d2 = probe_sqdist(g)                                        # [positions, channels]
    if shanks is not None:
        d2 = np.where(shanks[:, None] == shanks[None], d2, np.inf)
        nn = min(nn, int(np.bincount(np.unique(shanks, return_inverse=True)[1]).min()))
    nbr = np.argsort(d2, axis=1, kind="stable")[:, :nn]         # positions = channel sites
    widths = np.asarray(widths_um, dtype=np.float64)
    w = np.exp(-np.take_along_axis(d2, nbr, 1)[:, None, :] / (2 * widths[None, :, None] ** 2))
    w = np.nan_to_num(w)
    w /= np.linalg.norm(w, axis=2, keepdims=True)               # [P, S, N], unit norm
    return nbr, w


def _engine_scores(xp: Any, x: Any, bank: np.ndarray, nbr: np.ndarray, w: np.ndarray,
                   inv_sd: np.ndarray | None, memory_bytes: int) -> tuple:
    """(score [P, n], best_k [P, n]) through fir_bank on the whole batch scaled by each
    channel's inverse noise SD per template (None: measured on this fir_bank output), then per
    time block a gather of the neighbours and a batched `dspk.matmul` with the weights: the
    best width, then the best template (max/argmax). The path of CuPy input the fused kernels
    cannot take, and the reference of the CPU path (`_cpu_spikes`, in the tests)."""
    c, n = x.shape
    k = bank.shape[0]
    nn, n_widths = nbr.shape[1], w.shape[1]
    dt = x.dtype
    b = fir_bank(x, bank.astype(dt))                            # [C, k, n]
    if inv_sd is None:
        inv_sd = _inverse_noise(_template_noise(x, bank, b), c, k)
    b *= xp.asarray(inv_sd.astype(dt))[:, :, None]              # unit noise per output
    wd = xp.asarray(w.astype(dt))
    nbr_d = xp.asarray(nbr)
    # the best width and template per position and sample, time block by time block
    per_sample = c * nn * k * dt.itemsize * (1 + n_widths / nn)
    block = max(1, int(memory_bytes // max(1, per_sample)))
    score = xp.empty((c, n), dtype=dt)
    best_k = xp.empty((c, n), dtype=np.int8 if k < 128 else np.int32)
    for t0 in range(0, n, block):
        t1 = min(n, t0 + block)
        gathered = b[nbr_d, :, t0:t1].reshape(c, nn, k * (t1 - t0))   # [P, N, k·tb]
        s = matmul(wd, gathered).reshape(c, n_widths, k, t1 - t0)     # [P, S, k, tb]
        s = s.max(axis=1)                                             # over widths
        best_k[:, t0:t1] = s.argmax(axis=1)
        score[:, t0:t1] = s.max(axis=1)
    return score, best_k


def _local_maxima(xp: Any, score: Any, nbr: Any, threshold: float, dead: int) -> tuple:
    """(positions, samples) where the score is >= threshold and the largest within ±dead
    samples at its own and its neighbouring positions."""
    if xp is np:
        # deferred like every scipy import in dspk: ~0.3 s to import (design: nothing heavy
        # at import time); NumPy input no longer comes here but in the tests (the reference)
        from scipy.ndimage import maximum_filter1d  # noqa: PLC0415
    else:
        from cupyx.scipy.ndimage import maximum_filter1d  # noqa: PLC0415 (CuPy)
    in_time = maximum_filter1d(score, size=2 * dead + 1, axis=1, mode="constant",
                               cval=-np.inf)
    around = in_time.copy()                            # over the neighbouring positions,
    for j in range(1, nbr.shape[1]):                   # one gathered [P, n] at a time
        xp.maximum(around, in_time[nbr[:, j]], out=around)
    keep = (score >= threshold) & (score >= around)
    return xp.nonzero(keep)
