#!/usr/bin/env python3
"""dspk.ops at sorter sizes (384 x 60 000 samples; 64 and 4 channels), with the peers that are
installed run on the same data: NumPy/SciPy on the CPU, CuPy/cupyx and PyTorch on the GPU.

Median ms (CUDA events on the GPU, perf_counter on the CPU), the fraction of the copy ceiling
for memory-bound ops (bytes read + written / time / measured copy rate), and the error against a
float64 reference where one is cheap.

    python benchmarks/bench_ops.py [--backend cpu|gpu|auto] [--small] [--samples N] [--out DIR]

``--samples N``: traces of N samples (default 60 000; 6000 with --small); issue 32 measures the
CPU at 30 000 (1 s). On the CPU each case also gets its candidates timed one by one (where the
dspk under test has them), the tuner's choice named, and the CPU time of the call next to its
wall time (other processes on the cores show as wall time above the CPU time's share).
"""

from __future__ import annotations

import sys
import statistics
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dspk  # noqa: E402
from dspk.backend import to_numpy  # noqa: E402
from common import backend_tools, bench_main, finish, heading  # noqa: E402 (benchmarks/)

#: the traces' length, set by --samples (None: 60 000, or 6000 with --small)
SAMPLES: int | None = None

TARGETS_GPU = {"fir_bank 6x61": 0.8, "local whitening apply": 0.07,
               "median CAR + high-pass": 1.0, "local whitening build": 10.0}


def realistic(c, n, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((c // 4 + 2, n), dtype=np.float32)
    mix = rng.standard_normal((c, src.shape[0]), dtype=np.float32) * 20
    return (mix @ src + rng.uniform(-300, 300, (c, 1)).astype(np.float32)
            + 5 * rng.standard_normal((c, n), dtype=np.float32)).astype(np.float32)


def probe(n):
    return np.stack([np.tile([0.0, 32.0], n // 2 + 1)[:n],
                     np.repeat(np.arange(n // 2 + 1), 2)[:n] * 20.0], axis=1)


def run(backend, small):
    gpu, xp, clock = backend_tools(backend)
    rows, notes = [], []
    T = SAMPLES or (6000 if small else 60000)
    src = xp.ones(1 << 26, np.float32)
    dst = xp.empty_like(src)
    bw = 2 * src.nbytes / (clock.median_ms(lambda: xp.copyto(dst, src), 5) * 1e-3)  # bytes/s
    torch = None
    try:
        import torch as _torch

        if not gpu or _torch.cuda.is_available():
            torch = _torch
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
    except ImportError:
        notes.append("peer missing: torch")

    def add(case, impl, ms, nbytes=None, err=None, note=""):
        rows.append(dict(case=case, impl=impl, ms=ms, frac_bw=(nbytes / (ms * 1e-3) / bw)
                         if nbytes else None, err=err, note=note))

    def cpu_time(fn, samples=5):
        """The median CPU time (all threads) of ``fn`` in ms, on the CPU only."""
        if gpu:
            return None
        fn()
        got = []
        for _ in range(samples):
            t0 = time.process_time()
            fn()
            got.append((time.process_time() - t0) * 1e3)
        return statistics.median(got)

    for C in (384, 64, 4):
        xh = realistic(C, T, seed=C)
        x = xp.asarray(xh)
        x64 = xh.astype(np.float64)
        ref = np.cov(x64)
        cov = dspk.covariance(x)
        err = float(np.linalg.norm(to_numpy(cov) - ref) / np.linalg.norm(ref))
        add(f"covariance {C}x{T}", "dspk.covariance (float32)",
            clock.median_ms(lambda: dspk.covariance(x)), x.nbytes, err)
        add(f"covariance {C}x{T}", "peer numpy/cupy cov(dtype=f32)",
            clock.median_ms(lambda: xp.cov(x, dtype=np.float32)), x.nbytes)
        if torch is not None:
            tx = torch.as_tensor(x, device="cuda" if gpu else "cpu")
            add(f"covariance {C}x{T}", "peer torch.cov",
                clock.median_ms(lambda: torch.cov(tx)), x.nbytes)
        x16 = xp.asarray(np.clip(xh, -32768, 32767).astype(np.int16))
        add(f"covariance {C}x{T}", "dspk.covariance (int16, exact)",
            clock.median_ms(lambda: dspk.covariance(x16)), x16.nbytes)
        add(f"covariance {C}x{T}", "dspk.int_matmul(x16, x16.T) alone (its product)",
            clock.median_ms(lambda: dspk.int_matmul(x16, x16.T)), x16.nbytes,
            note=f"tuner: {dspk.explain(x16, x16.T).candidate}")
        if not gpu and C == 384:
            cpu_candidate_rows(add, clock, x16, f"covariance {C}x{T}", notes)
            add(f"covariance {C}x{T}", "dspk.covariance (float32), CPU time of the call",
                cpu_time(lambda: dspk.covariance(x)))
            add(f"covariance {C}x{T}", "dspk.covariance (int16, exact), CPU time of the call",
                cpu_time(lambda: dspk.covariance(x16)))
        if C == 384:
            geom = probe(C)
            t0 = time.perf_counter()
            w_loc = dspk.whitening_matrix(cov, geometry_um=geom, n_neighbors=32)
            add("local whitening build", "dspk.whitening_matrix(n_neighbors=32)",
                clock.median_ms(lambda: dspk.whitening_matrix(cov, geometry_um=geom,
                                                              n_neighbors=32), 5),
                note=f"first call {1e3 * (time.perf_counter() - t0):.1f} ms; Kilosort4: 241-254 ms")
            w = dspk.whitening_matrix(cov)
            add("global whitening build", "dspk.whitening_matrix", clock.median_ms(
                lambda: dspk.whitening_matrix(cov), 5))
            y = dspk.spatial_filter(w, x)
            c_w = to_numpy(dspk.covariance(y)).astype(np.float64)
            # 21 samples each, interleaved call by call, for a fair one-shot against peer
            wd = w.astype(x.dtype)
            pair = {"one": [], "peer": []}
            for _ in range(21):
                pair["one"].append(clock.median_ms(lambda: dspk.spatial_filter(w, x), 1))
                pair["peer"].append(clock.median_ms(lambda: xp.matmul(wd, x), 1))
            add("dense whitening apply", "dspk.spatial_filter(W, x), one-shot (21 samples "
                "interleaved with the peer's)", statistics.median(pair["one"]), 2 * x.nbytes,
                float(np.abs(c_w - np.eye(C)).max()), "err: max |cov(Wx) - I|")
            add("dense whitening apply", "peer dense xp.matmul(W, x) (cuBLAS/BLAS)",
                statistics.median(pair["peer"]), 2 * x.nbytes)
            f_loc = dspk.SpatialFilter(w_loc)
            ref_loc = to_numpy(w_loc).astype(np.float64) @ x64
            err = float(np.abs(to_numpy(f_loc(x)) - ref_loc).max() / np.abs(ref_loc).max())
            add("local whitening apply", f"dspk.SpatialFilter(W_local)(x), prepared "
                f"(tuner: {f_loc.chosen})", clock.median_ms(lambda: f_loc(x)), 2 * x.nbytes,
                err, "32 of 384 non-zeros per row")
            add("local whitening apply", "dspk.spatial_filter(W_local, x), one-shot (the "
                "filter prepared for W kept by its content)",
                clock.median_ms(lambda: dspk.spatial_filter(w_loc, x)), 2 * x.nbytes)
            # a W never seen on every call (matrices made beforehand, each used once), 21
            # samples interleaved call by call with the dense peer's
            w32 = w_loc.astype(x.dtype)
            fresh = iter([w_loc * (1.0 + 1e-3 * (i + 1)) for i in range(42)])
            pair = {"one": [], "peer": []}
            for _ in range(21):
                pair["one"].append(clock.median_ms(lambda: dspk.spatial_filter(next(fresh), x),
                                                   1))
                pair["peer"].append(clock.median_ms(lambda: xp.matmul(w32, x), 1))
            add("local whitening apply", "dspk.spatial_filter(W_local, x), one-shot on a new W "
                "every call (dense product on first sight; 21 samples interleaved with the "
                "peer's)", statistics.median(pair["one"]), 2 * x.nbytes)
            add("local whitening apply", "peer dense xp.matmul(W_local, x), interleaved with "
                "the row above", statistics.median(pair["peer"]), 2 * x.nbytes)
            add("local whitening apply", "peer dense xp.matmul(W_local, x) (cuBLAS/BLAS)",
                clock.median_ms(lambda: xp.matmul(w32, x)), 2 * x.nbytes)
            if torch is not None:
                tw_, tx_ = (torch.as_tensor(v, device="cuda" if gpu else "cpu")
                            for v in (w32, x))
                add("local whitening apply", "peer dense torch.matmul(W_local, x)",
                    clock.median_ms(lambda: torch.matmul(tw_, tx_)), 2 * x.nbytes)
            for name, impl in f_loc.implementations(x).items():
                add("local whitening apply", f"candidate {name}",
                    clock.median_ms(impl), 2 * x.nbytes)
            if not gpu:
                add("local whitening apply", f"dspk.SpatialFilter(W_local)(x), CPU time of "
                    f"the call ({f_loc.chosen})", cpu_time(lambda: f_loc(x)))
            taps = dspk.highpass_taps(30000.0)

            def car_hp():
                return dspk.fir_filter(dspk.common_reference(x, "median"), taps)

            add("median CAR + high-pass", f"dspk.common_reference + fir_filter ({len(taps)} taps)",
                clock.median_ms(car_hp, 5), 4 * x.nbytes)
            add("median CAR", "dspk.common_reference(x, 'median')",
                clock.median_ms(lambda: dspk.common_reference(x, "median"), 5), 2 * x.nbytes,
                note=f"CPU time {cpu_time(lambda: dspk.common_reference(x, 'median')):.1f} ms"
                if not gpu else "")
            add("high-pass", f"dspk.fir_filter ({len(taps)} taps)",
                clock.median_ms(lambda: dspk.fir_filter(x, taps), 5),
                2 * x.nbytes, note=f"CPU time {cpu_time(lambda: dspk.fir_filter(x, taps)):.1f} ms"
                if not gpu else "")
            fir_candidate_rows(add, clock, xp, x, taps[::-1].copy()[None], "high-pass",
                               2 * x.nbytes, notes)
            from scipy.signal import butter

            if gpu:
                from cupyx.scipy import signal as xs
            else:
                from scipy import signal as xs
            sos = xp.asarray(butter(3, 300, btype="highpass", fs=30000.0, output="sos"))
            add("high-pass", "peer sosfiltfilt (Butterworth 3, KS4's filter)",
                clock.median_ms(lambda: xs.sosfiltfilt(sos, x, axis=1), 3), 2 * x.nbytes)
            from dspk.detect import default_templates

            bank = default_templates(30000.0)                  # detection's bank: 6 x 61 taps
            ref_bank = fir_reference(xh[:4], bank)
            err = float(np.abs(to_numpy(dspk.fir_bank(x, bank))[:4] - ref_bank).max()
                        / np.abs(ref_bank).max())
            add("fir_bank 6x61", "dspk.fir_bank (default_templates)",
                clock.median_ms(lambda: dspk.fir_bank(x, bank), 5),
                x.nbytes * 7, err, note=f"CPU time {cpu_time(lambda: dspk.fir_bank(x, bank)):.1f}"
                f" ms; {2 * C * T * 6 * 61 / 1e9:.1f} GFLOP direct" if not gpu else "")
            fir_candidate_rows(add, clock, xp, x, bank, "fir_bank 6x61", x.nbytes * 7, notes)
            if torch is not None:
                tb = torch.as_tensor(bank, device="cuda" if gpu else "cpu")
                tx = torch.as_tensor(x, device="cuda" if gpu else "cpu")
                weight = tb.repeat(C, 1)[:, None, :]
                add("fir_bank 6x61", "peer torch conv1d depthwise", clock.median_ms(
                    lambda: torch.nn.functional.conv1d(tx[None], weight, padding=30, groups=C),
                    3), x.nbytes * 7)
    clips = xp.asarray(np.random.default_rng(1).standard_normal((100000 if not small else 10000,
                                                                  61)).astype(np.float32))
    p = dspk.PCA(6).fit(clips)
    dev = "cuda" if gpu else "cpu"
    add("PCA transform 61->6", "dspk.PCA.transform", clock.median_ms(lambda: p.transform(clips)),
        clips.nbytes)
    mu, comps = p.mean_, p.components_
    add("PCA transform 61->6", "peer (x - mean) @ W.T (CuPy/NumPy)",
        clock.median_ms(lambda: (clips - mu[None]) @ comps.T), clips.nbytes)
    if torch is not None:
        tc, tm, tw = (torch.as_tensor(v, device=dev) for v in (clips, mu, comps))
        add("PCA transform 61->6", "peer torch (x - mean) @ W.T",
            clock.median_ms(lambda: (tc - tm[None]) @ tw.T), clips.nbytes)
    npts = 20000 if gpu and not small else 4000
    a = xp.asarray(np.random.default_rng(2).standard_normal((npts, 16)).astype(np.float32))
    case = f"pairwise_sqdist {npts}x{npts}x16"
    add(case, "dspk.pairwise_sqdist", clock.median_ms(lambda: dspk.pairwise_sqdist(a, a), 3),
        npts * npts * 4)
    add(case, "peer ‖a‖² + ‖b‖² − 2abᵀ, clamped (CuPy/NumPy expression)", clock.median_ms(
        lambda: xp.maximum((a * a).sum(1)[:, None] + (a * a).sum(1)[None, :] - 2 * (a @ a.T),
                           0), 3), npts * npts * 4)
    if torch is not None:
        ta = torch.as_tensor(a, device=dev)
        add(case, "peer torch.cdist(a, a) ** 2",
            clock.median_ms(lambda: torch.cdist(ta, ta) ** 2, 3), npts * npts * 4)
    return rows, notes, {"copy_Bps": bw}


def fir_reference(x, bank):
    """[C, k, n] float64 correlation (scipy, float64) of the first rows of x with the bank."""
    from scipy import signal

    k, t = bank.shape
    out = np.zeros((x.shape[0], k, x.shape[1]))
    for c in range(x.shape[0]):
        for i in range(k):
            full = signal.correlate(x[c].astype(np.float64), bank[i], mode="full")
            out[c, i] = full[t - 1 - t // 2:t - 1 - t // 2 + x.shape[1]]
    return out


def fir_candidate_rows(add, clock, xp, x, weights, case, nbytes, notes):
    """One row per implementation the tuner chooses among for this filter (where the dspk
    under test exposes them: `dspk.ops.fir.bank_implementations`)."""
    try:
        from dspk.ops.fir import bank_implementations
    except ImportError:
        notes.append(f"{case}: this dspk has no bank_implementations (candidates not timed)")
        return
    for name, impl in bank_implementations(xp, x, weights).items():
        add(case, f"candidate {name}", clock.median_ms(impl, 5), nbytes)


def cpu_candidate_rows(add, clock, x16, case, notes):
    """The CPU's exact integer candidates of X·Xᵀ, each run alone on the product."""
    import importlib

    from dspk.linalg import candidates_int

    engine = importlib.import_module("dspk.linalg.matmul")
    p, _ = engine.as_problem(x16, x16.T, None, allowed=candidates_int.INT_DTYPES,
                             result_dtype=np.int64)
    ref = None
    for c in engine.current_engine().tuner.candidates(False, "i"):
        reason = c.unavailable(p)
        if reason is not None:
            notes.append(f"{case}: candidate {c.name} unavailable: {reason}")
            continue
        c.run(p)
        got = p.out.to_array().copy()
        ref = got if ref is None else ref
        add(case, f"int16 X·Xᵀ candidate {c.name}", clock.median_ms(lambda: c.run(p), 5),
            x16.nbytes, note="bit-identical to the first" if np.array_equal(got, ref)
            else "DIFFERS from the first")


def markdown(rows, notes, backend, env, copy_Bps):
    head = heading("bench_ops", backend, env, ["case", "implementation", "median ms",
                                               "of copy ceiling", "error", "target ms", "note"])
    lines = head[:4] + [f"Copy ceiling measured: {copy_Bps / 1e9:.0f} GB/s (read + write).",
                        ""] + head[4:]
    for r in rows:
        tgt = TARGETS_GPU.get(r["case"]) if backend == "gpu" else None
        frac = "-" if r["frac_bw"] is None else f"{100 * r['frac_bw']:.0f}%"
        err = "-" if r["err"] is None else f"{r['err']:.1e}"
        lines.append(f"| {r['case']} | {r['impl']} | {r['ms']:.4f} | {frac} | {err} | "
                     f"{tgt if tgt else '-'} | {r['note']} |")
    return finish(lines, notes)


if __name__ == "__main__":
    import argparse

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--samples", type=int, default=None)
    known, rest = pre.parse_known_args()
    SAMPLES = known.samples
    bench_main("bench_ops", __doc__, run, markdown, rest)
