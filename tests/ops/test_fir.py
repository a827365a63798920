"""FIR design (frequency responses), per-channel filtering and banks against SciPy, streaming
with halos; CPU and GPU (`gpu` params)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import signal

import dspk
from dspk.backend import to_numpy

FS = 30000.0


def gain(taps, f):
    _, h = signal.freqz(taps, worN=np.atleast_1d(f), fs=FS)
    return np.abs(h)


def test_default_highpass_is_at_least_as_selective_as_kilosort4():
    taps = dspk.highpass_taps(FS)
    assert len(taps) % 2 == 1
    assert np.all(gain(taps, np.linspace(1, 200, 50)) <= 0.1)
    assert gain(taps, 400)[0] >= 0.85
    assert np.all(np.abs(gain(taps, np.linspace(600, 0.45 * FS, 200)) - 1) <= 0.03)
    assert abs(gain(taps, 300)[0] - 0.5) < 0.02


def test_zero_phase_taps_match_filtfilt_magnitude():
    taps = dspk.zero_phase_taps(FS, 300, order=3)
    np.testing.assert_allclose(taps, taps[::-1], atol=1e-12)
    sos = signal.butter(3, 300, btype="highpass", fs=FS, output="sos")
    f = np.array([100.0, 200, 300, 400, 600, 1000])
    _, h = signal.sosfreqz(sos, worN=f, fs=FS)
    np.testing.assert_allclose(gain(taps, f), np.abs(h) ** 2, atol=1e-4)


def test_bandpass_taps():
    taps = dspk.bandpass_taps(FS, 300, 6000)
    assert gain(taps, 3000)[0] > 0.97 and gain(taps, 100)[0] < 0.03 and gain(taps, 9000)[0] < 0.03


@settings(max_examples=60, deadline=None)
@given(fs=st.sampled_from([2500.0, 20000.0, 25000.0, 30000.0, 32000.0, 40000.0]),
       low=st.floats(0.02, 0.2), high=st.floats(0.25, 0.45),
       ripple=st.floats(8.0, 80.0), transition=st.none() | st.floats(0.3, 1.5))
def test_kaiser_design_is_scipy_signal_bit_for_bit(fs, low, high, ripple, transition):
    """dspk designs its Kaiser taps without importing scipy.signal (0.65 s per process): the
    same bits as kaiserord + firwin, high-pass and band-pass, every ripple branch."""
    cut, hi = low * fs, high * fs
    t = None if transition is None else transition * cut
    width = ((2 / 3) * cut if t is None else t) / (0.5 * fs)
    numtaps, beta = signal.kaiserord(ripple, width)
    assert dspk.ops.kaiser.kaiser_order(ripple, width) == (numtaps, beta)
    ref = signal.firwin(numtaps | 1, cut, window=("kaiser", beta), pass_zero=False, fs=fs)
    np.testing.assert_array_equal(dspk.highpass_taps(fs, cut, t, ripple), ref)
    ref = signal.firwin(numtaps | 1, [cut, hi], window=("kaiser", beta), pass_zero=False, fs=fs)
    np.testing.assert_array_equal(dspk.bandpass_taps(fs, cut, hi, t, ripple), ref)


def test_kaiser_design_bad_input():
    with pytest.raises(ValueError, match="ripple_db: expected at least 8"):
        dspk.highpass_taps(FS, ripple_db=5.0)
    with pytest.raises(ValueError, match="numtaps: a filter that passes Nyquist"):
        dspk.ops.kaiser.kaiser_firwin(10, 300.0, FS, 2.0)


def test_designing_taps_does_not_import_scipy_signal():
    import subprocess
    import sys
    code = ("import sys, dspk; dspk.highpass_taps(30000.0); dspk.bandpass_taps(30000.0, 300, "
            "6000); print('scipy.signal' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_fir_filter_matches_lfilter(xp, dtype, tol):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5000)).astype(dtype)
    taps = dspk.highpass_taps(FS)
    y = to_numpy(dspk.fir_filter(xp.asarray(x), taps)).astype(np.float64)
    causal = signal.lfilter(taps, 1.0, x.astype(np.float64), axis=1)
    c = len(taps) // 2
    ref = np.zeros_like(causal)
    ref[:, :-c] = causal[:, c:]
    inner = slice(len(taps), 5000 - len(taps))
    err = np.linalg.norm(y[:, inner] - ref[:, inner]) / np.linalg.norm(ref[:, inner])
    assert err <= tol
    assert y.shape == x.shape


def test_zero_phase_filtering_equals_the_symmetric_kernel(xp):
    x = np.random.default_rng(1).standard_normal((3, 4000))
    taps = dspk.highpass_taps(FS)
    y = to_numpy(dspk.fir_filter(xp.asarray(x), taps, zero_phase=True))
    k = np.convolve(taps, taps[::-1])
    ref = np.stack([np.convolve(r, k, mode="same") for r in x])
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-10)


def test_streaming_with_halos_equals_one_shot(xp):
    x = np.random.default_rng(2).standard_normal((4, 12000))
    taps = dspk.highpass_taps(FS)
    halo = len(taps) // 2
    whole = to_numpy(dspk.fir_filter(xp.asarray(x), taps))
    chunk = 3000
    for start in range(halo, 12000 - halo - chunk, chunk):
        part = to_numpy(dspk.fir_filter(xp.asarray(x[:, start - halo:start + chunk + halo]),
                                        taps, halo=halo))
        np.testing.assert_allclose(part, whole[:, start:start + chunk], rtol=1e-10, atol=1e-10)


def test_fir_bank_matches_correlate(xp):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 2000)).astype(np.float32)
    bank = rng.standard_normal((6, 61))
    y = to_numpy(dspk.fir_bank(xp.asarray(x), bank))
    assert y.shape == (5, 6, 2000)
    for c in range(5):
        for i in range(6):
            ref = signal.correlate(x[c].astype(np.float64), bank[i], mode="same")
            assert np.linalg.norm(y[c, i] - ref) / np.linalg.norm(ref) <= 1e-5


def test_bad_filter_arguments(xp):
    x = xp.zeros((2, 100), np.float32)
    with pytest.raises(ValueError, match="taps: 101 taps are longer than the data"):
        dspk.fir_filter(x, np.ones(101))
    with pytest.raises(ValueError, match="cutoff 20000"):
        dspk.highpass_taps(FS, 20000)
    with pytest.raises(ValueError, match="fs: expected a positive"):
        dspk.highpass_taps(0)
    with pytest.raises(ValueError, match="halo: expected"):
        dspk.fir_filter(x, np.ones(5), halo=50)
    with pytest.raises(ValueError, match="bank: expected"):
        dspk.fir_bank(x, np.ones(5))


def test_cpu_channel_blocks_in_threads_equal_one_block():
    from threadpoolctl import threadpool_limits

    x = np.random.default_rng(4).standard_normal((384, 3000)).astype(np.float32)  # > 2^20
    taps = dspk.highpass_taps(FS)
    with threadpool_limits(2, user_api="blas"):         # the engine's threads: as BLAS's
        threaded = dspk.fir_filter(x, taps)
    with threadpool_limits(1, user_api="blas"):
        np.testing.assert_array_equal(dspk.fir_filter(x, taps), threaded)


@pytest.mark.gpu
@settings(max_examples=30, deadline=None)
@given(channels=st.integers(1, 4), n=st.sampled_from([1, 17, 300, 2048, 2049, 5000]),
       taps=st.integers(1, 300), nf=st.integers(1, 7), f64=st.booleans(),
       strided=st.booleans())
def test_gpu_direct_fir_kernel_matches_float64(channels, n, taps, nf, f64, strided):
    """The direct FIR/bank kernel (whichever the tuner would pick): tile edges, taps not a
    multiple of the register block, taps longer than a tile's overhang, rows with a stride."""
    import cupy as cp

    from dspk.ops._traces_gpu import fir_direct

    taps = min(taps, n)
    dtype = np.float64 if f64 else np.float32
    rng = np.random.default_rng(taps * 131 + n)
    x = rng.standard_normal((channels, 2 * n if strided else n)).astype(dtype)
    w = rng.standard_normal((nf, taps))
    xg = cp.asarray(x)[:, ::2] if strided else cp.asarray(x)
    xr = x[:, ::2] if strided else x
    got = fir_direct(xg, w, taps // 2).get()
    assert got.shape == (channels, nf, n) and got.dtype == dtype
    for c in range(channels):
        for i in range(nf):
            ref = signal.correlate(xr[c].astype(np.float64), w[i], mode="full")
            ref = ref[taps - 1 - taps // 2: taps - 1 - taps // 2 + n]
            scale = np.abs(xr[c]).max() * np.abs(w[i]).sum()
            assert np.abs(got[c, i] - ref).max() <= (1e-6 if not f64 else 1e-14) * scale


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_cpu_whole_row_fft_candidate(dtype, tol):
    """The CPU's whole-row FFT candidate on its own (the tuner may keep either candidate)."""
    from dspk.ops.fir import _rfft_bank

    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 1001)).astype(dtype)
    w = rng.standard_normal((2, 64))
    got = _rfft_bank(x, w)
    for c in range(3):
        for i in range(2):
            ref = signal.correlate(x[c].astype(np.float64), w[i], mode="full")[63 - 32:][:1001]
            assert np.linalg.norm(got[c, i] - ref) / np.linalg.norm(ref) <= tol
