#!/usr/bin/env python3
"""Where the local whitening build's time goes (384 channels, 32 neighbours): the stages of
dspk.whitening_matrix timed one by one on the device (CUDA events), median of 7.

    python benchmarks/profile_whitening.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupy as cp  # noqa: E402

import dspk  # noqa: E402
from dspk.ops.spatial import neighbors  # noqa: E402


def median_ms(fn, reps=7):
    fn()
    cp.cuda.Device().synchronize()
    out = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        t0 = time.perf_counter()
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append((cp.cuda.get_elapsed_time(a, b), 1e3 * (time.perf_counter() - t0)))
    out.sort()
    return out[len(out) // 2]


def main():
    c, k = 384, 32
    rng = np.random.default_rng(0)
    mix = rng.standard_normal((c, c // 4))
    cov = cp.asarray(mix @ mix.T + np.eye(c))
    geom = np.stack([np.tile([0.0, 32.0], c // 2), np.repeat(np.arange(c // 2), 2) * 20.0], 1)
    rows = []
    rows.append(("whole whitening_matrix(local, 32)",
                 median_ms(lambda: dspk.whitening_matrix(cov, geometry_um=geom,
                                                         n_neighbors=k))))
    rows.append(("neighbors() on the host", median_ms(lambda: neighbors(geom, k))))
    hoods = neighbors(geom, k)
    idx = cp.asarray(np.stack(hoods))
    rows.append(("gather [384, 32, 32]", median_ms(lambda: cov[idx[:, :, None],
                                                                idx[:, None, :]])))
    sub = cov[idx[:, :, None], idx[:, None, :]]
    rows.append(("cupy.linalg.eigh batched float64", median_ms(lambda: cp.linalg.eigh(sub))))
    rows.append(("cupy.linalg.eigh batched float32",
                 median_ms(lambda: cp.linalg.eigh(sub.astype(np.float32)))))
    d, e = cp.linalg.eigh(sub)
    rows.append(("compose E diag Et (batched matmul)",
                 median_ms(lambda: (e * (1 / cp.sqrt(cp.maximum(d, 0) + 1e-8))[:, None, :])
                           @ cp.swapaxes(e, 1, 2))))
    for name, (gpu_ms, wall_ms) in rows:
        print(f"| {name} | {gpu_ms:.3f} | {wall_ms:.3f} |")


if __name__ == "__main__":
    print("| stage | GPU ms (events) | wall ms |\n|---|---|---|")
    main()
