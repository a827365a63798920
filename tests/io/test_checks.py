"""What dspk.io refuses or warns about so that nothing is read wrong without a word: recordings
copied short (Open Ephys against its per-sample files, SpikeGLX without fileSizeBytes), metadata
that disagree with the file, a SpikeGLX .bin without its .meta, coincident probe contacts,
options that contradict the format; the messages spell arguments for Python or the command
line; the formats open_recording dispatches to, in order; io's modules import without a cycle."""

import ast
import json
import logging
import os
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

import dspk.io
from dspk.argnames import command_line_spelling
from dspk.io import (ArrayRecording, BinaryRecording, HDF5Recording, OpenEphysRecording,
                     RecordingError, RecordingWarning, SpikeGLXRecording,
                     SpikeInterfaceRecording, open_recording, read_probe, recording_formats)
from dspk.io.probe import probe_positions
from dspk.io.recording import OpenOptions

from tests.recordings import TinySIRecording, np1_meta, oe_stream, rand16, write_oe, write_sglx

CLI = {"fs": "--fs", "n_channels": "--n-channels", "dtype": "--dtype", "dataset": "--dataset",
       "gain_to_uv": "--gain-to-uv", "geometry": "--probe FILE"}


# -- Open Ephys: continuous.dat against sample_numbers.npy / timestamps.npy -----------------------
def oe_recording(tmp_path, n=100, c=4):
    rec_dir = write_oe(tmp_path, [oe_stream("Rhythm_FPGA-100.0", c)], [rand16(n, c)])
    return rec_dir, rec_dir / "continuous" / "Rhythm_FPGA-100.0"


def test_open_ephys_dat_shorter_than_its_sample_numbers_is_refused(tmp_path):
    rec_dir, stream = oe_recording(tmp_path)
    with open(stream / "continuous.dat", "r+b") as f:          # 10 whole frames cut off
        f.truncate(90 * 4 * 2)
    with pytest.raises(RecordingError, match=r"continuous.dat holds 90 samples \(720 bytes of "
                                             r"4-channel int16 frames\) but .*sample_numbers.npy "
                                             r"has 100 entries: the recording looks truncated"):
        open_recording(rec_dir)


def test_open_ephys_timestamps_alone_are_checked_too(tmp_path):
    rec_dir, stream = oe_recording(tmp_path)
    (stream / "sample_numbers.npy").unlink()                   # GUI 0.5: timestamps.npy only
    np.save(stream / "timestamps.npy", np.arange(120, dtype=np.int64))
    with pytest.raises(RecordingError, match=r"holds 100 samples .*timestamps.npy has 120 "
                                             r"entries"):
        open_recording(rec_dir)
    np.save(stream / "timestamps.npy", np.arange(100, dtype=np.int64))
    assert open_recording(rec_dir).n_samples == 100
    (stream / "timestamps.npy").unlink()                       # nothing to check against
    assert open_recording(rec_dir).n_samples == 100


def test_open_ephys_per_sample_file_cut_short_or_damaged(tmp_path):
    rec_dir, stream = oe_recording(tmp_path)
    npy = stream / "sample_numbers.npy"
    size = npy.stat().st_size
    with open(npy, "r+b") as f:                                # the header says 100 entries
        f.truncate(size - 80)
    with pytest.raises(RecordingError, match=r"sample_numbers.npy: its header says 100 entries "
                                             r".* truncated or copied incompletely"):
        open_recording(rec_dir)
    npy.write_bytes(b"not a numpy file")
    with pytest.raises(RecordingError, match="sample_numbers.npy: cannot be read as a .npy"):
        open_recording(rec_dir)
    np.save(npy, np.int64(5))
    with pytest.raises(RecordingError, match="sample_numbers.npy: a scalar"):
        open_recording(rec_dir)


def test_open_ephys_dat_of_partial_frames_says_truncated(tmp_path):
    rec_dir, stream = oe_recording(tmp_path)
    with open(stream / "continuous.dat", "ab") as f:
        f.write(b"\x01\x02\x03")
    with pytest.raises(RecordingError, match=r"803 bytes is not a whole number of 4-channel "
                                             r"int16 frames \(8 bytes, num_channels=4 of stream "
                                             r"'Rhythm_FPGA-100.0'\): truncated or copied"):
        open_recording(rec_dir)


def test_open_ephys_checks_every_stream_it_opens(tmp_path):
    streams = [oe_stream("Neuropix-PXI-100.ProbeA-AP", 4),
               oe_stream("Neuropix-PXI-100.ProbeA-LFP", 4, 2500.0)]
    rec_dir = write_oe(tmp_path, streams, [rand16(60, 4), rand16(20, 4)])
    lfp = rec_dir / "continuous" / "Neuropix-PXI-100.ProbeA-LFP"
    np.save(lfp / "sample_numbers.npy", np.arange(25))
    assert open_recording(rec_dir).n_samples == 60             # the AP stream is whole
    with pytest.raises(RecordingError, match="holds 20 samples .* has 25 entries"):
        open_recording(rec_dir, dataset="Neuropix-PXI-100.ProbeA-LFP")
    with pytest.raises(RecordingError, match="holds 20 samples .* has 25 entries"):
        open_recording(lfp / "continuous.dat")


# -- SpikeGLX: size against the .meta ------------------------------------------------------------
def without_file_size(path, secs=None):
    meta = path.with_suffix(".meta")
    lines = [ln for ln in meta.read_text().splitlines() if not ln.startswith("fileSizeBytes=")]
    if secs is not None:
        lines = [f"fileTimeSecs={secs}" if ln.startswith("fileTimeSecs=") else ln for ln in lines]
    meta.write_text("\n".join(lines) + "\n")
    return path


def test_spikeglx_without_file_size_cut_by_whole_frames_warns(tmp_path, caplog):
    data = rand16(3000, 385)
    path = without_file_size(write_sglx(tmp_path, "c.imec0.ap.bin", data, np1_meta()))
    with open(path, "r+b") as f:
        f.truncate(2900 * 385 * 2)                             # 100 whole frames missing
    with caplog.at_level(logging.WARNING, logger="dspk.io"), \
            pytest.warns(RecordingWarning, match=r"c.imec0.ap.bin: 2900 samples on disk, but its "
                                                 r".meta implies 3000 \(fileTimeSecs=0.1 x "
                                                 r"imSampRate=30000\) and has no fileSizeBytes"):
        rec = open_recording(path)
    assert rec.n_samples == 2900                               # still read: a warning
    assert any("2900 samples on disk" in r.getMessage() for r in caplog.records)
    assert issubclass(RecordingWarning, UserWarning)


@pytest.mark.parametrize("secs", [None, "0.1", "0.100000", "0.1000001", "0.09999999"])
def test_spikeglx_without_file_size_of_the_right_length_does_not_warn(tmp_path, secs):
    path = without_file_size(write_sglx(tmp_path, "d.imec0.ap.bin", rand16(3000, 385),
                                        np1_meta()), secs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_recording(path).n_samples == 3000


def nidq_one_channel(tmp_path, name, n, secs):
    """A 1-channel nidq .bin of n samples at 30 kHz whose .meta has fileTimeSecs=secs and no
    fileSizeBytes."""
    meta = {"typeThis": "nidq", "niSampRate": "30000", "nSavedChans": "1",
            "snsMnMaXaDw": "1,0,0,0", "niAiRangeMax": "5", "niMNGain": "200"}
    return without_file_size(write_sglx(tmp_path, name, np.zeros((n, 1), np.int16), meta),
                             secs)


def test_spikeglx_duration_tolerance_follows_the_written_precision(tmp_path):
    """fileTimeSecs rounded to 6 significant digits ("100" for 100.000233 s: 7 samples off at
    30 kHz) is within its precision; 100 frames missing are not. A short value is exact to 6
    digits ("0.1": 0.100000 s), so 20 samples missing from 3000 are told."""
    path = nidq_one_channel(tmp_path, "a.nidq.bin", 3_000_007, format(3_000_007 / 3e4, ".6g"))
    assert path.with_suffix(".meta").read_text().count("fileTimeSecs=100\n") == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_recording(path).n_samples == 3_000_007
    with open(path, "r+b") as f:
        f.truncate(2_999_907 * 2)
    with pytest.warns(RecordingWarning, match="2999907 samples on disk, but its .meta implies "
                                              "3000000"):
        open_recording(path)
    path = nidq_one_channel(tmp_path, "b.nidq.bin", 3000, "0.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_recording(path)
    with open(path, "r+b") as f:
        f.truncate(2997 * 2)                                   # a few frames: tolerated
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_recording(path)
    with open(path, "r+b") as f:
        f.truncate(2980 * 2)
    with pytest.warns(RecordingWarning, match="2980 samples on disk"):
        open_recording(path)


def test_spikeglx_nidq_without_file_size_is_checked_with_its_rate(tmp_path):
    meta = {"typeThis": "nidq", "niSampRate": "25000", "nSavedChans": "2",
            "snsMnMaXaDw": "1,0,0,1", "niAiRangeMax": "5", "niMNGain": "200"}
    path = without_file_size(write_sglx(tmp_path, "n.nidq.bin", rand16(2500, 2), meta))
    with open(path, "r+b") as f:
        f.truncate(2000 * 2 * 2)
    with pytest.warns(RecordingWarning, match=r"2000 samples .* implies 2500 .*niSampRate=25000"):
        open_recording(path)


def test_spikeglx_with_file_size_keeps_its_checks(tmp_path):
    data = rand16(3000, 385)
    path = write_sglx(tmp_path, "f.imec0.ap.bin", data, np1_meta())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_recording(path)
    with open(path, "r+b") as f:
        f.truncate(2900 * 385 * 2)
    with pytest.raises(RecordingError, match="fileSizeBytes=2310000: the file is truncated"):
        open_recording(path)


def test_spikeglx_n_saved_chans_disagreeing_with_a_whole_file(tmp_path):
    meta = np1_meta()
    meta["nSavedChans"] = "384"                                # the file has 385 per frame
    meta["snsApLfSy"] = "383,0,1"
    path = write_sglx(tmp_path, "g.imec0.ap.bin", rand16(100, 385), meta)
    with pytest.raises(RecordingError, match=r"nSavedChans: .*g.imec0.ap.meta disagrees with "
                                             r".*g.imec0.ap.bin: nSavedChans=384 implies "
                                             r"768-byte int16 frames, but the file holds 77000 "
                                             r"bytes \(as fileSizeBytes says\)") as e:
        open_recording(path)
    assert "truncated" not in str(e.value)


# -- SpikeGLX: a stream's .bin without its .meta -------------------------------------------------
@pytest.mark.parametrize("name", ["run_g0_t0.imec0.ap.bin", "run_g0_t0.imec0.lf.bin",
                                  "run_g0_t0.nidq.bin", "run_g0_t0.obx0.obx.bin",
                                  "run_g0_t0.imec.ap.bin", "run_g0_t0.imec1.bin",
                                  "RUN.IMEC0.AP.BIN"])
def test_spikeglx_bin_without_meta_names_the_missing_meta(tmp_path, name):
    rand16(100, 4).tofile(tmp_path / name)
    meta = name[:-4] + ".meta"
    with pytest.raises(RecordingError, match=rf"{meta}: missing \(no such file\).* read {name} "
                                             rf"as a flat binary instead: pass n_channels= and "
                                             rf"fs="):
        open_recording(tmp_path / name)
    with pytest.raises(RecordingError, match=r"pass --n-channels and --fs \(and --dtype"):
        with command_line_spelling(CLI):
            open_recording(tmp_path / name)
    # the flat-binary options say what it is
    rec = open_recording(tmp_path / name, n_channels=4, fs=3e4)
    assert isinstance(rec, BinaryRecording) and not isinstance(rec, SpikeGLXRecording)
    assert rec.n_samples == 100


def test_other_binaries_still_need_their_channel_count(tmp_path):
    rand16(100, 4).tofile(tmp_path / "temp_wh.dat")
    with pytest.raises(RecordingError, match=r"n_channels: a flat binary .* pass n_channels= "
                                             r"and fs="):
        open_recording(tmp_path / "temp_wh.dat")
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(RecordingError, match=r"x.txt: not an HDF5 file; a flat binary needs "
                                             r"--n-channels and --fs"):
        with command_line_spelling(CLI):
            open_recording(tmp_path / "x.txt")


# -- messages spell what to pass for the command line --------------------------------------------
def test_messages_spell_arguments_for_the_command_line(tmp_path):
    with command_line_spelling(CLI):
        with pytest.raises(RecordingError, match=r"needs its sampling rate \(--fs\)"):
            open_recording(np.zeros((3000, 4), np.int16))
        meta = np1_meta()
        meta["imDatPrb_type"] = "3000"
        del meta["~snsShankMap"]
        path = write_sglx(tmp_path, "j.imec0.ap.bin", rand16(50, 385), meta)
        with pytest.raises(RecordingError, match="pass --gain-to-uv"):
            open_recording(path)
        with h5py.File(tmp_path / "two.h5", "w") as f:
            f["a"] = np.zeros((100, 2), np.int16)
            f["b"] = np.zeros((100, 2), np.int16)
        with pytest.raises(RecordingError, match="choose one with --dataset"):
            open_recording(tmp_path / "two.h5")
        with h5py.File(tmp_path / "nofs.h5", "w") as f:
            f["a"] = np.zeros((100, 2), np.int16)
        with pytest.raises(RecordingError, match="unknown; pass --fs"):
            open_recording(tmp_path / "nofs.h5")
        with pytest.raises(RecordingError, match="choose one with --dataset"):
            write_oe(tmp_path / "oe", [oe_stream("Neuropix-PXI-100.ProbeA-AP", 4),
                                       oe_stream("Neuropix-PXI-100.ProbeB-AP", 4)],
                     [rand16(10, 4), rand16(10, 4)])
            open_recording(tmp_path / "oe")
    with pytest.raises(RecordingError, match=r"pass layout='samples_channels' or "
                                             r"layout='channels_samples'"):
        open_recording(np.zeros((300, 200), np.int16), fs=3e4)


# -- coincident contacts ---------------------------------------------------------------------------
def test_read_probe_refuses_coincident_contacts(tmp_path):
    (tmp_path / "a.csv").write_text("0,0\n0,20\n0,0\n0,40\n")
    with pytest.raises(RecordingError, match=r"a.csv: channels 0 and 2 are both at \(0, 0\) µm"):
        read_probe(tmp_path / "a.csv")
    (tmp_path / "b.json").write_text(json.dumps({
        "specification": "probeinterface", "probes": [{
            "contact_positions": [[0, 0], [16, 20], [0, 20], [16, 20]],
            "device_channel_indices": [3, 1, 2, 0]}]}))
    with pytest.raises(RecordingError, match=r"b.json: channels 0 and 1 are both at \(16, 20\)"):
        read_probe(tmp_path / "b.json")
    (tmp_path / "c.prb").write_text("channel_groups = {0: {'channels': [0, 1, 2], "
                                    "'geometry': {0: (5, 5), 1: (5, 5), 2: (5, 5)}}}\n")
    with pytest.raises(RecordingError, match=r"channels 0, 1 and 2 are all at \(5, 5\) µm"):
        read_probe(tmp_path / "c.prb")
    np.save(tmp_path / "d.npy", np.zeros((384, 2)))
    with pytest.raises(RecordingError, match=r"channels 0, 1, 2, 3, \.\.\. \(384 in all\) are "
                                             r"all at \(0, 0\) µm: the contacts of a probe are "
                                             r"at distinct positions"):
        read_probe(tmp_path / "d.npy")
    # two probes of a group at the same place
    (tmp_path / "e.json").write_text(json.dumps({
        "specification": "probeinterface", "probes": [
            {"contact_positions": [[0, 0], [0, 20]]}, {"contact_positions": [[0, 0], [0, 20]]}]}))
    with pytest.raises(RecordingError, match=r"channels 0 and 2 are both at \(0, 0\) µm; "
                                             r"channels 1 and 3 are both at \(0, 20\) µm"):
        read_probe(tmp_path / "e.json")


def test_probe_objects_and_arrays_with_coincident_contacts_are_refused(tmp_path):
    class Probe:
        contact_positions = np.array([[0.0, 0.0], [0.0, 20.0], [0.0, 20.0]])
        device_channel_indices = None

    with pytest.raises(RecordingError, match=r"geometry: channels 1 and 2 are both at \(0, 20\)"):
        probe_positions(Probe())
    x = rand16(3000, 3)
    with pytest.raises(RecordingError, match=r"channels 1 and 2 are both at \(0, 20\)"):
        open_recording(x, fs=3e4, geometry=Probe())
    with pytest.raises(RecordingError, match=r"geometry: channels 0, 1 and 2 are all at \(0, 0\)"):
        open_recording(x, fs=3e4, geometry=np.zeros((3, 2)))
    with pytest.raises(RecordingError, match=r"geometry: channels 0 and 2 are both at \(1, 2\)"):
        ArrayRecording(x, 3e4, geometry=[[1, 2], [3, 4], [1, 2]])
    (tmp_path / "p.csv").write_text("0,0\n0,0\n0,20\n")
    with pytest.raises(RecordingError, match=r"p.csv: channels 0 and 1 are both at \(0, 0\)"):
        open_recording(x, fs=3e4, geometry=tmp_path / "p.csv")
    # distinct positions, however close, are a probe
    g = np.array([[0.0, 0.0], [0.0, 1e-3], [1e-3, 0.0]])
    np.testing.assert_array_equal(open_recording(x, fs=3e4, geometry=g).geometry, g)


def test_a_file_geometry_with_coincident_contacts_is_not_used_and_can_be_overridden(tmp_path):
    """A placeholder geometry in a file (all contacts at one place) does not stop the file
    from being read: it is dropped with a warning naming the contacts, and steps that need a
    geometry then ask for one; a geometry given is used, and a coincident one given is
    refused."""
    from dspk.io import RecordingWarning
    from dspk.pipeline import Pipeline, PipelineError

    path = tmp_path / "rec.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", data=rand16(3000, 4))
        d.attrs["fs"] = 3e4
        d.attrs["geometry"] = np.zeros((4, 2))                  # a placeholder
    with pytest.warns(RecordingWarning, match=r"channels 0, 1, 2 and 3 are all at \(0, 0\).*"
                                              r"geometry is not used"):
        rec = open_recording(path)
    assert rec.geometry is None
    with pytest.raises(PipelineError, match="needs the recording's geometry"):
        Pipeline.from_options(whiten="local").check(rec)
    g = np.c_[np.zeros(4), 20.0 * np.arange(4)]
    assert open_recording(path, geometry=g).geometry[3, 1] == 60.0
    with pytest.raises(RecordingError, match=r"channels 0, 1, 2 and 3 are all at"):
        open_recording(path, geometry=np.zeros((4, 2)))

    nwb = tmp_path / "rec.nwb"
    with h5py.File(nwb, "w") as f:
        es = f.create_group("acquisition/es")
        es.attrs["neurodata_type"] = "ElectricalSeries"
        es.create_dataset("data", data=rand16(3000, 3))
        es.create_dataset("starting_time", data=0.0).attrs["rate"] = 3e4
        table = f.create_group("general/extracellular_ephys/electrodes")
        table["rel_x"] = np.array([0.0, 0.0, 0.0])
        table["rel_y"] = np.array([0.0, 20.0, 20.0])
        es["electrodes"] = np.arange(3)
    with pytest.warns(RecordingWarning, match=r"channels 1 and 2 are both at \(0, 20\)"):
        assert open_recording(nwb).geometry is None
    assert open_recording(nwb, geometry=g[:3]).n_channels == 3


def test_the_bundled_sample_has_distinct_contacts():
    data = str(Path(__file__).resolve().parents[2] / "data")
    with open_recording(os.path.join(data, "sample.nwb")) as rec:
        g = rec.geometry
    assert g is not None and len(np.unique(g, axis=0)) == len(g)


# -- options that do not apply -------------------------------------------------------------------
def test_options_contradicting_an_array_are_refused():
    x = np.zeros((3000, 4), np.int16)
    with pytest.raises(RecordingError, match=r"dataset: an array \(shape \(3000, 4\)\) holds one "
                                             r"stream; dataset= does not apply"):
        open_recording(x, fs=3e4, dataset="/traces")
    with pytest.raises(RecordingError, match=r"n_channels: .* channel count \(4\); leave "
                                             r"n_channels= out \(got 5\)"):
        open_recording(x, fs=3e4, n_channels=5)
    with pytest.raises(RecordingError, match="dtype: .* an array, int16; got float32"):
        open_recording(x, fs=3e4, dtype=np.float32)
    with pytest.raises(RecordingError, match="header_bytes: .* an array, with no header"):
        open_recording(x, fs=3e4, header_bytes=8)
    # options that describe it are accepted
    assert open_recording(x, fs=3e4, n_channels=4, dtype="int16").n_channels == 4


def test_options_contradicting_an_hdf5_dataset_are_refused(tmp_path):
    path = tmp_path / "rec.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("traces", data=rand16(3000, 4)).attrs["fs"] = 3e4
    with pytest.raises(RecordingError, match=r"n_channels: .* an HDF5 dataset whose metadata "
                                             r"give the channel count \(4\)"):
        open_recording(path, n_channels=3)
    with pytest.raises(RecordingError, match="dtype: .* an HDF5 dataset, int16; got float32"):
        open_recording(path, dtype="float32")
    with pytest.raises(RecordingError, match="header_bytes: .* an HDF5 dataset, with no header"):
        open_recording(path, header_bytes=16)
    rec = open_recording(path, n_channels=4, dtype=np.int16, layout="samples_channels")
    assert rec.n_channels == 4


def test_options_contradicting_a_flat_binary_or_spikeinterface_are_refused(tmp_path):
    rand16(100, 4).tofile(tmp_path / "x.bin")
    with pytest.raises(RecordingError, match=r"dataset: a flat binary \(.*x.bin\) holds one "
                                             r"stream"):
        open_recording(tmp_path / "x.bin", n_channels=4, fs=3e4, dataset="a")

    with pytest.raises(RecordingError, match="layout: .* a SpikeInterface recording, stored "
                                             r"\[samples, channels\]"):
        open_recording(TinySIRecording(), layout="channels_samples")
    with pytest.raises(RecordingError, match="dataset: a SpikeInterface recording"):
        open_recording(TinySIRecording(), dataset="x")
    assert isinstance(open_recording(TinySIRecording(), n_channels=2), SpikeInterfaceRecording)


# -- dispatch ------------------------------------------------------------------------------------
def test_formats_are_asked_in_order_and_each_recognizes_its_own(tmp_path):
    assert recording_formats() == (ArrayRecording, SpikeInterfaceRecording, OpenEphysRecording,
                                   SpikeGLXRecording, HDF5Recording, BinaryRecording)
    rec_dir = write_oe(tmp_path / "oe", [oe_stream("Rhythm_FPGA-100.0", 4)], [rand16(10, 4)])
    sglx = write_sglx(tmp_path, "s.imec0.ap.bin", rand16(10, 385), np1_meta())
    with h5py.File(tmp_path / "h.h5", "w") as f:
        f.create_dataset("t", data=rand16(3000, 2)).attrs["fs"] = 3e4
    rand16(10, 2).tofile(tmp_path / "flat.bin")
    sources = {ArrayRecording: np.zeros((3000, 2), np.int16),
               OpenEphysRecording: rec_dir,
               SpikeGLXRecording: sglx,
               HDF5Recording: tmp_path / "h.h5",
               BinaryRecording: tmp_path / "flat.bin"}
    opts = OpenOptions()
    for fmt, source in sources.items():
        first = next(f for f in recording_formats() if f.recognizes(source, opts))
        assert first is fmt, (fmt, first)
        assert not any(f.recognizes(source, opts) for f in (ArrayRecording,
                                                            SpikeInterfaceRecording)
                       if f is not fmt)
    # folders: Open Ephys only when a recording is in or below them
    (tmp_path / "empty").mkdir()
    assert not any(f.recognizes(tmp_path / "empty", opts) for f in recording_formats())
    with pytest.raises(RecordingError, match="a directory with no structure.oebin"):
        open_recording(tmp_path / "empty")
    with pytest.raises(TypeError, match="source: expected a path or an array, got int"):
        open_recording(3)
    with pytest.raises(FileNotFoundError, match="no such file"):
        open_recording(tmp_path / "none.bin")


def io_imports():
    """{module: [(imported io module, names)]} of dspk/io's modules, every import statement
    (function-level ones too), read from the source."""
    folder = Path(dspk.io.__file__).parent
    found = {}
    for path in sorted(folder.glob("*.py")):
        edges = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    edges.append((node.module, [a.name for a in node.names]))
                else:                                  # from . import hdf5
                    edges += [(a.name, []) for a in node.names]
        found[path.stem] = edges
    return found


def test_io_modules_import_without_a_cycle():
    graph = {m: {t for t, _ in edges if t != "__init__"} for m, edges in io_imports().items()
             if m != "__init__"}
    assert graph["probe"] == {"errors"} and "probe" in graph["recording"]
    state = {}

    def visit(m, path):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", f"import cycle: {' -> '.join(path + [m])}"
        state[m] = "open"
        for t in sorted(graph.get(m, ())):
            visit(t, path + [m])
        state[m] = "done"

    for m in graph:
        visit(m, [])


def test_io_modules_import_no_private_names_of_each_other():
    private = [(m, t, n) for m, edges in io_imports().items() for t, names in edges
               for n in names if n.startswith("_")]
    assert not private
