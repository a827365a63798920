"""Spike positions for motion estimation: the centre of mass of each spike's squared trough
amplitudes on the channels nearest its channel.

A detected spike's channel position is quantised to the probe's pitch (20 µm rows on
Neuropixels 1.0), too coarse for sub-micrometre registration. The centre of mass of the
amplitudes (SpikeInterface's ``localize_peaks(method="center_of_mass")``, Kilosort4's
``yweighted``) moves continuously with the unit; squaring the amplitudes weights the channels
nearest the unit most (a plain centre of mass is pulled towards the middle of the
neighbourhood). On SpikeInterface's drifting ground truth (128 channels, ±20 µm zig-zag) the
registration of these positions recovered the drift to 0.3–0.45 µm RMS, against 1.6 µm with the
channel positions and 0.6–1.1 µm with unsquared amplitudes (benchmarks/bench_motion.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import array_module, to_numpy
from .motion import positions

__all__ = ["localize", "LOCALIZE_NEIGHBORS", "TROUGH_WINDOW_MS"]

#: channels per spike in the centre of mass (the spike's channel and its nearest)
LOCALIZE_NEIGHBORS = 12
#: each channel's amplitude: its most negative sample within ± this of the spike's trough
TROUGH_WINDOW_MS = 0.15


def localize(x: Any, spikes: Any, geometry: Any, fs: float,
             n_neighbors: int = LOCALIZE_NEIGHBORS, power: float = 2.0) -> tuple:
    """The position of each spike: the centre of mass of ``max(0, −trough)^power`` over the
    ``n_neighbors`` channels nearest its channel, each channel's trough its most negative
    sample within ±`TROUGH_WINDOW_MS` of the spike's sample (samples outside x count as 0).

    Parameters
    ----------
    x : array
        [channels, samples] traces the spikes were detected in (NumPy or CuPy: the amplitudes
        are gathered there; only they are transferred).
    spikes : numpy.ndarray or mapping
        ``sample_index`` (the trough, in x's samples) and ``channel_index`` of each spike
        (`dspk.detect_spikes`' result).
    geometry : array-like or probeinterface Probe
        [channels, 2] positions in µm.
    fs : float
        Sampling rate in Hz.
    n_neighbors : int
        Channels per spike (at most the channel count).
    power : float
        The amplitudes' exponent (1: SpikeInterface's centre of mass).

    Returns
    -------
    (x_um, y_um, amplitude)
        float64 [spikes] each, NumPy: the position, and the trough's depth (positive) on the
        spike's channel. A spike without a negative sample around it keeps its channel's
        position.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import localize
    >>> geom = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    >>> x = np.zeros((6, 100), np.float32)
    >>> x[2:4, 50] = [-4.0, -4.0]                      # halfway between channels 2 and 3
    >>> spikes = np.array([(50, 2)], dtype=[("sample_index", "i8"), ("channel_index", "i8")])
    >>> localize(x, spikes, geom, 30000.0)
    (array([0.]), array([50.]), array([4.]))
    """
    g = positions(geometry)
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
    xp = array_module(x)
    k = min(int(n_neighbors), len(g))
    dist = np.hypot(g[:, None, 0] - g[None, :, 0], g[:, None, 1] - g[None, :, 1])
    dist[np.arange(len(g)), np.arange(len(g))] = -1.0       # itself first
    nbr = np.argsort(dist, axis=1, kind="stable")[:, :k]    # [channels, k]
    half = max(1, int(round(TROUGH_WINDOW_MS * 1e-3 * fs)))
    offsets = np.arange(-half, half + 1)
    chans = nbr[ch]                                          # [spikes, k]
    samples = t[:, None] + offsets[None, :]                  # [spikes, m]
    inside = (samples >= 0) & (samples < x.shape[1])
    clipped = np.clip(samples, 0, x.shape[1] - 1)
    vals = x[xp.asarray(chans)[:, :, None], xp.asarray(clipped)[:, None, :]]   # [spikes, k, m]
    vals = xp.where(xp.asarray(inside)[:, None, :], vals, 0)
    trough = to_numpy(xp.maximum(-vals.min(axis=2), 0)).astype(np.float64)     # [spikes, k]
    w = trough ** power
    total = w.sum(axis=1)
    has = total > 0
    safe = np.where(has, total, 1.0)
    pos_x = np.where(has, (w * g[chans, 0]).sum(axis=1) / safe, g[ch, 0])
    pos_y = np.where(has, (w * g[chans, 1]).sum(axis=1) / safe, g[ch, 1])
    return pos_x, pos_y, trough[:, 0]
