#!/usr/bin/env python3
"""The int16 packing pass of the exact integer product, against the memory floor: the
contiguous-rows kernel with 1, 2, 4 and 8 16-byte loads in flight per thread (with and without
the row sums), the general strided kernel, and a plain device copy of the same bytes (int16 in,
two int8 planes out: 2 bytes read and 2 written per value). Each variant's planes and sums are
checked equal to the 1-load kernel's. Median of 20 back-to-back calls (CUDA events), inputs
rotated over 4 copies so that no call finds its operand in L2.

    python benchmarks/profile_intpack.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupy as cp  # noqa: E402

from dspk.kernels import kernel  # noqa: E402
from dspk.linalg import candidates_int as ci  # noqa: E402


def timed(fns, reps=20) -> float:
    """Median ms of ``reps`` calls cycling through ``fns`` (one per operand copy)."""
    for f in fns:
        f()
    cp.cuda.Device().synchronize()
    times = []
    for i in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fns[i % len(fns)]()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(times))


def main() -> None:
    c, k = 384, 60000
    rng = np.random.default_rng(0)
    xs = [cp.asarray(rng.integers(-32768, 32767, (c, k), dtype=np.int16)) for _ in range(4)]
    mp, kp = ci._pad16(c), ci._pad16(k)
    gb = (xs[0].nbytes + 2 * mp * kp) / 1e9
    print(f"| variant | ms | GB/s ({gb * 1e3:.0f} MB moved) |\n|---|---|---|")

    def row(name, ms):
        print(f"| {name} | {ms:.4f} | {gb / ms * 1e3:.0f} |")

    outs = {}

    def variant(expr, per, rows_kernel, sums):
        fn = kernel("intpack.cu", expr)
        qs = [cp.zeros(2 * mp * kp, np.int8) for _ in xs]
        rs = [cp.zeros(c, np.uint64) for _ in xs]
        strides = (np.int64(k),) if rows_kernel else (np.int64(k), np.int64(1))

        def make(x, q, r):
            def go():
                if sums:
                    r.fill(0)
                fn((-(-kp // (256 * per)), mp), (256,),
                   (x, np.int64(0), *strides, np.int32(1), np.int32(c), np.int32(k),
                    np.int32(mp), np.int32(kp), q, r if sums else 0))
            return go
        fns = [make(x, q, r) for x, q, r in zip(xs, qs, rs)]
        ms = timed(fns)
        fns[0]()
        outs[expr] = (qs[0].copy(), rs[0].copy() if sums else None)
        return ms

    for u in (1, 2, 4, 8):
        for sums in (True, False):
            expr = f"pack_planes_rows<short, false, {'true' if sums else 'false'}, {u}>"
            row(f"rows kernel, {u} load(s) per thread{'' if sums else ', no row sums'}",
                variant(expr, u * 8, True, sums))
    row("general strided kernel", variant("pack_planes<short, false, true>", 4, False, True))
    ref_q, ref_r = outs["pack_planes_rows<short, false, true, 1>"]
    for expr, (q, r) in outs.items():
        same = bool((q == ref_q).all()) and (r is None or bool((r == ref_r).all()))
        if not same:
            print(f"| {expr} | DIFFERS from the 1-load kernel | |")
    dsts = [cp.empty((c, k), np.int16) for _ in xs]
    row("device copy of the same bytes (floor)",
        timed([lambda s=s, d=d: cp.copyto(d, s) for s, d in zip(xs, dsts)]))
    print(f"\nPACK_LOADS = {ci.PACK_LOADS}")


if __name__ == "__main__":
    main()
