"""dspk.ops against float64 NumPy references, on CPU and GPU (`gpu` params): covariance and its
accumulator (exact for int16), whitening (global, local), spatial filters, common references,
PCA, distances; and their bad input."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dspk
from dspk.backend import to_numpy
from dspk.ops.spatial import DEFAULT_EPS, neighbors

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def realistic(channels, samples, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((channels // 4 + 2, samples))
    mix = rng.standard_normal((channels, src.shape[0])) * 20
    x = mix @ src + rng.uniform(-300, 300, (channels, 1)) + 5 * rng.standard_normal((channels,
                                                                                      samples))
    return x.astype(dtype)


def rel(a, b):
    a, b = to_numpy(a).astype(np.float64), np.asarray(b, dtype=np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def probe(n):
    """Two columns, 20 µm pitch (a Neuropixels-like layout)."""
    return np.stack([np.tile([0.0, 32.0], n // 2 + 1)[:n], np.repeat(np.arange(n // 2 + 1), 2)[:n]
                     * 20.0], axis=1)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_covariance_matches_numpy(xp, dtype, tol):
    x = realistic(64, 20000, dtype=dtype)
    c = dspk.covariance(xp.asarray(x))
    assert c.dtype == dtype
    assert rel(c, np.cov(x.astype(np.float64))) <= tol
    assert rel(dspk.covariance(xp.asarray(x), center=False, ddof=0),
               x.astype(np.float64) @ x.T.astype(np.float64) / x.shape[1]) <= tol


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("view", ["contiguous", "every_other_sample", "reversed", "row_slice",
                                  "samples_first"])
def test_covariance_of_views_matches_numpy(xp, dtype, tol, view):
    """Any strides (the GPU's one-pass centring reads them in place), few rows (several blocks
    per row there), lengths that are not a multiple of a block's stride, ddof and center."""
    base = realistic(6, 6001, seed=3, dtype=dtype)
    x = {"contiguous": lambda a: a, "every_other_sample": lambda a: a[:, ::2],
         "reversed": lambda a: a[::-1, ::-1], "row_slice": lambda a: a[1:4, 7:],
         "samples_first": lambda a: a.T.copy().T}[view]
    want = x(base).astype(np.float64)
    got = dspk.covariance(x(xp.asarray(base)))
    assert got.dtype == dtype and got.shape == (want.shape[0],) * 2
    assert rel(got, np.cov(want)) <= tol
    assert rel(dspk.covariance(x(xp.asarray(base)), ddof=0), np.cov(want, ddof=0)) <= tol
    assert rel(dspk.covariance(x(xp.asarray(base)), center=False, ddof=2),
               want @ want.T / (want.shape[1] - 2)) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1), (1, 100003), (3, 129), (64, 60000), (300, 513)])
def test_gpu_center_rows_is_numpys_arithmetic(dtype, shape):
    """The centred copy and the float64 means of the one-pass kernel against NumPy's mean
    (the sum's order differs: the means agree to float64 rounding), and the centred values
    bit for bit against x − mean.astype(dtype) with the kernel's own mean."""
    import cupy as cp

    from dspk.ops._covariance_gpu import center_rows

    x = realistic(max(shape[0], 4), shape[1], seed=shape[1], dtype=dtype)[:shape[0]]
    xc, mean = center_rows(cp.asarray(x))
    want_mean = x.mean(axis=1, dtype=np.float64)
    assert mean.dtype == np.float64 and xc.dtype == dtype and xc.flags.c_contiguous
    np.testing.assert_allclose(cp.asnumpy(mean), want_mean, rtol=1e-13, atol=1e-12)
    want = x - cp.asnumpy(mean).astype(dtype)[:, None]
    assert np.array_equal(cp.asnumpy(xc), want)


def test_int16_covariance_is_exact(xp):
    x = np.random.default_rng(1).integers(-32768, 32768, (16, 5000), dtype=np.int16)
    c = dspk.covariance(xp.asarray(x))
    assert c.dtype == np.float64
    assert rel(c, np.cov(x.astype(np.float64))) <= 1e-14


@SETTINGS
@given(cuts=st.lists(st.integers(1, 999), max_size=6, unique=True),
       dtype=st.sampled_from([np.int16, np.float32, np.float64]))
def test_accumulator_equals_one_shot_whatever_the_chunks(xp, cuts, dtype):
    rng = np.random.default_rng(len(cuts))
    if dtype == np.int16:
        x = rng.integers(-3000, 3000, (5, 1000), dtype=np.int16)
    else:
        x = realistic(5, 1000, dtype=dtype)
    edges = [0] + sorted(cuts) + [1000]
    acc = dspk.CovarianceAccumulator()
    for a, b in zip(edges[:-1], edges[1:]):
        acc.add(xp.asarray(x[:, a:b]))
    one = dspk.covariance(xp.asarray(x))
    if dtype == np.int16:
        assert np.array_equal(to_numpy(acc.result()), to_numpy(one))
    else:
        assert rel(acc.result(), to_numpy(one)) <= (1e-5 if dtype == np.float32 else 1e-12)


def test_global_whitening_gives_identity_covariance(xp):
    x = realistic(384, 20000, seed=2)
    xd = xp.asarray(x)
    w = dspk.whitening_matrix(dspk.covariance(xd))
    y = dspk.spatial_filter(w, xd)
    c = to_numpy(dspk.covariance(y)).astype(np.float64)
    assert np.max(np.abs(c - np.eye(384))) <= 1e-3


@pytest.mark.parametrize("how", [{"n_neighbors": 8}, {"radius_um": 45.0}])
def test_local_whitening_matches_the_definition(xp, how):
    x = realistic(40, 8000, seed=3, dtype=np.float64)
    cov = np.cov(x)
    geom = probe(40)
    w = to_numpy(dspk.whitening_matrix(xp.asarray(cov), geometry_um=geom, **how))
    ref = np.zeros((40, 40))
    for c, hood in enumerate(neighbors(geom, how.get("n_neighbors"), how.get("radius_um"))):
        d, e = np.linalg.eigh(cov[np.ix_(hood, hood)])
        z = e @ np.diag(1 / np.sqrt(d + DEFAULT_EPS * d.mean())) @ e.T
        ref[c, hood] = z[0]
    assert rel(w, ref) <= 1e-12
    assert all((np.count_nonzero(r) <= 8) for r in w) if "n_neighbors" in how else True


def test_singular_covariance_gives_no_nan(xp):
    x = realistic(32, 10)               # a short chunk: rank <= 9
    w = to_numpy(dspk.whitening_matrix(dspk.covariance(xp.asarray(x))))
    assert np.all(np.isfinite(w))
    w0 = to_numpy(dspk.whitening_matrix(xp.zeros((4, 4), np.float32)))
    assert np.array_equal(w0, np.eye(4, dtype=np.float32))


@pytest.mark.parametrize("op", ["median", "mean"])
@pytest.mark.parametrize("channels", [7, 8])
def test_common_reference(xp, op, channels):
    x = realistic(channels, 3000, seed=4, dtype=np.float64)
    ref = getattr(np, op)(x, axis=0)
    assert rel(dspk.common_reference(xp.asarray(x), op), x - ref[None]) <= 1e-12
    groups = [np.arange(0, 3), np.arange(3, channels)]
    got = to_numpy(dspk.common_reference(xp.asarray(x), op, groups=groups))
    for g in groups:
        np.testing.assert_allclose(got[g], x[g] - getattr(np, op)(x[g], axis=0), rtol=1e-12,
                                   atol=1e-9)


def test_local_common_reference(xp):
    x = realistic(20, 2000, seed=5, dtype=np.float64)
    geom = probe(20)
    got = to_numpy(dspk.common_reference(xp.asarray(x), "median", geometry_um=geom,
                                         local_radius=(30, 60)))
    d = np.sqrt(((geom[:, None] - geom[None]) ** 2).sum(-1))
    for c in range(20):
        ring = (d[c] >= 30) & (d[c] <= 60) & (np.arange(20) != c)
        np.testing.assert_allclose(got[c], x[c] - np.median(x[ring], axis=0), rtol=1e-12,
                                   atol=1e-9)


def test_pca_matches_eigh_and_fixes_signs(xp):
    rng = np.random.default_rng(6)
    clips = (rng.standard_normal((3000, 5)) @ rng.standard_normal((5, 61))).astype(np.float64)
    p = dspk.PCA(3).fit(xp.asarray(clips))
    cov = np.cov(clips.T)
    d, e = np.linalg.eigh(cov)
    ref = e[:, ::-1][:, :3].T
    ref *= np.sign(ref[np.arange(3), np.abs(ref).argmax(axis=1)])[:, None]
    assert rel(p.components_, ref) <= 1e-10
    feats = p.transform(xp.asarray(clips))
    assert rel(feats, (clips - clips.mean(0)) @ ref.T) <= 1e-10
    three = p.transform(xp.asarray(clips.reshape(1000, 3, 61)))
    assert three.shape == (1000, 3, 3)


def test_distances(xp):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((50, 6))
    b = rng.standard_normal((70, 6))
    ref = ((a[:, None] - b[None]) ** 2).sum(-1)
    assert rel(dspk.pairwise_sqdist(xp.asarray(a), xp.asarray(b)), ref) <= 1e-12
    idx, dist = dspk.knn(xp.asarray(a), xp.asarray(b), 4)
    np.testing.assert_array_equal(to_numpy(idx), np.argsort(ref, axis=1, kind="stable")[:, :4])
    assert to_numpy(dist).min() >= 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,m", [(1, 1), (70000, 5), (300, 1025), (2049, 700)])
def test_distances_are_numpys_expression_bit_for_bit(xp, dtype, n, m):
    """The one-pass finish (in place on the GPU, one temporary on the CPU) gives the bits of
    max(‖a‖² + ‖b‖² − 2·A·Bᵀ, 0) computed from the same product and norms, near-duplicate
    points (negative before the clamp) included, at row counts beyond a grid's y limit. On the
    GPU the finish serves more dimensions than the direct kernel takes (134 here)."""
    from dspk.ops.distance import _DIRECT_SMALL_DIMS

    d = 5 if xp is np else _DIRECT_SMALL_DIMS + 6
    rng = np.random.default_rng(n + m)
    a = (rng.standard_normal((n, d)) * 10).astype(dtype)
    b = np.concatenate([a[: min(n, m // 2)] + np.asarray(1e-3, dtype),
                        (rng.standard_normal((m - min(n, m // 2), d)) * 10).astype(dtype)])
    ga, gb = xp.asarray(a), xp.asarray(b)
    got = dspk.pairwise_sqdist(ga, gb)
    ab = dspk.matmul(ga, gb.T)
    want = xp.maximum((ga * ga).sum(axis=1)[:, None] + (gb * gb).sum(axis=1)[None, :] - 2 * ab, 0)
    assert got.dtype == dtype and got.shape == (n, m)
    assert np.array_equal(to_numpy(got), to_numpy(want))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = np.maximum((a64 * a64).sum(1)[:, None] + (b64 * b64).sum(1)[None] - 2 * a64 @ b64.T, 0) \
        if n * m <= 2_000_000 else None
    if ref is not None:
        scale = np.abs(a).max() ** 2 * d
        assert np.abs(to_numpy(got) - ref).max() <= scale * (1e-5 if dtype == np.float32
                                                             else 1e-13)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,m,d", [(1, 1, 1), (70, 130, 5), (300, 1025, 16), (2049, 700, 31),
                                   (129, 64, 32), (65, 67, 33), (200, 256, 64), (70000, 5, 3)])
def test_gpu_direct_distances(dtype, n, m, d):
    """The one-launch kernel for few dimensions against float64 distances, within the rounding of
    a length-d dot product of the points' magnitude; exactly 0 between identical points (the
    norms and the products are the same fma chain); near-duplicates clamped at 0, never
    negative; partial tiles, odd widths (scalar stores) and strided inputs."""
    import cupy as cp

    rng = np.random.default_rng(n * m + d)
    a = (rng.standard_normal((n, d)) * 10 + 3).astype(dtype)
    dup = min(n, m // 2)
    b = np.concatenate([a[:dup], (rng.standard_normal((m - dup, d)) * 10).astype(dtype)])
    if m - dup > 1:
        b[dup] = b[dup - 1] + np.asarray(1e-3, dtype) if dup else b[dup]
    got = dspk.pairwise_sqdist(cp.asarray(a), cp.asarray(b))
    assert isinstance(got, cp.ndarray) and got.dtype == dtype and got.shape == (n, m)
    got = cp.asnumpy(got)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = (a64 * a64).sum(1)[:, None] + (b64 * b64).sum(1)[None] - 2 * a64 @ b64.T
    ref = np.maximum(ref, 0)
    eps = np.finfo(dtype).eps
    scale = (np.abs(a64).max() + np.abs(b64).max()) ** 2 * d
    assert np.abs(got - ref).max() <= 4 * scale * eps
    assert got.min() >= 0
    assert np.all(got[np.arange(dup), np.arange(dup)] == 0)
    # strided views of the same points give the same bits
    wide_a = cp.asarray(np.repeat(a, 2, axis=1))[:, ::2]
    wide_b = cp.asarray(np.repeat(b, 2, axis=1))[:, ::2]
    assert np.array_equal(cp.asnumpy(dspk.pairwise_sqdist(wide_a, wide_b)), got)


@pytest.mark.gpu
def test_gpu_direct_distances_propagate_nan():
    import cupy as cp

    from dspk.finite import checked

    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    a[2, 1] = np.nan
    # The public call refuses NaN (tests/test_nan_policy.py); inside a `checked` block the
    # direct kernel runs, and a NaN row must poison its own row and column, nothing else.
    with checked():
        got = cp.asnumpy(dspk.pairwise_sqdist(cp.asarray(a), cp.asarray(a)))
    assert np.isnan(got[2]).all() and np.isnan(got[:, 2]).all()
    keep = [0, 1, 3]
    assert np.isfinite(got[np.ix_(keep, keep)]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,taps,k", [(1, 1, 1), (100, 61, 6), (1000, 61, 3), (777, 33, 12),
                                      (5000, 82, 32), (300, 120, 9), (129, 121, 16)])
def test_gpu_pca_transform_in_one_pass(dtype, n, taps, k):
    """The fused centred projection against float64 (x − μ)·Wᵀ for the fitted mean and
    components, within a length-taps dot product's rounding; the centring is the expression's
    own (x − μ in the dtype); strided and [n, channels, taps] clips give the same bits."""
    import cupy as cp

    from dspk.ops import _pca_gpu

    rng = np.random.default_rng(n + taps + k)
    clips = (rng.standard_normal((n + k, 4)) @ rng.standard_normal((4, taps)) * 30
             + rng.standard_normal((n + k, taps)) + 50).astype(dtype)
    p = dspk.PCA(k).fit(cp.asarray(clips))
    x = clips[:n]
    assert _pca_gpu.fits(taps, k, np.dtype(dtype).itemsize)
    got = p.transform(cp.asarray(x))
    assert isinstance(got, cp.ndarray) and got.dtype == dtype and got.shape == (n, k)
    got = cp.asnumpy(got)
    mean, comps = cp.asnumpy(p.mean_), cp.asnumpy(p.components_)
    xc = x - mean[None]                                  # the expression's centring
    ref = xc.astype(np.float64) @ comps.astype(np.float64).T
    bound = np.abs(xc).astype(np.float64) @ np.abs(comps).astype(np.float64).T
    assert np.all(np.abs(got - ref) <= 2 * taps * np.finfo(dtype).eps * bound + 1e-30)
    wide = cp.asarray(np.repeat(x, 2, axis=1))[:, ::2]
    assert np.array_equal(cp.asnumpy(p.transform(wide)), got)
    if n % 3 == 0:
        three = cp.asnumpy(p.transform(cp.asarray(x.reshape(n // 3, 3, taps))))
        assert np.array_equal(three.reshape(n, k), got)


@pytest.mark.gpu
def test_gpu_pca_fit_of_usual_clips_is_the_hosts():
    """CuPy clips up to HOST_FIT_ELEMENTS are fitted on the host (no CuPy kernel for NVRTC
    in a first fit): the same mean and components as NumPy clips', on the device."""
    import cupy as cp

    from dspk.ops import pca as pca_mod

    rng = np.random.default_rng(8)
    clips = (rng.standard_normal((4000, 6)) @ rng.standard_normal((6, 61))).astype(np.float32)
    host, dev = dspk.PCA(3).fit(clips), dspk.PCA(3).fit(cp.asarray(clips))
    assert isinstance(dev.mean_, cp.ndarray) and isinstance(dev.components_, cp.ndarray)
    assert np.array_equal(cp.asnumpy(dev.components_), host.components_)
    assert np.array_equal(cp.asnumpy(dev.mean_), host.mean_)
    assert clips.size <= pca_mod.HOST_FIT_ELEMENTS


@pytest.mark.gpu
def test_gpu_pca_transform_beyond_a_tile_takes_the_expression():
    """Taps too many for a shared-memory tile go through the centred copy and the engine."""
    import cupy as cp

    from dspk.ops import _pca_gpu

    taps = 1000
    assert not _pca_gpu.fits(taps, 3, 8)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, taps))
    p = dspk.PCA(3).fit(cp.asarray(x))
    got = p.transform(cp.asarray(x))
    want = (x - cp.asnumpy(p.mean_)) @ cp.asnumpy(p.components_).T
    assert rel(got, want) <= 1e-12


# -- bad input ---------------------------------------------------------------------------------
def test_samples_channels_hint(xp):
    with pytest.raises(ValueError, match="did you pass \\[samples, channels\\]"):
        dspk.covariance(xp.zeros((60000, 384), np.float32))


def test_bad_covariances_name_the_channels(xp):
    c = np.eye(5)
    c[1, 3] = 0.5
    with pytest.raises(ValueError, match=r"not symmetric: cov\[(1, 3|3, 1)\]"):
        dspk.whitening_matrix(xp.asarray(c))
    c = np.eye(5)
    c[2, 4] = c[4, 2] = np.nan
    with pytest.raises(ValueError, match=r"not finite at channels \(2, 4\)"):
        dspk.whitening_matrix(xp.asarray(c))


def test_geometry_of_the_wrong_length(xp):
    with pytest.raises(ValueError, match="geometry: 3 positions for 5 channels"):
        dspk.whitening_matrix(xp.eye(5), geometry_um=np.zeros((3, 2)), n_neighbors=2)


def test_pca_too_many_components(xp):
    with pytest.raises(ValueError, match="n_components: 7 components need at least 7 taps"):
        dspk.PCA(7).fit(xp.zeros((100, 5)))


def test_empty_and_wrong_inputs(xp):
    with pytest.raises(ValueError, match="x: empty"):
        dspk.covariance(xp.zeros((0, 10), np.float32))
    with pytest.raises(ValueError, match="expected a 2-D"):
        dspk.covariance(xp.zeros(10, np.float32))
    with pytest.raises(TypeError, match="x: unsupported dtype int32"):
        dspk.covariance(xp.zeros((2, 10), np.int32))
    with pytest.raises(ValueError, match="w: has 3 columns but x has 4 channels"):
        dspk.spatial_filter(xp.eye(3), xp.zeros((4, 10)))
    with pytest.raises(ValueError, match="operator"):
        dspk.common_reference(xp.zeros((4, 10)), "mode")


def test_cpu_median_blocks_in_threads_equal_one_block():
    from threadpoolctl import threadpool_limits

    x = realistic(384, 3000, seed=8, dtype=np.float32)  # > 2^20 elements: the threaded path
    with threadpool_limits(2, user_api="blas"):         # the engine's threads: as BLAS's
        threaded = dspk.common_reference(x, "median")
    with threadpool_limits(1, user_api="blas"):
        np.testing.assert_array_equal(dspk.common_reference(x, "median"), threaded)
    np.testing.assert_array_equal(threaded, x - np.median(x, axis=0)[None])


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_sparse_spatial_filter_equals_dense(xp, dtype, tol):
    x = realistic(384, 4000, seed=9, dtype=dtype)
    cov = np.cov(x.astype(np.float64))
    w = dspk.whitening_matrix(xp.asarray(cov), geometry_um=probe(384), n_neighbors=32)
    assert int((to_numpy(w) != 0).sum(axis=1).max()) <= 32
    got = dspk.spatial_filter(w.astype(dtype), xp.asarray(x))
    assert type(got) is type(xp.asarray(x)) and got.dtype == dtype
    ref = to_numpy(w).astype(np.float64) @ x.astype(np.float64)
    assert rel(got, ref) <= tol
    # every way the tuner chooses between, whichever it kept
    f = dspk.SpatialFilter(w.astype(dtype))
    assert f.sparse
    xd = xp.asarray(x)
    assert rel(f._csr_apply(xd), ref) <= tol
    assert rel(dspk.matmul(w.astype(dtype), xd), ref) <= tol
    if xp is not np:
        from dspk.ops.spatial import SPARSE_KERNEL_VARIANTS

        for groups, vpl, pipe in SPARSE_KERNEL_VARIANTS:
            assert f._kernel_plan(xd, groups, vpl, pipe) is not None
            name = f"sparse_kernel_g{groups}v{vpl}{'p' if pipe else ''}"
            assert rel(f.implementations(xd)[name](), ref) <= tol


def _scrambled_local_w(n: int, k: int, seed: int) -> tuple:
    """A local-whitening-like W (k non-zeros per row) on a probe whose channels are listed in
    a random order, and that order."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    geom = probe(n)[perm]
    hoods = neighbors(geom, k)
    w = np.zeros((n, n))
    for c, h in enumerate(hoods):
        w[c, h] = rng.standard_normal(len(h))
    return w, perm


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("n_samples", [1, 255, 256, 1000, 4097])
def test_sparse_kernel_matches_float64(dtype, tol, n_samples):
    """The sparse kernel on channel orders that are not sorted along the probe, sample counts
    around its tile, every group size, against the float64 product."""
    import cupy as cp

    from dspk.ops._spatial_gpu import SparseRowsPlan

    w, _ = _scrambled_local_w(200, 24, seed=n_samples)
    x = np.random.default_rng(1).standard_normal((200, n_samples)).astype(dtype)
    ref = w @ x.astype(np.float64)
    for groups, vpl, pipe in ((8, 2, False), (4, 2, False), (2, 1, False), (1, 1, False),
                              (8, 1, False), (8, 1, True), (2, 2, True), (1, 1, True)):
        plan = SparseRowsPlan(w, dtype, groups, vpl, pipe)
        got = plan(cp.asarray(x))
        assert got.dtype == dtype and got.shape == ref.shape
        assert rel(got, ref) <= tol, groups


@pytest.mark.gpu
def test_sparse_kernel_views_and_shapes():
    """Strided and offset views (the scalar path), more output rows than a multiple of 8, a
    non-square W, all-zero rows."""
    import cupy as cp

    from dspk.ops._spatial_gpu import SparseRowsPlan

    rng = np.random.default_rng(3)
    w = np.zeros((77, 130))
    for r in range(77):
        w[r, rng.choice(130, 5, replace=False)] = rng.standard_normal(5)
    w[10] = 0
    big = rng.standard_normal((130, 1300)).astype(np.float32)
    xd = cp.asarray(big)
    for view in (xd[:, 3:1003], xd[:, ::2], xd[:, 256:]):
        ref = w @ cp.asnumpy(view).astype(np.float64)
        for vpl, pipe in ((1, False), (2, False), (1, True)):
            got = SparseRowsPlan(w, np.float32, 8, vpl, pipe)(view)
            assert rel(got, ref) <= 1e-5
            assert float(abs(got[10]).max()) == 0.0


def test_spatial_filter_prepared_equals_one_shot(xp):
    w, perm = _scrambled_local_w(100, 12, seed=4)
    x = xp.asarray(np.random.default_rng(2).standard_normal((100, 3000)).astype(np.float32))
    f = dspk.SpatialFilter(xp.asarray(w))
    assert f.sparse and f.max_row_nnz == 12
    got = f(x)
    ref = w @ to_numpy(x).astype(np.float64)
    assert rel(got, ref) <= 1e-5
    first = f.chosen
    again = f(x)                       # the remembered choice: the same implementation
    assert f.chosen == first and bool((again == got).all())
    assert rel(dspk.spatial_filter(xp.asarray(w), x), ref) <= 1e-5
    with pytest.raises(ValueError, match="w: has 100 columns but x has 99 channels"):
        f(x[:99])
    with pytest.raises(ValueError, match="w: expected a non-empty matrix"):
        dspk.SpatialFilter(np.zeros((0, 4)))


def test_bipolar_and_laplacian(xp):
    x = realistic(12, 1000, seed=10, dtype=np.float64)
    w = dspk.ops.bipolar_matrix([[0, 1], [5, 3]], 12)
    got = to_numpy(dspk.spatial_filter(xp.asarray(w.astype(np.float64)), xp.asarray(x)))
    np.testing.assert_allclose(got, np.stack([x[0] - x[1], x[5] - x[3]]), rtol=1e-12)
    geom = probe(12)
    lap = dspk.ops.laplacian_matrix(geom, n_neighbors=3, dtype=np.float64)
    hoods = neighbors(geom, 4)
    for c in range(12):
        ref = x[c] - x[hoods[c][1:]].mean(axis=0)
        out = lap.astype(np.float64)[c] @ x
        np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-9)
    with pytest.raises(ValueError, match="pairs: a channel paired with itself"):
        dspk.ops.bipolar_matrix([[2, 2]], 12)
    with pytest.raises(ValueError, match="n_neighbors: expected"):
        dspk.ops.laplacian_matrix(geom, n_neighbors=12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels", [1, 2, 3, 31, 32, 33, 64, 383, 384])
def test_gpu_median_reference_kernel_is_exact(dtype, channels):
    """The median-selection kernel equals numpy to the bit (x - median in x's dtype), with
    ties, negative values, zeros of both signs and a sample count not a multiple of its tile."""
    import cupy as cp

    from dspk.ops._traces_gpu import car_median, car_reason

    rng = np.random.default_rng(channels)
    x = rng.standard_normal((channels, 1000)).astype(dtype)
    x[:, :300] = rng.integers(-3, 4, (channels, 300))      # many ties
    x[:, 300] = -0.0
    assert car_reason(cp.asarray(x)) is None
    got = car_median(cp.asarray(x)).get()
    np.testing.assert_array_equal(got, x - np.median(x, axis=0)[None])
    strided = cp.asarray(np.repeat(x, 2, axis=1))[:, ::2]    # rows with a stride
    np.testing.assert_array_equal(car_median(strided).get(), got)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels", [1, 2, 7, 384, 385])
def test_cpumedian_by_sorting_is_numpys_median(dtype, channels):
    """The CPU's sort-based median candidate on its own (the tuner may keep either): equal to
    numpy.median bit for bit, ties and NaN included."""
    from dspk.ops.spatial import median_by_sorting

    rng = np.random.default_rng(channels)
    x = rng.standard_normal((channels, 5001)).astype(dtype)
    x[:, :1000] = rng.integers(-2, 3, (channels, 1000))
    x[0, 4000] = np.nan
    got, want = median_by_sorting(x), np.median(x, axis=0)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype


def test_int16_covariance_exact_at_the_largest_n_of_the_static_bound(xp):
    """n = 2^16 − 1 samples at ±32768: n·S − s·sᵀ reaches ~2^62 and must still be exact
    (the int64 path is taken from n alone, with no look at the data)."""
    from fractions import Fraction

    n = 2**16 - 1
    x = np.full((2, n), -32768, dtype=np.int16)
    x[1, ::2] = 32767
    got = to_numpy(dspk.covariance(xp.asarray(x)))
    a = x.astype(object)
    for i in range(2):
        for j in range(2):
            s_ij = int((a[i] * a[j]).sum())
            exact = Fraction(n * s_ij - int(a[i].sum()) * int(a[j].sum()), n * (n - 1))
            assert got[i, j] == float(exact)
