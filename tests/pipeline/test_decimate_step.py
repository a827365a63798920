"""`Decimate` as a pipeline step: the decimated recording against
``scipy.signal.decimate(ftype="fir")`` of the whole recording for any block (a property over
block boundaries), a job's output independent of the chunk size and written at its own rate
(the HDF5 file's and the Kilosort folder's ``fs``, read back by dspk and by SpikeInterface),
the steps after it at the new rate, `Pipeline.transform`; its options and refusals; the GPU
forms against the CPU ones (`gpu`)."""

import os

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import signal

import dspk
from dspk import cli
from dspk.pipeline import Decimate, Pipeline, PipelineError, Reference
from dspk.pipeline.steps.decimate import DecimatedRecording

FS = 30000.0


def lfp_like(n_ch=6, n=36011, seed=0):
    """Slow waves plus broadband noise (what a decimation keeps and removes), float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / FS
    slow = np.sin(2 * np.pi * 7.0 * t)[None] * rng.uniform(50, 100, (n_ch, 1))
    return (slow + rng.normal(0, 20, (n_ch, n))).astype(np.float32)


def geometry(n_ch):
    return np.c_[np.zeros(n_ch), 20.0 * np.arange(n_ch)]


X = lfp_like()
REF = signal.decimate(X.astype(np.float64), 12, ftype="fir", axis=1)    # the one-shot
SCALE = float(np.abs(REF).max())


@settings(max_examples=30, deadline=None)
@given(a=st.integers(0, REF.shape[1] - 2), width=st.integers(1, 900))
def test_any_block_of_the_decimated_recording_is_the_one_shots(a, width):
    b = min(REF.shape[1], a + width)
    rec = DecimatedRecording(dspk.open_recording(X, fs=FS, layout="channels_samples"), 12)
    assert (rec.fs, rec.n_samples) == (2500.0, REF.shape[1]) == (2500.0, 3001)
    got = rec.read(a, b)
    np.testing.assert_allclose(got, REF[:, a:b], rtol=0, atol=3e-7 * SCALE)


@pytest.mark.parametrize("chunk_s", [0.05, 0.137, 1.0])
def test_a_jobs_output_does_not_depend_on_the_chunk_and_is_at_its_own_rate(tmp_path, chunk_s):
    rec = dspk.open_recording(X, fs=FS, layout="channels_samples", geometry=geometry(6))
    p = Pipeline.from_options(decimate=12, highpass=0, reference="none", whiten="none",
                              backend="cpu")
    out = p.run(rec, str(tmp_path / "o.h5"), chunk_s=chunk_s, progress=False)
    with h5py.File(out, "r") as f:
        y = f["traces"][()].T
        assert float(f["traces"].attrs["fs"]) == 2500.0
    np.testing.assert_allclose(y, REF, rtol=0, atol=3e-7 * SCALE)
    with dspk.open_recording(out) as back:
        assert (back.fs, back.n_samples) == (2500.0, 3001)
    assert p.fs == FS                          # the pipeline's rate: its input's


def test_steps_after_it_run_at_the_new_rate_and_spikeinterface_reads_the_output(tmp_path):
    si = pytest.importorskip("spikeinterface.core")
    dsi = pytest.importorskip("dspk.spikeinterface")
    rec = dspk.open_recording(X, fs=FS, layout="channels_samples", geometry=geometry(6))
    p = Pipeline.from_options(decimate_to=2500.0, highpass=100.0, reference="median",
                              whiten="none", backend="cpu")
    assert [type(s).__name__ for s in p.steps] == ["Decimate", "HighPass", "Reference"]
    out = p.run(rec, str(tmp_path / "o.h5"), chunk_s=0.1, progress=False)
    # the same steps on the decimated array (Pipeline.transform: decimate, then the others
    # at 2.5 kHz), and by hand
    want = Pipeline.from_options(highpass=100.0, reference="median", whiten="none",
                                 backend="cpu").transform(REF.astype(np.float32), fs=2500.0)
    np.testing.assert_allclose(p.transform(X, FS), want, rtol=0, atol=2e-5 * SCALE)
    with h5py.File(out, "r") as f:
        np.testing.assert_allclose(f["traces"][()].T, want, rtol=0, atol=2e-5 * SCALE)
    back = dsi.DspkOutputRecording(out)
    assert back.get_sampling_frequency() == 2500.0 and back.get_num_samples() == 3001
    np.testing.assert_allclose(back.get_traces().T, want, rtol=0, atol=2e-5 * SCALE)
    # a Kilosort folder: its binary at 2.5 kHz, as SpikeInterface reads it with params.py
    ks = p.run(rec, str(tmp_path / "ks"), format="kilosort", progress=False, chunk_s=0.1)
    params = {}
    exec((ks / "params.py").read_text(), {}, params)
    assert params["sample_rate"] == 2500.0
    sb = si.read_binary(ks / "traces.bin", sampling_frequency=params["sample_rate"],
                        dtype=params["dtype"], num_channels=params["n_channels_dat"])
    assert sb.get_num_samples() == 3001
    with pytest.raises(PipelineError, match="decimate"):
        dsi.DspkRecording(si.NumpyRecording([X.T], sampling_frequency=FS), decimate=12)


def test_a_recording_at_the_target_rate_is_left_as_it_is(tmp_path):
    rec = dspk.open_recording(REF.astype(np.float32), fs=2500.0, layout="channels_samples")
    p = Pipeline.from_options(decimate_to=2500.0, highpass=0, reference="mean", whiten="none")
    assert p.source(rec) is rec
    out = p.run(rec, str(tmp_path / "o.h5"), progress=False)
    with h5py.File(out, "r") as f:
        assert f["traces"].shape == (3001, 6) and float(f["traces"].attrs["fs"]) == 2500.0


def test_options_help_and_refusals(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["preprocess", "--help"])
    text = capsys.readouterr().out
    for flag in ("--decimate Q", "--decimate-to HZ", "--butter-bandpass LO HI", "ibl-lfp"):
        assert flag in text
    with pytest.raises(PipelineError, match="decimate=1"):
        Decimate(1)
    with pytest.raises(PipelineError, match="one of them"):
        Decimate(12, target_hz=2500.0)
    with pytest.raises(PipelineError, match="first step"):
        Pipeline([Reference("mean"), Decimate(12)])
    rec = dspk.open_recording(X, fs=FS, layout="channels_samples")
    with pytest.raises(PipelineError, match="decimate_to=7000.0.*not a whole factor"):
        Pipeline.from_options(decimate_to=7000.0, whiten="none").run(
            rec, str(tmp_path / "o.h5"), progress=False)
    assert not os.path.exists(tmp_path / "o.h5.partial")
    with pytest.raises(PipelineError, match="give one of them"):
        Pipeline.from_options(decimate=12, decimate_to=2500.0)
    raw = tmp_path / "r.bin"
    X.T.astype(np.int16).tofile(raw)
    assert cli.main(["preprocess", str(raw), str(tmp_path / "c.h5"), "--n-channels", "6",
                     "--fs", "30000", "--decimate-to", "7000", "--whiten", "none"]) == 2
    assert "--decimate-to 7000" in capsys.readouterr().err
    assert cli.main(["preprocess", str(raw), str(tmp_path / "c.h5"), "--n-channels", "6",
                     "--fs", "30000", "--decimate", "12", "--whiten", "none",
                     "--quiet"]) == 0
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert f["traces"].shape == (3001, 6) and float(f["traces"].attrs["fs"]) == 2500.0


@pytest.mark.gpu
def test_gpu_forms_match_the_cpu_ones(tmp_path):
    cp = pytest.importorskip("cupy")
    rec = dspk.open_recording(X, fs=FS, layout="channels_samples", geometry=geometry(6))
    gpu_view = DecimatedRecording(rec, 12, xp=cp)
    got = gpu_view.read(17, 2900)
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(got), REF[:, 17:2900], rtol=0, atol=3e-7 * SCALE)
    p = Pipeline.from_options(decimate=12, highpass=0, butter_bandpass=(0.5, 300.0),
                              reference="median", whiten="none", backend="gpu")
    q = Pipeline.from_options(decimate=12, highpass=0, butter_bandpass=(0.5, 300.0),
                              reference="median", whiten="none", backend="cpu")
    y_gpu = p.transform(cp.asarray(X), FS)
    y_cpu = q.transform(X, FS)
    np.testing.assert_allclose(cp.asnumpy(y_gpu), y_cpu, rtol=0, atol=1e-5 * SCALE)
    a = p.run(rec, str(tmp_path / "g.h5"), chunk_s=0.3, progress=False)
    b = q.run(rec, str(tmp_path / "c.h5"), chunk_s=0.3, progress=False)
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        np.testing.assert_allclose(fa["traces"][()], fb["traces"][()], rtol=0,
                                   atol=1e-5 * SCALE)


def test_run_split_spans_are_at_the_decimated_rate(tmp_path):
    pytest.importorskip("dask")
    from dspk.dask import run_split

    rec = dspk.open_recording(X, fs=FS, layout="channels_samples")
    p = Pipeline.from_options(decimate=12, highpass=0, reference="mean", whiten="none",
                              backend="cpu")
    out = run_split(p, rec, str(tmp_path / "o.h5"), spans=3, chunk_s=0.1)
    with h5py.File(out, "r") as f:
        np.testing.assert_allclose(f["traces"][()].T, p.transform(X, FS), rtol=0,
                                   atol=3e-7 * SCALE)
    import dask.array as da
    from dspk.dask import apply

    with pytest.raises(PipelineError, match="map_overlap"):
        apply(p, da.from_array(X), fs=FS)
