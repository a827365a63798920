#!/usr/bin/env python3
"""The CPU's per-batch calls of issue 32 (1-s batches: 384 x 30 000) on idle cores and with one
busy-looping process on one of them: how each implementation copes with sharing the cores (the
common case on a shared machine, and inside a job, whose reader and writer threads compete with
the computation).

Each call is made once (the tuner chooses, in a fresh `$DSPK_CACHE_DIR` unless one is set),
then timed warm: median of --repeats calls, idle, then with ``python -c "while True: pass"``
running. Prints one JSON line (``RESULT {...}``) and a Markdown table.

    PYTHONPATH=$PWD python benchmarks/profiles/profile_cpu_shared.py [--repeats 7]
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

os.environ.setdefault("DSPK_CACHE_DIR", tempfile.mkdtemp(prefix="dspk-shared-"))

import dspk  # noqa: E402
from bench_pipeline import geometry  # noqa: E402 (benchmarks/)
from dspk.detect import default_templates  # noqa: E402


def cases() -> dict:
    """The calls, on correlated traces of a Neuropixels-like geometry."""
    rng = np.random.default_rng(0)
    geom = geometry()
    d = np.sqrt(((geom[:, None] - geom[None]) ** 2).sum(-1))
    mix = np.linalg.cholesky(np.exp(-d / 40.0) + 1e-6 * np.eye(len(geom))).T.astype(np.float32)
    x = (rng.standard_normal((30000, len(geom)), dtype=np.float32) @ mix).T.copy() * 20
    xi = np.clip(np.rint(x), -32768, 32767).astype(np.int16)
    w = dspk.whitening_matrix(dspk.covariance(x), geometry_um=geom, n_neighbors=32)
    f = dspk.SpatialFilter(w)
    bank = default_templates(30000.0)
    taps = dspk.highpass_taps(30000.0)
    return {"covariance float32": lambda: dspk.covariance(x),
            "covariance int16 (exact)": lambda: dspk.covariance(xi),
            "fir_bank default_templates": lambda: dspk.fir_bank(x, bank),
            "fir_filter high-pass (263 taps)": lambda: dspk.fir_filter(x, taps),
            "common_reference median": lambda: dspk.common_reference(x, "median"),
            "SpatialFilter(local W)(x)": lambda: f(x)}


def median_ms(fn, repeats: int) -> float:
    got = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        got.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    calls = cases()
    for fn in calls.values():
        fn()                                     # tuned, warm
    res = {}
    for label in ("idle", "one core busy"):
        busy = None
        if label != "idle":
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(0.5)
        try:
            res[label] = {k: median_ms(fn, args.repeats) for k, fn in calls.items()}
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    print("RESULT " + json.dumps(res))
    print("| call | idle ms | one core busy ms |\n|---|---|---|")
    for k in calls:
        print(f"| {k} | {res['idle'][k]:.1f} | {res['one core busy'][k]:.1f} |")


if __name__ == "__main__":
    main()
