"""`estimate`: the drift of a recording from its spikes (times, depths, amplitudes), by
DREDge's decentralised registration (`dspk.motion.registration`), per shank."""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import numpy as np

from ..argnames import arg
from ..backend import array_module, to_numpy
from .motion import Motion, MotionError, positions, shank_labels
from .registration import (PAIRWISE_MEMORY_BYTES, activity_raster, pairwise_displacement,
                           registration_weights, solve_displacement, spatial_windows)

__all__ = ["estimate", "MIN_SPIKES_PER_BIN"]

log = logging.getLogger("dspk.motion")

#: the fewest spikes per time bin (on average, per shank) a motion is estimated from; a
#: non-rigid window needs as many in its own bins, or the shank's motion is estimated rigid
MIN_SPIKES_PER_BIN = 20


def _field(spikes: Any, name: str) -> Any:
    try:
        return spikes[name]
    except (KeyError, ValueError, IndexError):
        return None


def _spike_columns(spikes: Any, fs: float | None) -> tuple:
    """(times_s, depths_um, amplitudes, channels or None, x or None) of the spikes: a
    structured array or a mapping of 1-D arrays (NumPy or CuPy)."""
    names = getattr(getattr(spikes, "dtype", None), "names", None)
    if names is None and not hasattr(spikes, "keys"):
        raise TypeError(f"spikes: expected a structured array or a mapping of arrays "
                        f"(sample_index or time_s, y, amplitude), got {type(spikes).__name__}")
    y = _field(spikes, "y")
    if y is None:
        raise MotionError("spikes: no 'y' (each spike's depth in µm: dspk.detect_spikes gives "
                          "it, dspk.motion.localize refines it)")
    xp = array_module(y)
    times = _field(spikes, "time_s")
    if times is None:
        samples = _field(spikes, "sample_index")
        if samples is None:
            raise MotionError("spikes: no 'sample_index' nor 'time_s' (each spike's time)")
        if fs is None or not fs > 0:
            raise MotionError(f"fs: the spikes' times are sample indices: pass the sampling "
                              f"rate ({arg('fs')}<Hz>)")
        times = xp.asarray(samples, dtype=np.float64) / float(fs)
    amp = _field(spikes, "amplitude")
    if amp is None:
        amp = xp.ones(y.shape, dtype=np.float64)
    return (xp.asarray(times, dtype=np.float64), xp.asarray(y, dtype=np.float64),
            xp.asarray(amp, dtype=np.float64), _field(spikes, "channel_index"),
            _field(spikes, "x"))


def _spike_shanks(channels: Any, xs: Any, g: np.ndarray, shanks: np.ndarray, n: int) -> Any:
    """The shank of each spike: its channel's, else that of the channel nearest its x."""
    if channels is not None:
        return shanks[np.asarray(to_numpy(channels), np.int64)]
    if xs is not None:
        x = np.asarray(to_numpy(xs), np.float64)
        order = np.argsort(g[:, 0], kind="stable")
        at = np.clip(np.searchsorted(g[order, 0], x), 1, len(order) - 1)
        left, right = order[at - 1], order[at]
        nearest = np.where(np.abs(g[left, 0] - x) <= np.abs(g[right, 0] - x), left, right)
        return shanks[nearest]
    if len(np.unique(shanks)) > 1:
        raise MotionError("spikes: a multi-shank probe needs each spike's 'channel_index' "
                          "(or 'x') to tell its shank")
    return np.zeros(n, np.int64)


#: the spikes a non-rigid window should hold per time bin (the default windows' width): the
#: best fixed widths on two probes of 6x different spike densities both held ~300
#: (`estimate`'s ``win_scale_um``)
WINDOW_SPIKES_PER_BIN = 300.0
#: the default windows' narrowest and widest SD (µm): 50 µm is 2.5 rows of an NP1.0 probe;
#: beyond 600 µm the error on a depth gradient grew again (0.84 µm RMS at 600, 0.97 at 800)
WINDOW_MIN_UM, WINDOW_MAX_UM = 50.0, 600.0


def window_scale(n_spikes: int, n_bins: int, extent_um: float) -> float:
    """The default non-rigid windows' SD (µm) for a shank: the width whose Gaussian window
    (effective length √(2π)·SD) holds `WINDOW_SPIKES_PER_BIN` of the shank's spikes per time
    bin, at their mean density along its ``extent_um``, within [`WINDOW_MIN_UM`,
    `WINDOW_MAX_UM`].

    Parameters
    ----------
    n_spikes : int
        The shank's spikes.
    n_bins : int
        The estimate's time bins.
    extent_um : float
        The shank's extent along depth (µm).

    Returns
    -------
    float
        The windows' SD (µm); `estimate` spaces them as far apart by default.

    Examples
    --------
    >>> from dspk.motion.estimation import window_scale
    >>> round(window_scale(140_000, 150, 3840.0))    # NP1.0, 100 units, 300 s
    492
    >>> round(window_scale(53_000, 60, 630.0))       # 128 channels, 100 units, 120 s
    85
    """
    density = n_spikes / (max(n_bins, 1) * max(extent_um, 1e-9))     # spikes / (µm · bin)
    if density <= 0:
        return WINDOW_MAX_UM
    width = WINDOW_SPIKES_PER_BIN / (math.sqrt(2.0 * math.pi) * density)
    return float(min(max(width, WINDOW_MIN_UM), WINDOW_MAX_UM))


def estimate(spikes: Any, geometry: Any, duration_s: float, *, fs: float | None = None,
             rigid: bool = False, bin_s: float = 2.0, bin_um: float = 1.0,
             max_disp_um: float = 100.0, win_step_um: float | None = None,
             win_scale_um: float | None = None, time_horizon_s: float | None = 1000.0,
             mincorr: float = 0.1, lambda_t: float = 1.0, lambda_s: float = 1.0,
             smooth_um: float = 1.0, weights: str = "count",
             robust_iterations: int = 3, shank_ids: Any = None,
             min_spikes_per_bin: int = MIN_SPIKES_PER_BIN,
             memory_bytes: int = PAIRWISE_MEMORY_BYTES) -> Motion:
    """The drift of a recording from its spikes, by DREDge's decentralised registration
    (Windolf et al. 2023; SpikeInterface's ``estimate_motion(method="dredge_ap")``), per shank:
    the spikes' activity raster (`activity_raster`: time bins of ``bin_s``, depth bins of
    ``bin_um``), every pair of time bins within ``time_horizon_s`` cross-correlated along depth
    (`pairwise_displacement`, products on dspk's engine) in one window (rigid) or in
    overlapping Gaussian windows along depth (non-rigid, `spatial_windows`), and the
    displacement of each bin solved from those pairwise shifts (`solve_displacement`: weighted,
    robust least squares with temporal and spatial priors).

    NumPy or CuPy spike columns: the raster, the correlations and the solve (a [time bins,
    time bins] system per window) run where they are (CuPy: on the GPU).

    Parameters
    ----------
    spikes : numpy.ndarray or mapping
        One row per spike: ``y`` (depth, µm: `dspk.motion.localize` gives a continuous one),
        ``sample_index`` (with ``fs``) or ``time_s``, ``amplitude`` (default 1), and on a
        multi-shank probe ``channel_index`` (or ``x``) for the spike's shank. A structured
        array (`dspk.detect_spikes`' result) or a dict of 1-D arrays (NumPy or CuPy).
    geometry : array-like or probeinterface Probe
        [channels, 2] positions (µm) of the probe: its extent along depth, its shanks.
    duration_s : float
        The recording's duration: the time bins cover [0, duration_s).
    fs : float, optional
        Sampling rate (Hz) of ``sample_index``.
    rigid : bool
        One displacement per time bin (and shank), or one per window along depth.
    bin_s, bin_um : float
        The raster's time and depth bins.
    max_disp_um : float
        The largest shift between two time bins looked for (µm).
    win_step_um, win_scale_um : float, optional
        Non-rigid windows' spacing and Gaussian SD (µm). By default both are chosen per shank
        from its spikes (`window_scale`): wide enough that a window holds
        `WINDOW_SPIKES_PER_BIN` spikes per time bin, within [`WINDOW_MIN_UM`,
        `WINDOW_MAX_UM`]. No fixed width served both probes measured
        (SpikeInterface's drifting ground truth; error against the true displacement, µm RMS):
        on 128 channels (630 µm, 100 units, ~1.4 spikes per µm per bin) windows of 100 µm
        left 0.39 (non-rigid gradient) where 300 µm left 1.43; on an NP1.0 probe (384
        channels, 3840 µm, 100 units, ~0.24 spikes per µm per bin, 300 s) windows of 100 µm
        left 2.79 (non-rigid) and 3.08 (rigid drift) where 490 µm left 0.87 and 1.06. Both
        best widths hold ~300 spikes per window and time bin.
    time_horizon_s : float, optional
        Pairs of time bins further apart are not compared (None: all pairs).
    mincorr : float
        Pairs that correlate less are left out.
    lambda_t, lambda_s : float
        The temporal and spatial priors (`solve_displacement`).
    smooth_um : float
        The raster's smoothing along depth (Gaussian SD, µm).
    weights : {"count", "log_amplitude", "amplitude"}
        How each spike counts in the raster (DREDge weighs by amplitude; counting each spike
        once did better on SpikeInterface's drifting ground truth: 0.28-0.42 µm RMS against
        0.31-0.48 with log amplitudes, 3 seeds, rigid).
    robust_iterations : int
        Rounds of robust reweighting of the solve.
    shank_ids : array-like, optional
        Each channel's shank (default: `dspk.motion.shank_labels` of the geometry: x gaps).
    min_spikes_per_bin : int
        The fewest spikes per time bin (on average) a shank's motion is estimated from; a
        non-rigid window with fewer in its own bins is solved from its neighbours (the spatial
        prior), and a shank whose every window has too few is estimated rigid (a warning says
        so).
    memory_bytes : int
        Bound on the correlations held at once.

    Returns
    -------
    Motion
        With the probe's geometry and shanks (so that it corrects that probe only).

    Raises
    ------
    MotionError
        Too few spikes on a shank (the count needed is named), fewer than 2 time bins, a
        shank with no depth extent, spikes without depths or times.

    Examples
    --------
    Spikes of 40 units at fixed depths, the whole probe moving up 6 µm after 60 s:

    >>> import numpy as np
    >>> from dspk.motion import estimate
    >>> rng = np.random.default_rng(0)
    >>> geom = np.c_[np.zeros(64), 10.0 * np.arange(64)]
    >>> units = rng.uniform(50, 580, 40)
    >>> t = np.sort(rng.uniform(0, 120, 40 * 600))
    >>> unit = rng.integers(0, 40, t.size)
    >>> y = units[unit] + np.where(t >= 60, 6.0, 0.0) + rng.normal(0, 2, t.size)
    >>> spikes = {"time_s": t, "y": y, "amplitude": rng.uniform(5, 20, t.size)}
    >>> m = estimate(spikes, geom, 120.0, rigid=True)
    >>> m
    Motion(rigid, 60 time bins of 2 s, displacement -3.35..3.38 µm)
    >>> d = m.displacement[:, 0]
    >>> round(float(d[30:].mean() - d[:30].mean()), 1)
    6.1
    """
    g = positions(geometry)
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise MotionError(f"duration_s: expected the recording's positive duration in seconds, "
                          f"got {duration_s!r}")
    for name, value in (("bin_s", bin_s), ("bin_um", bin_um), ("max_disp_um", max_disp_um)):
        if not (math.isfinite(value) and value > 0):
            raise MotionError(f"{name}: expected a positive number, got {value!r}")
    n_t = int(math.ceil(duration_s / bin_s - 1e-9))
    if n_t < 2:
        raise MotionError(f"duration_s: {duration_s:g} s gives {n_t} time bin of {bin_s:g} s; "
                          f"motion needs at least 2 (a longer recording, or a smaller "
                          f"{arg('bin_s')})")
    edges = bin_s * np.arange(n_t + 1, dtype=np.float64)
    times, depths, amps, channels, xs = _spike_columns(spikes, fs)
    xp = array_module(depths)
    shanks = shank_labels(g, shank_ids)
    spike_shank = _spike_shanks(channels, xs, g, shanks, int(depths.shape[0]))
    horizon = None if time_horizon_s is None else int(math.ceil(time_horizon_s / bin_s))
    disp_parts, depth_parts, shank_parts = [], [], []
    for s in np.unique(shanks):
        ys = g[shanks == s, 1]
        lo, hi = float(ys.min()), float(ys.max())
        if hi - lo <= 0:
            raise MotionError(f"geometry: the channels of shank {int(s)} all lie at y = "
                              f"{lo:g} µm: a probe with no depth extent cannot show motion "
                              f"along depth")
        mine = np.flatnonzero(spike_shank == s)
        sel = xp.asarray(mine)
        t_s, y_s, a_s = times[sel], depths[sel], amps[sel]
        need = min_spikes_per_bin * n_t
        if mine.size < need:
            raise MotionError(f"spikes: {mine.size} spikes on shank {int(s)}; estimating its "
                              f"motion needs at least {need} ({min_spikes_per_bin} per time "
                              f"bin, {n_t} bins of {bin_s:g} s): a longer recording, a lower "
                              f"detection threshold or larger {arg('bin_s')}")
        # the raster reaches max_disp_um beyond the channels: units near the ends move in
        # and out of the probe's extent
        margin = float(max_disp_um)
        n_d = int(math.ceil((hi - lo + 2 * margin) / bin_um))
        d_edges = lo - margin + bin_um * np.arange(n_d + 1)
        d_centres = 0.5 * (d_edges[1:] + d_edges[:-1])
        raster = activity_raster(t_s, y_s, a_s, edges, d_edges, weights=weights,
                                 smooth_um=smooth_um)
        counts = to_numpy(activity_raster(t_s, y_s, a_s, edges, d_edges, weights="count",
                                          smooth_um=0.0)).astype(np.float64)
        scale = win_scale_um if win_scale_um is not None else \
            window_scale(mine.size, n_t, hi - lo)
        step = win_step_um if win_step_um is not None else scale
        windows, centres = spatial_windows(d_centres, lo, hi, rigid=rigid, step_um=step,
                                           scale_um=scale)
        rigid_here = len(centres) == 1
        if not rigid and rigid_here:
            warnings.warn(f"shank {int(s)} spans {hi - lo:g} µm, too short for non-rigid "
                          f"windows of {scale:g} µm: its motion is estimated rigid",
                          stacklevel=2)
        # a window's activity per time bin: its spikes, weighted by the window
        activity = counts @ windows.T                                   # [T, windows]
        enough = activity.sum(axis=0) >= need
        if not rigid_here and not enough.any():
            warnings.warn(f"shank {int(s)}: no non-rigid window has {min_spikes_per_bin} "
                          f"spikes per time bin: its motion is estimated rigid", stacklevel=2)
            windows, centres = spatial_windows(d_centres, lo, hi, rigid=True)
            activity = counts @ windows.T
            enough = np.ones(1, bool)
        lag = max(1, int(math.ceil(max_disp_um / bin_um)))
        # the pairs, their weights and the solve stay where the raster is (CuPy: on the GPU)
        shifts = xp.zeros((len(centres), n_t, n_t))
        weights_ = xp.zeros_like(shifts)
        for b, win in enumerate(windows):
            if not enough[b]:
                continue           # solved from its neighbours (the spatial prior)
            sh, corr = pairwise_displacement(raster, win, lag, horizon, memory_bytes)
            shifts[b] = sh * bin_um
            weights_[b] = registration_weights(corr, xp.asarray(activity[:, b]), mincorr)
            del sh, corr
        p = to_numpy(solve_displacement(shifts, weights_, lambda_t=lambda_t,
                                        lambda_s=lambda_s,
                                        robust_iterations=robust_iterations))
        del shifts, weights_
        log.info("motion of shank %d: %s, %d time bins, displacement %.3g..%.3g µm",
                 int(s), "rigid" if len(centres) == 1 else f"{len(centres)} windows", n_t,
                 float(p.min()), float(p.max()))
        disp_parts.append(p.T)
        depth_parts.append(centres)
        shank_parts.append(np.full(len(centres), s, np.int64))
    return Motion(edges, np.concatenate(depth_parts), np.concatenate(disp_parts, axis=1),
                  bin_shanks=np.concatenate(shank_parts), geometry=g, channel_shanks=shanks)
