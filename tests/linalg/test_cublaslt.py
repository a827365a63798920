"""cuBLASLt candidates: the column-major geometry (checked on the CPU by emulating the
column-major GEMM on the operands' memory) and every ranked algorithm against float64 on the
GPU, for each layout of a, b and out, batched, strided and X·Xᵀ."""

import importlib
import itertools

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from dspk.linalg.cublaslt import OP_N, gemm_geometry

engine = importlib.import_module("dspk.linalg.matmul")


def _operand(rng, rows, cols, layout, dtype=np.float64, pad=3):
    """A [rows, cols] matrix stored row- or column-major with padded leading dimension."""
    if layout == "R":
        base = rng.standard_normal((rows, cols + pad)).astype(dtype)
        return base[:, :cols]
    base = rng.standard_normal((cols, rows + pad)).astype(dtype)
    return base[:, :rows].T


def _column_major(view, rows, cols, ld):
    """The column-major [rows, cols] matrix with leading dimension ld at the view's address."""
    item = view.itemsize
    assert view.buffer.flags.c_contiguous          # the view's owner
    flat = view.buffer.reshape(-1)
    start = (view.ptr - view.buffer.ctypes.data) // item
    return as_strided(flat[start:], shape=(rows, cols), strides=(item, ld * item))


@pytest.mark.parametrize("la,lb,lo", list(itertools.product("RC", repeat=3)))
def test_the_column_major_geometry_computes_a_times_b(la, lb, lo):
    rng = np.random.default_rng(0)
    M, K, N = 5, 7, 4
    a, b = _operand(rng, M, K, la), _operand(rng, K, N, lb)       # padded leading dimensions
    out = np.zeros((M, N)) if lo == "R" else np.zeros((N, M)).T
    p, _ = engine.as_problem(a, b, out)
    g = gemm_geometry(p.a, p.b, p.out)
    first, second = (p.b, p.a) if g.swap else (p.a, p.b)
    r1, c1 = (g.m, g.k) if g.op1 == OP_N else (g.k, g.m)
    r2, c2 = (g.k, g.n) if g.op2 == OP_N else (g.n, g.k)
    m1 = _column_major(first, r1, c1, g.ld1)
    m2 = _column_major(second, r2, c2, g.ld2)
    m1 = m1 if g.op1 == OP_N else m1.T
    m2 = m2 if g.op2 == OP_N else m2.T
    c = _column_major(p.out, g.m, g.n, g.ldc)
    c[...] = m1 @ m2
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("la,lb,lo", list(itertools.product("RC", repeat=3)))
def test_gpu_every_ranked_algorithm_matches_float64(dtype, la, lb, lo):
    import cupy as cp

    from dspk.linalg.candidates_lt import CublasLtGemm

    rng = np.random.default_rng(1)
    M, K, N = 37, 61, 203
    a = cp.asarray(np.ascontiguousarray(_operand(rng, M, K, la, dtype)))
    b = cp.asarray(np.ascontiguousarray(_operand(rng, K, N, lb, dtype)))
    a = a if la == "R" else cp.asfortranarray(a)
    b = b if lb == "R" else cp.asfortranarray(b)
    out = cp.empty((M, N), dtype) if lo == "R" else cp.empty((N, M), dtype).T
    p, _ = engine.as_problem(a, b, out)
    ref = a.get().astype(np.float64) @ b.get().astype(np.float64)
    ran = 0
    for rank in range(4):
        c = CublasLtGemm(rank)
        if c.unavailable(p) is not None:
            continue
        out[...] = cp.nan
        c.run(p)
        got = out.get().astype(np.float64)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < (1e-5 if dtype == np.float32 else 1e-12), (rank, err)
        ran += 1
    assert ran >= 1


@pytest.mark.gpu
def test_gpu_batched_strided_and_gram():
    import cupy as cp

    from dspk.linalg.candidates_lt import CublasLtGemm

    rng = np.random.default_rng(2)
    cases = []
    a = cp.asarray(rng.standard_normal((3, 20, 33)).astype(np.float32))
    b = cp.asarray(rng.standard_normal((3, 33, 50)).astype(np.float32))
    cases.append((a, b, None))
    big = cp.asarray(rng.standard_normal((24, 500)).astype(np.float32))
    x = big[2:18, 7:450]                         # a strided view
    cases.append((x, x.T, None))                 # X·Xᵀ over the same memory
    w = cp.asarray(rng.standard_normal((16, 16)).astype(np.float32))
    cases.append((w, x, cp.empty((16, 443), np.float32)))
    for a, b, out in cases:
        p, result = engine.as_problem(a, b, out)
        ref = np.matmul(a.get().astype(np.float64), b.get().astype(np.float64))
        c = CublasLtGemm(0)
        assert c.unavailable(p) is None, c.unavailable(p)
        c.run(p)
        got = (result if out is None else out).get().astype(np.float64)
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.gpu
def test_gpu_broadcast_and_gathered_operands_are_declined():
    import cupy as cp

    from dspk.linalg.candidates_lt import CublasLtGemm

    w = cp.ones((1, 8, 8), np.float32)
    x = cp.ones((4, 8, 30), np.float32)
    p, _ = engine.as_problem(w, x, None)
    assert "broadcast" in CublasLtGemm(0).unavailable(p)
    y = cp.ones((8, 60), np.float32)[:, ::2]      # no unit stride
    p, _ = engine.as_problem(cp.ones((8, 8), np.float32), y, None)
    assert "unit stride" in CublasLtGemm(0).unavailable(p)
