"""dspk.ops.phase_shift and fractional_delay_taps: against SpikeInterface's phase_shift on
band-limited noise, against analytically delayed sines, the design error of the taps, chunks
with halos, shapes and dtypes (hypothesis), bad input; the CuPy path against float64 NumPy
(`gpu` params)."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.signal import butter, freqz, sosfiltfilt
from scipy.signal.windows import tukey

import dspk
from dspk.backend import to_numpy
from dspk.io import open_recording
from dspk.ops import fractional_delay_taps, phase_shift

from tests.recordings import np1_meta, write_sglx

FS = 30000.0
NP_SHIFTS = np.r_[np.arange(12) / 13, np.arange(16) / 16]     # NP1.0 and NP2.0 fractions


def band_limited(channels, n, seed=0, taper=True):
    """300-6000 Hz noise (Butterworth band-pass, forward and backward), tapered to zero over
    its first and last 3000 samples unless ``taper`` is False."""
    x = np.random.default_rng(seed).standard_normal((channels, n))
    sos = butter(5, [300.0, 6000.0], btype="bandpass", fs=FS, output="sos")
    y = sosfiltfilt(sos, x, axis=1)
    return y * tukey(n, 6000 / n)[None] if taper else y


def si_phase_shift(x, shifts):
    """SpikeInterface's phase_shift of [channels, samples] x, as [channels, samples]."""
    core = pytest.importorskip("spikeinterface.core",
                               reason="the comparison runs against SpikeInterface")
    pre = pytest.importorskip("spikeinterface.preprocessing",
                              reason="the comparison runs against SpikeInterface")
    rec = core.NumpyRecording(np.ascontiguousarray(x.T), FS)
    return pre.phase_shift(rec, inter_sample_shift=np.asarray(shifts)).get_traces().T


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-7), (np.float32, 1e-5)])
def test_phase_shift_matches_spikeinterface_on_band_limited_data(dtype, tol):
    x = band_limited(28, 30000)
    ref = si_phase_shift(x, NP_SHIFTS)
    y = phase_shift(x.astype(dtype), NP_SHIFTS)
    assert y.dtype == dtype and y.shape == x.shape
    rms = np.sqrt((x ** 2).mean())
    # every sample (the data go to zero at the ends): measured 3.6e-9 (float64), 1.1e-6
    assert np.abs(y - ref).max() / rms <= tol


def test_phase_shift_matches_spikeinterface_in_the_interior_of_untapered_data():
    # the reference's FFT rings from the steps at the ends (1/distance); the aim: <= 1e-4 of
    # the RMS in the interior (measured 5e-5 at 6000 samples from the ends)
    x = band_limited(28, 30000, seed=1, taper=False)
    ref = si_phase_shift(x, NP_SHIFTS)
    y = phase_shift(x, NP_SHIFTS)
    rms = np.sqrt((x ** 2).mean())
    assert np.abs(y - ref)[:, 6000:-6000].max() / rms <= 1e-4


def test_a_spikeglx_np1_recording_read_by_dspk_and_by_spikeinterface(tmp_path):
    """The issue's comparison: the same NP1.0 .bin/.meta, shifted by SpikeInterface (its
    reader's inter_sample_shift) and by dspk (the recording's sample_shifts)."""
    extractors = pytest.importorskip("spikeinterface.extractors",
                                     reason="the comparison runs against SpikeInterface")
    pre = pytest.importorskip("spikeinterface.preprocessing",
                              reason="the comparison runs against SpikeInterface")
    folder = tmp_path / "run_g0" / "run_g0_imec0"
    folder.mkdir(parents=True)
    x = band_limited(384, 12000, seed=3)
    x = np.round(x / x.std() * 3000)                             # int16 counts, RMS 3000
    data = np.zeros((12000, 385), np.int16)
    data[:, :384] = x.T
    path = write_sglx(folder, "run_g0_t0.imec0.ap.bin", data, np1_meta())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = extractors.read_spikeglx(folder, stream_id="imec0.ap")
        ref = pre.phase_shift(pre.astype(theirs, "float64")).get_traces().T
    rec = open_recording(path)
    y = phase_shift(rec.read(scaled=False).astype(np.float32), rec.sample_shifts)
    # measured 5.9e-5 of the RMS on every sample: the rounding to counts is white noise up to
    # Nyquist, where no FIR follows a fractional delay
    assert np.abs(y - ref).max() / np.sqrt((x ** 2).mean()) <= 1e-4


@pytest.mark.parametrize("freq", [1000.0, 2500.0, 5000.0])
def test_phase_shift_of_a_sine_is_the_shifted_sine(freq):
    t = np.arange(4000.0)
    shifts = np.r_[NP_SHIFTS, -0.3, 1.7, 2.0]
    x = np.tile(np.sin(2 * np.pi * freq / FS * t), (len(shifts), 1))
    y = phase_shift(x, shifts)
    want = np.sin(2 * np.pi * freq / FS * (t[None] - shifts[:, None]))
    # measured 9.7e-10 over 1-5 kHz and the NP fractions
    assert np.abs(y - want)[:, 100:-100].max() <= 1e-6


def test_the_sign_is_spikeinterfaces_a_positive_shift_delays():
    x = np.zeros((1, 200))
    x[0, 100] = 1.0
    y = phase_shift(x, [0.5])[0]
    assert y[100] == pytest.approx(y[101])            # the peak moves half a sample later
    assert y[100] > 0.6 and y[99] < 0.25 and y[102] < 0.25
    np.testing.assert_array_equal(phase_shift(x, [3.0])[0], np.roll(x[0], 3))


@pytest.mark.parametrize("taps, bound", [(33, 3.4e-5), (49, 2e-7), (63, 3e-9), (81, 1e-11)])
def test_design_error_up_to_0_8_of_nyquist(taps, bound):
    w = np.linspace(0, 0.8 * np.pi, 1500)
    worst = 0.0
    for s in np.r_[NP_SHIFTS, 0.5, -0.5, 1.25]:
        h = fractional_delay_taps(s, taps)
        assert len(h) == taps + 2 * abs(round(s)) and len(h) % 2 == 1
        _, resp = freqz(h, worN=w)
        # freqz's response is of a causal filter: remove the centring delay len(h)//2
        resp = resp * np.exp(1j * w * (len(h) // 2))
        worst = max(worst, np.abs(resp - np.exp(-1j * w * s)).max())
    assert worst <= bound


def test_taps_sum_to_one_and_whole_shifts_are_exact():
    for s in (0.1, 0.5, 11 / 13, -0.7):
        assert fractional_delay_taps(s).sum() == pytest.approx(1.0, abs=1e-14)
    h = fractional_delay_taps(-2.0, taps=3)
    np.testing.assert_array_equal(h, [0, 1, 0, 0, 0, 0, 0])     # lag -2: two samples early


def test_groups_of_channels_keep_the_input_order():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 700))
    shifts = np.array([0.5, 0.0, 0.25, 0.5, 0.25, 0.0, 1 / 13, 0.5, 0.25])
    y = phase_shift(x, shifts)
    for c in range(9):
        np.testing.assert_allclose(y[c], phase_shift(x[c:c + 1], shifts[c:c + 1])[0],
                                   rtol=0, atol=1e-12)
    np.testing.assert_array_equal(y[[1, 5]], x[[1, 5]])         # shift 0: an exact copy


def test_edges_reflect_differs_only_within_the_reach():
    x = band_limited(3, 2000, seed=5, taper=False)
    shifts = [0.2, 0.7, 0.5]
    zeros = phase_shift(x, shifts)
    mirrored = phase_shift(x, shifts, edges="reflect")
    reach = 63 // 2 + 1
    np.testing.assert_allclose(zeros[:, reach:-reach], mirrored[:, reach:-reach], rtol=0,
                               atol=1e-12)
    assert np.abs(zeros[:, :reach] - mirrored[:, :reach]).max() > 1e-3
    # reflection continues the signal: near the start it is a mirrored copy's delay
    padded = np.pad(x, ((0, 0), (500, 500)), mode="reflect")
    np.testing.assert_allclose(mirrored, phase_shift(padded, shifts)[:, 500:-500], rtol=0,
                               atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(channels=st.integers(1, 6), n=st.integers(70, 400), chunk=st.integers(1, 120),
       taps=st.sampled_from([3, 9, 33, 63]), dtype=st.sampled_from([np.float32, np.float64]),
       edges=st.sampled_from(["zeros", "reflect"]), seed=st.integers(0, 2**16),
       whole=st.booleans())
def test_chunks_with_a_halo_equal_one_call(channels, n, chunk, taps, dtype, edges, seed, whole):
    """Any chunking of the samples, each chunk read with the filters' reach on each side (x
    extended at its ends by the edge rule), gives the one-shot result; shapes and dtypes
    kept."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((channels, n)).astype(dtype)
    shifts = rng.choice([0.0, 1.0, -2.0] if whole else np.r_[NP_SHIFTS, 1.5, -0.4, 2.0],
                        channels)
    one = phase_shift(x, shifts, taps=taps, edges=edges)
    assert one.shape == x.shape and one.dtype == dtype
    halo = taps // 2 + int(np.abs(np.round(shifts)).max())
    padded = np.pad(x, ((0, 0), (halo, halo)), mode="reflect" if edges == "reflect" else
                    "constant")
    parts = []
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        part = phase_shift(padded[:, start:stop + 2 * halo], shifts, taps=taps, edges=edges,
                           halo=halo)
        assert part.shape == (channels, stop - start) and part.dtype == dtype
        parts.append(part)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(np.hstack(parts), one, rtol=0, atol=tol)


def test_bad_input():
    x = np.zeros((3, 100))
    with pytest.raises(ValueError, match=r"shifts: expected one shift per channel \(3\), got "
                                         r"shape \(2,\); pass shifts="):
        phase_shift(x, [0.1, 0.2])
    with pytest.raises(ValueError, match="shifts: not finite at channel 1"):
        phase_shift(x, [0.1, np.nan, 0.2])
    with pytest.raises(ValueError, match="shifts: not finite at channel 2"):
        phase_shift(x, [0.1, 0.3, np.inf])
    with pytest.raises(TypeError, match="shifts: expected one number per channel"):
        phase_shift(x, ["a", "b", "c"])
    bad = x.copy()
    bad[2, 7] = np.nan
    with pytest.raises(ValueError, match="x: not finite at channel 2, sample 7"):
        phase_shift(bad, [0.1, 0.2, 0.3])
    with pytest.raises(TypeError, match="x: unsupported dtype int16"):
        phase_shift(np.zeros((3, 100), np.int16), [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="x: expected a 2-D"):
        phase_shift(np.zeros(100), [0.1])
    for taps in (4, 1, 2.5, True):
        with pytest.raises(ValueError, match="taps: expected an odd number of taps >= 3"):
            phase_shift(x, 0.5, taps=taps)
    with pytest.raises(ValueError, match="edges: expected 'zeros' or 'reflect'"):
        phase_shift(x, 0.5, edges="wrap")
    for halo in (-1, 50, 1.5):
        with pytest.raises(ValueError, match="halo: expected an integer"):
            phase_shift(x, 0.5, halo=halo)
    with pytest.raises(ValueError, match="shift: expected a finite delay"):
        fractional_delay_taps(np.inf)


def test_exported_at_the_top_level():
    assert dspk.phase_shift is phase_shift


@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-6), (np.float64, 1e-12)])
def test_phase_shift_on_both_backends_matches_the_float64_reference(xp, dtype, tol):
    """The CuPy path (fir_filter's GPU candidates, gathers and scatters on the device) gives
    what NumPy in float64 gives."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((40, 5000))
    shifts = rng.choice(NP_SHIFTS, 40)
    shifts[:3] = [0.0, 1.0, 0.0]
    for edges in ("zeros", "reflect"):
        ref = phase_shift(x, shifts, edges=edges)
        y = phase_shift(xp.asarray(x.astype(dtype)), xp.asarray(shifts), edges=edges)
        assert isinstance(y, type(xp.asarray(x))) and y.dtype == dtype
        assert np.abs(to_numpy(y).astype(np.float64) - ref).max() <= tol * np.abs(ref).max()
    part = phase_shift(xp.asarray(x.astype(dtype)), xp.asarray(shifts), halo=100)
    assert part.shape == (40, 4800)
    assert np.abs(to_numpy(part).astype(np.float64) - ref[:, 100:-100]).max() <= \
        tol * np.abs(ref).max()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-6), (np.float64, 1e-12)])
def test_the_gpus_one_launch_per_channel_filters_are_the_per_group_filters(dtype, tol):
    """On the GPU every channel goes through its group's filter in one launch (fir_rows, the
    filters of different lengths centred in one bank): NumPy's float64 per-group result, a
    zero shift an exact copy, a whole shift an exact move, with and without a halo."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((37, 3001))
    shifts = rng.choice([0.0, 0.5, -2.0, 1.5, 1 / 13, 12 / 13], 37)
    shifts[:2] = [0.0, -2.0]
    for taps, halo in ((63, 0), (9, 40), (63, 100)):
        ref = phase_shift(x, shifts, taps=taps, halo=halo)
        y = phase_shift(cp.asarray(x.astype(dtype)), shifts, taps=taps, halo=halo)
        assert isinstance(y, cp.ndarray) and y.dtype == dtype and y.flags.c_contiguous
        assert y.shape == ref.shape
        got = cp.asnumpy(y).astype(np.float64)
        assert np.abs(got - ref).max() <= tol * np.abs(ref).max()
        xs = x.astype(dtype)[:, halo:x.shape[1] - halo]
        np.testing.assert_array_equal(got[0], xs[0])                    # shift 0
        np.testing.assert_array_equal(got[1, :-2], x.astype(dtype)[1, halo + 2:
                                                                   x.shape[1] - halo])
