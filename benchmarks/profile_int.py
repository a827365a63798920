#!/usr/bin/env python3
"""One exact int16 covariance product (384 x 60000) after a warm-up, for Nsight Compute or
nsys: every kernel of the int8 tensor-core path (pack, cuBLAS GEMM, combine) in one call.

    python benchmarks/profile_int.py
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupy as cp  # noqa: E402

import dspk  # noqa: E402

x = cp.asarray(np.random.default_rng(3).integers(-2000, 2000, (384, 60000), dtype=np.int16))
dspk.int_matmul(x, x.T)
cp.cuda.Device().synchronize()
cp.cuda.profiler.start()
dspk.int_matmul(x, x.T)
cp.cuda.Device().synchronize()
cp.cuda.profiler.stop()
print("done")
