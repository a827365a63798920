#!/usr/bin/env python3
"""W·X with a small W on the GPU (spatial filters, projections): every direct W·X candidate
that can run the shape, cuBLAS (the ``cublas`` candidate), ``cupy.matmul`` and ``torch.matmul``
(when importable), each timed as GPU time and checked against a float64 product.

GPU ms: CUDA events around ``--calls`` back-to-back calls queued behind a spin kernel (the host
enqueues them all while the GPU is held, so the host's launch overhead is not in the time), per
call, median of ``--reps`` repetitions after a warm-up. The calls rotate over enough copies of
X and out to exceed the L2 cache, as bench_linalg does, so X comes from HBM as it would in a
pipeline. Queued ms: the same calls without the spin kernel (what a caller that enqueues them
one by one sees). Error: max |out - ref| / max |ref|, ref the float64 product of the same
operands. A candidate that fails is reported in its row and the others still run.

    PYTHONPATH=. python3 benchmarks/profile_wx.py [--out DIR] [--calls 50] [--reps 7]
        [--names direct_wxtile32c2s4w16,cublas]

With ``--out DIR`` the table is also written to DIR/profile_wx-gpu.md (and .json).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cupy as cp  # noqa: E402

from common import environment, finish, heading, publish  # noqa: E402 (benchmarks/)
from dspk.linalg.candidates_gpu import CublasGemm, WxTile, _SmallLeft, gpu_candidates  # noqa: E402
from dspk.linalg.problem import prepared  # noqa: E402

engine = importlib.import_module("dspk.linalg.matmul")

#: (label, M, K, N, dtype): out[M, N] = W[M, K]·X[K, N]
CASES = [
    ("spatial 64 ch", 64, 64, 60000, np.float32),
    ("spatial 64 -> 32 ch", 32, 64, 60000, np.float32),
    ("spatial 64 ch, float64", 64, 64, 60000, np.float64),
    ("projection 61 -> 6, 100000 clips", 6, 61, 100000, np.float32),
]
#: bytes of X and out the calls rotate over: several times the H200's 50 MB L2
ROTATION_BYTES = 256 << 20

COLUMNS = ["case", "shape", "implementation", "GPU ms", "min–max ms", "vs cuBLAS", "queued ms",
           "GB/s", "TFLOP/s", "rel. max err", "note"]


class GpuClock:
    """GPU time of a batch of calls, with and without a spin kernel holding the GPU while the
    host enqueues the batch (benchmarks/spin.cu)."""

    def __init__(self) -> None:
        src = (Path(__file__).resolve().parent / "spin.cu").read_text()
        self._spin = cp.RawModule(code=src).get_function("spin")
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        self._hz = props["clockRate"] * 1e3

    @staticmethod
    def host_s(fn, n: int = 20) -> float:
        """Host time to enqueue one call (s)."""
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        t = (time.perf_counter() - t0) / n
        cp.cuda.Device().synchronize()
        return t

    def gpu_ms(self, fn, calls: int, reps: int) -> tuple[float, float, float, int]:
        """(median, min, max) ms per call behind the spin kernel, and how many repetitions
        the spin ended before the host had enqueued the batch (their time includes the host's)."""
        spin_s = calls * self.host_s(fn) * 3 + 1e-3
        times, early = [], 0
        for _ in range(reps):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            self._spin((1,), (1,), (np.int64(int(self._hz * spin_s)),))
            s.record()
            for i in range(calls):
                fn(i)
            e.record()
            early += bool(s.done)
            e.synchronize()
            times.append(cp.cuda.get_elapsed_time(s, e) / calls)
        return statistics.median(times), min(times), max(times), early

    @staticmethod
    def queued_ms(fn, calls: int, reps: int) -> float:
        times = []
        for _ in range(reps):
            cp.cuda.Device().synchronize()
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            for i in range(calls):
                fn(i)
            e.record()
            e.synchronize()
            times.append(cp.cuda.get_elapsed_time(s, e) / calls)
        return statistics.median(times)


def implementations(w, xs, outs, problems, names):
    """(name, fn(i) running on buffer set i % len(xs), note, setup error or None) for the
    direct W·X candidates, cuBLAS and the peers, in that order."""
    nsets = len(xs)
    out = []
    for c in gpu_candidates():
        if not isinstance(c, (_SmallLeft, CublasGemm)) or (names and c.name not in names):
            continue
        try:
            reason = c.unavailable(problems[0])
            if reason is not None:
                out.append((c.name, None, f"unavailable: {reason}", None))
                continue
            note = ""
            if isinstance(c, WxTile):
                g = c.launch_config(problems[0])
                note = (f"grid {g['grid'][0]}x{g['grid'][1]}, {g['threads']} threads, "
                        f"{g['smem'] / 1024:.1f} KiB smem, {g['ctas_per_sm']} CTA/SM, "
                        f"{g['registers']} regs, tile {g['tile']} cols, k-chunk {g['k_chunk']}"
                        + (", mirrored" if g["mirrored"] else ""))
            calls = [prepared(c, q) for q in problems]
            out.append((c.name, lambda i, calls=calls: calls[i % nsets](), note, None))
        except Exception as exc:  # reported in the table, the others still run
            traceback.print_exc()
            out.append((c.name, None, "", f"{type(exc).__name__}: {exc}"))
    if not names or "cupy.matmul" in names:
        out.append(("cupy.matmul",
                    lambda i: cp.matmul(w, xs[i % nsets], out=outs[i % nsets]), "", None))
    if not names or "torch.matmul" in names:
        try:
            import torch

            if not torch.cuda.is_available():
                raise ImportError("torch without CUDA")
            torch.backends.cuda.matmul.allow_tf32 = False  # FP32 products, as everyone else
            tw = torch.from_dlpack(w)
            tx = [torch.from_dlpack(x) for x in xs]
            to = [torch.from_dlpack(o) for o in outs]
            out.append(("torch.matmul",
                        lambda i: torch.matmul(tw, tx[i % nsets], out=to[i % nsets]),
                        f"torch {torch.__version__}, allow_tf32=False", None))
        except ImportError as exc:
            out.append(("torch.matmul", None, f"not run: {exc}", None))
        except Exception as exc:  # torch present but unusable here: reported, not fatal
            traceback.print_exc()
            out.append(("torch.matmul", None, "", f"{type(exc).__name__}: {exc}"))
    return out


def run_case(clock, label, M, K, N, dtype, calls, reps, names):
    item = np.dtype(dtype).itemsize
    nsets = int(max(1, min(16, -(-ROTATION_BYTES // ((K * N + M * N) * item)))))
    rng = cp.random.default_rng(7)
    w = rng.standard_normal((M, K), dtype=dtype)
    xs = [rng.standard_normal((K, N), dtype=dtype) for _ in range(nsets)]
    outs = [cp.empty((M, N), dtype) for _ in range(nsets)]
    problems = [engine.as_problem(w, xs[s], outs[s])[0] for s in range(nsets)]
    ref = cp.matmul(w.astype(cp.float64), xs[0].astype(cp.float64))
    ref_max = float(cp.abs(ref).max())
    shape = f"W[{M},{K}]·X[{K},{N}] {np.dtype(dtype).name}"
    flop, nbytes = 2.0 * M * N * K, (M * K + K * N + M * N) * item
    rows = []
    for name, fn, note, error in implementations(w, xs, outs, problems, names):
        row = {"case": label, "shape": shape, "impl": name, "gpu_ms": None, "min_ms": None,
               "max_ms": None, "queued_ms": None, "rel_err": None, "note": note,
               "error": error, "sets": nsets}
        rows.append(row)
        if fn is None:
            continue
        try:
            outs[0].fill(cp.nan)  # an implementation that writes nothing shows a NaN error
            fn(0)
            cp.cuda.Device().synchronize()
            row["rel_err"] = float(cp.abs(outs[0].astype(cp.float64) - ref).max()) / ref_max
            for i in range(2 * nsets):  # warm-up: clocks, caches, lazy set-up of every set
                fn(i)
            cp.cuda.Device().synchronize()
            med, lo, hi, early = clock.gpu_ms(fn, calls, reps)
            row.update(gpu_ms=med, min_ms=lo, max_ms=hi, queued_ms=clock.queued_ms(fn, calls, reps))
            if early:
                row["note"] = (row["note"] + "; " if row["note"] else "") + (
                    f"{early} of {reps} batches outran the spin kernel (host time included)")
        except Exception as exc:  # reported in the table, the others still run
            traceback.print_exc()
            row["error"] = f"{type(exc).__name__}: {exc}"
    cublas = next((r["gpu_ms"] for r in rows if r["impl"] == "cublas" and r["gpu_ms"]), None)
    for r in rows:
        t = r["gpu_ms"]
        r["vs_cublas"] = cublas / t if (t and cublas) else None
        r["gbps"] = nbytes / (t * 1e-3) / 1e9 if t else None
        r["tflops"] = flop / (t * 1e-3) / 1e12 if t else None
    del xs, outs, problems, ref
    cp.get_default_memory_pool().free_all_blocks()
    return rows


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def markdown(rows, notes, env, calls, reps):
    lines = heading("profile_wx", "gpu", env, COLUMNS)
    lines[1:1] = ["", f"GPU ms: events around {calls} calls queued behind a spin kernel, per "
                      f"call, median of {reps}; queued ms: the same without the spin kernel. "
                      f"vs cuBLAS: cuBLAS's GPU ms / this GPU ms (> 1 is faster). Rows of a "
                      f"case sorted by GPU ms."]
    order = {label: i for i, (label, *_rest) in enumerate(CASES)}
    done = sorted(rows, key=lambda r: (order.get(r["case"], 99), r["gpu_ms"] is None,
                                       r["gpu_ms"] or 0.0))
    for r in done:
        note = r["note"] if not r["error"] else f"FAILED: {r['error']}"
        if r["rel_err"] is not None and not r["rel_err"] < 1e-5:
            note = "; ".join(n for n in ("WRONG RESULT", note) if n)
        spread = (f"{r['min_ms']:.4f}–{r['max_ms']:.4f}" if r["min_ms"] is not None else "n/a")
        lines.append("| " + " | ".join([
            r["case"], r["shape"], r["impl"], fmt(r["gpu_ms"], ".4f"), spread,
            fmt(r["vs_cublas"], ".2f"), fmt(r["queued_ms"], ".4f"), fmt(r["gbps"], ".0f"),
            fmt(r["tflops"], ".1f"), fmt(r["rel_err"], ".1e"), note.replace("|", "/")]) + " |")
    return finish(lines, notes)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="directory for profile_wx-gpu.{md,json}")
    ap.add_argument("--calls", type=int, default=50, help="calls per timed batch")
    ap.add_argument("--reps", type=int, default=7, help="timed batches (median)")
    ap.add_argument("--names", default="",
                    help="comma-separated implementations to run (default: all)")
    args = ap.parse_args(argv)
    names = {n for n in args.names.split(",") if n}
    clock = GpuClock()
    rows, notes = [], []
    for label, M, K, N, dtype in CASES:
        try:
            rows.extend(run_case(clock, label, M, K, N, dtype, args.calls, args.reps, names))
        except Exception as exc:  # a case that cannot even be set up: say so, go on
            traceback.print_exc()
            notes.append(f"{label}: case failed: {type(exc).__name__}: {exc}")
    for r in rows:
        if r["gpu_ms"] is None and r["error"] is None and r["note"]:
            notes.append(f"{r['case']}: {r['impl']} {r['note']}")
    shown = [r for r in rows if r["gpu_ms"] is not None or r["error"] is not None]
    env = environment(True)
    try:
        import torch

        env["torch"] = torch.__version__
    except ImportError:
        pass
    md = markdown(shown, notes, env, args.calls, args.reps)
    publish("profile_wx", "gpu", md, {"env": env, "rows": rows, "notes": notes,
                                      "calls": args.calls, "reps": args.reps}, args.out)


if __name__ == "__main__":
    main()
