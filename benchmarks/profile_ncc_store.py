#!/usr/bin/env python3
"""Full NCC maps (4096² uint8, 16x16 templates, N = 32 and 128, prepared `TemplateBank`) with
the kernel's plain stores against evict-first stores (NCC_STREAMING_STORES in ncc.cu), the
two builds alternated three times in one process; median of 15 calls each (CUDA events).

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


def build(streaming: int) -> None:
    """Make every later kernel() compile ncc.cu with NCC_STREAMING_STORES = ``streaming``."""
    def source(filename: str) -> str:
        text = _plain_source(filename)
        if filename == "ncc.cu":
            text = f"#define NCC_STREAMING_STORES {streaming}\n" + text
        return text
    kernels._source = source
    kernels._function.cache_clear()
    current_engine().forget()


def main() -> None:
    rng = np.random.default_rng(0)
    img = cp.asarray(rng.integers(0, 256, (4096, 4096), dtype=np.uint8))
    print("| N | round | plain stores ms | evict-first stores ms | same maps |\n|---|---|---|---|---|")
    for n in (32, 128):
        y = rng.integers(0, 4096 - 16, n)
        x = rng.integers(0, 4096 - 16, n)
        tpl = cp.asarray(np.stack([cp.asnumpy(img[a:a + 16, b:b + 16]) for a, b in zip(y, x)]))
        for rnd in range(3):
            res = {}
            for streaming in (0, 1):
                build(streaming)
                tb = TemplateBank(tpl)
                ms = Clock(gpu=True).median_ms(lambda: tb.ncc(img), samples=15)
                res[streaming] = (ms, tb.ncc(img))
            same = bool(cp.array_equal(res[0][1], res[1][1]))
            print(f"| {n} | {rnd} | {res[0][0]:.4f} | {res[1][0]:.4f} | {same} |")
            del res


if __name__ == "__main__":
    main()
