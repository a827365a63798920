"""dspk.ops.remove_artifacts against SpikeInterface's remove_artifacts on the same array (every
mode, float32 and float64, labels, single-sample windows, triggers at the ends and close
together, fit spacings), the one documented difference (a zeroed window at the first sample),
blocks with their reach of context against one call, bad inputs; the CuPy path against
NumPy (`gpu`)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspk.backend import to_numpy
from dspk.ops import (ARTIFACT_MODES, artifact_reach, artifact_templates, artifact_window,
                      remove_artifacts)

FS = 30000.0


def si_remove(x, triggers, mode, labels=None, **kwargs):
    """SpikeInterface's remove_artifacts of [channels, samples] x, as [channels, samples]."""
    core = pytest.importorskip("spikeinterface.core")
    pre = pytest.importorskip("spikeinterface.preprocessing")
    rec = core.NumpyRecording(np.ascontiguousarray(x.T), FS)
    out = pre.remove_artifacts(rec, list_triggers=[np.asarray(triggers)], mode=mode,
                               list_labels=None if labels is None else [np.asarray(labels)],
                               **kwargs)
    return out.get_traces().T


def stimulated(dtype=np.float32, channels=5, n=20000, triggers=(600, 3000, 7000, 7300,
                                                               12000, 18500), seed=0):
    """A random walk (an LFP-like drift the interpolating modes must follow) with a
    decaying artefact after each trigger, of one of two shapes by label."""
    rng = np.random.default_rng(seed)
    x = np.cumsum(rng.standard_normal((channels, n)), axis=1)
    labels = np.array(["a", "b"] * (len(triggers) // 2 + 1))[:len(triggers)]
    gain = rng.uniform(0.5, 2.0, channels)[:, None]
    for t, lab in zip(triggers, labels):
        k = np.arange(min(90, n - t))
        shape = 400 * np.exp(-k / 12) if lab == "a" else -250 * np.exp(-k / 30)
        x[:, t:t + len(k)] += gain * shape
    return x.astype(dtype), np.asarray(triggers), labels


@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-5), (np.float64, 1e-10)])
@pytest.mark.parametrize("mode", ARTIFACT_MODES)
def test_matches_spikeinterface(mode, dtype, tol):
    x, trig, lab = stimulated(dtype)
    labels = lab if mode in ("average", "median") else None
    ref = si_remove(x, trig, mode, labels, ms_before=0.5, ms_after=3.0)
    got = remove_artifacts(x, trig, 0.5, 3.0, mode, fs=FS, labels=labels)
    assert got.dtype == x.dtype and got.shape == x.shape
    scale = np.abs(ref).max()
    if mode in ("average", "median"):
        tol = max(tol, 1e-6)      # the reference's templates are float32 for any traces
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol * scale)
    assert not np.array_equal(got, x)                       # something was removed


@pytest.mark.parametrize("mode", ["zeros", "linear", "cubic"])
def test_single_sample_windows_match_spikeinterface(mode):
    x, trig, _ = stimulated(np.float64)
    ref = si_remove(x, trig, mode, ms_before=None, ms_after=None)
    got = remove_artifacts(x, trig, None, None, mode, fs=FS)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9 * np.abs(ref).max())


@pytest.mark.parametrize("mode", ["linear", "cubic", "average", "median"])
def test_ends_and_close_triggers_match_spikeinterface(mode):
    """Triggers whose windows or fit points reach past the ends (the fallbacks: nearest
    sample, extrapolation, a clipped template) and triggers within each other's reach (each
    fill reads the previous ones), in the reference's order."""
    n = 6000
    trig = np.array([2, 40, 100, 130, 3000, 3004, 5930, 5990, 5999])
    x, _, _ = stimulated(np.float64, n=n, triggers=tuple(trig))
    if mode in ("average", "median"):
        trig = trig[(trig >= 15) & (trig <= n - 90)]       # whole windows (SpikeInterface
        # leaves edge windows to a shape mismatch, and pads edge waveforms differently)
    ref = si_remove(x, trig, mode, ms_before=0.5, ms_after=3.0)
    got = remove_artifacts(x, trig, 0.5, 3.0, mode, fs=FS)
    tol = 1e-6 if mode in ("average", "median") else 1e-9      # (float32 templates)
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol * np.abs(ref).max())


@settings(max_examples=25, deadline=None)
@given(data=st.data(), mode=st.sampled_from(["linear", "cubic"]),
       spacing=st.sampled_from([0.1, 0.5, 1.0, 2.0]))
def test_random_triggers_and_spacings_match_spikeinterface(data, mode, spacing):
    n = 4000
    trig = np.sort(np.array(data.draw(st.lists(st.integers(-80, n + 10), min_size=1,
                                               max_size=6), label="triggers")))
    before = data.draw(st.sampled_from([0.0, 0.2, 1.0]), label="ms_before")
    after = data.draw(st.sampled_from([0.0, 0.5, 2.0]), label="ms_after")
    x, _, _ = stimulated(np.float64, channels=3, n=n, triggers=())
    ref = si_remove(x, trig, mode, ms_before=before, ms_after=after,
                    fit_sample_spacing=spacing)
    got = remove_artifacts(x, trig, before, after, mode, fs=FS, fit_sample_spacing=spacing)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-8 * np.abs(ref).max())


def test_zeros_at_the_first_sample_is_the_documented_difference():
    """A window reaching sample 0: SpikeInterface stops one sample short of t + after there
    (and at the start of each chunk it is given); dspk zeros the whole window everywhere."""
    x = np.ones((2, 500))
    before, after = artifact_window(0.5, 3.0, FS)
    ref = si_remove(x, [10], "zeros", ms_before=0.5, ms_after=3.0)
    got = remove_artifacts(x, [10], 0.5, 3.0, "zeros", fs=FS)
    diff = np.flatnonzero((got != ref).any(axis=0))
    assert diff.tolist() == [10 + after]
    assert (got[:, :10 + after + 1] == 0).all() and (got[:, 10 + after + 1:] == 1).all()
    # inside, both zero t - before .. t + after
    inner = remove_artifacts(x, [200], 0.5, 3.0, "zeros", fs=FS)
    assert np.flatnonzero(inner[0] == 0).tolist() == list(range(200 - before, 200 + after + 1))
    np.testing.assert_array_equal(inner, si_remove(x, [200], "zeros", ms_before=0.5,
                                                   ms_after=3.0))


@pytest.mark.parametrize("mode", ARTIFACT_MODES)
def test_blocks_with_their_reach_equal_one_call(mode):
    x, trig, lab = stimulated(np.float64, n=20000)
    labels = lab if mode in ("average", "median") else None
    whole = remove_artifacts(x, trig, 0.5, 3.0, mode, fs=FS, labels=labels)
    templates = None
    if mode in ("average", "median"):
        templates = artifact_templates(x, trig, 0.5, 3.0, fs=FS, labels=labels, operator=mode)
    m = artifact_reach(0.5, 3.0, mode, FS)
    parts = []
    for s0 in range(0, 20000, 2900):                     # blocks that cut windows
        s1 = min(20000, s0 + 2900)
        a, b = max(0, s0 - m), min(20000, s1 + m)
        y = remove_artifacts(x[:, a:b], trig, 0.5, 3.0, mode, fs=FS, labels=labels,
                             templates=templates, start=a)
        parts.append(y[:, s0 - a:s0 - a + s1 - s0])
    np.testing.assert_allclose(np.hstack(parts), whole, rtol=0, atol=1e-12)


def test_templates_per_label():
    x = np.zeros((2, 1000))
    x[:, [100, 300]] = [[1.0, 3.0], [2.0, 6.0]]
    x[:, 600] = [10.0, 20.0]
    names, tpl = artifact_templates(x, [100, 300, 600], 0.1, 0.1, fs=10000.0,
                                    labels=[7, 7, 9])
    assert names.tolist() == [7, 9] and tpl.shape == (2, 2, 2)
    np.testing.assert_allclose(tpl[0], [[0.0, 2.0], [0.0, 4.0]])
    np.testing.assert_allclose(tpl[1], [[0.0, 10.0], [0.0, 20.0]])
    _, med = artifact_templates(x, [100, 300, 600], 0.1, 0.1, fs=10000.0, operator="median")
    np.testing.assert_allclose(med[0], [[0.0, 3.0], [0.0, 6.0]])
    y = remove_artifacts(x, [100, 300, 600], 0.1, 0.1, "average", fs=10000.0,
                         labels=[7, 7, 9])
    np.testing.assert_allclose(y[:, [100, 300, 600]], [[-1.0, 1.0, 0.0], [-2.0, 2.0, 0.0]])


def test_bad_inputs():
    x = np.zeros((2, 100), np.float32)
    with pytest.raises(ValueError, match="mode"):
        remove_artifacts(x, [5], mode="spline", fs=FS)
    with pytest.raises(ValueError, match="fs"):
        remove_artifacts(x, [5], fs=0.0)
    with pytest.raises(ValueError, match="ms_before"):
        remove_artifacts(x, [5], -1.0, 3.0, fs=FS)
    with pytest.raises(ValueError, match="ms_before, ms_after"):
        remove_artifacts(x, [5], None, 3.0, fs=FS)
    with pytest.raises(ValueError, match="samples"):
        remove_artifacts(x, [5.5], fs=FS)
    with pytest.raises(ValueError, match="samples"):
        remove_artifacts(x, [[5]], fs=FS)
    with pytest.raises(ValueError, match="labels"):
        remove_artifacts(x, [5, 9], labels=[1], fs=FS)
    with pytest.raises(ValueError, match="fit_sample_spacing"):
        remove_artifacts(x, [5], mode="linear", fs=1000.0, fit_sample_spacing=0.5)
    with pytest.raises(ValueError, match="needs a window"):
        remove_artifacts(x, [5], None, None, "median", fs=FS)
    with pytest.raises(ValueError, match="templates: expected shape"):
        remove_artifacts(x, [5], 0.5, 3.0, "average", fs=FS,
                         templates=([0], np.zeros((1, 2, 3))))
    with pytest.raises(ValueError, match="no artefact for label"):
        remove_artifacts(x, [5], 0.5, 3.0, "average", fs=FS, labels=[4],
                         templates=([0], np.zeros((1, 2, 105))))
    with pytest.raises(TypeError, match="x"):
        remove_artifacts(np.zeros((2, 100), np.int16), [5], fs=FS)
    with pytest.raises(ValueError, match="operator"):
        artifact_templates(x, [5], 0.5, 3.0, fs=FS, operator="max")
    assert remove_artifacts(x, np.array([], np.int64), fs=FS).shape == x.shape


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ARTIFACT_MODES)
@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-5), (np.float64, 1e-10)])
def test_cupy_matches_numpy(mode, dtype, tol):
    cp = pytest.importorskip("cupy")
    x, trig, lab = stimulated(dtype, n=20000, triggers=(2, 600, 3000, 3010, 12000, 19990))
    labels = lab if mode in ("average", "median") else None
    ref = remove_artifacts(x, trig, 0.5, 3.0, mode, fs=FS, labels=labels)
    got = remove_artifacts(cp.asarray(x), cp.asarray(trig), 0.5, 3.0, mode, fs=FS,
                           labels=labels)
    assert isinstance(got, cp.ndarray) and got.dtype == x.dtype
    np.testing.assert_allclose(to_numpy(got), ref, rtol=0, atol=tol * np.abs(ref).max())
