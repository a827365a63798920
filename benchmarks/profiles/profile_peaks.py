#!/usr/bin/env python3
"""Where `TemplateBank.peaks` spends its time on the GPU (bench_match's 4096² image, threshold
0.9, min_distance 4): the candidate-list kernel alone, the hash-table peak check, the sorting
path's sort and check, and the whole call; with the number of candidates. Median of CUDA-event
timings.

    python benchmarks/profiles/profile_peaks.py [N ...]     (default: 32 128)
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import cupy as cp  # noqa: E402

from bench_match import coins_or_none, cut_templates, large_image  # noqa: E402
from dspk.match import PEAK_KERNELS, TemplateBank  # noqa: E402
from dspk.kernels import kernel  # noqa: E402


def timed(fn, reps=15):
    fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(ts))


def main() -> None:
    img = cp.asarray(large_image(4096, coins_or_none()))
    thr, d = 0.9, 4
    print("| N | part | median ms |\n|---|---|---|")
    for n in [int(v) for v in sys.argv[1:]] or [32, 128]:
        tb = TemplateBank(cp.asarray(cut_templates(img.get(), n, seed=n)))
        peaks = tb.peaks(img, thr, d)
        cap = tb._cache.get("peak_capacity", 1 << 20)
        cand, insert, check, size = tb._peak_launches(img, thr, cap, d)
        stream = cp.cuda.get_current_stream().ptr
        count = cp.zeros(2, dtype=np.uint32)
        keys = cp.empty(cap, dtype=np.int64)
        scores = cp.empty(cap, dtype=np.float32)
        tkey = cp.empty(size, dtype=np.uint64)
        tscore = cp.empty(size, dtype=np.float32)
        pk = cp.empty(cap, dtype=np.int64)
        ps = cp.empty(cap, dtype=np.float32)

        def kernel_only():
            count.fill(0)
            cand(stream, img.data.ptr, count.data.ptr, keys.data.ptr, scores.data.ptr)

        t_kernel = timed(kernel_only)
        found = int(count[0].get())

        def hashed():
            count[1:].fill(0)
            tkey.fill(np.uint64(2**64 - 1))
            insert(stream, keys.data.ptr, scores.data.ptr, count.data.ptr, tkey.data.ptr,
                   tscore.data.ptr)
            check(stream, keys.data.ptr, scores.data.ptr, count.data.ptr, tkey.data.ptr,
                  tscore.data.ptr, pk.data.ptr, ps.data.ptr)

        t_hash = timed(hashed)
        k, s = keys[:found], scores[:found]

        def sort():
            o = cp.argsort(k)
            return k[o], s[o]

        t_sort = timed(sort)
        ks, ss = sort()
        fn = kernel("ncc.cu", PEAK_KERNELS[0])     # ncc_peak_check, as TemplateBank.peaks
        ho, wo = img.shape[0] - 15, img.shape[1] - 15

        def sorted_check():
            count[1:].fill(0)
            fn((-(-found // 256),), (256,), (ks, ss, np.int32(found), np.int32(ho),
                                             np.int32(wo), np.int32(d), count[1:], pk, ps))

        t_check = timed(sorted_check)
        t_maps = timed(lambda: tb._ncc_bank_mma(img))
        t_all = timed(lambda: tb.peaks(img, thr, d))
        for part, t in (("candidate kernel (no maps)", t_kernel),
                        (f"hash-table check of {found} candidates (table memset, insert, "
                         f"check)", t_hash),
                        ("(sorting path) argsort + 2 gathers", t_sort),
                        ("(sorting path) binary-search check", t_check),
                        ("maps kernel, for scale", t_maps),
                        (f"TemplateBank.peaks ({len(peaks)} peaks)", t_all)):
            print(f"| {n} | {part} | {t:.4f} |")


if __name__ == "__main__":
    main()
