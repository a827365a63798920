"""``format="kilosort"`` (``dspk preprocess --format kilosort``): a folder that Kilosort4, Phy
and SpikeInterface read as it is — the traces as the HDF5 output holds them, the probe in
three forms, Phy's params.py — written as OUT.partial/ and renamed when complete, resumable,
and refused before any work where it could destroy something. Kilosort4's own loaders read
it where kilosort is installed."""

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.io import loadmat

import dspk
from dspk.io import read_probe
from dspk.cli import main
from dspk.pipeline import JobInterrupted, Pipeline, PipelineError
from dspk.pipeline.handoff import KILOSORT_FILES, KILOSORT_STEPS_PER_SD

FS = 30000.0
FILES = sorted(KILOSORT_FILES)


def geometry(c=16):
    """Two columns, 20 µm rows."""
    return np.c_[np.tile([0.0, 32.0], c // 2), np.repeat(np.arange(c // 2) * 20.0, 2)]


def recording(n=12000, c=16, seed=0, shanks=None):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c)) * 40).astype(np.int16)
    rec = dspk.open_recording(x, fs=FS, geometry=geometry(c), gain_to_uv=0.5,
                              layout="samples_channels")
    rec.shank_ids = shanks
    return rec


def pipeline(**options):
    return Pipeline.from_options(**{"whiten": "local", "n_neighbors": 8, **options})


def traces(folder, c=16):
    about = json.loads((folder / "dspk.json").read_text())
    return np.fromfile(folder / "traces.bin", dtype=about["dtype"]).reshape(-1, c), about


@pytest.fixture
def no_fit(monkeypatch):
    """Pipeline.fit raises: a test passes only if nothing was fitted."""
    def fit(self, *args, **kwargs):
        raise AssertionError("Pipeline.fit was called")

    monkeypatch.setattr(Pipeline, "fit", fit)


# -- what the folder holds -----------------------------------------------------------------------
def test_whitened_int16_traces_are_the_hdf5_outputs_at_200_steps_per_sd(tmp_path):
    rec = recording()
    out = pipeline().run(rec, tmp_path / "ks", format="kilosort", chunk_s=0.1,
                         progress=False)
    assert sorted(os.listdir(out)) == FILES
    y, about = traces(out)
    # the same job into HDF5 at the same scale: the same samples, byte for byte
    h5 = pipeline().run(rec, tmp_path / "o.h5", chunk_s=0.1, output_dtype=np.int16,
                        output_scale=1 / KILOSORT_STEPS_PER_SD, progress=False)
    with h5py.File(h5, "r") as f:
        assert np.array_equal(y, f["traces"][:])
    assert y.dtype == np.int16 and y.shape == (12000, 16)
    assert 180 < np.std(y) < 220                         # unit-variance noise x 200
    assert about["scale"] == 1 / 200 and about["units"] == "whitened (noise SD)"
    assert about["whitened"] and about["n_samples"] == 12000 and about["fs"] == FS
    assert about["job"]["fingerprint"] == pipeline().fit(rec).fingerprint()
    # the fitted state, as an HDF5 output stores it
    p = pipeline()
    assert np.array_equal(p.read_fitted(out / "fitted.h5")[-1]["W"],
                          p.read_fitted(h5)[-1]["W"])


def test_float32_and_unwhitened_traces(tmp_path):
    rec = recording()
    out = pipeline().run(rec, tmp_path / "f32", format="kilosort", output_dtype=np.float32,
                         chunk_s=0.1, progress=False)
    h5 = pipeline().run(rec, tmp_path / "o.h5", chunk_s=0.1, progress=False)
    y, about = traces(out)
    with h5py.File(h5, "r") as f:
        assert np.array_equal(y, f["traces"][:])
    assert about["dtype"] == "float32" and about["scale"] == 1.0
    assert (out / "params.py").read_text().count("'float32'") == 1
    # not whitened: int16 in steps of 0.1 µV
    out = pipeline(whiten="none").run(rec, tmp_path / "uv", format="kilosort", chunk_s=0.1,
                                      progress=False)
    y, about = traces(out)
    assert about["scale"] == 0.1 and about["units"] == "uV" and not about["whitened"]
    # the same chunks: another chunk length is another size class, whose tuned products
    # may round differently (one int16 step) where the tuner's choice differs under load
    h5 = pipeline(whiten="none").run(rec, tmp_path / "uv.h5", output_dtype=np.int16,
                                     chunk_s=0.1, progress=False)
    with h5py.File(h5, "r") as f:
        assert np.array_equal(y, f["traces"][:])
    # steps of 0.1 µV (the float32 products of another run may round the other way)
    uv = Pipeline.from_options(whiten="none").fit(rec).transform(rec.read())
    assert np.abs(y - np.rint(uv.T / 0.1)).max() <= 1


def test_probe_in_kilosorts_forms_probeinterface_and_phy_params(tmp_path):
    shanks = np.repeat([0, 1], 8)
    rec = recording(shanks=shanks)
    rec.channel_ids = np.array([f"ch{i}" for i in range(16)])
    out = pipeline(whiten="none").run(rec, tmp_path / "ks", format="kilosort",
                                      progress=False)
    probe = json.loads((out / "chanMap.json").read_text())
    assert probe["chanMap"] == list(range(16)) and probe["n_chan"] == 16
    assert np.array_equal(np.c_[probe["xc"], probe["yc"]], geometry())
    assert probe["kcoords"] == shanks.tolist()
    mat = loadmat(out / "chanMap.mat")
    assert mat["chanMap"].ravel().tolist() == list(range(1, 17))       # MATLAB counts from 1
    assert mat["chanMap0ind"].ravel().tolist() == list(range(16))
    assert np.array_equal(np.c_[mat["xcoords"], mat["ycoords"]], geometry())
    assert (mat["kcoords"].ravel() == shanks + 1).all() and mat["connected"].all()
    assert float(mat["fs"].squeeze()) == FS
    assert np.array_equal(read_probe(out / "probe.json", n_channels=16), geometry())
    pi = pytest.importorskip("probeinterface")
    p = pi.read_probeinterface(out / "probe.json").probes[0]
    assert p.shank_ids.tolist() == [str(s) for s in shanks]
    assert p.device_channel_indices.tolist() == list(range(16))
    params = {}
    exec((out / "params.py").read_text(), {}, params)
    assert params == {"dat_path": "traces.bin", "n_channels_dat": 16, "dtype": "int16",
                      "offset": 0, "sample_rate": FS, "hp_filtered": True}
    about = json.loads((out / "dspk.json").read_text())
    assert about["channel_ids"] == [f"ch{i}" for i in range(16)]
    assert about["shank_ids"] == shanks.tolist()


def test_kilosort4_loads_the_probe_and_the_binary(tmp_path):
    kio = pytest.importorskip("kilosort.io", reason="kilosort (with torch) is not installed: "
                              "pip install kilosort (its io module needs torch, scikit-learn, "
                              "faiss-cpu)")
    rec = recording()
    out = pipeline().run(rec, tmp_path / "ks", format="kilosort", chunk_s=0.1,
                         progress=False)
    y, about = traces(out)
    for name in ("chanMap.json", "chanMap.mat"):
        probe = kio.load_probe(out / name)
        assert probe["chanMap"].tolist() == list(range(16)) and probe["n_chan"] == 16
        assert np.array_equal(np.c_[probe["xc"], probe["yc"]], geometry())
    f = kio.BinaryRWFile(str(out / "traces.bin"), n_chan_bin=16, fs=FS, dtype=about["dtype"])
    assert tuple(int(v) for v in f.shape) == (12000, 16)
    assert np.array_equal(f[100:200], y[100:200])
    # what Kilosort4 thresholds: the whitened traces in noise SDs (its `scale` setting)
    g = kio.BinaryRWFile(str(out / "traces.bin"), n_chan_bin=16, fs=FS,
                         dtype=about["dtype"], scale=about["scale"])
    assert 0.9 < np.std(g[0:12000]) < 1.1


# -- written as OUT.partial/, resumable ----------------------------------------------------------
def test_an_interrupted_folder_is_kept_partial_and_resumed_to_the_same_bytes(tmp_path):
    rec = recording()
    whole = pipeline().run(rec, tmp_path / "whole", format="kilosort", chunk_s=0.1,
                           progress=False)
    out = tmp_path / "ks"

    def stop(done):
        if done >= 6000:
            raise KeyboardInterrupt

    with pytest.raises(JobInterrupted, match="ks.partial is kept"):
        pipeline().run(rec, out, format="kilosort", chunk_s=0.1, progress=False,
                       on_chunk=stop)
    assert not out.exists()
    partial = tmp_path / "ks.partial"
    record = json.loads((partial / "progress.json").read_text())
    assert record["done"] >= 6000
    seen = []
    pipeline().run(rec, out, format="kilosort", chunk_s=0.1, progress=False, resume=True,
                   on_chunk=seen.append)
    assert seen[0] == record["done"] + 3000 and seen[-1] == 12000   # from where it stopped
    assert not partial.exists() and sorted(os.listdir(out)) == FILES
    for name in ("traces.bin", "chanMap.json", "params.py", "probe.json"):
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name


def test_a_failed_job_leaves_no_folder(tmp_path):
    def fail(done):
        raise ValueError("a damaged sample")

    out = tmp_path / "ks"
    with pytest.raises(ValueError, match="damaged"):
        pipeline().run(recording(), out, format="kilosort", chunk_s=0.1, progress=False,
                       on_chunk=fail)
    assert os.listdir(tmp_path) == []


def test_an_empty_folder_is_filled_and_an_earlier_output_replaced(tmp_path):
    out = tmp_path / "ks"
    out.mkdir()
    pipeline().run(recording(), out, format="kilosort", progress=False)
    first = (out / "traces.bin").read_bytes()
    pipeline().run(recording(seed=1), out, format="kilosort", progress=False,
                   overwrite=True)
    assert sorted(os.listdir(out)) == FILES and (out / "traces.bin").read_bytes() != first
    assert sorted(os.listdir(tmp_path)) == ["ks"]


# -- refused before any work -----------------------------------------------------------------------
def test_refused_folders_fit_nothing_and_write_nothing(tmp_path, no_fit):
    rec = recording()
    a_file = tmp_path / "ks.txt"
    a_file.write_text("keep")
    with pytest.raises(PipelineError, match="is a file; format='kilosort' writes a folder"):
        pipeline().run(rec, a_file, format="kilosort", progress=False)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(PipelineError, match="exists and is not empty;.*overwrite=True"):
        pipeline().run(rec, mine, format="kilosort", progress=False)
    with pytest.raises(PipelineError, match=r"holds files dspk did not write \(notes.txt\)"):
        pipeline().run(rec, mine, format="kilosort", progress=False, overwrite=True)
    with pytest.raises(PipelineError, match="its folder .* does not exist"):
        pipeline().run(rec, tmp_path / "no" / "ks", format="kilosort", progress=False)
    (tmp_path / "ks.partial").write_text("x")
    with pytest.raises(PipelineError, match="ks.partial: is a file"):
        pipeline().run(rec, tmp_path / "ks", format="kilosort", progress=False)
    assert sorted(os.listdir(tmp_path)) == ["ks.partial", "ks.txt", "mine"]
    assert os.listdir(mine) == ["notes.txt"] and a_file.read_text() == "keep"


def test_refused_options_name_what_to_change(tmp_path, no_fit):
    rec = recording()
    out = tmp_path / "ks"
    cases = [(dict(format="phy"), "format: expected one of 'hdf5', 'kilosort', 'nwb'"),
             (dict(format="kilosort", layout="channels_samples"), "layout: format='kilosort'"),
             (dict(format="kilosort", compression="gzip"), "compression: format='kilosort'"),
             ]
    for kwargs, message in cases:
        with pytest.raises(PipelineError, match=message):
            pipeline().run(rec, out, progress=False, **kwargs)
    with pytest.raises(PipelineError, match="detect: format='kilosort' holds the traces only"):
        pipeline(detect=True).run(rec, out, format="kilosort", progress=False)
    flat = dspk.open_recording(np.zeros((3000, 4), np.int16), fs=FS)
    with pytest.raises(PipelineError, match="geometry: format='kilosort' writes Kilosort's "
                                            "probe"):
        Pipeline.from_options(whiten="global").run(flat, out, format="kilosort",
                                                   progress=False)
    assert os.listdir(tmp_path) == []


def test_a_folder_holding_the_input_is_refused(tmp_path, no_fit):
    raw = tmp_path / "ks" / "raw.bin"
    raw.parent.mkdir()
    np.zeros((3000, 4), np.int16).tofile(raw)
    rec = dspk.open_recording(raw, n_channels=4, fs=FS, geometry=geometry(4))
    with pytest.raises(PipelineError, match="is or holds a file of the input"):
        pipeline(n_neighbors=2).run(rec, raw.parent, format="kilosort", progress=False,
                                    overwrite=True)
    assert os.listdir(raw.parent) == ["raw.bin"]


# -- the command line ----------------------------------------------------------------------------
def write_source(path):
    """`recording()` as an HDF5 file with its rate and geometry."""
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", data=recording().read(scaled=False).T)
        d.attrs["fs"] = FS
        d.attrs["geometry"] = geometry()
    return path


def test_command_line_writes_the_folder_and_names_options_in_errors(tmp_path, capsys):
    src = write_source(tmp_path / "in.h5")
    out = tmp_path / "ks"
    assert main(["preprocess", str(src), str(out), "--format", "kilosort", "--neighbors", "8",
                 "--quiet"]) == 0
    assert sorted(os.listdir(out)) == FILES
    assert traces(out)[1]["dtype"] == "int16"
    capsys.readouterr()
    assert main(["preprocess", str(src), str(out), "--format", "kilosort", "--quiet"]) == 2
    assert "exists and is not empty; name a new or empty folder, or pass --overwrite" in \
        capsys.readouterr().err
    assert main(["preprocess", str(src), str(tmp_path / "k2"), "--format", "kilosort",
                 "--detect", "--quiet"]) == 2
    assert "detect: --format kilosort holds the traces only; the spikes of --detect" in \
        capsys.readouterr().err
    assert main(["preprocess", str(src), str(tmp_path / "k3"), "--format", "kilosort",
                 "--compression", "gzip", "--quiet"]) == 2
    assert "leave --compression out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["preprocess", str(src), str(tmp_path / "k4"), "--format", "phy"])
    assert "--format: invalid choice: 'phy'" in capsys.readouterr().err
    assert not any(Path(tmp_path, k).exists() for k in ("k2", "k3", "k4"))


def test_info_describes_the_folder(tmp_path, capsys):
    """``dspk info KSFOLDER``: the binary, its units, the probe, the steps, the bad channels."""
    src = write_source(tmp_path / "in.h5")
    out = tmp_path / "ks"
    assert main(["preprocess", str(src), str(out), "--format", "kilosort", "--neighbors", "8",
                 "--bad-channels", "2,5", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    said = capsys.readouterr().out
    meta = traces(out)[1]
    n, c = meta["n_samples"], meta["n_channels"]
    assert f"traces.bin: {c} channels x {n} samples int16 ([samples, channels], offset 0)" \
        in said
    assert f"values: raw x {meta['scale']:g}, in whitened" in said
    assert "written by dspk: HighPass -> BadChannels -> Reference -> Whiten" in said
    assert f"probe (chanMap.json): {c} channels" in said
    assert "bad channels (interpolated): given [2, 5]" in said


# -- any length, any chunk, stopped anywhere -------------------------------------------------------
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 2500), chunk=st.integers(100, 1200), stop=st.integers(1, 4),
       int16=st.booleans())
def test_any_chunking_writes_the_hdf5_outputs_samples_and_resumes_to_them(tmp_path_factory, n,
                                                                          chunk, stop, int16):
    folder = tmp_path_factory.mktemp("ks")
    rec = recording(n=n, c=4, seed=n)
    options = dict(chunk_s=chunk / FS, progress=False,
                   output_dtype=np.int16 if int16 else np.float32)
    h5 = Pipeline.from_options(whiten="global").run(rec, folder / "o.h5", **options,
                                                      output_scale=1 / 200 if int16 else None)
    with h5py.File(h5, "r") as f:
        want = f["traces"][:]

    def halt(done):
        if done >= min(n, stop * chunk) and done < n:
            raise KeyboardInterrupt

    out = folder / "ks"
    try:
        Pipeline.from_options(whiten="global").run(rec, out, format="kilosort", on_chunk=halt,
                                                   **options)
    except JobInterrupted:
        Pipeline.from_options(whiten="global").run(rec, out, format="kilosort", resume=True,
                                                   **options)
    got, _ = traces(out, c=4)
    assert got.dtype == want.dtype and np.array_equal(got, want)
