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

import threading
from typing import Any

import numpy as np

from .backend import array_module, device_properties, is_cupy_array
from .linalg import int_matmul
from .kernels import LAUNCH, FastLaunch, declare_instances, kernel
from .linalg.engine import current_engine
from .linalg.host_checks import to_host
from .linalg.prepared import PreparedCache

__all__ = ["ncc", "ncc_direct", "ncc_peaks", "TemplateBank", "PEAK_DTYPE"]

MATCH_DTYPES = (np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int16))
_SMEM = 48 * 1024
#: im2col rows are materialized in blocks of about this many bytes (CPU/GPU memory bound)
IM2COL_BLOCK_BYTES = 64 << 20
#: ncc_peaks computes the maps of at most this many bytes at a time (template groups)
PEAK_MAPS_BYTES = 256 << 20
#: the fused peak search lists scores above the threshold in at most this many bytes
PEAK_CANDIDATES_BYTES = 1 << 30
#: ncc_peaks checks neighbourhoods up to this half-width through a hash table of the
#: candidates ((2d+1)^2 - 1 lookups each), wider ones by sorting the candidates
PEAK_HASH_MAX_D = 8
#: ... while the candidate list holds at most this many (the table is 2-4x the list)
PEAK_HASH_MAX_CANDIDATES = 1 << 24
#: peak lists up to this long are sorted on the host, longer ones on the device
PEAK_HOST_SORT_MAX = 4096
#: tensor-core kernel: positions per block along x (rows per block: the variant's BY)
MMA_BX = LAUNCH["MMA_BX"]
#: the fused kernels' blocks (dspk/kernels/launch.cuh): dp4a positions per block along x and
#: y, tensor-core and bank-packing threads
NCC_TX, NCC_TY = LAUNCH["NCC_TX"], LAUNCH["NCC_TY"]
MMA_THREADS, PACK_THREADS = LAUNCH["NCC_MMA_THREADS"], LAUNCH["NCC_PACK_THREADS"]
#: a cap on the tensor-core kernel's dynamic shared memory per block (below it, the variant's
#: blocks per SM decide: an SM's shared memory / blocks - the 1 KiB the driver keeps per block)
MMA_SMEM_BUDGET = 227 * 1024
#: tensor-core kernel variants for the tuner: name -> (n-tiles per pass NT or None for the
#: default, blocks per SM, rows per block BY). NT = 2 at 3 blocks per SM: half the
#: accumulators, 80 registers, 24 warps per SM instead of 16 (each A fragment serves 2 n-tiles
#: instead of 4). BY = 64: the th - 1 halo rows of the prologue spread over twice the rows, for
#: ~40 KB more shared memory per block (banks of more than ~40 templates take grid-z slices).
MMA_VARIANTS = {"bank_mma": (None, 2, 32), "bank_mma_nt2": (2, 3, 32),
                "bank_mma_by64": (None, 2, 64)}
#: the variant whose candidate-list mode (PEAKS) ncc_peaks runs
PEAK_VARIANT = "bank_mma"
PEAK_DTYPE = np.dtype([("template_index", np.int64), ("y", np.int64), ("x", np.int64),
                       ("score", np.float32)])
#: the fused kernels' templates per pass of the dp4a kernel (TG)
DP4A_GROUPS = (16, 32)
#: ncc.cu's kernels without template parameters (the peak checks)
PEAK_KERNELS = ("ncc_peak_check", "ncc_peak_insert", "ncc_peak_check_hash")


#: the tensor-core kernel's mma.sync m16n8k32 on int8 needs this compute capability
MMA_MIN_CC = (8, 0)


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def _cc(props: dict) -> tuple[int, int]:
    return int(props.get("major", 0)), int(props.get("minor", 0))


def _dp4a_expression(center: bool, tg: int) -> str:
    return f"ncc_bank_dp4a<{_bool(center)}, {tg}>"


def _pack_expression(center: bool) -> str:
    return f"ncc_mma_pack<{_bool(center)}>"


def _mma_expression(center: bool, plan: dict, peaks: bool) -> str:
    """The tensor-core kernel's instance for a `_mma_plan`."""
    return (f"ncc_bank_mma<{_bool(center)}, {plan['NT']}, {_bool(plan['wide'])}, "
            f"{_bool(peaks)}, {plan['minb']}, {plan['BY']}>")


def _mma_nt(ntiles: int, wide: bool, variant: str) -> int:
    """n-tiles per pass of ``variant`` for a bank of ``ntiles`` tiles of 8 templates: 4, or
    fewer when the bank has fewer; 2 at most with int64 sums (WIDE: registers for 2) or
    where the variant asks for 2."""
    nt = 4 if ntiles >= 4 else (2 if ntiles >= 2 else 1)
    if wide:
        nt = min(nt, 2)                                 # int64 sums: registers for 2 n-tiles
    want_nt = MMA_VARIANTS[variant][0]
    if want_nt is not None:
        nt = min(nt, want_nt)
    return nt


def _ncc_instances(props: dict) -> set[str]:
    """Every kernel of ncc.cu dspk requests: the dp4a bank for both centrings and template
    groups, the bank packing, the tensor-core kernel of each variant for every n-tile count
    its rule gives (maps; the candidate list for PEAK_VARIANT), the peak checks."""
    found = {*PEAK_KERNELS, *(_pack_expression(c) for c in (False, True)),
             *(_dp4a_expression(c, tg) for c in (False, True) for tg in DP4A_GROUPS)}
    if _cc(props) < MMA_MIN_CC:
        return found                                    # no mma.sync m16n8k32 to compile
    for variant, (_, minb, by) in MMA_VARIANTS.items():
        for ntiles in range(1, 5):                      # 4 and more tiles: the same rule
            for wide in (False, True):
                plan = {"NT": _mma_nt(ntiles, wide, variant), "wide": wide, "minb": minb,
                        "BY": by}
                for center in (False, True):
                    for peaks in {False, variant == PEAK_VARIANT}:
                        found.add(_mma_expression(center, plan, peaks))
    return found


declare_instances("ncc.cu", _ncc_instances)


def _check_dtype(name: str, arr: Any) -> None:
    if arr.dtype.kind == "f":
        raise TypeError(f"{name}: float data ({arr.dtype}); ncc works on integer images — "
                        f"quantize first (e.g. to uint8 or int16 with a known scale)")
    if arr.dtype not in MATCH_DTYPES:
        raise TypeError(f"{name}: unsupported dtype {arr.dtype}; ncc takes uint8, int8, int16")


def _validate(image: Any, bank: "TemplateBank") -> Any:
    """Check an image against a bank; returns the array module."""
    xp = array_module(image, bank.templates)
    if getattr(image, "ndim", None) != 2:
        raise ValueError(f"image: expected a 2-D [H, W] array, got shape "
                         f"{getattr(image, 'shape', None)}")
    _check_dtype("image", image)
    if image.dtype != bank.dtype:
        raise TypeError(f"templates are {bank.dtype} but the image is {image.dtype}: both "
                        f"must have the same dtype")
    H, W = image.shape
    if bank.th > H or bank.tw > W:
        raise ValueError(f"templates: {bank.th}x{bank.tw} is larger than the image {H}x{W}")
    return xp


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


def _numerator_sums(xp: Any, image: Any, t_mat: Any, th: int, tw: int) -> Any:
    """S_IT[n, y, x] = Σ window(y, x)·T[n] (int64), one int_matmul per block of output rows;
    ``t_mat`` is the bank as a [K, N] matrix (K = th·tw, row-major pixels)."""
    n = t_mat.shape[1]
    H, W = image.shape
    ho, wo = H - th + 1, W - tw + 1
    K = th * tw
    img = xp.ascontiguousarray(image)
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


def _template_sums(templates: Any) -> tuple:
    """S_T and S_TT per template (int64, exact)."""
    n = templates.shape[0]
    t64 = templates.reshape(n, -1).astype(np.int64)
    return t64.sum(axis=1), (t64 * t64).sum(axis=1)


def _normalize(xp: Any, s_it: Any, s_i: Any, s_ii: Any, K: int, s_t: Any, s_tt: Any,
               dtype: Any) -> Any:
    """The coefficient from exact sums: int64 numerator and variances, float32 ratio."""
    m = {np.dtype(np.uint8): 255, np.dtype(np.int8): 128, np.dtype(np.int16): 32768}[
        np.dtype(dtype)]
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


class TemplateBank:
    """A bank of templates prepared once for repeated matching: its sums, its [K, N] matrix for
    the product engine and its packed words for the fused GPU kernel are computed on first use
    and kept (the templates are copied, so later changes to the caller's array do not leak in).

    Parameters
    ----------
    templates : numpy.ndarray or cupy.ndarray
        [N, th, tw] (or one [th, tw]) uint8, int8 or int16.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.match import TemplateBank
    >>> img = np.random.default_rng(1).integers(0, 256, (30, 30), dtype=np.uint8)
    >>> bank = TemplateBank(img[None, 4:12, 6:14])
    >>> [tuple(int(v) for v in p)[:3] for p in bank.peaks(img, 0.999)]
    [(0, 4, 6)]
    """

    def __init__(self, templates: Any):
        xp = array_module(templates)
        if getattr(templates, "ndim", None) == 2:
            templates = templates[None]
        if getattr(templates, "ndim", None) != 3:
            raise ValueError(f"templates: expected [N, th, tw] (or one [th, tw] template), got "
                             f"shape {getattr(templates, 'shape', None)}")
        _check_dtype("templates", templates)
        n, th, tw = templates.shape
        if n == 0:
            raise ValueError("templates: the bank is empty (N = 0)")
        if th == 0 or tw == 0:
            raise ValueError(f"templates: empty template shape {th}x{tw}")
        self.xp = xp
        self._memcpy = xp.cuda.runtime.memcpyAsync if xp is not np else None
        self.templates = xp.array(templates, copy=True, order="C")
        self.n, self.th, self.tw = n, th, tw
        self.dtype = templates.dtype
        self._cache: dict = {}
        self._bound: dict = {}   # image signature -> bound implementation
        self._repack: dict = {}  # cache name -> launch that packs self.templates in place
        self._live: set = set()  # the packed words that bound launches read (kept on reload)

    def _get(self, name: str, make: Any) -> Any:
        if name not in self._cache:
            self._cache[name] = make()
        return self._cache[name]

    def _reload(self, templates: Any, stream: int) -> None:
        """Take the values of ``templates`` (same shape, dtype and device as the bank's) for
        the next calls on ``stream``: copied over the bank's own, the tensor-core words that
        bound launches read packed again into the same buffers (so those launches stay
        valid), every other derived array dropped (made again when used). Two launches, no
        host wait: what a one-shot `ncc` does instead of reading the content to look it up
        (the pack of a 32 x 16² bank is a few µs of GPU time; a content hash costs a
        device-to-host copy, that is, a wait for all the work queued before)."""
        if templates.flags.c_contiguous:
            self._memcpy(self.templates.data.ptr, templates.data.ptr, templates.nbytes,
                         _DEVICE_TO_DEVICE, stream)
        else:
            self.templates[...] = templates if templates.ndim == 3 else templates[None]
        cache = self._cache
        for name in _CONTENT_CACHES:
            cache.pop(name, None)
        for name in [k for k in self._repack if k not in self._live]:
            del self._repack[name], cache[name]     # packed for tuning only: pack on next use
        for launch in self._repack.values():
            launch(stream)

    @property
    def sums(self) -> tuple:
        """(S_T, S_TT): each template's sum and sum of squares, int64 [N] (exact)."""
        return self._get("sums", lambda: _template_sums(self.templates))

    @property
    def matrix(self) -> Any:
        """The bank as a C-contiguous [th·tw, N] matrix (row-major pixels) for the product
        engine."""
        return self._get("matrix", lambda: self.xp.ascontiguousarray(
            self.templates.reshape(self.n, -1).T))

    def ncc(self, image: Any) -> Any:
        """Normalized cross-correlation maps of a template bank (TM_CCOEFF_NORMED).

        Parameters
        ----------
        image : numpy.ndarray or cupy.ndarray
            [H, W] of the bank's dtype (a 1-row image gives a 1-D signal search).

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
        once and correlates it with the whole bank with __dp4a; ``bank_mma`` (GPU, 8-bit, cc >=
        8.0) — the same on INT8 tensor cores (mma.sync), the window matrix read from shifted
        copies of the image patch in shared memory (implicit im2col: never written,
        `dspk/kernels/ncc.cu`; variants in `MMA_VARIANTS`: templates per pass, blocks per SM,
        rows per block). Only the final ratio is floating point, computed the same way
        by every implementation (the maps are bit-identical whichever runs). See the module
        docstring for the formula and the exactness bounds. `ncc_direct` computes the same
        maps directly. The chosen implementation is bound per image geometry: later calls with
        the same shape, dtype and strides go straight to it.

        Examples
        --------
        >>> import numpy as np
        >>> img = np.random.default_rng(2).integers(-128, 128, (20, 64), dtype=np.int8)
        >>> bank = TemplateBank(np.stack([img[3:9, 5:12], img[10:16, 40:47]]))
        >>> maps = bank.ncc(img)
        >>> maps.shape, [tuple(int(v) for v in np.unravel_index(m.argmax(), m.shape)) for m in maps]
        ((2, 15, 58), [(3, 5), (10, 40)])
        """
        bound = self._bound.get(_signature(image))
        if bound is not None:   # seen before: validated, implementation chosen, launch packed
            return bound(image)
        xp = _validate(image, self)
        impls = {"im2col_int_matmul": self._ncc_engine}
        if xp is not np and _bank_reason(image, self) is None:
            impls["bank_dp4a"] = self._ncc_bank_dp4a
        if xp is not np:
            for variant in MMA_VARIANTS:
                if _mma_reason(image, self, variant) is None:
                    impls[variant] = lambda img, v=variant: self._ncc_bank_mma(img, v)
        name = "im2col_int_matmul"
        if len(impls) > 1:
            gpu = xp is not np
            tuner = current_engine().tuner
            key = ("ncc", tuner.stamp(gpu, image.device.id if gpu else None), image.dtype.name,
                   *(int(v).bit_length() for v in (*image.shape, self.n, self.th, self.tw)))
            name, _ = tuner.choose(key, {k: (lambda f=f: f(image)) for k, f in impls.items()},
                                   gpu, _agree)
        bound = impls[name]
        if name in MMA_VARIANTS and image.strides[1] == 1:
            bound = self._bind_mma(image, name)
            self._live.add(f"mma-{name}")
        if len(self._bound) < 64:
            self._bound[_signature(image)] = bound
        return bound(image)

    def _bind_mma(self, image: Any, variant: str = "bank_mma") -> Any:
        """The tensor-core kernel for images of this geometry with its launch packed once:
        a call allocates the maps and launches, nothing else."""
        xp = self.xp
        launch = self._mma_launch(image, None, variant)
        shape = (self.n, image.shape[0] - self.th + 1, image.shape[1] - self.tw + 1)

        def run(img: Any) -> Any:
            out = xp.empty(shape, dtype=np.float32)
            launch(xp.cuda.get_current_stream().ptr, img.data.ptr, out.data.ptr)
            return out

        return run

    def subset(self, start: int, stop: int) -> "TemplateBank":
        """Templates ``start:stop`` as a bank of their own."""
        return TemplateBank(self.templates[start:stop])

    def peaks(self, image: Any, threshold: float, min_distance: int = 1) -> np.ndarray:
        """`ncc_peaks` with this bank."""
        return ncc_peaks(image, self, threshold, min_distance)

    def _ncc_engine(self, image: Any) -> Any:
        """im2col blocks through the integer product engine, integral-image window sums."""
        xp = self.xp
        s_i, s_ii = _box_sums(xp, image, self.th, self.tw)
        s_it = _numerator_sums(xp, image, self.matrix, self.th, self.tw)
        return _normalize(xp, s_it, s_i, s_ii, self.th * self.tw, *self.sums, self.dtype)

    def _dp4a_bank(self) -> tuple:
        """(bank words [N, th, twq] int32, centred S_T, float32 rsqrt(var_T) or 0)."""
        xp, n, th, tw = self.xp, self.n, self.th, self.tw
        K = th * tw
        center = self.dtype == np.uint8
        t = self.templates.astype(np.int16) - (128 if center else 0)     # centred, -128..127
        twq = -(-tw // 4)
        packed = xp.zeros((n, th, twq * 4), dtype=np.int8)
        packed[:, :, :tw] = t.astype(np.int8)
        t64 = t.reshape(n, K).astype(np.int64)
        t_sum = t64.sum(axis=1)
        var_t = K * (t64 * t64).sum(axis=1) - t_sum * t_sum
        vt = xp.maximum(var_t, 1).astype(np.float32)  # float32: no float64 in device code
        t_rs = xp.where(var_t > 0, 1 / xp.sqrt(vt), 0).astype(np.float32)
        return packed.view(np.int32), t_sum, t_rs

    def _mma_bank(self, variant: str = "bank_mma") -> tuple:
        """(plan, bank in fragment order, centred S_T, float32 1/sqrt(var_T) or 0), packed on
        the device by one launch of ``ncc_mma_pack``."""
        xp = self.xp
        plan = _mma_plan(self.n, self.th, self.tw, xp.cuda.runtime.getDevice(), variant)
        tmpl = xp.ascontiguousarray(self.templates).view(np.uint8)
        tiles = plan["grid_z"] * plan["tiles_z"]
        packed = xp.empty(tiles * (plan["KC"] // 4) * 32 * 2, dtype=np.int32)
        t_sum = xp.empty(self.n, dtype=np.int64)
        t_rs = xp.empty(self.n, dtype=np.float32)
        pack = FastLaunch(kernel("ncc.cu", _pack_expression(self.dtype == np.uint8)), (tiles * 8,),
                          (PACK_THREADS,),
                          [("u64", tmpl), ("i32", self.n), ("i32", self.th), ("i32", self.tw),
                           ("i32", plan["cpr"]), ("i32", plan["KC"]), ("u64", packed),
                           ("u64", t_sum), ("u64", t_rs)])
        pack(xp.cuda.get_current_stream().ptr)
        self._repack[f"mma-{variant}"] = pack
        return plan, packed, t_sum, t_rs

    def _mma_launch(self, image: Any, peaks: tuple | None,
                    variant: str = "bank_mma") -> FastLaunch:
        """The tensor-core kernel's launch for images of ``image``'s geometry (rows
        contiguous), its parameters packed (`FastLaunch`). Call-time addresses: the image and
        the maps; with ``peaks`` = (threshold, capacity), the image, the candidate count, keys
        and scores instead (the candidate-list mode)."""
        th, tw = self.th, self.tw
        H, W = image.shape
        ho, wo = H - th + 1, W - tw + 1
        plan, bank, t_sum, t_rs = self._get(f"mma-{variant}", lambda: self._mma_bank(variant))
        fn = kernel("ncc.cu", _mma_expression(self.dtype == np.uint8, plan, peaks is not None))
        if fn.max_dynamic_shared_size_bytes < plan["smem"]:
            fn.max_dynamic_shared_size_bytes = plan["smem"]
        dyn, nil = ("ptr", None), ("u64", 0)
        threshold, capacity = peaks or (0.0, 0)
        maps_args = [nil, dyn, dyn, dyn] if peaks is not None else [dyn, nil, nil, nil]
        args = [dyn, ("i64", image.strides[0]), ("i32", H), ("i32", W), ("u64", bank),
                ("i32", th), ("i32", tw), ("i32", plan["cpr"]), ("i32", plan["KC"]),
                ("i32", self.n), ("i32", plan["tiles_z"]), ("u64", t_sum), ("u64", t_rs),
                ("i32", plan["Cs"]), ("i32", plan["R"]), maps_args[0], ("i32", ho), ("i32", wo),
                ("f32", threshold), maps_args[1], ("i32", capacity), maps_args[2], maps_args[3]]
        return FastLaunch(fn, (-(-wo // MMA_BX), -(-ho // plan["BY"]), plan["grid_z"]),
                          (MMA_THREADS,), args, shared_mem=plan["smem"])

    def _rows_contiguous(self, image: Any) -> Any:
        return image if image.strides[1] == 1 else self.xp.ascontiguousarray(image)

    def _ncc_bank_mma(self, image: Any, variant: str = "bank_mma") -> Any:
        """The fused tensor-core kernel of dspk/kernels/ncc.cu (implicit im2col, mma.sync)."""
        image = self._rows_contiguous(image)
        return self._bind_mma(image, variant)(image)

    def _peaks_mma(self, image: Any, threshold: float, d: int) -> np.ndarray | None:
        """Peaks without maps: the tensor-core kernel lists every score >= threshold, and the
        candidates that no listed neighbour exceeds are appended to a short list — through a
        hash table of the candidates for neighbourhoods up to PEAK_HASH_MAX_D (no sort, no
        host wait before the end), by sorting them and binary searches beyond. None when the
        candidates would exceed PEAK_CANDIDATES_BYTES (a threshold so low that most positions
        pass: the caller falls back to maps). Launches are packed once per image geometry,
        threshold and list capacity."""
        xp = self.xp
        image = self._rows_contiguous(image)
        ho, wo = image.shape[0] - self.th + 1, image.shape[1] - self.tw + 1
        stream = xp.cuda.get_current_stream().ptr
        memset = xp.cuda.runtime.memsetAsync
        while True:
            capacity = self._cache.get("peak_capacity", 1 << 20)
            hashed = d <= PEAK_HASH_MAX_D and capacity <= PEAK_HASH_MAX_CANDIDATES
            count = xp.empty(2, dtype=np.uint32)          # candidates, peaks
            memset(count.data.ptr, 0, 8, stream)
            keys = xp.empty(capacity, dtype=np.int64)
            scores = xp.empty(capacity, dtype=np.float32)
            peak_key = xp.empty(capacity, dtype=np.int64)
            peak_score = xp.empty(capacity, dtype=np.float32)
            launches = self._peak_launches(image, threshold, capacity, d if hashed else None)
            launches[0](stream, image.data.ptr, count.data.ptr, keys.data.ptr, scores.data.ptr)
            if hashed:
                size = launches[3]
                table_key = xp.empty(size, dtype=np.uint64)
                table_score = xp.empty(size, dtype=np.float32)
                memset(table_key.data.ptr, 0xFF, 8 * size, stream)
                launches[1](stream, keys.data.ptr, scores.data.ptr, count.data.ptr,
                            table_key.data.ptr, table_score.data.ptr)
                launches[2](stream, keys.data.ptr, scores.data.ptr, count.data.ptr,
                            table_key.data.ptr, table_score.data.ptr, peak_key.data.ptr,
                            peak_score.data.ptr)
            found, m = (int(v) for v in count.get())
            if found <= capacity:
                break
            if found * 12 > PEAK_CANDIDATES_BYTES or found >= 2**31:
                return None
            self._cache["peak_capacity"] = found     # once more, with room for all of them
        if not hashed and found:
            keys, scores = keys[:found], scores[:found]
            order = xp.argsort(keys)
            keys, scores = keys[order], scores[order]
            fn = kernel("ncc.cu", PEAK_KERNELS[0])
            fn((-(-found // 256),), (256,), (keys, scores, np.int32(found), np.int32(ho),
                                             np.int32(wo), np.int32(d), count[1:],
                                             peak_key, peak_score))
            m = int(count[1:].get()[0])
        # the list sorted (appended in any order) and split into (template, y, x): on the
        # host when short (a few launches and copies cost more), on the device when long (a
        # host sort of ~10^5 keys costs milliseconds)
        plane = ho * wo
        peaks = np.empty(m, dtype=PEAK_DTYPE)
        if m <= PEAK_HOST_SORT_MAX:
            k, sc = peak_key[:m].get(), peak_score[:m].get()
            order = np.argsort(k)
            k, sc = k[order], sc[order]
            peaks["template_index"], rem = np.divmod(k, plane)
            peaks["y"], peaks["x"] = np.divmod(rem, wo)
            peaks["score"] = sc
            return peaks
        k, sc = peak_key[:m], peak_score[:m]
        order = xp.argsort(k)
        k, sc = k[order], sc[order]
        rem = k % plane
        peaks["template_index"] = (k // plane).get()
        peaks["y"] = (rem // wo).get()
        peaks["x"] = (rem % wo).get()
        peaks["score"] = sc.get()
        return peaks

    def _peak_launches(self, image: Any, threshold: float, capacity: int,
                       d: int | None) -> tuple:
        """(candidate kernel, hash insert, hash check, table size) packed for this geometry,
        threshold and capacity (the last three None without ``d``: the sorting path)."""
        lkey = ("peaks", _signature(image), threshold, capacity, d)
        hit = self._bound.get(lkey)
        if hit is not None:
            return hit
        cand = self._mma_launch(image, (threshold, capacity), PEAK_VARIANT)
        self._live.add("mma-bank_mma")
        insert = check = size = None
        if d is not None:
            ho, wo = image.shape[0] - self.th + 1, image.shape[1] - self.tw + 1
            size = 1 << max(4, (2 * capacity - 1).bit_length())   # >= 2x: short probes
            grid = (-(-capacity // 256),)
            dyn = ("ptr", None)
            insert = FastLaunch(kernel("ncc.cu", PEAK_KERNELS[1]), grid, (256,),
                                [dyn, dyn, dyn, ("i32", capacity), dyn, dyn,
                                 ("u64", size - 1)])
            check = FastLaunch(kernel("ncc.cu", PEAK_KERNELS[2]), grid, (256,),
                               [dyn, dyn, dyn, ("i32", capacity), dyn, dyn, ("u64", size - 1),
                                ("i32", ho), ("i32", wo), ("i32", d), dyn, dyn])
        hit = (cand, insert, check, size)
        if len(self._bound) < 64:
            self._bound[lkey] = hit
        return hit

    def _ncc_bank_dp4a(self, image: Any) -> Any:
        """The fused kernel of dspk/kernels/ncc.cu: patch and bank in shared memory, __dp4a."""
        xp, n, th, tw = self.xp, self.n, self.th, self.tw
        H, W = image.shape
        ho, wo = H - th + 1, W - tw + 1
        bank, t_sum, t_rs = self._get("dp4a", self._dp4a_bank)
        img = image if image.strides[1] == 1 else xp.ascontiguousarray(image)
        img8 = img.view(np.uint8)
        out = xp.empty((n, ho, wo), dtype=np.float32)
        tg = DP4A_GROUPS[1] if n >= DP4A_GROUPS[1] else DP4A_GROUPS[0]
        fn = kernel("ncc.cu", _dp4a_expression(self.dtype == np.uint8, tg))
        twq = bank.shape[2]
        fn((-(-wo // NCC_TX), -(-ho // NCC_TY)), (NCC_TX, NCC_TY),
           (img8, np.int64(img8.strides[0]), np.int32(H), np.int32(W), bank, np.int32(n),
            np.int32(th), np.int32(tw), np.int32(twq), t_sum, t_rs, out, np.int32(ho),
            np.int32(wo)),
           shared_mem=_bank_smem(n, th, tw))
        return out


def ncc(image: Any, templates: Any) -> Any:
    """Normalized cross-correlation maps of a template bank (TM_CCOEFF_NORMED): the maps of
    ``TemplateBank(templates).ncc(image)`` (see there). ``templates`` may be a
    `TemplateBank`, prepared once for many images.

    Parameters
    ----------
    image : numpy.ndarray or cupy.ndarray
        [H, W] uint8, int8 or int16 (a 1-row image: a 1-D signal search).
    templates : array or TemplateBank
        [N, th, tw] (or one [th, tw]) of the image's dtype and array type.

    Returns
    -------
    array
        float32 [N, H − th + 1, W − tw + 1] coefficients in [−1, 1] (see `TemplateBank.ncc`).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.match import ncc
    >>> img = np.random.default_rng(0).integers(0, 256, (40, 50), dtype=np.uint8)
    >>> maps = ncc(img, img[None, 10:18, 20:30])
    >>> maps.shape, float(maps[0, 10, 20]) > 0.999
    ((1, 33, 41), True)

    A 1-row image is a signal:

    >>> sig = np.random.default_rng(1).integers(-100, 100, (1, 200), dtype=np.int16)
    >>> m = ncc(sig, sig[:, 50:70])
    >>> m.shape, int(m[0, 0].argmax())
    ((1, 1, 181), 50)
    """
    return _with_bank(templates, lambda bank: bank.ncc(image))


def _signature(image: Any) -> tuple:
    device = getattr(image, "device", None)
    return (type(image), getattr(image, "shape", None), getattr(image, "dtype", None),
            getattr(image, "strides", None), getattr(device, "id", None))


def _with_bank(templates: Any, work: Any) -> Any:
    """``work(bank)`` with the prepared bank of ``templates``: the caller's `TemplateBank`;
    on the GPU, the bank kept for this shape, dtype, device and stream with these templates
    loaded into it (`_OneShotBanks`); on the CPU, the one kept for these templates' content
    (a one-shot `ncc` in a loop does not prepare the bank every call)."""
    if isinstance(templates, TemplateBank):
        return work(templates)
    if is_cupy_array(templates) and templates.ndim in (2, 3) and templates.size and \
            templates.dtype in MATCH_DTYPES:
        return _one_shot_banks().run(templates, work)
    if isinstance(templates, np.ndarray):
        return work(_prepared_banks().get(templates))
    return work(TemplateBank(templates))


class _OneShotBanks:
    """One `TemplateBank` per (template shape, dtype, device, stream) for one-shot GPU calls,
    reloaded with the caller's templates on every call (`TemplateBank._reload`): the bank's
    buffers, plans and bound launches are reused, and nothing reads the templates back to the
    host. Per stream, because a reload overwrites the buffers the previous call's kernels read
    (stream order makes that safe; another stream could still be reading them). The bank's
    lock is held from the reload to the call's last launch: two threads on one stream do not
    interleave."""

    MAX_BANKS = 16

    def __init__(self) -> None:
        self._banks: dict = {}
        self._lock = threading.Lock()
        self.built = 0
        self._cp: Any = None

    def run(self, templates: Any, work: Any) -> Any:
        cp = self._cp
        if cp is None:
            import cupy as cp  # noqa: PLC0415 (CuPy input)

            self._cp = cp
        dev = templates.data.device_id
        if dev != cp.cuda.runtime.getDevice():
            with cp.cuda.Device(dev):
                return self.run(templates, work)
        stream = cp.cuda.get_current_stream().ptr
        # the per-thread default stream has one handle (cudaStreamPerThread) for a different
        # stream in every thread
        key = (templates.shape, templates.strides, templates.dtype.char, dev, stream,
               threading.get_ident() if stream == _PER_THREAD_STREAM else None)
        entry = self._banks.get(key)
        fresh = entry is None
        if fresh:
            entry = (TemplateBank(templates), threading.Lock())
            with self._lock:
                if len(self._banks) >= self.MAX_BANKS:
                    self._banks.pop(next(iter(self._banks)))
                self.built += 1
                got = self._banks.setdefault(key, entry)
            fresh = got is entry
            entry = got
        bank, lock = entry
        with lock:
            if not fresh:
                bank._reload(templates, stream)
            return work(bank)

    def clear(self) -> None:
        with self._lock:
            self._banks.clear()

    def __len__(self) -> int:
        return len(self._banks)


def _prepared_banks() -> PreparedCache:
    """The engine's TemplateBanks of the NumPy template arrays ncc and ncc_peaks were called
    with lately."""
    return current_engine().prepared("ncc_banks", lambda: PreparedCache(TemplateBank))


def _one_shot_banks() -> _OneShotBanks:
    """The engine's reloadable banks of one-shot GPU calls."""
    return current_engine().prepared("ncc_one_shot_banks", _OneShotBanks)
#: the bank caches computed from the templates' values (dropped by a reload)
_CONTENT_CACHES = ("sums", "matrix", "dp4a")
_DEVICE_TO_DEVICE = 3   # cudaMemcpyDeviceToDevice
_PER_THREAD_STREAM = 2  # cudaStreamPerThread


def _agree(got: Any, ref: Any) -> str | None:
    # (on the host: CuPy's reduction kernels would be compiled in a first call)
    worst = float(np.abs(to_host(got) - to_host(ref)).max()) if got.size else 0.0
    return None if worst <= 2e-6 else f"coefficients differ from the reference by {worst:.2e}"


def _patch_bytes(th: int, tw: int) -> int:
    """The image patch of the fused kernels (their own layout): NCC_TY + th - 1 rows of
    NCC_TX + 4*twq + 8 bytes."""
    return (NCC_TY + th - 1) * (NCC_TX + 4 * -(-tw // 4) + 8)


def _bank_smem(n: int, th: int, tw: int) -> int:
    """Dynamic shared memory of the dp4a bank kernel: bank words [n][th][twq], then the patch."""
    return n * th * -(-tw // 4) * 4 + _patch_bytes(th, tw)


def _mma_plan(n: int, th: int, tw: int, device_id: int, variant: str = "bank_mma") -> dict:
    """Geometry of the tensor-core kernel (see dspk/kernels/ncc.cu): chunks of 8 template bytes
    per row (cpr) and per template (KC, a multiple of 4 = one mma K step each), the shifted
    copies' strides (Cs, R), n-tiles of 8 templates per group (NT) and per grid-z slice
    (tiles_z: as many as fit the shared-memory budget of ``variant``'s blocks per SM), and
    the dynamic shared memory."""
    cpr = -(-tw // 8)
    twp = 8 * cpr
    kc = -(-(th * cpr) // 4) * 4
    cs = (56 + twp - 32 + 63) // 64 * 64 + 32          # >= 56 + twp and = 32 (mod 64)
    r = 8 * cs + (8 * cpr) % 32
    _, minb, by = MMA_VARIANTS[variant]
    ph = by + th - 1
    fixed = kc * 4 + ph * r + max(ph * (64 + twp + 8), ph * MMA_BX * 8)
    per_tile = kc // 4 * 32 * 8 + 8 * (8 + 4)          # fragments, S_T, 1/sqrt(var_T)
    wide = th * tw > 362                                # int32 epilogue exact up to K = 362
    ntiles = -(-n // 8)
    nt = _mma_nt(ntiles, wide, variant)
    props = device_properties(device_id)
    optin = int(props.get("sharedMemPerBlockOptin", _SMEM))
    per_sm = int(props.get("sharedMemPerMultiprocessor", 228 * 1024))
    budget = min(optin, MMA_SMEM_BUDGET, per_sm // minb - 1024)
    fit = (budget - fixed) // per_tile // nt * nt if budget > fixed else 0
    need = -(-ntiles // nt) * nt
    tiles_z = min(fit, need)
    grid_z = -(-need // tiles_z) if tiles_z > 0 else 0
    return dict(cpr=cpr, KC=kc, Cs=cs, R=r, NT=nt, minb=minb, BY=by, wide=wide, tiles_z=tiles_z,
                grid_z=grid_z,
                smem=fixed + tiles_z * per_tile, fixed=fixed, per_tile=per_tile, budget=budget)


def _fused_reason(image: Any, bank: TemplateBank, mma: bool,
                  variant: str = "bank_mma") -> str | None:
    """Why a fused bank kernel (dp4a, or tensor-core ``mma``) cannot run these inputs."""
    which = "tensor-core" if mma else "dp4a"
    if image.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        return f"the {which} bank kernel takes 8-bit images"
    if mma:
        if _cc(device_properties(image.device.id)) < MMA_MIN_CC:
            return "mma.sync m16n8k32 on int8 needs compute capability 8.0"
    if bank.th * bank.tw > 131071:
        return "template of more than 131071 pixels (int32 sums)"
    if mma:
        plan = _mma_plan(bank.n, bank.th, bank.tw, image.device.id, variant)
        if plan["tiles_z"] == 0:
            return (f"image patch copies and one group of templates need "
                    f"{plan['fixed'] + plan['NT'] * plan['per_tile']} bytes of shared memory "
                    f"(budget {plan['budget']})")
    elif _bank_smem(bank.n, bank.th, bank.tw) > _SMEM:
        return "bank and image patch exceed 48 KiB of shared memory"
    return None


def _bank_reason(image: Any, bank: TemplateBank) -> str | None:
    return _fused_reason(image, bank, mma=False)


def _mma_reason(image: Any, bank: TemplateBank, variant: str = "bank_mma") -> str | None:
    return _fused_reason(image, bank, mma=True, variant=variant)


def ncc_direct(image: Any, templates: Any) -> Any:
    """The same maps as `ncc`, computed directly: S_IT accumulated over template offsets in
    int64 (no product engine). The tests' reference; O(N·K·positions) work.

    Parameters
    ----------
    image, templates :
        As for `ncc`.

    Returns
    -------
    array
        The maps of `ncc`, bit for bit (the same exact sums, the same final ratio).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.match import ncc, ncc_direct
    >>> img = np.random.default_rng(0).integers(0, 256, (40, 50), dtype=np.uint8)
    >>> t = np.stack([img[10:18, 20:30], img[25:33, 5:15]])
    >>> bool(np.array_equal(ncc_direct(img, t), ncc(img, t)))
    True
    """
    bank = templates if isinstance(templates, TemplateBank) else TemplateBank(templates)
    xp = _validate(image, bank)
    n, th, tw = bank.n, bank.th, bank.tw
    H, W = image.shape
    ho, wo = H - th + 1, W - tw + 1
    img = image.astype(np.int64)
    t64 = bank.templates.astype(np.int64)
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
    return _normalize(xp, s_it, s_i, s_ii, th * tw, *bank.sums, bank.dtype)


def ncc_peaks(image: Any, templates: Any, threshold: float, min_distance: int = 1,
              maps: Any = None) -> np.ndarray:
    """Local maxima of the `ncc` maps at or above ``threshold``.

    A position is a peak of template n when its score is >= ``threshold`` and equals the
    maximum of that template's map over the (2·min_distance + 1)² square around it (positions
    outside the map do not count). Plateaus give one peak per position of the plateau.

    On the GPU with 8-bit images, the maps are never written: the tensor-core kernel lists
    every score at or above the threshold, and a second kernel keeps those that no listed
    neighbour exceeds (a neighbour not listed scores below the threshold). A threshold so low
    that the list would exceed ``PEAK_CANDIDATES_BYTES`` falls back to maps, computed a group
    of templates at a time (``PEAK_MAPS_BYTES``), as on the CPU. The peaks are the same either
    way.

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

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.match import ncc_peaks
    >>> img = np.random.default_rng(0).integers(0, 256, (40, 50), dtype=np.uint8)
    >>> t = np.stack([img[10:18, 20:30], img[25:33, 5:15]])   # cut from the image
    >>> peaks = ncc_peaks(img, t, threshold=0.9)
    >>> peaks[["template_index", "y", "x"]].tolist()
    [(0, 10, 20), (1, 25, 5)]
    >>> np.round(peaks["score"], 3)
    array([1., 1.], dtype=float32)
    """
    if not -1.0 <= float(threshold) <= 1.0:
        raise ValueError(f"threshold: expected a score in [-1, 1], got {threshold}")
    if int(min_distance) < 1:
        raise ValueError(f"min_distance: expected an integer >= 1, got {min_distance}")
    return _with_bank(templates, lambda bank: _peaks(image, bank, float(threshold),
                                                     int(min_distance), maps))


def _peaks(image: Any, bank: TemplateBank, threshold: float, min_distance: int,
           maps: Any) -> np.ndarray:
    xp = _validate(image, bank)
    size = 2 * min_distance + 1
    if maps is not None:
        return _peaks_of(xp, maps, 0, threshold, size)
    # The bank in groups whose maps fit PEAK_MAPS_BYTES: the full maps of a large bank never
    # exist at once (4096² x 128 templates would be 8.6 GB of float32).
    if xp is not np and _mma_reason(image, bank) is None:
        found = bank._peaks_mma(image, threshold, min_distance)
        if found is not None:
            return found
    ho, wo = image.shape[0] - bank.th + 1, image.shape[1] - bank.tw + 1
    group = max(1, PEAK_MAPS_BYTES // max(1, 4 * ho * wo))
    parts = []
    for n0 in range(0, bank.n, group):
        sub = bank if group >= bank.n else bank.subset(n0, min(bank.n, n0 + group))
        parts.append(_peaks_of(xp, sub.ncc(image), n0, threshold, size))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _peaks_of(xp: Any, maps: Any, first: int, threshold: float, size: int) -> np.ndarray:
    if xp is np:
        from scipy.ndimage import maximum_filter  # noqa: PLC0415 (slow import: when used)
    else:
        from cupyx.scipy.ndimage import maximum_filter  # noqa: PLC0415 (CuPy input)
    local = maximum_filter(maps, size=(1, size, size), mode="constant", cval=-np.inf)
    keep = (maps >= np.float32(threshold)) & (maps == local)
    t, y, x = (v.get() if hasattr(v, "get") else v for v in xp.nonzero(keep))
    scores = maps[keep]
    scores = scores.get() if hasattr(scores, "get") else scores
    peaks = np.empty(len(t), dtype=PEAK_DTYPE)
    peaks["template_index"], peaks["y"], peaks["x"], peaks["score"] = t + first, y, x, scores
    return peaks
