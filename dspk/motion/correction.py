"""Motion correction of traces: each channel re-sampled at its position moved by the drift,
by kriging interpolation from the channels (SpikeInterface's ``interpolate_motion``, method
"kriging"; Kilosort's drift correction), one [channels, channels] matrix per time bin applied
with `dspk.ops.spatial_filter`.

What matches SpikeInterface's ``interpolate_motion(recording, motion, border_mode=...,
spatial_interpolation_method="kriging", sigma_um=20, p=1)`` (version 0.105): the kernel
``exp(−(d/σ)^p)``, the weights ``K(moved, channels) · pinv(K(channels, channels) + 1e-6 I)``,
each row normalised to sum 1 where the moved position lies within the probe's extent; each
sample takes the displacement of its time bin (the motion's bins, or bins of
``time_bin_s``, whose displacement is interpolated linearly from the motion's), samples
before the first bin or after the last take the first or last bin's. What differs:
``border="zeros"`` is SpikeInterface's ``border_mode="force_zeros"`` and
``border="extrapolate"`` its ``"force_extrapolate"``; its default, ``"remove_channels"``,
which drops channels, is not offered (a pipeline keeps its channels). SpikeInterface's lazy
recording rebuilds the bins' edges from their centres and then the centres from those edges,
so its first and last bins take the displacement a quarter bin inward (between them and the
next); here every bin takes its own (as SpikeInterface's ``interpolate_motion_on_traces``
does when given the motion's bins). A sample exactly on an edge starts the next bin here
(the edge's first sample is computed from the sample index, not compared in floating point).
On a multi-shank probe each shank is interpolated from its own channels only (SpikeInterface
mixes the shanks' channels through the kernel's tails).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np

from ..backend import array_module, is_cupy_array, to_numpy
from ..caches import LRU
from ..ops import spatial_filter
from .motion import Motion, MotionError, positions, shank_labels

__all__ = ["correct", "Correction", "kriging_matrix", "keep_white", "BORDERS", "KRIGING_RIDGE",
           "WHITE_FLOOR"]

#: what a channel moved beyond the probe's extent gets: zeros, or the kriging's extrapolation
BORDERS = ("zeros", "extrapolate")
#: the ridge added to the channels' kernel matrix before its pseudo-inverse (the reference's)
KRIGING_RIDGE = 1e-6
#: matrices kept by a `Correction` (the bins of a chunk and the next)
CACHED_MATRICES = 16
#: `keep_white`: eigenvalues of W·Wᵀ are floored at this fraction of the largest, only so that a
#: direction W annihilates exactly (rows reading the same combination) is not divided by a
#: rounding error. Not higher: the kriging's real spectrum reaches that low — on a 384-channel
#: NP1.0 at half a pitch of drift its smallest eigenvalue was 1.6e-5 of the largest
#: (SpikeInterface's 20 µm, p=1 kernel; 6.2e-5 with Kilosort's), and a floor of 1e-3 left W·Wᵀ
#: up to 0.031 off the identity: noise no longer white, which is what this function is for
WHITE_FLOOR = 1e-10


def _kernel(a: Any, b: Any, sigma_um: float, p: float) -> Any:
    xp = array_module(a)
    d = xp.sqrt((a[:, None, 0] - b[None, :, 0]) ** 2 + (a[:, None, 1] - b[None, :, 1]) ** 2)
    return xp.exp(-((d / sigma_um) ** p))


def keep_white(w: Any) -> Any:
    """The interpolation matrix W [channels, channels] made to keep white noise white: its
    polar factor ``(W·Wᵀ)^(−1/2)·W`` over the rows that read anything (zero rows stay zero).

    Why: a correction that follows whitening (Kilosort4's order, and `--preset kilosort`'s)
    feeds the sorter noise of covariance W·Wᵀ, and a kriging row that reads between contacts
    averages them — by an amount that changes with the drift's fraction of the pitch. On
    SpikeInterface's drifting ground truth (NP1.0, 64 channels x 120 s, ±20 µm zig-zag,
    corrected by the true motion after `--preset kilosort`'s whitening) the median noise SD of
    6-s bins moved between 0.74 and 0.95 (Kilosort4's own kernel; 0.48–0.95 with
    SpikeInterface's 20 µm, p=1), so a sorter's fixed threshold stood up to 28 % more noise
    SDs high at the worst drift than at the best (99 % with that kernel). The polar factor is
    the orthogonal matrix nearest W (for a shift of a uniform line of contacts: the all-pass
    fractional shift): it moves the traces as W does
    and keeps the noise white, of unit variance, at every drift (measured 0.950–0.958 on the
    same data); units' peak amplitude over 12-s bins varied by 12.0 % (median CV) against
    13.8 %. (`benchmarks/profiles/profile_keep_white.py`.) Not Kilosort's or SpikeInterface's:
    dspk's own; only meaningful on whitened traces.

    Parameters
    ----------
    w : array
        [channels, channels] float64 (NumPy or CuPy), a row per output channel.

    Returns
    -------
    array
        The same shape, type and module.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import keep_white, kriging_matrix
    >>> geom = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    >>> w = kriging_matrix(geom, np.full(6, 10.0))          # halfway between contacts
    >>> round(float((w @ w.T)[2, 2]), 3)                    # white noise's variance: halved
    0.5
    >>> u = keep_white(w)
    >>> round(float((u @ u.T)[2, 2]), 3), bool((u[5] == 0).all())   # kept; beyond: zeros
    (1.0, True)
    """
    xp = array_module(w)
    rows = xp.flatnonzero(xp.abs(w).sum(axis=1) > 0)
    if len(rows) == 0:
        return w
    wr = w[rows]
    ev, v = xp.linalg.eigh(wr @ wr.T)
    ev = xp.maximum(ev, WHITE_FLOOR * ev.max())
    out = xp.zeros_like(w)
    out[rows] = (v * ev ** -0.5) @ (v.T @ wr)
    return out


def kriging_matrix(geometry: Any, displacement_um: Any, sigma_um: float = 20.0,
                   p: float = 1.0, border: str = "zeros", shank_ids: Any = None) -> np.ndarray:
    """W [channels, channels] with ``(W·x)[c]`` the traces interpolated at channel c's position
    moved by ``displacement_um[c]`` along depth (SpikeInterface's
    ``get_spatial_interpolation_kernel(source, target, method="kriging")``, transposed).

    Parameters
    ----------
    geometry : array-like or probeinterface Probe
        [channels, 2] positions in µm.
    displacement_um : array-like
        [channels] the displacement (µm, finite) each channel is read at.
    sigma_um, p : float
        The kernel ``exp(−(d/sigma_um)^p)`` (SpikeInterface's defaults: 20 µm, 1).
    border : {"zeros", "extrapolate"}
        A moved position beyond its shank's extent along depth: a row of zeros, or the
        kriging's weights as they are (not normalised).
    shank_ids : array-like, optional
        Each channel's shank: a channel is interpolated from its shank's channels only
        (default: `dspk.motion.shank_labels`).

    Returns
    -------
    numpy.ndarray
        float64 [channels, channels].

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import kriging_matrix
    >>> geom = np.c_[np.zeros(5), 20.0 * np.arange(5)]
    >>> w = kriging_matrix(geom, np.zeros(5))
    >>> bool(np.allclose(w, np.eye(5), atol=1e-6))              # no motion: the identity
    True
    >>> w = kriging_matrix(geom, np.full(5, 10.0))
    >>> np.round(w[1], 3) + 0.0                # halfway to channel 2: a linear interpolation
    array([0. , 0.5, 0.5, 0. , 0. ])
    >>> bool((w[4] == 0).all())                                 # moved beyond the probe
    True
    """
    return Correction(geometry, None, sigma_um, p, border, shank_ids).matrix(displacement_um)


class Correction:
    """The motion correction of one probe, prepared: the pseudo-inverse of each shank's
    kernel matrix (once), and the [channels, channels] matrix of each time bin (`matrix`,
    the last `CACHED_MATRICES` kept). `correct` uses one; a pipeline's `Motion` step keeps
    one per run.

    Parameters
    ----------
    geometry : array-like or probeinterface Probe
        [channels, 2] positions in µm.
    motion : Motion, optional
        The drift (checked to be this probe's); None for `matrix` alone.
    sigma_um, p : float
        The kriging kernel (as `kriging_matrix`).
    border : {"zeros", "extrapolate"}
    shank_ids : array-like, optional
        Each channel's shank.
    time_bin_s : float, optional
        Interpolate in bins of this length (their displacement linearly interpolated from the
        motion's), starting at time 0; default: the motion's own bins.
    white : bool
        Each bin's matrix made to keep whitened noise white (`keep_white`): for traces that
        were whitened before the correction.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import Correction, Motion
    >>> geom = np.c_[np.zeros(5), 20.0 * np.arange(5)]
    >>> m = Motion([0.0, 1.0, 2.0], [40.0], [[0.0], [20.0]], geometry=geom)
    >>> c = Correction(geom, m)
    >>> x = np.tile(np.arange(5.0, dtype=np.float32)[:, None], (1, 4))   # channel c holds c
    >>> np.round(c(x, 1.0, fs=2.0), 4)[:4]   # from 1 s, displacement 20 µm: one channel up
    array([[1., 1., 1., 1.],
           [2., 2., 2., 2.],
           [3., 3., 3., 3.],
           [4., 4., 4., 4.]], dtype=float32)
    """

    def __init__(self, geometry: Any, motion: Motion | None = None, sigma_um: float = 20.0,
                 p: float = 1.0, border: str = "zeros", shank_ids: Any = None,
                 time_bin_s: float | None = None, white: bool = False) -> None:
        self.geometry = positions(geometry)
        if not isinstance(white, (bool, np.bool_)):
            raise TypeError(f"white: expected True or False, got {white!r}")
        self.white = bool(white)
        if not (math.isfinite(sigma_um) and sigma_um > 0):
            raise ValueError(f"sigma_um: expected a positive kernel scale in µm, got "
                             f"{sigma_um!r}")
        if not (math.isfinite(p) and p > 0):
            raise ValueError(f"p: expected a positive kernel exponent, got {p!r}")
        if border not in BORDERS:
            raise ValueError(f"border: expected 'zeros' or 'extrapolate', got {border!r}")
        if time_bin_s is not None and not (math.isfinite(time_bin_s) and time_bin_s > 0):
            raise ValueError(f"time_bin_s: expected a positive bin length in seconds, got "
                             f"{time_bin_s!r}")
        self.sigma_um, self.p, self.border = float(sigma_um), float(p), border
        self.shanks = shank_labels(self.geometry, shank_ids)
        self.motion = motion
        if motion is not None:
            if not isinstance(motion, Motion):
                raise TypeError(f"motion: expected a dspk.motion.Motion, got "
                                f"{type(motion).__name__}")
            motion.check_probe(self.geometry, shank_ids)
            if motion.geometry is None:
                missing = sorted(set(self.shanks.tolist()) - set(motion.shanks.tolist()))
                if missing:
                    raise MotionError(f"motion: no spatial bin on shank {missing[0]}")
        self.time_bin_s = time_bin_s
        self._groups = []
        for s in np.unique(self.shanks):
            idx = np.flatnonzero(self.shanks == s)
            g = self.geometry[idx]
            kxx = _kernel(g, g, self.sigma_um, self.p)
            inv = np.linalg.pinv(kxx + KRIGING_RIDGE * np.eye(len(idx)))
            self._groups.append((idx, g, inv, g[:, 1].min(), g[:, 1].max()))
        self._cache = LRU(CACHED_MATRICES)
        self._bins: tuple | None = None
        self._device_groups: dict = {}

    def matrix(self, displacement_um: Any, xp: Any = np) -> Any:
        """W [channels, channels] (float64) reading each channel at its position moved by its
        displacement (see `kriging_matrix`), made with ``xp`` (``cupy``: on the GPU, where a
        run's traces are; the probe's pseudo-inverses are moved there once).

        Parameters
        ----------
        displacement_um : array-like
            [channels] µm, finite.
        xp : module
            numpy or cupy.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.motion import Correction
        >>> Correction(np.c_[np.zeros(3), [0.0, 20.0, 40.0]]).matrix(np.zeros(3)).shape
        (3, 3)
        """
        d = np.asarray(displacement_um, np.float64).reshape(-1)
        n = len(self.geometry)
        if d.shape != (n,):
            raise ValueError(f"displacement_um: expected one value per channel ({n}), got "
                             f"shape {d.shape}")
        if not np.all(np.isfinite(d)):
            c = int(np.flatnonzero(~np.isfinite(d))[0])
            raise MotionError(f"displacement_um: not finite at channel {c}; NaN must never "
                              f"reach the traces")
        w = xp.zeros((n, n))
        for idx, g, inv, lo, hi in self._groups_on(xp):
            moved = g.copy()
            moved[:, 1] += xp.asarray(d[to_numpy(idx)])
            k = _kernel(moved, g, self.sigma_um, self.p) @ inv        # [targets, sources]
            inside = (moved[:, 1] >= lo) & (moved[:, 1] <= hi)
            sums = k.sum(axis=1)
            scale = xp.where(inside, 1.0 / xp.where(sums != 0, sums, 1.0), 1.0)
            k *= scale[:, None]
            if self.border == "zeros":
                k = xp.where(inside[:, None], k, 0.0)
            w[idx[:, None], idx[None, :]] = k
        return keep_white(w) if self.white else w

    def _groups_on(self, xp: Any) -> list:
        """Each shank's (channels, positions, pseudo-inverse, extent) in ``xp``'s arrays."""
        if xp is np:
            return self._groups
        key = xp.cuda.Device().id
        if key not in self._device_groups:
            self._device_groups[key] = [(xp.asarray(idx), xp.asarray(g), xp.asarray(inv), lo, hi)
                                        for idx, g, inv, lo, hi in self._groups]
        return self._device_groups[key]

    def bins(self) -> tuple:
        """(edges, centres' displacement [bins, channels]) of the interpolation bins: the
        motion's own, or bins of `time_bin_s` from 0 to the motion's last edge."""
        m = self.motion
        if m is None:
            raise MotionError("motion: a Correction made without a motion has no time bins")
        if self.time_bin_s is None:
            edges = m.time_edges_s
        else:
            n = max(1, int(math.ceil(m.time_edges_s[-1] / self.time_bin_s - 1e-9)))
            edges = self.time_bin_s * np.arange(n + 1, dtype=np.float64)
        centres = 0.5 * (edges[1:] + edges[:-1])
        disp = m.displacement_at(centres[:, None], self.geometry[None, :, 1],
                                 self.shanks[None, :])
        return edges, disp

    def _bin_matrix(self, k: int, disp: np.ndarray, like: Any) -> Any:
        """Bin k's matrix in the dtype and array type (device) of ``like``: made on the host
        once, moved once (the same array each time, which `spatial_filter` recognises)."""
        gpu = is_cupy_array(like)
        key = (k, like.dtype.str, like.device.id if gpu else None)
        w = self._cache.get(key)
        if w is None:
            # made where the traces are: on the GPU, [channels, channels] products and a kernel
            # per bin (an hour of 2-s bins: 1800 of them) instead of the host's
            xp = array_module(like)
            with xp.cuda.Device(like.device.id) if gpu else contextlib.nullcontext():
                w = self.matrix(disp[k], xp).astype(like.dtype)
            self._cache.put(key, w)
        return w

    def segments(self, n: int, start: float, fs: float) -> list:
        """[(bin, first sample, end sample)] of ``n`` samples whose first is at ``start``
        seconds (samples in bin k: those at or after its first edge and before the next;
        before the first edge, bin 0; after the last, the last bin)."""
        edges, _ = self._edges_disp()
        # an edge's first sample, ceil((edge − start)·fs), rounded first so that a time a
        # floating-point step off an exact sample lands on that sample in every chunking
        firsts = np.ceil(np.round((edges[1:-1] - start) * fs, 6)).astype(np.int64)
        bounds = np.clip(np.concatenate([[0], firsts, [n]]), 0, n)
        return [(k, int(a), int(b)) for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))
                if b > a]

    def _edges_disp(self) -> tuple:
        if self._bins is None:
            self._bins = self.bins()
        return self._bins

    def __call__(self, x: Any, t0: float, fs: float) -> Any:
        """The traces x [channels, samples] (x[:, 0] at ``t0`` seconds), corrected.

        Parameters
        ----------
        x : array
            float32 or float64, NumPy or CuPy.
        t0 : float
            The time of x's first sample, in seconds from the recording's start.
        fs : float
            The sampling rate in Hz.
        """
        xp = array_module(x)
        if getattr(x, "ndim", None) != 2 or x.shape[0] != len(self.geometry):
            raise ValueError(f"x: expected [channels, samples] traces of the "
                             f"{len(self.geometry)} channels of geometry, got shape "
                             f"{getattr(x, 'shape', None)}")
        if x.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"x: expected float32 or float64 traces, got {x.dtype}")
        if not (math.isfinite(fs) and fs > 0):
            raise ValueError(f"fs: expected a positive sampling rate, got {fs!r}")
        if not math.isfinite(t0):
            raise ValueError(f"t0: expected a finite time in seconds, got {t0!r}")
        _, disp = self._edges_disp()
        out = xp.empty_like(x)
        for k, a, b in self.segments(x.shape[1], float(t0), float(fs)):
            out[:, a:b] = spatial_filter(self._bin_matrix(k, disp, x),
                                         xp.ascontiguousarray(x[:, a:b]))
        return out


def correct(x: Any, geometry: Any, motion: Motion, t0: float, fs: float, *,
            sigma_um: float = 20.0, p: float = 1.0, border: str = "zeros",
            time_bin_s: float | None = None, shank_ids: Any = None, white: bool = False) -> Any:
    """Traces corrected for motion: each channel re-sampled, sample by sample, at its position
    moved by the drift of its time bin, by kriging from the probe's channels (SpikeInterface's
    ``interpolate_motion`` with method "kriging"; see the module's notes for what differs). One
    [channels, channels] matrix per time bin (`kriging_matrix`), applied to that bin's samples
    with `dspk.ops.spatial_filter`.

    Parameters
    ----------
    x : array
        [channels, samples] float32 or float64 traces (NumPy or CuPy: the result is of the
        same type).
    geometry : array-like or probeinterface Probe
        [channels, 2] positions in µm: the probe the motion was estimated on (another is
        refused).
    motion : Motion
        The drift (`dspk.motion.estimate`).
    t0 : float
        The time of x[:, 0] in seconds from the recording's start.
    fs : float
        The sampling rate in Hz.
    sigma_um, p : float
        The kriging kernel ``exp(−(d/sigma_um)^p)`` (SpikeInterface's defaults: 20, 1).
    border : {"zeros", "extrapolate"}
        A channel moved beyond its shank's extent: zeros, or the kriging's extrapolation.
    time_bin_s : float, optional
        Interpolation bins of this length (from time 0; the displacement at their centres
        interpolated linearly); default: the motion's bins (SpikeInterface's default).
    shank_ids : array-like, optional
        Each channel's shank (default: the motion's, from the x gaps of the geometry).
    white : bool
        Keep whitened noise white (`keep_white`): for x whitened before the correction.

    Returns
    -------
    array
        [channels, samples], x's dtype and array type.

    Examples
    --------
    A unit at depth 40 µm that moved up by 20 µm (one channel) after 1 s is put back:

    >>> import numpy as np
    >>> from dspk.motion import Motion, correct
    >>> geom = np.c_[np.zeros(8), 20.0 * np.arange(8)]
    >>> m = Motion([0.0, 1.0, 2.0], [70.0], [[0.0], [20.0]], geometry=geom)
    >>> x = np.zeros((8, 4), np.float32)
    >>> x[2, :2] = -10.0                         # channel 2 in the first second
    >>> x[3, 2:] = -10.0                         # channel 3 in the next
    >>> np.round(correct(x, geom, m, t0=0.0, fs=2.0), 2)[1:5] + 0.0
    array([[  0.,   0.,   0.,   0.],
           [-10., -10., -10., -10.],
           [  0.,   0.,   0.,   0.],
           [  0.,   0.,   0.,   0.]], dtype=float32)
    """
    if not isinstance(motion, Motion):
        raise TypeError(f"motion: expected a dspk.motion.Motion (dspk.motion.estimate, "
                        f"Motion.load), got {type(motion).__name__}")
    return Correction(geometry, motion, sigma_um, p, border, shank_ids, time_bin_s,
                      white)(x, t0, fs)
