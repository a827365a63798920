#!/usr/bin/env python3
"""Host (Python) cost of one `dspk.matmul` call on a known geometry, piece by piece.

For the skinny products the GPU works for a few microseconds, so the Python between the call
and the launch sets the rate. This prints the per-call host time of the public call and of
its parts (signature, plan lookup, output allocation, the bound runner), and a cProfile of
repeated calls, for the 4-channel covariance and spatial filter.

    python benchmarks/bench_host.py [--backend cpu|gpu|auto] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspk  # noqa: E402
from dspk.backend import resolve_backend  # noqa: E402

engine = importlib.import_module("dspk.linalg.matmul")


def per_call_us(fn, reps=5000):
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    backend = resolve_backend(args.backend)
    gpu = backend == "gpu"
    xp = np
    if gpu:
        import cupy as xp
    rng = np.random.default_rng(0)
    x = xp.asarray(rng.standard_normal((4, 60000)).astype(np.float32))
    w = xp.asarray(rng.standard_normal((4, 4)).astype(np.float32))
    c_out = xp.empty((4, 4), np.float32)
    lines = [f"# bench_host — {backend}", ""]
    sync = (lambda: xp.cuda.Device().synchronize()) if gpu else (lambda: None)
    for label, a, b, out in (("cov4", x, x.T, None), ("cov4 out=", x, x.T, c_out),
                             ("spatial4", w, x, None)):
        dspk.matmul(a, b, out=out)
        sync()
        sig = engine.operand_signature(a, b, out)
        plans = dspk.linalg.current_engine().plans["matmul"]
        plan = plans.get(sig)
        rows = [("dspk.matmul", per_call_us(lambda: dspk.matmul(a, b, out=out))),
                ("operand_signature", per_call_us(lambda: engine.operand_signature(a, b, out))),
                ("plan lookup", per_call_us(lambda: plans.get(sig)))]
        if plan is not None:
            o = out if out is not None else xp.empty(plan.shape, np.float32)
            if gpu:
                pa, pb, po = a.data.ptr, b.data.ptr, o.data.ptr
                rows.append(("bound runner", per_call_us(lambda: plan.runner(pa, pb, po))))
                rows.append(("cupy.empty(out)",
                             per_call_us(lambda: xp.empty(plan.shape, np.float32))))
                rows.append(("runtime.getDevice", per_call_us(xp.cuda.runtime.getDevice)))
                rows.append(("get_current_stream", per_call_us(xp.cuda.get_current_stream)))
            else:
                rows.append(("bound runner", per_call_us(lambda: plan.runner(a, b, o))))
        rows.append(("peer a @ b", per_call_us(lambda: a @ b)))
        p, _ = engine.as_problem(a, b, out)
        rows.append(("tuner.select (known key)", per_call_us(lambda: engine.tuner.select(p), 500)))
        sync()
        lines.append(f"## {label} (plan {'found' if plan is not None else 'MISSING'})")
        lines += [f"- {name}: {us:.2f} µs" for name, us in rows]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(3000):
            dspk.matmul(a, b, out=out)
        prof.disable()
        sync()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
        lines += ["", "```", s.getvalue().strip()[-3000:], "```", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"bench_host-{backend}.md").write_text(text)


if __name__ == "__main__":
    main()
