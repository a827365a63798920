#!/usr/bin/env python3
"""What the demultiplexed common reference (``--reference-groups adc``, CatGT's ``-gbldmx``)
removes against the global one, on a synthetic NP1.0 recording (384 channels, 30 kHz) with a
multiplexed artefact: fast transients common to every channel, each channel sampling them at
its own ADC instant (``x_c[n] = a(n + shift_c)``, shift_c = k/13 of a sample), in white noise.

For each reference (none; global median / mean; per ADC instant median / mean; and each after
the phase-shift correction): the artefact left, as the RMS over the transients' windows of
(output − the same reference of the noise alone) over the artefact's own RMS there; the
reference's own noise, as the RMS of what it subtracts from the noise alone over the noise's
RMS (a reference over 32 channels is noisier than one over 384); and the time per second of
recording.

    python benchmarks/bench_demux.py [--backend cpu|gpu] [--out DIR|FILE.md] [--small]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, out_files  # noqa: E402 (benchmarks/)

FS = 30000.0


def multiplexed_artifact(n: int = 60000, amplitude: float = 200.0, width: float = 0.6,
                         noise: float = 10.0, events_per_s: float = 20.0, spread: float = 0.0,
                         seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(artefact [384, n], noise [384, n], NP1.0 sample shifts, event samples): the artefact
    is a sum of Gaussian transients of ``width`` samples (SD; a fast biphasic edge: the
    derivative of a Gaussian, scaled to ``amplitude`` µV peak), common to all channels but
    for a gain that goes linearly from 1 − spread to 1 + spread along the probe, channel c
    sampling it at n + shift_c; white noise of ``noise`` µV RMS."""
    from dspk.io.adc import neuropixels_sample_shifts

    rng = np.random.default_rng(seed)
    shifts = neuropixels_sample_shifts(np.arange(384), "NP1000")
    events = np.sort(rng.choice(np.arange(100, n - 100), int(events_per_s * n / FS),
                                replace=False))
    t = np.arange(n)[None, :] + shifts[:, None]               # each channel's sampling times
    art = np.zeros((384, n))
    gain = np.linspace(1.0 - spread, 1.0 + spread, 384)[:, None]
    for e in events:
        lo, hi = e - 20, e + 20
        u = (t[:, lo:hi] - e) / width
        art[:, lo:hi] += -amplitude * gain * u * np.exp(0.5 - 0.5 * u ** 2)   # peak: amplitude
    return art, rng.standard_normal((384, n)) * noise, shifts, events


def measure(xp, backend: str, small: bool) -> tuple[list, list]:
    rows = []
    for spread in (0.0, 0.2):
        rows += scenario(xp, backend, small, spread)
    n = 15000 if small else 60000
    notes = [f"384 channels (NP1.0 multiplexing: 12 instants of 32 channels, shifts k/13), "
             f"{n / FS:g} s at 30 kHz, float32; 20 transients per second "
             f"(Gaussian-derivative edges, SD 0.6 sample, 200 µV peak) in 10 µV RMS white "
             f"noise; gain spread: the artefact's gain from 1 − s to 1 + s along the probe",
             "artefact left: RMS of (output − the same reference applied to the noise alone) "
             "over ±5 samples around the transients, over the input artefact's RMS there",
             "reference noise: RMS of what the reference subtracts from the noise alone, over "
             "the noise's RMS (a mean over N channels: 1/sqrt(N); a median ~1.25 times that)",
             "ms per s: wall time per second of recording on this machine (shared)"]
    return rows, notes


def scenario(xp, backend: str, small: bool, spread: float) -> list:
    from dspk.ops import common_reference, demux_reference, phase_shift

    n = 15000 if small else 60000
    art, noise, shifts, events = multiplexed_artifact(n, spread=spread)
    window = np.zeros(n, bool)
    for e in events:
        window[e - 5:e + 6] = True
    x = xp.asarray((art + noise).astype(np.float32))
    z = xp.asarray(noise.astype(np.float32))
    art_rms = float(np.sqrt((art[:, window] ** 2).mean()))
    def same(a):
        return a

    def shifted(a):
        return phase_shift(a, shifts)

    # (what runs before the reference, the reference)
    cases = {
        "none": (same, same),
        "global median": (same, lambda a: common_reference(a, "median")),
        "global mean (CatGT -gblcar)": (same, lambda a: common_reference(a, "mean")),
        "ADC instant median": (same, lambda a: demux_reference(a, shifts, "median")),
        "ADC instant mean (CatGT -gbldmx)": (same, lambda a: demux_reference(a, shifts,
                                                                             "mean")),
        "phase shift + global median": (shifted, lambda a: common_reference(a, "median")),
        "phase shift + ADC instant median": (shifted,
                                             lambda a: demux_reference(a, shifts, "median")),
    }
    rows = []
    to_host = (lambda a: a.get()) if backend == "gpu" else np.asarray
    for name, (pre, refer) in cases.items():
        def f(a, pre=pre, refer=refer):
            return refer(pre(a))

        f(x)                                                    # warm-up (tuner)
        t0 = time.perf_counter()
        y = to_host(f(x))
        dt = time.perf_counter() - t0
        y0 = to_host(f(z))
        left = y - y0
        # the phase shift also moves the artefact: compare with the artefact it moved
        ref = art if "phase" not in name else to_host(phase_shift(xp.asarray(art), shifts))
        rows.append(dict(case=f"gain spread {spread:g}", impl=name, gain_spread=spread,
                         ms=round(1e3 * dt, 1),
                         artifact_left=round(float(np.sqrt((left[:, window] ** 2).mean()))
                                             / art_rms, 4),
                         artifact_left_vs_input=round(float(np.sqrt(
                             (left[:, window] ** 2).mean() / (ref[:, window] ** 2).mean())), 4),
                         reference_noise=round(float((to_host(pre(z)) - y0).std()
                                                     / noise.std()), 4),
                         ms_per_s=round(1e3 * dt / (n / FS), 1)))
    return rows


def markdown(rows: list, notes: list, backend: str, env: dict, machine: str) -> str:
    lines = [f"# bench_demux — {backend} ({machine})", "",
             "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), "",
             "| gain spread | reference | artefact left | reference noise | ms per s |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['gain_spread']:g} | {r['impl']} | {r['artifact_left']} | "
                     f"{r['reference_noise']} | {r['ms_per_s']} |")
    lines += ["", "## Notes", ""] + [f"- {x}" for x in notes]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--machine", default="cpu-2core")
    ap.add_argument("--small", action="store_true", help="0.5 s instead of 2 s")
    ap.add_argument("--out", default=None, help="folder for bench_demux-<backend>.{md,json} "
                    "or a FILE.md")
    args = ap.parse_args(argv)
    if args.backend == "gpu":
        import cupy as xp
    else:
        xp = np
    rows, notes = measure(xp, args.backend, args.small)
    env = environment(args.backend == "gpu")
    env["load"] = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    md = markdown(rows, notes, args.backend, env, args.machine)
    print(md)
    if args.out:
        md_path, json_path = out_files(args.out, "bench_demux", args.backend)
        md_path.write_text(md)
        json_path.write_text(json.dumps(dict(env=env, machine=args.machine, rows=rows,
                                             notes=notes), indent=1))


if __name__ == "__main__":
    main()
