"""Recordings' ADC sample shifts (`Recording.sample_shifts`): SpikeGLX imec streams against
SpikeInterface's SpikeGLX reader (its ``inter_sample_shift`` property) on the same .bin/.meta,
saved subsets against probeinterface's reader with SpikeInterface's shift rule, the
multiplexing rule against probeinterface's ProbeTable data; None where the format does not
say; SpikeInterface recordings carry theirs."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspk.io import RecordingError, open_recording
from dspk.io.adc import NP1_PARTS, NP2_PARTS, neuropixels_sample_shifts

from tests.recordings import np1_meta, np2_meta, rand16, write_sglx


def np2_full_meta(ptype):
    """np2_meta with the tags SpikeInterface's (neo's) reader needs besides the probe's."""
    meta = np2_meta(ptype)
    for key, value in np1_meta().items():
        if key in ("fileName", "firstSample", "appVersion", "fileCreateTime", "gateMode",
                   "trigMode", "typeImEnabled", "imTrgSource", "syncImInputSlot", "userNotes",
                   "imDatPrb_sn", "imDatApi", "imDatBs_fw", "fileSHA1", "imCalibrated"):
            meta.setdefault(key, value)
    meta["~snsChanMap"] = "(384,0,1)" + "".join(f"(AP{c};{c}:{c})" for c in range(384)) + \
        "(SY0;384:384)"
    return meta


def si_shifts(folder, stream):
    """SpikeInterface's SpikeGLX reader's inter_sample_shift for a stream of a run folder."""
    extractors = pytest.importorskip("spikeinterface.extractors",
                                     reason="the comparison runs against SpikeInterface")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = extractors.read_spikeglx(folder, stream_id=stream)
    return rec.get_property("inter_sample_shift")


def pi_shifts(meta_path):
    """What SpikeInterface's reader computes: probeinterface's probe of the .meta, then its
    get_neuropixels_sample_shifts_from_probe."""
    pi = pytest.importorskip("probeinterface", reason="the comparison runs against it")
    utils = pytest.importorskip("spikeinterface.extractors.neuropixels_utils",
                                reason="the comparison runs against SpikeInterface")
    probe = pi.read_spikeglx(meta_path)
    shifts = utils.get_neuropixels_sample_shifts_from_probe(probe)
    return shifts[np.argsort(probe.device_channel_indices)]


@pytest.mark.parametrize("case", ["np1", "np1_subset", "np2_1shank", "np2_4shank"])
def test_spikeglx_shifts_equal_spikeinterfaces_reader(tmp_path, case):
    meta, n = {"np1": (np1_meta(), 385),
               "np1_subset": (np1_meta(stored_ids=range(3, 384, 7)), 56),
               "np2_1shank": (np2_full_meta(21), 385),
               "np2_4shank": (np2_full_meta(24), 385)}[case]
    folder = tmp_path / "run_g0" / "run_g0_imec0"
    folder.mkdir(parents=True)
    path = write_sglx(folder, "run_g0_t0.imec0.ap.bin", rand16(100, n), meta)
    ours = open_recording(path).sample_shifts
    theirs = si_shifts(folder, "imec0.ap")
    assert theirs is not None and ours is not None
    np.testing.assert_array_equal(ours, theirs)
    cycle = 16 if case.startswith("np2") else 13
    assert set(np.round(ours * cycle, 9)) <= set(range(cycle - (cycle == 13)))


def test_spikeglx_lf_stream_shifts_equal_spikeinterfaces_reader(tmp_path):
    folder = tmp_path / "run_g0" / "run_g0_imec0"
    folder.mkdir(parents=True)
    ids = list(range(0, 384, 3))
    write_sglx(folder, "run_g0_t0.imec0.ap.bin", rand16(120, len(ids) + 1),
               np1_meta(stored_ids=ids))
    lf = write_sglx(folder, "run_g0_t0.imec0.lf.bin", rand16(10, len(ids) + 1),
                    np1_meta(stored_ids=ids, band="lf"))
    ours = open_recording(lf).sample_shifts
    np.testing.assert_array_equal(ours, si_shifts(folder, "imec0.lf"))
    np.testing.assert_array_equal(ours, (np.array(ids) % 24 // 2) / 13)


@settings(max_examples=20, deadline=None)
@given(ids=st.lists(st.integers(0, 383), min_size=1, max_size=60, unique=True).map(sorted),
       np2=st.booleans())
def test_random_saved_subsets_equal_probeinterface_with_spikeinterfaces_rule(
        tmp_path_factory, ids, np2):
    folder = tmp_path_factory.mktemp("sglx")
    if np2:
        meta = np2_meta(21)
        meta["snsSaveChanSubset"] = ",".join(str(c) for c in ids + [384])
        meta["nSavedChans"] = str(len(ids) + 1)
        meta["snsApLfSy"] = f"{len(ids)},0,1"
        meta["~snsShankMap"] = "(1,2,640)" + "".join(f"(0:{c % 2}:{c // 2}:1)" for c in ids)
    else:
        meta = np1_meta(stored_ids=ids)
    path = write_sglx(folder, "r_g0_t0.imec0.ap.bin", rand16(8, len(ids) + 1), meta)
    ours = open_recording(path).sample_shifts
    np.testing.assert_array_equal(ours, pi_shifts(path.with_suffix(".meta")))


def test_the_multiplexing_rule_is_probeinterfaces_probetable():
    """For every part whose ProbeTable mux table dspk uses, the table's sampling order of
    every readout channel over its cycle is dspk's shift; the parts left out are those with
    the irregular 128-channel table."""
    pi = pytest.importorskip("probeinterface", reason="its ProbeTable data are the reference")
    data = json.loads((Path(pi.__file__).parent / "resources" /
                       "neuropixels_probe_features.json").read_text())
    known = NP1_PARTS | NP2_PARTS
    for part, spec in data["neuropixels_probes"].items():
        table = data["z_mux_tables"].get(spec["mux_table_format_type"])
        if part not in known:
            assert spec["mux_table_format_type"] == "mux_np1200", part
            assert neuropixels_sample_shifts([0], part) is None
            continue
        head, *slots = table.split(")(")
        _, per_adc = (int(v) for v in head.strip("(").split(","))
        order = {}
        for k, slot in enumerate(slots):
            for ch in slot.strip("()").split():
                order[int(ch)] = k
        readout = np.array(sorted(order))
        cycle = int(per_adc * (1 + float(spec["lf_sample_frequency_hz"]) /
                               float(spec["ap_sample_frequency_hz"])))
        want = np.array([order[c] for c in readout]) / cycle
        np.testing.assert_array_equal(neuropixels_sample_shifts(readout, part), want, part)


def test_probe_type_without_a_part_number(tmp_path):
    meta = np1_meta()
    del meta["imDatPrb_pn"]
    path = write_sglx(tmp_path, "a_g0_t0.imec0.ap.bin", rand16(10, 385), meta)
    np.testing.assert_array_equal(open_recording(path).sample_shifts,
                                  (np.arange(384) % 24 // 2) / 13)
    meta = np2_meta(24)
    del meta["imDatPrb_pn"]
    path = write_sglx(tmp_path, "b_g0_t0.imec0.ap.bin", rand16(10, 385), meta)
    np.testing.assert_array_equal(open_recording(path).sample_shifts,
                                  (np.arange(384) % 32 // 2) / 16)
    meta = np1_meta()                          # 3A: imProbeOpt, multiplexed as NP1.0
    del meta["imDatPrb_pn"], meta["imDatPrb_type"]
    meta["imProbeOpt"] = "3"
    path = write_sglx(tmp_path, "c_g0_t0.imec.ap.bin", rand16(10, 385), meta)
    np.testing.assert_array_equal(open_recording(path).sample_shifts,
                                  (np.arange(384) % 24 // 2) / 13)


def test_no_shifts_where_the_format_does_not_say(tmp_path):
    meta = np1_meta()
    meta["imDatPrb_pn"] = "NP1200"                      # irregular multiplexing: not known
    path = write_sglx(tmp_path, "a_g0_t0.imec0.ap.bin", rand16(10, 385), meta)
    assert open_recording(path).sample_shifts is None
    meta["imDatPrb_pn"] = "NPXYZ"
    path = write_sglx(tmp_path, "b_g0_t0.imec0.ap.bin", rand16(10, 385), meta)
    assert open_recording(path).sample_shifts is None
    meta = np1_meta(geom=("geom",))
    del meta["imDatPrb_pn"]
    meta["imDatPrb_type"] = "x1"                 # unreadable; the gains given instead
    path = write_sglx(tmp_path, "d_g0_t0.imec0.ap.bin", rand16(10, 385), meta)
    assert open_recording(path, gain_to_uv=1.0).sample_shifts is None
    nidq = {"typeThis": "nidq", "niSampRate": "25000", "nSavedChans": "2",
            "snsMnMaXaDw": "0,0,2,0", "snsSaveChanSubset": "all", "niAiRangeMax": "5"}
    path = write_sglx(tmp_path, "c_g0_t0.nidq.bin", rand16(10, 2), nidq)
    assert open_recording(path).sample_shifts is None
    assert open_recording(np.zeros((100, 3), np.int16), fs=3e4).sample_shifts is None
    rand16(10, 4).tofile(tmp_path / "flat.bin")
    assert open_recording(tmp_path / "flat.bin", n_channels=4, fs=3e4).sample_shifts is None


def test_a_spikeinterface_recording_carries_its_shifts():
    core = pytest.importorskip("spikeinterface.core", reason="a SpikeInterface recording")
    rec = core.NumpyRecording(np.zeros((100, 3), np.float32), 30000.0)
    assert open_recording(rec).sample_shifts is None
    rec.set_property("inter_sample_shift", np.array([0.0, 1 / 13, 2 / 13]))
    ours = open_recording(rec)
    np.testing.assert_array_equal(ours.sample_shifts, [0.0, 1 / 13, 2 / 13])
    np.testing.assert_array_equal(ours.reopen().sample_shifts, ours.sample_shifts)
    rec.set_property("inter_sample_shift", np.array([0.0, np.nan, 2 / 13]))
    with pytest.raises(RecordingError, match="inter_sample_shift: .* one finite shift per "
                                             "channel"):
        open_recording(rec)


def test_shifts_survive_reopening(tmp_path):
    path = write_sglx(tmp_path, "a_g0_t0.imec0.ap.bin", rand16(10, 385), np1_meta())
    rec = open_recording(path)
    np.testing.assert_array_equal(rec.spec().open().sample_shifts, rec.sample_shifts)
    np.testing.assert_array_equal(rec.reopen().sample_shifts, rec.sample_shifts)


def test_an_hdf5_file_carries_its_shifts_and_shanks(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "np1.h5"
    shifts, shanks = np.arange(4) / 13, np.array([0, 0, 1, 1])
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", data=rand16(100, 4))
        d.attrs["fs"] = 30000.0
        d.attrs["sample_shifts"] = shifts
        d.attrs["shank_ids"] = shanks
    rec = open_recording(path)
    np.testing.assert_array_equal(rec.sample_shifts, shifts)
    np.testing.assert_array_equal(rec.shank_ids, shanks)
    assert rec.shank_ids.dtype == np.int64
    np.testing.assert_array_equal(rec.reopen().sample_shifts, shifts)
    rec.close()
    for key, bad, why in [("sample_shifts", np.array([0.0, np.nan, 0.1, 0.2]), "finite"),
                          ("sample_shifts", np.zeros(3), "one finite number per channel"),
                          ("shank_ids", np.array([0, 0.5, 1, 1]), "whole numbers")]:
        with h5py.File(path, "a") as f:
            f["traces"].attrs[key] = bad
        with pytest.raises(RecordingError, match=f"{key}.*{why}"):
            open_recording(path)
        with h5py.File(path, "a") as f:
            f["traces"].attrs[key] = shifts if key == "sample_shifts" else shanks
