#!/usr/bin/env python3
"""The fused int16 X·Xᵀ kernel (gram16.cu), each variant the tuner times, against the INT8
GEMM path (pack + cuBLASLt + combine) on the same data: int16 [C, 60 000] full-range, inputs
rotated over copies that together exceed L2 (as a pipeline's chunks arrive), median of 25
calls (CUDA events per call); every result checked exactly against the first candidate's.

    python benchmarks/profiles/profile_gram16.py          # the table
    python benchmarks/profiles/profile_gram16.py --once   # each variant once, 384 channels (ncu)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

import cupy as cp  # noqa: E402

from dspk.linalg import candidates_int as ci  # noqa: E402
from dspk.linalg.matmul import as_problem  # noqa: E402


def runners(x):
    """{name: (runner, config)} for the fused variants and the INT8 GEMM candidates."""
    p, _ = as_problem(x, x.T, None, allowed=ci.INT_DTYPES, result_dtype=np.int64)
    found = {}
    for c in [ci.Int16GramFused(*v) for v in ci.GRAM16_VARIANTS] + \
            [ci.Int8TensorCore(7), ci.Int8TensorCore()]:
        why = c.unavailable(p)
        if why:
            print(f"| {x.shape[0]} | {c.name} | unavailable: {why} | | |")
            continue
        cfg = c.launch_config(p) if hasattr(c, "launch_config") else {}
        found[c.name] = (c.bind(p), cfg)
    return found


def main() -> None:
    once = "--once" in sys.argv
    l2 = cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]
    print("| channels | candidate | median ms | TOP/s (useful, triangle) | config |")
    print("|---|---|---|---|---|")
    for c in ((384,) if once else (384, 128, 64, 4)):
        k = 60000
        rng = np.random.default_rng(c)
        n_copies = 1 if once else max(2, -(-4 * l2 // (2 * c * k)))
        xs = [cp.asarray(rng.integers(-32768, 32768, (c, k), dtype=np.int16))
              for _ in range(min(n_copies, 64))]
        outs = [cp.empty((c, c), dtype=np.int64) for _ in xs]
        sums = [cp.empty(c, dtype=np.int64) for _ in xs]
        found = runners(xs[0])
        want = xs[0].get().astype(np.int64)
        want_s, want_m = want.sum(axis=1), want @ want.T
        tiles = -(-c // 64)
        useful = 2.0 * 4 * 64 * 64 * k * tiles * (tiles + 1) / 2   # int8 ops the kernel does
        for name, (run, cfg) in found.items():
            run(xs[0].data.ptr, xs[0].data.ptr, outs[0].data.ptr, sums[0].data.ptr)
            same = bool(np.array_equal(outs[0].get(), want_m)
                        and np.array_equal(sums[0].get(), want_s))
            if once:
                cp.cuda.Device().synchronize()
                continue
            times = []
            for i in range(25 + 3):
                j = i % len(xs)
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record()
                run(xs[j].data.ptr, xs[j].data.ptr, outs[j].data.ptr, sums[j].data.ptr)
                b.record()
                b.synchronize()
                if i >= 3:
                    times.append(cp.cuda.get_elapsed_time(a, b))
            ms = float(np.median(times))
            conf = {key: cfg[key] for key in ("grid", "ctas_per_sm", "registers", "k_chunk")
                    if key in cfg}
            print(f"| {c} | {name}{'' if same else ' DIFFERS'} | {ms:.4f} | "
                  f"{useful / ms / 1e9:.0f} | {conf} |")


if __name__ == "__main__":
    main()
