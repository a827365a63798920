"""CPU candidates: NumPy's BLAS, BLAS syrk for X·Xᵀ, split-K with pairwise sums, and a direct
(einsum) loop for tiny shapes where BLAS dispatch costs more than the product.

Each computes on 3-D arrays ``a`` [B, M, K], ``b`` [B, K, N] into ``out`` [B, M, N]; `bind`
wraps that for the 2-D or 3-D arrays a caller passes to `matmul`.

BLAS runs on one thread and the candidates thread over blocks of their own that do not depend on
the thread count (`dspk.linalg.threads`): a product gives the same bits on 1 thread and on 16,
in a Dask worker and in the process that started it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..caches import shared
from .problem import Candidate, Problem, Runner
from .threads import gemm_batch, parallel_blocks, single_threaded_blas

#: A threaded product's output columns are cut into blocks that are a function of the shape alone,
#: so the blocks (and the bits) are the same whatever the thread count: a power of two of blocks
#: (they share evenly among 1, 2, 4, 8 or 16 threads), at most MAX_BLOCKS, each of at least
#: BLOCK_FLOP (PAIR_FLOP for two blocks) and of at least 8·K columns (between MIN_COLS / 4 and
#: MIN_COLS), as equal as multiples of COL_ALIGN columns allow. Each block packs W again (K·M
#: values) and costs a dispatch; measured on 2 cores with NumPy's OpenBLAS 0.3.31 (ms, ratio to
#: NumPy): one thread, 384 x 384 x 6000 in 2 / 4 blocks 1.027 / 1.050, 384 x 384 x 60 000 in 2 / 4 /
#: 8 / 16 blocks 1.004 / 1.013 / 1.020 / 1.029, 64 x 64 x 60 000 1.02-1.035 for 2-16; two threads,
#: 384 x 384 x 6000 in 2 / 4 blocks 1.02 / 1.06, 64 x 64 x 2000 in 2 / 4 blocks 1.04 / 1.22 (one
#: block: 1.5); OpenBLAS runs a batch in rounds of one member per thread, so many small members cost
#: a barrier each (32 x 64 x 60 000: 16 blocks 1.05, 4 blocks 0.94).
MAX_BLOCKS = 16
BLOCK_FLOP = 1 << 25
PAIR_FLOP = 1 << 22     # from here two blocks even when each is under BLOCK_FLOP
MIN_COLS = 2048
COL_ALIGN = 64


def column_block(a: np.ndarray, n: int) -> int:
    """The output columns per block of `blocked_matmul` for left operand ``a`` [..., M, K]
    and ``n`` output columns (``n`` or more: one block)."""
    m, k = a.shape[-2], a.shape[-1]
    min_cols = min(MIN_COLS, max(MIN_COLS // 4, 8 * k))
    flop = 2 * m * k * n
    blocks = min(MAX_BLOCKS, n // min_cols,
                 max(flop // BLOCK_FLOP, 2 if flop >= 2 * PAIR_FLOP else 1))
    if blocks < 2:
        return -(-max(n, 1) // COL_ALIGN) * COL_ALIGN
    blocks = 1 << (blocks.bit_length() - 1)          # a power of two
    return -(-n // (blocks * COL_ALIGN)) * COL_ALIGN


def _pairwise_sum(parts: list[np.ndarray]) -> np.ndarray:
    """Sum in a balanced binary tree: the error grows with log(len), not len."""
    while len(parts) > 1:
        nxt = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]


def _as3(x: np.ndarray) -> np.ndarray:
    return x if x.ndim == 3 else x[None]


class _CpuCandidate(Candidate):
    gpu = False
    #: whether the operands must be BLAS-ready (one unit stride) for `compute`
    needs_blas_layout = True

    def compute(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError  # pragma: no cover - interface

    def run(self, p: Problem) -> None:
        a, b = p.a, p.b
        if self.needs_blas_layout:
            a, b = (v if v.layout() != "S" else v.contiguous() for v in (a, b))
        self.compute(a.to_array(), b.to_array(), p.out.to_array())

    def bind(self, p: Problem) -> Runner | None:
        if self.needs_blas_layout and "S" in (p.a.layout(), p.b.layout()):
            return None
        compute = self.compute

        def run(a: Any, b: Any, out: Any) -> None:
            compute(_as3(a), _as3(b), _as3(out))

        return run


def _blas_operand(v: np.ndarray) -> tuple[int, int] | None:
    """(CBLAS transpose flag, leading dimension) of the 2-D matrices of ``v`` [..., R, C], or
    None when BLAS cannot read them in place."""
    it = v.itemsize
    r, c = v.shape[-2:]
    sr, sc = v.strides[-2:]
    if sc == it and sr % it == 0 and sr // it >= max(c, 1):
        return 111, sr // it                          # CblasNoTrans, row-major
    if sr == it and sc % it == 0 and sc // it >= max(r, 1):
        return 112, sc // it                          # CblasTrans
    return None


#: the process-wide store (`dspk.caches`) of the grouped ?gemm_batch calls' arrays, by operand
#: geometry (None where the operands do not suit one)
PLANS = "cpu_gemm_batch_plans"
#: plans kept before the store starts again
MAX_PLANS = 256
SMALL_MNK = 100 ** 3


def _plans() -> dict:
    return shared(PLANS, dict)


def _batch_plan(a: np.ndarray, b: np.ndarray, out: np.ndarray, cols: int) -> tuple | None:
    """Everything but the base addresses of one grouped ?gemm_batch call over the column
    blocks of every matrix of the batch (a group of full blocks, one of the narrower last ones),
    kept per geometry; None when the operands do not suit it."""
    key = (a.shape, a.strides, b.shape, b.strides, out.shape, out.strides, a.dtype, cols)
    plans = _plans()
    plan = plans.get(key)
    if plan is not None or key in plans:
        return plan
    nb, m, n = out.shape
    if a.shape[-1] != b.shape[-2] or (a.shape[-2], b.shape[-1]) != (m, n) \
            or {a.shape[0], b.shape[0]} - {1, nb} or a.dtype != b.dtype or a.dtype != out.dtype:
        raise ValueError(f"matmul: operands {a.shape} {a.dtype}, {b.shape} {b.dtype} do not "
                         f"give out {out.shape} {out.dtype}")   # BLAS would read past them
    found = gemm_batch(a.dtype)
    fa, fb = _blas_operand(a), _blas_operand(b)
    if found is None or fa is None or fb is None or out.strides[-1] != out.itemsize \
            or out.strides[-2] % out.itemsize or out.strides[-2] < out.shape[-1] * out.itemsize \
            or min(a.strides[0], b.strides[0], out.strides[0]) < 0:
        plans[key] = None
        return None
    fn, itype = found
    k = a.shape[-1]
    full, tail = divmod(n, cols)
    widths = [cols] * full + ([tail] if tail else [])
    if tail and full > 1 and m * k * tail <= 2 * SMALL_MNK:
        widths = [cols] * (full - 1) + [cols + tail]  # a narrow last block joins the one before
    if m * k * min(widths) <= SMALL_MNK:
        # OpenBLAS's batch runs members of M·N·K <= 100³ with its small-matrix kernels, whose
        # batched use crashed in 0.3.31 (seen with a 244-column last block)
        plans[key] = None
        return None
    starts = np.cumsum([0] + widths[:-1])
    groups = [(w, [j for j, v in enumerate(widths) if v == w]) for w in dict.fromkeys(widths)]
    # byte offsets of each member's a, b and out: group by group, then matrix by matrix
    mats = np.arange(nb)
    sa = a.strides[0] if a.shape[0] > 1 else 0
    sb = b.strides[0] if b.shape[0] > 1 else 0
    off_a, off_b, off_c = [], [], []
    for _, blocks in groups:
        col = starts[blocks][None, :]
        off_a.append(np.repeat(mats * sa, len(blocks)))
        off_b.append((mats[:, None] * sb + col * b.strides[-1]).ravel())
        off_c.append((mats[:, None] * out.strides[0] + col * out.strides[-1]).ravel())
    off_a, off_b, off_c = (np.concatenate(v) for v in (off_a, off_b, off_c))
    groups = [(nb * len(blocks), w) for w, blocks in groups]
    g = len(groups)
    ints = np.array([[m] * g, [c for _, c in groups], [k] * g, [fa[1]] * g, [fb[1]] * g,
                     [out.strides[-2] // out.itemsize] * g, [s for s, _ in groups]], dtype=itype)
    flags = np.array([[fa[0]] * g, [fb[0]] * g], dtype=np.int32)
    scal = np.array([[1.0] * g, [0.0] * g], dtype=a.dtype)
    offs = np.stack([off_a, off_b, off_c]).astype(np.uintp)
    plan = (fn, g, ints, flags, scal, offs)
    if len(plans) > MAX_PLANS:
        plans.clear()
    plans[key] = plan
    return plan


def blocked_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a @ b`` (2-D or batched), threaded over blocks of `column_block` output columns
    when there are at least two, each block summed on one thread.

    With NumPy's OpenBLAS >= 0.3.30 the blocks go to OpenBLAS in one grouped ?gemm_batch call:
    it computes each with its one-thread driver and shares whole blocks among its own threads
    (as many as BLAS was given), so the bits do not depend on the thread count and no thread of
    dspk competes with OpenBLAS's (which keep spinning ~0.1 s after a NumPy product). Otherwise
    BLAS is pinned to one thread and dspk threads over the blocks itself (`parallel_blocks`)."""
    n = out.shape[-1]
    cols = column_block(a, n)
    if n <= cols:
        with single_threaded_blas():
            np.matmul(a, b, out=out)
        return
    a3, b3, o3 = (v if v.ndim == 3 else v[None] for v in (a, b, out))
    plan = _batch_plan(a3, b3, o3, cols) if o3.shape[0] * -(-n // cols) < 1 << 20 else None
    if plan is not None:
        fn, g, ints, flags, scal, offs = plan
        # the members' addresses, made per call: the plan is shared by every thread that
        # multiplies this geometry at the same time
        ptrs = offs + np.array([a3.ctypes.data, b3.ctypes.data, o3.ctypes.data],
                               dtype=np.uintp)[:, None]
        f, i, s, p = flags.ctypes.data, ints.ctypes.data, scal.ctypes.data, ptrs.ctypes.data
        isz, fsz, psz, nmem = ints.itemsize * g, scal.itemsize * g, \
            ptrs.itemsize, ptrs.shape[1]
        fn(101, f, f + 4 * g, i, i + isz, i + 2 * isz, s,
           p, i + 3 * isz, p + psz * nmem, i + 4 * isz, s + fsz,
           p + 2 * psz * nmem, i + 5 * isz, g, i + 6 * isz)
        return

    def block(s: int) -> None:
        e = min(s + cols, n)
        np.matmul(a, b[..., s:e], out=out[..., s:e])

    parallel_blocks(block, range(0, n, cols))


class NumpyMatmul(_CpuCandidate):
    name = "numpy"
    summary = ("numpy.matmul (the installed BLAS, one thread per call, threaded over fixed "
               "column blocks), operands gathered only if BLAS cannot take them")

    def unavailable(self, p: Problem) -> str | None:
        return None

    def compute(self, a, b, out):
        blocked_matmul(a, b, out)

    def bind(self, p: Problem) -> Runner | None:
        if "S" in (p.a.layout(), p.b.layout()):
            return None
        return blocked_matmul  # 2-D or 3-D as given: no wrapper cost


class NumpySplitK(_CpuCandidate):
    def __init__(self, chunk: int):
        self.chunk = chunk
        self.name = f"numpy_splitk{chunk}"
        self.summary = f"numpy.matmul over K-chunks of {chunk}, summed pairwise"

    def unavailable(self, p: Problem) -> str | None:
        if p.k < 4 * self.chunk:
            return f"K={p.k} shorter than 4 chunks of {self.chunk}"
        return None

    def compute(self, a, b, out):
        c = self.chunk
        starts = range(0, a.shape[2], c)
        parts: list[Any] = [None] * len(starts)

        def part(i: int) -> None:
            k0 = starts[i]
            parts[i] = np.matmul(a[:, :, k0:k0 + c], b[:, k0:k0 + c, :])

        parallel_blocks(part, range(len(starts)))   # the chunks, not the threads, fix the sums
        out[...] = _pairwise_sum(parts)


class CpuSyrk(_CpuCandidate):
    name = "blas_syrk"
    summary = "BLAS ssyrk/dsyrk for X·Xᵀ (half the products), upper triangle mirrored"
    first_use_imports = ("scipy.linalg",)   # 0.2-0.4 s on 2 cores when nothing imported it

    def unavailable(self, p: Problem) -> str | None:
        if not p.symmetric:
            return "only for X·Xᵀ (b is not a.T)"
        return None

    def compute(self, a, b, out):
        from scipy.linalg import blas  # noqa: PLC0415 (scipy import is slow; only when used)

        syrk = blas.ssyrk if a.dtype == np.float32 else blas.dsyrk
        with single_threaded_blas():
            for i in range(a.shape[0]):
                # Fortran-ordered xᵀ (no copy for a C-ordered x): syrk(trans=1) gives x·xᵀ.
                c = syrk(1.0, a[i].T, trans=1, lower=0)
                out[i] = np.triu(c) + np.triu(c, 1).T


def _row_edges(m: int, blocks: int) -> list[int]:
    """Cuts of m rows into ``blocks`` row blocks, multiples of 8 rows but the last."""
    size = -(-m // (blocks * 8)) * 8
    return [min(i * size, m) for i in range(blocks)] + [m]


def _tiles_plan(a: np.ndarray, b: np.ndarray, out: np.ndarray, blocks: int) -> tuple:
    """(upper-triangle tiles (r0, r1, c0, c1), one grouped ?gemm_batch call's arrays or None)
    for out = a·b with b = aᵀ, kept per geometry: the members' byte offsets are relative to the
    three base addresses, added per call (the plan is shared between threads)."""
    key = ("sym", a.shape, a.strides, b.strides, out.shape, out.strides, a.dtype, blocks)
    plans = _plans()
    plan = plans.get(key)
    if plan is not None:
        return plan
    edges = _row_edges(out.shape[-2], blocks)
    tiles = [(edges[i], edges[i + 1], edges[j], edges[j + 1])
             for i in range(blocks) for j in range(i, blocks) if edges[i] < edges[i + 1]
             and edges[j] < edges[j + 1]]
    found = gemm_batch(a.dtype)
    fa, fb = _blas_operand(a), _blas_operand(b)
    k = a.shape[-1]
    batch = None
    if found is not None and fa is not None and fb is not None \
            and out.strides[-1] == out.itemsize and out.strides[-2] % out.itemsize == 0 \
            and min((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in tiles) * k > SMALL_MNK:
        # (OpenBLAS's small-matrix kernels crashed in a batch: members of M·N·K <= 100³ never
        # go to it)
        fn, itype = found
        shapes = list(dict.fromkeys((r1 - r0, c1 - c0) for r0, r1, c0, c1 in tiles))
        members = [[t for t in tiles if (t[1] - t[0], t[3] - t[2]) == sh] for sh in shapes]
        order = [t for group in members for t in group]
        off = np.array([[r0 * a.strides[-2] for r0, _, _, _ in order],
                        [c0 * b.strides[-1] for _, _, c0, _ in order],
                        [r0 * out.strides[-2] + c0 * out.strides[-1] for r0, _, c0, _ in order]],
                       dtype=np.uintp)
        g = len(shapes)
        ints = np.array([[mm for mm, _ in shapes], [nn for _, nn in shapes], [k] * g,
                         [fa[1]] * g, [fb[1]] * g, [out.strides[-2] // out.itemsize] * g,
                         [len(group) for group in members]], dtype=itype)
        flags = np.array([[fa[0]] * g, [fb[0]] * g], dtype=np.int32)
        scal = np.array([[1.0] * g, [0.0] * g], dtype=a.dtype)
        batch = (fn, g, ints, flags, scal, off)
    plan = (tiles, batch)
    if len(plans) > MAX_PLANS:
        plans.clear()
    plans[key] = plan
    return plan


def _mirror_upper(out: np.ndarray, tiles: list) -> None:
    """Copy each tile's transpose below the diagonal (the diagonal tiles' own upper halves
    too), so the result is symmetric to the bit."""
    for r0, r1, c0, c1 in tiles:
        if r0 == c0:
            t = out[r0:r1, r0:r1]
            low = np.tril_indices(r1 - r0, -1)
            t[low] = t.T[low]
        else:
            out[c0:c1, r0:r1] = out[r0:r1, c0:c1].T


class CpuSymBlocks(_CpuCandidate):
    """X·Xᵀ as the upper-triangle tiles of its rows cut into ``blocks`` blocks, each tile one
    single-threaded gemm, the lower triangle mirrored: (blocks + 1) / (2·blocks) of the full
    product's work, shared among BLAS's threads whole tiles at a time (one grouped ?gemm_batch
    where OpenBLAS has it, else dspk's pool), so the bits do not depend on the thread count.
    A 384 x 384 covariance has only 384 output columns: `NumpyMatmul`'s column blocks (>= 512
    columns each) leave it on one thread. Measured on 2 cores (OpenBLAS 0.3.31, float32, ms):
    384 x 6000 one thread 7.3, 2/3/4/6 blocks 7.4/5.7/5.8/6.8; 384 x 60 000 73.0 -> 71.5/59.5/
    67.0/82.6 — an even number of equal tiles (3 blocks: 6 tiles) shares best between two
    threads; NumPy's own two-thread syrk (whose bits depend on the thread count) 5.0 and 49.7."""

    def __init__(self, blocks: int):
        self.blocks = blocks
        self.name = f"numpy_symblock{blocks}"
        self.summary = (f"X·Xᵀ as the upper-triangle tiles of {blocks} row blocks, each one "
                        f"single-threaded gemm, tiles shared among BLAS's threads, mirrored")

    def unavailable(self, p: Problem) -> str | None:
        if not p.symmetric:
            return "only for X·Xᵀ (b is not a.T)"
        if p.m < 32 * self.blocks:
            return f"{p.m} rows: fewer than 32 per block of {self.blocks}"
        return None

    def compute(self, a, b, out):
        for i in range(out.shape[0]):
            self._one(a[i if a.shape[0] > 1 else 0], b[i if b.shape[0] > 1 else 0], out[i])

    def _one(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        tiles, batch = _tiles_plan(a, b, out, self.blocks)
        if batch is not None:
            fn, g, ints, flags, scal, offs = batch
            ptrs = offs + np.array([a.ctypes.data, b.ctypes.data, out.ctypes.data],
                                   dtype=np.uintp)[:, None]
            f, i, s, p = flags.ctypes.data, ints.ctypes.data, scal.ctypes.data, ptrs.ctypes.data
            isz, fsz, psz, nmem = ints.itemsize * g, scal.itemsize * g, \
                ptrs.itemsize, ptrs.shape[1]
            fn(101, f, f + 4 * g, i, i + isz, i + 2 * isz, s,
               p, i + 3 * isz, p + psz * nmem, i + 4 * isz, s + fsz,
               p + 2 * psz * nmem, i + 5 * isz, g, i + 6 * isz)
        else:
            def tile(t: tuple) -> None:
                r0, r1, c0, c1 = t
                np.matmul(a[r0:r1], b[:, c0:c1], out=out[r0:r1, c0:c1])

            parallel_blocks(tile, tiles)
        _mirror_upper(out, tiles)


class CpuDirect(_CpuCandidate):
    name = "direct_einsum"
    summary = "numpy.einsum loop without BLAS, for tiny products"
    needs_blas_layout = False

    def unavailable(self, p: Problem) -> str | None:
        if p.m * p.n * p.k > 4096:
            return f"M·N·K = {p.m * p.n * p.k} > 4096: BLAS is the better tool"
        return None

    def compute(self, a, b, out):
        np.einsum("bmk,bkn->bmn", a, b, out=out, optimize=False)


def cpu_candidates() -> list[Candidate]:
    """All CPU candidates, in the order used when tuning is off."""
    return [NumpyMatmul(), CpuSyrk(), CpuSymBlocks(3), CpuSymBlocks(4), NumpySplitK(4096),
            NumpySplitK(16384), CpuDirect()]
