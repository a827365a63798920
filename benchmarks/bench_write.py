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
dspk's writer writes. ``--backend`` only names the run (the writes are the host's either way:
a GPU job's output reaches the file from pinned host memory as a CPU job's does).

    python benchmarks/bench_write.py [--gb 2.76] [--dir DIR] [--threads 4]
                                     [--backend cpu|gpu] [--out DIR|FILE.md]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, out_files  # noqa: E402 (benchmarks/)

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
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu",
                    help="names the run only: the writes are the host's")
    ap.add_argument("--out", default=None, help="folder for bench_write-<backend>.{md,json} "
                    "(or the table's FILE.md, its JSON beside it)")
    args = ap.parse_args(argv)
    n_blocks = max(1, int(round(args.gb * 1e9 / BLOCK)))
    gb = n_blocks * BLOCK / 1e9
    block = np.random.default_rng(0).standard_normal(BLOCK // 4).astype(np.float32)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        where = (f"{n_blocks} blocks of {BLOCK / 1e6:.1f} MB = {gb:.2f} GB into {d} "
                 f"({file_system(d)}); {os.cpu_count()} cores; vm.dirty_ratio "
                 f"{vm('dirty_ratio')}, dirty_background_ratio {vm('dirty_background_ratio')}, "
                 f"dirty_bytes {vm('dirty_bytes')}")
        print(f"# bench_write: {where}", flush=True)
        methods = (("pwrite, 1 thread", lambda p: run_pwrite(p, block, n_blocks, 1)),
                   (f"pwrite, {args.threads} threads",
                    lambda p: run_pwrite(p, block, n_blocks, args.threads)),
                   (f"mmap, {args.threads} threads",
                    lambda p: run_mmap(p, block, n_blocks, args.threads)),
                   ("O_DIRECT, 1 thread", lambda p: run_direct(p, block, n_blocks)))
        runs = {name: [] for name, _ in methods}
        # two rounds, the methods in turn: the first file written on a machine pays for
        # the page cache it takes from others (each method's rounds are printed)
        for _ in range(2):
            for name, fn in methods:
                path = d / "out.bin"
                dt = fn(path)
                t0 = time.perf_counter()
                if path.exists():
                    path.unlink()
                runs[name].append((dt, time.perf_counter() - t0))
                time.sleep(0.5)
    case = f"{gb:.2f} GB into one new file"
    rows, notes = [], [where, "wall_s: the second round (the first pays for the page cache)."]
    lines = [f"# bench_write — {args.backend}", "",
             "Environment: " + ", ".join(f"{k}={v}" for k, v in environment(False).items()),
             "", "| method | round 1 s | round 2 s | GB/s (2) | unlink s (1, 2) |",
             "|---|---|---|---|---|"]
    for name, rs in runs.items():
        if any(dt is None for dt, _ in rs):
            lines.append(f"| {name} | n/a | n/a | | |")
            notes.append(f"{name}: not available on this file system")
            continue
        (d1, u1), (d2, u2) = rs
        lines.append(f"| {name} | {d1:.3f} | {d2:.3f} | {gb / d2:.2f} | {u1:.3f}, {u2:.3f} |")
        rows.append(dict(case=case, impl=name, wall_s=d2, round1_s=d1, gb_per_s=gb / d2,
                         unlink_s=[u1, u2]))
    md = "\n".join(lines + ["", "## Notes", ""] + [f"- {n}" for n in notes]) + "\n"
    print(md)
    sys.stdout.flush()
    if args.out:
        md_path, json_path = out_files(args.out, "bench_write", args.backend)
        md_path.write_text(md)
        json_path.write_text(json.dumps(dict(env=environment(False), rows=rows, notes=notes),
                                        indent=1))


if __name__ == "__main__":
    main()
