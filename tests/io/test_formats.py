"""dspk.io's vendor formats and probe files: SpikeGLX (.bin + .meta: NP1.0, NP2.0, nidq), Open
Ephys binary format (structure.oebin + continuous.dat), probeinterface JSON, .prb and CSV probe
files; a stored-channel subset of a flat binary. Files are written here in each format's
documented layout; expected µV per bit are computed by hand from the documented formulas."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspk.io import (BinaryRecording, OpenEphysRecording, RecordingError, SpikeGLXRecording,
                     open_recording, read_probe)
from tests.recordings import (neuropixels_oe, np1_ap_gain, np1_lf_gain, np1_meta, np2_meta,
                              oe_stream, pi_json, pi_xy, rand16, write_oe, write_sglx)

# -- SpikeGLX ------------------------------------------------------------------------------------


@pytest.mark.parametrize("geom", [("shank",), ("geom",), ("shank", "geom")])
def test_spikeglx_np1_ap(tmp_path, geom):
    data = rand16(1000, 385)
    data[:, 384] = np.arange(1000) % 2 * 64                        # the sync word (bit 6)
    path = write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", data, np1_meta(geom=geom))
    rec = open_recording(path)
    assert isinstance(rec, SpikeGLXRecording) and rec.stream == "imec"
    assert (rec.n_channels, rec.n_samples, rec.fs, rec.dtype) == (384, 1000, 30000.0, np.int16)
    assert rec.excluded_columns.tolist() == [384]                   # SY: not a channel
    want_gain = np.array([1e6 * 0.6 / 512 / np1_ap_gain(c) for c in range(384)])
    np.testing.assert_allclose(rec.gain_to_uv, want_gain, rtol=1e-12)
    assert rec.gain_to_uv[3] == pytest.approx(2.34375)              # 0.6 V / 512 / 500
    np.testing.assert_array_equal(rec.offset_to_uv, 0)
    # probeinterface's NP1.0 (by the part number): the staggered columns, x from 0
    np.testing.assert_array_equal(rec.geometry[:4], [[16, 0], [48, 0], [0, 20], [32, 20]])
    np.testing.assert_array_equal(rec.geometry[383], [32, 191 * 20])
    assert rec.contact_ids[:2].tolist() == ["e0", "e1"] and rec.shank_ids.max() == 0
    assert rec.used.sum() == 383 and not rec.used[191]
    # without a part number (older SpikeGLX): SpikeGLX's own coordinates, the same from the
    # shank map and the geometry map
    meta = np1_meta(geom=geom)
    del meta["imDatPrb_pn"]
    own = open_recording(write_sglx(tmp_path, "own_g0_t0.imec0.ap.bin", data, meta))
    np.testing.assert_array_equal(own.geometry[:4], [[27, 0], [59, 0], [11, 20], [43, 20]])
    np.testing.assert_array_equal(own.geometry[383], [43, 191 * 20])
    assert set(own.geometry[:, 0]) == {11.0, 27.0, 43.0, 59.0}
    assert own.used.sum() == 383 and not own.used[191] and own.contact_ids is None
    np.testing.assert_array_equal(rec.read(scaled=False), data[:, :384].T)
    np.testing.assert_array_equal(rec.read(10, 20, channels=[383, 0], scaled=False),
                                  data[10:20, [383, 0]].T)
    got = rec.read(0, 50, channels=[5])
    np.testing.assert_allclose(got, data[:50, [5]].T * want_gain[5], rtol=1e-6)
    native = rec.read_native(3, 9)                                  # [samples, channels]
    np.testing.assert_array_equal(native, data[3:9, :384])
    # the .meta opens it as well
    assert open_recording(path.with_suffix(".meta")).n_channels == 384


def test_spikeglx_np1_lf_uses_the_lf_gains(tmp_path):
    data = rand16(300, 385, seed=1)
    path = write_sglx(tmp_path, "run_g0_t0.imec0.lf.bin", data, np1_meta(band="lf"))
    rec = open_recording(path)
    assert (rec.n_channels, rec.fs) == (384, 2500.0)
    np.testing.assert_allclose(rec.gain_to_uv, [1e6 * 0.6 / 512 / np1_lf_gain(c)
                                                for c in range(384)])
    np.testing.assert_array_equal(rec.read(scaled=False), data[:, :384].T)


def test_spikeglx_saved_subset_maps_gains_and_geometry(tmp_path):
    ids = list(range(10)) + list(range(100, 110))
    data = rand16(200, 21, seed=2)
    path = write_sglx(tmp_path, "sub_g0_t0.imec0.ap.bin", data, np1_meta(stored_ids=ids))
    meta = open(path.with_suffix(".meta")).read()
    assert "snsSaveChanSubset=0:9,100:109,768" in meta
    rec = open_recording(path)
    assert rec.n_channels == 20 and rec.saved_channels.tolist() == ids
    np.testing.assert_allclose(rec.gain_to_uv, [1e6 * 0.6 / 512 / np1_ap_gain(c) for c in ids])
    np.testing.assert_array_equal(rec.geometry[10], pi_xy(0, 50))       # site 100
    np.testing.assert_array_equal(rec.read(scaled=False), data[:, :20].T)

    # LF channels are numbered after the AP ones (384 + c); their IMRO entry is c
    path = write_sglx(tmp_path, "sub_g0_t0.imec0.lf.bin", data,
                      np1_meta(stored_ids=ids, band="lf"))
    assert "snsSaveChanSubset=384:393,484:493,768" in open(path.with_suffix(".meta")).read()
    rec = open_recording(path)
    assert rec.saved_channels.tolist() == ids
    np.testing.assert_allclose(rec.gain_to_uv, [1e6 * 0.6 / 512 / np1_lf_gain(c) for c in ids])


@settings(max_examples=25, deadline=None)
@given(ids=st.lists(st.integers(0, 383), min_size=1, max_size=40, unique=True).map(sorted),
       n=st.integers(2, 60), start=st.integers(0, 59), length=st.integers(0, 60))
def test_spikeglx_random_saved_subsets(tmp_path_factory, ids, n, start, length):
    folder = tmp_path_factory.mktemp("sglx")
    data = rand16(n, len(ids) + 1, seed=len(ids) * 7 + n)
    path = write_sglx(folder, "r_g0_t0.imec0.ap.bin", data, np1_meta(stored_ids=ids))
    rec = open_recording(path)
    assert rec.saved_channels.tolist() == ids
    np.testing.assert_allclose(rec.gain_to_uv, [1e6 * 0.6 / 512 / np1_ap_gain(c) for c in ids])
    np.testing.assert_array_equal(rec.geometry, [pi_xy(c % 2, c // 2) for c in ids])
    start = min(start, n)
    stop = min(n, start + length)
    np.testing.assert_array_equal(rec.read(start, stop, scaled=False), data[start:stop, :-1].T)


@pytest.mark.parametrize("ptype, with_maxint", [(24, True), (21, False)])
def test_spikeglx_np2(tmp_path, ptype, with_maxint):
    data = rand16(400, 385, seed=3)
    path = write_sglx(tmp_path, "np2_g0_t0.imec0.ap.bin", data, np2_meta(ptype, 384, with_maxint))
    rec = open_recording(path)
    # fixed gain 80; 14-bit (imMaxInt 8192, the default for NP2.0 when absent)
    np.testing.assert_allclose(rec.gain_to_uv, 1e6 * 0.5 / 8192 / 80)
    assert rec.gain_to_uv[0] == pytest.approx(0.762939453125)
    # probeinterface's (by the part number): SpikeGLX's layout with x from 0
    if ptype == 24:
        np.testing.assert_array_equal(rec.geometry[0], [0, 0])
        np.testing.assert_array_equal(rec.geometry[97], [250 + 32, 0])     # shank 1
        np.testing.assert_array_equal(rec.geometry[383], [750 + 32, 15 * 47])
        assert rec.shank_ids.tolist() == np.repeat(np.arange(4), 96).tolist()
    else:   # NP2.0 single shank: 32 µm columns, 15 µm rows, not staggered
        np.testing.assert_array_equal(rec.geometry[:3], [[0, 0], [32, 0], [0, 15]])
    # without a part number: SpikeGLX's own coordinates, from the geometry or shank map
    meta = np2_meta(ptype, 384, with_maxint)
    del meta["imDatPrb_pn"]
    own = open_recording(write_sglx(tmp_path, "own_g0_t0.imec0.ap.bin", data, meta))
    if ptype == 24:
        np.testing.assert_array_equal(own.geometry[0], [27, 0])
        np.testing.assert_array_equal(own.geometry[97], [250 + 59, 0])     # shank 1
        np.testing.assert_array_equal(own.geometry[383], [750 + 59, 15 * 47])
        assert own.shank_ids.tolist() == rec.shank_ids.tolist()
    else:
        np.testing.assert_array_equal(own.geometry[:3], [[27, 0], [59, 0], [27, 15]])
    np.testing.assert_array_equal(rec.read(scaled=False), data[:, :384].T)


def test_spikeglx_nidq(tmp_path):
    meta = {"typeThis": "nidq", "niSampRate": "25000", "nSavedChans": "5",
            "snsMnMaXaDw": "2,1,1,1", "acqMnMaXaDw": "2,1,1,1", "snsSaveChanSubset": "all",
            "niAiRangeMax": "5", "niAiRangeMin": "-5", "niMaxInt": "32768",
            "niMNGain": "200", "niMAGain": "2", "niMNChans1": "0:1", "niMAChans1": "2",
            "niXAChans1": "3", "niXDChans1": "0:7", "niXDBytes1": "1",
            "~snsChanMap": "(2,1,32,1,1)(MN0C0;0:0)(MN0C1;1:1)(MA0C0;2:2)(XA0;3:3)(XD0;4:4)"}
    data = rand16(500, 5, seed=4)
    path = write_sglx(tmp_path, "run_g0_t0.nidq.bin", data, meta)
    rec = open_recording(path)
    assert (rec.n_channels, rec.fs, rec.stream) == (4, 25000.0, "nidq")
    np.testing.assert_allclose(rec.gain_to_uv, [1e6 * 5 / 32768 / g for g in (200, 200, 2, 1)])
    assert rec.geometry is None and rec.excluded_columns.tolist() == [4]   # XD word left out
    np.testing.assert_array_equal(rec.read(scaled=False), data[:, :4].T)


def test_spikeglx_arguments_override_the_meta(tmp_path):
    data = rand16(100, 385, seed=5)
    meta = np1_meta()
    del meta["imSampRate"]                                # not needed when fs= is given
    path = write_sglx(tmp_path, "o.imec0.ap.bin", data, meta)
    probe = tmp_path / "linear.csv"
    probe.write_text("".join(f"0,{20 * i}\n" for i in range(384)))
    rec = open_recording(path, fs=29999.5, gain_to_uv=0.25, offset_to_uv=1.0, geometry=probe)
    assert rec.fs == 29999.5
    np.testing.assert_array_equal(rec.gain_to_uv, 0.25)
    np.testing.assert_array_equal(rec.geometry[:, 1], 20.0 * np.arange(384))
    np.testing.assert_allclose(rec.read(0, 3, channels=[2]), data[:3, [2]].T * 0.25 + 1.0)
    with pytest.raises(RecordingError, match="imSampRate: missing from .*o.imec0.ap.meta"):
        open_recording(path)
    # the flat-binary options are refused when they contradict the meta
    assert open_recording(path, fs=3e4, n_channels=385).n_channels == 384
    with pytest.raises(RecordingError, match="n_channels: .* a SpikeGLX file"):
        open_recording(path, fs=3e4, n_channels=380)
    with pytest.raises(RecordingError, match="dtype: .*int16"):
        open_recording(path, fs=3e4, dtype=np.float32)
    with pytest.raises(RecordingError, match="dataset: a SpikeGLX file"):
        open_recording(path, fs=3e4, dataset="x")


@pytest.mark.parametrize("key", ["nSavedChans", "imAiRangeMax", "snsApLfSy", "~imroTbl"])
def test_spikeglx_missing_meta_key_is_named(tmp_path, key):
    meta = np1_meta()
    del meta[key]
    path = write_sglx(tmp_path, "m.imec0.ap.bin", rand16(50, 385), meta)
    with pytest.raises(RecordingError, match=f"{key.lstrip('~')}: missing from "
                                             f".*m.imec0.ap.meta"):
        open_recording(path)


def test_spikeglx_missing_nidq_gain_is_named(tmp_path):
    meta = {"typeThis": "nidq", "niSampRate": "25000", "nSavedChans": "2",
            "snsMnMaXaDw": "1,0,0,1", "niAiRangeMax": "5"}
    path = write_sglx(tmp_path, "n.nidq.bin", rand16(50, 2), meta)
    with pytest.raises(RecordingError, match="niMNGain: missing from .*n.nidq.meta"):
        open_recording(path)
    assert open_recording(path, gain_to_uv=1.0).n_channels == 1


def test_spikeglx_truncated_and_size_mismatch(tmp_path):
    data = rand16(100, 385)
    path = write_sglx(tmp_path, "t.imec0.ap.bin", data, np1_meta())
    with open(path, "r+b") as f:                      # a copy cut off mid-frame
        f.truncate(path.stat().st_size - 7)
    with pytest.raises(RecordingError, match=r"t.imec0.ap.bin: .* bytes on disk, but its .meta "
                                             r"says fileSizeBytes=77000"):
        open_recording(path)
    # whole frames missing: only fileSizeBytes tells
    path = write_sglx(tmp_path, "u.imec0.ap.bin", data, np1_meta(), file_size=200 * 385 * 2)
    with pytest.raises(RecordingError, match="u.imec0.ap.bin: 77000 bytes on disk, .*"
                                             "fileSizeBytes=154000: the file is truncated"):
        open_recording(path)
    # no fileSizeBytes and not a whole number of frames
    meta = np1_meta()
    path = write_sglx(tmp_path, "v.imec0.ap.bin", data, meta)
    text = path.with_suffix(".meta").read_text().replace("fileSizeBytes=77000\n", "")
    path.with_suffix(".meta").write_text(text)
    with open(path, "ab") as f:
        f.write(b"\x00\x01\x02")
    with pytest.raises(RecordingError, match="v.imec0.ap.bin: 77003 bytes is not a whole number "
                                             "of 385-channel int16 frames"):
        open_recording(path)


def test_spikeglx_inconsistent_meta(tmp_path):
    meta = np1_meta()
    meta["snsApLfSy"] = "384,0,0"
    path = write_sglx(tmp_path, "i.imec0.ap.bin", rand16(50, 385), meta)
    with pytest.raises(RecordingError, match=r"snsApLfSy: 384\+0\+0 stored channels but "
                                             r"nSavedChans=385"):
        open_recording(path)
    meta = np1_meta()
    meta["imDatPrb_type"] = "3000"                              # a type dspk has no gains for
    del meta["~snsShankMap"], meta["imDatPrb_pn"]               # nor any geometry
    path = write_sglx(tmp_path, "j.imec0.ap.bin", rand16(50, 385), meta)
    with pytest.raises(RecordingError, match="probe type 3000 .* pass gain_to_uv="):
        open_recording(path)
    rec = open_recording(path, gain_to_uv=2.0)
    assert rec.n_channels == 384 and rec.geometry is None
    meta = np1_meta(stored_ids=range(10))
    meta["~imroTbl"] = "(0,384)(0 0 0 500 250 1)"               # entries missing
    path = write_sglx(tmp_path, "k.imec0.ap.bin", rand16(50, 11), meta)
    with pytest.raises(RecordingError, match=r"imroTbl: no entry for channel\(s\) \[1, 2"):
        open_recording(path)


def test_a_bin_without_meta_is_still_a_flat_binary(tmp_path):
    data = rand16(100, 4)
    data.tofile(tmp_path / "plain.ap.bin")
    # named like a SpikeGLX stream: the missing .meta is what is reported
    with pytest.raises(RecordingError, match="plain.ap.meta: missing .* as a flat binary"):
        open_recording(tmp_path / "plain.ap.bin")
    assert open_recording(tmp_path / "plain.ap.bin", n_channels=4, fs=3e4).n_channels == 4


# -- Open Ephys ----------------------------------------------------------------------------------


def test_open_ephys_neuropixels_picks_the_ap_stream(tmp_path):
    rec_dir, data = neuropixels_oe(tmp_path)
    for where in (tmp_path, tmp_path / "Record Node 101", rec_dir, rec_dir / "structure.oebin"):
        rec = open_recording(where)
        assert isinstance(rec, OpenEphysRecording)
        assert (rec.stream, rec.n_channels, rec.n_samples, rec.fs) == \
            ("Neuropix-PXI-100.ProbeA-AP", 384, 900, 30000.0)
    np.testing.assert_allclose(rec.gain_to_uv, 0.195)
    assert rec.geometry is None
    np.testing.assert_array_equal(rec.read(scaled=False), data[0].T)
    np.testing.assert_allclose(rec.read(5, 9, channels=[7]), data[0][5:9, [7]].T * 0.195,
                               rtol=1e-6)
    lfp = open_recording(tmp_path, dataset="Neuropix-PXI-100.ProbeA-LFP")
    assert (lfp.fs, lfp.n_samples) == (2500.0, 75)
    np.testing.assert_array_equal(lfp.read(scaled=False), data[1].T)
    assert open_recording(tmp_path, dataset="1").stream == "Neuropix-PXI-100.ProbeA-LFP"
    assert open_recording(tmp_path, dataset="ProbeA-LFP").fs == 2500.0
    daq = open_recording(tmp_path, dataset="2")               # analog inputs in V per bit
    np.testing.assert_allclose(daq.gain_to_uv, 0.00030518 * 1e6)
    # the stream's continuous.dat opens its stream
    dat = rec_dir / "continuous" / "Neuropix-PXI-100.ProbeA-LFP" / "continuous.dat"
    assert open_recording(dat).fs == 2500.0
    with pytest.raises(RecordingError, match="the data of stream 'Neuropix-PXI-100.ProbeA-LFP'"):
        open_recording(dat, dataset="Neuropix-PXI-100.ProbeA-AP")
    # a probe supplied by the user
    probe = tmp_path / "np.csv"
    probe.write_text("x,y\n" + "".join(f"{16 * (i % 2)},{20 * (i // 2)}\n" for i in range(384)))
    assert open_recording(tmp_path, geometry=probe).geometry[3].tolist() == [16.0, 20.0]


def test_open_ephys_unknown_stream_lists_the_streams(tmp_path):
    neuropixels_oe(tmp_path)
    with pytest.raises(RecordingError, match=r"dataset: no stream 'ProbeB-AP' .* 0: "
                                             r"'Neuropix-PXI-100.ProbeA-AP' \(384 channels, "
                                             r"30000.0 Hz\); 1: 'Neuropix-PXI-100.ProbeA-LFP'"):
        open_recording(tmp_path, dataset="ProbeB-AP")


def test_open_ephys_two_probes_need_a_choice(tmp_path):
    streams = [oe_stream("Neuropix-PXI-100.ProbeA-AP", 4),
               oe_stream("Neuropix-PXI-100.ProbeB-AP", 4)]
    write_oe(tmp_path, streams, [rand16(10, 4), rand16(10, 4, 1)])
    with pytest.raises(RecordingError, match="2 continuous streams and none is clearly the "
                                             "neural .* choose one with dataset="):
        open_recording(tmp_path)
    assert open_recording(tmp_path, dataset="Neuropix-PXI-100.ProbeB-AP").n_channels == 4


def test_open_ephys_older_neuropixels_naming_picks_the_spike_band(tmp_path):
    streams = [oe_stream("Neuropix-PXI-100.0", 6), oe_stream("Neuropix-PXI-100.1", 6, 2500.0)]
    write_oe(tmp_path, streams, [rand16(40, 6), rand16(4, 6)])
    assert open_recording(tmp_path).stream == "Neuropix-PXI-100.0"


def test_open_ephys_acquisition_board_leaves_out_aux_and_adc(tmp_path):
    names = [f"CH{i + 1}" for i in range(32)] + ["AUX1", "AUX2", "AUX3"] + \
        [f"ADC{i + 1}" for i in range(8)]
    streams = [oe_stream("Acquisition_Board-100.Rhythm Data", 43, names=names)]
    data = rand16(600, 43, 13)
    write_oe(tmp_path, streams, [data])
    rec = open_recording(tmp_path)
    assert rec.n_channels == 32 and rec.channel_names == names[:32]
    assert rec.excluded_columns.tolist() == list(range(32, 43))
    np.testing.assert_array_equal(rec.read(scaled=False), data[:, :32].T)
    np.testing.assert_array_equal(rec.read_native(0, 10), data[:10, :32])


def test_open_ephys_several_recordings_are_listed(tmp_path):
    s = [oe_stream("Rhythm_FPGA-100.0", 4)]
    write_oe(tmp_path, s, [rand16(10, 4)], "recording1")
    write_oe(tmp_path, [oe_stream("Rhythm_FPGA-100.0", 4)], [rand16(20, 4)], "recording2")
    with pytest.raises(RecordingError, match=r"2 Open Ephys recordings below .*\n  "
                                             r"Record Node 101.experiment1.recording1."
                                             r"structure.oebin\n  .*recording2"):
        open_recording(tmp_path)
    rec = open_recording(tmp_path / "Record Node 101" / "experiment1" / "recording2")
    assert rec.n_samples == 20


def test_open_ephys_bad_inputs(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordingError, match="a directory with no structure.oebin"):
        open_recording(tmp_path / "empty")
    s = oe_stream("Rhythm_FPGA-100.0", 4)
    del s["channels"][2]["bit_volts"]
    write_oe(tmp_path / "a", [s], [rand16(10, 4)])
    with pytest.raises(RecordingError, match="bit_volts: missing from channel 'CH3' of stream "
                                             "'Rhythm_FPGA-100.0'"):
        open_recording(tmp_path / "a")
    assert open_recording(tmp_path / "a", gain_to_uv=0.195).n_channels == 4
    s = oe_stream("Rhythm_FPGA-100.0", 4)
    del s["sample_rate"]
    write_oe(tmp_path / "b", [s], [rand16(10, 4)])
    with pytest.raises(RecordingError, match="sample_rate: missing from stream"):
        open_recording(tmp_path / "b")
    assert open_recording(tmp_path / "b", fs=20000.0).fs == 20000.0
    rec_dir = write_oe(tmp_path / "c", [oe_stream("Rhythm_FPGA-100.0", 4)], [rand16(10, 4)])
    dat = rec_dir / "continuous" / "Rhythm_FPGA-100.0" / "continuous.dat"
    with open(dat, "ab") as f:
        f.write(b"\x01")
    with pytest.raises(RecordingError, match="not a whole number of 4-channel int16 frames"):
        open_recording(tmp_path / "c")
    dat.unlink()
    with pytest.raises(FileNotFoundError, match="continuous.dat: no such file"):
        open_recording(tmp_path / "c")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "structure.oebin").write_text("{not json")
    with pytest.raises(RecordingError, match="not a readable structure.oebin"):
        open_recording(tmp_path / "d")
    assert open_recording(tmp_path / "a", gain_to_uv=1.0, n_channels=4).n_channels == 4
    with pytest.raises(RecordingError, match="n_channels: .* an Open Ephys recording"):
        open_recording(tmp_path / "a", gain_to_uv=1.0, n_channels=5)


# -- probe files ---------------------------------------------------------------------------------


def test_probeinterface_json_ordered_by_device_channel(tmp_path):
    pos = [[0, 0], [0, 20], [0, 40], [0, 60]]
    path = pi_json(tmp_path / "p.json", [{"ndim": 2, "si_units": "um", "contact_positions": pos,
                                          "device_channel_indices": [3, 0, 2, 1],
                                          "contact_ids": ["a", "b", "c", "d"]}])
    g = read_probe(path, n_channels=4)
    assert g.dtype == np.float64 and g[:, 1].tolist() == [20, 60, 40, 0]
    # two probes, wired interleaved; an unconnected contact (-1) dropped
    path = pi_json(tmp_path / "two.json", [
        {"ndim": 2, "contact_positions": [[0, 0], [0, 20], [0, 40]],
         "device_channel_indices": [0, 2, -1]},
        {"ndim": 2, "si_units": "mm", "contact_positions": [[0.3, 0], [0.3, 0.02]],
         "device_channel_indices": [1, 3]}])
    np.testing.assert_allclose(read_probe(path), [[0, 0], [300, 0], [0, 20], [300, 20]])
    # no wiring: the contacts in file order, probe after probe
    path = pi_json(tmp_path / "plain.json", [{"contact_positions": pos[:2]},
                                             {"contact_positions": pos[2:]}])
    assert read_probe(path)[:, 1].tolist() == [0, 20, 40, 60]


def test_probeinterface_json_bad_inputs(tmp_path):
    with pytest.raises(RecordingError, match=r"4 channel positions, expected 5"):
        read_probe(pi_json(tmp_path / "a.json", [{"contact_positions": [[0, 0]] * 4}]), 5)
    with pytest.raises(RecordingError, match=r"no position for channel\(s\) 1"):
        read_probe(pi_json(tmp_path / "b.json", [{"contact_positions": [[0, 0], [0, 1]],
                                                 "device_channel_indices": [0, 2]}]))
    with pytest.raises(RecordingError, match=r"channel\(s\) 0 appear more than once"):
        read_probe(pi_json(tmp_path / "c.json", [{"contact_positions": [[0, 0], [0, 1]],
                                                 "device_channel_indices": [0, 0]}]))
    with pytest.raises(RecordingError, match="some probes have device_channel_indices"):
        read_probe(pi_json(tmp_path / "d.json", [
            {"contact_positions": [[0, 0]], "device_channel_indices": [0]},
            {"contact_positions": [[0, 1]]}]))
    (tmp_path / "e.json").write_text(json.dumps({"probes": []}))
    with pytest.raises(RecordingError, match="expected probeinterface JSON"):
        read_probe(tmp_path / "e.json")
    with pytest.raises(RecordingError, match="e.json.* must be finite"):
        read_probe(pi_json(tmp_path / "e.json", [{"contact_positions": [[0, 0], [0, None]]}]))


def test_prb_literals(tmp_path):
    path = tmp_path / "probe.prb"
    path.write_text('"""A 2-shank probe."""\n'
                    "total_nb_channels = 8\n"
                    "radius = 100\n"
                    "shank0 = {0: (0, 0), 1: (0, 20), 2: (16, 0), 3: (16, 20)}\n"
                    "channel_groups = {\n"
                    "    0: {'channels': list(range(4)), 'geometry': shank0,\n"
                    "        'graph': [(0, 1), (1, 2)]},\n"
                    "    1: {'channels': [7, 6, 5, 4],\n"
                    "        'geometry': [(200 + 16, 20), (200 + 16, 0), (200, 20), (200, -0)]},\n"
                    "}\n")
    g = read_probe(path, n_channels=8)
    np.testing.assert_array_equal(g, [[0, 0], [0, 20], [16, 0], [16, 20],
                                      [200, 0], [200, 20], [216, 0], [216, 20]])


@pytest.mark.parametrize("code", [
    "import os\nchannel_groups = {0: {'channels': [0], 'geometry': {0: (0, 0)}}}\n",
    "channel_groups = {0: {'channels': [0], 'geometry': {0: (0, 0)}}}\n"
    "open('pwned', 'w').write('x')\n",
    "channel_groups = __import__('os').system('touch pwned')\n",
    "channel_groups = {0: {'channels': [c for c in range(2)], 'geometry': {}}}\n",
    "def f():\n    pass\nchannel_groups = {}\n",
])
def test_prb_with_code_is_refused(tmp_path, code, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.prb"
    path.write_text(code)
    with pytest.raises(RecordingError, match=r"evil.prb, line \d: refused .* a .prb file is "
                                             r"read, not run"):
        read_probe(path)
    assert not (tmp_path / "pwned").exists()


def test_prb_bad_inputs(tmp_path):
    path = tmp_path / "a.prb"
    path.write_text("channel_groups = {0: {'channels': [0, 1, 3], "
                    "'geometry': {0: (0, 0), 1: (0, 20), 3: (0, 40)}}}\n")
    with pytest.raises(RecordingError, match=r"no position for channel\(s\) 2"):
        read_probe(path)
    path.write_text("channel_groups = {0: {'channels': [0, 1], 'geometry': {0: (0, 0)}}}\n")
    with pytest.raises(RecordingError, match=r"no geometry for channel\(s\) \[1\]"):
        read_probe(path)
    path.write_text("geometry = {0: (0, 0)}\n")
    with pytest.raises(RecordingError, match="expected a channel_groups"):
        read_probe(path)
    path.write_text("channel_groups = {0: {'channels': [0, 1], 'geometry': {0: (0, 0), "
                    "1: (0, float('nan'))}}}\n")
    with pytest.raises(RecordingError, match="refused"):
        read_probe(path)
    path.write_text("channel_groups = {0: {'channels': [0, 1]\n")
    with pytest.raises(RecordingError, match="not a Python-literal .prb file"):
        read_probe(path)


def test_csv_tsv_tables(tmp_path):
    (tmp_path / "a.csv").write_text("# from the lab wiki\nx_um,y_um\n0,0\n16, 20\n\n32,40\n")
    np.testing.assert_array_equal(read_probe(tmp_path / "a.csv", 3),
                                  [[0, 0], [16, 20], [32, 40]])
    (tmp_path / "b.tsv").write_text("channel\tx\ty\n2\t32\t40\n0\t0\t0\n1\t16\t20\n")
    np.testing.assert_array_equal(read_probe(tmp_path / "b.tsv"), [[0, 0], [16, 20], [32, 40]])
    (tmp_path / "c.txt").write_text("0 0\n0 20.5\n")
    np.testing.assert_array_equal(read_probe(tmp_path / "c.txt"), [[0, 0], [0, 20.5]])
    np.save(tmp_path / "d.npy", np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert read_probe(tmp_path / "d.npy").tolist() == [[1, 2], [3, 4]]


def test_table_bad_inputs(tmp_path):
    (tmp_path / "a.csv").write_text("1,0,0,5\n")
    with pytest.raises(RecordingError, match=r"a.csv, line 1: 4 columns; expected 2 \(x, y\) "
                                             r"or 3 \(channel, x, y\)"):
        read_probe(tmp_path / "a.csv")
    (tmp_path / "b.csv").write_text("0,0\n0,20\n1,0,40\n")
    with pytest.raises(RecordingError, match="line 3: 3 columns where the lines before have 2"):
        read_probe(tmp_path / "b.csv")
    (tmp_path / "c.csv").write_text("0,0\n0,nan\n")
    with pytest.raises(RecordingError, match=r"c.csv: positions must be finite; channel\(s\) 1"):
        read_probe(tmp_path / "c.csv")
    (tmp_path / "d.csv").write_text("0,0\n0,20\n")
    with pytest.raises(RecordingError, match="d.csv: 2 channel positions, expected 3"):
        read_probe(tmp_path / "d.csv", n_channels=3)
    (tmp_path / "e.csv").write_text("x,y\n0,0\nzero,1\n")
    with pytest.raises(RecordingError, match="line 3: expected numbers"):
        read_probe(tmp_path / "e.csv")
    (tmp_path / "f.csv").write_text("0.5,0,0\n")
    with pytest.raises(RecordingError, match="must hold integers"):
        read_probe(tmp_path / "f.csv")
    (tmp_path / "g.yaml").write_text("x: 1\n")
    with pytest.raises(RecordingError, match="unknown probe file type '.yaml'"):
        read_probe(tmp_path / "g.yaml")
    with pytest.raises(FileNotFoundError):
        read_probe(tmp_path / "nope.json")
    np.save(tmp_path / "h.npy", np.zeros((4, 3)))
    with pytest.raises(RecordingError, match=r"expected \[channels, 2\]"):
        read_probe(tmp_path / "h.npy")


def test_geometry_accepts_probe_files_and_objects(tmp_path):
    x = rand16(3000, 4)
    (tmp_path / "p.csv").write_text("0,0\n0,20\n0,40\n0,60\n")
    rec = open_recording(x, fs=3e4, geometry=str(tmp_path / "p.csv"))
    assert rec.geometry[:, 1].tolist() == [0, 20, 40, 60]
    with pytest.raises(RecordingError, match=r"p.csv: 4 channel positions, expected 3"):
        open_recording(x[:, :3], fs=3e4, geometry=tmp_path / "p.csv")

    class Probe:                                    # the attributes of a probeinterface Probe
        contact_positions = np.array([[0.0, 0], [0, 20], [0, 40], [0, 60]])
        device_channel_indices = np.array([1, 0, 3, 2])
        si_units = "um"

    assert open_recording(x, fs=3e4, geometry=Probe()).geometry[:, 1].tolist() == \
        [20, 0, 60, 40]


def test_real_probeinterface_objects(tmp_path):
    pi = pytest.importorskip("probeinterface")
    probe = pi.generate_linear_probe(num_elec=8, ypitch=20)
    wiring = np.array([3, 1, 7, 5, 0, 2, 4, 6])
    probe.set_device_channel_indices(wiring)
    x = rand16(3000, 8)
    rec = open_recording(x, fs=3e4, geometry=probe)
    np.testing.assert_array_equal(rec.geometry[wiring], probe.contact_positions)
    # the same through probeinterface's JSON
    pi.write_probeinterface(tmp_path / "probe.json", probe)
    np.testing.assert_array_equal(read_probe(tmp_path / "probe.json", 8), rec.geometry)
    # a ProbeGroup: two probes, channels 0-3 and 4-7
    a = pi.generate_linear_probe(num_elec=4, ypitch=20)
    b = pi.generate_linear_probe(num_elec=4, ypitch=20)
    b.move([300, 0])
    a.set_device_channel_indices([0, 1, 2, 3])
    b.set_device_channel_indices([7, 6, 5, 4])
    group = pi.ProbeGroup()
    group.add_probe(a)
    group.add_probe(b)
    g = open_recording(x, fs=3e4, geometry=group).geometry
    np.testing.assert_array_equal(g[:4], a.contact_positions)
    np.testing.assert_array_equal(g[4:], b.contact_positions[::-1])
    pi.write_probeinterface(tmp_path / "group.json", group)
    np.testing.assert_array_equal(read_probe(tmp_path / "group.json"), g)
    # an unwired probe: contact order
    c = pi.generate_linear_probe(num_elec=8, ypitch=25)
    assert open_recording(x, fs=3e4, geometry=c).geometry[7, 1] == c.contact_positions[7, 1]


# -- a stored-channel subset of a flat binary -----------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(data=st.data(), stored=st.integers(1, 12), n=st.integers(2, 300))
def test_binary_column_subset_reads_like_numpy(tmp_path_factory, data, stored, n):
    cols = data.draw(st.lists(st.integers(0, stored - 1), min_size=1, max_size=stored,
                              unique=True), label="columns")
    x = rand16(n, stored, seed=stored * 1000 + n)
    path = tmp_path_factory.mktemp("sub") / "x.bin"
    x.tofile(path)
    rec = BinaryRecording(path, stored, 3e4, columns=cols, gain_to_uv=0.5)
    assert rec.n_channels == len(cols) and rec.n_stored == stored
    start = data.draw(st.integers(0, n), label="start")
    stop = data.draw(st.integers(start, n), label="stop")
    pick = data.draw(st.lists(st.integers(0, len(cols) - 1), min_size=1, max_size=6),
                     label="channels")
    want = x[start:stop][:, cols]
    np.testing.assert_array_equal(rec.read(start, stop, scaled=False), want.T)
    np.testing.assert_array_equal(rec.read(start, stop, channels=pick, scaled=False),
                                  want[:, pick].T)
    np.testing.assert_array_equal(rec.read(start, stop, channels=pick),
                                  (want[:, pick].T * np.float32(0.5)).astype(np.float32))
    np.testing.assert_array_equal(rec.read_native(start, stop), want)
    out = np.empty((stop - start, len(cols)), np.int16)
    assert rec.read_native(start, stop, out=out) is out
    np.testing.assert_array_equal(out, want)


def test_binary_columns_are_checked(tmp_path):
    rand16(10, 4).tofile(tmp_path / "x.bin")
    for cols, msg in [([], "non-empty"), ([0, 4], r"must be in \[0, 4\)"),
                      ([1, 1], "listed twice"), ([[0]], "1-D")]:
        with pytest.raises(RecordingError, match=f"columns: .*{msg}"):
            BinaryRecording(tmp_path / "x.bin", 4, 3e4, columns=cols)


def test_a_spikeglx_run_folder_names_its_files(tmp_path):
    run = tmp_path / "run_g0" / "run_g0_imec0"
    run.mkdir(parents=True)
    write_sglx(run, "run_g0_t0.imec0.ap.bin", rand16(20, 385), np1_meta())
    write_sglx(run, "run_g0_t0.imec0.lf.bin", rand16(2, 385), np1_meta(band="lf"))
    with pytest.raises(RecordingError, match=r"no structure.oebin .* SpikeGLX files below it "
                                             r"\(open one of them\):\n  run_g0.run_g0_imec0."
                                             r"run_g0_t0.imec0.ap.bin\n  .*lf.bin"):
        open_recording(tmp_path)


@pytest.mark.parametrize("case", ["np1", "np1_subset", "np2_4shank", "np2_1shank"])
def test_spikeglx_geometry_agrees_with_probeinterface(tmp_path, case):
    """The sites' distances equal those of probeinterface's own reader (its probe catalogue
    and the IMRO table: another route to the same layout; its origin differs by a shift)."""
    pi = pytest.importorskip("probeinterface")
    meta, n = {"np1": (np1_meta(), 385), "np1_subset": (np1_meta(range(0, 384, 7)), 56),
               "np2_4shank": (np2_meta(24), 385), "np2_1shank": (np2_meta(21), 385)}[case]
    path = write_sglx(tmp_path, "x.imec0.ap.bin", rand16(10, n), meta)
    ours = open_recording(path).geometry
    probe = pi.read_spikeglx(path.with_suffix(".meta"))
    theirs = probe.contact_positions[np.argsort(probe.device_channel_indices)]

    def dist(g):
        return np.sqrt(((g[:, None] - g[None]) ** 2).sum(-1))

    assert theirs.shape == ours.shape
    np.testing.assert_allclose(dist(ours), dist(theirs), atol=1e-9)


def test_spikeglx_geometry_map_headers(tmp_path):
    """A one-shank map whose header lacks the shank pitch (written by some tools) reads; a
    several-shank one does not."""
    meta = np1_meta(stored_ids=range(4), geom=("geom",))
    del meta["imDatPrb_pn"]                           # dspk's own reading of the map
    meta["~snsGeomMap"] = "(0,0)" + meta["~snsGeomMap"].split(")", 1)[1]
    path = write_sglx(tmp_path, "g.imec0.ap.bin", rand16(10, 5), meta)
    np.testing.assert_array_equal(open_recording(path).geometry[:, 0], [27, 59, 11, 43])
    meta["~snsGeomMap"] = meta["~snsGeomMap"].replace("(0:59:", "(1:59:")
    path = write_sglx(tmp_path, "h.imec0.ap.bin", rand16(10, 5), meta)
    with pytest.raises(RecordingError, match=r"snsGeomMap: expected a \(part,shanks,shank "
                                             r"pitch,shank width\) header in .*h.imec0.ap.meta"):
        open_recording(path)
