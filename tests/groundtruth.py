"""A ground-truth recording for detection tests: units with extracellular waveforms on a probe
geometry, spatially correlated noise, known spike times, a range of SNRs."""

from __future__ import annotations

import numpy as np

FS = 30000.0


def probe(channels: int = 64, columns: int = 2, pitch_um: float = 20.0) -> np.ndarray:
    rows = np.arange(channels) // columns
    x = (np.arange(channels) % columns) * 32.0
    return np.stack([x, rows * pitch_um], axis=1)


def make(seconds: float = 4.0, geometry: np.ndarray | None = None,
         snrs: tuple = (3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 14.0, 20.0), rate_hz: float = 8.0,
         noise_um: float = 30.0, seed: int = 0) -> dict:
    """{"x": [C, n] float32 µV (noise SD 1 per channel), "times", "units", "snr" (per unit:
    trough on the best channel / noise SD), "geometry", "templates" [units, C, taps]}."""
    rng = np.random.default_rng(seed)
    g = probe() if geometry is None else geometry
    c = len(g)
    n = int(seconds * FS)
    d = np.sqrt(((g[:, None] - g[None]) ** 2).sum(-1))
    mix = np.linalg.cholesky(np.exp(-d / noise_um) + 1e-9 * np.eye(c))
    x = (mix @ rng.standard_normal((c, n))).astype(np.float64)   # unit variance per channel
    t_ms = (np.arange(61) - 20) / FS * 1e3
    times, units, templates = [], [], []
    span = g[:, 1].max()
    for u, snr in enumerate(snrs):
        pos = np.array([rng.uniform(0, 32), rng.uniform(0.1, 0.9) * span])
        depth = rng.uniform(10, 30)
        dist = np.sqrt(((g - pos) ** 2).sum(-1) + depth ** 2)
        decay = (dist.min() / dist) ** 2
        width = rng.uniform(0.08, 0.18)
        wave = -np.exp(-0.5 * (t_ms / width) ** 2) + \
            0.3 * np.exp(-0.5 * ((t_ms - 3.5 * width) / (2.5 * width)) ** 2)
        tmpl = snr * decay[:, None] * wave[None, :]                 # trough = snr on best ch
        isi = rng.exponential(FS / rate_hz, int(rate_hz * seconds * 3)) + 0.003 * FS
        t = np.cumsum(isi).astype(np.int64)
        t = t[(t > 100) & (t < n - 100)]
        for t0 in t:
            x[:, t0 - 20:t0 + 41] += tmpl
        times.append(t)
        units.append(np.full(len(t), u))
        templates.append(tmpl)
    times = np.concatenate(times)
    units = np.concatenate(units)
    order = np.argsort(times, kind="stable")
    return dict(x=x.astype(np.float32), times=times[order], units=units[order],
                snr=np.asarray(snrs), geometry=g, templates=np.stack(templates))


def match(found: np.ndarray, truth: np.ndarray, tolerance: int) -> tuple:
    """Greedy one-to-one matching of sorted sample indices within ±tolerance:
    (matched truth mask, matched found mask)."""
    ti = np.zeros(len(truth), bool)
    fi = np.zeros(len(found), bool)
    j0 = 0
    for i, t in enumerate(truth):
        while j0 < len(found) and found[j0] < t - tolerance:
            j0 += 1
        j = j0
        while j < len(found) and found[j] <= t + tolerance:
            if not fi[j]:
                fi[j] = ti[i] = True
                break
            j += 1
    return ti, fi
