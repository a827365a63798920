"""Timing shared by the benchmarks: one call per sample, CUDA events on the GPU, perf_counter on
the CPU, median after a warm-up call. (bench_linalg has its own, finer clock: back-to-back calls,
rotation beyond L2, device-only time behind a spin kernel.)"""

from __future__ import annotations

import statistics
import time


class Clock:
    def __init__(self, gpu: bool):
        self.gpu = gpu
        if gpu:
            import cupy as cp

            self.cp = cp

    def median_ms(self, fn, samples: int = 7) -> float:
        fn()
        times = []
        for _ in range(samples):
            if self.gpu:
                s, e = self.cp.cuda.Event(), self.cp.cuda.Event()
                s.record()
                fn()
                e.record()
                e.synchronize()
                times.append(self.cp.cuda.get_elapsed_time(s, e))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
