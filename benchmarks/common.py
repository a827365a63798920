"""What the benchmarks share: the command line, the environment header, writing the
results, and timing: one call per sample, CUDA events on the GPU, perf_counter on
the CPU, median after a warm-up call. (bench_linalg has its own, finer clock: back-to-back calls,
rotation beyond L2, device-only time behind a spin kernel.)"""

from __future__ import annotations

import re
import statistics
import sys
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


def parse_args(doc: str, argv=None):
    """The benchmarks' command line: --backend, --small, --out."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--backend", default=None, help="cpu, gpu or auto (default: $DSPK_BACKEND)")
    ap.add_argument("--small", action="store_true", help="small sizes")
    ap.add_argument("--out", default=None, help="directory for <name>-<backend>.{md,json}")
    return ap.parse_args(argv)


def environment(gpu: bool) -> dict:
    """Date, versions and, on the GPU, its name and CuPy's version, for a table's header."""
    import numpy as np

    import dspk

    env = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dspk": dspk.__version__,
           "numpy": np.__version__}
    if gpu:
        import cupy as cp

        name = cp.cuda.runtime.getDeviceProperties(0)["name"]
        env.update(gpu=name.decode() if isinstance(name, bytes) else name, cupy=cp.__version__)
    return env


def publish(name: str, backend: str, md: str, payload: dict, out: str | None) -> None:
    """Print the table; with ``out``, also write it and the JSON payload there."""
    import json
    from pathlib import Path

    print(md)
    if out:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}-{backend}.md").write_text(md)
        (d / f"{name}-{backend}.json").write_text(json.dumps(payload, indent=1))


def out_files(out: str, name: str, backend: str) -> tuple:
    """Where ``--out`` puts a benchmark's table and JSON: a folder (what `publish` and
    scripts/gpu-check use) gets <name>-<backend>.md and .json; a path ending in ``.md`` is the
    table itself, the JSON beside it. The folder is made."""
    from pathlib import Path

    o = Path(out)
    md = o if o.suffix == ".md" else o / f"{name}-{backend}.md"
    md.parent.mkdir(parents=True, exist_ok=True)
    return md, md.with_suffix(".json")


def backend_tools(backend: str) -> tuple:
    """(gpu, array module, Clock) for a benchmark's backend."""
    gpu = backend == "gpu"
    if gpu:
        import cupy as xp
    else:
        import numpy as xp
    return gpu, xp, Clock(gpu)


def heading(name: str, backend: str, env: dict, columns: list[str]) -> list[str]:
    """The first lines of a benchmark's Markdown table: title, environment, header."""
    return [f"# {name} — {backend}", "",
            "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), "",
            "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def finish(lines: list[str], notes: list[str]) -> str:
    """The table's lines with its notes, as one Markdown text."""
    if notes:
        lines = lines + ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def bench_main(name: str, doc: str, run, markdown, argv=None) -> None:
    """The command line of a benchmark: ``run(backend, small)`` gives (rows, notes[, extra
    dict]); ``markdown(rows, notes, backend, env, **extra)`` renders them; both are printed
    and, with --out, written as <name>-<backend>.{md,json}."""
    args = parse_args(doc, argv)
    from dspk.backend import resolve_backend

    backend = resolve_backend(args.backend)
    rows, notes, *rest = run(backend, args.small)
    extra = rest[0] if rest else {}
    env = environment(backend == "gpu")
    publish(name, backend, markdown(rows, notes, backend, env, **extra),
            {"env": env, "rows": rows, "notes": notes, **extra}, args.out)


def count_compiles() -> list:
    """From now on in this process, the seconds CuPy spends compiling kernels with NVRTC (its
    own elementwise/reduction/sort kernels and any RawModule built from source; a kernel found
    in ``CUPY_CACHE_DIR`` is not compiled) go to element 0 of the returned list and the
    compiled kernels' names (the first 60 characters of each) to element 1. Nothing is counted
    where CuPy is not imported."""
    spent: list = [0.0, []]
    if "cupy" not in sys.modules:
        return spent
    from cupy.cuda import compiler

    # (CuPy 14: _compile_with_cache_cuda calls this module-level function on a cache miss)
    hook = "_compile_using_nvrtc_no_warning"
    if not hasattr(compiler, hook):
        hook = "compile_using_nvrtc"
    inner = getattr(compiler, hook)

    def timed(source, *a, **k):
        t0 = time.perf_counter()
        try:
            return inner(source, *a, **k)
        finally:
            spent[0] += time.perf_counter() - t0
            found = re.findall(r"__global__\s+void\s+(\w+)", str(source))
            spent[1].append(",".join(found)[:60] or "?")

    setattr(compiler, hook, timed)
    return spent


def count_tuner_time() -> list[float]:
    """From now on in this process, the seconds spent inside the engine's tuner (its `_tune`
    and `_choose_now`: timing candidates and implementations; `_from_table` and
    `_choose_from_table`: checking a winners table's choice) are added to the returned
    one-element list (a first call's share of tuning, for the benchmarks of first calls)."""
    from dspk.linalg.tuner import Tuner

    spent = [0.0]

    def timed(f):
        def g(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0
        return g

    for name in ("_tune", "_choose_now", "_from_table", "_choose_from_table"):
        if hasattr(Tuner, name):
            setattr(Tuner, name, timed(getattr(Tuner, name)))
    return spent


def job_timing_lines(text: str) -> list:
    """The lines of a dspk job's log that say where its time went: the fit (each stage's
    share), the drift estimate, the chunk loop's split and the whole job.

    >>> job_timing_lines("x\\ndspk.pipeline: fit in 2.00 s: 10 chunks read ...\\nother")
    ['dspk.pipeline: fit in 2.00 s: 10 chunks read ...']
    """
    keys = ("fit in ", "motion (", " samples in ", "written in ")
    return [line.strip() for line in text.splitlines() if any(k in line for k in keys)]
