"""Each CUDA kernel once, on small shapes, against float64: what compute-sanitizer (memcheck,
racecheck) runs over in scripts/gpu-check. Edge cases: sizes not multiples of the tiles,
strided and transposed views, batches with broadcasting, split-K remainders."""

import importlib

import numpy as np
import pytest

from dspk.linalg import MatrixView
from dspk.linalg.candidates_gpu import gpu_candidates

pytestmark = pytest.mark.gpu
engine = importlib.import_module("dspk.linalg.matmul")


def check_all(a, b, expect, out=None):
    import cupy as cp

    p, _ = engine.as_problem(a, b, out)
    ah = np.asarray(p.a.to_array().get(), np.float64)
    bh = np.asarray(p.b.to_array().get(), np.float64)
    ref = np.matmul(ah, bh)
    ran = set()
    for c in gpu_candidates():
        if c.unavailable(p) is not None:
            continue
        p.out.to_array()[...] = cp.nan
        c.run(p)
        got = p.out.to_array().get().astype(np.float64)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert np.isfinite(got).all() and err < 1e-5, (c.name, err)
        ran.add(c.name)
    assert expect <= ran, expect - ran


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_shapes_every_kernel(dtype):
    import cupy as cp

    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal((5, 3333)).astype(dtype) + 1)
    check_all(x, x.T, {"direct_gram_small", "direct_gram_tiled4", "cublas"})
    y = cp.asarray(rng.standard_normal((3, 2, 2100)).astype(dtype))
    check_all(y, cp.asarray(rng.standard_normal((2100, 7)).astype(dtype)),
              {"direct_gram_small", "direct_gram_tiled4"})
    z = cp.asarray(rng.standard_normal((70, 9000)).astype(dtype))
    check_all(z[:, ::2], z[:, ::2].T, {"cublas"})
    big = cp.asarray(rng.standard_normal((200, 3000)).astype(dtype))
    check_all(big, big.T, {"cublas_symblock64w2", "cublas"})
    w = cp.asarray(rng.standard_normal((6, 61)).astype(dtype))
    cl = cp.asarray(rng.standard_normal((61, 1000)).astype(dtype))
    check_all(w, cl, {"direct_wx1", "direct_wx2", "direct_wxv1k16", "direct_wxv2k16",
                      "direct_wxv1k4"})
    check_all(cl.T, w.T, {"direct_wx1"})
    # 16-byte rows but a ragged last column block, K not a multiple of 4, 3 row slices used
    x = cp.asarray(rng.standard_normal((7, 1004)).astype(dtype))[:, :1001]
    w = cp.asarray(rng.standard_normal((30, 7)).astype(dtype))
    out = MatrixView.of(cp.zeros((30, 1004), dtype)).cols(0, 1001)
    check_all(w, x, {"direct_wxv1k16", "direct_wxv2k16", "direct_wxv4k16", "direct_wxv4k4"},
              out=out)
    v = MatrixView.of(cp.asarray(rng.standard_normal((2, 40, 700)).astype(dtype))).cols(3, 603)
    check_all(v, MatrixView.of(cp.asarray(rng.standard_normal((600, 9)).astype(dtype))),
              {"direct_gram_tiled4", "cublas"})


#: the wx_tile variants registered in gpu_candidates()
WX_TILE = {"direct_wxtile32c2s4w16", "direct_wxtile64c2s4w16", "direct_wxtile32c2s4w12"}
#: the ones that also take M <= 8 (32 column vectors of lanes per warp row)
WX_TILE_NARROW = {"direct_wxtile64c2s4w16", "direct_wxtile128c1s6w16"}
#: the column-heavy one, for M <= 32 only (512 threads at 32 rows; 64 rows would need 1024)
WX_TILE_COLS = {"direct_wxtile128c1s6w16"}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_wx_tile_kernels(dtype):
    """wx_tile (a persistent, cp.async-pipelined register tile) on ragged shapes: a last column
    tile cut inside a 16-byte vector, M not a multiple of 8, K odd (a partial k-chunk, and K
    smaller than one chunk), several tiles per CTA (batches share the CTAs of a wave), a
    broadcast W, M <= 8, and the mirrored orientation X·W (via outᵀ = Wᵀ·Xᵀ)."""
    import cupy as cp

    rng = np.random.default_rng(3)

    def arr(*shape):
        return cp.asarray(rng.standard_normal(shape).astype(dtype))

    def padded_out(*shape):  # [..., n] with 16-byte rows: a column range of a wider array
        wide = -(-shape[-1] // 4) * 4
        return MatrixView.of(cp.zeros(shape[:-1] + (wide,), dtype)).cols(0, shape[-1])

    # M = 30 of a 32-row tile, K = 7 < one k-chunk, N = 1001: last vector holds one column
    x = arr(7, 1004)[:, :1001]
    check_all(arr(30, 7), x, WX_TILE | WX_TILE_COLS, out=padded_out(30, 1001))
    # 24 batches with one W: a CTA per batch loops over several tiles; K = 61 is 3 chunks of
    # 16 and one of 13 (float32, 64-row variant), N = 5001 ends mid-vector
    xb = MatrixView.of(arr(24, 61, 5004)).cols(0, 5001)
    check_all(arr(64, 61), xb, WX_TILE, out=padded_out(24, 64, 5001))
    # a W per batch, M = 47, K = 128 (two 64-element W rows of shared memory per k-chunk pair)
    xb = MatrixView.of(arr(3, 128, 2052)).cols(0, 2050)
    check_all(arr(3, 47, 128), xb, WX_TILE, out=padded_out(3, 47, 2050))
    # M = 6: only the variant whose warps span 32 column vectors takes an 8-row tile
    x = arr(61, 2004)[:, :2001]
    check_all(arr(6, 61), x, WX_TILE_NARROW, out=padded_out(6, 2001))
    # mirrored: (X·W)[2001, 17] = xᵀ·wᵀ with a column-major out, run as w·x into outᵀ
    out_t = MatrixView.of(cp.zeros((17, 2004), dtype)).cols(0, 2001).T
    check_all(x.T, arr(17, 61).T, WX_TILE | WX_TILE_COLS, out=out_t)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
def test_small_integer_products_on_tensor_cores(dtype):
    """Packing (padding, planes), the int8 GEMM and the int64 recombination, on small ragged
    shapes: what the sanitizer checks for intpack.cu."""
    import cupy as cp

    from dspk.linalg.candidates_int import Int8TensorCore

    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    a = rng.integers(info.min, int(info.max) + 1, (2, 7, 45), dtype=dtype)
    b = rng.integers(info.min, int(info.max) + 1, (45, 19), dtype=dtype)
    p, _ = engine.as_problem(cp.asarray(a), cp.asarray(b), None,
                           allowed=(np.dtype(dtype),), result_dtype=np.int64)
    Int8TensorCore().run(p)
    ref = a.astype(np.int64) @ b.astype(np.int64)
    assert np.array_equal(p.out.to_array().get(), ref)
    x = cp.asarray(a[0])
    p, _ = engine.as_problem(x, x.T, None, allowed=(np.dtype(dtype),), result_dtype=np.int64)
    Int8TensorCore().run(p)
    assert np.array_equal(p.out.to_array().get()[0], a[0].astype(np.int64) @ a[0].T)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
def test_integer_products_through_cublaslt_are_exact(dtype):
    """The cuBLASLt variants of the INT8 GEMM (each ranked algorithm that is offered) give the
    int64 product bit for bit, for X·Xᵀ with a K longer than one tile and for A·B."""
    import cupy as cp

    from dspk.linalg.candidates_int import INT8_LT_RANKS, Int8TensorCore

    info = np.iinfo(dtype)
    rng = np.random.default_rng(2)
    x = cp.asarray(rng.integers(info.min, int(info.max) + 1, (37, 3001), dtype=dtype))
    a = cp.asarray(rng.integers(info.min, int(info.max) + 1, (21, 517), dtype=dtype))
    b = cp.asarray(rng.integers(info.min, int(info.max) + 1, (517, 33), dtype=dtype))
    ran = 0
    for lhs, rhs in ((x, x.T), (a, b)):
        ref = lhs.get().astype(np.int64) @ rhs.get().astype(np.int64)
        for rank in range(INT8_LT_RANKS):
            c = Int8TensorCore(rank)
            p, _ = engine.as_problem(lhs, rhs, None, allowed=(np.dtype(dtype),),
                                   result_dtype=np.int64)
            if c.unavailable(p) is not None:
                continue
            p.out.to_array()[...] = -1
            c.run(p)
            assert np.array_equal(p.out.to_array().get()[0], ref), (c.name, lhs.shape)
            ran += 1
    assert ran >= 2


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_small_ncc_bank_kernel(dtype):
    """The fused NCC bank kernels (dp4a, mma) on a ragged image and bank (sanitizer target for
    ncc.cu)."""
    import cupy as cp

    from dspk.match import TemplateBank, ncc_direct

    info = np.iinfo(dtype)
    rng = np.random.default_rng(2)
    image = rng.integers(info.min, int(info.max) + 1, (45, 70), dtype=dtype)
    bank = rng.integers(info.min, int(info.max) + 1, (35, 7, 5), dtype=dtype)
    bank[0] = image[3:10, 8:13]
    tb = TemplateBank(cp.asarray(bank))
    ref = ncc_direct(cp.asarray(image), cp.asarray(bank)).get()
    for got in (tb._ncc_bank_dp4a(cp.asarray(image)).get(),
                tb._ncc_bank_mma(cp.asarray(image)).get()):
        assert np.max(np.abs(got - ref)) <= 2e-6 and got[0, 3, 8] > 0.99999
    peaks = tb._peaks_mma(cp.asarray(image), 0.5, 2)
    assert (0, 3, 8) in {(int(t), int(y), int(x)) for t, y, x, _ in peaks}


def test_small_trace_kernels():
    """The direct FIR kernel and the median reference on small ragged inputs (sanitizer target
    for traces.cu)."""
    import cupy as cp

    from dspk.ops._traces_gpu import car_median, fir_direct

    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 2100)).astype(np.float32)
    w = rng.standard_normal((2, 37))
    got = fir_direct(cp.asarray(x), w, 18).get()
    ref = np.stack([[np.correlate(np.pad(r.astype(np.float64), 18), f, "valid") for f in w]
                    for r in x])
    assert np.abs(got - ref).max() <= 1e-4
    y = rng.standard_normal((37, 70)).astype(np.float32)
    np.testing.assert_array_equal(car_median(cp.asarray(y)).get(), y - np.median(y, axis=0))


@pytest.mark.parametrize("variant", [(64, 4, 1), (128, 2, 1)])
def test_small_fused_int16_gram(variant):
    """The fused int16 X·Xᵀ kernel on ragged shapes (sanitizer target: cp.async stages, the
    epilogue's shared tile reused after the pipeline, the mirror writes)."""
    import cupy as cp

    from dspk.linalg.candidates_int import INT_DTYPES, Int16GramFused

    rng = np.random.default_rng(5)
    for m, k in [(3, 9), (65, 3001), (130, 200)]:
        x = cp.asarray(rng.integers(-32768, 32768, (m, k + (-k) % 8), dtype=np.int16))[:, :k]
        p, _ = engine.as_problem(x, x.T, None, allowed=INT_DTYPES, result_dtype=np.int64)
        c = Int16GramFused(*variant)
        assert c.unavailable(p) is None
        sums = cp.full(m, 7, dtype=np.int64)
        p.out.to_array()[...] = -1
        c.bind(p)(p.a.ptr, p.b.ptr, p.out.ptr, sums.data.ptr)
        xh = x.get().astype(np.int64)
        assert np.array_equal(p.out.to_array().get()[0], xh @ xh.T)
        assert np.array_equal(sums.get(), xh.sum(axis=1))
