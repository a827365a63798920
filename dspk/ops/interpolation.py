"""Bad-channel interpolation as a spatial matrix: each bad channel replaced by a kriging
(Gaussian-kernel) average of the good ones, as SpikeInterface's ``interpolate_bad_channels``
and IBL's ``interpolate_bad_channels`` compute it; applied with `dspk.ops.spatial_filter`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..argnames import arg
from ._checks import positions, positive_number

__all__ = ["interpolation_matrix", "WEIGHT_THRESHOLD"]

#: kernel values, and normalised weights, below this are dropped (the reference's
#: ``weight_threshold``)
WEIGHT_THRESHOLD = 0.005


def _bad_mask(bad: Any, n: int) -> np.ndarray:
    b = bad.get() if hasattr(bad, "get") else bad
    b = np.asarray(b)
    if b.dtype == bool:
        if b.shape != (n,):
            raise ValueError(f"bad: a mask needs one flag per channel ({n}), got shape "
                             f"{b.shape}")
        return b.copy()
    if b.size == 0:
        return np.zeros(n, dtype=bool)
    if b.ndim != 1 or b.dtype.kind not in "iu":
        raise ValueError(f"bad: expected channel indices (a 1-D list of integers) or a "
                         f"boolean mask of {n} flags, got {b.dtype} of shape {b.shape}")
    unknown = b[(b < 0) | (b >= n)]
    if unknown.size:
        raise ValueError(f"bad: channel {int(unknown[0])} is not one of the {n} channels of "
                         f"{arg('geometry')} (indices 0..{n - 1})")
    mask = np.zeros(n, dtype=bool)
    mask[b] = True
    return mask


def _kernel(good: np.ndarray, bad: np.ndarray, sigma_um: Any, p: float) -> np.ndarray:
    """[good, bad] kernel exp(−(d/σ)^p): Euclidean d for one σ, or (x, y) distances with
    σx and σy (the reference's Kilosort 2.5 mode: exp(−(dx/σx)^p − (dy/σy)^p))."""
    dx = np.abs(good[:, None, 0] - bad[None, :, 0])
    dy = np.abs(good[:, None, 1] - bad[None, :, 1])
    if np.ndim(sigma_um) == 0:
        sigma = positive_number("sigma_um", sigma_um)
        return np.exp(-((np.sqrt(dx * dx + dy * dy) / sigma) ** p))
    pair = np.asarray(sigma_um, dtype=object).ravel()
    if pair.size != 2:
        raise ValueError(f"sigma_um: expected one number or a (sigma_x, sigma_y) pair in µm, "
                         f"got {sigma_um!r}")
    sx, sy = (positive_number("sigma_um", v) for v in pair)
    return np.exp(-((dx / sx) ** p) - (dy / sy) ** p)


def interpolation_matrix(geometry: Any, bad: Any, *, sigma_um: Any = 20.0, p: float = 1.3,
                         weights: Any = None) -> np.ndarray:
    """W [channels, channels] that replaces each bad channel by a weighted average of the good
    ones and keeps the good ones: ``spatial_filter(W, x)`` equals SpikeInterface's
    ``interpolate_bad_channels(recording, bad_channel_ids, sigma_um=sigma_um, p=p)``
    (spikeinterface.preprocessing, version 0.105; the kriging of IBL's
    ``interpolate_bad_channels``) on the same traces.

    The weights are the reference's: the kernel ``k = exp(−(d/sigma_um)^p)`` between every good
    channel and every bad one (d: the distance between contacts, µm); kernel values below
    0.005 dropped; each bad channel's column divided by its sum; normalised weights below
    0.005 dropped again, without a second normalisation (so a bad channel far from every good
    one is all zeros, as in the reference). Row b of W holds bad channel b's weights at the
    good channels (zero at the bad ones); the row of a good channel is the identity's.

    What differs from the reference: ``sigma_um`` defaults to 20 µm, where the reference
    estimates it from the geometry when not given (the most common step between distinct
    y positions: 20 µm on NP1.0, 15 µm on NP2.0); pass it to match. Channels are indices
    into ``geometry`` (or a mask), not channel ids.

    Parameters
    ----------
    geometry : array-like or probeinterface Probe
        [channels, 2] contact positions in µm (x, y), finite, in the channel order of the
        traces W will be applied to.
    bad : array-like
        The bad channels: indices into ``geometry`` (duplicates are harmless) or a boolean
        mask of one flag per channel. Empty: W is the identity. At least one channel must
        stay good.
    sigma_um : float or (float, float)
        The kernel's scale in µm (> 0), or a (sigma_x, sigma_y) pair: then the kernel is
        ``exp(−(dx/sigma_x)^p − (dy/sigma_y)^p)``, the reference's Kilosort 2.5 mode.
    p : float
        The kernel's exponent (> 0; default 1.3, as the reference).
    weights : array-like, optional
        [good channels, bad channels] weights to use instead (the reference's ``weights``),
        good and bad channels each in increasing index order.

    Returns
    -------
    numpy.ndarray
        W [channels, channels], float64, dense (`spatial_filter` finds it sparse; give it
        ``cupy.asarray(W)`` for CuPy traces).

    Raises
    ------
    ValueError
        geometry not [channels, 2] or not finite, ``bad`` naming a channel outside the
        geometry, every channel bad, a non-positive ``sigma_um`` or ``p``, ``weights`` of
        the wrong shape or not finite.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import interpolation_matrix, spatial_filter
    >>> geom = np.c_[np.zeros(5), 20.0 * np.arange(5)]            # a column, 20 µm pitch
    >>> w = interpolation_matrix(geom, [2])
    >>> np.round(w[2], 4)                              # channel 2 from its neighbours
    array([0.0941, 0.4059, 0.    , 0.4059, 0.0941])
    >>> bool((w[[0, 1, 3, 4]] == np.eye(5)[[0, 1, 3, 4]]).all())   # the good ones kept
    True
    >>> x = np.arange(15, dtype=np.float32).reshape(5, 3)
    >>> spatial_filter(w, x)[2]                        # a linear gradient is kept
    array([6., 7., 8.], dtype=float32)
    """
    g = positions(geometry)
    n = len(g)
    mask = _bad_mask(bad, n)
    p = positive_number("p", p)
    bad_idx, good_idx = np.flatnonzero(mask), np.flatnonzero(~mask)
    if good_idx.size == 0:
        raise ValueError(f"bad: all {n} channels are bad; at least one good channel is needed "
                         f"to interpolate from")
    w = np.eye(n)
    if bad_idx.size == 0:
        return w
    if weights is None:
        k = _kernel(g[good_idx], g[bad_idx], sigma_um, p)
        k[k < WEIGHT_THRESHOLD] = 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            k /= k.sum(axis=0)[None, :]
        k[(k < WEIGHT_THRESHOLD) | np.isnan(k)] = 0.0
    else:
        k = np.asarray(weights.get() if hasattr(weights, "get") else weights,
                       dtype=np.float64)
        if k.shape != (good_idx.size, bad_idx.size):
            raise ValueError(f"weights: expected [good channels, bad channels] = "
                             f"[{good_idx.size}, {bad_idx.size}], got shape {k.shape}")
        if not np.isfinite(k).all():
            raise ValueError("weights: must be finite")
    w[bad_idx] = 0.0
    w[np.ix_(bad_idx, good_idx)] = k.T
    return w
