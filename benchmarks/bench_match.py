#!/usr/bin/env python3
"""NCC template-bank matching (seed 000) and the exact integer engine.

Cases: scikit-image's ``data.coins()`` (303x384) with 32 templates of 16x16 cut from it (the
seed's case; reported missing without scikit-image), a large image (4096x4096 on the GPU,
1024x1024 on the CPU: tiled coins plus noise, or smooth noise without scikit-image) with
N in {1, 16, 32, 128}; full coefficient maps (`ncc`) and peaks (`ncc_peaks`); the numerator
rate as GOP/s of 2·positions·K·N; peers when installed (OpenCV ``matchTemplate``,
scikit-image ``match_template``). And `int_matmul` on int16 [384, 60000] against the float32
product of the same data (bit-exactness checked against int64).

    python benchmarks/bench_match.py [--backend cpu|gpu|auto] [--small] [--out DIR]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dspk  # noqa: E402
from dspk.backend import to_numpy  # noqa: E402
from common import backend_tools, bench_main, finish, heading  # noqa: E402 (benchmarks/)
from dspk.match import (MMA_VARIANTS, TemplateBank, _bank_reason, _mma_reason, ncc,  # noqa: E402
                        ncc_direct, ncc_peaks)

TARGETS_GPU = {("coins", 32, "ncc"): 0.05, ("large", 32, "ncc"): 1.0,
               ("int16 cov", 0, "int_matmul"): 0.08}


def coins_or_none():
    """scikit-image's coins, or a saved copy named by $DSPK_COINS (a .npy file) for machines
    without scikit-image (the GPU machine has no network to install it)."""
    try:
        from skimage import data  # noqa: PLC0415
    except ImportError:
        import os  # noqa: PLC0415

        saved = os.environ.get("DSPK_COINS")
        return np.load(saved) if saved and os.path.exists(saved) else None
    return data.coins()


def large_image(size, coins):
    rng = np.random.default_rng(7)
    if coins is not None:
        reps = (-(-size // coins.shape[0]), -(-size // coins.shape[1]))
        img = np.tile(coins, reps)[:size, :size].astype(np.float64)
    else:
        from scipy.ndimage import gaussian_filter  # noqa: PLC0415

        img = gaussian_filter(rng.standard_normal((size, size)), 3) * 60 + 128
    img = img + rng.normal(0, 8, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def cut_templates(image, n, th=16, tw=16, seed=7):
    rng = np.random.default_rng(seed)
    ys = rng.integers(0, image.shape[0] - th, n)
    xs = rng.integers(0, image.shape[1] - tw, n)
    return np.stack([image[y:y + th, x:x + tw] for y, x in zip(ys, xs)])


def run(backend, small):
    gpu, xp, clock = backend_tools(backend)
    rows, notes = [], []
    coins = coins_or_none()
    if coins is None:
        notes.append("scikit-image missing: the coins case is skipped and the large image is "
                     "smooth noise; skimage peer missing")
    size = (1024 if small else 4096) if gpu else (256 if small else 1024)
    cases = []
    if coins is not None:
        cases.append(("coins", coins, cut_templates(coins, 32)))
    big = large_image(size, coins)
    for n in ((1, 32) if small else (1, 16, 32, 128)):
        cases.append(("large", big, cut_templates(big, n, seed=n)))
    for label, img, bank in cases:
        n, th, tw = bank.shape
        ho, wo = img.shape[0] - th + 1, img.shape[1] - tw + 1
        gop = 2.0 * ho * wo * th * tw * n / 1e9
        xi, xb = xp.asarray(img), xp.asarray(bank)
        maps = ncc(xi, xb)
        crop = (slice(None), slice(0, min(ho, 48)), slice(0, min(wo, 48)))
        ref = to_numpy(ncc_direct(xp.asarray(img[:min(ho, 48) + th - 1, :min(wo, 48) + tw - 1]),
                                  xb))
        err = float(np.max(np.abs(to_numpy(maps[crop]) - ref)))
        shape = f"{img.shape[0]}x{img.shape[1]}, N={n}, {th}x{tw}"
        t = clock.median_ms(lambda: ncc(xi, xb))
        rows.append(dict(case=label, n=n, what="ncc", shape=shape,
                         impl="dspk.ncc (full maps), one-shot call", ms=t,
                         gops=gop / (t * 1e-3), err=err))
        # a different bank (same shape) on every call: nothing can be reused but the plan
        others = [xp.asarray(cut_templates(img, n, th, tw, seed=100 + i)) for i in range(4)]
        turn = iter(range(10**9))
        t = clock.median_ms(lambda: ncc(xi, others[next(turn) % 4]))
        rows.append(dict(case=label, n=n, what="ncc", shape=shape,
                         impl="dspk.ncc one-shot, a different bank every call", ms=t,
                         gops=gop / (t * 1e-3), err=float("nan")))
        tb = TemplateBank(xb)
        tb.ncc(xi)
        t = clock.median_ms(lambda: tb.ncc(xi))
        rows.append(dict(case=label, n=n, what="ncc", shape=shape,
                         impl="dspk TemplateBank.ncc (bank prepared once)", ms=t,
                         gops=gop / (t * 1e-3), err=err))
        impls = {"im2col_int_matmul": tb._ncc_engine}
        if gpu:
            if _bank_reason(xi, tb) is None:
                impls["bank_dp4a"] = tb._ncc_bank_dp4a
            else:
                notes.append(f"{label} N={n}: bank_dp4a unavailable: {_bank_reason(xi, tb)}")
            for variant in MMA_VARIANTS:
                why = _mma_reason(xi, tb, variant)
                if why is None:
                    impls[variant] = lambda img, v=variant: tb._ncc_bank_mma(img, v)
                else:
                    notes.append(f"{label} N={n}: {variant} unavailable: {why}")
        for name, fn in impls.items():
            try:
                res = fn(xi)
                e = float(np.max(np.abs(to_numpy(res[crop]) - ref)))
                t = clock.median_ms(lambda fn=fn: fn(xi))
                rows.append(dict(case=label, n=n, what="ncc", shape=shape,
                                 impl=f"candidate {name} (prepared bank)", ms=t,
                                 gops=gop / (t * 1e-3), err=e))
            except Exception as exc:  # reported, never hidden
                notes.append(f"{label} N={n}: {name} failed: {type(exc).__name__}: {exc}")
        # peaks: the seed's setting, and a peak-heavy one (threshold 0.8, 3x3 neighbourhoods:
        # ~10^5 peaks on the large textured image)
        for thr, d, kind in ((0.9, 4, "peaks"), (0.8, 1, "peaks (peak-heavy)")):
            found = ncc_peaks(xi, xb, thr, min_distance=d)
            t = clock.median_ms(lambda: ncc_peaks(xi, xb, thr, min_distance=d))
            rows.append(dict(case=label, n=n, what=kind, shape=shape,
                             impl=f"dspk.ncc_peaks one-shot (threshold {thr}, min_distance "
                                  f"{d}; {len(found)} peaks)", ms=t,
                             gops=gop / (t * 1e-3), err=float("nan")))
            same = tb.peaks(xi, thr, d)
            t = clock.median_ms(lambda: tb.peaks(xi, thr, d))
            rows.append(dict(case=label, n=n, what=kind, shape=shape,
                             impl=f"dspk TemplateBank.peaks (prepared; same peaks: "
                                  f"{bool(np.array_equal(same, found))})", ms=t,
                             gops=gop / (t * 1e-3), err=float("nan")))
        try:
            import cv2  # noqa: PLC0415

            def cv():
                for i in range(n):
                    cv2.matchTemplate(img, bank[i], cv2.TM_CCOEFF_NORMED)

            # OpenCV takes 17 s for 4096² x 32 templates (H200 host, 2026-12-02): the large
            # image is timed with N = 1 only unless DSPK_BENCH_ALL_PEERS is set.
            every = bool(os.environ.get("DSPK_BENCH_ALL_PEERS"))
            if (img.size * n <= 4096 * 4096 * 32 and (gpu or not small)
                    and (label == "coins" or n == 1 or every)):
                t = clock.median_ms(cv, samples=3) if not gpu else statistics.median(
                    [_wall(cv) for _ in range(3)])
                cvmap = cv2.matchTemplate(img, bank[0], cv2.TM_CCOEFF_NORMED)
                rows.append(dict(case=label, n=n, what="ncc", shape=shape,
                                 impl="peer cv2.matchTemplate (CPU, looped)", ms=t,
                                 gops=gop / (t * 1e-3),
                                 err=float(np.max(np.abs(cvmap[:ref.shape[1], :ref.shape[2]]
                                                         - ref[0])))))
        except ImportError:
            if "peer missing: OpenCV (cv2)" not in notes:
                notes.append("peer missing: OpenCV (cv2)")
        if label == "coins":
            from skimage.feature import match_template  # noqa: PLC0415 (coins => skimage)

            def sk():
                return [match_template(img, bank[i]) for i in range(2)]

            t = statistics.median([_wall(sk) for _ in range(3)]) * n / 2
            skmap = match_template(img, bank[0])
            rows.append(dict(case=label, n=n, what="ncc", shape=shape,
                             impl="peer skimage.match_template (CPU, 2 templates timed, x N/2)",
                             ms=t, gops=gop / (t * 1e-3),
                             err=float(np.max(np.abs(skmap[:ref.shape[1], :ref.shape[2]]
                                                     - ref[0])))))
    # int16 exact covariance against the float32 product
    C, T = (384, 6000 if small else 60000)
    x16 = np.random.default_rng(3).integers(-2000, 2000, (C, T), dtype=np.int16)
    xi = xp.asarray(x16)
    exact = dspk.int_matmul(xi, xi.T)
    x64 = x16.astype(np.int64)
    ok = bool(np.array_equal(to_numpy(exact), x64 @ x64.T))
    t = clock.median_ms(lambda: dspk.int_matmul(xi, xi.T))
    gop = 2.0 * C * C * T / 1e9
    rows.append(dict(case="int16 cov", n=0, what="int_matmul", shape=f"[{C},{T}] int16",
                     impl=f"dspk.int_matmul (bit-identical to int64: {ok}; runs "
                          f"{dspk.explain(xi, xi.T).candidate})",
                     ms=t, gops=gop / (t * 1e-3), err=0.0 if ok else float("nan")))
    xf = xi.astype(np.float32)
    t = clock.median_ms(lambda: dspk.matmul(xf, xf.T))
    f32 = to_numpy(dspk.matmul(xf, xf.T)).astype(np.float64)
    ref = (x64 @ x64.T).astype(np.float64)
    rows.append(dict(case="int16 cov", n=0, what="int_matmul", shape=f"[{C},{T}] as float32",
                     impl="dspk.matmul float32 (same data)", ms=t, gops=gop / (t * 1e-3),
                     err=float(np.linalg.norm(f32 - ref) / np.linalg.norm(ref))))
    return rows, notes


def _wall(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def markdown(rows, notes, backend, env):
    lines = heading("bench_match", backend, env,
                    ["case", "shape", "implementation", "median ms", "numerator GOP/s",
                     "max abs err vs direct (48x48 crop)", "target ms"])
    for r in rows:
        tgt = TARGETS_GPU.get((r["case"], r["n"], r["what"])) if backend == "gpu" else None
        lines.append(f"| {r['case']} | {r['shape']} | {r['impl']} | {r['ms']:.4f} | "
                     f"{r['gops']:.1f} | {r['err']:.1e} | {tgt if tgt else '-'} |")
    return finish(lines, notes)


if __name__ == "__main__":
    bench_main("bench_match", __doc__, run, markdown)
