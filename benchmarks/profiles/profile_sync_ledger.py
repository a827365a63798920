#!/usr/bin/env python3
"""The events pass of a SpikeGLX .bin job (issue 47): the sync words read again over the
whole file (`read_sync`, what a job did before `dspk.io.sync.SyncLedger`) against the edges
kept as the job's own reads went, the file cold (its pages evicted with posix_fadvise after
the job's pass, as an hour's file is by the end of its job) and warm (in the page cache).

    python benchmarks/profiles/profile_sync_ledger.py --seconds 120 --work /tmp/evb

Prints Markdown rows: cache | events | job's read pass s | events pass s | edges.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

from dspk.io import open_recording, sync_events  # noqa: E402
from tests.recordings import np1_meta  # noqa: E402

FS = 30000


def write_bin(path: Path, n: int) -> None:
    """385 int16 columns (384 channels of noise, the SY word's bit 6 toggling every 0.5 s)."""
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for a in range(0, n, 10 * FS):
            b = min(n, a + 10 * FS)
            x = rng.integers(-200, 200, (b - a, 385), dtype=np.int16)
            x[:, 384] = (((np.arange(a, b) // (FS // 2)) % 2) << 6).astype(np.int16)
            x.tofile(f)
    meta = dict(np1_meta(range(384)))
    meta["fileSizeBytes"] = str(n * 385 * 2)
    meta["fileTimeSecs"] = str(n / FS)
    with open(path.with_suffix(".meta"), "w", newline="\r\n") as f:
        f.write("".join(f"{k}={v}\n" for k, v in sorted(meta.items())))


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def job_reads(rec, chunk: int = FS, halo: int = 300) -> float:
    """A job's pass: 1-s blocks with their halos, as `dspk.pipeline.stream` reads them."""
    t0 = time.perf_counter()
    for s0 in range(0, rec.n_samples, chunk):
        rec.read_native(max(0, s0 - halo), min(rec.n_samples, s0 + chunk + halo))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/dspk-sync-ledger"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    n = int(FS * args.seconds)
    path = args.work / "run_g0_t0.imec0.ap.bin"
    if not path.exists() or path.stat().st_size != n * 385 * 2:
        write_bin(path, n)
    print(f"{path.name}: 385 x {n} int16, {path.stat().st_size / 1e9:.2f} GB\n")
    print("| cache | events | job's read pass s | events pass s | edges |")
    print("|---|---|---|---|---|")
    for cold in (True, False):
        for kept in (False, True):
            if cold:
                evict(path)
            with open_recording(path) as rec:
                if not kept:
                    rec._sync_ledger = None            # before: nothing kept
                t_read = job_reads(rec)
                if kept:
                    t0 = time.perf_counter()
                    ev = sync_events(rec)
                    t_ev = time.perf_counter() - t0
            if not kept:
                if cold:
                    evict(path)
                with open_recording(path) as rec:
                    rec._sync_ledger = None
                    t0 = time.perf_counter()
                    ev = sync_events(rec)
                    t_ev = time.perf_counter() - t0
            what = "kept as read (SyncLedger)" if kept else "read_sync over the file (before)"
            print(f"| {'cold' if cold else 'warm'} | {what} | {t_read:.2f} | {t_ev:.3f} "
                  f"| {len(ev)} |", flush=True)


if __name__ == "__main__":
    main()
