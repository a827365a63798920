#!/usr/bin/env python3
"""The first call against the hundredth (issue 32): every public call of the API page, each in
a fresh process, first with empty tuner and kernel caches (a new machine: ``DSPK_CACHE_DIR``
and ``CUPY_CACHE_DIR`` empty), then again in another fresh process with the caches the first
one filled (the second run on that machine). Each process builds its inputs (not timed),
times the first call, then the median of three more.

Goals: on the CPU the first call at most 2x the warm median; on the GPU at most the warm
median + 0.3 s.

Inputs: 384 channels x 30 000 samples (1 s at 30 kHz) of float32 traces (int16 for the
integer products), a Neuropixels-1 geometry; detection on whitened-like unit-variance noise
with spikes; template matching on a 1024 x 1024 image with 32 templates of 16 x 16.

    python benchmarks/bench_coldstart.py [--backend cpu|gpu] [--out DIR] [--only NAME ...]

``--thorough-export TABLE.json`` makes the winners table of this machine's class instead
(`dspk.linalg.winners`): in one fresh process with an empty tuner cache, every call above,
the `STANDARD_EXTRA` products and a job's keys for each of `STANDARD_PIPELINES` (384
channels, chunks of 1 s: `dspk.Pipeline.tune`) are tuned thoroughly, and the cache's
thorough entries for the device (GPU 0 with ``--backend gpu``, else the host) are exported
into TABLE.json, merged with what it holds. Copy it to ``dspk/linalg/winners/<class>.json``
(or give that path) to ship it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import environment, heading  # noqa: E402 (benchmarks/)

#: what every case's process runs before its inputs: the array module, data, a sync
PRELUDE = """
import json, os, statistics, sys, time
import numpy as np
gpu = os.environ["BENCH_BACKEND"] == "gpu"
if gpu:
    import cupy as xp
    sync = xp.cuda.Device().synchronize
else:
    xp = np
    sync = lambda: None
t_import = time.perf_counter()
import dspk
t_import = time.perf_counter() - t_import
rng = np.random.default_rng(0)
C, N, FS = 384, 30000, 30000.0
col = np.arange(C)
geom = np.c_[np.array([43.0, 11.0, 59.0, 27.0])[col % 4], 20.0 * (col // 2)]
x = xp.asarray(rng.standard_normal((C, N)).astype(np.float32))
"""

#: name -> (inputs, the call); the call's result is synchronised on the GPU
CASES = {
    "covariance float32": ("", "dspk.covariance(x)"),
    "covariance int16": ("xi = xp.asarray(rng.integers(-2000, 2000, (C, N), dtype=np.int16))",
                         "dspk.covariance(xi)"),
    "whitening_matrix local": ("cov = dspk.covariance(x)",
                               "dspk.whitening_matrix(cov, geometry_um=geom, n_neighbors=32)"),
    "spatial_filter local W": (
        "w = dspk.whitening_matrix(dspk.covariance(x), geometry_um=geom, n_neighbors=32)",
        "dspk.spatial_filter(w, x)"),
    "common_reference median": ("", "dspk.common_reference(x, 'median')"),
    "fir_filter highpass": ("taps = dspk.highpass_taps(FS, 300.0)", "dspk.fir_filter(x, taps)"),
    "fir_bank default templates": (
        "from dspk.detect import default_templates\nbank = default_templates(FS)",
        "dspk.fir_bank(x, bank)"),
    "matmul 384x384x30000": ("w = xp.asarray(rng.standard_normal((C, C)).astype(np.float32))",
                             "dspk.matmul(w, x)"),
    "int_matmul int16 X.X^T": (
        "xi = xp.asarray(rng.integers(-2000, 2000, (C, N), dtype=np.int16))",
        "dspk.int_matmul(xi, xi.T)"),
    "PCA fit + transform": (
        "clips = xp.asarray(rng.standard_normal((20000, 61)).astype(np.float32))",
        "dspk.PCA(3).fit(clips).transform(clips)"),
    "pairwise_sqdist 2000x2000x16": (
        "a = xp.asarray(rng.standard_normal((2000, 16)).astype(np.float32))",
        "dspk.pairwise_sqdist(a, a)"),
    "detect_spikes": ("", "dspk.detect_spikes(x, geom, FS)"),
    "learn_templates": (
        # spikes of the default templates' shapes on a few channels each, 1500 in 1 s
        "from dspk.detect import default_templates\n"
        "w = default_templates(FS)\n"
        "xs = rng.standard_normal((C, N)).astype(np.float32)\n"
        "for t in range(100, N - 100, 20):\n"
        "    c = int(rng.integers(1, C - 1)); k = int(rng.integers(0, len(w)))\n"
        "    xs[c - 1:c + 2, t - 20:t + 41] += (np.array([[6.0], [12.0], [6.0]]) * w[k]\n"
        "                                       / -w[k].min())\n"
        "xs = xp.asarray(xs)",
        "dspk.learn_templates(xs, FS)"),
    "ncc 1024^2 x 32 templates": (
        "from dspk.match import ncc\n"
        "img = xp.asarray(rng.integers(0, 256, (1024, 1024), dtype=np.uint8))\n"
        "tpl = xp.asarray(rng.integers(0, 256, (32, 16, 16), dtype=np.uint8))",
        "ncc(img, tpl)"),
    "Pipeline.transform (hp, median, local W)": (
        "rec = dspk.open_recording(x, fs=FS, geometry=geom)\n"
        "p = dspk.Pipeline.from_options(backend=os.environ['BENCH_BACKEND']).fit(rec)",
        "p.transform(x)"),
}

#: products a job meets beyond the calls above, tuned thoroughly for the winners table: the
#: covariance and W·X of 2 s (fit chunks of 60 000 samples: another size class of K)
STANDARD_EXTRA = {
    "covariance float32 2 s": ("x2 = xp.concatenate([x, x], axis=1)", "dspk.covariance(x2)"),
    "covariance int16 2 s": (
        "xi2 = xp.asarray(rng.integers(-2000, 2000, (C, 2 * N), dtype=np.int16))",
        "dspk.covariance(xi2)"),
    "matmul 384x384x60000": (
        "w = xp.asarray(rng.standard_normal((C, C)).astype(np.float32))\n"
        "x2 = xp.concatenate([x, x], axis=1)", "dspk.matmul(w, x2)"),
}

#: the pipelines whose job keys the winners table holds (`dspk.Pipeline.from_options`
#: keywords): Kilosort's chain (the default options), with detection, and IBL's destripe
STANDARD_PIPELINES = ({}, {"detect": True}, {"preset": "ibl"})

#: the winners table's process: each call tuned thoroughly, then a job's keys, then export
THOROUGH = PRELUDE + """
from dspk.linalg import current_engine
from dspk.linalg.tuner_cache import cache_path
from dspk.linalg.winners import export
engine = current_engine()
for name, inputs, call in json.loads(os.environ["BENCH_CALLS"]):
    t = time.perf_counter()
    ns = dict(globals())
    exec(inputs, ns)
    with engine.thorough():
        exec(call, ns)
        sync()
    print(f"thorough: {name}: {time.perf_counter() - t:.1f} s", flush=True)
# a job's keys: int16 [samples, channels] as a probe's file, 3 s in chunks of 1 s; noise of
# ~10 uV correlated over neighbouring channels, as a probe's (white noise on every channel
# has IBL's bad-channel detection call every channel bad)
noise = rng.standard_normal((3 * N, C + 8)).astype(np.float32)
smooth = sum(noise[:, i:i + C] for i in range(9)) / 3.0
raw = np.rint(4 * (smooth + 0.5 * rng.standard_normal((3 * N, C)))).astype(np.int16)
noise = smooth = None
for options in json.loads(os.environ["BENCH_PIPELINES"]):
    t = time.perf_counter()
    rec = dspk.open_recording(raw, fs=FS, geometry=geom, layout="samples_channels",
                              gain_to_uv=2.34375)
    dspk.Pipeline.from_options(backend=os.environ["BENCH_BACKEND"], **options).tune(rec, 1.0)
    print(f"thorough: pipeline {options}: {time.perf_counter() - t:.1f} s", flush=True)
got = export(cache_path(), os.environ["BENCH_EXPORT"],
             gpu=xp.cuda.runtime.getDevice() if gpu else None)
print("RESULT " + json.dumps(got))
"""

CHILD = PRELUDE + """
{inputs}
sync()
from common import count_compiles, count_tuner_time
tuner, compiles = count_tuner_time(), count_compiles()
t = time.perf_counter(); {call}; sync(); first = time.perf_counter() - t
tuner_s, (nvrtc_s, nvrtc_names) = tuner[0], (compiles[0], list(compiles[1]))
warm = []
for _ in range(3):
    t = time.perf_counter(); {call}; sync(); warm.append(time.perf_counter() - t)
print("RESULT " + json.dumps(dict(first_s=first, warm_s=statistics.median(warm),
                                  import_s=t_import, tuner_s=tuner_s, nvrtc_s=nvrtc_s,
                                  nvrtc=nvrtc_names)))
"""


def run_case(name: str, backend: str, cache: Path, timeout: float) -> dict:
    """One fresh process for case ``name`` with its caches under ``cache``."""
    inputs, call = CASES[name]
    code = CHILD.format(inputs=textwrap.dedent(inputs), call=call)
    env = dict(os.environ, BENCH_BACKEND=backend, DSPK_CACHE_DIR=str(cache / "dspk"),
               CUPY_CACHE_DIR=str(cache / "cupy"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")]))
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=timeout)
    wall = time.perf_counter() - t
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode or not line:
        return {"error": (res.stderr.strip().splitlines() or ["no output"])[-1]}
    return {**json.loads(line[0][7:]), "process_s": wall}


def thorough_export(backend: str, out: Path, names: list[str], timeout: float) -> dict:
    """The winners table of this machine's class (module docstring): one fresh process with
    an empty tuner cache tunes ``names`` (and `STANDARD_EXTRA`, `STANDARD_PIPELINES`)
    thoroughly and exports its thorough entries into ``out`` (merged)."""
    calls = [(n, textwrap.dedent(CASES[n][0]), CASES[n][1]) for n in names] + \
        [(n, textwrap.dedent(i), c) for n, (i, c) in STANDARD_EXTRA.items()]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, BENCH_BACKEND=backend, DSPK_CACHE_DIR=str(Path(tmp) / "dspk"),
                   BENCH_CALLS=json.dumps(calls), BENCH_EXPORT=str(Path(out).resolve()),
                   BENCH_PIPELINES=json.dumps(list(STANDARD_PIPELINES)),
                   PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")]))
        # the table is made from a thorough tuning alone: never from another table's choices
        env["DSPK_WINNERS"] = "off"
        res = subprocess.run([sys.executable, "-c", THOROUGH], env=env, text=True,
                             stdout=subprocess.PIPE, timeout=timeout)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    print("\n".join(ln for ln in res.stdout.splitlines() if not ln.startswith("RESULT ")))
    if res.returncode or not line:
        raise SystemExit(f"the thorough tuning failed (exit {res.returncode})")
    return json.loads(line[0][7:])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu", choices=("cpu", "gpu"))
    ap.add_argument("--out", default=None, help="folder for bench_coldstart-<backend>.{md,json}")
    ap.add_argument("--only", nargs="*", default=None, help="case names (substrings)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--split", action="store_true",
                    help="two more fresh processes per call, one cache emptied in each: the "
                         "tuner's (kernel caches kept) and the kernels' (tuner's kept)")
    ap.add_argument("--thorough-export", default=None, metavar="TABLE.json",
                    help="tune the calls (and a job's keys) thoroughly in one process and "
                         "export the winners table of this machine's class into TABLE.json "
                         "(merged), instead of timing first calls")
    args = ap.parse_args(argv)
    names = [n for n in CASES if not args.only or any(o in n for o in args.only)]
    if args.thorough_export:
        t = time.perf_counter()
        got = thorough_export(args.backend, Path(args.thorough_export), names,
                              max(args.timeout, 3600.0))
        print(f"{got['exported']} entries exported into {got['path']} (class {got['class']}, "
              f"{got['entries']} in the table) in {time.perf_counter() - t:.0f} s")
        return
    calls = []
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            cold = run_case(name, args.backend, Path(tmp), args.timeout)
            again = run_case(name, args.backend, Path(tmp), args.timeout)   # caches filled
            row = {"call": name, "cold": cold, "filled": again}
            if args.split:
                for what, sub in (("tuner_cold", "dspk"), ("kernels_cold", "cupy")):
                    keep = Path(tmp) / f"{sub}.kept"
                    if (Path(tmp) / sub).exists():
                        (Path(tmp) / sub).rename(keep)
                    row[what] = run_case(name, args.backend, Path(tmp), args.timeout)
                    shutil.rmtree(Path(tmp) / sub, ignore_errors=True)
                    if keep.exists():
                        keep.rename(Path(tmp) / sub)
        calls.append(row)
        print(json.dumps(row), flush=True)
    rows = results_rows(calls)
    gpu = args.backend == "gpu"
    env = environment(gpu)
    lines = heading("bench_coldstart", args.backend, env,
                    ["call", "first, empty caches (ms)", "warm median (ms)", "first / warm",
                     "first, filled caches (ms)", "goal met (empty caches)",
                     "of which tuner / NVRTC (ms, kernels compiled)"])
    for r in calls:
        c, f = r["cold"], r["filled"]
        if "error" in c or "error" in f:
            lines.append(f"| {r['call']} | {c.get('error', '')} {f.get('error', '')} | | | | | |")
            continue
        first, warm = c["first_s"] * 1e3, c["warm_s"] * 1e3
        met = first <= warm + 300.0 if gpu else first <= 2.0 * warm
        lines.append(f"| {r['call']} | {first:.1f} | {warm:.2f} | {first / warm:.1f}x | "
                     f"{f['first_s'] * 1e3:.1f} | {'yes' if met else 'no'} | {_shares(c)} |")
    if args.split:
        lines += ["", "First call with one cache emptied (the other filled by the runs above):", "",
                  "| call | tuner cache empty (ms) | of which tuner / NVRTC | kernel caches empty "
                  "(ms) | of which tuner / NVRTC |", "|---|---|---|---|---|"]
        for r in calls:
            cells = [f"{r[k]['first_s'] * 1e3:.1f} | {_shares(r[k])}" if "first_s" in r[k]
                     else f"{r[k]['error']} |" for k in ("tuner_cold", "kernels_cold")]
            lines.append(f"| {r['call']} | {cells[0]} | {cells[1]} |")
        compiled = sorted({k for r in calls for run in ("cold", "kernels_cold")
                           for k in r.get(run, {}).get("nvrtc", [])})
        if compiled:
            lines += ["", f"Kernels NVRTC compiled in first calls ({len(compiled)} distinct):",
                      "", ", ".join(f"`{k}`" for k in compiled)]
    notes = [f"import dspk: {calls[0]['cold']['import_s'] * 1e3:.0f} ms in the first process"
             if calls and "import_s" in calls[0]["cold"] else "",
             "goal: first <= 2x warm (CPU), first <= warm + 300 ms (GPU)",
             f"command: python benchmarks/bench_coldstart.py --backend {args.backend}"]
    md = "\n".join(lines + ["", "## Notes", ""] + [f"- {n}" for n in notes if n]) + "\n"
    print(md)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"bench_coldstart-{args.backend}.md").write_text(md)
        (out / f"bench_coldstart-{args.backend}.json").write_text(
            json.dumps({"env": env, "rows": rows, "calls": calls}, indent=1))


def _shares(run: dict) -> str:
    """The tuner's and NVRTC's milliseconds inside a first call, and how many kernels NVRTC
    compiled."""
    if "tuner_s" not in run:
        return ""
    return (f"{run['tuner_s'] * 1e3:.0f} / {run['nvrtc_s'] * 1e3:.0f} "
            f"({len(run.get('nvrtc', []))})")


#: the measurements of a call, as rows of the results format (`dspk.plot.load_results`)
MEASURES = (("cold", "first_s", "first call, empty caches"), ("cold", "warm_s", "warm median"),
            ("filled", "first_s", "first call, filled caches"),
            ("tuner_cold", "first_s", "first call, tuner cache empty"),
            ("kernels_cold", "first_s", "first call, kernel caches empty"))


def results_rows(calls: list[dict]) -> list[dict]:
    """One row per call and measurement: {case, impl, ms} (errors as rows with ``error``)."""
    rows = []
    for r in calls:
        for run, key, impl in MEASURES:
            got = r.get(run)
            if got is None:
                continue
            if key in got:
                rows.append({"case": r["call"], "impl": impl, "ms": got[key] * 1e3})
            elif "error" in got and key == "first_s":
                rows.append({"case": r["call"], "impl": impl, "error": got["error"]})
    return rows


if __name__ == "__main__":
    main()
