#!/usr/bin/env python3
"""How fast this machine takes a job's output: ``--gb`` of float32 blocks of a 384-channel
second (46 MB) written into one new file, as a job writes them, by:

- ``pwrite, 1 thread``: `dspk.io.rawio.RawDatasetWriter`'s way (os.pwrite, GIL released);
- ``pwrite, N threads``: each block cut in N parts written at once (one file: buffered
  writes to one inode may serialise in the kernel: this says whether they do);
- ``mmap, N threads``: the file mapped, each part copied in by NumPy (GIL released);
- ``O_DIRECT, 1 thread``: page-aligned blocks straight to the device, no page cache
  (where the file system takes O_DIRECT);

and the time to delete the written file (what replacing an existing output costs), the
file system, and the kernel's dirty-page limits. Not a dspk function: the numbers decide how
dspk's writer writes.

    python benchmarks/bench_write.py [--gb 2.76] [--dir DIR] [--threads 4]
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

BLOCK = 384 * 30000 * 4


def file_system(path: Path) -> str:
    best, kind = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fs = line.split()[:3]
            if str(path).startswith(mnt) and len(mnt) > len(best):
                best, kind = mnt, f"{fs} on {dev} at {mnt}"
    except OSError:
        pass
    return kind


def vm(name: str) -> str:
    try:
        return Path(f"/proc/sys/vm/{name}").read_text().strip()
    except OSError:
        return "?"


def pwrite_all(fd: int, view: memoryview, at: int) -> None:
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], at + done)


def parts(n: int, k: int) -> list:
    step = -(-n // k)
    step = -(-step // 4096) * 4096
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def run_pwrite(path: Path, block: np.ndarray, n_blocks: int, threads: int) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    view = memoryview(block).cast("B")
    spans = parts(len(view), threads)
    t0 = time.perf_counter()
    for b in range(n_blocks):
        at = b * len(view)
        if threads == 1:
            pwrite_all(fd, view, at)
        else:
            ts = [threading.Thread(target=pwrite_all, args=(fd, view[s0:s1], at + s0))
                  for s0, s1 in spans]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
    dt = time.perf_counter() - t0
    os.close(fd)
    return dt


def run_mmap(path: Path, block: np.ndarray, n_blocks: int, threads: int) -> float:
    size = block.nbytes * n_blocks
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)
    dst = np.frombuffer(mm, dtype=np.uint8)
    src = block.view(np.uint8).reshape(-1)
    spans = parts(len(src), threads)
    t0 = time.perf_counter()
    for b in range(n_blocks):
        at = b * len(src)
        ts = [threading.Thread(target=np.copyto, args=(dst[at + s0:at + s1], src[s0:s1]))
              for s0, s1 in spans]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    dt = time.perf_counter() - t0
    del dst
    mm.close()
    os.close(fd)
    return dt


def run_direct(path: Path, block: np.ndarray, n_blocks: int) -> float | None:
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644)
    except OSError:
        return None
    buf = mmap.mmap(-1, block.nbytes)              # page-aligned
    np.frombuffer(buf, np.uint8)[:] = block.view(np.uint8).reshape(-1)
    view = memoryview(buf)
    try:
        t0 = time.perf_counter()
        for b in range(n_blocks):
            pwrite_all(fd, view, b * block.nbytes)
        dt = time.perf_counter() - t0
    except OSError:
        dt = None
    finally:
        os.close(fd)
        view.release()
        buf.close()
    return dt


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.76)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args(argv)
    n_blocks = max(1, int(round(args.gb * 1e9 / BLOCK)))
    gb = n_blocks * BLOCK / 1e9
    block = np.random.default_rng(0).standard_normal(BLOCK // 4).astype(np.float32)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        print(f"# bench_write: {n_blocks} blocks of {BLOCK / 1e6:.1f} MB = {gb:.2f} GB into "
              f"{d} ({file_system(d)}); {os.cpu_count()} cores; vm.dirty_ratio "
              f"{vm('dirty_ratio')}, dirty_background_ratio {vm('dirty_background_ratio')}, "
              f"dirty_bytes {vm('dirty_bytes')}")
        methods = (("pwrite, 1 thread", lambda p: run_pwrite(p, block, n_blocks, 1)),
                   (f"pwrite, {args.threads} threads",
                    lambda p: run_pwrite(p, block, n_blocks, args.threads)),
                   (f"mmap, {args.threads} threads",
                    lambda p: run_mmap(p, block, n_blocks, args.threads)),
                   ("O_DIRECT, 1 thread", lambda p: run_direct(p, block, n_blocks)))
        rows = {name: [] for name, _ in methods}
        # two rounds, the methods in turn: the first file written on a machine pays for
        # the page cache it takes from others (each method's rounds are printed)
        for _ in range(2):
            for name, fn in methods:
                path = d / "out.bin"
                dt = fn(path)
                t0 = time.perf_counter()
                if path.exists():
                    path.unlink()
                rows[name].append((dt, time.perf_counter() - t0))
                time.sleep(0.5)
        print(f"{'method':24s} {'round 1 s':>9s} {'round 2 s':>9s} {'GB/s (2)':>8s} "
              f"{'unlink s (1, 2)':>16s}")
        for name, runs in rows.items():
            if any(dt is None for dt, _ in runs):
                print(f"{name:24s} {'n/a':>9s}")
                continue
            (d1, u1), (d2, u2) = runs
            print(f"{name:24s} {d1:9.3f} {d2:9.3f} {gb / d2:8.2f} {u1:8.3f} {u2:7.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
