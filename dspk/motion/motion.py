"""The `Motion` object: a drift estimate — the displacement in µm of the tissue relative to
the probe, per time bin and spatial bin — its value at any time and depth, its file
(`Motion.save` / `Motion.load`, refused for another probe) and its fitted-state form for a
pipeline.

Conventions (SpikeInterface's ``Motion``, spikeinterface.core.motion, version 0.105): a unit
at depth ``y`` at time 0 appears at ``y + displacement(t, y)`` at time ``t`` (up to a constant:
the displacement is relative); between bin centres, in time and in depth, it is linearly
interpolated; outside them it is the nearest bin's (clipped). Rigid motion has one spatial bin
(per shank). A multi-shank probe has the spatial bins of each shank side by side in one
[time bins, spatial bins] array, each bin labelled with its shank (`Motion.bin_shanks`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..backend import to_numpy
from ..ops._checks import positions as checked_positions

__all__ = ["Motion", "MotionError", "shank_labels", "to_spikeinterface", "SHANK_GAP_UM",
           "MOTION_FILE_VERSION"]

#: channels whose x positions are separated by a gap wider than this (µm) are on different
#: shanks, when the shanks are not given (Neuropixels 2.0: 250 µm between shanks, 32 µm
#: across one)
SHANK_GAP_UM = 100.0
#: the format of `Motion.save`'s file
MOTION_FILE_VERSION = 1


class MotionError(ValueError):
    """A motion estimate that cannot be made or used as asked (the message says why): too few
    spikes, a probe without depth extent, a motion file or object of another probe.

    A `ValueError`, so ``except ValueError`` catches it too.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import Motion, MotionError
    >>> m = Motion([0.0, 2.0], [0.0], [[np.nan]])
    Traceback (most recent call last):
    ...
    dspk.motion.MotionError: displacement: not finite at time bin 0, spatial bin 0 ...
    """


def shank_labels(geometry: Any, shank_ids: Any = None) -> np.ndarray:
    """Each channel's shank as 0, 1, ... (in increasing order of the given ids, or of x): the
    ids given, or groups of channels separated along x by more than `SHANK_GAP_UM`.

    Parameters
    ----------
    geometry : array-like or probeinterface Probe
        [channels, 2] contact positions in µm (x, y).
    shank_ids : array-like, optional
        One id per channel (numbers or strings: a probeinterface Probe's ``shank_ids``).

    Returns
    -------
    numpy.ndarray
        int64 [channels].

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import shank_labels
    >>> geom = np.c_[[0.0, 32.0, 250.0, 282.0], [0.0, 15.0, 0.0, 15.0]]   # 2 shanks
    >>> shank_labels(geom).tolist()
    [0, 0, 1, 1]
    >>> shank_labels(geom, ["b", "b", "a", "a"]).tolist()
    [1, 1, 0, 0]
    """
    g = positions(geometry)
    if shank_ids is not None:
        ids = np.asarray(to_numpy(shank_ids))
        if ids.shape != (len(g),):
            raise MotionError(f"shank_ids: expected one shank per channel ({len(g)}), got shape "
                              f"{ids.shape}")
        return np.unique(ids, return_inverse=True)[1].astype(np.int64).reshape(-1)
    xs = np.unique(g[:, 0])
    starts = xs[np.r_[True, np.diff(xs) > SHANK_GAP_UM]]
    return (np.searchsorted(starts, g[:, 0], side="right") - 1).astype(np.int64)


def positions(geometry: Any) -> np.ndarray:
    """[channels, 2] float64 positions in µm from an array or a probeinterface Probe; finite
    (`dspk.ops`' check, its ValueError raised as a `MotionError`, which the pipeline's
    Motion step reports as its own)."""
    try:
        return checked_positions(geometry)
    except ValueError as exc:
        raise MotionError(str(exc)) from None


def probe_digest(geometry: np.ndarray, shanks: np.ndarray) -> str:
    """A short digest of the positions (to 1e-3 µm) and shanks: names the probe in messages
    and files."""
    h = hashlib.sha256(np.round(geometry, 3).astype(np.float64).tobytes())
    h.update(np.asarray(shanks, np.int64).tobytes())
    return h.hexdigest()[:12]


def _describe(geometry: np.ndarray) -> str:
    y = geometry[:, 1]
    return f"{len(geometry)} channels spanning y {y.min():g}..{y.max():g} µm"


def _interval_weights(centres: np.ndarray, at: np.ndarray) -> tuple:
    """(lower index, upper index, weight of the upper) of the linear interpolation between
    sorted ``centres`` at ``at``, clipped to the first and last (the nearest value outside)."""
    n = len(centres)
    if n == 1:
        zero = np.zeros(at.shape, dtype=np.int64)
        return zero, zero, np.zeros(at.shape)
    a = np.clip(at, centres[0], centres[-1])
    hi = np.clip(np.searchsorted(centres, a, side="right"), 1, n - 1)
    lo = hi - 1
    w = (a - centres[lo]) / (centres[hi] - centres[lo])
    return lo, hi, w


class Motion:
    """A drift estimate: ``displacement[k, j]`` µm in time bin k (edges ``time_edges_s[k]``,
    ``time_edges_s[k + 1]``) and spatial bin j (centred at depth ``depths_um[j]`` on shank
    ``bin_shanks[j]``); SpikeInterface's ``Motion`` (one segment, direction "y") with the
    probe it was estimated on and its shanks.

    Parameters
    ----------
    time_edges_s : array-like
        [time bins + 1] increasing times in seconds from the recording's start.
    depths_um : array-like
        [spatial bins] the depth (y, µm) each spatial bin is centred at; rigid motion has one
        per shank.
    displacement : array-like
        [time bins, spatial bins] µm, finite (NaN is refused: it must never reach traces).
    bin_shanks : array-like, optional
        [spatial bins] the shank (0, 1, ...) of each spatial bin, each shank's bins in
        increasing depth. Default: all on shank 0.
    geometry : array-like, optional
        [channels, 2] positions (µm) of the probe the motion was estimated on: a probe of other
        positions is refused by `check_probe` (and by `dspk.motion.correct`, `load`).
    channel_shanks : array-like, optional
        [channels] the shank (0, 1, ...) of each channel (default: `shank_labels` of
        ``geometry``).

    Attributes
    ----------
    STATE_KEYS : tuple of str
        The arrays `to_state` always writes (with a probe, also ``geometry`` and
        ``channel_shanks``).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import Motion
    >>> m = Motion([0.0, 2.0, 4.0, 6.0], [100.0], [[0.0], [4.0], [8.0]])   # rigid
    >>> m
    Motion(rigid, 3 time bins of 2 s, displacement 0..8 µm)
    >>> m.time_centres_s, m.displacement_at([1.0, 2.0, 6.0], [0.0, 50.0, 900.0])
    (array([1., 3., 5.]), array([0., 2., 8.]))
    """

    STATE_KEYS = ("time_edges_s", "depths_um", "displacement", "bin_shanks")

    def __init__(self, time_edges_s: Any, depths_um: Any, displacement: Any,
                 bin_shanks: Any = None, geometry: Any = None,
                 channel_shanks: Any = None) -> None:
        edges = np.asarray(to_numpy(time_edges_s), dtype=np.float64).reshape(-1)
        depths = np.asarray(to_numpy(depths_um), dtype=np.float64).reshape(-1)
        disp = np.asarray(to_numpy(displacement), dtype=np.float64)
        if edges.size < 2 or not np.all(np.isfinite(edges)) or np.any(np.diff(edges) <= 0):
            raise MotionError(f"time_edges_s: expected at least 2 finite, increasing times, got "
                              f"{edges.size} values")
        if depths.size == 0 or not np.all(np.isfinite(depths)):
            raise MotionError("depths_um: expected one or more finite depths (one per spatial "
                              "bin)")
        if disp.shape != (edges.size - 1, depths.size):
            raise MotionError(f"displacement: expected [time bins, spatial bins] = "
                              f"[{edges.size - 1}, {depths.size}], got shape {disp.shape}")
        bad = np.argwhere(~np.isfinite(disp))
        if len(bad):
            k, j = (int(v) for v in bad[0])
            raise MotionError(f"displacement: not finite at time bin {k}, spatial bin {j} "
                              f"({len(bad)} values); NaN must never reach the traces: fill "
                              f"them (e.g. with the neighbouring bins' values) first")
        shanks = np.zeros(depths.size, np.int64) if bin_shanks is None else \
            np.asarray(to_numpy(bin_shanks)).astype(np.int64).reshape(-1)
        if shanks.shape != depths.shape or shanks.min() < 0:
            raise MotionError(f"bin_shanks: expected one shank (0, 1, ...) per spatial bin "
                              f"({depths.size}), got {shanks.tolist()}")
        for s in np.unique(shanks):
            d = depths[shanks == s]
            if np.any(np.diff(d) <= 0):
                raise MotionError(f"depths_um: the spatial bins of shank {int(s)} must be in "
                                  f"increasing depth, got {d.tolist()}")
        self.time_edges_s = edges
        self.depths_um = depths
        self.displacement = disp
        self.bin_shanks = shanks
        self.geometry = None if geometry is None else positions(geometry)
        if self.geometry is None:
            self.channel_shanks = None
        elif channel_shanks is None:
            self.channel_shanks = shank_labels(self.geometry)
        else:
            cs = np.asarray(to_numpy(channel_shanks)).astype(np.int64).reshape(-1)
            if cs.shape != (len(self.geometry),):
                raise MotionError(f"channel_shanks: expected one shank per channel "
                                  f"({len(self.geometry)}), got shape {cs.shape}")
            self.channel_shanks = cs
        if self.channel_shanks is not None:
            missing = sorted(set(np.unique(self.channel_shanks).tolist()) -
                             set(np.unique(shanks).tolist()))
            if missing:
                raise MotionError(f"bin_shanks: no spatial bin on shank {missing[0]}, which "
                                  f"has channels")

    # -- description ------------------------------------------------------------------------
    @property
    def time_centres_s(self) -> np.ndarray:
        """The time bins' centres in seconds.

        Examples
        --------
        >>> from dspk.motion import Motion
        >>> Motion([0.0, 2.0, 3.0], [0.0], [[0.0], [1.0]]).time_centres_s
        array([1. , 2.5])
        """
        return 0.5 * (self.time_edges_s[1:] + self.time_edges_s[:-1])

    @property
    def shanks(self) -> np.ndarray:
        """The shanks that have spatial bins (0, 1, ...).

        Examples
        --------
        >>> from dspk.motion import Motion
        >>> Motion([0.0, 2.0], [0.0, 0.0], [[1.0, 2.0]], bin_shanks=[0, 1]).shanks
        array([0, 1])
        """
        return np.unique(self.bin_shanks)

    @property
    def rigid(self) -> bool:
        """Whether each shank has one spatial bin.

        Examples
        --------
        >>> from dspk.motion import Motion
        >>> Motion([0.0, 2.0], [0.0, 300.0], [[1.0, 2.0]]).rigid
        False
        """
        return len(self.bin_shanks) == len(self.shanks)

    @property
    def probe(self) -> str:
        """A short digest of the probe's positions and shanks ("" without a geometry).

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.motion import Motion
        >>> geom = np.c_[np.zeros(4), 20.0 * np.arange(4)]
        >>> len(Motion([0.0, 2.0], [30.0], [[0.0]], geometry=geom).probe)
        12
        """
        if self.geometry is None:
            return ""
        return probe_digest(self.geometry, self.channel_shanks)

    def drift_range(self) -> tuple:
        """(smallest, largest) displacement in µm over every bin.

        Examples
        --------
        >>> from dspk.motion import Motion
        >>> Motion([0.0, 2.0, 4.0], [0.0], [[-3.0], [5.0]]).drift_range()
        (-3.0, 5.0)
        """
        return float(self.displacement.min()), float(self.displacement.max())

    def summary(self) -> str:
        """The estimate's kind and bins, in words.

        Examples
        --------
        >>> from dspk.motion import Motion
        >>> Motion([0.0, 2.0, 4.0], [100.0, 300.0], [[0, 0], [1, 2]]).summary()
        'non-rigid, 2 spatial bins, 2 time bins of 2 s'
        """
        kind = "rigid" if self.rigid else f"non-rigid, {len(self.depths_um)} spatial bins"
        if len(self.shanks) > 1:
            kind += f", {len(self.shanks)} shanks"
        widths = np.diff(self.time_edges_s)
        width = f"{widths[0]:g} s" if np.allclose(widths, widths[0]) else \
            f"{widths.min():g}-{widths.max():g} s"
        return f"{kind}, {len(widths)} time bins of {width}"

    def __repr__(self) -> str:
        lo, hi = self.drift_range()
        return f"Motion({self.summary()}, displacement {lo:.3g}..{hi:.3g} µm)"

    # -- values -----------------------------------------------------------------------------
    def displacement_at(self, times_s: Any, depths_um: Any, shanks: Any = 0) -> np.ndarray:
        """The displacement (µm) at each (time, depth) on its shank: linear between the time
        bins' centres and between the spatial bins' depths, the nearest bin's beyond them
        (SpikeInterface's ``Motion.get_displacement_at_time_and_depth``).

        Parameters
        ----------
        times_s, depths_um : array-like
            Times (s) and depths (µm), broadcast together.
        shanks : int or array-like
            The shank of each point (broadcast with them; default 0).

        Returns
        -------
        numpy.ndarray
            float64, of the broadcast shape.

        Examples
        --------
        >>> from dspk.motion import Motion
        >>> m = Motion([0.0, 2.0, 4.0], [0.0, 100.0], [[0.0, 10.0], [2.0, 20.0]])
        >>> m.displacement_at(2.0, [0.0, 50.0, 100.0, 500.0])     # halfway in time
        array([ 1.,  8., 15., 15.])
        """
        t, d, s = np.broadcast_arrays(np.asarray(to_numpy(times_s), np.float64),
                                      np.asarray(to_numpy(depths_um), np.float64),
                                      np.asarray(to_numpy(shanks)).astype(np.int64))
        out = np.empty(t.shape, np.float64)
        lo, hi, wt = _interval_weights(self.time_centres_s, t)
        for shank in np.unique(s):
            bins = np.flatnonzero(self.bin_shanks == shank)
            if bins.size == 0:
                raise MotionError(f"shanks: the motion has no spatial bin on shank "
                                  f"{int(shank)} (shanks {self.shanks.tolist()})")
            on = s == shank
            dlo, dhi, wd = _interval_weights(self.depths_um[bins], d[on])
            table = self.displacement[:, bins]
            tl, th, w = lo[on], hi[on], wt[on]
            at_lo = table[tl, dlo] * (1 - wd) + table[tl, dhi] * wd
            at_hi = table[th, dlo] * (1 - wd) + table[th, dhi] * wd
            out[on] = at_lo * (1 - w) + at_hi * w
        return out

    def channel_displacement(self, times_s: Any) -> np.ndarray:
        """The displacement of every channel of the probe at each time: [times, channels] µm
        (`displacement_at` at the channels' depths and shanks).

        Parameters
        ----------
        times_s : array-like
            1-D times in seconds.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.motion import Motion
        >>> geom = np.c_[np.zeros(3), [0.0, 50.0, 100.0]]
        >>> m = Motion([0.0, 2.0], [0.0, 100.0], [[0.0, 10.0]], geometry=geom)
        >>> m.channel_displacement([1.0])
        array([[ 0.,  5., 10.]])
        """
        if self.geometry is None:
            raise MotionError("geometry: the motion does not know its probe; make it with "
                              "geometry= (dspk.motion.estimate does)")
        t = np.asarray(to_numpy(times_s), np.float64).reshape(-1, 1)
        return self.displacement_at(t, self.geometry[None, :, 1], self.channel_shanks[None])

    # -- the probe ---------------------------------------------------------------------------
    def check_probe(self, geometry: Any, shank_ids: Any = None, tolerance_um: float = 1e-3,
                    where: str = "motion") -> None:
        """Refuse a probe other than the one the motion was estimated on: another channel
        count, positions that differ by more than ``tolerance_um``, other shanks. Nothing is
        checked when the motion does not know its probe (``geometry=None``).

        Parameters
        ----------
        geometry : array-like or probeinterface Probe
            [channels, 2] positions in µm.
        shank_ids : array-like, optional
            The channels' shanks (default: `shank_labels` of the geometry).
        tolerance_um : float
            The largest difference of a position accepted.
        where : str
            What the motion is, for the message (a file's name).

        Raises
        ------
        MotionError
            Naming both probes and the difference.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.motion import Motion
        >>> geom = np.c_[np.zeros(4), 20.0 * np.arange(4)]
        >>> m = Motion([0.0, 2.0], [30.0], [[0.0]], geometry=geom)
        >>> m.check_probe(geom)
        >>> m.check_probe(geom[:3])            # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dspk.motion.MotionError: motion: estimated on a probe of 4 channels spanning y 0..60 µm ...
        """
        if self.geometry is None:
            return
        g = positions(geometry)
        mine = f"{where}: estimated on a probe of {_describe(self.geometry)} " \
               f"(probe {self.probe})"
        if len(g) != len(self.geometry):
            raise MotionError(f"{mine}; this one has {_describe(g)}: the motion of another "
                              f"probe cannot correct it (estimate it on this recording)")
        diff = np.abs(g - self.geometry).max(axis=1)
        if diff.max() > tolerance_um:
            c = int(diff.argmax())
            raise MotionError(f"{mine}; this one has the same channel count but other "
                              f"positions (channel {c}: {g[c].tolist()} µm against "
                              f"{self.geometry[c].tolist()}): the motion of another probe "
                              f"cannot correct it")
        shanks = shank_labels(g, shank_ids)
        if not np.array_equal(shanks, self.channel_shanks):
            c = int(np.flatnonzero(shanks != self.channel_shanks)[0])
            raise MotionError(f"{mine}; this one puts channel {c} on shank {int(shanks[c])}, "
                              f"the motion on shank {int(self.channel_shanks[c])}")

    # -- state and files --------------------------------------------------------------------
    def to_state(self) -> dict:
        """The motion as float64 arrays (a pipeline step's fitted state; `from_state` reads it
        back): ``time_edges_s``, ``depths_um``, ``displacement``, ``bin_shanks``, and with a
        probe ``geometry`` and ``channel_shanks``.

        Examples
        --------
        >>> from dspk.motion import Motion
        >>> m = Motion([0.0, 2.0], [0.0], [[1.5]])
        >>> sorted(m.to_state()), Motion.from_state(m.to_state()).displacement
        (['bin_shanks', 'depths_um', 'displacement', 'time_edges_s'], array([[1.5]]))
        """
        state = {"time_edges_s": self.time_edges_s, "depths_um": self.depths_um,
                 "displacement": self.displacement,
                 "bin_shanks": self.bin_shanks.astype(np.float64)}
        if self.geometry is not None:
            state["geometry"] = self.geometry
            state["channel_shanks"] = self.channel_shanks.astype(np.float64)
        return {k: np.asarray(v, np.float64) for k, v in state.items()}

    @classmethod
    def from_state(cls, state: dict) -> "Motion":
        """The motion `to_state` wrote (a pipeline's fitted state, read back as float64).

        Parameters
        ----------
        state : dict

        Examples
        --------
        >>> from dspk.motion import Motion
        >>> Motion.from_state(Motion([0.0, 2.0], [0.0], [[1.5]]).to_state())
        Motion(rigid, 1 time bins of 2 s, displacement 1.5..1.5 µm)
        """
        geometry = state.get("geometry")
        shanks = state.get("channel_shanks")
        return cls(state["time_edges_s"], state["depths_um"], state["displacement"],
                   bin_shanks=np.rint(np.asarray(state["bin_shanks"])).astype(np.int64),
                   geometry=geometry,
                   channel_shanks=None if shanks is None
                   else np.rint(np.asarray(shanks)).astype(np.int64))

    def save(self, path: str | Path) -> None:
        """Write the motion to an ``.npz`` file (arrays, and a JSON header with the format
        version and the probe's digest); `load` reads it back.

        Parameters
        ----------
        path : str or Path

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np
        >>> from dspk.motion import Motion
        >>> geom = np.c_[np.zeros(4), 20.0 * np.arange(4)]
        >>> m = Motion([0.0, 2.0, 4.0], [30.0], [[0.0], [3.0]], geometry=geom)
        >>> tmp = tempfile.TemporaryDirectory()
        >>> m.save(os.path.join(tmp.name, "motion.npz"))
        >>> Motion.load(os.path.join(tmp.name, "motion.npz"), geometry=geom).displacement[:, 0]
        array([0., 3.])
        >>> tmp.cleanup()
        """
        meta = {"format": "dspk.motion", "version": MOTION_FILE_VERSION, "dspk": __version__,
                "probe": self.probe}
        np.savez(path, meta=json.dumps(meta), **self.to_state())

    @classmethod
    def load(cls, path: str | Path, geometry: Any = None, shank_ids: Any = None) -> "Motion":
        """A motion written by `save`; with ``geometry``, refused unless it is of that probe
        (`check_probe`).

        Parameters
        ----------
        path : str or Path
        geometry : array-like or probeinterface Probe, optional
            The probe the motion is to correct.
        shank_ids : array-like, optional
            Its channels' shanks.

        Raises
        ------
        MotionError
            Not a motion file, a newer format, or another probe's motion (the reason said).

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np
        >>> from dspk.motion import Motion
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = os.path.join(tmp.name, "motion.npz")
        >>> Motion([0.0, 2.0], [30.0], [[0.0]], geometry=np.c_[np.zeros(4), 20.0 *
        ...        np.arange(4)]).save(path)
        >>> Motion.load(path, geometry=np.c_[np.zeros(4), 15.0 * np.arange(4)])
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dspk.motion.MotionError: ...motion.npz: estimated on a probe of 4 channels ... positions ...
        >>> tmp.cleanup()
        """
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                state = {k: np.asarray(z[k]) for k in z.files if k != "meta"}
        except (OSError, ValueError, KeyError) as exc:
            raise MotionError(f"{path}: not a motion file written by Motion.save ({exc})") \
                from None
        if meta.get("format") != "dspk.motion":
            raise MotionError(f"{path}: not a motion file written by Motion.save")
        if int(meta.get("version", 0)) > MOTION_FILE_VERSION:
            raise MotionError(f"{path}: motion file format {meta['version']} is newer than "
                              f"this dspk reads ({MOTION_FILE_VERSION}); upgrade dspk")
        m = cls.from_state(state)
        if geometry is not None:
            m.check_probe(geometry, shank_ids, where=str(path))
        return m


def to_spikeinterface(motion: Motion) -> Any:
    """The motion as SpikeInterface's ``Motion`` (spikeinterface.core.motion; one segment,
    direction "y", its temporal bins the time bins' centres), for
    ``spikeinterface.preprocessing.interpolate_motion`` and SpikeInterface's plots. Imports
    SpikeInterface (which must be installed).

    SpikeInterface's ``Motion`` has no shanks: a motion of several shanks is refused. Its time
    bins are rebuilt from the centres (edges halfway between them): the same bins when the
    time bins are of one length.

    Parameters
    ----------
    motion : Motion

    Returns
    -------
    spikeinterface.core.motion.Motion

    Raises
    ------
    MotionError
        A motion of several shanks.
    ImportError
        SpikeInterface is not installed.

    Examples
    --------
    >>> from dspk.motion import Motion, to_spikeinterface
    >>> si_motion = to_spikeinterface(Motion([0.0, 2.0, 4.0], [100.0], [[0.0], [3.0]]))
    ... # doctest: +SKIP
    >>> si_motion.temporal_bins_s[0], si_motion.displacement[0][:, 0]   # doctest: +SKIP
    (array([1., 3.]), array([0., 3.]))
    """
    if not isinstance(motion, Motion):
        raise TypeError(f"motion: expected a dspk.motion.Motion, got {type(motion).__name__}")
    if len(motion.shanks) > 1:
        raise MotionError(f"motion: {len(motion.shanks)} shanks; SpikeInterface's Motion has "
                          f"one set of spatial bins for the whole probe (export each shank's "
                          f"recording with its own motion)")
    # SpikeInterface: an optional dependency, imported when asked for
    from spikeinterface.core.motion import Motion as SIMotion  # noqa: PLC0415

    return SIMotion(motion.displacement.copy(), motion.time_centres_s.copy(),
                    motion.depths_um.copy(), direction="y")
