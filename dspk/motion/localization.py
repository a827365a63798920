"""Spike positions for motion estimation.

A detected spike's channel position is quantised to the probe's pitch (20 µm rows on
Neuropixels 1.0), far too coarse for sub-micrometre registration, and a position that sticks
to the channels does worse than noise: a unit whose positions stay on one row while it drifts
adds a stationary peak to the activity raster, which pulls every pairwise shift towards zero.
Two ways to place a spike between the channels:

- ``"grid"`` (the default): the spike's amplitude on each of its nearest channels (the
  projection of each channel's waveform on the main channel's, a matched filter in time) is
  compared with the amplitudes a point source would give at candidate positions around its
  channel (every 2.5 µm along depth within ±30 µm, at the x of the neighbouring columns, four
  distances from the probe; an exponential decay with distance), and the position is the
  average of the best 5 % of candidates weighted by their match (SpikeInterface's
  ``localize_peaks(method="grid_convolution")``, Kilosort 2.5's grid of virtual templates).
- ``"center_of_mass"``: the centre of mass of the squared trough amplitudes
  (SpikeInterface's ``"center_of_mass"`` squared, Kilosort4's ``yweighted``).

Measured on SpikeInterface's drifting ground truth (128 channels, 120 s, ±20 µm zig-zag, 3
seeds, the same spikes, the rigid estimate of `dspk.motion.estimate`): the drift recovered to
0.28–0.42 µm RMS from the grid's positions, 0.29–0.78 µm from the centre of mass (one seed's
pairwise shifts shrunk by 16 %: the stationary-peak effect above), 1.6–8.7 µm from the
channels' positions (SpikeInterface's ``nonrigid_fast_and_accurate``: 0.37–0.46 µm).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..backend import array_module, to_numpy
from ..caches import LRU
from .motion import positions

__all__ = ["localize", "LOCALIZE_METHODS", "LOCALIZE_NEIGHBORS", "TROUGH_WINDOW_MS",
           "GRID_STEP_UM", "GRID_HALF_UM", "GRID_DECAY_UM", "GRID_TOP"]

LOCALIZE_METHODS = ("grid", "center_of_mass")
#: channels per spike (the spike's channel and its nearest)
LOCALIZE_NEIGHBORS = 12
#: the centre of mass's amplitude of a channel: its most negative sample within ± this
TROUGH_WINDOW_MS = 0.15
#: the grid's amplitudes: each channel's waveform within ± this of the trough, projected on
#: the main channel's
PROJECTION_WINDOW_MS = 0.4
#: the grid's candidate positions: every GRID_STEP_UM along depth within ±GRID_HALF_UM of the
#: spike's channel, at the x of its neighbours, at each distance (µm) of GRID_DECAY_UM from
#: the probe, the amplitude decaying as exp(−r / d) with the distance r
GRID_STEP_UM, GRID_HALF_UM, GRID_DECAY_UM = 2.5, 30.0, (10.0, 20.0, 30.0, 50.0)
#: the fraction of the best-matching candidates averaged
GRID_TOP = 0.05
#: spikes per block of the grid's products (bounds the [spikes, candidates, channels] array)
GRID_BLOCK = 4096


def _neighbours(g: np.ndarray, k: int) -> np.ndarray:
    """[channels, k]: each channel, then its nearest (by distance, ties by index)."""
    dist = np.hypot(g[:, None, 0] - g[None, :, 0], g[:, None, 1] - g[None, :, 1])
    dist[np.arange(len(g)), np.arange(len(g))] = -1.0
    return np.argsort(dist, axis=1, kind="stable")[:, :k]


def _gather(x: Any, chans: np.ndarray, t: np.ndarray, half: int) -> Any:
    """x[chans, t + (−half..half)] [spikes, k, 2 half + 1] (samples outside x as 0), where x
    is."""
    xp = array_module(x)
    samples = t[:, None] + np.arange(-half, half + 1)[None, :]
    inside = (samples >= 0) & (samples < x.shape[1])
    clipped = np.clip(samples, 0, x.shape[1] - 1)
    vals = x[xp.asarray(chans)[:, :, None], xp.asarray(clipped)[:, None, :]]
    return xp.where(xp.asarray(inside)[:, None, :], vals, 0)


#: probes whose grids are kept (the oldest goes first)
GRID_PROBES = 4
_GRIDS = LRU(GRID_PROBES)
_GRIDS_LOCK = threading.Lock()


def _grid_of(g: np.ndarray, nbr: np.ndarray) -> tuple:
    """`_grid_profiles`, kept for the last `GRID_PROBES` probes (a pass localises every
    chunk's spikes on the same probe)."""
    key = (g.tobytes(), nbr.tobytes())
    with _GRIDS_LOCK:
        found = _GRIDS.get(key)
        if found is not None:
            return found
    found = _grid_profiles(g, nbr)
    with _GRIDS_LOCK:
        _GRIDS.put(key, found, touch=False)    # (one another thread kept meanwhile: its place)
    return found


def _grid_profiles(g: np.ndarray, nbr: np.ndarray) -> tuple:
    """Per channel, the candidates' depths [channels, m] and their unit-norm amplitude
    profiles on the channel's neighbours [channels, m, k] (float32)."""
    dys = np.arange(-GRID_HALF_UM, GRID_HALF_UM + 1e-9, GRID_STEP_UM)
    c, k = nbr.shape
    xs = [np.unique(g[nbr[i], 0]) for i in range(c)]
    width = max(len(v) for v in xs)
    m = len(GRID_DECAY_UM) * width * len(dys)
    depth = np.empty((c, m))
    prof = np.zeros((c, m, k), np.float64)
    for i in range(c):
        cx = np.resize(xs[i], width)            # (a channel with fewer columns repeats them)
        dz, xx, dy = np.meshgrid(GRID_DECAY_UM, cx, dys, indexing="ij")
        dz, xx, yy = dz.ravel(), xx.ravel(), g[i, 1] + dy.ravel()
        gx, gy = g[nbr[i], 0], g[nbr[i], 1]
        r = np.sqrt((gx[None] - xx[:, None]) ** 2 + (gy[None] - yy[:, None]) ** 2 +
                    dz[:, None] ** 2)
        f = np.exp(-r / dz[:, None])
        prof[i] = f / np.linalg.norm(f, axis=1, keepdims=True)
        depth[i] = yy
    return depth, prof.astype(np.float32)


def localize(x: Any, spikes: Any, geometry: Any, fs: float, method: str = "grid",
             n_neighbors: int = LOCALIZE_NEIGHBORS) -> tuple:
    """The position of each spike along depth (and across), between the channels: by a grid
    of point-source candidates (``"grid"``) or the centre of mass of the squared trough
    amplitudes (``"center_of_mass"``); see the module's notes. Samples outside x count as 0.

    Parameters
    ----------
    x : array
        [channels, samples] traces the spikes were detected in (NumPy or CuPy: the waveforms
        are gathered and the grid's products computed there; only the positions come back).
    spikes : numpy.ndarray or mapping
        ``sample_index`` (the trough, in x's samples) and ``channel_index`` of each spike
        (`dspk.detect_spikes`' result).
    geometry : array-like or probeinterface Probe
        [channels, 2] positions in µm.
    fs : float
        Sampling rate in Hz.
    method : {"grid", "center_of_mass"}
    n_neighbors : int
        Channels per spike (at most the channel count).

    Returns
    -------
    (x_um, y_um, amplitude)
        float64 [spikes] each, NumPy: the position (``"grid"``: x is the spike's channel's)
        and the amplitude on the spike's channel (``"grid"``: its waveform's norm; the centre
        of mass: its trough's depth). A spike without a negative deflection keeps its
        channel's position.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import localize
    >>> geom = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    >>> x = np.zeros((6, 100), np.float32)
    >>> x[2:4, 50] = [-4.0, -4.0]                      # halfway between channels 2 and 3
    >>> spikes = np.array([(50, 2)], dtype=[("sample_index", "i8"), ("channel_index", "i8")])
    >>> localize(x, spikes, geom, 30000.0, method="center_of_mass")
    (array([0.]), array([50.]), array([4.]))
    >>> float(np.round(localize(x, spikes, geom, 30000.0)[1][0], 3))    # the grid: the same
    50.0
    """
    g = positions(geometry)
    if method not in LOCALIZE_METHODS:
        raise ValueError(f"method: expected 'grid' or 'center_of_mass', got {method!r}")
    if getattr(x, "ndim", None) != 2 or x.shape[0] != len(g):
        raise ValueError(f"x: expected [channels, samples] traces of the {len(g)} channels of "
                         f"geometry, got shape {getattr(x, 'shape', None)}")
    if not fs > 0:
        raise ValueError(f"fs: expected a positive sampling rate, got {fs!r}")
    if not n_neighbors >= 1:
        raise ValueError(f"n_neighbors: expected at least 1 channel, got {n_neighbors!r}")
    t = np.asarray(to_numpy(spikes["sample_index"]), np.int64).reshape(-1)
    ch = np.asarray(to_numpy(spikes["channel_index"]), np.int64).reshape(-1)
    if t.shape != ch.shape:
        raise ValueError("spikes: sample_index and channel_index must have one value per spike")
    if ch.size and (ch.min() < 0 or ch.max() >= len(g)):
        raise ValueError(f"spikes: channel_index outside the {len(g)} channels of geometry")
    if t.size == 0:
        empty = np.zeros(0)
        return empty, empty.copy(), empty.copy()
    nbr = _neighbours(g, min(int(n_neighbors), len(g)))
    chans = nbr[ch]                                                      # [spikes, k]
    if method == "center_of_mass":
        half = max(1, int(round(TROUGH_WINDOW_MS * 1e-3 * fs)))
        vals = _gather(x, chans, t, half)
        trough = to_numpy(array_module(x).maximum(-vals.min(axis=2), 0)).astype(np.float64)
        w = trough ** 2
        total = w.sum(axis=1)
        has = total > 0
        safe = np.where(has, total, 1.0)
        pos_x = np.where(has, (w * g[chans, 0]).sum(axis=1) / safe, g[ch, 0])
        pos_y = np.where(has, (w * g[chans, 1]).sum(axis=1) / safe, g[ch, 1])
        return pos_x, pos_y, trough[:, 0]
    return _grid(x, t, ch, chans, g, nbr, fs)


def _grid(x: Any, t: np.ndarray, ch: np.ndarray, chans: np.ndarray, g: np.ndarray,
          nbr: np.ndarray, fs: float) -> tuple:
    xp = array_module(x)
    depth, prof = _grid_of(g, nbr)
    prof_d = xp.asarray(prof)
    half = max(1, int(round(PROJECTION_WINDOW_MS * 1e-3 * fs)))
    m = depth.shape[1]
    top = max(1, int(np.ceil(GRID_TOP * m)))
    pos_y = np.empty(len(t))
    amp = np.empty(len(t))
    for b0 in range(0, len(t), GRID_BLOCK):
        sl = slice(b0, b0 + GRID_BLOCK)
        w = _gather(x, chans[sl], t[sl], half).astype(np.float32)      # [n, k, taps]
        main = w[:, 0, :]
        norm = xp.sqrt((main * main).sum(axis=1))
        unit = main / xp.where(norm > 0, norm, 1)[:, None]
        a = xp.maximum(xp.einsum("nkt,nt->nk", w, unit), 0)             # [n, k]
        scores = xp.einsum("nmk,nk->nm", prof_d[xp.asarray(ch[sl])], a)  # [n, m]
        order = xp.argsort(-scores, axis=1)[:, :top]
        best = xp.maximum(xp.take_along_axis(scores, order, axis=1), 0)
        ys = xp.asarray(depth)[xp.asarray(ch[sl])[:, None], order]
        total = best.sum(axis=1)
        y = to_numpy((best * ys).sum(axis=1) / xp.where(total > 0, total, 1))
        pos_y[sl] = np.where(to_numpy(total) > 0, y, g[ch[sl], 1])
        amp[sl] = to_numpy(norm)
    return g[ch, 0].astype(np.float64), pos_y, amp
