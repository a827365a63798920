"""Normalized cross-correlation of an image (or a 1-row signal) against a bank of templates,
with an exact integer numerator (``dspk.linalg.int_matmul``) and exact integer window sums.

For a window I of the image under template T (K = th·tw pixels), with S_I = ΣI, S_II = ΣI²,
S_T = ΣT, S_TT = ΣT², S_IT = ΣI·T:

    ncc = (K·S_IT − S_I·S_T) / sqrt((K·S_II − S_I²) · (K·S_TT − S_T²))

the correlation coefficient of the mean-subtracted window and template (OpenCV's
TM_CCOEFF_NORMED). Every sum is an exact integer; the numerator and both variance terms are
formed exactly in int64 while K²·max|I|·max|T| < 2^63 (every uint8/int8 case, and int16 up to
K = 92 681 pixels); beyond that they are combined in float64. Only the final ratio is
floating point: float32, from reciprocal square roots. A window or template with zero variance
gives 0.0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pathlib import Path

from .backend import array_module
from .linalg import int_matmul
from .linalg.kernels import kernel
from .linalg.matmul import tuner

__all__ = ["ncc", "ncc_direct", "ncc_peaks", "PEAK_DTYPE"]

MATCH_DTYPES = (np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int16))
NCC_KERNELS = Path(__file__).resolve().parent / "kernels" / "ncc.cu"
_SMEM = 48 * 1024
#: im2col rows are materialized in blocks of about this many bytes (CPU/GPU memory bound)
IM2COL_BLOCK_BYTES = 64 << 20
PEAK_DTYPE = np.dtype([("template_index", np.int64), ("y", np.int64), ("x", np.int64),
                       ("score", np.float32)])


def _validate(image: Any, templates: Any) -> tuple:
    xp = array_module(image, templates)
    if getattr(image, "ndim", None) != 2:
        raise ValueError(f"image: expected a 2-D [H, W] array, got shape "
                         f"{getattr(image, 'shape', None)}")
    if getattr(templates, "ndim", None) == 2:
        templates = templates[None]
    if getattr(templates, "ndim", None) != 3:
        raise ValueError(f"templates: expected [N, th, tw] (or one [th, tw] template), got shape "
                         f"{getattr(templates, 'shape', None)}")
    for name, arr in (("image", image), ("templates", templates)):
        if arr.dtype.kind == "f":
            raise TypeError(f"{name}: float data ({arr.dtype}); ncc works on integer images — "
                            f"quantize first (e.g. to uint8 or int16 with a known scale)")
        if arr.dtype not in MATCH_DTYPES:
            raise TypeError(f"{name}: unsupported dtype {arr.dtype}; ncc takes uint8, int8, int16")
    if image.dtype != templates.dtype:
        raise TypeError(f"templates are {templates.dtype} but the image is {image.dtype}: both "
                        f"must have the same dtype")
    n, th, tw = templates.shape
    if n == 0:
        raise ValueError("templates: the bank is empty (N = 0)")
    if th == 0 or tw == 0:
        raise ValueError(f"templates: empty template shape {th}x{tw}")
    H, W = image.shape
    if th > H or tw > W:
        raise ValueError(f"templates: {th}x{tw} is larger than the image {H}x{W}")
    return xp, templates


def _box_sums(xp: Any, image: Any, th: int, tw: int) -> tuple:
    """Exact window sums S_I and S_II (int64) for every top-left corner, via integral images."""
    img = image.astype(np.int64)
    H, W = img.shape
    ii = xp.zeros((H + 1, W + 1), dtype=np.int64)
    ii[1:, 1:] = img.cumsum(axis=0).cumsum(axis=1)
    sq = xp.zeros((H + 1, W + 1), dtype=np.int64)
    sq[1:, 1:] = (img * img).cumsum(axis=0).cumsum(axis=1)
    ho, wo = H - th + 1, W - tw + 1

    def box(t: Any) -> Any:
        return t[th:th + ho, tw:tw + wo] - t[:ho, tw:tw + wo] - t[th:th + ho, :wo] + t[:ho, :wo]

    return box(ii), box(sq)


def _numerator_sums(xp: Any, image: Any, templates: Any) -> Any:
    """S_IT[n, y, x] = Σ window(y, x)·T[n] (int64), one int_matmul per block of output rows."""
    n, th, tw = templates.shape
    H, W = image.shape
    ho, wo = H - th + 1, W - tw + 1
    K = th * tw
    img = xp.ascontiguousarray(image)
    t_mat = xp.ascontiguousarray(templates.reshape(n, K).T)        # [K, N]
    s, item = img.strides, img.itemsize
    rows_per_block = max(1, IM2COL_BLOCK_BYTES // max(1, wo * K * item))
    out = xp.empty((n, ho, wo), dtype=np.int64)
    for y0 in range(0, ho, rows_per_block):
        y1 = min(ho, y0 + rows_per_block)
        # windows [y1-y0, wo, th, tw] as a strided view, copied once into im2col rows [P, K]
        win = xp.lib.stride_tricks.as_strided(img[y0:], shape=(y1 - y0, wo, th, tw),
                                              strides=(s[0], s[1], s[0], s[1]))
        cols = xp.ascontiguousarray(win).reshape((y1 - y0) * wo, K)
        prod = int_matmul(cols, t_mat)                                 # [P, N] exact
        out[:, y0:y1, :] = prod.T.reshape(n, y1 - y0, wo)
    return out


def _normalize(xp: Any, s_it: Any, s_i: Any, s_ii: Any, templates: Any) -> Any:
    """The coefficient from exact sums: int64 numerator and variances, float32 ratio."""
    n, th, tw = templates.shape
    K = th * tw
    t64 = templates.reshape(n, K).astype(np.int64)
    s_t = t64.sum(axis=1)
    s_tt = (t64 * t64).sum(axis=1)
    m = {np.dtype(np.uint8): 255, np.dtype(np.int8): 128, np.dtype(np.int16): 32768}[
        np.dtype(templates.dtype)]
    exact = K * K * m * m < 2**63
    wide = np.int64 if exact else np.float64
    k = wide(K)
    num = k * s_it.astype(wide) - s_i.astype(wide)[None] * s_t.astype(wide)[:, None, None]
    var_i = k * s_ii.astype(wide) - s_i.astype(wide) * s_i.astype(wide)
    var_t = k * s_tt.astype(wide) - s_t.astype(wide) * s_t.astype(wide)
    # float32 from here: relative rounding ~6e-8 per conversion, no cancellation left.
    num32 = num.astype(np.float32)
    vi = var_i.astype(np.float32)
    vt = var_t.astype(np.float32)
    ok_i = vi > 0
    ok_t = vt > 0
    ri = xp.where(ok_i, 1 / xp.sqrt(xp.where(ok_i, vi, 1)), 0).astype(np.float32)
    rt = xp.where(ok_t, 1 / xp.sqrt(xp.where(ok_t, vt, 1)), 0).astype(np.float32)
    out = num32 * ri[None] * rt[:, None, None]
    return xp.clip(out, -1, 1).astype(np.float32, copy=False)


def ncc(image: Any, templates: Any) -> Any:
    """Normalized cross-correlation maps of a template bank (TM_CCOEFF_NORMED).

    Parameters
    ----------
    image : numpy.ndarray or cupy.ndarray
        [H, W] uint8, int8 or int16 (a 1-row image gives a 1-D signal search).
    templates : array
        [N, th, tw] (or one [th, tw]) of the image's dtype; rectangular templates allowed.

    Returns
    -------
    array
        float32 [N, H − th + 1, W − tw + 1], the array type of the inputs: the correlation
        coefficient of the mean-subtracted template and window, in [−1, 1]; 0.0 where the
        window or the template has zero variance.

    Raises
    ------
    TypeError
        Float images (quantize first), dtypes other than uint8/int8/int16, or image and
        templates of different dtypes.
    ValueError
        A template larger than the image, an empty bank, wrong dimensions.

    Notes
    -----
    Implementations, chosen per device and size class by dspk's tuner (timed on first sight,
    results checked against the first): ``im2col_int_matmul`` — the numerator Σ window·template
    for the whole bank as one exact integer product per block of positions
    (`dspk.linalg.int_matmul`: INT8 tensor cores on the GPU), window sums from exact integral
    images; ``bank_dp4a`` (GPU, 8-bit images) — one fused kernel that loads each image patch
    once and correlates it with the whole bank (`dspk/kernels/ncc.cu`). Only the final ratio is
    floating point. See the module docstring for the formula and the exactness bounds.
    `ncc_direct` computes the same maps directly.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.match import ncc
    >>> img = np.random.default_rng(0).integers(0, 256, (40, 50), dtype=np.uint8)
    >>> maps = ncc(img, img[None, 10:18, 20:30])
    >>> maps.shape, float(maps[0, 10, 20]) > 0.999
    ((1, 33, 41), True)
    """
    xp, templates = _validate(image, templates)
    impls = {"im2col_int_matmul": lambda: _ncc_engine(xp, image, templates)}
    if xp is not np and _bank_reason(image, templates) is None:
        impls["bank_dp4a"] = lambda: _ncc_bank_dp4a(xp, image, templates)
    if len(impls) == 1:
        return impls["im2col_int_matmul"]()
    n, th, tw = templates.shape
    gpu = xp is not np
    dev = image.device.id if gpu else None
    key = ("ncc", tuner.stamp(gpu, dev), image.dtype.name,
           *(int(v).bit_length() for v in (image.shape[0], image.shape[1], n, th, tw)))
    name, _ = tuner.choose(key, impls, gpu, _agree)
    return impls[name]()


def _agree(got: Any, ref: Any) -> str | None:
    worst = float(abs(got - ref).max()) if got.size else 0.0
    return None if worst <= 2e-6 else f"coefficients differ from the reference by {worst:.2e}"


def _ncc_engine(xp: Any, image: Any, templates: Any) -> Any:
    """im2col blocks through the integer product engine, integral-image window sums."""
    n, th, tw = templates.shape
    s_i, s_ii = _box_sums(xp, image, th, tw)
    s_it = _numerator_sums(xp, image, templates)
    return _normalize(xp, s_it, s_i, s_ii, templates)


def _bank_reason(image: Any, templates: Any) -> str | None:
    """Why the fused dp4a bank kernel cannot run these inputs (None if it can)."""
    n, th, tw = templates.shape
    if image.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        return "the dp4a bank kernel takes 8-bit images"
    if th * tw > 131071:
        return "template of more than 131071 pixels (int32 sums)"
    twq = -(-tw // 4)
    pw = -(-(32 + tw - 1 + 6) // 4) * 4
    if n * th * twq * 4 + (8 + th - 1) * pw > _SMEM:
        return "bank and image patch exceed 48 KiB of shared memory"
    return None


def _ncc_bank_dp4a(xp: Any, image: Any, templates: Any) -> Any:
    """The fused kernel of dspk/kernels/ncc.cu: patch and bank in shared memory, __dp4a."""
    n, th, tw = templates.shape
    H, W = image.shape
    ho, wo = H - th + 1, W - tw + 1
    K = th * tw
    center = image.dtype == np.uint8
    t = templates.astype(np.int16) - (128 if center else 0)           # centred, -128..127
    twq = -(-tw // 4)
    packed = xp.zeros((n, th, twq * 4), dtype=np.int8)
    packed[:, :, :tw] = t.astype(np.int8)
    bank = packed.view(np.int32)                                       # [n, th, twq] words
    t64 = t.reshape(n, K).astype(np.int64)
    t_sum = t64.sum(axis=1)
    var_t = K * (t64 * t64).sum(axis=1) - t_sum * t_sum
    vt = xp.maximum(var_t, 1).astype(np.float32)   # float32: no float64 in device code
    t_rs = xp.where(var_t > 0, 1 / xp.sqrt(vt), 0).astype(np.float32)
    img = image if image.strides[1] == 1 else xp.ascontiguousarray(image)
    img8 = img.view(np.uint8)
    out = xp.empty((n, ho, wo), dtype=np.float32)
    tg = 32 if n >= 32 else 16
    fn = kernel(str(NCC_KERNELS), f"ncc_bank_dp4a<{'true' if center else 'false'}, {tg}>")
    pw = -(-(32 + tw - 1 + 6) // 4) * 4
    smem = n * th * twq * 4 + (8 + th - 1) * pw
    fn((-(-wo // 32), -(-ho // 8)), (32, 8),
       (img8, np.int64(img8.strides[0]), np.int32(H), np.int32(W), bank, np.int32(n),
        np.int32(th), np.int32(tw), np.int32(twq), t_sum, t_rs, out, np.int32(ho), np.int32(wo)),
       shared_mem=smem)
    return out


def ncc_direct(image: Any, templates: Any) -> Any:
    """The same maps as `ncc`, computed directly: S_IT accumulated over template offsets in
    int64 (no product engine). The tests' reference; O(N·K·positions) work."""
    xp, templates = _validate(image, templates)
    n, th, tw = templates.shape
    H, W = image.shape
    ho, wo = H - th + 1, W - tw + 1
    img = image.astype(np.int64)
    t64 = templates.astype(np.int64)
    s_it = xp.zeros((n, ho, wo), dtype=np.int64)
    for dy in range(th):
        for dx in range(tw):
            s_it += t64[:, dy, dx][:, None, None] * img[dy:dy + ho, dx:dx + wo][None]
    s_i = xp.zeros((ho, wo), dtype=np.int64)
    s_ii = xp.zeros((ho, wo), dtype=np.int64)
    for dy in range(th):
        for dx in range(tw):
            w = img[dy:dy + ho, dx:dx + wo]
            s_i += w
            s_ii += w * w
    return _normalize(xp, s_it, s_i, s_ii, templates)


def ncc_peaks(image: Any, templates: Any, threshold: float, min_distance: int = 1,
              maps: Any = None) -> np.ndarray:
    """Local maxima of the `ncc` maps at or above ``threshold``.

    A position is a peak of template n when its score is >= ``threshold`` and equals the
    maximum of that template's map over the (2·min_distance + 1)² square around it (positions
    outside the map do not count). Plateaus give one peak per position of the plateau.

    Parameters
    ----------
    image, templates :
        As for `ncc`.
    threshold : float
        Minimum score, in [−1, 1].
    min_distance : int
        Half-width of the neighbourhood, in pixels (>= 1).
    maps : array, optional
        Coefficient maps already computed by `ncc` for these inputs.

    Returns
    -------
    numpy.ndarray
        Structured, dtype `PEAK_DTYPE` (``template_index``, ``y``, ``x`` — top-left corner of the
        window, as in the maps — and ``score``), sorted by template, then y, then x. A NumPy
        array whatever the input type: a peak list is small.
    """
    if not -1.0 <= float(threshold) <= 1.0:
        raise ValueError(f"threshold: expected a score in [-1, 1], got {threshold}")
    if int(min_distance) < 1:
        raise ValueError(f"min_distance: expected an integer >= 1, got {min_distance}")
    xp, templates = _validate(image, templates)
    if maps is None:
        maps = ncc(image, templates)
    size = 2 * int(min_distance) + 1
    if xp is np:
        from scipy.ndimage import maximum_filter  # noqa: PLC0415
    else:
        from cupyx.scipy.ndimage import maximum_filter  # noqa: PLC0415
    local = maximum_filter(maps, size=(1, size, size), mode="constant", cval=-np.inf)
    keep = (maps >= np.float32(threshold)) & (maps == local)
    t, y, x = (v.get() if hasattr(v, "get") else v for v in xp.nonzero(keep))
    scores = maps[keep]
    scores = scores.get() if hasattr(scores, "get") else scores
    peaks = np.empty(len(t), dtype=PEAK_DTYPE)
    peaks["template_index"], peaks["y"], peaks["x"], peaks["score"] = t, y, x, scores
    return peaks
