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
    from dspk.ops.spatial import _PREPARED_FILTERS

    _PREPARED_FILTERS.clear()
    rng = np.random.default_rng(1)
    geom = np.c_[np.tile([0.0, 32.0], 32), 20.0 * np.arange(64)]
    cov = np.cov(rng.standard_normal((64, 5000)))
    w = xp.asarray(dspk.whitening_matrix(cov, geometry_um=geom, n_neighbors=8))
    x = xp.asarray(rng.standard_normal((64, 3000)).astype(np.float32))
    hits = _PREPARED_FILTERS.hits
    for _ in range(3):
        y = dspk.spatial_filter(w, x)
    assert _PREPARED_FILTERS.hits == hits + 2
    ref = np.asarray(to_numpy(w), np.float64) @ np.asarray(to_numpy(x), np.float64)
    np.testing.assert_allclose(to_numpy(y), ref, rtol=1e-5, atol=1e-4)
    w[3, 3] += 1.0                                               # modified in place
    y = dspk.spatial_filter(w, x)
    ref = np.asarray(to_numpy(w), np.float64) @ np.asarray(to_numpy(x), np.float64)
    np.testing.assert_allclose(to_numpy(y), ref, rtol=1e-5, atol=1e-4)


def test_ncc_in_a_loop_packs_the_bank_once_and_sees_changes(xp):
    from dspk.match import _PREPARED_BANKS, ncc, ncc_direct

    _PREPARED_BANKS.clear()
    img = np.random.default_rng(2).integers(0, 256, (60, 70), dtype=np.uint8)
    bank = img[None, 10:18, 20:30].copy()
    img_d, bank_d = xp.asarray(img), xp.asarray(bank)
    misses = _PREPARED_BANKS.misses
    for _ in range(3):
        maps = ncc(img_d, bank_d)
    assert _PREPARED_BANKS.misses == misses + 1
    bank_d[0, 0, 0] ^= 0xFF                                      # modified in place
    bank[0, 0, 0] ^= 0xFF
    maps = ncc(img_d, bank_d)
    np.testing.assert_allclose(to_numpy(maps), ncc_direct(img, bank), atol=2e-6)
