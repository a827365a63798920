#!/usr/bin/env python3
"""Interleaved in-process A/B of the CPU detection path (issue 43 item 4): `detect_spikes` on
bench_detect's batches (384 channels, Neuropixels 1 and 4 shanks, ~750 spikes/s), with this
tree's `_cpu_spikes`/`_cpu_noise` against a reference copy of dspk/detect/spikes_cpu.py (e.g.
main's: ``git show main:dspk/detect/spikes_cpu.py > /tmp/ref_spikes_cpu.py``), alternated
call by call so both see the same load; wall and process CPU medians, whether the spikes (and
the template noise) are identical to the bit, recall / precision against the injected spikes.

    DSPK_REF_SPIKES_CPU=/tmp/ref_spikes_cpu.py SECS=2 REPS=5 \
        python benchmarks/profiles/profile_detect_cpu_ab.py

Prints Markdown rows: case | noise | ref ms | ref x RT | ref CPU ms | new ms | new x RT |
new CPU ms | CPU ratio | identical | spikes | recall / precision | load average.
"""
import importlib.util
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import dspk.detect.spikes as det  # noqa: E402
from bench_detect import FS, batch, multishank, np1, score  # noqa: E402
from dspk.detect import detect_spikes, template_noise  # noqa: E402


def load_reference():
    """The reference copy of spikes_cpu.py, imported under a name of its own."""
    path = os.environ.get("DSPK_REF_SPIKES_CPU", "/tmp/det/ref_spikes_cpu.py")
    spec = importlib.util.spec_from_file_location("dspk.detect._ref_cpu", path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    return ref


def use(impl):
    det._cpu_spikes, det._cpu_noise = impl


def main():
    ref = load_reference()
    new = (det._cpu_spikes, det._cpu_noise)
    old = (ref._cpu_spikes, ref._cpu_noise)
    secs = float(os.environ.get("SECS", "2"))
    reps = int(os.environ.get("REPS", "5"))
    cases = [("np1 band", np1(), "band"), ("np1 white", np1(), "white"),
             ("4 shanks white", multishank(), "white")]
    if os.environ.get("ONE"):
        cases = cases[:1]
    for name, (geom, shanks), spectrum in cases:
        x, times = batch(geom, secs, spectrum=spectrum)
        res = {}
        for lab, impl in (("old", old), ("new", new)):
            use(impl)
            res[lab] = detect_spikes(x, geom, FS, shank_ids=shanks)
            res[lab + "n"] = template_noise(x, FS)
        same = (np.array_equal(res["old"], res["new"])
                and np.array_equal(res["oldn"].view(np.uint64), res["newn"].view(np.uint64)))
        rec = score(res["new"]["sample_index"], times, 12)
        sd = res["newn"]
        use(old)
        g_old = detect_spikes(x, geom, FS, shank_ids=shanks, noise=sd)
        use(new)
        g_new = detect_spikes(x, geom, FS, shank_ids=shanks, noise=sd)
        same = same and np.array_equal(g_old, g_new)
        loads = []
        for mode in ("measured", "given"):
            kw = {} if mode == "measured" else {"noise": sd}
            t = {"old": [], "new": []}
            cpu = {"old": [], "new": []}
            for _ in range(reps):
                for lab, impl in (("old", old), ("new", new)):
                    use(impl)
                    c0, t0 = time.process_time(), time.perf_counter()
                    detect_spikes(x, geom, FS, shank_ids=shanks, **kw)
                    t[lab].append(time.perf_counter() - t0)
                    cpu[lab].append(time.process_time() - c0)
                with open("/proc/loadavg") as f:
                    loads.append(float(f.read().split()[0]))
            mo, mn = np.median(t["old"]), np.median(t["new"])
            co, cn = np.median(cpu["old"]), np.median(cpu["new"])
            print(f"| {name} | noise {mode} | {mo * 1e3:.0f} | {secs / mo:.2f} | {co * 1e3:.0f} "
                  f"| {mn * 1e3:.0f} | {secs / mn:.2f} | {cn * 1e3:.0f} | {co / cn:.2f} "
                  f"| {'yes' if same else 'NO'} | {len(res['new'])} "
                  f"| {rec[0]:.3f} / {rec[1]:.3f} | {min(loads):.1f}-{max(loads):.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
