"""dspk's destriping ops against the International Brain Laboratory's own code
(ibl-neuropixel's `ibldsp`, the reference SpikeInterface ported; skipped with a reason where it
does not import): the spatial high-pass with its AGC against `ibldsp.voltage.kfilt`, the ADC
phase shift against `ibldsp.fourier.fshift` (IBL's `destripe` applies both)."""

import numpy as np
import pytest
from scipy import signal

from dspk.ops import highpass_spatial_filter, phase_shift
from tests.geometry import np1_geometry

voltage = pytest.importorskip("ibldsp.voltage", reason="the comparison runs against "
                              "ibl-neuropixel (pip install ibl-neuropixel)")
fourier = pytest.importorskip("ibldsp.fourier", reason="the comparison runs against "
                              "ibl-neuropixel (pip install ibl-neuropixel)")

FS = 30000.0


def striped(seed, n_ch=384, n=6000):
    """Coloured noise plus a stripe common to every channel, float64 µV."""
    rng = np.random.default_rng(seed)
    noise = signal.lfilter([1.0], [1.0, -0.9], rng.normal(0, 10, (n_ch, n)), axis=1)
    t = np.arange(n)
    stripe = 150.0 * np.sin(t / 40.0) + signal.lfilter([1.0], [1.0, -0.99],
                                                        rng.normal(0, 15, n))
    return noise + stripe[None]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("agc", [True, False])
def test_spatial_highpass_is_ibls_kfilt(seed, agc):
    """kfilt's defaults (60 channels padded by reflection, no taper, Butterworth order 3 at
    0.01, AGC over 3000 samples): IBL's AGC floor is one number for the whole array
    (0.003 · the array's SD), given here as every channel's RMS with epsilon 0.003."""
    x = striped(seed)
    ref = voltage.kfilt(x.copy(), ntr_pad=60, ntr_tap=0, lagc=3000 if agc else 0)
    sd = np.std(x - np.mean(x))
    got = highpass_spatial_filter(x, np1_geometry(), FS, apply_agc=agc,
                                  rms_values=np.full(len(x), sd), epsilon=0.003)
    assert np.abs(got - ref).max() <= 1e-11 * np.abs(ref).max()


def test_phase_shift_is_ibls_fshift():
    """A band-limited, tapered signal (IBL's FFT shift is circular: it needs no padding
    there) delayed by NP1.0's k/13 shifts: within 1e-6 of the signal's RMS."""
    rng = np.random.default_rng(0)
    sos = signal.butter(4, [300, 6000], btype="band", fs=FS, output="sos")
    x = signal.sosfiltfilt(sos, rng.normal(size=(48, 30000)), axis=1)
    x *= signal.windows.tukey(x.shape[1], 0.1)[None]
    shifts = ((np.arange(48) % 24) // 2) / 13.0
    ref = fourier.fshift(x, shifts, axis=1)
    got = phase_shift(x, shifts)
    rms = np.sqrt(np.mean(ref ** 2))
    assert np.abs(got - ref).max() <= 1e-6 * rms
