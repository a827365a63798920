#!/usr/bin/env python3
"""Where the exact int16 covariance's time goes on the GPU: the public call and its parts
(int_matmul alone, the channel sums, the int64 combination), median of 20 back-to-back calls
(CUDA events) and the host time per call, for 384, 64 and 4 channels x 60 000 samples.

    python benchmarks/profiles/profile_int16cov.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

import cupy as cp  # noqa: E402

import dspk  # noqa: E402
from dspk.linalg import int_gram  # noqa: E402
from dspk.ops.covariance import _int_cov_gpu  # noqa: E402


def timed(fn, reps=20):
    fn()
    cp.cuda.Device().synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    t0 = time.perf_counter()
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / reps, 1e3 * (time.perf_counter() - t0) / reps


def _pieces(x):
    """The int8 tensor-core runner's three steps, each alone, with its own buffers: the
    packing of the two int8 planes (+ exact row sums), the split-K GEMM, the combine."""
    from cupy_backends.cuda.libs import cublas

    from dspk.linalg import candidates_int as ci
    from dspk.kernels import grid_1d, kernel

    c, k = x.shape
    mp = ci._pad16(c)
    splits, kc = ci._split_k(1, 2 * mp, 2 * mp, k, dspk.backend.device_properties(0))
    kp = splits * kc
    q = cp.empty(2 * mp * kp, dtype=np.int8)
    rs = cp.zeros(c, dtype=np.int64)
    c32 = cp.empty(splits * (2 * mp) ** 2, dtype=np.int32)
    out = cp.empty((c, c), dtype=np.int64)
    pack = kernel("intpack.cu", "pack_planes<short, false, true>")
    combine = kernel("intpack.cu", "combine_planes")
    handle = cp.cuda.device.get_cublas_handle()

    def do_pack():
        pack((-(-kp // 1024), mp), (256,), (x, np.int64(0), np.int64(k), np.int64(1),
                                            np.int32(1), np.int32(c), np.int32(k),
                                            np.int32(mp), np.int32(kp), q, rs))

    def do_gemm():
        cublas.gemmStridedBatchedEx(
            handle, ci.OP_T, ci.OP_N, 2 * mp, 2 * mp, kc, ci._ONE_I32.ctypes.data,
            q.data.ptr, ci.CUDA_R_8I, kp, kc, q.data.ptr, ci.CUDA_R_8I, kp, kc,
            ci._ZERO_I32.ctypes.data, c32.data.ptr, ci.CUDA_R_32I, 2 * mp, (2 * mp) ** 2,
            splits, ci.CUBLAS_COMPUTE_32I, ci.CUBLAS_GEMM_DEFAULT)

    def do_combine():
        combine(grid_1d(c * c), (256,),
                (c32, np.int32(splits), np.int32(2), np.int32(mp), np.int32(mp), np.int32(1),
                 np.int32(c), np.int32(c), out, np.int64(c * c), np.int64(c), np.int64(1),
                 rs, rs, np.int64(128 * 128 * k), np.int32(1)))

    def do_gemm3():   # the h·hᵀ, h·lᵀ, l·lᵀ blocks only, as two strided-batched calls (tried
        # for X·Xᵀ on 2026-12-03: 0.120 ms against 0.107 for all four blocks in one call)
        ld = 2 * mp
        for m, a_off, b_off, c_off in ((2 * mp, 0, 0, 0), (mp, mp * kp, mp * kp, mp * ld + mp)):
            cublas.gemmStridedBatchedEx(
                handle, ci.OP_T, ci.OP_N, m, mp, kc, ci._ONE_I32.ctypes.data,
                q.data.ptr + b_off, ci.CUDA_R_8I, kp, kc, q.data.ptr + a_off, ci.CUDA_R_8I, kp,
                kc, ci._ZERO_I32.ctypes.data, c32.data.ptr + 4 * c_off, ci.CUDA_R_32I, ld,
                ld * ld, splits, ci.CUBLAS_COMPUTE_32I, ci.CUBLAS_GEMM_DEFAULT)

    gop = 2 * (2 * mp) ** 2 * kp / 1e9
    parts = {"  pack (2 int8 planes + row sums)": do_pack,
             f"  GEMM alone ({splits} x [{2 * mp}x{2 * mp}x{kc}], {gop:.1f} GOP)": do_gemm,
             f"  GEMM of 3 of the 4 plane blocks ({0.75 * gop:.1f} GOP)": do_gemm3,
             f"  combine ({splits} partials)": do_combine}
    parts.update(_lt_gemms(q, c32, mp, kp, kc, splits, do_pack, do_gemm))
    parts.update(_lt_three_blocks(q, c32, mp, kp, do_pack))
    return parts


def _lt_three_blocks(q, c32, mp, kp, do_pack):
    """The symmetric product's 3 of 4 plane blocks through cuBLASLt, whole K: [h; l]·hᵀ
    (the hh and lh blocks, written where the full GEMM writes its first Mp columns) and l·lᵀ,
    each with the best of cuBLASLt's first 8 algorithms; checked against the full GEMM's
    blocks. Returns {name: call} for the pair when it agrees."""
    from dspk.linalg import cublaslt

    if cublaslt.available():
        return {}
    n = 2 * mp
    do_pack()
    full = cublaslt.LtMatmul(cublaslt.GemmGeometry(False, n, n, kp, cublaslt.OP_T,
                                                   cublaslt.OP_N, kp, kp, n),
                             1, kp, kp, n * n, 0, 0, np.int8)
    stream = cp.cuda.get_current_stream().ptr
    full(q.data.ptr, q.data.ptr, c32.data.ptr, stream)
    ref = c32[:n * n].reshape(n, n).copy()      # row-major view: [r][c] = q_r . q_c
    best = []
    for m, off_a, off_b, off_c in ((n, 0, 0, 0), (mp, mp * kp, mp * kp, mp + mp * n)):
        g = cublaslt.GemmGeometry(False, m, mp, kp, cublaslt.OP_T, cublaslt.OP_N, kp, kp, n)
        timings = []
        for rank in range(8):
            try:
                lt = cublaslt.LtMatmul(g, 1, kp, kp, n * n, rank, 0, np.int8)
            except RuntimeError:
                break
            if not lt.ok:
                break

            def run(lt=lt, oa=off_a, ob=off_b, oc=off_c):
                lt(q.data.ptr + oa, q.data.ptr + ob, c32.data.ptr + 4 * oc, stream)
            timings.append((timed(run)[0], rank, run))
        if not timings:
            return {}
        best.append(min(timings, key=lambda t: t[0]))
    c32[...] = 0
    for _, _, run in best:
        run()
    got = c32[:n * n].reshape(n, n)
    same = bool((got[:mp] == ref[:mp]).all() and (got[mp:, mp:] == ref[mp:, mp:]).all())

    def both():
        for _, _, run in best:
            run()
    label = (f"  cuBLASLt 3 of 4 blocks, whole K: [h;l]·hᵀ rank {best[0][1]} "
             f"({best[0][0]:.4f}) + l·lᵀ rank {best[1][1]} ({best[1][0]:.4f})")
    if not same:
        print(f"| - | {label} | DIFFERS from the full GEMM's blocks | |")
        return {}
    return {label: both}


def _lt_gemms(q, c32, mp, kp, kc, splits, do_pack, do_gemm):
    """The same int8 GEMM through cuBLASLt, each of the heuristic's first 8 algorithms, with
    dspk's K split (the chunks as the batch) and with the whole K in one matrix (cuBLASLt
    may split K itself, in its workspace). Each is checked: its partials summed over the
    batch must equal cuBLAS's exactly. Returns {name: call} for those that ran and agreed."""
    from dspk.linalg import cublaslt

    if cublaslt.available():
        print(f"| - | cuBLASLt | {cublaslt.available()} | |")
        return {}
    do_pack()
    do_gemm()
    ref = c32.reshape(splits, -1).astype(np.int64).sum(axis=0)
    n = 2 * mp
    out = {}
    for split_name, batches, chunk in ((f"{splits} K chunks as the batch", splits, kc),
                                       ("whole K", 1, kp)):
        for rank in range(8):
            g = cublaslt.GemmGeometry(False, n, n, chunk, cublaslt.OP_T, cublaslt.OP_N, kp, kp, n)
            try:
                lt = cublaslt.LtMatmul(g, batches, chunk, chunk, n * n, rank, 0, np.int8)
            except RuntimeError as e:
                print(f"| - | cuBLASLt int8 {split_name} rank {rank} | {e} | |")
                break
            if not lt.ok:
                break

            def run(lt=lt):
                lt(q.data.ptr, q.data.ptr, c32.data.ptr, cp.cuda.get_current_stream().ptr)

            c32[...] = 0
            run()
            cp.cuda.Device().synchronize()
            got = c32[:batches * n * n].reshape(batches, -1).astype(np.int64).sum(axis=0)
            same = bool((got == ref).all())
            name = (f"  cuBLASLt int8 GEMM, {split_name}, rank {rank} (waves {lt.waves:.2f}, "
                    f"ws {lt.workspace >> 10} KiB){'' if same else ' WRONG'}")
            if same:
                out[name] = run
            else:
                print(f"| - | {name} | differs from cuBLAS | |")
    return out


def _fused(x, want):
    """Each variant of the fused int16 X·Xᵀ kernel (gram16.cu) bound as int_gram runs it (with
    the row sums), checked exactly against ``want`` = int_matmul's product."""
    from dspk.linalg import candidates_int as ci
    from dspk.linalg.matmul import as_problem

    p, _ = as_problem(x, x.T, None, allowed=ci.INT_DTYPES, result_dtype=np.int64)
    out = p.out.to_array()
    rs = cp.empty(x.shape[0], dtype=np.int64)
    parts = {}
    for variant in ci.GRAM16_VARIANTS:
        c = ci.Int16GramFused(*variant)
        why = c.unavailable(p)
        if why:
            print(f"| {x.shape[0]} | {c.name} | unavailable: {why} | |")
            continue
        cfg = c.launch_config(p)
        run = c.bind(p)
        out[...] = -1
        run(p.a.ptr, p.b.ptr, p.out.ptr, rs.data.ptr)
        same = bool((out[0] == want).all()) and bool((rs == x.sum(axis=1, dtype=np.int64)).all())
        label = (f"  {c.name} (grid {cfg['grid']}, {cfg['ctas_per_sm']} CTAs/SM, "
                 f"{cfg['registers']} registers, K chunk {cfg['k_chunk']})"
                 + ("" if same else " DIFFERS"))
        parts[label] = lambda run=run: run(p.a.ptr, p.b.ptr, p.out.ptr, rs.data.ptr)
    return parts


def main() -> None:
    print("| channels | part | ms per call (events) | host ms per call |\n|---|---|---|---|")
    for c in (384, 64, 4):
        x = cp.asarray(np.random.default_rng(c).integers(-2000, 2000, (c, 60000),
                                                         dtype=np.int16))
        s_mat, s = int_gram(x)
        parts = {
            "dspk.covariance (public)": lambda: dspk.covariance(x),
            "int_matmul(x, x.T)": lambda: dspk.int_matmul(x, x.T),
            "int_gram(x) (product + row sums, covariance's call)": lambda: int_gram(x),
            "covariance's finishing kernel alone": lambda: _int_cov_gpu(s_mat, s, 60000, 1,
                                                                         True),
            "x.sum(axis=1, int64)": lambda: x.sum(axis=1, dtype=np.int64),
            "float32 covariance of the same data": lambda: dspk.covariance(
                x.astype(np.float32)),
        }
        parts.update(_fused(x, dspk.int_matmul(x, x.T)))
        parts.update(_pieces(x))
        for name, fn in parts.items():
            gpu_ms, host_ms = timed(fn)
            print(f"| {c} | {name} | {gpu_ms:.4f} | {host_ms:.4f} |")
        print(f"| {c} | explain | {dspk.explain(x, x.T)!r:.200} | |")
        grams = [getattr(plan, "name", "?") for plan in
                 dspk.linalg.engine.current_engine().plans["int_gram"].values()]
        print(f"| {c} | int_gram's bound candidates | {grams} | |")


if __name__ == "__main__":
    main()
