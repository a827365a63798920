"""``--preset ibl-lfp`` against the International Brain Laboratory's own LFP destripe
(ibl-neuropixel's ``ibldsp.voltage.destripe_lfp``; skipped where it does not import) on the
same array: IBL's Butterworth 0.5-300 Hz band-pass run forward and backward, its ADC shift
(NP1.0), its bad channels (LFP threshold) interpolated, its median per shank — in the
recording's interior, where ``sosfiltfilt``'s odd extension of the array's ends no longer
reaches (the taps' half length, 6.2 s at 2.5 kHz); a wideband stream decimated to 2.5 kHz
first, against ``scipy.signal.decimate`` then IBL's; a job's chunks against the one-shot."""

import h5py
import numpy as np
import pytest
from scipy import signal

import dspk
from dspk.pipeline import Pipeline

voltage = pytest.importorskip("ibldsp.voltage", reason="the comparison runs against "
                              "ibl-neuropixel (pip install ibl-neuropixel)")
neuropixel = pytest.importorskip("neuropixel")

FS = 2500.0
HALF = 15509                       # ButterBandPass(0.5, 300).margin(2500.0)


def header(n_ch, version=1):
    return {k: np.asarray(v)[:n_ch] for k, v in
            neuropixel.trace_header(version=version).items()}


def lfp(n_ch, n, fs, seed=0, bad=True):
    """A depth-scaled common LFP (6 Hz and red noise) plus channel noise, band-limited below
    0.4·fs; with ``bad``, channel 30 dead and channel 60 noisy (white to Nyquist). µV."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / fs
    depth = np.linspace(0.5, 1.5, n_ch)[:, None]
    common = 80 * np.sin(2 * np.pi * 6 * t) + signal.lfilter([1.0], [1.0, -0.98],
                                                             rng.normal(0, 8, n))
    x = common[None] * depth + rng.normal(0, 5, (n_ch, n))
    if bad:
        x[30] = rng.normal(0, 2, n)
    x = signal.sosfiltfilt(signal.butter(4, 0.4 * fs, fs=fs, output="sos"), x)
    if bad:
        x[60] += rng.normal(0, 100, n)
    return x


def recording(x, h, fs, shifts=True):
    rec = dspk.open_recording(x.astype(np.float32), fs=fs, layout="channels_samples",
                              geometry=np.c_[h["x"], h["y"]].astype(float))
    rec.sample_shifts = h["sample_shift"] if shifts else None
    rec.shank_ids = h["shank"].astype(np.int64)
    return rec


def test_preset_is_ibls_destripe_lfp_on_the_same_array(tmp_path):
    n_ch, n = 96, 40000
    h = header(n_ch)
    x = lfp(n_ch, n, FS)
    labels, _ = voltage.detect_bad_channels(x * 1e-6, fs=FS)            # IBL takes volts
    ref = voltage.destripe_lfp(x * 1e-6, fs=FS, h=h, channel_labels=True) * 1e6
    rec = recording(x, h, FS)
    p = Pipeline.from_options(preset="ibl-lfp", backend="cpu").fit(rec, n_chunks=4)
    assert [type(s).__name__ for s in p.steps] == ["Decimate", "PhaseShift", "BadChannels",
                                                   "ButterBandPass", "Reference"]
    np.testing.assert_array_equal(p.states[2]["labels"], labels)       # dead 30, noisy 60
    assert np.flatnonzero(labels).tolist() == [30, 60]
    y = p.transform(x.astype(np.float32), FS)
    inner = slice(HALF + 500, n - HALF - 500)
    rms = np.sqrt(np.mean(ref[:, inner] ** 2))
    assert np.abs(y - ref)[:, inner].max() <= 5e-4 * rms                # measured 1.1e-4
    # a job's chunks (6 s each, with 6.2 s of context) give the one-shot
    out = p.run(rec, str(tmp_path / "o.h5"), chunk_s=6.0, progress=False)
    with h5py.File(out, "r") as f:
        assert float(f["traces"].attrs["fs"]) == FS
        np.testing.assert_allclose(f["traces"][()].T, y, rtol=0, atol=2e-5 * rms)


def test_a_wideband_stream_is_decimated_to_2500_hz_first():
    """NP2.0-like wideband samples at 30 kHz: IBL's LFP chain on scipy's FIR decimation
    (NP2.0: no ADC shift, as destripe_lfp sets it)."""
    n_ch, n = 16, 12 * 36000
    h = header(n_ch, version=2)
    x = lfp(n_ch, n, 30000.0, seed=1, bad=False)
    low = signal.decimate(x, 12, ftype="fir", axis=1)
    ref = voltage.destripe_lfp(low * 1e-6, fs=FS, h=h, neuropixel_version=2) * 1e6
    rec = recording(x, h, 30000.0, shifts=False)
    p = Pipeline.from_options(preset="ibl-lfp", bad_channels="none", backend="cpu").fit(rec)
    assert p.source(rec).fs == FS and p.fs == 30000.0
    y = p.transform(x.astype(np.float32), 30000.0)
    assert y.shape == ref.shape == (n_ch, 36000)
    inner = slice(HALF + 500, 36000 - HALF - 500)
    rms = np.sqrt(np.mean(ref[:, inner] ** 2))
    assert np.abs(y - ref)[:, inner].max() <= 5e-4 * rms
