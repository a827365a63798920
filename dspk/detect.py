"""Universal-template spike detection on whitened traces.

Each channel is correlated with a small bank of temporal templates (`dspk.fir_bank`: the
[k, taps]·im2col(x) product without im2col); channels are combined around every position of
the probe with Gaussian spatial weights of several widths (a batched product through
`dspk.matmul`: [widths, neighbours] · [neighbours, templates·time] per position); the best
template and width per position and sample give a score in noise standard deviations; spikes
are the scores above the threshold that are the largest within ±``dead_time`` samples and among
the neighbouring positions.

**The threshold's unit is the measured noise of each template's output.** Whitening makes the
noise of every channel unit-variance, not white: after a 300 Hz high-pass its power sits in
300–6000 Hz, and a unit-norm template passes more of it than of white noise (measured: the
default bank's outputs have noise SDs of 1.5–1.7 on band-limited noise, up to 2.4 on a
1/f-tilted spectrum, 1.0 on white noise, so a threshold in channel SDs gave hundreds of false
spikes per second). Each channel's output of each template is therefore divided by its robust
noise SD, the median absolute output / 0.6745 (`template_noise`), measured on the fit chunks in
a pipeline or on the batch itself in a one-shot call; with unit-norm spatial weights over
channels whose noise is independent, every combined score has unit noise, and the false-alarm
rate of a threshold no longer depends on the spectrum.

Positions are the channel positions (one per channel), so the cost is linear in the channel
count whatever the probe's shape (Kilosort4's regular grid grows with sparse and multi-shank
probes). Intermediates beyond the bank output are bounded by ``memory_bytes``: time (or the
scored windows) is processed in blocks, the [positions, widths, templates, time] tensor never
exists whole.

Three implementations give the same spikes (the first two to the bit; the fused kernels
within float tolerance at threshold ties: a score equal to the threshold or to a neighbour's to
the last bits may go either way):

- CuPy input the fused kernels cannot take: the engine path above (every score: gathered
  neighbours, batched `dspk.matmul`; maxima with ``maximum_filter1d``). It is the reference.
- NumPy input: the same scores (the same products, summed in the same order by the same
  BLAS), computed only where they can reach the threshold. By Cauchy–Schwarz (the weights are
  positive, of unit norm) a score is at most the root of the sum over the neighbours of the
  squared largest positive output over the templates; that bound is taken per window of
  `BOUND_WINDOW` samples (2–4 % of the (position, window) pairs reach the threshold on
  whitened Neuropixels data with ~750 spikes/s), and only those windows are scored. A spike is
  at least the threshold and every score around it, so its maxima are found among the points
  above the threshold alone. The noise of each output is measured in the same pass over the
  bank output, channel block by channel block (`template_noise`'s values).
- CuPy input: fused kernels (dspk/kernels/detect.cu, `dspk._detect_gpu`). `dspk.fir_bank` runs
  on one time block at a time (with ``taps//2`` samples of real data on each side); one kernel
  combines the neighbours with every width and keeps the best width and template per position
  and sample in registers (the [positions, widths, templates, time] tensor is never written,
  nor is the gathered [positions, neighbours, templates, time] one), and a second finds the
  local maxima, testing the window only where the score passes the threshold. The
  [positions, samples] score and best template are all that is kept for the whole batch.
  `dspk._detect_gpu.fused_reason` says when the kernels cannot take the sizes (more than 8
  widths, 64 neighbours or 127 templates, other dtypes).
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

import numpy as np

from ._detect_gpu import fused_reason
from .backend import array_module, to_numpy
from .linalg import MatrixView, current_engine, matmul
from .linalg.host_checks import to_host
from .linalg.threads import blas_threads, parallel_blocks
from .ops import PCA, fir_bank, pairwise_sqdist
from .ops.distance import probe_sqdist
from .ops.fir_cpu import ToeplitzBank

__all__ = ["detect_spikes", "default_templates", "learn_templates", "spike_features",
           "spike_clips", "template_noise", "spikes_to_peaks", "SPIKE_DTYPE", "PEAK_DTYPE",
           "PEAK_LOCATION_DTYPE"]

log = logging.getLogger("dspk.detect")

SPIKE_DTYPE = np.dtype([("sample_index", np.int64), ("channel_index", np.int64),
                        ("amplitude", np.float32), ("template_index", np.int64),
                        ("x", np.float32), ("y", np.float32)])
#: SpikeInterface's peaks (``spikeinterface.core.node_pipeline.base_peak_dtype``, what its
#: ``detect_peaks`` returns and ``NumpySorting.from_peaks``, ``select_peaks`` and its motion
#: estimation take): `spikes_to_peaks` gives them
PEAK_DTYPE = np.dtype([("sample_index", np.int64), ("channel_index", np.int64),
                       ("amplitude", np.float64), ("segment_index", np.int64)])
#: SpikeInterface's ``peak_locations`` (as its ``localize_peaks`` returns them: x, y in µm),
#: row for row with the peaks
PEAK_LOCATION_DTYPE = np.dtype([("x", np.float64), ("y", np.float64)])
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


#: samples per channel the whitening check looks at (a warning needs no more)
NOISE_CHECK_SAMPLES = 2048


def _noise_check(x: Any) -> None:
    """Warn when x is clearly not whitened: the median over channels of a robust noise SD
    (median |x| / 0.6745 on an evenly spaced sample of the batch; whitened data is high-passed,
    so its median is ~0) far from 1."""
    xp = array_module(x)
    n = x.shape[1]
    sub = x[:, ::max(1, n // NOISE_CHECK_SAMPLES)]
    if xp is np:
        per_channel = _host_abs_median(sub)
    else:
        # dspk's prebuilt gather and median kernels (an odd count: the middle value), not
        # cupy.median, whose kernels would be compiled in a first call (4.8 s measured on an
        # H100 with an empty CuPy cache)
        m = sub.shape[1] - (1 - sub.shape[1] % 2)
        rows = MatrixView.of(sub[:, :m]).contiguous().to_array()[0]
        per_channel = to_host(_abs_median(xp, rows))
    sd = float(np.median(per_channel)) / 0.6745
    if not 0.5 <= sd <= 2.0:
        warnings.warn(f"x: the noise SD is {sd:.3g} (median over channels); detection expects "
                      f"whitened data (noise SD 1) and its threshold is in noise SDs",
                      stacklevel=3)


#: the noise of each template's output is measured on this many samples of the batch, evenly
#: spaced (far enough apart to be nearly independent: the SD to a few per cent); odd, so the
#: median is one of them
NOISE_SAMPLES = 8191
#: median |output| / MAD_TO_SD is the SD of Gaussian noise
MAD_TO_SD = 0.6744897501960817
#: the GPU filters the batch for the noise in channel blocks of at most this many bytes
NOISE_BLOCK_BYTES = 128 << 20
#: bisection steps of the GPU's median from [0, max]: the brackets meet (adjacent values, so the
#: result is the middle value itself) within 64 halvings unless max / median > 2^11 (float64)
MEDIAN_BISECTIONS = 64


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
    return _template_noise(x, bank)


def _noise_samples(n: int, taps: int) -> np.ndarray:
    """The samples the noise is measured on: evenly spaced, away from the batch's edges (where
    the filter sees zeros) when the batch is long enough."""
    half = taps // 2
    lo, hi = (half, n - half) if n - 2 * half >= NOISE_SAMPLES else (0, n)
    m = min(NOISE_SAMPLES, hi - lo)
    if m > 1 and m % 2 == 0:
        m -= 1                                    # odd: the median is one of the samples
    return lo + (np.arange(m, dtype=np.int64) * (hi - lo)) // m


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


def _abs_median(xp: Any, a: Any) -> Any:
    """The median of |a| along the last axis (odd length). NumPy's; on the GPU by bisection on
    the value (a count per row and step, `MEDIAN_BISECTIONS` steps, no sort: CuPy's sort of
    2 304 rows of 8 191 took 6.3 ms on an H200), which ends on the middle value itself or its
    float neighbour: in one kernel with each row in shared memory when it fits
    (`dspk._detect_gpu.row_abs_median`), else with CuPy array operations."""
    if xp is np:
        return _host_abs_median(a)
    from ._detect_gpu import RM_MAX_BYTES, row_abs_median  # noqa: PLC0415 (GPU-only)

    if a.shape[-1] * a.itemsize <= RM_MAX_BYTES:             # each row in shared memory
        flat = a.reshape(-1, a.shape[-1])
        return row_abs_median(flat, MEDIAN_BISECTIONS).reshape(a.shape[:-1])
    a = xp.abs(a)
    half = (a.shape[-1] + 1) // 2
    lo = xp.zeros(a.shape[:-1], dtype=a.dtype)
    hi = a.max(axis=-1)
    for _ in range(MEDIAN_BISECTIONS):
        mid = (lo + hi) * a.dtype.type(0.5)
        enough = (a <= mid[..., None]).sum(axis=-1) >= half
        hi = xp.where(enough, mid, hi)
        lo = xp.where(enough, lo, mid)
    return hi


#: rows per block of the host median (blocks run on the engine's threads; a block's keys and
#: values stay in cache)
MEDIAN_BLOCK_ROWS = 24


def _host_abs_median(a: np.ndarray) -> np.ndarray:
    """``np.median(np.abs(a), axis=-1)``, the same values, in blocks of `MEDIAN_BLOCK_ROWS`
    rows on the engine's threads: for rows of odd length the middle value by `_middle_value`
    (a block with a NaN, and even lengths, go to np.median)."""
    m = a.shape[-1]
    flat = a.reshape(-1, m)
    if m % 2 == 0 or flat.shape[0] == 0:
        return np.median(np.abs(a), axis=-1)

    parts = parallel_blocks(lambda r0: _abs_median_rows(flat[r0:r0 + MEDIAN_BLOCK_ROWS]),
                            range(0, flat.shape[0], MEDIAN_BLOCK_ROWS))
    return np.concatenate(parts).reshape(a.shape[:-1])


def _abs_median_rows(a: np.ndarray) -> np.ndarray:
    """The median of |a| of each row of ``a`` [rows, odd m] on the calling thread: the middle
    value by `_middle_value`, or np.median where a row has a NaN (the same values)."""
    v = np.abs(a)
    return np.median(v, axis=-1) if np.isnan(v.max()) else _middle_value(v)


def _middle_value(v: np.ndarray) -> np.ndarray:
    """The middle value of each row of ``v`` [rows, odd m] (non-negative float32/float64, no
    NaN), as np.partition gives it, without its comparisons (its mispredicted branches cost
    ~55 µs per row of 8191): the bits of a non-negative float order like the float, so the
    rows' top 16 bits are sorted (NumPy's stable sort of 16-bit integers is a radix sort), the
    middle row key found, and only the values with that key (a few dozen) sorted in full.
    Measured (one thread, blocks of 24 rows): 2304 rows of 8191, 84–91 ms of CPU against
    120–125 ms for np.partition."""
    mid = v.shape[1] // 2
    bits = v.view(np.uint32 if v.itemsize == 4 else np.uint64)
    key = (bits >> (8 * v.itemsize - 16)).astype(np.uint16)
    ordered = np.sort(key, axis=1, kind="stable")
    middle = ordered[:, mid:mid + 1]
    below = np.count_nonzero(ordered < middle, axis=1)          # values under the middle key
    same = key == middle
    count = np.count_nonzero(same, axis=1)
    width = int(count.max())
    tied = np.full((len(v), width), np.inf, dtype=v.dtype)      # those values, row by row
    tied[np.arange(width) < count[:, None]] = v[same]
    tied.sort(axis=1)
    return tied[np.arange(len(v)), mid - below]


def _inverse_noise(noise: Any, c: int, k: int) -> np.ndarray:
    """1 / noise [C, k] (0 where a channel has no noise: a dead or flat channel adds nothing)."""
    sd = np.asarray(to_numpy(noise), dtype=np.float64)
    if sd.shape != (c, k):
        raise ValueError(f"noise: expected the noise SD of each channel's output of each "
                         f"template, [{c}, {k}], got shape {sd.shape}")
    if not np.all(np.isfinite(sd)) or np.any(sd < 0):
        raise ValueError("noise: expected finite, non-negative noise SDs")
    with np.errstate(divide="ignore"):
        return np.where(sd > 0, 1.0 / sd, 0.0)


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
        from . import _detect_gpu  # noqa: PLC0415 (GPU-only)

        if noise is None:
            inv_sd = _inverse_noise(_template_noise(x, bank), c, k)

        score, best_k = _detect_gpu.scores(x, bank.astype(dt), nbr, w.astype(dt), inv_sd,
                                           memory_bytes)
        p, t = _detect_gpu.peaks(score, nbr, threshold, dead)
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


#: the CPU path tests its bound and computes scores in windows of this many samples
BOUND_WINDOW = 8
#: a window is scored when its bound reaches (1 - BOUND_MARGIN)·threshold²: the bound and the
#: scores round differently (a few float32 ulps), the margin is far above both
BOUND_MARGIN = 1e-3
#: below this threshold the CPU path scores every window (squares of the bound could underflow)
BOUND_MIN_THRESHOLD = 1e-12
#: channels per block of the bound's pass over the bank output (a block stays in cache)
BOUND_ROWS = 4
#: time samples per block of the bound's neighbour sums
BOUND_BLOCK = 4096
#: windows of one position per product member, at least (more when the product would be
#: small enough for the engine to consider a non-BLAS candidate: see `_cpu_spikes`)
MEMBER_WINDOWS = 8
#: windows per product of the second pass of `_cpu_spikes` (the exact outputs again)
WINDOWS_PER_PRODUCT = 4096
#: product members per `dspk.matmul` call, at most (the last call is padded: one shape per
#: probe and bank, tuned once)
MEMBERS_PER_CALL = 256


class _BankBlocks:
    """The bank output of NumPy input channel block by channel block, each block reduced
    while it is in cache (`_cpu_spikes`, `_cpu_noise`): the products of
    `dspk.ops.fir_cpu.ToeplitzBank` into per-thread buffers that are reused, so the
    [C, k, n] output is never written (on 2 cores: 276 MB of new pages and three passes over
    them for 384 x 30 000 float32). Detection calls these products directly rather than
    `dspk.fir_bank`: what is timed here is a product fused with its reduction, not one the
    tuner could time against the bank's other implementations; `toeplitz_gemm` is the bank's
    fastest on the CPU at detection's sizes (6 x 61 taps), and where the tuner chose it the
    bits are those of `dspk.fir_bank`."""

    def __init__(self, x: np.ndarray, bank: np.ndarray):
        self.x = x
        self.c, self.n = x.shape
        self.tb = ToeplitzBank(bank, self.n, x.dtype)
        self.local = threading.local()
        tb = self.tb
        # where the noise samples sit in a block's pieces (interior, head, tail)
        idx = _noise_samples(self.n, tb.taps)
        mid = (idx >= tb.half) & (idx < tb.stop)
        q, r = np.divmod(idx[mid] - tb.half, tb.length)
        self.noise_mid = ((q * tb.k * tb.length + r)[None, :] +
                          (np.arange(tb.k) * tb.length)[:, None]).ravel()   # [k·m_mid] flat
        self.noise_head = idx[idx < tb.half]
        self.noise_tail = idx[idx >= tb.stop] - tb.stop

    def block(self, c0: int, c1: int) -> tuple:
        """(interior [rows, blocks, k, L] in this thread's buffer, head [rows, k, half], tail
        [rows, k, n − stop]) of channels [c0, c1)."""
        tb = self.tb
        buf = getattr(self.local, "buf", None)
        if buf is None or buf.shape[0] < c1 - c0:
            buf = np.empty((c1 - c0, max(tb.blocks, 1), tb.k * tb.length), dtype=self.x.dtype)
            self.local.buf = buf
        for i in range(c1 - c0):
            tb.interior(self.x, c0 + i, buf[i, :tb.blocks])
        inner = buf[:c1 - c0, :tb.blocks].reshape(c1 - c0, tb.blocks, tb.k, tb.length)
        rows = self.x[c0:c1]
        return inner, tb.span(rows, 0, tb.half), tb.span(rows, tb.stop, self.n)

    def noise(self, inner: np.ndarray, head: np.ndarray, tail: np.ndarray) -> np.ndarray:
        """[rows, k] float64 noise SDs of a block (`_template_noise`'s values: the median is
        of the same outputs at the same samples, in another order)."""
        rows, k = head.shape[:2]
        mid = np.take(inner.reshape(rows, -1), self.noise_mid, axis=1)   # (4x faster than
        v = np.concatenate([mid.reshape(rows, k, -1),                    # a 2-D index)
                            head[:, :, self.noise_head], tail[:, :, self.noise_tail]], axis=2)
        sd = _abs_median_rows(v.reshape(rows * k, -1)) if v.shape[2] % 2 else \
            np.median(np.abs(v), axis=-1)
        return sd.reshape(rows, k).astype(np.float64) / MAD_TO_SD


def _cpu_noise(x: np.ndarray, bank: np.ndarray) -> np.ndarray:
    """`_template_noise` of NumPy input: [C, k] noise SDs, the bank computed channel block by
    channel block (`_BankBlocks`) and never written whole."""
    bb = _BankBlocks(np.ascontiguousarray(x), bank)
    rows = max(1, min(BOUND_ROWS, NOISE_BLOCK_BYTES // max(1, bank.shape[0] * x.shape[1]
                                                            * x.itemsize)))
    parts = parallel_blocks(lambda c0: bb.noise(*bb.block(c0, min(bb.c, c0 + rows))),
                            range(0, bb.c, rows))
    return np.concatenate(parts) if parts else np.zeros((0, bank.shape[0]))


def _cpu_spikes(x: np.ndarray, bank: np.ndarray, nbr: np.ndarray, w: np.ndarray,
                inv_sd: np.ndarray | None, threshold: float, dead: int,
                memory_bytes: int) -> tuple:
    """(positions, samples, scores, best templates) of the spikes of NumPy input: the
    scores of `_engine_scores` (bit for bit where its `fir_bank` is the Toeplitz products:
    the same products, summed in the same order by the same BLAS) and the maxima of
    `_local_maxima`, computed only where a score can reach the threshold.

    A score is Σₙ w[p, s, n]·bs[nbr[p, n], k, t] with bs the noise-scaled bank output and
    w ≥ 0 of unit norm, so by Cauchy–Schwarz it is at most √(Σₙ max(0, bs[nbr[p, n], k, t])²)
    ≤ √(Σₙ m[nbr[p, n], t]²) with m = max(0, maxₖ bs), and within a window of `BOUND_WINDOW`
    samples at most √(Σₙ (max over the window of m[nbr[p, n]])²). Only the (position, window)
    pairs where that bound reaches the threshold (2–4 % of them on whitened Neuropixels data
    with ~750 spikes/s) are scored: the windows' bank outputs gathered for the neighbours,
    multiplied by the weights with `dspk.matmul` (``MEMBER_WINDOWS`` windows of one position
    per member). Every other score is below the threshold, and a score below the threshold
    neither is a spike nor suppresses one (a spike is at least the threshold and at least
    every score around it), so the maxima are found among the scored points above the
    threshold alone (`_sparse_maxima`).

    The bank output is never written whole (`_BankBlocks`): a first pass computes it channel
    block by channel block into a buffer that stays in cache and reduces it there to the
    noise (unless given; `_template_noise`'s values), bs = b·(1 / noise) and the window maxima
    of m; a second computes again the exact outputs of the (channel, window) pairs a scored
    pair needs (the neighbours of the scored positions: ~10 % of the pairs), the same
    products by `ToeplitzBank.windows`. The channel blocks, the window blocks of the bound
    and the groups of members run on the engine's threads; each score is computed on its
    own, so neither the blocks (the memory budget) nor the thread count change a bit.
    Memory: the bound per window ([C, n / BOUND_WINDOW], dtype and bool), blocks within
    ``memory_bytes`` per thread, the needed windows' outputs (k·BOUND_WINDOW values each) and
    the points above the threshold (~28 bytes each)."""
    c, n = x.shape
    k = bank.shape[0]
    nn, n_widths = nbr.shape[1], w.shape[1]
    dt = x.dtype
    isz = dt.itemsize
    x = np.ascontiguousarray(x)
    bb = _BankBlocks(x, bank)
    given = inv_sd is not None
    inv_all = inv_sd.astype(dt) if given else np.empty((c, k), dtype=dt)
    wd = w.astype(dt)
    win = min(BOUND_WINDOW, n)
    n_windows = -(-n // win)
    share = max(1, int(memory_bytes) // max(1, blas_threads()))
    limit = dt.type(threshold * threshold * (1 - BOUND_MARGIN))
    prune = threshold >= BOUND_MIN_THRESHOLD
    mw = np.empty((c, n_windows), dtype=dt)        # per channel and window: max(0, bs)²
    tb = bb.tb
    half, stop = tb.half, tb.stop

    def peaks(c0: int) -> None:
        """Channels [c0, c0 + rows): their bank output (`_BankBlocks.block`), its noise
        (unless given), bs = b·(1 / noise) (as _engine_scores), and the largest max(0, bs) of
        each window over the templates, squared, into mw."""
        c1 = min(c, c0 + rows)
        inner, head, tail = bb.block(c0, c1)
        if not given:
            inv_all[c0:c1] = _inverse_noise(bb.noise(inner, head, tail), c1 - c0,
                                            k).astype(dt)    # (raises as before on NaN)
        inv = inv_all[c0:c1]
        np.multiply(inner, inv[:, None, :, None], out=inner)
        np.multiply(head, inv[:, :, None], out=head)
        np.multiply(tail, inv[:, :, None], out=tail)
        m = getattr(bb.local, "m", None)
        if m is None or m.shape[0] < c1 - c0:
            m = bb.local.m = np.zeros((c1 - c0, n_windows * win), dtype=dt)  # zeros pad
        m = m[:c1 - c0]                                                      # the last window
        mi = m[:, half:stop].reshape(c1 - c0, tb.blocks, tb.length)
        if k == 1:
            mi[...] = inner[:, :, 0]
        else:                                      # (a chain of maxima: faster than a
            np.maximum(inner[:, :, 0], inner[:, :, 1], out=mi)   # reduction over a short
            for j in range(2, k):                                # middle axis)
                np.maximum(mi, inner[:, :, j], out=mi)
        np.max(head, axis=1, out=m[:, :half])
        np.max(tail, axis=1, out=m[:, stop:n])
        np.maximum(m, 0, out=m)
        o = mw[c0:c1]
        np.maximum(m[:, 0::win], m[:, 1::win] if win > 1 else m[:, 0::win], out=o)
        for j in range(2, win):                    # (faster than a max over an axis of
            np.maximum(o, m[:, j::win], out=o)     # `win` elements)
        np.multiply(o, o, out=o)

    # channels in blocks of a few whole rows (their bank output stays in cache)
    rows = max(1, min(BOUND_ROWS, share // max(1, (k * n + n_windows * win + k * NOISE_SAMPLES)
                                                  * isz)))
    parallel_blocks(peaks, range(0, c, rows))
    block = max(1, min(BOUND_BLOCK // win, share // max(1, 2 * c * isz)))
    active = np.ones((c, n_windows), dtype=bool)   # (position, window) may reach threshold

    def bound(w0: int) -> None:
        """The bound of windows [w0, w0 + block) (NaN passes: scored as before)."""
        part = mw[:, w0:w0 + block]
        e = part[nbr[:, 0]]
        for j in range(1, nn):
            e += part[nbr[:, j]]
        np.logical_not(e < limit, out=active[:, w0:w0 + block])

    if prune:
        parallel_blocks(bound, range(0, n_windows, block))
    pos, wi = np.nonzero(active)                   # by position, then window
    # the (channel, window) pairs a scored pair needs: its neighbours' windows, computed again
    # (the same products), scaled as in the first pass; row `len(need)` is zeros (empty slots)
    needed = np.zeros(c * n_windows, dtype=bool)
    needed[(nbr[pos] * n_windows + wi[:, None]).ravel()] = True
    need = np.flatnonzero(needed)
    lookup = np.full(c * n_windows, len(need), dtype=np.int64)
    lookup[need] = np.arange(len(need))
    exact = np.zeros((len(need) + 1, k, win), dtype=dt)
    need_ch, need_start = need // n_windows, np.minimum((need % n_windows) * win, n - win)
    chunk = max(1, min(WINDOWS_PER_PRODUCT, share // max(1, (2 * k + 1) * (win + tb.taps)
                                                         * isz)))

    def recompute(j0: int) -> None:
        ch = need_ch[j0:j0 + chunk]
        e = tb.windows(x, ch, need_start[j0:j0 + chunk], win)
        np.multiply(e, inv_all[ch][:, :, None], out=exact[j0:j0 + len(ch)])

    parallel_blocks(recompute, range(0, len(need), chunk))
    # members: `per` window slots of one position; a product of fewer than 4097 multiply-adds
    # per member could go to the engine's einsum candidate (other roundings), so never fewer
    per = max(MEMBER_WINDOWS, -(-4097 // (n_widths * nn * k * win)))
    counts = np.bincount(pos, minlength=c)
    members_of = -(-counts // per)
    first_slot = (np.cumsum(members_of) - members_of) * per
    first_win = np.cumsum(counts) - counts
    size = (nn + n_widths + 2) * per * k * win * isz            # bytes per member, about
    mb = max(1, min(MEMBERS_PER_CALL, share // max(1, size)))   # members per product
    total = -(-int(members_of.sum()) // mb) * mb                # padded: one shape
    member_pos = np.zeros(total, dtype=np.int64)
    member_pos[:members_of.sum()] = np.repeat(np.arange(c), members_of)
    slot_win = np.full(total * per, -1, dtype=np.int64)         # -1: an empty slot
    slot_win[first_slot[pos] + np.arange(len(pos)) - first_win[pos]] = wi
    offsets = np.arange(win)

    def score(m0: int) -> tuple:
        """(positions, samples, scores, templates) above the threshold in members
        [m0, m0 + mb)."""
        mp = member_pos[m0:m0 + mb]
        sw = slot_win[m0 * per:(m0 + mb) * per]
        start = np.where(sw >= 0, np.minimum(sw * win, n - win), 0)    # the last: shifted
        key = nbr[mp][:, :, None] * n_windows + sw.reshape(mb, 1, per)
        g = exact[np.where(sw.reshape(mb, 1, per) >= 0, lookup[key], len(need))]
        s = matmul(wd[mp], g.reshape(mb, nn, per * k * win))           # [mb, S, per·k·win]
        top = s[:, 0].copy()
        for j in range(1, n_widths):                                   # the best width
            np.maximum(top, s[:, j], out=top)
        s = top.reshape(mb, per, k, win)
        top = s[:, :, 0].copy()                                        # the best template:
        best = np.zeros(top.shape, dtype=np.int64)                     # the first of equals,
        for j in range(1, k):                                          # as argmax (a chain of
            v = s[:, :, j]                                             # maxima is faster than
            best[v > top] = j                                          # reductions over short
            np.maximum(top, v, out=top)                                # axes)
        top, best = top.reshape(-1, win), best.reshape(-1, win)        # [slots, win]
        t = start[:, None] + offsets
        hit = (top >= threshold) & (sw[:, None] >= 0) & (t >= sw[:, None] * win)
        slot, col = np.nonzero(hit)
        return mp[slot // per], t[slot, col], top[slot, col], best[slot, col]

    parts = parallel_blocks(score, range(0, total, mb))
    if not parts:
        none = np.zeros(0, np.int64)
        return none, none, np.zeros(0, dt), none
    p, t, s, best = (np.concatenate(v) for v in zip(*parts))
    keep = _sparse_maxima(p, t, s, nbr, dead, n)
    return p[keep], t[keep], s[keep], best[keep]


def _sparse_maxima(p: np.ndarray, t: np.ndarray, s: np.ndarray, nbr: np.ndarray, dead: int,
                   n: int) -> np.ndarray:
    """Which of the points (p, t) of score s (every score >= the threshold; any other score
    is lower) are `_local_maxima`: at least every score within ±dead samples at p and at the
    positions ``nbr[p, 1:]``. A point below the next or the previous sample of its position
    is none; the others are compared with the window maxima of a sparse table over the points
    sorted by (position, sample): first their own position's, then the neighbours'."""
    m = len(s)
    keep = np.zeros(m, dtype=bool)
    if m == 0:
        return keep
    stride = n + 2 * dead + 1                      # a position's keys never reach the next's
    key = p * stride + (t + dead)
    order = None
    if np.any(key[1:] <= key[:-1]):                # (`_cpu_spikes` gives them sorted)
        order = np.argsort(key)
        key, s = key[order], s[order]
    adjacent = key[1:] == key[:-1] + 1
    cand = np.ones(m, dtype=bool)
    cand[1:] &= ~(adjacent & (s[:-1] > s[1:]))
    cand[:-1] &= ~(adjacent & (s[1:] > s[:-1]))
    levels = [s]                                   # levels[i][j] = max(s[j:j + 2**i])
    while 2 << (len(levels) - 1) <= min(m, 2 * dead + 1):
        half = 1 << (len(levels) - 1)
        levels.append(np.maximum(levels[-1][:-half], levels[-1][half:]))

    def window_max(centre: np.ndarray) -> np.ndarray:
        lo = np.searchsorted(key, centre - dead, "left")
        hi = np.searchsorted(key, centre + dead, "right")
        out = np.full(len(centre), -np.inf, dtype=s.dtype)
        length = hi - lo
        level = np.frexp(length)[1] - 1                          # floor(log2(length))
        for i in np.unique(level[length > 0]):
            at = np.flatnonzero((length > 0) & (level == i))
            out[at] = np.maximum(levels[i][lo[at]], levels[i][hi[at] - (1 << int(i))])
        return out

    at = np.flatnonzero(cand)
    around = window_max(key[at])                   # its own position (itself included)
    up = s[at] >= around
    at, around = at[up], around[up]
    ps, ts = key[at] // stride, key[at] % stride
    for j in range(1, nbr.shape[1]):
        np.maximum(around, window_max(nbr[ps, j] * stride + ts), out=around)
    keep[at if order is None else order[at]] = s[at] >= around
    return keep


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


def spike_clips(x: Any, spikes: np.ndarray, geometry: np.ndarray, fs: float,
                n_neighbors: int = 10) -> tuple:
    """(clips float32 [n_spikes, n_neighbors, taps] on the host, channels [n_spikes,
    n_neighbors]): each spike's waveform (2 ms, trough at 2/3 ms, zero outside x) on the
    channels nearest its channel, gathered where x is (only the clips are transferred).

    Parameters
    ----------
    x : array
        [channels, samples] traces (NumPy or CuPy).
    spikes : numpy.ndarray
        With fields ``sample_index`` (the trough) and ``channel_index`` (`detect_spikes`).
    geometry : numpy.ndarray
        [channels, 2] float64 contact positions in µm (a NumPy array: its bytes key a cache).
    fs : float
        Sampling rate in Hz (the clip is round(2 ms · fs) taps, made odd).
    n_neighbors : int
        Channels per clip: the spike's channel, then the nearest others (at most all).

    Returns
    -------
    (clips, channels)
        float32 [n_spikes, n_neighbors, taps] and the channels of each clip's rows, int64
        [n_spikes, n_neighbors].

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.detect import spike_clips
    >>> geom = np.c_[np.zeros(8), 20.0 * np.arange(8)]
    >>> x = np.zeros((8, 3000), dtype=np.float32)
    >>> x[3, 500] = -5.0
    >>> spikes = np.array([(500, 3)], dtype=[("sample_index", "i8"), ("channel_index", "i8")])
    >>> clips, channels = spike_clips(x, spikes, geom, 30000.0, n_neighbors=3)
    >>> clips.shape, channels.tolist()
    ((1, 3, 61), [[3, 2, 4]])
    >>> int(clips[0, 0].argmin()), float(clips[0, 0].min())    # the trough at tap 20
    (20, -5.0)
    """
    geometry = np.asarray(to_numpy(geometry), dtype=np.float64)
    nbr = _neighbourhoods(geometry, n_neighbors, (), None)[0]   # no weights; cached per probe
    nn = nbr.shape[1]
    chans = nbr[np.asarray(spikes["channel_index"], dtype=np.int64)].reshape(-1, nn)
    clips = to_numpy(_clips(x, chans, np.asarray(spikes["sample_index"], dtype=np.int64),
                            fs))
    return clips, chans


def spike_features(x: Any, spikes: np.ndarray, geometry: Any, fs: float,
                   pca: PCA | None = None, n_components: int = 3,
                   n_neighbors: int = 10) -> tuple:
    """PCA features of every spike on its neighbouring channels.

    The waveform of each spike (2 ms, trough at 2/3 ms) on the ``n_neighbors`` channels
    nearest its channel is projected on temporal principal components (`dspk.PCA`, fitted on
    these waveforms unless ``pca`` is given): [n_spikes, n_neighbors, n_components].

    Parameters
    ----------
    x : array
        [channels, samples] traces, those the spikes were detected in (NumPy or CuPy).
    spikes : numpy.ndarray
        `detect_spikes`' result (``sample_index`` and ``channel_index`` are used).
    geometry : array
        [channels, 2] contact positions in µm.
    fs : float
        Sampling rate in Hz.
    pca : dspk.PCA, optional
        A fitted PCA to project on (its taps must match the clips'); default: one fitted here.
    n_components : int
        Components of the PCA fitted here (ignored with ``pca``).
    n_neighbors : int
        Channels per spike (see `spike_clips`).

    Returns
    -------
    (features, channels, pca)
        features float32 [n_spikes, n_neighbors, n_components]; the neighbour channels of each
        spike [n_spikes, n_neighbors]; the PCA used.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.detect import default_templates, detect_spikes, spike_features
    >>> geom = np.c_[np.zeros(8), 20.0 * np.arange(8)]
    >>> x = np.random.default_rng(0).standard_normal((8, 3000)).astype(np.float32)
    >>> w = default_templates()[2]
    >>> for t in (500, 1500, 2500):
    ...     x[2:5, t - 20:t + 41] += np.array([[6.0], [12.0], [6.0]]) * w / -w.min()
    >>> spikes = detect_spikes(x, geom, 30000.0)
    >>> feats, channels, pca = spike_features(x, spikes, geom, 30000.0, n_components=2,
    ...                                       n_neighbors=3)
    >>> feats.shape, feats.dtype, channels.tolist()
    ((3, 3, 2), dtype('float32'), [[3, 2, 4], [3, 2, 4], [3, 2, 4]])
    >>> again, _, _ = spike_features(x, spikes, geom, 30000.0, pca=pca, n_neighbors=3)
    >>> bool(np.array_equal(again, feats))                   # the same PCA, given
    True
    """
    g = np.asarray(to_numpy(geometry), dtype=np.float64)
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"x: expected [channels, samples], got shape "
                         f"{getattr(x, 'shape', None)}")
    if g.shape != (x.shape[0], 2):
        raise ValueError(f"geometry: expected [{x.shape[0]}, 2] positions in µm, got shape "
                         f"{g.shape}")
    clips, chans = spike_clips(x, spikes, g, fs, n_neighbors)
    nn = chans.shape[1]
    if pca is None:
        if len(spikes) * nn <= n_components:
            raise ValueError(f"spikes: {len(spikes)} spikes are too few for {n_components} "
                             f"components")
        pca = PCA(n_components).fit(clips)
    feats = pca.transform(clips)
    return np.asarray(feats, dtype=np.float32), chans, pca


def spikes_to_peaks(spikes: np.ndarray, traces: Any = None, start: int = 0,
                    segment_index: int = 0) -> tuple:
    """Spikes (`SPIKE_DTYPE`) as SpikeInterface's peaks and peak locations.

    dspk's spikes carry the detection score as ``amplitude`` (positive, in noise SDs of the
    combined template output) and the detecting channel's position as ``x``, ``y`` inside the
    array; SpikeInterface's peaks (`PEAK_DTYPE`) carry the signed trace value at the peak
    as ``amplitude`` (float64), a ``segment_index``, and keep the locations in a separate
    array (`PEAK_LOCATION_DTYPE`). With ``traces`` (the traces the spikes were detected in,
    or any block of them) the amplitude is the trace's value at each spike's trough on its
    channel — what SpikeInterface's ``detect_peaks`` reports; without them it is the score
    negated (the templates are troughs, so a spike's trace value is negative; the magnitude
    is then in noise SDs of the score, not of the trace).

    Parameters
    ----------
    spikes : numpy.ndarray
        `SPIKE_DTYPE` (`detect_spikes`, or the ``/spikes`` of a dspk output); ``x`` and ``y``
        are optional (the locations are then NaN).
    traces : array [channels, samples], optional
        NumPy or CuPy (only the spikes' samples are moved to the host); its column 0 is
        sample ``start``.
    start : int
        The sample of ``traces[:, 0]`` (for a block of a longer recording).
    segment_index : int
        The SpikeInterface segment the spikes belong to (≥ 0).

    Returns
    -------
    (peaks, locations)
        `PEAK_DTYPE` and `PEAK_LOCATION_DTYPE` arrays, row for row, in the spikes' order
        (by sample, as SpikeInterface's are).

    Raises
    ------
    ValueError
        Spikes without ``sample_index``, ``channel_index`` or ``amplitude``; a spike outside
        ``traces``; a negative ``segment_index``.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.detect import SPIKE_DTYPE, spikes_to_peaks
    >>> spikes = np.zeros(2, SPIKE_DTYPE)
    >>> spikes["sample_index"], spikes["channel_index"] = [10, 25], [1, 0]
    >>> spikes["amplitude"], spikes["y"] = [9.5, 8.0], [20.0, 0.0]
    >>> x = np.zeros((2, 100), np.float32)
    >>> x[1, 10], x[0, 25] = -41.5, -30.0
    >>> peaks, locations = spikes_to_peaks(spikes, x)
    >>> peaks.tolist(), locations["y"].tolist()
    ([(10, 1, -41.5, 0), (25, 0, -30.0, 0)], [20.0, 0.0])
    >>> spikes_to_peaks(spikes)[0]["amplitude"].tolist()        # without traces: -score
    [-9.5, -8.0]
    """
    names = getattr(getattr(spikes, "dtype", None), "names", None) or ()
    missing = [k for k in ("sample_index", "channel_index", "amplitude") if k not in names]
    if missing:
        raise ValueError(f"spikes: expected a structured array with sample_index, "
                         f"channel_index and amplitude (SPIKE_DTYPE), missing {missing}")
    if int(segment_index) < 0:
        raise ValueError(f"segment_index: expected a segment index >= 0, got {segment_index}")
    t = np.asarray(spikes["sample_index"], dtype=np.int64)
    ch = np.asarray(spikes["channel_index"], dtype=np.int64)
    peaks = np.zeros(len(t), dtype=PEAK_DTYPE)
    peaks["sample_index"], peaks["channel_index"] = t, ch
    peaks["segment_index"] = int(segment_index)
    if traces is None:
        peaks["amplitude"] = -np.asarray(spikes["amplitude"], dtype=np.float64)
    else:
        if getattr(traces, "ndim", None) != 2:
            raise ValueError(f"traces: expected [channels, samples], got shape "
                             f"{getattr(traces, 'shape', None)}")
        c, n = traces.shape
        at = t - int(start)
        outside = (at < 0) | (at >= n) | (ch < 0) | (ch >= c)
        if outside.any():
            k = int(np.flatnonzero(outside)[0])
            raise ValueError(f"traces: spike {k} (sample {t[k]}, channel {ch[k]}) is outside "
                             f"the traces' samples {start}..{int(start) + n - 1} and "
                             f"channels 0..{c - 1}")
        if len(t):
            xp = array_module(traces)
            values = traces[xp.asarray(ch), xp.asarray(at)]
            peaks["amplitude"] = to_numpy(values).astype(np.float64)
    locations = np.full(len(t), np.nan, dtype=PEAK_LOCATION_DTYPE)
    for key in ("x", "y"):
        if key in names:
            locations[key] = spikes[key]
    return peaks, locations
