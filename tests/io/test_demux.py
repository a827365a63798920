"""The demultiplexed common reference (CatGT's -gbldmx): `dspk.ops.demux_reference` against
its direct NumPy definition (NP1.0 and NP2.0 multiplexing, channel orders, median and mean),
the Reference step with ``groups="adc"`` on a SpikeGLX file (chunked run, the command line),
what it removes against the global reference on a multiplexed artefact
(benchmarks/bench_demux.py's recording), bad inputs; CuPy against NumPy (`gpu`)."""

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import dspk
from dspk import cli
from dspk.backend import to_numpy
from dspk.io.adc import neuropixels_sample_shifts
from dspk.ops import adc_groups, common_reference, demux_reference
from dspk.pipeline import Pipeline, PipelineError, Reference

from tests.pipeline.test_steps_neuropixels import np1_recording

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_demux import multiplexed_artifact  # noqa: E402


def direct(x, shifts, op):
    """y[c, t] = x[c, t] − op{x[c', t] : shifts[c'] == shifts[c]}, channel by channel."""
    f = np.median if op == "median" else np.mean
    y = np.empty_like(x)
    for c in range(x.shape[0]):
        same = np.flatnonzero(shifts == shifts[c])
        y[c] = x[c] - f(x[same], axis=0)
    return y


@pytest.mark.parametrize("part", ["NP1000", "NP2014"])
@pytest.mark.parametrize("op", ["median", "mean"])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_matches_the_direct_definition(part, op, dtype, tol):
    rng = np.random.default_rng(1)
    readout = rng.permutation(384)                   # any channel order
    shifts = neuropixels_sample_shifts(readout, part)
    x = rng.standard_normal((384, 2000)).astype(dtype)
    got = demux_reference(x, shifts, op)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, direct(x.astype(np.float64), shifts, op), rtol=0,
                               atol=tol)
    groups = adc_groups(shifts)
    assert len(groups) == (12 if part == "NP1000" else 16)
    assert sorted(np.concatenate(groups).tolist()) == list(range(384))
    assert {len(g) for g in groups} == ({32} if part == "NP1000" else {24})


def test_removes_a_multiplexed_artifact_the_global_reference_leaves():
    art, noise, shifts, events = multiplexed_artifact(15000, spread=0.0)
    window = np.zeros(15000, bool)
    for e in events:
        window[e - 5:e + 6] = True
    rms = np.sqrt((art[:, window] ** 2).mean())
    x = art + noise

    def left(f):
        d = f(x) - f(noise)
        return np.sqrt((d[:, window] ** 2).mean()) / rms

    g, dmx = left(lambda a: common_reference(a, "median")), \
        left(lambda a: demux_reference(a, shifts, "median"))
    assert g > 0.3 and dmx < 1e-6                   # bench_demux: 0.39 and 0.0
    art2, noise2, _, _ = multiplexed_artifact(15000, spread=0.2)
    x2 = art2 + noise2
    g2 = common_reference(x2, "mean") - common_reference(noise2, "mean")
    d2 = demux_reference(x2, shifts, "mean") - demux_reference(noise2, shifts, "mean")
    assert (d2[:, window] ** 2).mean() < 0.15 * (g2[:, window] ** 2).mean()


def test_reference_step_per_adc_instant(tmp_path, capsys):
    path = np1_recording(tmp_path, n=4000)
    with dspk.open_recording(path) as rec:
        p = Pipeline([Reference("mean", groups="adc")], backend="cpu").fit(rec)
        np.testing.assert_array_equal(p.states[0]["shifts"], rec.sample_shifts)
        out = p.run(rec, tmp_path / "dmx.h5", chunk_s=0.03, progress=False)
        x = rec.read()
        want = demux_reference(x, rec.sample_shifts, "mean")
    with h5py.File(out, "r") as f:
        np.testing.assert_allclose(f["traces"][:].T, want, rtol=0, atol=1e-3)
    assert not np.allclose(want, common_reference(x, "mean"), atol=1e-3)
    assert Reference("median", "adc").describe() == "reference='median', reference_groups='adc'"
    assert Pipeline.from_options(reference_groups="adc", whiten="none", highpass=0).steps == \
        [Reference("median", "adc")]
    assert cli.main(["preprocess", str(path), str(tmp_path / "cli.h5"), "--reference", "mean",
                     "--reference-groups", "adc", "--highpass", "0", "--whiten", "none",
                     "--backend", "cpu", "--quiet"]) == 0
    with h5py.File(tmp_path / "cli.h5", "r") as f:
        np.testing.assert_allclose(f["traces"][:].T, want, rtol=0, atol=1e-3)


def test_bad_inputs(tmp_path):
    x = np.random.default_rng(0).standard_normal((4, 300)).astype(np.float32)
    with pytest.raises(ValueError, match="sample_shifts: 3 shifts for 4 channels"):
        demux_reference(x, [0.0, 0.0, 0.5])
    with pytest.raises(ValueError, match="channel 3 is the only one"):
        demux_reference(x, [0.0, 0.0, 0.5, 0.25])
    with pytest.raises(ValueError, match="operator"):
        demux_reference(x, [0.0, 0.0, 0.5, 0.5], "max")
    with pytest.raises(ValueError, match="finite"):
        adc_groups([0.0, np.nan])
    rec = dspk.open_recording(x, fs=30000.0)                 # an array: no shifts
    with pytest.raises(PipelineError, match=r"reference_groups='adc' needs the recording's "
                                            r"sample_shifts"):
        Pipeline([Reference("median", "adc")]).fit(rec)
    path = np1_recording(tmp_path, n=3000)
    with dspk.open_recording(path) as sg:
        part = dspk.io.SubsetRecording(sg, channels=np.arange(3))   # 0,1 together; 2 alone
        with pytest.raises(PipelineError, match="only one sampled at its ADC instant"):
            Pipeline([Reference("median", "adc")]).fit(part)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["median", "mean"])
@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_cupy_matches_numpy(op, dtype, tol):
    cp = pytest.importorskip("cupy")
    shifts = neuropixels_sample_shifts(np.arange(384), "NP1000")
    x = np.random.default_rng(2).standard_normal((384, 30000)).astype(dtype)
    got = demux_reference(cp.asarray(x), shifts, op)
    assert isinstance(got, cp.ndarray) and got.dtype == dtype
    np.testing.assert_allclose(to_numpy(got), demux_reference(x, shifts, op), rtol=0, atol=tol)
