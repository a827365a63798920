#!/usr/bin/env python3
"""Where a first call's time goes (issue 32): runs a case of ``bench_coldstart`` in fresh
processes with chosen caches emptied and profiles the first call with cProfile (the
cumulative and own-time tables of the functions that took longest).

    python benchmarks/profiles/profile_coldstart.py --backend gpu --out DIR "covariance float32" ...

For each case four processes share one cache folder: ``cold`` (both caches empty), then
``tuner_cold`` (the kernel caches the first process filled, an empty tuner cache) and
``kernels_cold`` (the tuner cache filled, empty kernel caches).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/ (this file: benchmarks/profiles/)
sys.path.insert(0, str(HERE))

from bench_coldstart import CASES, PRELUDE, ROOT  # noqa: E402 (benchmarks/)

CHILD = PRELUDE + """
{inputs}
sync()
import cProfile, io, pstats
prof = cProfile.Profile()
t = time.perf_counter()
prof.enable(); {call}; sync(); prof.disable()
first = time.perf_counter() - t
s = io.StringIO()
st = pstats.Stats(prof, stream=s)
print(f"first call {{first * 1e3:.1f}} ms")
st.sort_stats("cumulative").print_stats({top})
st.sort_stats("tottime").print_stats({top})
print(s.getvalue())
"""


def profile(name: str, backend: str, cache: Path, top: int) -> str:
    inputs, call = CASES[name]
    code = CHILD.format(inputs=textwrap.dedent(inputs), call=call, top=top)
    env = dict(os.environ, BENCH_BACKEND=backend, DSPK_CACHE_DIR=str(cache / "dspk"),
               CUPY_CACHE_DIR=str(cache / "cupy"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return res.stdout + ("\n" + res.stderr[-3000:] if res.returncode else "")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="case names of bench_coldstart (substrings)")
    ap.add_argument("--backend", default="gpu", choices=("cpu", "gpu"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--runs", nargs="*", default=["cold", "tuner_cold", "kernels_cold"])
    args = ap.parse_args(argv)
    names = [n for n in CASES if any(c in n for c in args.cases)]
    out = Path(args.out) if args.out else None
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            cache = Path(tmp)
            for run in args.runs:
                if run in ("tuner_cold", "kernels_cold"):
                    if not any(cache.iterdir()):
                        profile(name, args.backend, cache, args.top)   # fill both caches
                    shutil.rmtree(cache / ("dspk" if run == "tuner_cold" else "cupy"),
                                  ignore_errors=True)
                text = profile(name, args.backend, cache, args.top)
                head = f"===== {name}: {run}"
                print(head, text.splitlines()[0] if text else "", flush=True)
                if out:
                    out.mkdir(parents=True, exist_ok=True)
                    slug = "".join(ch if ch.isalnum() else "_" for ch in name)[:40]
                    (out / f"{slug}-{run}.txt").write_text(head + "\n" + text)


if __name__ == "__main__":
    main()
