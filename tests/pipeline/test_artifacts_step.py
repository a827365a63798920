"""The RemoveArtifacts step: triggers from a CSV (samples, times, labels) or the sync channel
(a SpikeGLX .bin and .cbin), a chunked run against `dspk.ops.remove_artifacts` on the whole
array, each mode (the average/median artefacts fitted on a pass); the options on the command
line; a saved pipeline; bad inputs."""

import h5py
import numpy as np
import pytest

import dspk
from dspk import cli
from dspk.io.cbin import write_cbin
from dspk.ops import ARTIFACT_MODES, artifact_templates, remove_artifacts
from dspk.pipeline import Pipeline, PipelineError, RemoveArtifacts, registry
from dspk.pipeline.steps.artifacts import read_triggers

from tests.ops.test_artifacts import stimulated
from tests.recordings import np1_meta, write_sglx

FS = 30000.0


def compress(path, data):
    """``data`` [samples, channels] as an mtscomp .cbin (dspk's writer of the format: the
    decoder's agreement with mtscomp's own files is tests/io/test_cbin.py's)."""
    write_cbin(str(path), data, FS, chunk_samples=7000)
    return path


def write_csv(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("mode", ARTIFACT_MODES)
def test_chunked_run_equals_the_op_on_the_whole_array(tmp_path, mode):
    x, trig, lab = stimulated(np.float32, channels=4, n=30000,
                              triggers=(3, 600, 7000, 14999, 15000 + 40, 29990))
    codes = (lab == "b").astype(int)
    csv = write_csv(tmp_path / "stim.csv", "sample,label\n" +
                    "".join(f"{t},{c}\n" for t, c in zip(trig, codes)))
    rec = dspk.open_recording(x, fs=FS)
    pipe = Pipeline([RemoveArtifacts(csv, 0.5, 3.0, mode)]).fit(rec)
    labels = codes if mode in ("average", "median") else None
    want = remove_artifacts(x, trig, 0.5, 3.0, mode, fs=FS, labels=labels)
    if mode in ("average", "median"):
        names, tpl = artifact_templates(x.astype(np.float64), trig, 0.5, 3.0, fs=FS,
                                        labels=codes, operator=mode)
        np.testing.assert_array_equal(pipe.states[0]["template_labels"], names)
        np.testing.assert_allclose(pipe.states[0]["templates"], tpl, rtol=1e-6, atol=1e-3)
    np.testing.assert_allclose(pipe.transform(x), want, rtol=0, atol=2e-3)
    out = tmp_path / "out.h5"
    pipe.run(rec, out, chunk_s=0.17, progress=False)         # chunks cut the windows
    with h5py.File(out) as f:
        np.testing.assert_allclose(f["traces"][:].T, want, rtol=0, atol=2e-3)


def test_triggers_from_times_and_text_labels(tmp_path):
    path = write_csv(tmp_path / "t.csv", "time,label\n0.001,laser\n0.002,puff\n0.0031,laser\n")
    samples, labels = read_triggers(path, FS)
    assert samples.tolist() == [30, 60, 93] and labels.tolist() == [0, 1, 0]
    bare = write_csv(tmp_path / "b.csv", "10\n20\n")
    assert read_triggers(bare, FS)[0].tolist() == [10, 20]
    for text, match in (("when\n3\n", "'sample' or 'time'"), ("sample\n3.5\n", "whole"),
                        ("sample\nx\n", "not a number")):
        with pytest.raises(PipelineError, match=match):
            read_triggers(write_csv(tmp_path / "bad.csv", text), FS)


@pytest.mark.parametrize("compressed", [False, True])
def test_sync_bit_triggers_on_spikeglx(tmp_path, compressed):
    rng = np.random.default_rng(3)
    n = 20000
    data = rng.integers(-50, 50, (n, 385)).astype(np.int16)
    data[:, 384] = 0
    rises = [1000, 5000, 12345]
    for r in rises:
        data[r:r + 300, 384] |= 64                          # the sync input, bit 6
        data[r:r + 30, :384] += 3000                        # an artefact on every channel
    path = write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", data, np1_meta())
    if compressed:
        path = compress(tmp_path / "run_g0_t0.imec0.ap.cbin", data)
    with dspk.open_recording(path) as rec:
        gain = rec.gain_to_uv[:, None]
        pipe = Pipeline([RemoveArtifacts("sync:6", 0.1, 1.5, "cubic")]).fit(rec)
        assert pipe.states[0]["samples"].tolist() == rises
        want = remove_artifacts(rec.read(), rises, 0.1, 1.5, "cubic", fs=FS)
        out = tmp_path / "out.h5"
        pipe.run(rec, out, chunk_s=0.2, progress=False)
    with h5py.File(out) as f:
        got = f["traces"][:].T
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-2)
    assert (np.abs(got) < 500 * gain).all()              # the 3000-count steps are gone


def test_command_line_options(tmp_path, capsys):
    x, trig, _ = stimulated(np.float32, channels=4, n=9000, triggers=(1000, 5000))
    raw = tmp_path / "raw.bin"
    np.round(x.T * 10).astype(np.int16).tofile(raw)
    csv = write_csv(tmp_path / "stim.csv", "sample\n1000\n5000\n")
    out = tmp_path / "out.h5"
    assert cli.main(["preprocess", str(raw), str(out), "--n-channels", "4", "--fs", "30000",
                     "--artifacts", csv, "--artifact-window", "0.2", "2.5",
                     "--artifact-mode", "linear", "--highpass", "0", "--reference", "none",
                     "--whiten", "none", "--backend", "cpu"]) == 0
    with dspk.open_recording(raw, n_channels=4, fs=FS) as rec:
        want = remove_artifacts(rec.read(), [1000, 5000], 0.2, 2.5, "linear", fs=FS)
    with h5py.File(out) as f:
        np.testing.assert_allclose(f["traces"][:].T, want, rtol=0, atol=1e-3)
    with pytest.raises(SystemExit):
        cli.main(["preprocess", "--help"])
    help_text = capsys.readouterr().out
    for flag in ("--artifacts", "--artifact-window", "--artifact-mode"):
        assert flag in help_text
    stages = registry.stages(artifacts="sync:6", artifact_mode="median")
    assert type(stages[0]).__name__ == "RemoveArtifacts" and stages[0].mode == "median"


def test_saved_pipeline_keeps_the_triggers(tmp_path):
    x, trig, _ = stimulated(np.float32, channels=3, n=6000, triggers=(1000, 3000))
    csv = write_csv(tmp_path / "stim.csv", "sample\n1000\n3000\n")
    rec = dspk.open_recording(x, fs=FS)
    p = Pipeline([RemoveArtifacts(csv, 0.5, 3.0, "average")]).fit(rec)
    p.save(str(tmp_path / "p.npz"))
    q = Pipeline.load(str(tmp_path / "p.npz"))
    np.testing.assert_array_equal(q.transform(x), p.transform(x))


def test_bad_inputs(tmp_path):
    with pytest.raises(PipelineError, match="artifact_mode"):
        RemoveArtifacts("x.csv", mode="spline")
    with pytest.raises(PipelineError, match="artifact_window"):
        RemoveArtifacts("x.csv", -1.0, 3.0)
    with pytest.raises(PipelineError, match="sync:BIT"):
        RemoveArtifacts("sync:six")
    with pytest.raises(PipelineError, match="artifacts"):
        RemoveArtifacts("")
    rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=FS)
    with pytest.raises(PipelineError, match="no such file"):
        RemoveArtifacts(str(tmp_path / "missing.csv")).check(rec)
    with pytest.raises(PipelineError, match="sync channel"):
        RemoveArtifacts("sync:6").check(rec)
    with pytest.raises(PipelineError, match="sync channel"):
        Pipeline([RemoveArtifacts("sync:6")]).fit(rec)
    data = np.zeros((100, 385), np.int16)
    path = write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", data, np1_meta())
    with dspk.open_recording(path) as sg:
        with pytest.raises(PipelineError, match="bits 0..15"):
            RemoveArtifacts("sync:16").check(sg)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["linear", "cubic", "average"])
def test_step_on_the_gpu_matches_the_cpu(tmp_path, mode):
    """The step (its templates fitted on the GPU pass for "average"), the demultiplexed
    reference after it, and a .cbin input, run on both backends."""
    rng = np.random.default_rng(5)
    n = 12000
    data = rng.integers(-50, 50, (n, 385)).astype(np.int16)
    data[:, 384] = 0
    for r in (1000, 4000, 9000):
        data[r:r + 300, 384] |= 64
        data[r:r + 30, :384] += 3000
    path = compress(tmp_path / "run_g0_t0.imec0.ap.cbin", data)
    write_sglx(tmp_path, "x.bin", data, np1_meta())                     # the .meta's twin
    (tmp_path / "run_g0_t0.imec0.ap.meta").write_bytes((tmp_path / "x.meta").read_bytes())
    outs = {}
    with dspk.open_recording(path) as rec:
        for backend in ("cpu", "gpu"):
            p = Pipeline.from_options(artifacts="sync:6", artifact_mode=mode,
                                      reference="median", reference_groups="adc",
                                      whiten="none", backend=backend)
            out = p.fit(rec).run(rec, tmp_path / f"{backend}.h5", chunk_s=0.1,
                                 progress=False)
            with h5py.File(out, "r") as f:
                outs[backend] = f["traces"][:]
    scale = float(np.abs(outs["cpu"]).max())
    np.testing.assert_allclose(outs["gpu"], outs["cpu"], rtol=0, atol=2e-5 * scale)
