#!/usr/bin/env python3
"""dspk.matmul against NumPy's own ``w @ x`` on the CPU: a markdown table of median ms.

For each shape W [M, K] · X [K, N] (float32 unless --dtype), in a fresh process of its own
(--one-process: all in this one), the two calls are timed alternately (numpy, dspk, numpy,
dspk, ...: a shared, noisy machine slows both alike) after a warm-up that also lets dspk's tuner
choose; median of --repeats calls each. Both allocate their result, as a user's call does.
Columns: BLAS at its configured thread count (default: one per core, or OPENBLAS_NUM_THREADS),
then both with BLAS limited to one thread (threadpoolctl) unless --no-single. A dspk call that
follows a NumPy call here meets OpenBLAS's worker threads still spinning from it (~0.1 s), as a
user's interleaved calls would. Each row also checks that dspk gives the same bits with BLAS on
1 and on the configured count of threads.

    python benchmarks/profiles/profile_cpu_matmul.py [--repeats 41]
        [--shapes 384x384x6000,64x64x60000] [--dtype float64] [--one-process] [--no-single]
    OPENBLAS_NUM_THREADS=1 python benchmarks/profiles/profile_cpu_matmul.py

DSPK_CACHE_DIR is pointed at a temporary directory unless set, so the tuner's choices of earlier
runs are not reused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
SHAPES = "384x384x6000,384x384x60000,64x64x60000,32x64x60000,4x4x60000,6x61x100000"


def _time_pair(fa, fb, repeats: int) -> tuple[float, float]:
    ta, tb = [], []
    for _ in range(3):
        fa(), fb()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fa()
        t1 = time.perf_counter()
        fb()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return statistics.median(ta) * 1e3, statistics.median(tb) * 1e3


def measure(shape: str, dtype: str, repeats: int, single: bool) -> dict:
    """One shape, in this process."""
    sys.path.insert(0, str(ROOT))
    import numpy as np
    from threadpoolctl import threadpool_info, threadpool_limits

    import dspk

    m, k, n = (int(v) for v in shape.split("x"))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((m, k)).astype(dtype)
    x = rng.standard_normal((k, n)).astype(dtype)
    threads = max([lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
                  or [0])
    row = {"shape": shape, "threads": threads}
    row["numpy"], row["dspk"] = _time_pair(lambda: w @ x, lambda: dspk.matmul(w, x), repeats)
    many = dspk.matmul(w, x)
    with threadpool_limits(1, user_api="blas"):
        one = dspk.matmul(w, x)
        if single:
            row["numpy1"], row["dspk1"] = _time_pair(lambda: w @ x, lambda: dspk.matmul(w, x),
                                                     repeats)
    row["same_bits"] = bool(np.array_equal(one.view(np.uint8), many.view(np.uint8)))
    return row


def table(rows: list[dict], single: bool, dtype: str) -> str:
    import numpy as np

    import dspk

    head = ["shape (M x K x N)", "threads", "numpy ms", "dspk ms", "dspk / numpy"]
    if single:
        head += ["numpy 1 thread", "dspk 1 thread", "dspk / numpy (1)"]
    head.append("same bits 1 / all threads")
    out = [f"dspk {dspk.__version__}, NumPy {np.__version__}, {dtype}, {os.cpu_count()} CPUs, "
           "median ms (numpy and dspk calls alternated)", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["shape"], str(r["threads"]), f"{r['numpy']:.3f}", f"{r['dspk']:.3f}",
                 f"{r['dspk'] / r['numpy']:.2f}"]
        if single:
            cells += [f"{r['numpy1']:.3f}", f"{r['dspk1']:.3f}", f"{r['dspk1'] / r['numpy1']:.2f}"]
        cells.append("yes" if r["same_bits"] else "NO")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated MxKxN")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--one-process", action="store_true", help="all shapes in this process")
    ap.add_argument("--no-single", action="store_true", help="skip the one-thread columns")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    single = not args.no_single
    if args.child:
        print(json.dumps(measure(args.child, args.dtype, args.repeats, single)))
        return
    if "DSPK_CACHE_DIR" not in os.environ:
        os.environ["DSPK_CACHE_DIR"] = tempfile.mkdtemp(prefix="dspk-profile-cpu-")
    rows = []
    for shape in args.shapes.split(","):
        if args.one_process:
            rows.append(measure(shape, args.dtype, args.repeats, single))
            continue
        cmd = [sys.executable, __file__, "--child", shape, "--dtype", args.dtype,
               "--repeats", str(args.repeats)] + (["--no-single"] if not single else [])
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(table(rows, single, args.dtype))


if __name__ == "__main__":
    main()
