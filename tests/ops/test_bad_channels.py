"""dspk.ops.detect_bad_channels against SpikeInterface's detect_bad_channels(method=
"coherence+psd") on synthetic Neuropixels 1.0 recordings (384 channels, dead, noisy and
outside-the-brain channels, channels on each threshold's edge) across 3 seeds: the labels,
each chunk's labels, the chunks drawn; the outside locations on SpikeInterface's own test
probe; shapes and dtypes (hypothesis); bad input; the CuPy path against NumPy (`gpu` params)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspk
from dspk.ops import BadChannels, detect_bad_channels
from dspk.ops.bad_channels import FEATURES, LABELS
from tests.geometry import np1_geometry

FS = 30000.0
NOISE_UV = 8.0


def band(rng, shape, lo, hi):
    from scipy.signal import butter, sosfiltfilt

    sos = butter(3, [lo, hi], btype="bandpass", fs=FS, output="sos")
    return sosfiltfilt(sos, rng.standard_normal(shape), axis=-1)


@functools.lru_cache(maxsize=3)
def np1_recording(seed, n_ch=384, seconds=4.0, n_out=40, fade=12):
    """[channels, samples] float32 µV, its geometry, and the labels injected.

    In the brain: 300–6000 Hz noise (8 µV RMS) plus two shared 300–1500 Hz signals (≈15 µV,
    varying slowly with depth) that make the channels coherent. The top ``n_out`` channels are
    outside the brain (no shared signal, quieter 300–3000 Hz noise), the shared signal fading
    over the ``fade`` channels below. Injected among the others: dead (2 flat, 2 at 0.05 µV),
    noisy (4 with broadband noise ×5, 2 with their signal ×3, too similar to the median
    trace), and channels on a threshold's edge, whose label varies between chunks and is
    not asserted (only that dspk and SpikeInterface agree): the shared signal at 0.48–0.52
    (``xcorr_neighbors`` ≈ −0.5) and ×1.95–2.05 (≈ 1), white noise at ≈ 0.02 µV²/Hz.
    """
    rng = np.random.default_rng(seed)
    n = int(seconds * FS)
    geom = np1_geometry(n_ch)
    depth = geom[:, 1]
    noise = band(rng, (n_ch, n), 300, 6000)
    noise *= NOISE_UV / noise.std(axis=1, keepdims=True)
    shared = band(rng, (2, n), 300, 1500)
    shared /= shared.std(axis=1, keepdims=True)
    gain = 15.0 * (1 + 0.3 * np.sin(depth / 700.0))[:, None]
    signal = gain * (0.7 * np.c_[np.ones(n_ch), np.cos(depth / 900.0)] @ shared)
    top_down = np.argsort(depth, kind="stable")[::-1]
    out, fading = top_down[:n_out], top_down[n_out:n_out + fade]
    scale = np.ones(n_ch)
    scale[out] = 0.0
    scale[fading] = np.linspace(0.9, 0.15, fade)[::-1]
    x = noise + scale[:, None] * signal
    x[out] = band(rng, (n_out, n), 300, 3000) * 3.0
    expected = {int(c): "out" for c in out}
    inner = rng.permutation(np.setdiff1d(np.arange(n_ch), np.r_[out, fading]))
    dead, noisy, hot, edge = inner[:4], inner[4:8], inner[8:10], inner[10:19]
    x[dead[:2]] = 0.0
    x[dead[2:]] = rng.normal(0, 0.05, (2, n))
    x[noisy] += rng.normal(0, 5 * NOISE_UV, (len(noisy), n))
    x[hot] = noise[hot] + 3.0 * signal[hot]
    expected.update({int(c): "dead" for c in dead})
    expected.update({int(c): "noise" for c in np.r_[noisy, hot]})
    for c, k in zip(edge[:3], (0.48, 0.5, 0.52)):
        x[c] = noise[c] + k * signal[c]
    for c, k in zip(edge[3:6], (1.95, 2.0, 2.05)):
        x[c] = noise[c] + k * signal[c]
    for c, s in zip(edge[6:], (16.8, 17.3, 17.8)):   # 0.02 µV²/Hz white: σ² = 0.02 · fs/2
        x[c] = noise[c] + signal[c] + rng.normal(0, s, n)
    expected.update({int(c): "good" for c in np.setdiff1d(inner, np.r_[dead, noisy, hot,
                                                                        edge])})
    return x.astype(np.float32), geom, expected, set(int(c) for c in np.r_[fading, edge])


def si_recording(x, geom, filtered=True):
    """A SpikeInterface recording of [channels, samples] µV traces with geometry's probe."""
    core = pytest.importorskip("spikeinterface.core",
                               reason="the comparison runs against SpikeInterface")
    pi = pytest.importorskip("probeinterface", reason="SpikeInterface needs a probe attached")
    rec = core.NumpyRecording(np.ascontiguousarray(x.T), FS)
    rec.set_channel_gains(1.0)
    rec.set_channel_offsets(0.0)
    probe = pi.Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=geom, shapes="square", shape_params={"width": 12})
    probe.set_device_channel_indices(np.arange(len(geom)))
    attached = rec.set_probe(probe)        # in place from 0.105; a new recording before
    rec = rec if attached is None else attached
    if filtered:
        rec.annotate(is_filtered=True)     # assess the traces as given, as dspk does
    return rec


def si_labels(x, geom, **kwargs):
    pre = pytest.importorskip("spikeinterface.preprocessing",
                              reason="the comparison runs against SpikeInterface")
    _, labels = pre.detect_bad_channels(si_recording(x, geom), method="coherence+psd",
                                        job_kwargs={"n_jobs": 1, "progress_bar": False},
                                        **kwargs)
    return np.asarray(labels)


def disagreements(found: BadChannels, reference: np.ndarray) -> str:
    """One line per channel labelled differently: both labels, the chunk labels, features."""
    medians = found.channel_features()
    lines = []
    for c in np.flatnonzero(found.labels != reference):
        kinds, counts = np.unique(found.chunk_labels[:, c], return_counts=True)
        feats = ", ".join(f"{k}={medians[k][c]:.6g}" for k in FEATURES)
        lines.append(f"channel {c}: dspk {found.labels[c]!r}, SpikeInterface "
                     f"{reference[c]!r}; dspk's chunks {dict(zip(kinds, counts.tolist()))}; "
                     f"median features {feats}")
    return "\n".join(lines)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_labels_match_spikeinterface_on_a_neuropixels_recording(seed):
    x, geom, expected, _ = np1_recording(seed)
    kwargs = {"num_random_chunks": 20, "seed": seed}
    reference = si_labels(x, geom, **kwargs)
    found = detect_bad_channels(x, geom, FS, **kwargs)
    assert (found.labels == reference).all(), \
        "labels that differ from SpikeInterface's:\n" + disagreements(found, reference)
    # the recording holds what it was built to: each injected channel is found
    got = {c: str(found.labels[c]) for c in expected}
    assert got == expected
    assert {"dead", "noise", "out"} <= set(found.labels.tolist())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_chunks_labels_are_spikeinterfaces(seed):
    """Chunk by chunk, against the reference's per-chunk function (on its depth order)."""
    mod = pytest.importorskip("spikeinterface.preprocessing.detect_bad_channels",
                              reason="the comparison runs against SpikeInterface")
    core = pytest.importorskip("spikeinterface.core", reason="SpikeInterface's depth order")
    x, geom, _, edge = np1_recording(seed)
    found = detect_bad_channels(x, geom, FS, num_random_chunks=8, seed=10 + seed)
    order_f, order_r = core.order_channels_by_depth(si_recording(x, geom))
    differ = []
    for i, s in enumerate(found.chunk_starts):
        raw = x[:, s:s + found.chunk_samples].T[:, order_f]
        codes = mod.detect_bad_channels_ibl(raw, FS, psd_hf_threshold=0.02)[order_r]
        ref = np.array(LABELS)[codes]
        differ += [f"chunk {i} channel {c}: dspk {found.chunk_labels[i, c]!r}, SpikeInterface "
                   f"{ref[c]!r}, " + ", ".join(f"{k}={found.features[k][i, c]:.6g}"
                                               for k in FEATURES)
                   for c in np.flatnonzero(found.chunk_labels[i] != ref)]
    assert not differ, "\n".join(differ)
    # the edge channels are on their thresholds: the chunks do not all agree on some
    varying = [c for c in edge if len(set(found.chunk_labels[:, c].tolist())) > 1]
    assert varying


@pytest.mark.parametrize("n, seconds, num, seed", [(20000, 0.3, 10, 0), (9000, 0.3, 4, 1),
                                                   (100000, 0.5, 100, 7), (50000, 0.01, 3, 42)])
def test_the_chunks_are_spikeinterfaces(n, seconds, num, seed):
    tools = pytest.importorskip("spikeinterface.core.time_series_tools",
                                reason="the comparison runs against SpikeInterface")
    x = np.zeros((12, n), dtype=np.float32)
    rec = si_recording(x, np1_geometry(12))
    chunk = int(seconds * FS)
    slices = tools.get_random_sample_slices(rec, num_chunks_per_segment=num, chunk_size=chunk,
                                            seed=seed)
    x[:, ::7] = 1.0                          # not flat: a valid (if odd) recording
    found = detect_bad_channels(x, np1_geometry(12), FS, chunk_duration_s=seconds,
                                num_random_chunks=num, seed=seed, n_neighbors=5)
    assert found.chunk_samples == chunk
    assert found.chunk_starts.tolist() == [s for _, s, _ in slices]


@pytest.mark.parametrize("location", ["top", "bottom", "both"])
def test_outside_channels_at_either_end_as_spikeinterfaces_test(location):
    """SpikeInterface's own test: 64 channels in a line, 10 at each end at 5% amplitude."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, int(4 * FS))).astype(np.float32)
    x[:10] *= 0.05
    x[-10:] *= 0.05
    geom = np.c_[np.zeros(64), 20.0 * np.arange(64)]
    kwargs = {"outside_channels_location": location, "num_random_chunks": 20, "seed": 5}
    reference = si_labels(x, geom, **kwargs)
    found = detect_bad_channels(x, geom, FS, **kwargs)
    assert (found.labels == reference).all(), disagreements(found, reference)
    out = np.flatnonzero(found.labels == "out").tolist()
    ends = {"top": list(range(54, 64)), "bottom": list(range(10)),
            "both": list(range(10)) + list(range(54, 64))}
    assert out == ends[location]


def test_the_defaults_are_spikeinterfaces():
    """100 chunks of 0.3 s and every threshold as the reference's defaults."""
    x, geom, _, _ = np1_recording(0)
    sub = np.flatnonzero(geom[:, 1] >= 2800)     # the top 96 channels: out, fading, some in
    with pytest.warns(UserWarning, match="Over 1/3 of channels"):
        reference = si_labels(x[sub], geom[sub], seed=4)
    with pytest.warns(UserWarning, match="43 of 104 channels are labelled bad"):
        found = detect_bad_channels(x[sub], geom[sub], FS, seed=4)
    assert found.chunk_labels.shape == (100, len(sub))
    assert found.chunk_samples == int(0.3 * FS)
    assert (found.labels == reference).all(), disagreements(found, reference)
    assert "out" in found.labels


def test_x_as_given_is_one_chunk_of_all_of_it():
    x, geom, _, _ = np1_recording(1)
    x = x[:, :12000]
    found = detect_bad_channels(x, geom, FS, num_random_chunks=None)
    assert found.chunk_starts.tolist() == [0] and found.chunk_samples == 12000
    # the reference with one chunk as long as the recording
    reference = si_labels(x, geom, num_random_chunks=1, chunk_duration_s=12000 / FS, seed=0)
    assert (found.labels == reference).all(), disagreements(found, reference)
    assert (found.chunk_labels[0] == found.labels).all()


@pytest.mark.parametrize("seed", [0, 2])
def test_the_channel_order_does_not_matter(seed):
    x, geom, _, _ = np1_recording(seed)
    perm = np.random.default_rng(seed).permutation(len(geom))
    a = detect_bad_channels(x, geom, FS, num_random_chunks=6, seed=1)
    b = detect_bad_channels(x[perm], geom[perm], FS, num_random_chunks=6, seed=1)
    np.testing.assert_array_equal(b.labels, a.labels[perm])
    for k in FEATURES:
        np.testing.assert_allclose(b.features[k], a.features[k][:, perm], rtol=1e-9,
                                   atol=1e-12)


def test_direction_x_orders_by_x():
    x, geom, _, _ = np1_recording(0)
    a = detect_bad_channels(x, geom, FS, num_random_chunks=4, seed=2)
    b = detect_bad_channels(x, geom[:, ::-1], FS, num_random_chunks=4, seed=2, direction="x")
    np.testing.assert_array_equal(a.labels, b.labels)
    for k in FEATURES:
        np.testing.assert_array_equal(a.features[k], b.features[k])


def test_a_probeinterface_probe_is_accepted():
    pi = pytest.importorskip("probeinterface", reason="a Probe as geometry")
    x, geom, _, _ = np1_recording(2)
    probe = pi.Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=geom)
    a = detect_bad_channels(x, probe, FS, num_random_chunks=3, seed=0)
    b = detect_bad_channels(x, geom, FS, num_random_chunks=3, seed=0)
    np.testing.assert_array_equal(a.labels, b.labels)


def test_the_result():
    x, geom, expected, _ = np1_recording(0)
    found = detect_bad_channels(x, geom, FS, num_random_chunks=5, seed=3)
    assert found.labels.shape == (384,) and found.labels.dtype.kind == "U"
    np.testing.assert_array_equal(found.bad, found.labels != "good")
    assert set(found.features) == set(FEATURES)
    medians = found.channel_features()
    for k in FEATURES:
        assert found.features[k].shape == (5, 384) and found.features[k].dtype == np.float64
        np.testing.assert_array_equal(medians[k], np.median(found.features[k], axis=0))
    np.testing.assert_allclose(found.features["xcorr_neighbors"],
                               found.features["xcorr"] - found.features["trend"])
    dead = [c for c, v in expected.items() if v == "dead"]
    assert (np.abs(found.features["xcorr"][:, dead]) < 0.01).all()


def test_too_many_bad_channels_warn_as_the_reference():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (1, 3000)) + rng.normal(0, 0.1, (24, 3000))
    x[:10] += rng.normal(0, 30, (10, 3000))        # noisy: 0.06 µV²/Hz at high frequencies
    with pytest.warns(UserWarning, match="10 of 24 channels are labelled bad"):
        found = detect_bad_channels(x, np.c_[np.zeros(24), np.arange(24.0)], FS,
                                    num_random_chunks=None, n_neighbors=5)
    assert (found.labels[:10] != "good").all()


@pytest.mark.filterwarnings("ignore:.* channels are labelled bad")
@settings(max_examples=25, deadline=None)
@given(n_ch=st.integers(3, 24), n=st.integers(600, 4000), data=st.data(),
       dtype=st.sampled_from([np.float32, np.float64, np.int16]))
def test_shapes_and_dtypes(n_ch, n, data, dtype):
    """Any real dtype gives the labels of its values in float64; shapes follow the chunks."""
    seed = data.draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 5, (1, n)) + rng.normal(0, 2, (n_ch, n))
    x = x.astype(dtype)
    geom = np1_geometry(n_ch)
    k = data.draw(st.integers(1, n_ch))
    num = data.draw(st.one_of(st.none(), st.integers(1, 6)))
    chunk_s = data.draw(st.floats(300 / FS, n / FS))
    kwargs = {"n_neighbors": k, "num_random_chunks": num, "chunk_duration_s": chunk_s,
              "seed": seed}
    found = detect_bad_channels(x, geom, FS, **kwargs)
    chunks = 1 if num is None else num
    length = n if num is None else int(chunk_s * FS)
    assert found.chunk_samples == length and found.chunk_starts.shape == (chunks,)
    assert ((found.chunk_starts >= 0) & (found.chunk_starts + length <= n)).all()
    assert found.labels.shape == (n_ch,) and set(found.labels.tolist()) <= set(LABELS)
    assert found.chunk_labels.shape == (chunks, n_ch)
    for name in FEATURES:
        assert found.features[name].shape == (chunks, n_ch)
        assert found.features[name].dtype == np.float64
    # the label is the most frequent chunk label, ties to the first of LABELS
    counts = np.stack([(found.chunk_labels == lab).sum(axis=0) for lab in LABELS])
    np.testing.assert_array_equal(found.labels, np.array(LABELS)[counts.argmax(axis=0)])
    as_float = detect_bad_channels(x.astype(np.float64), geom, FS, **kwargs)
    np.testing.assert_array_equal(found.labels, as_float.labels)
    for name in FEATURES:
        np.testing.assert_array_equal(found.features[name], as_float.features[name])


def test_bad_input():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 10, (16, 9000))
    geom = np1_geometry(16)
    with pytest.raises(TypeError, match="x: expected a NumPy or CuPy"):
        detect_bad_channels(x.tolist(), geom, FS)
    with pytest.raises(ValueError, match=r"x: expected a non-empty 2-D \[channels, samples\]"):
        detect_bad_channels(x[0], geom, FS)
    with pytest.raises(ValueError, match=r"x: expected a non-empty 2-D"):
        detect_bad_channels(x[:, :0], geom, FS)
    with pytest.raises(TypeError, match="x: expected real numbers"):
        detect_bad_channels(x.astype(np.complex128), geom, FS)
    with pytest.raises(ValueError, match=r"geometry: expected \[channels, 2\] positions in µm "
                                         r"\(x, y\), got shape \(16, 3\); pass geometry="):
        detect_bad_channels(x, np.zeros((16, 3)), FS)
    with pytest.raises(ValueError, match="geometry: 15 positions for the 16 channels of x"):
        detect_bad_channels(x, geom[:15], FS)
    with pytest.raises(ValueError, match="geometry: the position of channel 3 is not finite"):
        detect_bad_channels(x, np.where(np.arange(16)[:, None] == 3, np.nan, geom), FS)
    for fs in (0.0, -30000.0, float("nan")):
        with pytest.raises(ValueError, match="fs: expected a positive finite number.*pass fs="):
            detect_bad_channels(x, geom, fs)
    with pytest.raises(TypeError, match="fs: expected a positive number"):
        detect_bad_channels(x, geom, "fast")
    with pytest.raises(ValueError, match=r"x: 9000 samples, fewer than one chunk of "
                                         r"chunk_duration_s=0\.5 \(15000 samples at 30000\.0 "
                                         r"Hz\); pass a shorter chunk_duration_s= or "
                                         r"num_random_chunks=None"):
        detect_bad_channels(x, geom, FS, chunk_duration_s=0.5)
    with pytest.raises(ValueError, match="chunk_duration_s: expected a positive finite"):
        detect_bad_channels(x, geom, FS, chunk_duration_s=0.0)
    with pytest.raises(ValueError, match="chunk_duration_s: 1e-06 s is less than one sample"):
        detect_bad_channels(x, geom, FS, chunk_duration_s=1e-6)
    with pytest.raises(ValueError, match="num_random_chunks: expected an integer ≥ 1"):
        detect_bad_channels(x, geom, FS, num_random_chunks=0)
    with pytest.raises(ValueError, match="num_random_chunks: expected an integer ≥ 1"):
        detect_bad_channels(x, geom, FS, num_random_chunks=2.5)
    with pytest.raises(TypeError, match="seed: expected an integer or None"):
        detect_bad_channels(x, geom, FS, seed="zero")
    y = x.copy()
    y[4, 10] = np.nan
    with pytest.raises(ValueError, match="x: not finite \\(NaN or inf\\) at channel 4, "
                                         "sample 10"):
        detect_bad_channels(y, geom, FS, num_random_chunks=None)
    y[4, 10] = np.inf
    with pytest.raises(ValueError, match="x: not finite"):
        detect_bad_channels(y, geom, FS, num_random_chunks=None)
    with pytest.raises(ValueError, match=r"n_neighbors: 17 neighbours for the running median, "
                                         r"but x has 16 channels; pass n_neighbors="):
        detect_bad_channels(x, geom, FS, n_neighbors=17)
    with pytest.raises(ValueError, match="n_neighbors: expected an integer ≥ 1"):
        detect_bad_channels(x, geom, FS, n_neighbors=0)
    for v in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"nyquist_threshold: expected a fraction of fs/2 "
                                             r"in \(0, 1\)"):
            detect_bad_channels(x, geom, FS, nyquist_threshold=v)
    with pytest.raises(ValueError, match="welch_window_ms: a Welch segment of 1 samples has "
                                         "no frequency above nyquist_threshold=0.8"):
        detect_bad_channels(x, geom, FS, welch_window_ms=0.04)
    with pytest.raises(ValueError, match="welch_window_ms: expected a positive"):
        detect_bad_channels(x, geom, FS, welch_window_ms=-1)
    with pytest.raises(ValueError, match="outside_channels_location: expected one of 'top', "
                                         "'bottom', 'both', got 'side'"):
        detect_bad_channels(x, geom, FS, outside_channels_location="side")
    with pytest.raises(ValueError, match="direction: expected one of 'x', 'y', got 'z'"):
        detect_bad_channels(x, geom, FS, direction="z")
    for name in ("psd_hf_threshold", "dead_channel_threshold", "noisy_channel_threshold",
                 "outside_channel_threshold"):
        with pytest.raises(ValueError, match=f"{name}: expected a finite number"):
            detect_bad_channels(x, geom, FS, **{name: float("nan")})


def test_exported_at_the_top_level():
    assert dspk.detect_bad_channels is detect_bad_channels
    assert dspk.ops.detect_bad_channels is detect_bad_channels


def test_cupy_traces_give_the_numpy_labels(xp):
    """CuPy input is assessed on the device: the NumPy labels, the features to float64
    rounding (the FFTs and the median's reductions differ in order), host-side results."""
    x, geom, _, _ = np1_recording(1)
    ref = detect_bad_channels(x, geom, FS, num_random_chunks=6, seed=9)
    found = detect_bad_channels(xp.asarray(x), xp.asarray(geom), FS, num_random_chunks=6,
                                seed=9)
    assert isinstance(found.labels, np.ndarray)
    np.testing.assert_array_equal(found.labels, ref.labels)
    np.testing.assert_array_equal(found.chunk_starts, ref.chunk_starts)
    for k in FEATURES:
        assert isinstance(found.features[k], np.ndarray)
        np.testing.assert_allclose(found.features[k], ref.features[k], rtol=1e-9,
                                   atol=1e-12 * np.abs(ref.features[k]).max())
    y = xp.asarray(x[:40, :9000])
    y[5, 100] = xp.nan
    with pytest.raises(ValueError, match="x: not finite \\(NaN or inf\\) at channel 5, "
                                         "sample 100"):
        detect_bad_channels(y, geom[:40], FS, num_random_chunks=None)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), size=st.integers(1, 25), seed=st.integers(0, 2**16),
       ties=st.booleans())
def test_the_running_median_is_the_references_window_by_window(n, size, seed, ties):
    """shrinking_median (full windows over a sliding view, the ends one by one) is the
    reference's window-by-window definition to the bit, for any length and window, odd or
    even, with ties."""
    from dspk.ops.bad_channels import shrinking_median

    rng = np.random.default_rng(seed)
    v = rng.integers(0, 4, n).astype(np.float64) if ties else rng.standard_normal(n)
    half = size // 2
    ref = np.array([np.median(v[max(0, i - half):i + half + 1]) for i in range(n)])
    np.testing.assert_array_equal(shrinking_median(v, size), ref)
