#!/usr/bin/env python3
"""Full NCC maps (4096² uint8, 16x16 templates, N = 32 and 128, prepared `TemplateBank`) with
the tensor-core kernel built several ways (ncc.cu's macros): the default; the raw patch by
plain loads instead of cp.async (NCC_ASYNC_PATCH 0); plain stores instead of evict-first
(NCC_STREAMING_STORES 0); one plain store per output instead of the sector-filling lane
rotation (NCC_SECTOR_STORES 0). The builds alternate three times in one process, median of
15 calls each (CUDA events), maps compared bit for bit, the tuner's choice of variant shown.
Earlier builds (staged stores, paired A loads, the previous prologue) and their figures:
benchmarks/results/profile_ncc_store-gpu-h200-2026-12-04c.md.

    python benchmarks/profile_ncc_store.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cupy as cp  # noqa: E402

import dspk.kernels as kernels  # noqa: E402
from common import Clock  # noqa: E402
from dspk.linalg.engine import current_engine  # noqa: E402
from dspk.match import TemplateBank  # noqa: E402

_plain_source = kernels._source


BUILDS = {"default": "",
          "plain patch loads": "#define NCC_ASYNC_PATCH 0\n",
          "plain stores (not evict-first)": "#define NCC_STREAMING_STORES 0\n",
          "one store per output": "#define NCC_SECTOR_STORES 0\n"}


def build(defines: str) -> None:
    """Make every later kernel() compile ncc.cu with ``defines`` in front."""
    def source(filename: str) -> str:
        text = _plain_source(filename)
        if filename == "ncc.cu":
            text = defines + text
        return text
    kernels._source = source
    kernels._function.cache_clear()
    current_engine().forget()


def main() -> None:
    rng = np.random.default_rng(0)
    img = cp.asarray(rng.integers(0, 256, (4096, 4096), dtype=np.uint8))
    names = list(BUILDS)
    print("| N | round | " + " | ".join(f"{b} ms" for b in names) + " | same maps | chosen |")
    print("|---|---|" + "---|" * len(names) + "---|---|")
    for n in (32, 128):
        y = rng.integers(0, 4096 - 16, n)
        x = rng.integers(0, 4096 - 16, n)
        tpl = cp.asarray(np.stack([cp.asnumpy(img[a:a + 16, b:b + 16]) for a, b in zip(y, x)]))
        for rnd in range(3):
            res = {}
            for b in names:
                build(BUILDS[b])
                tb = TemplateBank(tpl)
                ms = Clock(gpu=True).median_ms(lambda: tb.ncc(img), samples=15)
                res[b] = (ms, tb.ncc(img), ",".join(sorted(tb._live)))
            same = all(bool(cp.array_equal(res[names[0]][1], res[b][1])) for b in names)
            print(f"| {n} | {rnd} | " + " | ".join(f"{res[b][0]:.4f}" for b in names)
                  + f" | {same} | {' / '.join(res[b][2] for b in names)} |")
            del res


if __name__ == "__main__":
    main()
