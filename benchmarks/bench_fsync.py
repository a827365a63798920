"""What flushing a job's output to the disk costs (issue 45, item 7): the same CPU job into a
~1 GB HDF5 output with ``fsync=True`` (the default: the partial file and its folder flushed
before the rename, the folder again after it) and ``fsync=False`` (``--no-fsync``), in turn,
with the time spent in the flushes themselves. The job has no steps (the samples scaled to
float32 and written), so the flush's share is as large as a job makes it.

    python benchmarks/bench_fsync.py [--reps 3] [--dir DIR] [--channels 32] [--samples 8000000]

DIR (default: a temporary folder) is on the disk being measured; the input (int16, half the
output's size) and the output are deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

import dspk
from dspk.pipeline.outputs import partial as partial_mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--channels", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8_000_000)
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="bench_fsync-", dir=args.dir)
    c, n, fs = args.channels, args.samples, 30000.0
    raw, out = os.path.join(folder, "raw.bin"), os.path.join(folder, "out.h5")
    rng = np.random.default_rng(0)
    block = (rng.standard_normal((1_000_000, c)) * 30).astype(np.int16)
    with open(raw, "wb") as f:
        for s in range(0, n, len(block)):
            block[:min(len(block), n - s)].tofile(f)
    spent: list = []
    real = partial_mod.fsync_path

    def timed(path):
        t = time.perf_counter()
        real(path)
        spent.append(time.perf_counter() - t)

    partial_mod.fsync_path = timed
    print(f"{c} channels x {n} samples float32: {c * n * 4 / 1e9:.3f} GB out, in {folder}")
    print("| fsync | job s | in fsync s | flushes (s) |")
    print("|---|---|---|---|")
    try:
        for _ in range(args.reps):
            for fsync in (True, False):
                spent.clear()
                if os.path.exists(out):
                    os.remove(out)
                os.sync()
                p = dspk.Pipeline.from_options(highpass=None, reference="none",
                                               whiten="none", backend="cpu")
                with dspk.open_recording(raw, fs=fs, n_channels=c) as rec:
                    t = time.perf_counter()
                    p.run(rec, out, chunk_s=1.0, progress=False, fsync=fsync)
                    wall = time.perf_counter() - t
                print(f"| {fsync} | {wall:.2f} | {sum(spent):.2f} | "
                      f"{', '.join(f'{s:.3f}' for s in spent)} |", flush=True)
    finally:
        partial_mod.fsync_path = real
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
