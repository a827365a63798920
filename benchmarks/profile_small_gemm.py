#!/usr/bin/env python3
"""Which cuBLAS entry point is fastest for the small spatial products, and where a one-shot
spatial_filter spends its host time.

For W[M, K]·X[K, N] float32 (64 x 64 x 60 000 and 384 x 384 x 60 000) it times, as GPU time
(CUDA events around 50 back-to-back launches, median of 7 repetitions) and host time per call:
cuBLAS gemmStridedBatchedEx with one batch (what dspk's "cublas" candidate calls), gemmEx, sgemm,
every algorithm cuBLASLt's heuristic offers (called through ctypes: CuPy does not expose
cuBLASLt), cupy.matmul, torch.matmul and dspk.matmul. Each result is checked against float64.
Then the public one-shot spatial_filter on a W never seen, against cupy.matmul, one call at a
time on an idle GPU (the way a user times one call).

    python benchmarks/profile_small_gemm.py [--out DIR]
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupy as cp  # noqa: E402
from cupy_backends.cuda.libs import cublas  # noqa: E402

import dspk  # noqa: E402
from common import Clock  # noqa: E402 (benchmarks/)

CUDA_R_32F, CUBLAS_COMPUTE_32F, OP_N = 0, 68, 0
DESC_TRANSA, DESC_TRANSB, PREF_MAX_WORKSPACE = 3, 4, 1
WORKSPACE = 32 << 20


def timed(fn, reps=50, samples=7):
    """(median GPU ms per call, median host µs per call) over ``samples`` runs of ``reps``."""
    fn()
    cp.cuda.Device().synchronize()
    dev, host = [], []
    for _ in range(samples):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        t0 = time.perf_counter()
        a.record()
        for _ in range(reps):
            fn()
        t1 = time.perf_counter()
        b.record()
        b.synchronize()
        dev.append(cp.cuda.get_elapsed_time(a, b) / reps)
        host.append(1e6 * (t1 - t0) / reps)
    return statistics.median(dev), statistics.median(host)


def _lt_library():
    """libcublasLt as loaded by this process (cuBLAS depends on it), else by name."""
    cp.cuda.device.get_cublas_handle()
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libcublasLt" in line:
            return ctypes.CDLL(line.split()[-1])
    return ctypes.CDLL("libcublasLt.so.13")


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t),
                ("state", ctypes.c_int), ("waves", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


def lt_runners(w, x, out, count=16):
    """{name: runner} for the cuBLASLt algorithms its heuristic returns for out = W·X
    (row-major; computed as outᵀ = Xᵀ·Wᵀ in column-major terms)."""
    lib = _lt_library()
    vp = ctypes.c_void_p
    handle = vp()
    assert lib.cublasLtCreate(ctypes.byref(handle)) == 0
    desc = vp()
    assert lib.cublasLtMatmulDescCreate(ctypes.byref(desc), CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0
    M, K = w.shape
    N = x.shape[1]

    def layout(rows, cols, ld):
        lay = vp()
        assert lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), CUDA_R_32F, ctypes.c_uint64(rows),
                                              ctypes.c_uint64(cols), ctypes.c_int64(ld)) == 0
        return lay

    la, lb, lc = layout(N, K, N), layout(K, M, K), layout(N, M, N)
    pref = vp()
    assert lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)) == 0
    ws = ctypes.c_uint64(WORKSPACE)
    assert lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, ctypes.byref(ws),
                                                    8) == 0
    results = (_Heuristic * count)()
    got = ctypes.c_int()
    st = lib.cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, count, results,
                                            ctypes.byref(got))
    assert st == 0, f"cublasLtMatmulAlgoGetHeuristic: status {st}"
    work = cp.empty(WORKSPACE, dtype=np.uint8)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    runners = {}
    for i in range(got.value):
        r = results[i]
        if r.state != 0:
            continue
        algo = ctypes.byref(r.algo)

        def run(algo=algo, wsz=r.workspace):
            s = lib.cublasLtMatmul(handle, desc, ctypes.byref(one), vp(x.data.ptr), la,
                                   vp(w.data.ptr), lb, ctypes.byref(zero), vp(out.data.ptr), lc,
                                   vp(out.data.ptr), lc, algo, vp(work.data.ptr),
                                   ctypes.c_size_t(wsz),
                                   vp(cp.cuda.get_current_stream().ptr))
            if s:
                raise RuntimeError(f"cublasLtMatmul: status {s}")

        runners[f"cublasLt heuristic #{i} (waves {r.waves:.2f}, ws {r.workspace >> 10} KiB)"] = run
    runners["_keep"] = (results, work, handle, desc, la, lb, lc, pref)   # alive while timed
    return runners


def cublas_runners(w, x, out):
    """The cuBLAS entry points for out = W·X (row-major, as outᵀ = Xᵀ·Wᵀ)."""
    M, K = w.shape
    N = x.shape[1]
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    h = cp.cuda.device.get_cublas_handle
    return {
        "cublas gemmStridedBatchedEx, 1 batch (dspk's)": lambda: cublas.gemmStridedBatchedEx(
            h(), OP_N, OP_N, N, M, K, one.ctypes.data, x.data.ptr, CUDA_R_32F, N, 0, w.data.ptr,
            CUDA_R_32F, K, 0, zero.ctypes.data, out.data.ptr, CUDA_R_32F, N, 0, 1,
            CUBLAS_COMPUTE_32F, -1),
        "cublas gemmEx": lambda: cublas.gemmEx(
            h(), OP_N, OP_N, N, M, K, one.ctypes.data, x.data.ptr, CUDA_R_32F, N, w.data.ptr,
            CUDA_R_32F, K, zero.ctypes.data, out.data.ptr, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, -1),
        "cublas sgemm": lambda: cublas.sgemm(
            h(), OP_N, OP_N, N, M, K, one.ctypes.data, x.data.ptr, N, w.data.ptr, K,
            zero.ctypes.data, out.data.ptr, N),
    }


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    lines = ["# profile_small_gemm — " + cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
             "", "| product | implementation | GPU ms (50 back-to-back) | host µs/call | "
             "rel. error vs f64 |", "|---|---|---|---|---|"]
    for M, K, N in ((64, 64, 60000), (384, 384, 60000)):
        wh = rng.standard_normal((M, K)).astype(np.float32)
        xh = rng.standard_normal((K, N)).astype(np.float32)
        ref = wh.astype(np.float64) @ xh.astype(np.float64)
        w, x = cp.asarray(wh), cp.asarray(xh)
        out = cp.empty((M, N), np.float32)
        impls = cublas_runners(w, x, out)
        try:
            lt = lt_runners(w, x, out)
            keep = lt.pop("_keep")
            impls.update(lt)
        except Exception as e:  # noqa: BLE001 (report, go on)
            keep = None
            lines.append(f"| {M}x{K}x{N} | cublasLt | failed: {type(e).__name__}: {e} | | |")
        impls["cupy.matmul"] = lambda: cp.matmul(w, x, out=out)
        impls["dspk.matmul (tuned)"] = lambda: dspk.linalg.matmul(w, x)
        if torch is not None:
            tw, tx = torch.as_tensor(w, device="cuda"), torch.as_tensor(x, device="cuda")
            torch.backends.cuda.matmul.allow_tf32 = False
            to = torch.empty((M, N), device="cuda")
            impls["torch.matmul(out=)"] = lambda: torch.matmul(tw, tx, out=to)
            impls["torch.matmul"] = lambda: torch.matmul(tw, tx)
        for name, fn in impls.items():
            try:
                out.fill(0)
                dev, host = timed(fn)
                if name.startswith("torch"):
                    got = (to if "out=" in name else torch.matmul(tw, tx)).cpu().numpy()
                elif name.startswith("dspk"):
                    got = dspk.linalg.matmul(w, x).get()
                else:
                    got = out.get()
                err = float(np.abs(got - ref).max() / np.abs(ref).max())
                lines.append(f"| {M}x{K}x{N} | {name} | {dev:.4f} | {host:.1f} | {err:.1e} |")
            except Exception as e:  # noqa: BLE001
                lines.append(f"| {M}x{K}x{N} | {name} | failed: {type(e).__name__}: {e} | | |")
        del keep
    # the one-shot spatial_filter on a new W every call, one call at a time on an idle GPU
    geom = np.c_[np.tile([0.0, 32.0], 192), 20.0 * np.arange(384)]
    xh = rng.standard_normal((384, 60000)).astype(np.float32)
    x = cp.asarray(xh)
    w_loc = dspk.whitening_matrix(cp.asarray(np.cov(xh[:, :20000]).astype(np.float32)),
                                  geometry_um=geom, n_neighbors=32)
    fresh = iter([w_loc * (1.0 + 1e-3 * (i + 1)) for i in range(90)])
    clock = Clock(gpu=True)     # one call per sample after a warm-up, as bench_ops times
    w32 = w_loc.copy()
    dspk.spatial_filter(next(fresh), x)
    pair = {"one": [], "peer": [], "host": []}
    for _ in range(21):
        pair["one"].append(clock.median_ms(lambda: dspk.spatial_filter(next(fresh), x), 1))
        pair["peer"].append(clock.median_ms(lambda: cp.matmul(w32, x), 1))
        cp.cuda.Device().synchronize()
        wn = next(fresh)
        t0 = time.perf_counter()
        dspk.spatial_filter(wn, x)
        pair["host"].append(1e6 * (time.perf_counter() - t0))
    lines += ["", "| one call on an idle GPU, 384 x 384 local W x 60 000 | GPU ms (median of 21, "
              "interleaved) |", "|---|---|",
              f"| dspk.spatial_filter(W_new, x), a W never seen | "
              f"{statistics.median(pair['one']):.4f} (host {statistics.median(pair['host']):.1f} "
              f"µs per call) |",
              f"| cupy.matmul(W, x) | {statistics.median(pair['peer']):.4f} |"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "profile_small_gemm.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
