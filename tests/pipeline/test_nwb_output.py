"""``format="nwb"`` (``dspk preprocess --format nwb``): an NWB file written through pynwb
with a processed ElectricalSeries in processing/ecephys and its electrodes table, which
pynwb, nwbinspector, SpikeInterface and dspk read; its samples those of the HDF5 output,
written chunk by chunk; refused before any work where it could not be honoured."""

import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import h5py
import numpy as np
import pytest

import dspk
from dspk.cli import main
from dspk.io import RecordingError
from dspk.io.nwb import SERIES_PATH
from dspk.pipeline import Pipeline, PipelineError

pynwb = pytest.importorskip("pynwb")

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "sample.nwb"
FS = 30000.0


def geometry(c=8):
    return np.c_[np.tile([0.0, 32.0], c // 2), np.repeat(np.arange(c // 2) * 20.0, 2)]


def recording(n=9000, c=8, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c)) * 40).astype(np.int16)
    rec = dspk.open_recording(x, fs=FS, geometry=geometry(c), gain_to_uv=0.5)
    rec.shank_ids = np.repeat([0, 1], c // 2)
    rec.channel_ids = np.array([f"AP{i}" for i in range(c)])
    return rec


def pipeline(**options):
    return Pipeline.from_options(**{"whiten": "local", "n_neighbors": 4, **options})


@pytest.fixture
def no_fit(monkeypatch):
    """Pipeline.fit raises: a test passes only if nothing was fitted."""
    def fit(self, *args, **kwargs):
        raise AssertionError("Pipeline.fit was called")

    monkeypatch.setattr(Pipeline, "fit", fit)


def problems(path):
    """nwbinspector's critical messages and errors, but those about the subject: the subject
    is the experiment's, which dspk takes over from an NWB input and never invents."""
    inspector = pytest.importorskip("nwbinspector")
    return [f"{m.importance.name} {m.check_function_name}: {m.message}"
            for m in inspector.inspect_nwbfile(nwbfile_path=str(path))
            if m.importance.name in ("CRITICAL", "ERROR", "PYNWB_VALIDATION")
            and not m.check_function_name.startswith("check_subject")]


def test_pynwb_reads_the_processed_series_with_its_electrodes(tmp_path):
    rec = recording()
    seen = []
    out = pipeline().run(rec, tmp_path / "out.nwb", format="nwb", chunk_s=0.1,
                         progress=False, on_chunk=seen.append)
    assert seen == [3000, 6000, 9000]                       # written chunk by chunk
    h5 = pipeline().run(rec, tmp_path / "out.h5", chunk_s=0.1, progress=False)
    with pynwb.NWBHDF5IO(str(out), "r") as io, h5py.File(h5, "r") as f:
        nwb = io.read()
        es = nwb.processing["ecephys"]["FilteredEphys"]["ElectricalSeriesProcessed"]
        assert np.array_equal(es.data[:], f["traces"][:])   # the HDF5 output's samples
        assert (es.rate, es.starting_time, es.conversion) == (FS, 0.0, 1e-6)
        assert "whitened" in es.description and "HighPass" in es.filtering
        table = es.electrodes.to_dataframe()
        assert table["channel_name"].tolist() == [f"AP{i}" for i in range(8)]
        assert np.array_equal(table[["rel_x", "rel_y"]].to_numpy(), geometry())
        assert table["group_name"].tolist() == ["shank0"] * 4 + ["shank1"] * 4
        assert list(nwb.was_generated_by[0]) == ["dspk", dspk.__version__]
    assert problems(out) == []
    assert sorted(os.listdir(tmp_path)) == ["out.h5", "out.nwb"]


def test_int16_series_scales_to_uv_by_its_conversion(tmp_path):
    rec = recording()
    out = pipeline(whiten="none").run(rec, tmp_path / "out.nwb", format="nwb",
                                      output_dtype=np.int16, progress=False)
    h5 = pipeline(whiten="none").run(rec, tmp_path / "out.h5", output_dtype=np.int16,
                                     progress=False)
    with h5py.File(out, "r") as f, h5py.File(h5, "r") as g:
        data = f[SERIES_PATH + "/data"]
        assert data.dtype == np.int16 and np.array_equal(data[:], g["traces"][:])
        assert data.attrs["conversion"] == pytest.approx(0.1e-6)   # 0.1 µV per step
    back = dspk.open_recording(out)
    assert np.allclose(back.gain_to_uv, 0.1) and np.array_equal(back.geometry, geometry())
    assert problems(out) == []


def test_spikeinterface_reads_ids_locations_and_gains(tmp_path):
    se = pytest.importorskip("spikeinterface.extractors")
    out = pipeline(whiten="none").run(recording(), tmp_path / "out.nwb", format="nwb",
                                      progress=False)
    si = se.read_nwb(str(out))
    assert si.get_num_samples() == 9000 and si.get_sampling_frequency() == FS
    assert list(si.get_channel_ids()) == [f"AP{i}" for i in range(8)]
    assert np.array_equal(si.get_channel_locations(), geometry())
    assert np.allclose(si.get_channel_gains(), 1.0)                     # float32 µV
    assert np.allclose(si.get_traces(return_in_uV=True, end_frame=100),
                       dspk.open_recording(out).read(0, 100).T)


def test_an_nwb_input_gives_its_session_and_subject(tmp_path):
    rec = dspk.open_recording(SAMPLE)
    out = pipeline().run(dspk.io.SubsetRecording(rec, 30000, 60000, np.arange(16)),
                         tmp_path / "out.nwb", format="nwb", progress=False)
    with pynwb.NWBHDF5IO(str(out), "r") as io, pynwb.NWBHDF5IO(str(SAMPLE), "r") as sio:
        nwb, sample = io.read(), sio.read()
        assert nwb.session_start_time == sample.session_start_time
        assert nwb.subject.subject_id == sample.subject.subject_id == "synthetic"
        assert nwb.subject.sex == "U"
        es = nwb.processing["ecephys"]["FilteredEphys"]["ElectricalSeriesProcessed"]
        assert es.starting_time == 1.0 and es.data.shape == (30000, 16)   # --time 1 2
    assert problems(out) == []


def test_the_bundled_sample_passes_nwbinspector():
    assert problems(SAMPLE) == []


def test_a_failed_or_interrupted_job_leaves_no_file(tmp_path):
    for error in (ValueError("a damaged sample"), KeyboardInterrupt()):
        def fail(done, error=error):
            raise error

        with pytest.raises(type(error)):
            pipeline().run(recording(), tmp_path / "out.nwb", format="nwb", chunk_s=0.1,
                           progress=False, on_chunk=fail)
        assert os.listdir(tmp_path) == []


def test_refused_options_name_what_to_change(tmp_path, monkeypatch, no_fit):
    rec = recording()
    out = tmp_path / "out.nwb"
    for kwargs, message in [(dict(resume=True), "resume: format='nwb' is written in one go"),
                            (dict(compression="lzf"), "compression: format='nwb'"),
                            (dict(layout="channels_samples"), "layout: format='nwb'")]:
        with pytest.raises(PipelineError, match=message):
            pipeline().run(rec, out, format="nwb", progress=False, **kwargs)
    with pytest.raises(PipelineError, match="detect: format='nwb' holds the traces only"):
        pipeline(detect=True).run(rec, out, format="nwb", progress=False)
    out.write_bytes(b"keep")
    with pytest.raises(PipelineError, match="exists; pass overwrite=True"):
        pipeline().run(rec, out, format="nwb", progress=False)
    out.unlink()
    monkeypatch.setitem(sys.modules, "pynwb", None)
    with pytest.raises(RecordingError, match="writing NWB needs pynwb: pip install pynwb"):
        pipeline().run(rec, out, format="nwb", progress=False)
    assert os.listdir(tmp_path) == []


def test_command_line(tmp_path, capsys):
    out = tmp_path / "sample.nwb"
    assert main(["preprocess", str(SAMPLE), str(out), "--format", "nwb", "--int16",
                 "--time", "0", "1", "--quiet"]) == 0
    with pynwb.NWBHDF5IO(str(out), "r") as io:
        data = io.read().processing["ecephys"]["FilteredEphys"]["ElectricalSeriesProcessed"]
        assert data.data.shape == (30000, 32) and data.data.dtype == np.int16
    capsys.readouterr()
    assert main(["preprocess", str(SAMPLE), str(tmp_path / "b.nwb"), "--format", "nwb",
                 "--resume", "--quiet"]) == 2
    assert "resume: --format nwb is written in one go and cannot be resumed; leave --resume " \
           "out" in capsys.readouterr().err
    assert not (tmp_path / "b.nwb").exists()


def test_the_session_start_is_now_without_an_nwb_input(tmp_path):
    before = datetime.now(timezone.utc).replace(microsecond=0)
    out = pipeline().run(recording(), tmp_path / "out.nwb", format="nwb", progress=False)
    with pynwb.NWBHDF5IO(str(out), "r") as io:
        nwb = io.read()
        assert nwb.session_start_time >= before and nwb.subject is None
