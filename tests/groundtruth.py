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
         noise_um: float = 30.0, seed: int = 0, spectrum: str = "white") -> dict:
    """{"x": [C, n] float32 µV (noise SD 1 per channel), "times", "units", "snr" (per unit:
    trough on the best channel / noise SD), "geometry", "templates" [units, C, taps]}. The
    noise is correlated between channels over ``noise_um`` and has the ``spectrum`` of
    `shaped_noise` in time."""
    rng = np.random.default_rng(seed)
    g = probe() if geometry is None else geometry
    c = len(g)
    n = int(seconds * FS)
    d = np.sqrt(((g[:, None] - g[None]) ** 2).sum(-1))
    mix = np.linalg.cholesky(np.exp(-d / noise_um) + 1e-9 * np.eye(c))
    noise = rng.standard_normal((c, n)) if spectrum == "white" else \
        shaped_noise(c, n, spectrum, seed=int(rng.integers(2**31)))
    x = (mix @ noise).astype(np.float64)                          # unit variance per channel
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


#: noise spectra of the detection tests: what whitened traces look like in practice
SPECTRA = ("white", "band", "pink")


def shaped_noise(channels: int, n: int, spectrum: str = "white", seed: int = 0,
                 fs: float = FS) -> np.ndarray:
    """[channels, n] float64 Gaussian noise of unit variance per channel, independent between
    channels, with a power spectrum that is flat ("white"), band-limited to 300–6000 Hz
    ("band": a whitened trace after the high-pass, with the probe's anti-alias low-pass), or
    falling as 1/f above 300 Hz ("pink": a 1/f-tilted residual that whitening left)."""
    if spectrum not in SPECTRA:
        raise ValueError(f"spectrum: expected one of {SPECTRA}, got {spectrum!r}")
    rng = np.random.default_rng(seed)
    if spectrum == "white":
        return rng.standard_normal((channels, n))
    pad = 4096                     # filtered with room on both sides: no edge transients kept
    x = rng.standard_normal((channels, n + 2 * pad))
    if spectrum == "band":
        from scipy.signal import butter, sosfilt

        x = sosfilt(butter(4, (300.0, 6000.0), "bandpass", fs=fs, output="sos"), x, axis=1)
    else:
        f = np.fft.rfftfreq(x.shape[1], 1.0 / fs)
        gain = np.where(f > 300.0, 1.0 / np.sqrt(np.maximum(f, 1.0)), 0.0)
        x = np.fft.irfft(np.fft.rfft(x, axis=1) * gain[None], x.shape[1], axis=1)
    x = x[:, pad:pad + n]
    return x / x.std(axis=1, keepdims=True)
