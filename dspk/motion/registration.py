"""Decentralised registration of spike activity (DREDge, Windolf et al. 2023, "DREDge: robust
motion correction for high-density extracellular recordings across species"; the
``dredge_ap`` and ``decentralized`` estimators of SpikeInterface 0.105): the pieces
`dspk.motion.estimate` is made of, each usable alone.

1. `activity_raster`: spikes binned by time and depth, weighted by amplitude (or counted),
   smoothed along depth.
2. `spatial_windows`: one window over the whole depth (rigid), or overlapping Gaussian windows
   along depth (non-rigid), each registered on its own.
3. `pairwise_displacement`: for every pair of time bins within a horizon, the shift along depth
   that best aligns their (windowed) activity — the maximum of their centred, normalised
   cross-correlation over lags, refined between lags by a parabola. The correlations at every
   lag are products ``[time bins, depth] · [depth, time bins]``, one per lag, computed as one
   batched product on dspk's engine (`dspk.linalg.matmul`) over a strided view of the padded
   raster (each lag a view one element further: nothing is copied).
4. `solve_displacement`: the displacement of each time bin (and window) that best explains
   those pairwise shifts — a weighted least-squares problem whose weights are the
   correlations and the bins' activity (DREDge's noise model), with a temporal prior (a
   Tikhonov penalty on the change between neighbouring time bins) that carries the estimate
   through bins with little activity, a spatial prior between neighbouring windows, and a few
   rounds of robust reweighting (Huber) against pairs whose shift is an outlier. Windows are
   solved together, block-tridiagonally (one Cholesky factorisation per window).

Every step runs where the spikes are (NumPy or CuPy): on the GPU the pairwise shifts, their
weights and the solve stay on the device (an hour of 2-s bins is 38 windows of [1800, 1800]
float64 pairs, ~1 GB each array, and ~150 Cholesky factorisations of 1800 x 1800).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..backend import array_module, to_numpy
from ..linalg import MatrixView, matmul

__all__ = ["activity_raster", "spatial_windows", "pairwise_displacement",
           "registration_weights", "solve_displacement", "RASTER_WEIGHTS",
           "PAIRWISE_MEMORY_BYTES"]

#: how each spike counts in `activity_raster`
RASTER_WEIGHTS = ("count", "amplitude", "log_amplitude")
#: bound on the [lags, time bins, time bins] correlations of `pairwise_displacement` held at
#: once (rows of time bins are processed in blocks)
PAIRWISE_MEMORY_BYTES = 512 << 20
#: window values below this fraction of the window's peak are dropped (the window's support)
WINDOW_FLOOR = 1e-5
#: the Huber threshold of the robust reweighting, in robust standard deviations of the residuals
HUBER_K = 2.0


def activity_raster(times_s: Any, depths_um: Any, amplitudes: Any, time_edges_s: Any,
                    depth_edges_um: Any, weights: str = "count",
                    smooth_um: float = 1.0) -> Any:
    """Spike activity binned by time and depth: ``raster[k, d]`` sums the weights of the spikes
    of time bin k (edges ``time_edges_s``) at depth bin d (edges ``depth_edges_um``), then is
    smoothed along depth by a Gaussian of SD ``smooth_um`` (DREDge's amplitude-weighted raster,
    ``histogram_depth_smooth_um``). Spikes outside the edges are left out.

    Parameters
    ----------
    times_s, depths_um, amplitudes : array
        1-D, one value per spike (NumPy or CuPy: the raster is made where they are).
    time_edges_s, depth_edges_um : array-like
        Increasing bin edges (uniform).
    weights : {"count", "log_amplitude", "amplitude"}
        Each spike counts 1, ``log(1 + |amplitude|)`` or ``|amplitude|``.
    smooth_um : float
        The smoothing's SD in µm (0: none).

    Returns
    -------
    array
        [time bins, depth bins] float32, the spikes' array type.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import activity_raster
    >>> r = activity_raster(np.array([0.5, 0.7, 1.5]), np.array([2.2, 2.9, 0.1]),
    ...                     np.ones(3), [0.0, 1.0, 2.0], np.arange(5.0), weights="count",
    ...                     smooth_um=0.0)
    >>> r
    array([[0., 0., 2., 0.],
           [1., 0., 0., 0.]], dtype=float32)
    """
    if weights not in RASTER_WEIGHTS:
        raise ValueError(f"weights: expected one of {', '.join(RASTER_WEIGHTS)}, got "
                         f"{weights!r}")
    xp = array_module(times_s)
    te = np.asarray(to_numpy(time_edges_s), np.float64)
    de = np.asarray(to_numpy(depth_edges_um), np.float64)
    n_t, n_d = len(te) - 1, len(de) - 1
    if n_t < 1 or n_d < 1:
        raise ValueError("time_edges_s, depth_edges_um: expected at least one bin each")
    t = xp.asarray(times_s, dtype=np.float64)
    d = xp.asarray(depths_um, dtype=np.float64)
    # uniform bins: the bin is an integer division (searchsorted's answer, without its cost)
    ti = xp.floor((t - te[0]) / ((te[-1] - te[0]) / n_t)).astype(np.int64)
    di = xp.floor((d - de[0]) / ((de[-1] - de[0]) / n_d)).astype(np.int64)
    inside = (ti >= 0) & (ti < n_t) & (di >= 0) & (di < n_d)
    if weights == "count":
        w = inside.astype(np.float64)
    else:
        a = xp.abs(xp.asarray(amplitudes, dtype=np.float64))
        w = (a if weights == "amplitude" else xp.log1p(a)) * inside
    flat = xp.where(inside, ti * n_d + di, 0)
    raster = xp.bincount(flat, weights=w, minlength=n_t * n_d).reshape(n_t, n_d)
    sigma = float(smooth_um) / ((de[-1] - de[0]) / n_d)
    if sigma > 0.05:
        raster = _smooth_depth(xp, raster, sigma)
    return raster.astype(np.float32)


def _smooth_depth(xp: Any, r: Any, sigma_bins: float) -> Any:
    """Each row convolved with a normalised Gaussian of SD ``sigma_bins`` (zeros beyond the
    edges), as a sum of shifted rows (the kernel is a few bins long)."""
    half = max(1, int(math.ceil(3.0 * sigma_bins)))
    k = np.exp(-0.5 * (np.arange(-half, half + 1) / sigma_bins) ** 2)
    k /= k.sum()
    n = r.shape[1]
    pad = xp.zeros((r.shape[0], n + 2 * half), dtype=r.dtype)
    pad[:, half:half + n] = r
    out = xp.zeros_like(r)
    for j, kj in enumerate(k):
        out += kj * pad[:, j:j + n]
    return out


def spatial_windows(depth_centres_um: Any, low_um: float, high_um: float, rigid: bool = False,
                    step_um: float = 200.0, scale_um: float = 300.0) -> tuple:
    """The windows along depth each registered on its own: one window of ones (rigid), or
    Gaussian windows of SD ``scale_um`` whose centres are ``step_um`` apart, the outer ones
    ``scale_um / 2`` inside the probe's extent [low_um, high_um] (SpikeInterface's
    ``get_spatial_windows`` with its default margin). Values below `WINDOW_FLOOR` of the
    peak are zero.

    Parameters
    ----------
    depth_centres_um : array-like
        The depth bins' centres (µm).
    low_um, high_um : float
        The probe's (shank's) extent along depth.
    rigid : bool
        One window over everything.
    step_um, scale_um : float
        Non-rigid windows' spacing and SD (µm).

    Returns
    -------
    (windows, centres)
        float64 [windows, depth bins] and the windows' centres (µm). A probe too short for
        two windows gets one (the caller says so: it is rigid).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import spatial_windows
    >>> w, c = spatial_windows(np.arange(0.5, 1000.0), 0.0, 1000.0, step_um=200.0,
    ...                        scale_um=300.0)
    >>> c
    array([200., 400., 600., 800.])
    >>> w.shape, float(w[0, 200])
    ((4, 1000), 0.9999986111120756)
    """
    d = np.asarray(to_numpy(depth_centres_um), np.float64)
    if rigid:
        return np.ones((1, len(d))), np.array([0.5 * (low_um + high_um)])
    if not (step_um > 0 and scale_um > 0):
        raise ValueError(f"step_um, scale_um: expected positive window spacing and width in "
                         f"µm, got {step_um!r}, {scale_um!r}")
    lo, hi = low_um + scale_um / 2.0, high_um - scale_um / 2.0
    if hi < lo:
        centres = np.array([0.5 * (low_um + high_um)])
    else:
        n = int((hi - lo) // step_um)
        border = ((hi - lo) - n * step_um) / 2.0
        centres = lo + border + step_um * np.arange(n + 1)
    w = np.exp(-0.5 * ((d[None, :] - centres[:, None]) / scale_um) ** 2)
    w[w < WINDOW_FLOOR] = 0.0
    return w, centres


def pairwise_displacement(raster: Any, window: Any, max_lag: int,
                          horizon: int | None = None,
                          memory_bytes: int = PAIRWISE_MEMORY_BYTES) -> tuple:
    """For every pair of time bins (i, j) within ``horizon`` bins of each other, the shift
    along depth (in depth bins, between lags by a parabola through the peak) that best aligns
    the activity of bin j with that of bin i, and the correlation there: DREDge's
    ``xcorr_windows`` (centred, normalised, window-weighted cross-correlation).

    ``shift[i, j] = s`` means ``raster[j, d + s] ≈ raster[i, d]`` over the window: the
    activity moved by s bins from bin i to bin j (``p[j] − p[i]`` for displacements p).

    Parameters
    ----------
    raster : array
        [time bins, depth bins] (`activity_raster`), NumPy or CuPy: the products run there.
    window : array-like
        [depth bins] non-negative weights (`spatial_windows`); its support (non-zero range)
        is the template compared, searched in the raster ±``max_lag`` bins around it (zeros
        beyond the raster).
    max_lag : int
        The largest shift tried, in depth bins (≥ 1).
    horizon : int, optional
        Pairs further apart than this many time bins are not compared (shift 0, correlation
        0). Default: all pairs.
    memory_bytes : int
        Bound on the correlations held at once (rows of time bins in blocks).

    Returns
    -------
    (shift, corr)
        float64 [time bins, time bins] each, NumPy or CuPy as ``raster`` is.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import pairwise_displacement
    >>> d = np.arange(200.0)
    >>> bump = lambda c: np.exp(-0.5 * ((d - c) / 4.0) ** 2)
    >>> raster = np.stack([bump(80.0), bump(83.0), bump(90.5)]).astype(np.float32)
    >>> shift, corr = pairwise_displacement(raster, np.ones(200), max_lag=20)
    >>> np.round(shift[0], 1)
    array([ 0. ,  3. , 10.5])
    >>> bool(corr[0, 1] > 0.99)
    True
    """
    xp = array_module(raster)
    if getattr(raster, "ndim", None) != 2:
        raise ValueError(f"raster: expected [time bins, depth bins], got shape "
                         f"{getattr(raster, 'shape', None)}")
    r = xp.ascontiguousarray(raster, dtype=np.float32)
    n_t, n_d = r.shape
    w_host = np.asarray(to_numpy(window), np.float64).reshape(-1)
    if w_host.shape != (n_d,) or np.any(w_host < 0) or not np.all(np.isfinite(w_host)):
        raise ValueError(f"window: expected {n_d} non-negative weights (one per depth bin), "
                         f"got shape {w_host.shape}")
    lag = int(max_lag)
    if lag < 1:
        raise ValueError(f"max_lag: expected at least 1 depth bin, got {max_lag!r}")
    shift = xp.zeros((n_t, n_t))
    corr = xp.zeros((n_t, n_t))
    support = np.flatnonzero(w_host > 0)
    if support.size == 0 or n_t == 0:
        return shift, corr
    a, b = int(support[0]), int(support[-1]) + 1
    n = b - a
    horizon = n_t if horizon is None else max(0, int(horizon))
    n_lags = 2 * lag + 1
    width = n_d + 2 * lag
    padded = xp.zeros((n_t, width), dtype=np.float32)
    padded[:, lag:lag + n_d] = r
    flat = padded.reshape(-1)
    flat_sq = (padded * padded).reshape(-1)
    w = xp.asarray(w_host[a:b].astype(np.float32))
    total = float(w_host[a:b].sum())
    # the shifted templates: lag k (shift k − lag) of time bin j is padded[j, a + k : b + k],
    # a view one element further per lag (batch stride 1: nothing copied)
    shifted = MatrixView(flat, (n_lags, n_t, n), (1, width, 1), a, name="shifted")
    shifted_sq = MatrixView(flat_sq, (n_lags, n_t, n), (1, width, 1), a, name="shifted_sq")
    w_col = w.reshape(n, 1)
    mean_x = matmul(shifted, w_col)[:, :, 0] / total                  # [lags, T]
    var_x = matmul(shifted_sq, w_col)[:, :, 0] / total - mean_x * mean_x
    tmpl = r[:, a:b] * w[None, :]                                     # [T, n]
    mean_t = tmpl.sum(axis=1) / total
    var_t = (tmpl * r[:, a:b]).sum(axis=1) / total - mean_t * mean_t
    tiny = np.float32(1e-12)
    rows = max(1, int(memory_bytes // (4 * n_lags * min(n_t, 2 * horizon + 1) * 3)))
    for i0 in range(0, n_t, rows):
        i1 = min(n_t, i0 + rows)
        j0, j1 = max(0, i0 - horizon), min(n_t, i1 + horizon)
        cols = MatrixView(flat, (n_lags, n, j1 - j0), (1, 1, width), a + j0 * width,
                          name="shifted_t")
        g = matmul(xp.ascontiguousarray(tmpl[i0:i1]), cols)            # [lags, rows, cols]
        c = _normalised(xp, g, total, mean_t[i0:i1], mean_x[:, j0:j1], var_t[i0:i1],
                        var_x[:, j0:j1], tiny)
        best = xp.argmax(c, axis=0)                                     # [rows, cols]
        peak = xp.take_along_axis(c, best[None], axis=0)[0]
        inner = xp.clip(best, 1, n_lags - 2)
        c_lo = xp.take_along_axis(c, (inner - 1)[None], axis=0)[0]
        c_mid = xp.take_along_axis(c, inner[None], axis=0)[0]
        c_hi = xp.take_along_axis(c, (inner + 1)[None], axis=0)[0]
        curv = c_lo - 2 * c_mid + c_hi
        ok = (best == inner) & (curv < 0)
        frac = xp.where(ok, 0.5 * (c_lo - c_hi) / xp.where(ok, curv, -1), 0)
        s = best.astype(np.float64) - lag + xp.clip(frac, -0.5, 0.5)
        ii = xp.arange(i0, i1)[:, None]
        jj = xp.arange(j0, j1)[None, :]
        near = xp.abs(ii - jj) <= horizon
        shift[i0:i1, j0:j1] = xp.where(near, s, 0.0)
        corr[i0:i1, j0:j1] = xp.where(near, peak.astype(np.float64), 0.0)
    return shift, corr


def _normalised(xp: Any, g: Any, total: float, mean_t: Any, mean_x: Any, var_t: Any,
                var_x: Any, tiny: Any) -> Any:
    """The correlations of a block, in place of its products ``g`` [lags, rows, cols]:
    (g / total − mean_t·mean_x) / √(var_t·var_x), 0 where that variance product is not above
    ``tiny``. On the host lag by lag (each [rows, cols] slice stays in cache: the whole-block
    expressions passed over the block's memory nine times, as long as its product took); on
    the GPU as whole-block expressions. The same operations on each element either way."""
    if xp is not np:
        g /= total
        g -= mean_t[None, :, None] * mean_x[:, None, :]
        den = var_t[None, :, None] * var_x[:, None, :]
        good = den > tiny
        return xp.where(good, g / xp.sqrt(xp.where(good, den, 1)), 0)
    den = np.empty(g.shape[1:], dtype=g.dtype)
    good = np.empty(g.shape[1:], dtype=bool)
    for k in range(g.shape[0]):
        gk = g[k]
        gk /= total
        gk -= np.multiply.outer(mean_t, mean_x[k])
        np.multiply.outer(var_t, var_x[k], out=den)
        np.greater(den, tiny, out=good)
        np.sqrt(den, out=den, where=good)
        np.divide(gk, den, out=gk, where=good)
        gk[~good] = 0
    return g


def registration_weights(corr: Any, activity: Any, mincorr: float = 0.1) -> np.ndarray:
    """DREDge's weight of each pair's shift: ``1 / (1/S_ij + 1/a_i + 1/a_j)`` with
    ``S = corr²`` where the correlation reaches ``mincorr`` (else the pair is left out) and
    ``a`` the time bins' activity (their spike counts in the window): a pair counts by how
    well its bins correlate and how many spikes they hold. Pairs of a bin with itself, and of
    a bin without activity, weigh 0.

    Parameters
    ----------
    corr : array-like
        [time bins, time bins] correlations (`pairwise_displacement`).
    activity : array-like
        [time bins] non-negative activity of each bin.
    mincorr : float
        The smallest correlation a pair is used with.

    Returns
    -------
    array
        float64 [time bins, time bins], NumPy or CuPy as ``corr`` is.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import registration_weights
    >>> registration_weights(np.array([[1.0, 0.9], [0.9, 1.0]]), [100.0, 1.0]).round(3)
    array([[0.   , 0.446],
           [0.446, 0.   ]])
    """
    xp = array_module(corr)
    c = xp.asarray(corr, dtype=np.float64)
    a = xp.asarray(activity, dtype=np.float64).reshape(-1)
    if c.ndim != 2 or c.shape[0] != c.shape[1] or a.shape != (c.shape[0],):
        raise ValueError(f"corr, activity: expected [T, T] and [T], got {c.shape} and "
                         f"{a.shape}")
    s = xp.where(c >= mincorr, c * c, 0.0)
    xp.fill_diagonal(s, 0.0)
    # 1/0 taken as inf (a pair or bin without activity weighs 0), no division by zero done
    inv_a = xp.where(a > 0, 1.0 / xp.where(a > 0, a, 1.0), xp.inf)
    inv = xp.where(s > 0, 1.0 / xp.where(s > 0, s, 1.0), xp.inf) + \
        inv_a[:, None] + inv_a[None, :]
    return xp.where(xp.isfinite(inv), 1.0 / xp.where(xp.isfinite(inv), inv, 1.0), 0.0)


def _normal_matrix(u: Any) -> Any:
    """The Hessian of Σ u_ij (p_j − p_i − D_ij)²  / 2: the Laplacian of u + uᵀ (NumPy or
    CuPy)."""
    sym = u + u.T
    h = -sym
    i = array_module(u).arange(h.shape[0])
    h[i, i] += sym.sum(axis=1)
    return h


def _rhs(u: np.ndarray, shift: np.ndarray) -> np.ndarray:
    ud = u * shift
    return ud.sum(axis=0) - ud.sum(axis=1)


def _path_laplacian(n: int, xp: Any = np) -> Any:
    lap = xp.zeros((n, n))
    if n > 1:
        i = xp.arange(n - 1)
        lap[i, i] += 1
        lap[i + 1, i + 1] += 1
        lap[i, i + 1] -= 1
        lap[i + 1, i] -= 1
    return lap


def _inverse(factor: tuple) -> np.ndarray:
    """The inverse of a symmetric positive definite matrix from its `cho_factor`: LAPACK's
    ``potri`` (one triangle, then mirrored) rather than solving for the identity: equal to
    rounding, and `solve_displacement` of 3 windows x 1800 time bins (an hour of 2-s bins)
    took 2.3 s against 3.1-4.1 s on 2 cores."""
    from scipy.linalg.lapack import get_lapack_funcs  # noqa: PLC0415 (when used)

    c, lower = factor
    (potri,) = get_lapack_funcs(("potri",), (c,))
    inv, info = potri(c, lower=lower)
    if info != 0:
        raise np.linalg.LinAlgError(f"potri: info {info}")
    tri = np.tril(inv) if lower else np.triu(inv)
    return tri + tri.T - np.diag(np.diag(tri))


class _HostCholesky:
    """Cholesky factorisation, solve and SPD inverse on the host: SciPy's ``cho_factor`` /
    ``cho_solve`` and LAPACK's ``potri`` (`_inverse`)."""

    xp = np

    @staticmethod
    def factor(m: np.ndarray) -> tuple:
        from scipy.linalg import cho_factor  # noqa: PLC0415 (scipy.linalg: when used)

        return cho_factor(m)

    @staticmethod
    def solve(f: tuple, r: np.ndarray) -> np.ndarray:
        from scipy.linalg import cho_solve  # noqa: PLC0415 (scipy.linalg: when used)

        return cho_solve(f, r)

    inverse = staticmethod(_inverse)


class _DeviceCholesky:
    """Cholesky factorisation, solve and SPD inverse from ``xp.linalg.cholesky`` and a
    ``solve_triangular`` with SciPy's signature (CuPy: cuSOLVER's potrf and cuBLAS's trsm,
    float64). NumPy with SciPy's ``solve_triangular`` gives the same arithmetic on the host
    (how the CPU tests check this form)."""

    def __init__(self, xp: Any, solve_triangular: Any):
        self.xp, self.trsm = xp, solve_triangular

    def factor(self, m: Any) -> Any:
        return self.xp.linalg.cholesky(m)                  # lower: m = L Lᵀ

    def solve(self, low: Any, r: Any) -> Any:
        y = self.trsm(low, r, lower=True)
        return self.trsm(low, y, trans="T", lower=True)

    def inverse(self, low: Any) -> Any:
        # m⁻¹ = L⁻ᵀ L⁻¹: symmetric by construction
        li = self.trsm(low, self.xp.eye(low.shape[0]), lower=True)
        return li.T @ li


def _device_cholesky(xp: Any) -> _DeviceCholesky:
    if xp is np:
        from scipy.linalg import solve_triangular  # noqa: PLC0415 (when used)
    else:
        from cupyx.scipy.linalg import solve_triangular  # noqa: PLC0415 (CuPy only)
    return _DeviceCholesky(xp, solve_triangular)


def _solve_blocks(diag: list, coupling: float, rhs: list,
                  chol: Any = _HostCholesky) -> Any:
    """The block-tridiagonal system with diagonal blocks ``diag`` (symmetric positive
    definite) and off-diagonal blocks ``−coupling·I`` (block Thomas algorithm: one Cholesky
    factorisation per block), with ``chol``'s factorisation (`_HostCholesky` on the host,
    `_DeviceCholesky` on the GPU)."""
    n_b = len(diag)
    if n_b == 1 or coupling == 0:
        return chol.xp.stack([chol.solve(chol.factor(a), r) for a, r in zip(diag, rhs)])
    gammas, ys = [], []
    prev_g = prev_y = None
    for b in range(n_b):
        m = diag[b] if prev_g is None else diag[b] - coupling * coupling * prev_g
        r = rhs[b] if prev_y is None else rhs[b] + coupling * prev_y
        f = chol.factor(m)
        prev_y = chol.solve(f, r)
        prev_g = chol.inverse(f) if b < n_b - 1 else None
        gammas.append(prev_g)
        ys.append(prev_y)
    out = [None] * n_b
    out[-1] = ys[-1]
    for b in range(n_b - 2, -1, -1):
        out[b] = ys[b] + coupling * (gammas[b] @ out[b + 1])
    return chol.xp.stack(out)


def solve_displacement(shifts: Any, weights: Any, lambda_t: float = 1.0,
                       lambda_s: float = 1.0, robust_iterations: int = 3,
                       eps: float = 1e-3) -> np.ndarray:
    """The displacement ``p[b, t]`` of each window b and time bin t that best explains the
    pairwise shifts: the minimum of

        Σ_b Σ_ij W[b,i,j] (p[b,j] − p[b,i] − D[b,i,j])²
        + λ_t Σ_b Σ_t (p[b,t+1] − p[b,t])² + λ_s Σ_b Σ_t (p[b+1,t] − p[b,t])² + ε Σ p²

    (DREDge's decentralised registration with its temporal and spatial priors; the small
    ridge ε fixes the free constant: the displacement has mean ≈ 0), then ``robust_iterations``
    rounds of Huber reweighting: a pair whose residual exceeds `HUBER_K` robust SDs has its
    weight scaled down by ``K·σ/|residual|``.

    Parameters
    ----------
    shifts : array-like
        [windows, T, T] (or [T, T]) pairwise shifts ``D[i, j] ≈ p[j] − p[i]``.
    weights : array-like
        Their weights, the same shape (`registration_weights`).
    lambda_t, lambda_s : float
        The temporal and spatial priors' strengths (≥ 0).
    robust_iterations : int
        Rounds of reweighting (0: plain least squares).
    eps : float
        The ridge (> 0).

    Returns
    -------
    array
        float64 [windows, T] (or [T] for 2-D input), NumPy or CuPy as ``shifts`` is: CuPy
        shifts are solved on the device (cuSOLVER's Cholesky in float64, the residuals and
        their median there).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion import solve_displacement
    >>> p = np.array([0.0, 2.0, 5.0, 4.0, 3.0, 1.0, 0.0, -2.0])
    >>> shifts = p[None, :] - p[:, None]             # shifts[i, j] = p[j] - p[i]
    >>> shifts[0, 3] = shifts[3, 0] = 40.0           # one pair an outlier
    >>> plain = solve_displacement(shifts, np.ones((8, 8)), lambda_t=0.0, robust_iterations=0)
    >>> np.round(plain - plain.mean() - (p - p.mean()), 2) + 0.0      # pulled by it
    array([ 0.5,  0. ,  0. , -0.5,  0. ,  0. ,  0. ,  0. ])
    >>> est = solve_displacement(shifts, np.ones((8, 8)), lambda_t=0.0)  # reweighted
    >>> np.round(est - est.mean() - (p - p.mean()), 2) + 0.0
    array([0., 0., 0., 0., 0., 0., 0., 0.])
    """
    xp = array_module(shifts)
    d = xp.asarray(shifts, dtype=np.float64)
    u = xp.asarray(weights, dtype=np.float64)
    flat = d.ndim == 2
    if flat:
        d, u = d[None], u[None]
    if d.ndim != 3 or d.shape[1] != d.shape[2] or u.shape != d.shape:
        raise ValueError(f"shifts, weights: expected [windows, T, T] each, got {d.shape} and "
                         f"{u.shape}")
    if not (lambda_t >= 0 and lambda_s >= 0 and eps > 0):
        raise ValueError("lambda_t, lambda_s: expected >= 0; eps: expected > 0")
    if not bool(xp.isfinite(d).all() & xp.isfinite(u).all() & (u >= 0).all()):
        raise ValueError("shifts, weights: expected finite values and non-negative weights")
    n_b, n_t = d.shape[0], d.shape[1]
    prior = lambda_t * _path_laplacian(n_t, xp) + eps * xp.eye(n_t)
    neighbours = np.full(n_b, 2.0)
    neighbours[[0, -1]] = 1.0
    if n_b == 1:
        neighbours[:] = 0.0
    chol = _HostCholesky if xp is np else _device_cholesky(xp)
    used = u > 0
    any_used = bool(used.any())
    uw = u.copy()
    p = xp.zeros((n_b, n_t))
    for it in range(int(robust_iterations) + 1):
        diag = [_normal_matrix(uw[b]) + prior + lambda_s * float(neighbours[b]) * xp.eye(n_t)
                for b in range(n_b)]
        p = _solve_blocks(diag, lambda_s, [_rhs(uw[b], d[b]) for b in range(n_b)], chol)
        if it == robust_iterations or not any_used:
            break
        resid = xp.abs(p[:, None, :] - p[:, :, None] - d)
        sigma = 1.4826 * float(xp.median(resid[used]))
        if sigma <= 0:
            break
        scale = xp.minimum(1.0, HUBER_K * sigma / xp.maximum(resid, 1e-300))
        uw = u * scale
    return p[0] if flat else p
