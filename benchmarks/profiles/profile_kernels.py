#!/usr/bin/env python3
"""Runs each direct kernel on the seed shapes a few times, bound as matmul binds them, for a
profiler (scripts/gpu-check runs it under `ncu` when NCU=1). Prints nothing of its own."""

import importlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

import cupy as cp  # noqa: E402

from dspk.linalg.candidates_gpu import gpu_candidates  # noqa: E402
from dspk.linalg.problem import prepared  # noqa: E402

engine = importlib.import_module("dspk.linalg.matmul")
names = sys.argv[1].split(",") if len(sys.argv) > 1 else None
rng = np.random.default_rng(0)
x384 = cp.asarray(rng.standard_normal((384, 60000), dtype=np.float32))
x64 = cp.asarray(rng.standard_normal((64, 60000), dtype=np.float32))
x4 = cp.asarray(rng.standard_normal((4, 60000), dtype=np.float32))
w64 = cp.asarray(rng.standard_normal((64, 64), dtype=np.float32))
w6 = cp.asarray(rng.standard_normal((6, 61), dtype=np.float32))
clips = cp.asarray(rng.standard_normal((61, 100000), dtype=np.float32))
cases = [(x384, x384.T), (x64, x64.T), (w64, x64), (x4, x4.T), (w6, clips)]
for a, b in cases:
    p, _ = engine.as_problem(a, b, None)
    for c in gpu_candidates():
        if c.unavailable(p) is None and (names is None or c.name in names):
            f = prepared(c, p)
            for _ in range(3):
                f()
cp.cuda.Device().synchronize()
