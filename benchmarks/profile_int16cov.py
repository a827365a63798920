#!/usr/bin/env python3
"""Where the exact int16 covariance's time goes on the GPU: the public call and its parts
(int_matmul alone, the channel sums, the int64 combination), median of 20 back-to-back calls
(CUDA events) and the host time per call, for 384, 64 and 4 channels x 60 000 samples.

    python benchmarks/profile_int16cov.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupy as cp  # noqa: E402

import dspk  # noqa: E402


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


def main() -> None:
    print("| channels | part | ms per call (events) | host ms per call |\n|---|---|---|---|")
    for c in (384, 64, 4):
        x = cp.asarray(np.random.default_rng(c).integers(-2000, 2000, (c, 60000),
                                                         dtype=np.int16))
        parts = {
            "dspk.covariance (public)": lambda: dspk.covariance(x),
            "int_matmul(x, x.T)": lambda: dspk.int_matmul(x, x.T),
            "x.sum(axis=1, int64)": lambda: x.sum(axis=1, dtype=np.int64),
            "float32 covariance of the same data": lambda: dspk.covariance(
                x.astype(np.float32)),
        }
        for name, fn in parts.items():
            gpu_ms, host_ms = timed(fn)
            print(f"| {c} | {name} | {gpu_ms:.4f} | {host_ms:.4f} |")
        print(f"| {c} | explain | {dspk.explain(x, x.T)!r:.200} | |")


if __name__ == "__main__":
    main()
