#!/usr/bin/env python3
"""Where `whitening_matrix`'s local form spends its time (384 channels, 32 neighbours), with
NumPy and (where CuPy works) CuPy input, and the eigendecompositions alone: one thread, the
BLAS threads in blocks (what `_zca` does), and cuSOLVER's batched Jacobi (for comparison).

    python benchmarks/profiles/profile_whitening.py [--repeats N]
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

from dspk.linalg.threads import blas_threads, parallel_blocks, single_threaded_blas  # noqa: E402
from dspk.ops import covariance, neighbors, whitening_matrix  # noqa: E402
from dspk.ops.spatial import EIGH_BLOCK  # noqa: E402


def best(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times), 1e3 * float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    n, k = 384, 32
    geom = np.c_[np.tile([16.0, 48.0, 0.0, 32.0], n // 4), 20.0 * (np.arange(n) // 2)]
    x = rng.standard_normal((n, 30000)).astype(np.float32)
    cov = covariance(x)
    print(f"BLAS threads: {blas_threads()}")
    rows = [("whitening_matrix local, NumPy", best(
        lambda: whitening_matrix(cov, geometry_um=geom, n_neighbors=k), a.repeats))]
    rows.append(("neighbors()", best(lambda: neighbors(geom, k), a.repeats)))
    hoods = np.array(neighbors(geom, k))
    c64 = cov.astype(np.float64)
    sub = c64[hoods[:, :, None], hoods[:, None, :]]
    rows.append(("gather [n, k, k]", best(lambda: c64[hoods[:, :, None], hoods[:, None, :]],
                                          a.repeats)))

    def one_thread():
        with single_threaded_blas():
            np.linalg.eigh(sub)
    rows.append(("eigh stack, one thread", best(one_thread, a.repeats)))
    blocks = [sub[i:i + EIGH_BLOCK] for i in range(0, n, EIGH_BLOCK)]
    rows.append((f"eigh in blocks of {EIGH_BLOCK}, {blas_threads()} threads",
                 best(lambda: parallel_blocks(np.linalg.eigh, blocks), a.repeats)))
    try:
        import cupy as cp
        cov_d, geom_d = cp.asarray(cov), cp.asarray(geom)
        rows.append(("whitening_matrix local, CuPy in/out", best(
            lambda: (whitening_matrix(cov_d, geometry_um=geom_d, n_neighbors=k),
                     cp.cuda.Device().synchronize()), a.repeats)))
        sub_d = cp.asarray(sub)
        rows.append(("cupy.linalg.eigh stack (syevj batched)", best(
            lambda: (cp.linalg.eigh(sub_d), cp.cuda.Device().synchronize()), a.repeats)))
        rows.append(("H2D + D2H of the stack", best(
            lambda: cp.asarray(sub).get(), a.repeats)))
    except Exception as exc:  # noqa: BLE001 (CuPy absent or no device: the host rows stand)
        print(f"CuPy rows skipped: {type(exc).__name__}: {exc}")
    print("| step | best ms | median ms |\n|---|---|---|")
    for name, (b, m) in rows:
        print(f"| {name} | {b:.2f} | {m:.2f} |")


if __name__ == "__main__":
    main()
