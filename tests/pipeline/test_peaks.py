"""Peaks in SpikeInterface's form without SpikeInterface: `dspk.detect.spikes_to_peaks`,
detection alone (`dspk.pipeline.detect_peaks`) and the `dspk detect` command; and the
channel ids, shanks and units every output now stores."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspk
from dspk import cli
from dspk.detect import (PEAK_DTYPE, PEAK_LOCATION_DTYPE, SPIKE_DTYPE, default_templates,
                         spikes_to_peaks)
from dspk.io import SubsetRecording
from dspk.pipeline import Pipeline, PipelineError, detect_peaks

FS = 30000.0
C = 12
GEOM = np.c_[np.tile([0.0, 32.0], C // 2), 20.0 * (np.arange(C) // 2)]


def spiky(seed=0, n=60000):
    """float32 µV noise (SD 10) with 150 spikes on neighbouring channels, [channels,
    samples]."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((C, n)) * 10.0).astype(np.float32)
    w = default_templates()[2] / -default_templates()[2].min()
    for t in rng.integers(100, n - 100, 150):
        ch = int(rng.integers(1, C - 1))
        x[ch - 1:ch + 2, t - 20:t + 41] += np.array([[50.0], [100.0], [50.0]]) * w
    return x


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The recording as a raw HDF5 file and `dspk preprocess --detect`'s output of it."""
    folder = tmp_path_factory.mktemp("peaks")
    raw = folder / "raw.h5"
    with h5py.File(raw, "w") as f:
        d = f.create_dataset("traces", data=spiky().T)
        d.attrs["fs"] = FS
        d.attrs["geometry"] = GEOM
    out = folder / "out.h5"
    assert cli.main(["preprocess", str(raw), str(out), "--detect", "--quiet",
                     "--backend", "cpu"]) == 0
    with h5py.File(out, "r") as f:
        return raw, out, f["spikes"][()], f["traces"][()]


# -- spikes_to_peaks ------------------------------------------------------------------------------
def test_spikes_become_peaks_with_the_signed_trace_value_and_locations_apart():
    spikes = np.zeros(3, SPIKE_DTYPE)
    spikes["sample_index"] = [5, 9, 40]
    spikes["channel_index"] = [2, 0, 1]
    spikes["amplitude"] = [8.0, 9.0, 12.0]
    spikes["x"], spikes["y"] = [0.0, 16.0, 32.0], [40.0, 0.0, 20.0]
    x = np.arange(3 * 50, dtype=np.float32).reshape(3, 50) - 100.0
    peaks, loc = spikes_to_peaks(spikes, x[:, 4:45], start=4, segment_index=2)
    assert peaks.dtype == PEAK_DTYPE and loc.dtype == PEAK_LOCATION_DTYPE
    assert peaks["amplitude"].tolist() == [x[2, 5], x[0, 9], x[1, 40]]
    assert peaks["segment_index"].tolist() == [2, 2, 2]
    assert loc.tolist() == [(0.0, 40.0), (16.0, 0.0), (32.0, 20.0)]
    bare = np.zeros(1, [("sample_index", "i8"), ("channel_index", "i8"), ("amplitude", "f4")])
    assert np.isnan(spikes_to_peaks(bare)[1]["x"]).all()
    empty, nowhere = spikes_to_peaks(np.zeros(0, SPIKE_DTYPE), x)
    assert empty.dtype == PEAK_DTYPE and len(empty) == len(nowhere) == 0


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 60), st.integers(1, 40), st.integers(0, 3))
def test_the_amplitude_does_not_depend_on_the_block_given(start, width, segment):
    rng = np.random.default_rng(start)
    x = rng.standard_normal((4, 200))
    spikes = np.zeros(width, SPIKE_DTYPE)
    spikes["sample_index"] = np.sort(rng.integers(start, start + width, width))
    spikes["channel_index"] = rng.integers(0, 4, width)
    whole, _ = spikes_to_peaks(spikes, x, segment_index=segment)
    part, _ = spikes_to_peaks(spikes, x[:, start:start + width + 5], start=start,
                              segment_index=segment)
    assert np.array_equal(whole, part)


def test_spikes_to_peaks_refuses_bad_inputs():
    spikes = np.zeros(1, SPIKE_DTYPE)
    spikes["sample_index"] = 50
    with pytest.raises(ValueError, match=r"spikes: .*missing \['amplitude'\]"):
        spikes_to_peaks(np.zeros(1, [("sample_index", "i8"), ("channel_index", "i8")]))
    with pytest.raises(ValueError, match="spikes: expected a structured array"):
        spikes_to_peaks(np.zeros(3))
    with pytest.raises(ValueError, match="segment_index: expected a segment index >= 0"):
        spikes_to_peaks(spikes, segment_index=-1)
    with pytest.raises(ValueError, match="traces: spike 0 .* outside the traces' samples 0..9"):
        spikes_to_peaks(spikes, np.zeros((2, 10)))
    with pytest.raises(ValueError, match=r"traces: expected \[channels, samples\]"):
        spikes_to_peaks(spikes, np.zeros(100))


# -- detection alone ------------------------------------------------------------------------------
def test_detection_alone_gives_the_spikes_of_preprocess_detect(written):
    raw, _, spikes, traces = written
    p = Pipeline.from_options(detect=True, backend="cpu")
    peaks, loc = detect_peaks(p, str(raw), chunk_s=0.37)
    assert p.is_fitted                                      # fitted as run() fits
    assert len(peaks) > 100
    assert np.array_equal(peaks["sample_index"], spikes["sample_index"])
    assert np.array_equal(peaks["channel_index"], spikes["channel_index"])
    # the trace at the trough, up to float32 rounding (other chunks than the job's)
    np.testing.assert_allclose(peaks["amplitude"],
                               traces[spikes["sample_index"], spikes["channel_index"]],
                               rtol=0, atol=2e-6 * float(np.abs(traces).max()))
    assert np.array_equal(loc["x"], spikes["x"].astype(float))
    fitted = p.fingerprint()
    again, _ = detect_peaks(p, str(raw), chunk_s=1.0)       # fitted: checked, not refitted
    assert p.fingerprint() == fitted
    assert np.array_equal(again[["sample_index", "channel_index", "segment_index"]],
                          peaks[["sample_index", "channel_index", "segment_index"]])
    np.testing.assert_allclose(again["amplitude"], peaks["amplitude"], rtol=0,
                               atol=2e-6 * float(np.abs(traces).max()))


def test_detection_alone_refuses_what_it_cannot_do(written):
    raw = written[0]
    with pytest.raises(PipelineError, match="pipeline: has no Detect step"):
        detect_peaks(Pipeline.from_options(), str(raw))
    with pytest.raises(PipelineError, match="chunk_s: expected a positive chunk length"):
        detect_peaks(Pipeline.from_options(detect=True), str(raw), chunk_s=0)
    no_geometry = dspk.open_recording(spiky(n=6000), fs=FS)
    with pytest.raises(PipelineError, match="geometry"):
        detect_peaks(Pipeline.from_options(whiten="global", detect=True), no_geometry)


# -- dspk detect ----------------------------------------------------------------------------------
def load(folder):
    meta = json.loads((folder / "detect.json").read_text())
    return np.load(folder / "peaks.npy"), np.load(folder / "peak_locations.npy"), meta


def test_dspk_detect_on_a_recording_and_on_an_output(written, tmp_path, capsys):
    raw, out, spikes, _ = written
    assert cli.main(["detect", str(raw), str(tmp_path / "a"), "--backend", "cpu",
                     "--chunk", "0.4"]) == 0
    peaks, loc, meta = load(tmp_path / "a")
    assert sorted(os.listdir(tmp_path)) == ["a"]             # no partial folder left
    assert peaks.dtype == PEAK_DTYPE and loc.dtype == PEAK_LOCATION_DTYPE
    assert np.array_equal(peaks[["sample_index", "channel_index"]],
                          spikes[["sample_index", "channel_index"]].astype(
                              [("sample_index", "i8"), ("channel_index", "i8")]))
    assert meta["n_peaks"] == len(peaks) and meta["fs"] == FS
    assert meta["channel_ids"] == list(range(C))
    assert meta["amplitude_units"] == "whitened (noise SD)"
    assert [s["step"] for s in meta["pipeline"]] == ["HighPass", "Reference", "Whiten",
                                                     "Detect"]
    assert "steps: HighPass -> Reference -> Whiten -> Detect" in capsys.readouterr().out
    # on the output: its traces as they are, the same spikes (the same noise, measured on
    # the same fit chunks of traces that differ by float rounding)
    assert cli.main(["detect", str(out), str(tmp_path / "b")]) == 0
    on_output, _, meta = load(tmp_path / "b")
    assert [s["step"] for s in meta["pipeline"]] == ["Detect"]
    assert meta["amplitude_units"] == "whitened (noise SD)"
    found = set(zip(on_output["sample_index"], on_output["channel_index"]))
    assert len(found ^ set(zip(spikes["sample_index"], spikes["channel_index"]))) <= 2
    # steps given on an output are run
    assert cli.main(["detect", str(out), str(tmp_path / "c"), "--whiten", "global",
                     "--threshold", "9"]) == 0
    assert [s["step"] for s in load(tmp_path / "c")[2]["pipeline"]] == ["Whiten", "Detect"]


def test_dspk_detect_refuses_an_outdir_it_would_damage(written, tmp_path, capsys):
    raw = str(written[0])
    (tmp_path / "file").write_text("x")
    assert cli.main(["detect", raw, str(tmp_path / "file")]) == 2
    assert "is a file; OUTDIR is the folder" in capsys.readouterr().err
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("keep")
    assert cli.main(["detect", raw, str(tmp_path / "theirs"), "--overwrite"]) == 2
    assert "holds files dspk detect did not write (notes.txt)" in capsys.readouterr().err
    assert cli.main(["detect", raw, str(tmp_path / "no" / "such")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["detect", raw, str(tmp_path / "empty"), "--threshold", "9"]) == 0
    assert cli.main(["detect", raw, str(tmp_path / "empty")]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert load(tmp_path / "empty")[2]["pipeline"][-1]["threshold"] == 9.0
    assert cli.main(["detect", raw, str(tmp_path / "empty"), "--overwrite"]) == 0
    assert load(tmp_path / "empty")[2]["pipeline"][-1]["threshold"] == 7.0   # replaced
    assert sorted(os.listdir(tmp_path)) == ["empty", "file", "theirs"]


def test_dspk_detect_help_names_its_files(capsys):
    with pytest.raises(SystemExit):
        cli.main(["detect", "--help"])
    text = capsys.readouterr().out
    assert "peaks.npy" in text and "peak_locations.npy" in text and "(default: 7.0)" in text


# -- what an output stores ------------------------------------------------------------------------
def test_an_output_stores_units_channel_ids_and_shanks(tmp_path):
    rec = dspk.open_recording(spiky(n=9000), fs=FS, geometry=GEOM)
    out = dspk.preprocess(rec, str(tmp_path / "w.h5"), progress=False)
    with h5py.File(out, "r") as f:
        assert f["traces"].attrs["units"] == "whitened (noise SD)"
        assert f["channel_ids"][()].tolist() == list(range(C))
        assert "shank_ids" not in f
    rec.channel_ids = np.array([f"ch{k}µ" for k in range(C)])
    rec.shank_ids = np.arange(C) // 6
    out = dspk.preprocess(rec, str(tmp_path / "u.h5"), whiten="none", progress=False,
                          output_dtype=np.int16)
    with h5py.File(out, "r") as f:
        assert f["traces"].attrs["units"] == "uV"
        assert f["channel_ids"].asstr()[()].tolist() == [f"ch{k}µ" for k in range(C)]
        assert f["shank_ids"][()].tolist() == [0] * 6 + [1] * 6
    part = SubsetRecording(dspk.open_recording(spiky(n=9000), fs=FS, geometry=GEOM),
                           channels=[5, 2, 7])
    assert part.channel_ids.tolist() == [5, 2, 7]            # the parent's indices
    rec.channel_ids = np.array(["a", "b"])
    with pytest.raises(PipelineError, match=r"channel_ids: expected one id per channel \(12\)"):
        dspk.preprocess(rec, str(tmp_path / "bad.h5"), whiten="none", progress=False)
    assert not (tmp_path / "bad.h5").exists()


def test_write_metadata_refuses_an_unknown_unit(tmp_path):
    from dspk.pipeline.output import job_record, write_metadata

    rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=FS)
    job = job_record("f00d", rec, 1500, np.float32, 1.0, "samples_channels", None)
    with h5py.File(tmp_path / "o.h5", "w") as f:
        f.create_dataset("traces", (3000, 2), np.float32)
        with pytest.raises(PipelineError, match="units: expected 'uV' or"):
            write_metadata(f, rec, job, [], units="mV")
