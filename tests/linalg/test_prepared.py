"""One-shot calls reuse what they prepared: operands recognised by content (fingerprint), a
modified operand prepared again, the cache bounded."""

import numpy as np
import pytest

import dspk
from dspk.backend import to_numpy
from dspk.linalg.prepared import PreparedCache, fingerprint

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint8, np.int16])
def test_fingerprint_follows_content(xp, dtype):
    a = xp.asarray(np.random.default_rng(0).integers(0, 100, (37, 13)).astype(dtype))
    fp = fingerprint(a)
    assert fingerprint(a.copy()) == fp
    assert fingerprint(xp.asfortranarray(a)) == fp               # the values, not the layout
    b = a.copy()
    b[36, 12] += 1
    assert fingerprint(b) != fp
    c = a.copy()
    c[0, 0], c[0, 1] = a[0, 1], a[0, 0]                          # a swap, same sum
    assert a[0, 0] == a[0, 1] or fingerprint(c) != fp
    assert fingerprint(a.reshape(13, 37)) != fp                  # the shape is part of it
    assert fingerprint(a[:, ::2]) == fingerprint(a[:, ::2].copy())


def test_fingerprint_of_odd_byte_counts_and_empty(xp):
    a = xp.arange(7, dtype=np.uint8)                              # 7 bytes: the byte kernel
    b = a.copy()
    b[6] = 0
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(xp.zeros((0, 3), np.float32)) == fingerprint(xp.zeros((0, 3), np.float32))


def test_cache_builds_once_per_content_and_is_bounded():
    built = []
    cache = PreparedCache(lambda a: built.append(1) or a.sum(), max_entries=2,
                          max_bytes=1 << 20)
    a, b, c = (np.full((4, 4), v, np.float32) for v in (1, 2, 3))
    for arr in (a, a.copy(), b, a, c):
        cache.get(arr)
    assert len(built) == 3 and len(cache) == 2                   # a, b, c built; b evicted
    cache.get(b)
    assert len(built) == 4
    big = np.zeros((600, 600))                                   # 2.9 MB > max_bytes: not kept
    cache.get(big)
    cache.get(big)
    assert len(built) == 6 and len(cache) == 2


def test_spatial_filter_in_a_loop_prepares_once_and_sees_changes(xp):
    from dspk.ops.spatial import _prepared_filters

    gpu = xp is not np
    _PREPARED_FILTERS = _prepared_filters(gpu)
    _PREPARED_FILTERS.clear()
    rng = np.random.default_rng(1)
    geom = np.c_[np.tile([0.0, 32.0], 48), 20.0 * np.arange(96)]
    cov = np.cov(rng.standard_normal((96, 5000)))
    w = xp.asarray(dspk.whitening_matrix(cov, geometry_um=geom, n_neighbors=8))
    x = xp.asarray(rng.standard_normal((96, 3000)).astype(np.float32))
    hits = _PREPARED_FILTERS.hits
    y = dspk.spatial_filter(w, x)                  # seen once: prepared on the CPU only
    assert len(_PREPARED_FILTERS) == (0 if gpu else 1)
    ref = np.asarray(to_numpy(w), np.float64) @ np.asarray(to_numpy(x), np.float64)
    np.testing.assert_allclose(to_numpy(y), ref, rtol=1e-5, atol=1e-4)
    # prepared on the first call on the CPU; on the GPU on the third (the first two only
    # start the hash of W and count it when it has landed: no wait for a W seen once)
    for _ in range(3):
        y = dspk.spatial_filter(w, x)
    assert len(_PREPARED_FILTERS) == 1
    assert _PREPARED_FILTERS.hits == hits + (1 if gpu else 3)
    assert next(iter(_PREPARED_FILTERS._entries.values()))[0].sparse
    ref = np.asarray(to_numpy(w), np.float64) @ np.asarray(to_numpy(x), np.float64)
    np.testing.assert_allclose(to_numpy(y), ref, rtol=1e-5, atol=1e-4)
    w[3, 3] += 1.0                                               # modified in place
    for _ in range(3 if gpu else 1):                  # (GPU: dense, then) prepared again
        y = dspk.spatial_filter(w, x)
        ref = np.asarray(to_numpy(w), np.float64) @ np.asarray(to_numpy(x), np.float64)
        np.testing.assert_allclose(to_numpy(y), ref, rtol=1e-5, atol=1e-4)
    assert len(_PREPARED_FILTERS) == 2


def test_spatial_filter_errors_on_first_and_prepared_calls(xp):
    w = xp.eye(4, dtype=np.float32)
    for _ in range(3):                                           # unprepared, then prepared
        with pytest.raises(ValueError, match="w: has 4 columns but x has 5 channels"):
            dspk.spatial_filter(w, xp.zeros((5, 100), np.float32))
        dspk.spatial_filter(w, xp.zeros((4, 100), np.float32))
    with pytest.raises(ValueError, match="w: expected a 2-D"):
        dspk.spatial_filter(xp.zeros(4, np.float32), xp.zeros((4, 100), np.float32))
    with pytest.raises(ValueError, match="w: expected a non-empty"):
        dspk.spatial_filter(xp.zeros((0, 4), np.float32), xp.zeros((4, 100), np.float32))
    other = np if xp is not np else None
    if other is not None:
        with pytest.raises(TypeError, match="mix NumPy and CuPy"):
            dspk.spatial_filter(np.eye(4, dtype=np.float32), xp.zeros((4, 100), np.float32))


def test_prepare_on_second_sighting():
    built = []
    cache = PreparedCache(lambda a: built.append(1) or a.sum(), prepare_on=2)
    a = np.ones((3, 3))
    assert cache.get(a) is None and built == []
    assert cache.get(a.copy()) == 9.0 and built == [1]
    assert cache.get(a) == 9.0 and built == [1]
    b = a + 1
    assert cache.get(b) is None and cache.get(a) == 9.0 and cache.get(b) == 18.0


def test_ncc_in_a_loop_packs_the_bank_once_and_sees_changes(xp):
    from dspk.match import _one_shot_banks, _prepared_banks, ncc, ncc_direct, ncc_peaks

    _PREPARED_BANKS, _ONE_SHOT_BANKS = _prepared_banks(), _one_shot_banks()
    _PREPARED_BANKS.clear()
    _ONE_SHOT_BANKS.clear()
    img = np.random.default_rng(2).integers(0, 256, (60, 70), dtype=np.uint8)
    bank = img[None, 10:18, 20:30].copy()
    img_d, bank_d = xp.asarray(img), xp.asarray(bank)
    misses, built = _PREPARED_BANKS.misses, _ONE_SHOT_BANKS.built
    for _ in range(3):
        maps = ncc(img_d, bank_d)
    if xp is np:
        assert _PREPARED_BANKS.misses == misses + 1
    else:       # one bank per shape and stream, reloaded with the templates every call
        assert _ONE_SHOT_BANKS.built == built + 1 and len(_PREPARED_BANKS) == 0
    np.testing.assert_array_equal(to_numpy(maps), ncc_direct(img, bank))
    bank_d[0, 0, 0] ^= 0xFF                                      # modified in place
    bank[0, 0, 0] ^= 0xFF
    maps = ncc(img_d, bank_d)
    np.testing.assert_array_equal(to_numpy(maps), ncc_direct(img, bank))
    other = np.ascontiguousarray(img[None, 30:38, 40:50])        # another bank, same shape
    np.testing.assert_array_equal(to_numpy(ncc(img_d, xp.asarray(other))),
                                  ncc_direct(img, other))
    found = ncc_peaks(img_d, xp.asarray(other), 0.99)
    assert found[["template_index", "y", "x"]].tolist() == [(0, 30, 40)]
    for y0 in (5, 6):                                            # views of the image itself
        view = img_d[None, y0:y0 + 8, 3:13]
        np.testing.assert_array_equal(to_numpy(ncc(img_d, view)),
                                      ncc_direct(img, img[None, y0:y0 + 8, 3:13]))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
def test_one_shot_ncc_follows_every_bank_of_a_shape(xp, dtype):
    """A sequence of different banks of one shape through the one-shot call, mixed with a
    non-contiguous one: each call's maps are those of its own templates (the reload)."""
    from dspk.match import ncc, ncc_direct

    rng = np.random.default_rng(5)
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    img = rng.integers(lo, hi, (40, 90), endpoint=True).astype(dtype)
    img_d = xp.asarray(img)
    for i in range(4):
        t = rng.integers(lo, hi, (3, 7, 9), endpoint=True).astype(dtype)
        td = xp.asarray(t) if i != 2 else xp.asarray(np.asfortranarray(t))
        np.testing.assert_array_equal(to_numpy(ncc(img_d, td)), ncc_direct(img, t))


def test_dense_w_skips_the_fingerprint_and_stays_correct(xp):
    """A dense W is prepared once (nothing to prepare), then goes to the dense product
    directly: no fingerprint, and still right after an in-place change; the verdict expires,
    so a sparse W written into the same buffer is found and prepared."""
    from dspk.ops.spatial import _DenseVerdicts, _prepared_filters

    store = _prepared_filters(xp is not np)
    store.clear()
    rng = np.random.default_rng(6)
    w = xp.asarray(rng.standard_normal((96, 96)).astype(np.float32))
    x = xp.asarray(rng.standard_normal((96, 700)).astype(np.float32))

    def check():
        ref = np.asarray(to_numpy(w), np.float64) @ np.asarray(to_numpy(x), np.float64)
        np.testing.assert_allclose(to_numpy(dspk.spatial_filter(w, x)), ref, rtol=1e-4,
                                   atol=1e-4)

    for _ in range(3 if xp is not np else 1):
        check()                                                  # (GPU: dense, then) prepared
    hits, misses = store.hits, store.misses
    for _ in range(5):
        check()
    assert (store.hits, store.misses) == (hits, misses)          # no fingerprint taken
    w[5, 7] += 3.0                                               # in place: still right
    check()
    geom = np.c_[np.zeros(96), 20.0 * np.arange(96)]             # a sparse W, same buffer
    w[...] = xp.asarray(dspk.ops.laplacian_matrix(geom, n_neighbors=2).astype(np.float32))
    for _ in range(_DenseVerdicts.RECHECK + 3):
        check()
    assert any(f.sparse for f, _ in store._entries.values())     # checked again, prepared


@pytest.mark.gpu
def test_gpu_new_operands_are_never_waited_for():
    """A new W on every call (made beforehand, so each buffer is new) goes to the dense product
    without a fingerprint wait: every hash is started, none is waited for, nothing is built;
    a W used again is prepared by its third call; a W modified in place between calls is
    never served a stale plan."""
    import cupy as cp

    from dspk.linalg.prepared import _hasher
    from dspk.ops.spatial import _prepared_filters

    store = _prepared_filters()
    store.clear()
    rng = np.random.default_rng(8)
    geom = np.c_[np.tile([0.0, 32.0], 48), 20.0 * np.arange(96)]
    w0 = dspk.whitening_matrix(np.cov(rng.standard_normal((96, 4000))), geometry_um=geom,
                               n_neighbors=8).astype(np.float32)
    x = cp.asarray(rng.standard_normal((96, 2000)).astype(np.float32))
    fresh = [cp.asarray(w0 * (1 + 0.01 * i)) for i in range(6)]
    hits = store.hits                                            # (counts since the process began)
    hasher = _hasher(0)
    started, waited = hasher.count, hasher.waited
    for w in fresh:
        y = dspk.spatial_filter(w, x)
        np.testing.assert_allclose(y.get(), w.get().astype(np.float64) @ x.get(), rtol=1e-4,
                                   atol=1e-4)
    assert len(store) == 0 and store.hits == hits
    assert hasher.count - started == 6 and hasher.waited == waited   # started, never waited
    w = fresh[0]
    for i in range(6):
        if i == 4:
            w[0, 0] += 1.0                                       # in place, once prepared
        y = dspk.spatial_filter(w, x)
        cp.cuda.Device().synchronize()
        np.testing.assert_allclose(y.get(), w.get().astype(np.float64) @ x.get(), rtol=1e-4,
                                   atol=1e-4)
        if i == 1:
            assert len(store) == 1                               # its third call: prepared


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_a_prepared_filter_never_reads_the_callers_buffer(xp, kind):
    """The cache finds a filter by the content W had: a W overwritten after it was prepared
    must not change what the filter of the old content computes (a dense filter reads W on
    every call; a sparse one builds a plan per dtype of x, here float64 after the change)."""
    from dspk.ops.spatial import _prepared_filters

    _prepared_filters(xp is not np).clear()
    rng = np.random.default_rng(9)
    geom = np.c_[np.tile([0.0, 32.0], 48), 20.0 * np.arange(96)]
    if kind == "dense":
        w = xp.asarray(rng.standard_normal((96, 96)).astype(np.float32))
    else:
        w = xp.asarray(dspk.whitening_matrix(np.cov(rng.standard_normal((96, 4000))),
                                             geometry_um=geom, n_neighbors=8).astype(np.float32))
    x = xp.asarray(rng.standard_normal((96, 800)).astype(np.float32))
    for _ in range(3):
        dspk.spatial_filter(w, x)                                # prepared (2nd or 3rd call)
    w_orig = w.copy()
    w[...] = w * 2.0 + 1.0                                       # the buffer holds another W
    for dtype in (np.float32, np.float64):
        xd = x.astype(dtype)
        y = dspk.spatial_filter(w_orig, xd)                      # the old content again
        ref = np.asarray(to_numpy(w_orig), np.float64) @ np.asarray(to_numpy(xd), np.float64)
        np.testing.assert_allclose(to_numpy(y), ref, rtol=1e-4, atol=1e-4)
