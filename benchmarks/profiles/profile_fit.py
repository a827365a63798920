#!/usr/bin/env python3
"""Where a pipeline's fit goes: cProfile of `Pipeline.fit` (the second fit in the process, so
imports, plans and tuning are out) of IBL's order with local whitening on a 384-channel int16
HDF5 recording (`bench_ibl_chain.make_recording`), the 25 functions with the most cumulative
time.

    python benchmarks/profiles/profile_fit.py [--backend cpu|gpu] [--seconds 60]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import dspk  # noqa: E402
from bench_ibl_chain import make_recording  # noqa: E402 (benchmarks/)
from dspk.pipeline.registry import preset  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.h5"
        make_recording(src, args.seconds)
        rec = dspk.open_recording(src)
        opts = dict(preset("ibl"), whiten="local", backend=args.backend)
        dspk.Pipeline.from_options(**opts).fit(rec)
        pipe = dspk.Pipeline.from_options(**opts)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.runcall(pipe.fit, rec)
        print(f"fit: {time.perf_counter() - t0:.3f} s ({args.backend})")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        rec.close()


if __name__ == "__main__":
    main()
