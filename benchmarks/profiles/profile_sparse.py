#!/usr/bin/env python3
"""The neighbourhood-sparse spatial kernel alone (local whitening, 32 of 384 non-zeros per
row, 384 x 60 000 float32), every variant launched three times: for ncu, e.g.

    ncu --kernel-name regex:sparse_rows --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section MemoryWorkloadAnalysis \\
        python benchmarks/profiles/profile_sparse.py

Without ncu it prints each variant's median time (CUDA events) and its plan's sizes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

import cupy as cp  # noqa: E402

from dspk.ops._spatial_gpu import SparseRowsPlan  # noqa: E402
from dspk.ops.spatial import SPARSE_KERNEL_VARIANTS, neighbors  # noqa: E402


def main() -> None:
    c, n = 384, 60000
    rows = np.arange(c) // 2
    geom = np.stack([np.where(np.arange(c) % 2 == 0, 0.0, 32.0) + 16.0 * (rows % 2),
                     rows * 20.0], axis=1)
    rng = np.random.default_rng(0)
    w = np.zeros((c, c))
    for ch, hood in enumerate(neighbors(geom, 32)):
        w[ch, hood] = rng.standard_normal(len(hood))
    x = cp.asarray(rng.standard_normal((c, n), dtype=np.float32))
    print("| variant | blocks | max union | mean cols per group | smem KB | median ms |")
    print("|---|---|---|---|---|---|")
    for groups, vpl, pipe in SPARSE_KERNEL_VARIANTS:
        plan = SparseRowsPlan(w, np.float32, groups, vpl, pipe)
        if plan.reason(0) is not None:
            continue
        times = []
        for _ in range(3):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            plan(x)
            b.record()
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b))
        print(f"| g{groups}v{vpl}{'p' if pipe else ''} | {plan.n_blocks} | {plan.max_union} | "
              f"{plan.mean_group_cols:.1f} | {plan.smem / 1024:.0f} | {sorted(times)[1]:.4f} |")
    # the public, prepared call (tuner's choice remembered), back to back
    import dspk  # noqa: PLC0415

    f = dspk.SpatialFilter(cp.asarray(w.astype(np.float32)))
    f(x)
    cp.cuda.Device().synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    for _ in range(20):
        f(x)
    b.record()
    b.synchronize()
    print(f"| SpatialFilter(W)(x), prepared ({f.chosen}), 20 calls back to back | - | - | - | - "
          f"| {cp.cuda.get_elapsed_time(a, b) / 20:.4f} |")


if __name__ == "__main__":
    main()
