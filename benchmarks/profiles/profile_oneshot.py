#!/usr/bin/env python3
"""Public one-shot calls as a user makes them, piece by piece, against their peers on the GPU:
`dspk.covariance` (float32, centred) with the CuPy expressions it replaced (mean, cast,
subtract, product, casts), its three pieces alone (centred copy, product, finish), `torch.cov`
and `cupy.cov`; `PCA.transform` against the same expression in CuPy and PyTorch;
`pairwise_sqdist` against the CuPy expression it replaced and `torch.cdist` squared, with its
two GPU routes (the one-launch direct kernel, the engine's product and a finish) at 16, 64 and
128 dimensions (where the direct kernel's bound is set).

Two timings per row, both medians of 21 samples between CUDA events: one call from an idle
stream (after a sync: the host time before the first launch shows, as in bench_ops), and 20
calls back to back divided by 20 (throughput, host time hidden behind the GPU's work).

    python benchmarks/profiles/profile_oneshot.py [--out DIR]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

import cupy as cp  # noqa: E402

import dspk  # noqa: E402
from dspk.ops import _covariance_gpu as g  # noqa: E402
from dspk.ops import _pca_gpu  # noqa: E402
from dspk.ops import distance as dist  # noqa: E402

try:
    import torch
except ImportError:  # reported, not skipped silently
    torch = None


def one_call_ms(fn, samples=21):
    fn()
    times = []
    for _ in range(samples):
        cp.cuda.Device().synchronize()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e))
    return statistics.median(times)


def back_to_back_ms(fn, calls=20, samples=11):
    fn()
    times = []
    for _ in range(samples):
        cp.cuda.Device().synchronize()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) / calls)
    return statistics.median(times)


def old_covariance(x):
    """What dspk.covariance ran on float CuPy input before (the accumulator's expressions)."""
    mean = x.mean(axis=1, dtype=np.float64)
    xc = x - mean[:, None].astype(x.dtype)
    m2 = dspk.matmul(xc, xc.T).astype(np.float64)
    return (m2 / (x.shape[1] - 1)).astype(x.dtype)


def main() -> None:
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else None
    lines = ["| case | implementation | one call ms | back to back ms | rel. error vs f64 |",
             "|---|---|---|---|---|"]

    def row(case, impl, fn, ref=None):
        err = ""
        if ref is not None:
            got = cp.asnumpy(fn()).astype(np.float64)
            err = f"{np.linalg.norm(got - ref) / np.linalg.norm(ref):.1e}"
        lines.append(f"| {case} | {impl} | {one_call_ms(fn):.4f} | {back_to_back_ms(fn):.4f} "
                     f"| {err} |")
        print(lines[-1], flush=True)

    for c in (4, 64, 384):
        n = 60000
        rng = np.random.default_rng(c)
        xh = (rng.standard_normal((c, n)) * 30 + rng.uniform(-300, 300, (c, 1))).astype(
            np.float32)
        ref = np.cov(xh.astype(np.float64))
        x = cp.asarray(xh)
        case = f"covariance {c}x{n} float32"
        row(case, "dspk.covariance (one pass centring, engine product, one finish)",
            lambda: dspk.covariance(x), ref)
        row(case, "before: CuPy mean/cast/subtract + engine product + casts",
            lambda: old_covariance(x), ref)
        xc, _ = g.center_rows(x)
        m2 = dspk.matmul(xc, xc.T)
        row(case, "piece: center_rows", lambda: g.center_rows(x))
        row(case, "piece: dspk.matmul(xc, xc.T)", lambda: dspk.matmul(xc, xc.T))
        row(case, "piece: float_finish", lambda: g.float_finish(m2, n - 1.0))
        row(case, "peer cupy.cov(dtype=float32)", lambda: cp.cov(x, dtype=np.float32), ref)
        if torch is not None:
            tx = torch.as_tensor(x, device="cuda")
            row(case, "peer torch.cov", lambda: torch.cov(tx), ref)
        else:
            lines.append(f"| {case} | peer torch.cov | missing (torch not installed) | | |")
    clips_h = np.random.default_rng(1).standard_normal((100000, 61)).astype(np.float32)
    clips = cp.asarray(clips_h)
    p = dspk.PCA(6).fit(clips)
    mu, w = p.mean_, p.components_
    ref = (clips_h.astype(np.float64) - cp.asnumpy(mu).astype(np.float64)) @ \
        cp.asnumpy(w).astype(np.float64).T
    case = "PCA transform 100000x61 -> 6"
    row(case, "dspk.PCA.transform (one pass: centre and project)", lambda: p.transform(clips),
        ref)
    row(case, "piece: the center_project launch alone",
        lambda: _pca_gpu.center_project(clips, mu, w))
    row(case, "before: CuPy centring + engine product",
        lambda: dspk.matmul(clips - mu[None], w.T), ref)
    row(case, "peer cupy (x - mean) @ W.T", lambda: (clips - mu[None]) @ w.T, ref)
    if torch is not None:
        tc, tm, tw = (torch.as_tensor(v, device="cuda") for v in (clips, mu, w))
        row(case, "peer torch (x - mean) @ W.T", lambda: (tc - tm[None]) @ tw.T, ref)
    chooser = dist._direct
    for n, d in ((20000, 16), (2000, 16), (20000, 32), (20000, 64), (2000, 64), (20000, 128),
                 (2000, 128)):
        pa = cp.asarray(np.random.default_rng(n).standard_normal((n, d)).astype(np.float32))
        case = f"pairwise_sqdist {n}x{n}x{d}"
        route = "direct kernel" if chooser(n, n, d) else "product, in-place finish"
        row(case, f"dspk.pairwise_sqdist (chose: {route})", lambda: dspk.pairwise_sqdist(pa, pa))
        for label, take in (("direct kernel", True), ("product, one in-place finish", False)):
            dist._direct = lambda n, m, d, take=take: take
            try:
                row(case, f"piece: {label}", lambda: dspk.pairwise_sqdist(pa, pa))
            finally:
                dist._direct = chooser
        row(case, "before: product + CuPy expression (four [n, n] temporaries)",
            lambda: cp.maximum((pa * pa).sum(axis=1)[:, None] + (pa * pa).sum(axis=1)[None, :]
                               - 2 * dspk.matmul(pa, pa.T), 0))
        if torch is not None:
            tp = torch.as_tensor(pa, device="cuda")
            row(case, "peer torch.cdist(a, a) ** 2", lambda: torch.cdist(tp, tp) ** 2)
            row(case, "peer torch.cdist(a, a, compute_mode='use_mm_for_euclid_dist') ** 2",
                lambda: torch.cdist(tp, tp, compute_mode="use_mm_for_euclid_dist") ** 2)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    text = (f"# profile_oneshot — {name.decode() if isinstance(name, bytes) else name}, "
            f"CuPy {cp.__version__}\n\n" + "\n".join(lines) + "\n")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile_oneshot-gpu.md").write_text(text)


if __name__ == "__main__":
    main()
