"""`dspk.linalg.eigh.device_eigh`: cuSOLVER's batched Jacobi against LAPACK (``gpu`` tests),
and the stacks it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from dspk.linalg.eigh import MAX_SIZE, device_eigh, device_eigh_supported


def spd_stack(b, k, seed=0, rank=None):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((b, k, rank or 2 * k))
    return a @ np.swapaxes(a, 1, 2) / a.shape[2]


@pytest.mark.parametrize("stack", [np.zeros((3, MAX_SIZE + 1, MAX_SIZE + 1)),
                                   np.zeros((3, 4, 4), np.float32), np.zeros((4, 4)),
                                   np.zeros((0, 4, 4)), np.zeros((2, 3, 4))])
def test_refused_stacks(stack):
    assert not device_eigh_supported(stack)
    with pytest.raises(ValueError, match="stack: expected"):
        device_eigh(stack)


@pytest.mark.gpu
@pytest.mark.parametrize("b, k, rank", [(384, 32, None), (7, 1, None), (50, 17, None),
                                        (40, 32, 8)])       # rank-deficient: zero eigenvalues
def test_device_eigh_agrees_with_lapack(b, k, rank):
    from dspk.caches import forget_shared, shared
    forget_shared()
    s = spd_stack(b, k, seed=k, rank=rank)
    d, e = device_eigh(s)
    assert not shared("device_eigh_fallback", set), "LAPACK's, not cuSOLVER's Jacobi"
    d_ref, _ = np.linalg.eigh(s)
    scale = np.abs(d_ref).max()
    assert np.max(np.abs(d - d_ref)) <= 1e-12 * scale
    back = np.einsum("bij,bj,bkj->bik", e, d, e)           # e·diag(d)·eᵀ
    assert np.max(np.abs(back - s)) <= 1e-12 * scale
    eye = np.einsum("bji,bjk->bik", e, e)                  # orthonormal columns
    assert np.max(np.abs(eye - np.eye(k))) <= 1e-12


@pytest.mark.gpu
def test_local_whitening_on_the_device_agrees_with_the_host():
    import cupy as cp

    import dspk
    from dspk.caches import forget_shared, shared
    forget_shared()
    n = 384
    geom = np.c_[np.tile([16.0, 48.0, 0.0, 32.0], n // 4), 20.0 * (np.arange(n) // 2)]
    rng = np.random.default_rng(5)
    mix = np.eye(n) + 0.3 * np.exp(-np.abs(np.subtract.outer(geom[:, 1], geom[:, 1])) / 40.0)
    x = (mix @ rng.standard_normal((n, 20000))).astype(np.float32)
    cov = dspk.covariance(x)
    for how in ({"n_neighbors": 32}, {"radius_um": 200.0}):   # Jacobi; LAPACK (> 32)
        w_host = dspk.whitening_matrix(cov, geometry_um=geom, **how)
        w_dev = dspk.whitening_matrix(cp.asarray(cov), geometry_um=geom, **how)
        assert isinstance(w_dev, cp.ndarray) and w_dev.dtype == w_host.dtype
        w_dev = w_dev.get()
        assert np.array_equal(w_dev != 0, w_host != 0)
        assert not shared("device_eigh_fallback", set)
        if "radius_um" in how:                  # 20-40 channels a neighbourhood: LAPACK's
            assert np.array_equal(w_dev, w_host)
        else:                                     # float64 to ~1e-13, then float32's step
            assert np.max(np.abs(w_dev - w_host)) <= 2.5e-7 * np.abs(w_host).max()


def test_a_cupy_without_the_binding_falls_back_to_lapack(monkeypatch, caplog):
    # cupy_backends' cuSOLVER binding is not CuPy's public API: where it cannot be called
    # as dspk calls it, LAPACK decomposes the stack (the same answer), said once
    import dspk.linalg.eigh as eigh_mod
    from dspk.caches import forget_shared

    def missing(stack):
        raise ImportError("no cupy_backends here")

    monkeypatch.setattr(eigh_mod, "_jacobi", missing)
    forget_shared()
    s = spd_stack(5, 4)
    with caplog.at_level("WARNING", logger="dspk"):
        d, e = device_eigh(s)
        device_eigh(s)
    d_ref, e_ref = np.linalg.eigh(s)
    assert np.array_equal(d, d_ref) and np.array_equal(e, e_ref)
    said = [r for r in caplog.records if "batched Jacobi is not reachable" in r.getMessage()]
    assert len(said) == 1
