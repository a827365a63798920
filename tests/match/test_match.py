"""dspk.match: exact integer sums, coefficients against a float64 evaluation of the definition,
peaks against a brute-force local-maximum search, bad input. CPU and GPU (`gpu` params)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspk.backend import to_numpy
from dspk.match import (MMA_VARIANTS, PEAK_DTYPE, TemplateBank, _numerator_sums, ncc, ncc_direct,
                        ncc_peaks)

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
DTYPES = [np.uint8, np.int8, np.int16]


def rand(shape, dtype, seed):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, int(info.max) + 1, shape, dtype=dtype)


def ncc_float64(image, templates):
    """TM_CCOEFF_NORMED straight from its definition, in float64."""
    img = image.astype(np.float64)
    n, th, tw = templates.shape
    ho, wo = img.shape[0] - th + 1, img.shape[1] - tw + 1
    out = np.zeros((n, ho, wo))
    for i in range(n):
        t = templates[i].astype(np.float64)
        t = t - t.mean()
        tn = np.sqrt((t * t).sum())
        for y in range(ho):
            for x in range(wo):
                w = img[y:y + th, x:x + tw]
                w = w - w.mean()
                d = np.sqrt((w * w).sum()) * tn
                out[i, y, x] = 0.0 if d == 0 else (w * t).sum() / d
    return out


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    H = draw(st.integers(1, 12))
    W = draw(st.integers(1, 14))
    th = draw(st.integers(1, H))
    tw = draw(st.integers(1, W))
    n = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    image = rand((H, W), dtype, seed)
    bank = rand((n, th, tw), dtype, seed + 1)
    if draw(st.booleans()):  # templates cut from the image: perfect matches exist
        y, x = draw(st.integers(0, H - th)), draw(st.integers(0, W - tw))
        bank[0] = image[y:y + th, x:x + tw]
    if draw(st.integers(0, 5)) == 0:  # a flat region and a flat template: zero variance
        image[:th, :tw] = image[0, 0]
        bank[-1] = bank[-1, 0, 0]
    return image, bank


@SETTINGS
@given(case=cases())
def test_sums_exact_and_coefficients_match_the_definition(xp, case):
    image, bank = case
    xi, xb = xp.asarray(image), xp.asarray(bank)
    # numerator sums bit-identical to the direct int64 computation
    n, th, tw = bank.shape
    ho, wo = image.shape[0] - th + 1, image.shape[1] - tw + 1
    direct = np.zeros((n, ho, wo), np.int64)
    for dy in range(th):
        for dx in range(tw):
            direct += bank[:, dy, dx].astype(np.int64)[:, None, None] * \
                image[dy:dy + ho, dx:dx + wo].astype(np.int64)[None]
    t_mat = xp.ascontiguousarray(xb.reshape(n, -1).T)
    assert np.array_equal(to_numpy(_numerator_sums(xp, xi, t_mat, th, tw)), direct)
    got = to_numpy(ncc(xi, xb))
    assert got.dtype == np.float32 and got.shape == (n, ho, wo)
    np.testing.assert_array_equal(got, to_numpy(ncc_direct(xi, xb)))
    assert np.max(np.abs(got - ncc_float64(image, bank))) <= 1e-6


def test_one_row_signal_search(xp):
    sig = rand((1, 500), np.int16, 3)
    tmpl = sig[:, 100:161][None].copy()
    maps = to_numpy(ncc(xp.asarray(sig), xp.asarray(tmpl)))
    assert maps.shape == (1, 1, 440) and int(np.argmax(maps[0, 0])) == 100


def test_zero_variance_gives_zero(xp):
    image = np.full((6, 6), 7, np.uint8)
    bank = rand((2, 3, 3), np.uint8, 4)
    assert np.all(to_numpy(ncc(xp.asarray(image), xp.asarray(bank))) == 0.0)


def brute_peaks(maps, threshold, d):
    rows = []
    n, h, w = maps.shape
    for t in range(n):
        for y in range(h):
            for x in range(w):
                s = maps[t, y, x]
                nb = maps[t, max(0, y - d):y + d + 1, max(0, x - d):x + d + 1]
                if s >= np.float32(threshold) and s == nb.max():
                    rows.append((t, y, x, s))
    return np.array(rows, dtype=PEAK_DTYPE)


@pytest.mark.parametrize("d", [1, 3])
def test_peaks_match_a_brute_force_search(xp, d):
    image = rand((40, 37), np.uint8, 5)
    bank = np.stack([image[5:13, 7:15], image[20:28, 3:11]])
    xi, xb = xp.asarray(image), xp.asarray(bank)
    peaks = ncc_peaks(xi, xb, 0.3, min_distance=d)
    ref = brute_peaks(to_numpy(ncc(xi, xb)), 0.3, d)
    assert peaks.dtype == PEAK_DTYPE
    np.testing.assert_array_equal(peaks, ref)
    top = peaks[peaks["score"] > 0.999]
    assert {(int(t), int(y), int(x)) for t, y, x, _ in top} == {(0, 5, 7), (1, 20, 3)}


# -- bad input ---------------------------------------------------------------------------------
def test_template_larger_than_image(xp):
    with pytest.raises(ValueError, match="templates: 5x2 is larger than the image 4x4"):
        ncc(xp.zeros((4, 4), np.uint8), xp.zeros((1, 5, 2), np.uint8))


def test_empty_bank(xp):
    with pytest.raises(ValueError, match="the bank is empty"):
        ncc(xp.zeros((4, 4), np.uint8), xp.zeros((0, 2, 2), np.uint8))


def test_dtype_mismatch(xp):
    with pytest.raises(TypeError, match="templates are int16 but the image is uint8"):
        ncc(xp.zeros((4, 4), np.uint8), xp.zeros((1, 2, 2), np.int16))


def test_float_image_points_to_quantization(xp):
    with pytest.raises(TypeError, match="quantize first"):
        ncc(xp.zeros((4, 4), np.float32), xp.zeros((1, 2, 2), np.float32))


def test_single_template_2d_and_non_contiguous_inputs(xp):
    image = rand((30, 40), np.int16, 6)
    xi = xp.asarray(image)[:, ::2]                # non-contiguous
    tmpl = xp.asarray(image[3:9, 4:14:2].copy())  # one 2-D template
    got = to_numpy(ncc(xi, tmpl))
    assert got.shape == (1, 25, 16) and got[0, 3, 2] > 0.999999


def test_peak_arguments(xp):
    img = xp.zeros((8, 8), np.uint8)
    with pytest.raises(ValueError, match="threshold"):
        ncc_peaks(img, img[None, :2, :2], 1.5)
    with pytest.raises(ValueError, match="min_distance"):
        ncc_peaks(img, img[None, :2, :2], 0.5, min_distance=0)


@pytest.mark.gpu
@SETTINGS
@given(case=cases(), n_extra=st.sampled_from([0, 16, 39]))
def test_gpu_bank_kernel_matches_the_definition(case, n_extra):
    """The fused dp4a kernel: ragged template widths (the last word's mask), several template
    groups per thread (TG), blocks overhanging the maps."""
    import cupy as cp

    from dspk.match import _bank_reason

    image, bank = case
    if image.dtype == np.int16:
        image = (image >> 8).astype(np.int8)
        bank = (bank >> 8).astype(np.int8)
    if n_extra:
        extra = rand((n_extra,) + bank.shape[1:], bank.dtype, 11)
        bank = np.concatenate([bank, extra])
    xi, xb = cp.asarray(image), cp.asarray(bank)
    tb = TemplateBank(xb)
    assert _bank_reason(xi, tb) is None
    got = tb._ncc_bank_dp4a(xi).get()
    assert np.max(np.abs(got - ncc_float64(image, bank))) <= 1e-6
    assert np.max(np.abs(got - ncc_direct(xi, xb).get())) <= 2e-6


def test_template_bank_reuse_and_snapshot(xp):
    image = rand((20, 24), np.uint8, 8)
    tmpl = xp.asarray(image[None, 2:8, 3:9].copy())
    bank = TemplateBank(tmpl)
    first = to_numpy(bank.ncc(xp.asarray(image)))
    tmpl[...] = 0  # the bank keeps its own copy
    np.testing.assert_array_equal(to_numpy(bank.ncc(xp.asarray(image))), first)
    np.testing.assert_array_equal(to_numpy(ncc(xp.asarray(image), bank)), first)
    assert first[0, 2, 3] > 0.99999


@pytest.mark.gpu
@SETTINGS
@given(case=cases(), n_extra=st.sampled_from([0, 16, 39]),
       variant=st.sampled_from(sorted(MMA_VARIANTS)))
def test_gpu_tensor_core_bank_kernel_matches_the_definition(case, n_extra, variant):
    """The fused mma kernel (each variant): K steps padded past the window, template groups
    of 32, ragged widths, blocks overhanging the maps."""
    import cupy as cp

    from dspk.match import _mma_reason

    image, bank = case
    if image.dtype == np.int16:
        image = (image >> 8).astype(np.int8)
        bank = (bank >> 8).astype(np.int8)
    if n_extra:
        bank = np.concatenate([bank, rand((n_extra,) + bank.shape[1:], bank.dtype, 12)])
    xi = cp.asarray(image)
    tb = TemplateBank(cp.asarray(bank))
    assert _mma_reason(xi, tb, variant) is None
    got = tb._ncc_bank_mma(xi, variant).get()
    assert np.max(np.abs(got - ncc_float64(image, bank))) <= 1e-6
    np.testing.assert_array_equal(got, ncc_direct(xi, cp.asarray(bank)).get())


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(20, 20), (3, 130)])
def test_gpu_tensor_core_kernel_int64_epilogue_and_bank_slices(shape, monkeypatch):
    """Templates of more than 362 pixels take the int64 epilogue; a shared-memory budget too
    small for the whole bank splits it over grid z. Both bit-identical to the direct maps."""
    import cupy as cp

    import dspk.match as match

    th, tw = shape
    image = rand((th + 21, tw + 70), np.uint8, 13)
    bank = rand((37, th, tw), np.uint8, 14)
    bank[5] = image[4:4 + th, 9:9 + tw]
    xi, xb = cp.asarray(image), cp.asarray(bank)
    ref = ncc_direct(xi, xb).get()
    plan = match._mma_plan(37, th, tw, 0)
    assert plan["wide"] and plan["grid_z"] == 1
    monkeypatch.setattr(match, "MMA_SMEM_BUDGET", plan["fixed"] + plan["NT"] * plan["per_tile"])
    sliced = match._mma_plan(37, th, tw, 0)
    assert sliced["grid_z"] > 1
    for _ in range(2):   # in slices, then (a fresh bank, the normal budget) whole
        got = TemplateBank(xb)._ncc_bank_mma(xi).get()
        np.testing.assert_array_equal(got, ref)
        assert got[5, 4, 9] > 0.99999
        monkeypatch.undo()


def test_peaks_in_template_groups_equal_peaks_of_the_full_maps(xp, monkeypatch):
    import dspk.match as match

    image = rand((30, 33), np.uint8, 9)
    bank = np.stack([image[i:i + 6, 2 * i:2 * i + 5] for i in range(7)])
    xi, xb = xp.asarray(image), xp.asarray(bank)
    whole = ncc_peaks(xi, xb, 0.2, min_distance=2)
    monkeypatch.setattr(match, "PEAK_MAPS_BYTES", 3 * 4 * 25 * 29)  # groups of 3 templates
    monkeypatch.setattr(match, "PEAK_CANDIDATES_BYTES", 0)  # no fused candidate list
    np.testing.assert_array_equal(ncc_peaks(xi, xb, 0.2, min_distance=2), whole)
    np.testing.assert_array_equal(brute_peaks(to_numpy(ncc(xi, xb)), 0.2, 2), whole)


@pytest.mark.gpu
@pytest.mark.parametrize("threshold", [-1.0, 0.1, 0.95])
def test_gpu_fused_peaks_with_a_growing_candidate_list(threshold):
    """The tensor-core peak search (no maps): a candidate list that starts too small is grown
    and the search repeated; every threshold, plateaus of flat windows included, gives the
    peaks of the maps."""
    import cupy as cp

    image = rand((50, 90), np.uint8, 15)
    image[30:40, 50:70] = 77                       # flat: zero variance, score 0 plateau
    bank = np.stack([image[i:i + 7, 3 * i:3 * i + 9] for i in range(11)])
    xi, xb = cp.asarray(image), cp.asarray(bank)
    tb = TemplateBank(xb)
    tb._cache["peak_capacity"] = 8
    got = tb._peaks_mma(xi, threshold, 2)
    assert got is not None
    if threshold < 0:   # every position is a candidate: the list had to grow
        assert tb._cache["peak_capacity"] == 11 * 44 * 82
    np.testing.assert_array_equal(got, brute_peaks(ncc(xi, xb).get(), threshold, 2))
    np.testing.assert_array_equal(ncc_peaks(xi, xb, threshold, 2), got)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", sorted(MMA_VARIANTS))
@pytest.mark.parametrize("hash_max_d", [8, 0])
@pytest.mark.parametrize("width", [333, 334])
def test_gpu_tensor_core_interior_blocks_maps_and_peaks(variant, hash_max_d, width,
                                                        monkeypatch):
    """Blocks whose positions and templates are all inside (the kernel's test-free epilogue,
    its sector-aligned stores) next to ragged ones: maps bit-identical to the direct ones
    (maps 318 and 319 wide: template rows starting at every offset within a 32-byte sector),
    peaks (several thresholds, repeated calls on the packed launches; the hash-table check and
    the sorting one) equal to those of the maps."""
    import cupy as cp

    import dspk.match as match

    monkeypatch.setattr(match, "PEAK_HASH_MAX_D", hash_max_d)

    image = rand((150, width), np.uint8, 21)
    bank = np.stack([image[4 * i:4 * i + 16, 9 * i:9 * i + 16] for i in range(32)])
    xi, xb = cp.asarray(image), cp.asarray(bank)
    ref = ncc_direct(xi, xb).get()
    tb = TemplateBank(xb)
    np.testing.assert_array_equal(tb._ncc_bank_mma(xi, variant).get(), ref)
    for threshold in (0.3, 0.99, 1.0, -1.0, 0.3):
        # reference: the CPU peaks of the direct maps (scipy's maximum filter; checked against
        # brute force on small maps above)
        want = ncc_peaks(image, bank, threshold, 3, maps=ref)
        np.testing.assert_array_equal(tb._peaks_mma(xi, threshold, 3), want)
