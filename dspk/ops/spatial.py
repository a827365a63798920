"""Spatial operations: whitening matrices (global and local ZCA), spatial filters, common
references."""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np
# numpy.median imports numpy.ma on its first call (its NaN check asks whether the array is
# masked): 10-20 ms of a first median reference on 2 cores, imported here with the module
# that calls it instead
import numpy.ma  # noqa: F401

from ..backend import array_module, blocked_transpose, cupy_module, is_cupy_array, to_numpy
from ..caches import LRU, shared
from ..linalg import matmul
from ..linalg.threads import parallel_blocks, single_threaded_blas
from ..linalg.eigh import device_eigh, device_eigh_supported
from ..linalg.engine import current_engine
from ..linalg.host_checks import identical, max_relative_difference, to_host
from ..linalg.prepared import PreparedCache, buffer_identity
from ..finite import NonFiniteError, api, check_finite
from ._checks import FLOATS, geometry, traces
from ._parallel import blocks
from ._spatial_gpu import SparseRowsPlan
from .spatial_cpu import MAX_AREA, ROW_BLOCKS, RowBlocksPlan
from ._traces_gpu import car_median, car_reason
from .distance import probe_sqdist

__all__ = ["whitening_matrix", "spatial_filter", "SpatialFilter", "common_reference", "neighbors",
           "bipolar_matrix", "laplacian_matrix"]

DEFAULT_EPS = 1e-8  # relative to the mean eigenvalue (see whitening_matrix)


def _check_cov(cov: Any) -> Any:
    if not (isinstance(cov, np.ndarray) or is_cupy_array(cov)):
        raise TypeError(f"cov: expected a NumPy or CuPy array, got {type(cov).__name__}")
    xp = array_module(cov)
    if cov.ndim != 2 or cov.shape[0] != cov.shape[1] or cov.shape[0] == 0:
        raise ValueError(f"cov: expected a square [channels, channels] matrix, got {cov.shape}")
    a = cov if cov.dtype in FLOATS else cov.astype(np.float64)
    if not bool(xp.isfinite(a).all()):
        i, j = (int(v) for v in xp.argwhere(~xp.isfinite(a))[0])
        raise NonFiniteError(f"cov: not finite at channels ({i}, {j})")
    tol = 1e-6 * (float(max(a.max(), -a.min())) or 1.0)
    # |cov - covᵀ| in tiles of whole rows against whole columns: the transposed operand read
    # 64 contiguous values at a time (one pass over a 384-channel cov: 0.35 ms, not 1)
    n, step = a.shape[0], 64
    worst = max(float(xp.abs(a[i:i + step] - a[:, i:i + step].T).max()) for i in range(0, n, step))
    if worst > tol:
        asym = xp.abs(a - a.T)
        i, j = (int(v) for v in np.unravel_index(int(asym.argmax()), asym.shape))
        raise ValueError(f"cov: not symmetric: cov[{i}, {j}] = {float(a[i, j])!r} but "
                         f"cov[{j}, {i}] = {float(a[j, i])!r}")
    return xp


def _zca(xp: Any, c: Any, eps: float | None, scale: Any, first_row: bool = False,
         eigh: Any = None) -> Any:
    """E·diag((d + ε)^-½)·Eᵀ for a stack of symmetric matrices c [..., k, k] (float64), with
    ε = eps·scale (scale: the mean eigenvalue of each real matrix, [..., 1]); with
    ``first_row``, only each matrix's first row [..., k] (local whitening keeps no other).
    LAPACK and BLAS on one thread: the same W in every process, whatever its thread count.
    A stack's eigendecompositions run in fixed blocks of `EIGH_BLOCK` matrices on the BLAS
    threads (`parallel_blocks`): each matrix's is LAPACK's alone, so the blocks change no bit,
    and 384 neighbourhoods of 32 take 30 ms on one core (the local W's whole cost).
    ``eigh``: another decomposition of the stack (a GPU caller's `dspk.linalg.eigh.
    device_eigh`)."""
    if eigh is not None:
        d, e = eigh(c)
    elif xp is np and c.ndim == 3 and len(c) > EIGH_BLOCK:
        parts = parallel_blocks(np.linalg.eigh, [c[i:i + EIGH_BLOCK]
                                                 for i in range(0, len(c), EIGH_BLOCK)])
        d = np.concatenate([p[0] for p in parts])
        e = np.concatenate([p[1] for p in parts])
    else:
        with single_threaded_blas():
            d, e = xp.linalg.eigh(c)
    with single_threaded_blas():
        d = xp.maximum(d, 0)
        base = eps if eps is not None else DEFAULT_EPS
        floor = xp.where(scale > 0, base * scale, 1.0)  # all-zero covariance: W = I
        s = 1.0 / xp.sqrt(d + floor)
        if first_row:
            # row 0 of E·diag(s)·Eᵀ: Σ_j E[0, j]·s[j]·E[i, j] — a [k]-vector per matrix
            return xp.einsum("nij,nj->ni", e, e[:, 0, :] * s)
        return (e * s[..., None, :]) @ xp.swapaxes(e, -1, -2)


#: matrices per block of a stack's eigendecompositions (`_zca`): 12 blocks for 384 channels
EIGH_BLOCK = 32


def neighbors(geom: Any, n_neighbors: int | None = None, radius_um: float | None = None) -> list:
    """Per channel, the indices of its neighbourhood (itself first, then by distance): the
    ``n_neighbors`` nearest channels, or those within ``radius_um`` µm.

    Parameters
    ----------
    geom : array-like
        [channels, D] contact positions in µm.
    n_neighbors : int, optional
        Neighbourhood size, the channel itself included (wins over ``radius_um``).
    radius_um : float, optional
        Every channel within this distance (inclusive), itself included.

    Returns
    -------
    list of numpy.ndarray
        One int64 index array per channel: the channel itself, then the others by distance
        (equal distances by channel index).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import neighbors
    >>> geom = np.c_[np.zeros(4), 20.0 * np.arange(4)]     # a column, 20 µm pitch
    >>> [h.tolist() for h in neighbors(geom, n_neighbors=2)]
    [[0, 1], [1, 0], [2, 1], [3, 2]]
    >>> [h.tolist() for h in neighbors(geom, radius_um=25.0)]
    [[0, 1], [1, 0, 2], [2, 1, 3], [3, 2]]
    """
    g = np.asarray(geom, dtype=np.float64)
    d = np.sqrt(probe_sqdist(g))
    ranked = d.copy()
    np.fill_diagonal(ranked, -1.0)          # itself first, then by distance (ties: by index)
    order = np.argsort(ranked, axis=1, kind="stable")
    if n_neighbors is not None:
        return list(order[:, :n_neighbors])
    counts = (d <= radius_um).sum(axis=1)   # sorted by distance: the neighbourhood is a prefix
    return [order[c, :counts[c]] for c in range(len(g))]


@api
def whitening_matrix(cov: Any, eps: float | None = None, geometry_um: Any = None,
                     n_neighbors: int | None = None, radius_um: float | None = None) -> Any:
    """ZCA whitening matrix W, applied as ``spatial_filter(W, x)``.

    Global (no geometry): W = E·diag((d + ε)^-½)·Eᵀ from the eigendecomposition cov = E·diag(d)·Eᵀ,
    so W·x has (nearly) identity covariance. Local (geometry with ``n_neighbors`` or
    ``radius_um``): each channel is whitened against its neighbourhood — the k nearest channels
    (Kilosort4 uses 32) or those within a radius (SpikeInterface uses 100 µm) — and keeps its own
    row of that neighbourhood's ZCA matrix; every neighbourhood's eigendecomposition runs in one
    batched call (padded to the largest neighbourhood with an uncoupled identity block).

    Parameters
    ----------
    cov : array
        [channels, channels], symmetric and finite (float32 or float64; computed in float64).
    eps : float, optional
        Regularization relative to the mean eigenvalue of each (sub)matrix: ε = eps·mean(d),
        default 1e-8 (below float32's resolution of a covariance, so whitened data has unit
        variance to ~1e-6 on full-rank data). A singular covariance (a short chunk, dead
        channels) gives no NaN; an all-zero covariance gives the identity.
    geometry_um : array, optional
        [channels, 2] contact positions in µm (or a probeinterface Probe).
    n_neighbors, radius_um :
        The neighbourhood for local whitening (one of them, with ``geometry_um``).

    Returns
    -------
    array
        W [channels, channels] in cov's dtype (dense; local W has k non-zeros per row).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import covariance, spatial_filter, whitening_matrix
    >>> rng = np.random.default_rng(0)
    >>> mix = np.array([[1.0, 0.0, 0.0], [0.9, 0.4, 0.0], [0.5, 0.5, 0.7]])
    >>> x = (mix @ rng.standard_normal((3, 20000))).astype(np.float32)   # correlated
    >>> w = whitening_matrix(covariance(x))
    >>> w.dtype, bool(np.allclose(w, w.T, atol=1e-6))                  # ZCA: symmetric
    (dtype('float32'), True)
    >>> np.round(covariance(spatial_filter(w, x)), 3) + 0.0
    array([[1., 0., 0.],
           [0., 1., 0.],
           [0., 0., 1.]], dtype=float32)

    Local whitening, each channel against its 3 nearest:

    >>> geom = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    >>> y = rng.standard_normal((6, 20000)).astype(np.float32)
    >>> w = whitening_matrix(covariance(y), geometry_um=geom, n_neighbors=3)
    >>> (w != 0).sum(axis=1)
    array([3, 3, 3, 3, 3, 3])
    """
    if is_cupy_array(cov):
        # CuPy in, CuPy out, assembled on the host (W is [channels, channels], made once per
        # recording: CuPy's kernels around it would cost 6-10 s of NVRTC compiles on a fresh
        # machine), the neighbourhoods' eigendecompositions by cuSOLVER's batched Jacobi
        # without CuPy kernels (`dspk.linalg.eigh`): 0.35 ms where LAPACK took 14 ms on the
        # H100 host's 16 cores. W agrees with NumPy input's to ~1e-13 (not bit for bit).
        g = geometry_um.get() if is_cupy_array(geometry_um) else geometry_um
        w = _whitening_matrix(to_host(cov), eps, g, n_neighbors, radius_um, device=True)
        return cupy_module().asarray(w)
    return _whitening_matrix(cov, eps, geometry_um, n_neighbors, radius_um)


def _whitening_matrix(cov: Any, eps: float | None, geometry_um: Any, n_neighbors: int | None,
                      radius_um: float | None, device: bool = False) -> Any:
    """`whitening_matrix` of a host (or NumPy-like) cov; with ``device``, a local W's
    eigendecompositions on the current CUDA device where cuSOLVER's batched Jacobi takes
    them (neighbourhoods of at most 32 channels)."""
    xp = _check_cov(cov)
    dtype = cov.dtype if cov.dtype in FLOATS else np.dtype(np.float64)
    if eps is not None and not eps > 0:
        raise ValueError(f"eps: expected a positive number, got {eps}")
    c64 = cov.astype(np.float64)
    n = cov.shape[0]
    if geometry_um is None:
        if n_neighbors is not None or radius_um is not None:
            raise ValueError("geometry_um: local whitening (n_neighbors or radius_um) needs the "
                             "channel positions")
        scale = xp.trace(c64).reshape(1) / n                  # mean eigenvalue
        return _zca(xp, c64, eps, scale).astype(dtype)
    g = geometry(geometry_um, n, xp)
    if (n_neighbors is None) == (radius_um is None):
        raise ValueError("give exactly one of n_neighbors and radius_um for local whitening")
    if n_neighbors is not None and not 1 <= int(n_neighbors):
        raise ValueError(f"n_neighbors: expected >= 1, got {n_neighbors}")
    if radius_um is not None and not radius_um >= 0:
        raise ValueError(f"radius_um: expected >= 0, got {radius_um}")
    plan = _hood_plan(np.asarray(g, dtype=np.float64),
                      None if n_neighbors is None else min(int(n_neighbors), n), radius_um)
    k, valid = plan.k, plan.valid
    # the neighbourhoods' covariances [n, k, k] by one gather from cov padded with k
    # uncoupled, well-scaled channels (a short neighbourhood's padding: slot j -> n + j)
    diag_fill = max(float(np.abs(np.diagonal(c64)).mean()), 1e-300)
    padded = np.zeros((n + k, n + k))
    padded[:n, :n] = c64
    padded[np.arange(n, n + k), np.arange(n, n + k)] = diag_fill
    sub = np.take(padded.reshape(-1), plan.flat)
    # ε from each real neighbourhood's mean eigenvalue (its trace / its size), not the padding
    scale = (np.diagonal(sub, axis1=1, axis2=2) * valid).sum(axis=1, keepdims=True) / \
        valid.sum(axis=1, keepdims=True)
    eigh = device_eigh if device and device_eigh_supported(sub) else None
    rows = _zca(xp, sub, eps, scale, first_row=True, eigh=eigh)        # own row (first)
    w = np.zeros((n, n), dtype=np.float64)
    w[plan.rows, plan.cols] = rows[valid]
    return w.astype(dtype)


class _HoodPlan:
    """Local whitening's index plan for one probe and neighbourhood: each channel's
    neighbourhood (`neighbors`) as k slots (``valid``: a real channel), the flat indices of
    its [k, k] covariance in cov padded with k channels (a short neighbourhood's slot j is
    channel n + j: an uncoupled block), and where each own row goes in W."""

    __slots__ = ("k", "valid", "flat", "rows", "cols")

    def __init__(self, geom: np.ndarray, n_neighbors: int | None, radius_um: float | None):
        hoods = neighbors(geom, n_neighbors, radius_um)
        n = len(hoods)
        k = max(len(h) for h in hoods)
        idx = np.tile(np.arange(n, n + k), (n, 1))
        valid = np.zeros((n, k), dtype=bool)
        for c, h in enumerate(hoods):
            idx[c, :len(h)] = h
            valid[c, :len(h)] = True
        self.k, self.valid = k, valid
        self.flat = idx[:, :, None] * (n + k) + idx[:, None, :]
        self.rows = np.repeat(np.arange(n), k).reshape(n, k)[valid]
        self.cols = idx[valid]
        # read-only, as shared arrays should be — but not ``flat``: numpy.take copies a
        # read-only index first (2.1 ms against 0.3 here)
        for a in (self.valid, self.rows, self.cols):
            a.setflags(write=False)


#: probes and neighbourhoods whose `_HoodPlan` is kept: a batch of recordings of one probe
#: finds its neighbourhoods once (2-3 ms of a 384-channel local W's 5-25 ms)
HOOD_PLANS = 8
_hood_lock = threading.Lock()


def _hood_plan(geom: np.ndarray, n_neighbors: int | None, radius_um: float | None
               ) -> _HoodPlan:
    key = (geom.shape, geom.tobytes(), n_neighbors,
           None if radius_um is None else float(radius_um))
    store = shared("whitening_neighbourhoods", lambda: LRU(max_entries=HOOD_PLANS))
    with _hood_lock:
        plan = store.get(key)
    if plan is None:
        plan = _HoodPlan(geom, n_neighbors, radius_um)
        with _hood_lock:
            store.put(key, plan)
    return plan


#: a W with at most this many non-zeros per row, and at most SPARSE_DENSITY of them overall,
#: may be applied as a sparse matrix (local whitening: ~32 of 384 per row)
SPARSE_MAX_ROW = 64
SPARSE_DENSITY = 0.25
#: (groups of 8 rows per thread block, sample vectors per lane, persistent double-buffered
#: blocks) tried for the sparse kernel (the tuner keeps the fastest)
SPARSE_KERNEL_VARIANTS = ((8, 2, False), (4, 2, False), (8, 1, False), (4, 1, False),
                          (2, 1, False), (8, 1, True), (4, 1, True), (2, 1, True))


class SpatialFilter:
    """A [out_channels, channels] matrix W prepared for applying to many blocks of traces:
    ``SpatialFilter(W)(x)`` is ``W·x``, the same as `spatial_filter` without its per-call
    analysis of W (the sparsity pattern, the sparse kernel's plan: built once, on first use).

    A dense W goes through `dspk.linalg.matmul` (exact in x's precision; W is converted to x's
    dtype). A neighbourhood-sparse W (at most `SPARSE_MAX_ROW` non-zeros per row and
    `SPARSE_DENSITY` overall: local whitening, local references, Laplacians) has more
    implementations: on the GPU a kernel of its own (dspk/kernels/spatial.cu: rows with
    overlapping neighbourhoods grouped, each group's x rows staged once in shared memory) and
    cuSPARSE's CSR product; on the CPU scipy.sparse in sample blocks and dense products of
    W's row blocks with the x rows their non-zeros reach (`dspk.ops.spatial_cpu`). The tuner
    times them against the dense product on first sight of a size class, checks each result
    against it (relative 1e-5 in float32, 1e-12 in float64) and keeps the fastest.

    W must not be modified while the SpatialFilter is in use (its copies would be stale).

    Parameters
    ----------
    w : numpy.ndarray or cupy.ndarray
        [out_channels, channels], non-empty; x must be of the same array type (and device).

    Attributes
    ----------
    sparse : bool
        Whether W counts as neighbourhood-sparse (so the sparse implementations are tried).
    chosen : str or None
        The implementation that computed the last call (``"dense_matmul"``, ``"csr"``, ...).

    Examples
    --------
    >>> import numpy as np, dspk
    >>> w = dspk.ops.laplacian_matrix(np.c_[np.zeros(8), 20.0 * np.arange(8)], n_neighbors=2)
    >>> f = dspk.SpatialFilter(w)
    >>> x = np.ones((8, 100), dtype=np.float32)
    >>> float(abs(f(x)).max())
    0.0
    """

    @api
    def __init__(self, w: Any) -> None:
        _check_w(w)
        self.w = w
        self.xp = array_module(w)
        # W's pattern read on the host (CuPy's comparison and sum would be compiled in a
        # first call: 1.5 s on a fresh machine); W is [out_channels, channels], small
        host = to_host(w)
        check_finite(host, "w", ("row", "column"))   # (checked once, here: W is fixed)
        nnz = (host != 0).sum(axis=1)
        self.max_row_nnz = int(nnz.max())
        self.sparse = (self.max_row_nnz <= SPARSE_MAX_ROW and w.shape[1] > SPARSE_MAX_ROW and
                       int(nnz.sum()) <= SPARSE_DENSITY * w.size)
        self._cast: dict = {}
        self._csr: dict = {}
        self._plans: dict = {}
        self._host: np.ndarray | None = host.astype(np.float64) if self.xp is not np else None
        self._row_plans: dict = {}
        self.chosen: str | None = None    # the implementation of the last call
        self._choice: dict = {}

    def _w(self, dtype: Any) -> Any:
        key = np.dtype(dtype)
        if key not in self._cast:
            self._cast[key] = self.w.astype(key, copy=False)
        return self._cast[key]

    def _kernel_plan(self, x: Any, groups: int, vpl: int = 2, pipe: bool = False) -> Any:
        """The sparse kernel's plan for x's device and dtype (None if it cannot run)."""
        key = (x.device.id, x.dtype, groups, vpl, pipe)
        if key not in self._plans:
            if self._host is None:
                self._host = to_numpy(self.w).astype(np.float64)
            plan = SparseRowsPlan(self._host, x.dtype, groups, vpl, pipe)
            self._plans[key] = plan if plan.reason(x.device.id) is None else None
        return self._plans[key]

    def _row_plan(self, dtype: Any, rows: int) -> RowBlocksPlan | None:
        """The CPU's row-block plan for x's dtype (None where its blocks cover more than
        `MAX_AREA` of W: channels not in probe order, or wide neighbourhoods)."""
        key = (np.dtype(dtype), rows)
        if key not in self._row_plans:
            plan = RowBlocksPlan(self.w, dtype, rows)
            self._row_plans[key] = plan if plan.area <= MAX_AREA else None
        return self._row_plans[key]

    def _csr_apply(self, x: Any) -> Any:
        key = x.dtype
        if key not in self._csr:
            if self.xp is np:
                from scipy.sparse import csr_matrix  # noqa: PLC0415 (slow import, when used)
            else:
                from cupyx.scipy.sparse import csr_matrix  # noqa: PLC0415 (CuPy input)
            self._csr[key] = csr_matrix(self._w(x.dtype))
        csr = self._csr[key]
        if self.xp is np:
            return blocks(lambda s, e: np.asarray(csr @ x[:, s:e]), x.shape[1], x.size, axis=1)
        return self.xp.ascontiguousarray(csr @ x)

    @api
    def __call__(self, x: Any) -> Any:
        """W·x for [channels, samples] traces x (x's array type and dtype; finite: a NaN
        or an infinity is a `ValueError` naming its channel and sample)."""
        xp = _check_pair(self.w, x)
        check_finite(x, "x")
        w = self.w
        if not self.sparse:
            self.chosen = "dense_matmul"
            return matmul(self._w(x.dtype), x)
        gpu = xp is not np
        # the choice for this size class, remembered here: a call after the first costs a
        # dictionary lookup, not the tuner's key and cache (tens of µs against a 0.16 ms
        # kernel on an H200)
        size_class = (x.dtype.str, int(x.shape[1]).bit_length(),
                      x.device.id if gpu else None)
        name = self._choice.get(size_class)
        if name is not None:
            self.chosen = name
            return self.implementations(x, only=name)[name]()
        impls = self.implementations(x)
        tuner = current_engine().tuner
        key = ("spatial_filter", tuner.stamp(gpu, x.device.id if gpu else None),
               x.dtype.name, *(int(v).bit_length() for v in (*w.shape, x.shape[1],
                                                              self.max_row_nnz)))
        tol = 1e-5 if x.dtype == np.float32 else 1e-12

        def agree(got: Any, ref: Any) -> str | None:
            worst = max_relative_difference(got, ref)   # (on the host: nothing compiled)
            return None if worst <= tol else f"differs from the dense product by {worst:.1e}"

        def sliced(fraction: float) -> dict:
            # the first samples (a contiguous copy, as x is): each costs what it costs in the
            # whole product
            n = x.shape[1]
            m = max(1, min(n, -(-n * fraction // 1)))
            return self.implementations(xp.ascontiguousarray(x[:, :int(m)]))

        # scipy.sparse's import (0.1-0.3 s on 2 cores) is not paid on a first use when
        # nothing else imported it: a thorough tuning (dspk tune) times the csr product
        imports = None if gpu else {"csr": ("scipy.sparse",)}
        # on the GPU cupyx's CSR product compiles kernels with NVRTC in its first run (6 s
        # measured on an H100 with an empty CuPy cache): left for a thorough tuning too
        name, _, out = tuner.choose_run(key, impls, gpu, agree, sliced=sliced, imports=imports,
                                        jit=("csr",))
        self._choice[size_class] = name
        self.chosen = name
        return out

    def implementations(self, x: Any, only: str | None = None) -> dict:
        """The ways W·x can be computed for these traces, by name (the dense product first:
        the reference the tuner checks the others against); ``only``: just that one."""
        impls = {"dense_matmul": lambda: matmul(self._w(x.dtype), x)}
        if not self.sparse:
            return impls
        # measured, not assumed (H200, 384 channels x 60 000, 32 non-zeros per row): the dense
        # product 0.45 ms, cuSPARSE 1.6 ms, this project's kernel 0.16; on 2 CPU cores
        # scipy.sparse 49 ms, BLAS 24
        impls["csr"] = lambda: self._csr_apply(x)
        if array_module(x) is np:
            # dense products of W's row blocks with the x rows their non-zeros reach (BLAS):
            # 384 channels, 32 neighbours, blocks of 32 rows: about 1/6 of the dense work
            for rows in ROW_BLOCKS:
                name = f"row_blocks{rows}"
                plan = self._row_plan(x.dtype, rows) if only in (None, name) else None
                if plan is not None:
                    impls[name] = (lambda p=plan: p(x))
        else:
            for groups, vpl, pipe in SPARSE_KERNEL_VARIANTS:
                name = f"sparse_kernel_g{groups}v{vpl}{'p' if pipe else ''}"
                if only is None or only == name:
                    # plans built when first run (a one-shot call runs only the tuner's choice)
                    impls[name] = (lambda g=groups, v=vpl, p=pipe: self._run_kernel(x, g, v, p))
        return impls if only is None else {only: impls[only]}

    def _run_kernel(self, x: Any, groups: int, vpl: int, pipe: bool = False) -> Any:
        plan = self._kernel_plan(x, groups, vpl, pipe)
        if plan is None:
            raise RuntimeError(f"the sparse kernel with {groups} groups per block does not fit "
                               f"this matrix (its neighbourhoods are too wide)")
        return plan(x)


@api
def spatial_filter(w: Any, x: Any) -> Any:
    """``W·x`` for a [out_channels, channels] matrix and [channels, samples] traces.

    On the GPU the first call with a W computes the dense product (`dspk.linalg.matmul`):
    W's analysis and the sparse kernel's plan cost more than one product, so they are not
    paid for a W seen once (its fingerprint is started after the product's launch, on a side
    stream, and not waited for). When the same W comes again (recognised by its content, so
    a W modified in place counts as new: from the third call, or the first after the
    second's fingerprint has landed), it is prepared as a `SpatialFilter` (see there for the
    implementations and how one is chosen) and kept with the last 8 matrices. On the CPU,
    where the analysis costs less than it saves on one product, W is prepared on its first
    call: calling this in a loop then costs a fingerprint of W per call over
    ``SpatialFilter(W)(x)``. A W found dense (nothing to prepare) goes to the dense product
    directly from then on, without the fingerprint (its buffer is remembered; the verdict
    is checked again every 64 calls).

    Parameters
    ----------
    w : array
        [out_channels, channels], converted to x's dtype; the same array type as x.
    x : array
        [channels, samples], float32 or float64.

    Returns
    -------
    array
        [out_channels, samples], x's dtype and array type.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import bipolar_matrix, spatial_filter
    >>> x = np.array([[1.0, 2.0], [0.5, 0.5], [4.0, 0.0]], dtype=np.float32)
    >>> spatial_filter(bipolar_matrix([[0, 1], [2, 0]], 3), x)
    array([[ 0.5,  1.5],
           [ 3. , -2. ]], dtype=float32)
    """
    xp = traces(x)
    _check_w(w)
    check_finite(w, "w", ("row", "column"))
    check_finite(x, "x")
    verdicts = _dense_verdicts()
    ident = buffer_identity(w)
    sight = None
    if not verdicts.dense(ident):
        prepared, sight = _prepared_filters(xp is not np).lookup(w, ident)
        if prepared is not None:
            if not prepared.sparse:
                verdicts.add(ident)
            return prepared(x)
    # A W seen for the first time: the product without preparation (W's analysis and the
    # sparse kernel's plan cost ~3 ms on an H200, against 0.4 ms for the dense product of
    # 384 channels; a W that comes back is prepared then). Its sighting (on the GPU, a hash
    # on a side stream, not waited for) is started after the product's launch. A W known to
    # be dense: nothing to prepare, and its fingerprint would only add to the product.
    _check_pair(w, x, xp)
    y = matmul(w if w.dtype == x.dtype else w.astype(x.dtype), x)
    if sight is not None:
        sight()
    return y


class _DenseVerdicts:
    """Buffers whose W was found dense (a SpatialFilter with nothing to prepare): while a
    verdict lasts, `spatial_filter` sends W straight to the dense product without a
    fingerprint. That is correct whatever the buffer holds by then (the dense product reads
    W itself); a verdict expires after `RECHECK` calls, so that a sparse W written into the
    same memory is found and prepared."""

    RECHECK = 64
    MAX = 64

    def __init__(self) -> None:
        # calls left to each verdict; a verdict's use leaves its place: the oldest goes first
        self._left = LRU(self.MAX)
        self._lock = threading.Lock()

    def dense(self, ident: tuple) -> bool:
        with self._lock:
            left = self._left.peek(ident)
            if left is None:
                return False
            if left <= 1:
                self._left.pop(ident)
                return False
            self._left.put(ident, left - 1, touch=False)
            return True

    def add(self, ident: tuple) -> None:
        with self._lock:
            self._left.put(ident, self.RECHECK, touch=False)

    def clear(self) -> None:
        with self._lock:
            self._left.clear()

    def __len__(self) -> int:
        return len(self._left)


def _dense_verdicts() -> _DenseVerdicts:
    return current_engine().prepared("spatial_filter_dense", _DenseVerdicts)


def _check_w(w: Any) -> None:
    if not (isinstance(w, np.ndarray) or is_cupy_array(w)) or w.ndim != 2:
        raise ValueError(f"w: expected a 2-D [out_channels, channels] array, got "
                         f"{getattr(w, 'shape', type(w).__name__)}")
    if w.size == 0:
        raise ValueError(f"w: expected a non-empty matrix, got shape {w.shape}")


def _check_pair(w: Any, x: Any, xp: Any = None) -> Any:
    """x's array module, once x is valid traces that ``w`` applies to (``xp``: x already
    checked, this module)."""
    xp = traces(x) if xp is None else xp
    if w.shape[1] != x.shape[0]:
        raise ValueError(f"w: has {w.shape[1]} columns but x has {x.shape[0]} channels")
    if isinstance(w, np.ndarray) != (xp is np):
        raise TypeError("w and x mix NumPy and CuPy arrays")
    return xp


def _prepared_filters(gpu: bool = True) -> PreparedCache:
    """The engine's SpatialFilters of the matrices spatial_filter was called with lately:
    on the GPU prepared on the second call with the same content, on the CPU on the first
    (there W's analysis and the row-block plan cost less than what they save on one product:
    384 channels x 30 000 samples on 2 cores, a local W: the dense product 36-52 ms, the
    prepared filter's first call 38 ms, then 19-21)."""
    if gpu:
        return current_engine().prepared(
            "spatial_filter", lambda: PreparedCache(_filter_of_copy, prepare_on=2))
    return current_engine().prepared(
        "spatial_filter_cpu", lambda: PreparedCache(_filter_of_copy, prepare_on=1))


def _filter_of_copy(w: Any) -> SpatialFilter:
    """A SpatialFilter of a copy of W: the cache finds it by the content W had, so it must not
    read the caller's buffer, which may hold other values by the next call."""
    return SpatialFilter(w.copy())


@api
def common_reference(x: Any, operator: str = "median", groups: Sequence | None = None,
                     geometry_um: Any = None, local_radius: tuple | None = None) -> Any:
    """Subtract a common reference from every channel.

    Parameters
    ----------
    x : array
        [channels, samples], float32 or float64.
    operator : {"median", "mean"}
        Per sample, across channels. With an even number of channels the median is the mean of
        the two middle values (numpy's convention).
    groups : sequence of index arrays, optional
        Reference each group of channels (shanks, say) with its own median/mean.
    geometry_um, local_radius : optional
        Local reference: each channel minus the reference of the channels whose distance lies in
        ``local_radius = (inner, outer)`` µm (SpikeInterface's annulus).

    Returns
    -------
    array
        Same shape and dtype as x.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import common_reference
    >>> x = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [10.0, 0.0, 0.0]], dtype=np.float32)
    >>> common_reference(x)                        # minus the median of each sample
    array([[-1.,  0.,  0.],
           [ 0.,  2.,  3.],
           [ 8., -2., -3.]], dtype=float32)
    >>> common_reference(x, groups=[[0, 1], [2]])   # a median per group of channels
    array([[-0.5, -1. , -1.5],
           [ 0.5,  1. ,  1.5],
           [ 0. ,  0. ,  0. ]], dtype=float32)
    >>> geom = np.c_[np.zeros(3), 20.0 * np.arange(3)]
    >>> common_reference(x, geometry_um=geom, local_radius=(0.0, 25.0))   # nearest others
    array([[-1. , -2. , -3. ],
           [-3.5,  3. ,  4.5],
           [ 8. , -4. , -6. ]], dtype=float32)
    """
    xp = traces(x)
    check_finite(x, "x")
    if operator not in ("median", "mean"):
        raise ValueError(f"operator: expected 'median' or 'mean', got {operator!r}")
    def reduce(a: Any) -> Any:
        if operator == "mean":
            return a.mean(axis=0, dtype=a.dtype)
        if xp is not np:
            return xp.median(a, axis=0)
        # sample blocks in threads (numpy's partition releases the GIL): 384 x 60 000, 2 cores,
        # 327 -> about 160 ms
        return blocks(lambda s, e: np.median(a[:, s:e], axis=0), a.shape[1], a.size, axis=0)
    c = x.shape[0]
    if local_radius is not None:
        if geometry_um is None:
            raise ValueError("geometry_um: a local reference needs the channel positions")
        inner, outer = local_radius
        g = geometry(geometry_um, c, xp)
        d = np.sqrt(probe_sqdist(to_numpy(g)))
        out = xp.empty_like(x)
        for ch in range(c):
            ring = np.flatnonzero((d[ch] >= inner) & (d[ch] <= outer) & (np.arange(c) != ch))
            if ring.size == 0:
                raise ValueError(f"local_radius: channel {ch} has no neighbour between {inner} "
                                 f"and {outer} µm")
            out[ch] = x[ch] - reduce(x[xp.asarray(ring)])
        return out
    def referenced(a: Any) -> Any:
        """a minus its reference. The median has more than one exact implementation: on the
        CPU, NumPy's median (partition) or whole-row SIMD sorts of the transposed block; on
        the GPU, cupy.median or a selection kernel of its own (dspk/kernels/traces.cu). The
        tuner times them on first sight of a size class and keeps the fastest whose result is
        identical to the library median's."""
        if operator == "median":
            gpu = xp is not np

            def implementations(b: Any) -> dict:
                impls = {"median": lambda: b - reduce(b)[None]}
                if not gpu:
                    impls["sorted_rows"] = lambda: b - median_by_sorting(b)[None]
                elif car_reason(b) is None:
                    impls["select_kernel"] = lambda: car_median(b)
                return impls

            def sliced(fraction: float) -> dict:
                # the first samples: each sample's median is its own
                m = max(1, min(a.shape[1], -(-a.shape[1] * fraction // 1)))
                return implementations(xp.ascontiguousarray(a[:, :int(m)]))

            impls = implementations(a)
            if len(impls) > 1:
                tuner = current_engine().tuner
                key = ("median_reference", tuner.stamp(gpu, a.device.id if gpu else None),
                       a.dtype.name, *(int(v).bit_length() for v in a.shape))
                # cupy.median compiles its kernels with NVRTC in its first run (seconds on a
                # fresh machine): a first use on the GPU leaves it for a thorough tuning
                return tuner.choose_run(key, impls, gpu, _identical, sliced=sliced,
                                        jit=("median",))[2]
        return a - reduce(a)[None]

    if groups is None:
        return referenced(x)
    out = x.copy()
    seen = np.zeros(c, dtype=bool)
    for gi, group in enumerate(groups):
        ids = np.asarray(group.get() if hasattr(group, "get") else group, dtype=np.int64)
        if ids.size == 0 or ids.min() < 0 or ids.max() >= c:
            raise ValueError(f"groups[{gi}]: channel indices must be in [0, {c})")
        if seen[ids].any():
            raise ValueError(f"groups[{gi}]: a channel appears in two groups")
        seen[ids] = True
        sel = xp.asarray(ids)
        out[sel] = referenced(x[sel])
    return out


def median_by_sorting(a: np.ndarray) -> np.ndarray:
    """numpy.median(a, axis=0), exactly, by sorting each sample's channel values: NumPy's
    vectorized (SIMD) sort of the transposed block's short rows beat its partition 6x here
    (384 float32 channels x 30 262 samples: 26 ms against 151 on one core). A block with a
    NaN takes numpy.median (which propagates it; the sort would move it to the end)."""
    c = a.shape[0]
    k = (c - 1) // 2
    half = a.dtype.type(0.5)

    def part(s: int, e: int) -> np.ndarray:
        srt = np.sort(blocked_transpose(a[:, s:e]), axis=1)     # [samples, channels]
        if np.isnan(srt[:, -1]).any():
            return np.median(a[:, s:e], axis=0)
        if c % 2:
            return srt[:, k].copy()
        return (srt[:, k] + srt[:, k + 1]) * half               # numpy's (a + b) / 2

    return blocks(part, a.shape[1], a.size, axis=0)


def _identical(got: Any, ref: Any) -> str | None:
    return None if identical(got, ref) else "differs from cupy.median's result"


def bipolar_matrix(pairs: Any, n_channels: int, dtype: Any = np.float32) -> np.ndarray:
    """W for bipolar derivations: row r is channel pairs[r][0] minus channel pairs[r][1].
    Apply with ``spatial_filter(W, x)`` (sparse: two non-zeros per row).

    Parameters
    ----------
    pairs : array-like
        [n, 2] channel indices (no channel paired with itself).
    n_channels : int
        Channels of the traces W applies to.
    dtype : numpy dtype
        Of W (default float32).

    Returns
    -------
    numpy.ndarray
        W [n, n_channels]: +1 and −1 in each row.

    Examples
    --------
    >>> from dspk.ops import bipolar_matrix
    >>> bipolar_matrix([[0, 1], [2, 3]], 4)
    array([[ 1., -1.,  0.,  0.],
           [ 0.,  0.,  1., -1.]], dtype=float32)
    """
    p = np.asarray(pairs, dtype=np.int64)
    if p.ndim != 2 or p.shape[1] != 2 or p.shape[0] == 0:
        raise ValueError(f"pairs: expected [n, 2] channel index pairs, got shape {p.shape}")
    if p.min() < 0 or p.max() >= n_channels:
        raise ValueError(f"pairs: channel indices must be in [0, {n_channels})")
    if np.any(p[:, 0] == p[:, 1]):
        raise ValueError("pairs: a channel paired with itself")
    w = np.zeros((len(p), n_channels), dtype=dtype)
    rows = np.arange(len(p))
    w[rows, p[:, 0]] = 1
    w[rows, p[:, 1]] = -1
    return w


def laplacian_matrix(geometry_um: Any, n_neighbors: int | None = 4,
                     radius_um: float | None = None, dtype: Any = np.float32) -> np.ndarray:
    """W for a spatial Laplacian: each channel minus the mean of its neighbours (its
    ``n_neighbors`` nearest other channels, or the others within ``radius_um``). Apply with
    ``spatial_filter(W, x)``.

    Parameters
    ----------
    geometry_um : array-like or probeinterface Probe
        [channels, 2] contact positions in µm.
    n_neighbors : int, optional
        Other channels averaged per channel, 1 <= n_neighbors < channels (default 4; ignored
        when ``radius_um`` is given). Equal distances are taken by channel index.
    radius_um : float, optional
        Average every other channel within this distance instead (each channel needs one).
    dtype : numpy dtype
        Of W (default float32).

    Returns
    -------
    numpy.ndarray
        W [channels, channels]: 1 on the diagonal, −1/k at each of the k neighbours.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import laplacian_matrix
    >>> geom = np.c_[np.zeros(4), 20.0 * np.arange(4)]
    >>> laplacian_matrix(geom, n_neighbors=2)
    array([[ 1. , -0.5, -0.5,  0. ],
           [-0.5,  1. , -0.5,  0. ],
           [ 0. , -0.5,  1. , -0.5],
           [ 0. , -0.5, -0.5,  1. ]], dtype=float32)
    """
    g = geometry(geometry_um, len(np.asarray(getattr(geometry_um, "contact_positions",
                                                     geometry_um))), np)
    n = len(g)
    if radius_um is not None:
        n_neighbors = None
    elif n_neighbors is None or not 1 <= int(n_neighbors) < n:
        raise ValueError(f"n_neighbors: expected 1 <= n_neighbors < {n}, got {n_neighbors}")
    hoods = neighbors(g, None if n_neighbors is None else int(n_neighbors) + 1, radius_um)
    w = np.zeros((n, n), dtype=dtype)
    for c, h in enumerate(hoods):
        others = h[1:]
        if others.size == 0:
            raise ValueError(f"radius_um: channel {c} has no neighbour within {radius_um} µm")
        w[c, c] = 1
        w[c, others] = -1.0 / others.size
    return w
