"""Channel metadata kept end to end (issue 46 point 5): a SpikeGLX or Open Ephys recording's
channel ids (SpikeInterface's, ``imec0.ap#AP0``), shanks, probe contact ids and ADC sample
shifts go into every output (HDF5, Kilosort folder, NWB, Zarr) and come back through dspk
(`dspk.open_recording`, `describe`, `read_dspk`) and through the tools' own readers
(SpikeInterface's read_spikeglx, read_openephys, read_nwb and read_zarr, probeinterface,
Kilosort4's load_probe); an NWB written from SpikeGLX starts its session at the meta's
``fileCreateTime``; the bundled sample and such an NWB pass nwbinspector without a critical
issue. The recordings are small (a few thousand samples)."""

import json
import logging
import re
import warnings
from datetime import datetime, timezone
from pathlib import Path

import h5py
import numpy as np
import pytest

import dspk
from dspk.cli import main
from dspk.io import RecordingError
from dspk.io.nwb import input_metadata
from dspk.pipeline import Pipeline, PipelineError
from dspk.pipeline.record import describe

from tests.recordings import np1_meta, rand16, write_sglx
from tests.io.test_probeinterface import SETTINGS, open_ephys

se = pytest.importorskip("spikeinterface.extractors")
si = pytest.importorskip("spikeinterface")
pi = pytest.importorskip("probeinterface")
pynwb = pytest.importorskip("pynwb")

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "sample.nwb"
SGLX = Path(__file__).resolve().parents[1] / "data" / "probeinterface" / "spikeglx"
#: a real 4-shank NP2.0 .meta whose saved electrodes differ between shanks (its fileName:
#: ...meta_test_2_g0_t0.imec0.ap.bin; fileCreateTime 2022-10-25T14:53:42)
FOUR_SHANKS = SGLX / "NP2_4_shanks_save_different_electrodes.imec0.ap.meta"
FORMATS = {"hdf5": "o.h5", "kilosort": "ks", "nwb": "o.nwb", "zarr": "o.zarr"}


def sglx_from(meta, folder, n=2000, seed=0, name=None, edit=None):
    """A SpikeGLX stream around a real .meta: ``n`` random samples, the meta's
    ``fileSizeBytes`` set to match (and ``edit(text)`` applied)."""
    text = meta.read_text(encoding="utf-8", errors="replace")
    saved = int(re.search(r"^nSavedChans=(\d+)", text, re.M).group(1))
    folder.mkdir(parents=True, exist_ok=True)
    stem = name or "run_g0_t0.imec0.ap"
    rand16(n, saved, seed).tofile(folder / f"{stem}.bin")
    text = re.sub(r"fileSizeBytes=\d+", f"fileSizeBytes={2 * n * saved}", text)
    (folder / f"{stem}.meta").write_text(edit(text) if edit else text)
    return folder / f"{stem}.bin"


def read_si(folder, stream_id):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return se.read_spikeglx(folder, stream_id=stream_id)


def si_contact_ids(rec):
    """A SpikeInterface recording's contact ids, in channel order."""
    probe = rec.get_probe()
    return probe.contact_ids[np.argsort(probe.device_channel_indices)].tolist()


def pipeline(**options):
    return Pipeline.from_options(**{"whiten": "none", **options})


def critical(path):
    """nwbinspector's CRITICAL messages and errors on a file (subject checks included)."""
    inspector = pytest.importorskip("nwbinspector")
    return [f"{m.importance.name} {m.check_function_name}: {m.message}"
            for m in inspector.inspect_nwbfile(nwbfile_path=str(path))
            if m.importance.name in ("CRITICAL", "ERROR", "PYNWB_VALIDATION")]


# -- SpikeGLX's channel ids are SpikeInterface's ------------------------------------------------
@pytest.mark.parametrize("meta", ["NP1_saved_only_subset_of_channels", "phase3a.imec.ap",
                                  "catgt", FOUR_SHANKS.stem], ids=str)
def test_spikeglx_channel_ids_are_spikeinterfaces(meta, tmp_path):
    """On real .meta files: the stream from the name SpikeGLX gave the file (imec1 for a file
    now named imec0; a 3A probe's imec.ap; CatGT's tcat), the names from ~snsChanMap."""
    rec = dspk.open_recording(sglx_from(SGLX / f"{meta}.meta", tmp_path, n=10))
    stream = rec.stream_id
    theirs = read_si(tmp_path, stream)
    assert rec.channel_ids.tolist() == theirs.get_channel_ids().tolist()
    assert rec.channel_names == theirs.get_property("channel_name").tolist()
    assert stream == {"NP1_saved_only_subset_of_channels": "imec1.ap",
                      "phase3a.imec.ap": "imec.ap"}.get(meta, "imec0.ap")


def test_spikeglx_lf_subset_and_nidq_channel_ids(tmp_path):
    saved = [0, 3, 5, 8, 100, 200, 300, 383]
    (tmp_path / "lf").mkdir()
    rec = dspk.open_recording(write_sglx(tmp_path / "lf", "run_g0_t0.imec0.lf.bin",
                                         rand16(500, 9), np1_meta(stored_ids=saved, band="lf")))
    assert rec.channel_ids.tolist() == read_si(tmp_path / "lf", "imec0.lf").get_channel_ids(
    ).tolist() == [f"imec0.lf#LF{c}" for c in saved]
    (tmp_path / "ni").mkdir()
    meta = {"typeThis": "nidq", "niSampRate": "25000", "nSavedChans": "5",
            "snsMnMaXaDw": "2,1,1,1", "acqMnMaXaDw": "2,1,1,1", "snsSaveChanSubset": "all",
            "niAiRangeMax": "5", "niAiRangeMin": "-5", "niMaxInt": "32768",
            "niMNGain": "200", "niMAGain": "2", "niXDChans1": "0:7",
            "fileName": "C:/data/run_g0/run_g0_t0.nidq.bin",
            "~snsChanMap": "(2,1,32,1,1)(MN0C0;0:0)(MN0C1;1:1)(MA0C0;2:2)(XA0;3:3)(XD0;4:4)"}
    ni = dspk.open_recording(write_sglx(tmp_path / "ni", "run_g0_t0.nidq.bin",
                                        rand16(500, 5), meta))
    # SpikeInterface keeps the digital word XD0 as a channel; dspk's channels are the analog
    # ones before it
    theirs = read_si(tmp_path / "ni", "nidq").get_channel_ids().tolist()
    assert ni.channel_ids.tolist() == theirs[:4] == ["nidq#MN0C0", "nidq#MN0C1", "nidq#MA0C0",
                                                     "nidq#XA0"]


def test_spikeglx_without_a_channel_map(tmp_path):
    """Older or edited metadata without ~snsChanMap: imec channels named AP/LF and their
    IMRO channel (what SpikeGLX writes there), NI-DAQ channels by index (no ids); without a
    fileName, the stream from this file's name, and from the band where that says none."""
    meta = np1_meta(stored_ids=[2, 7])
    del meta["~snsChanMap"], meta["fileName"]
    path = write_sglx(tmp_path, "renamed.bin", rand16(100, 3), meta)
    assert dspk.open_recording(path).channel_ids.tolist() == ["imec.ap#AP2", "imec.ap#AP7"]
    path = write_sglx(tmp_path, "x_g0_t0.imec3.ap.bin", rand16(100, 3), meta)
    assert dspk.open_recording(path).channel_ids.tolist() == ["imec3.ap#AP2", "imec3.ap#AP7"]
    ni = {"typeThis": "nidq", "niSampRate": "25000", "nSavedChans": "2",
          "snsMnMaXaDw": "0,0,2,0", "snsSaveChanSubset": "all", "niAiRangeMax": "5"}
    rec = dspk.open_recording(write_sglx(tmp_path, "run_g0_t0.nidq.bin", rand16(100, 2), ni))
    assert rec.channel_ids is None and rec.channel_names is None


# -- every output, and back ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def four_shanks(tmp_path_factory):
    """The 4-shank NP2.0 stream (384 channels, 2000 samples), SpikeInterface's reading of it
    and every output of one job on it (no PhaseShift: the shifts are carried)."""
    folder = tmp_path_factory.mktemp("four_shanks")
    path = sglx_from(FOUR_SHANKS, folder / "in")
    rec = dspk.open_recording(path)
    theirs = read_si(folder / "in", "imec0.ap")
    outs = {fmt: pipeline().run(rec, folder / name, format=fmt, progress=False,
                                **({"output_dtype": np.float32} if fmt == "kilosort" else {}))
            for fmt, name in FORMATS.items()}
    return rec, theirs, outs


def expected(theirs):
    """What every output must carry: SpikeInterface's reading of the SpikeGLX stream."""
    return {"channel_ids": theirs.get_channel_ids().tolist(),
            "shank_ids": theirs.get_channel_groups().tolist(),
            "contact_ids": si_contact_ids(theirs),
            "sample_shifts": theirs.get_property("inter_sample_shift").tolist()}


def test_the_input_is_spikeinterfaces(four_shanks):
    rec, theirs, _ = four_shanks
    want = expected(theirs)
    assert len(set(want["shank_ids"])) == 4 and len(set(want["sample_shifts"])) == 16
    assert rec.channel_ids.tolist() == want["channel_ids"]
    assert rec.shank_ids.tolist() == want["shank_ids"]
    assert rec.contact_ids.tolist() == want["contact_ids"]
    np.testing.assert_array_equal(rec.sample_shifts, want["sample_shifts"])


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_describe_and_open_recording_give_the_metadata_back(four_shanks, fmt):
    _, theirs, outs = four_shanks
    want = expected(theirs)
    readers = []
    if fmt != "nwb":                     # an NWB file dspk wrote is read as any NWB file
        readers.append(describe(outs[fmt], fitted=False))
    if fmt in ("hdf5", "nwb"):
        with dspk.open_recording(outs[fmt]) as back:
            readers.append({k: getattr(back, k) for k in want})
    for got in readers:
        assert [str(v) for v in got["channel_ids"]] == want["channel_ids"]
        assert np.asarray(got["shank_ids"]).tolist() == want["shank_ids"]
        assert [str(v) for v in got["contact_ids"]] == want["contact_ids"]
        np.testing.assert_array_equal(got["sample_shifts"], want["sample_shifts"])


def test_read_dspk_gives_spikeinterfaces_metadata(four_shanks):
    from dspk.spikeinterface import read_dspk

    _, theirs, outs = four_shanks
    back = read_dspk(outs["hdf5"])
    assert expected(back) == expected(theirs)
    np.testing.assert_array_equal(back.get_channel_locations(), theirs.get_channel_locations())


def test_spikeinterface_reads_the_zarr_and_nwb_outputs(four_shanks):
    _, theirs, outs = four_shanks
    want = expected(theirs)
    zarr = si.read_zarr(outs["zarr"])
    assert expected(zarr) == want
    nwb = se.read_nwb(str(outs["nwb"]))
    assert nwb.get_channel_ids().tolist() == want["channel_ids"]
    assert nwb.get_channel_groups().tolist() == [f"shank{s}" for s in want["shank_ids"]]
    assert nwb.get_property("contact_id").tolist() == want["contact_ids"]
    assert nwb.get_property("inter_sample_shift").tolist() == want["sample_shifts"]
    np.testing.assert_array_equal(nwb.get_channel_locations(), theirs.get_channel_locations())


def test_the_kilosort_folder_carries_the_metadata(four_shanks):
    """probeinterface reads probe.json's contacts and shanks; SpikeInterface's binary reader
    with that probe sees the channels as read_spikeglx does; dspk.json holds all four."""
    _, theirs, outs = four_shanks
    want = expected(theirs)
    folder = outs["kilosort"]
    about = json.loads((folder / "dspk.json").read_text())
    assert {k: about[k] for k in want} == want
    probe = pi.read_probeinterface(folder / "probe.json").probes[0]
    binary = si.read_binary(folder / "traces.bin", sampling_frequency=about["fs"],
                            dtype=about["dtype"], num_channels=about["n_channels"])
    binary.set_probe(probe, group_mode="by_shank")             # in place (SpikeInterface 0.105)
    assert si_contact_ids(binary) == want["contact_ids"]
    assert binary.get_channel_groups().tolist() == want["shank_ids"]


def test_kilosort4_load_probe_gives_the_shanks(four_shanks):
    kio = pytest.importorskip("kilosort.io", reason="kilosort (with torch) is not installed: "
                                                    "make test-kilosort runs this")
    _, theirs, outs = four_shanks
    for name, first in (("chanMap.json", 0), ("chanMap.mat", 1)):     # MATLAB's: 1-based
        probe = kio.load_probe(outs["kilosort"] / name)
        assert (probe["kcoords"].astype(int) - first).tolist() == \
            expected(theirs)["shank_ids"], name
        np.testing.assert_array_equal(np.c_[probe["xc"], probe["yc"]],
                                      theirs.get_channel_locations())


def test_a_spikeinterface_recording_carries_the_same(four_shanks, tmp_path):
    """SpikeInterface's reading of the stream, given to dspk: the same ids, shanks, contact
    ids (its probe's) and shifts as dspk's own reading, into the output."""
    rec, theirs, _ = four_shanks
    via = dspk.open_recording(theirs)
    for key in ("channel_ids", "shank_ids", "contact_ids", "sample_shifts"):
        np.testing.assert_array_equal(getattr(via, key), getattr(rec, key), err_msg=key)
    about = describe(pipeline().run(via, tmp_path / "si.h5", progress=False), fitted=False)
    got = {k: np.asarray(about[k]).tolist() for k in expected(theirs)}
    assert got == expected(theirs)


def test_the_session_starts_at_filecreatetime(four_shanks):
    _, _, outs = four_shanks
    with pynwb.NWBHDF5IO(str(outs["nwb"]), "r") as io:
        nwb = io.read()
        assert nwb.session_start_time == datetime(2022, 10, 25, 14, 53, 42,
                                                  tzinfo=timezone.utc)
        assert nwb.subject is None                      # SpikeGLX does not say it


# -- what changes the carried metadata ----------------------------------------------------------
def test_a_phase_shift_drops_the_shifts_and_decimation_divides_them(tmp_path):
    """Aligned traces carry no shifts (a reader shifting them again would misalign them:
    SpikeInterface's property is dropped too); decimated by q, the shifts are in the output's
    samples (the input's / q). The ids, shanks and contact ids are carried all the same."""
    path = write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", rand16(6000, 9),
                      np1_meta(stored_ids=range(8)))
    rec = dspk.open_recording(path)
    shifted = pipeline(phase_shift="auto")
    outs = [shifted.run(rec, tmp_path / name, format=fmt, progress=False)
            for fmt, name in (("hdf5", "p.h5"), ("zarr", "p.zarr"), ("nwb", "p.nwb"))]
    with h5py.File(outs[0], "r") as f:
        assert "sample_shifts" not in f and "contact_ids" in f
    about = describe(outs[0], fitted=False)
    assert about["sample_shifts"] is None and about["channel_ids"][0] == "imec0.ap#AP0"
    assert "inter_sample_shift" not in si.read_zarr(outs[1]).get_property_keys()
    assert "inter_sample_shift" not in se.read_nwb(str(outs[2])).get_property_keys()
    from dspk.spikeinterface import read_dspk

    assert "inter_sample_shift" not in read_dspk(outs[0]).get_property_keys()
    out = pipeline(decimate=3).run(rec, tmp_path / "d.h5", progress=False)
    np.testing.assert_allclose(describe(out, fitted=False)["sample_shifts"],
                               rec.sample_shifts / 3)


def test_open_ephys_metadata_into_the_outputs(tmp_path):
    """An Open Ephys Neuropixels stream (its probe from settings.xml): SpikeInterface's
    channel ids, probeinterface's contacts and the shifts into HDF5 and NWB, and back."""
    rec_dir, stream = open_ephys(SETTINGS[0], tmp_path / "in")
    dat = next(rec_dir.glob("continuous/*/continuous.dat"))
    rand16(1000, 384).tofile(dat)
    for name in ("sample_numbers.npy", "timestamps.npy"):
        np.save(dat.parent / name, np.arange(1000))
    rec = dspk.open_recording(tmp_path / "in")
    for fmt, name in (("hdf5", "o.h5"), ("nwb", "o.nwb")):
        out = pipeline().run(rec, tmp_path / name, format=fmt, progress=False)
        with dspk.open_recording(out) as back:
            assert back.channel_ids.tolist() == rec.channel_ids.tolist()
            assert back.channel_ids[0] == "CH0"
            assert back.contact_ids.tolist() == rec.contact_ids.tolist()
            assert back.shank_ids.tolist() == rec.shank_ids.tolist()
            np.testing.assert_array_equal(back.sample_shifts, rec.sample_shifts)


def test_an_open_ephys_session_starts_at_the_recordings_start(tmp_path):
    """Open Ephys: sync_messages.txt's Software Time (ms since 1970, UTC: the GUI 0.6 and
    later) first; without it (or with the 0.5 GUI's count from its own start) the
    experiment's settings.xml <INFO><DATE>, local time marked UTC (neuroconv's choice)."""
    rec_dir, _ = open_ephys(SETTINGS[0], tmp_path / "in")
    assert SETTINGS[0].name.startswith("OE_Neuropix-PXI-NP1")       # <DATE>11 Sep 2025 9:57:24
    dat = next(rec_dir.glob("continuous/*/continuous.dat"))
    rand16(1000, 384).tofile(dat)
    for name in ("sample_numbers.npy", "timestamps.npy"):
        np.save(dat.parent / name, np.arange(1000))

    def start():
        with dspk.open_recording(tmp_path / "in") as rec:
            return input_metadata(rec.files()).get("session_start")

    settings_date = datetime(2025, 9, 11, 9, 57, 24, tzinfo=timezone.utc)
    assert start() == settings_date
    (rec_dir / "sync_messages.txt").write_text(
        "Processor: Neuropix-PXI Id: 100 subProcessor: 0 start time: 137296@30000Hz\n"
        "Software time: 22489364@1000Hz\n")                             # the 0.5 GUI's
    assert start() == settings_date
    (rec_dir / "sync_messages.txt").write_text(
        "Software Time (milliseconds since midnight Jan 1st 1970 UTC): 1757584644500\n"
        "Start Time for Neuropix-PXI (100) - ProbeA @ 30000 Hz: 1197760\n")
    assert start() == datetime(2025, 9, 11, 9, 57, 24, 500000, tzinfo=timezone.utc)
    out = pipeline().run(dspk.open_recording(tmp_path / "in"), tmp_path / "o.nwb",
                         format="nwb", progress=False)
    with pynwb.NWBHDF5IO(str(out), "r") as io:
        assert io.read().session_start_time == \
            datetime(2025, 9, 11, 9, 57, 24, 500000, tzinfo=timezone.utc)


def test_an_input_without_the_metadata_writes_none_of_it(tmp_path):
    """An array (no ids, contacts or shifts): the HDF5 output holds only the channel indices,
    as before; dspk.json says null; the NWB electrodes table has no extra column."""
    rec = dspk.open_recording(rand16(3000, 4), fs=30000.0,
                              geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)])
    out = pipeline().run(rec, tmp_path / "o.h5", progress=False)
    with h5py.File(out, "r") as f:
        assert sorted(f) == ["channel_ids", "fitted", "geometry", "traces"]
    with dspk.open_recording(out) as back:
        assert back.channel_ids.tolist() == [0, 1, 2, 3]
        assert back.contact_ids is None and back.sample_shifts is None
    about = json.loads((pipeline().run(rec, tmp_path / "ks", format="kilosort",
                                       progress=False) / "dspk.json").read_text())
    assert (about["contact_ids"], about["sample_shifts"]) == (None, None)
    nwb = pipeline().run(rec, tmp_path / "o.nwb", format="nwb", progress=False)
    with pynwb.NWBHDF5IO(str(nwb), "r") as io:
        assert sorted(io.read().electrodes.colnames) == ["channel_name", "group",
                                                         "group_name", "location", "rel_x",
                                                         "rel_y"]


def test_a_damaged_output_names_what_is_wrong(tmp_path):
    rec = dspk.open_recording(rand16(3000, 4), fs=30000.0)
    out = pipeline().run(rec, tmp_path / "o.h5", progress=False)
    with h5py.File(out, "r+") as f:
        f["contact_ids"] = np.array([b"e0", b"e1"])              # 2 for 4 channels
    for read in (dspk.open_recording, describe):
        with pytest.raises(RecordingError, match=r"/contact_ids must hold one value per "
                                                 r"channel \(4\), got shape \(2,\)"):
            read(out)


# -- the session's start and the subject ----------------------------------------------------------
def test_the_session_start_from_the_meta_and_its_fallback(tmp_path, caplog):
    """fileCreateTime (CatGT's fileCreateTime_original first), marked UTC; a meta without
    it, with an anonymised 0000-00-00 date or a garbled one gives no start (the NWB then
    starts when it is written) and a warning naming the meta."""
    meta = tmp_path / "a.imec0.ap.meta"

    def start(**tags):
        meta.write_text("".join(f"{k}={v}\n" for k, v in {"typeThis": "imec", **tags}.items()))
        return input_metadata([tmp_path / "a.imec0.ap.bin", meta]).get("session_start")

    assert start(fileCreateTime="2024-03-01T10:00:00") == \
        datetime(2024, 3, 1, 10, tzinfo=timezone.utc)
    assert start(fileCreateTime="2023-06-05T17:20:39",
                 fileCreateTime_original="2023-04-27T15:21:38") == \
        datetime(2023, 4, 27, 15, 21, 38, tzinfo=timezone.utc)
    caplog.set_level(logging.WARNING, logger="dspk.io")
    for tags in ({}, {"fileCreateTime": ""}, {"fileCreateTime": "0000-00-00T00:00:00"},
                 {"fileCreateTime": "yesterday"}):
        caplog.clear()
        assert start(**tags) is None
        assert f"{meta}: fileCreateTime" in caplog.text
        assert "session_start_time is the time it is written" in caplog.text
    # an NWB from such a recording: the processing time
    data = np1_meta(stored_ids=range(4))
    del data["fileCreateTime"]
    before = datetime.now(timezone.utc).replace(microsecond=0)
    out = pipeline().run(write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", rand16(3000, 5), data),
                         tmp_path / "o.nwb", format="nwb", progress=False)
    with pynwb.NWBHDF5IO(str(out), "r") as io:
        assert io.read().session_start_time >= before


def test_nwbinspector_finds_nothing_critical(tmp_path):
    """The bundled sample (its subject has a species and an age) and an NWB written from
    SpikeGLX with the subject given: no critical issue. Without a subject, the only one is
    the missing subject (dspk does not invent it)."""
    assert critical(SAMPLE) == []
    with pynwb.NWBHDF5IO(str(SAMPLE), "r") as io:
        subject = io.read().subject
        assert (subject.species, subject.age) == ("Mus musculus", "P90D")
    path = write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", rand16(3000, 9),
                      np1_meta(stored_ids=range(8)))
    out = pipeline().run(path, tmp_path / "o.nwb", format="nwb", progress=False,
                         subject={"subject_id": "m1", "species": "Mus musculus",
                                  "age": "P90D", "sex": "F"})
    assert critical(out) == []
    bare = pipeline().run(path, tmp_path / "bare.nwb", format="nwb", progress=False)
    assert [p.split(":")[0] for p in critical(bare)] == ["CRITICAL check_subject_exists"]


def test_the_subject_given_and_refused(tmp_path, capsys):
    rec = dspk.open_recording(SAMPLE)
    part = dspk.io.SubsetRecording(rec, 0, 3000, np.arange(4))
    out = pipeline().run(part, tmp_path / "o.nwb", format="nwb", progress=False,
                         subject={"subject_id": "m7", "date_of_birth": "2026-01-02"})
    with pynwb.NWBHDF5IO(str(out), "r") as io:
        s = io.read().subject                    # given fields win, the input's others kept
        assert (s.subject_id, s.species, s.age) == ("m7", "Mus musculus", "P90D")
        assert s.date_of_birth == datetime(2026, 1, 2, tzinfo=timezone.utc)
    for subject, message in [({"specie": "x"}, "subject: 'specie' is not a field of an NWB "
                                               "Subject"),
                             ({"date_of_birth": "soon"}, "date_of_birth: expected an ISO 8601"),
                             ("Mus musculus", "expected a dict of NWB Subject fields")]:
        with pytest.raises(PipelineError, match=message):
            pipeline().run(part, tmp_path / "x.nwb", format="nwb", progress=False,
                           subject=subject)
    assert not (tmp_path / "x.nwb").exists()
    assert main(["preprocess", str(SAMPLE), str(tmp_path / "c.nwb"), "--format", "nwb",
                 "--time", "0", "0.1", "--channels", "0-3", "--quiet", "--subject",
                 "species=Homo sapiens", "--subject", "age=P30Y"]) == 0
    with pynwb.NWBHDF5IO(str(tmp_path / "c.nwb"), "r") as io:
        assert (io.read().subject.species, io.read().subject.age) == ("Homo sapiens", "P30Y")
    capsys.readouterr()
    assert main(["preprocess", str(SAMPLE), str(tmp_path / "c.h5"), "--subject", "age=P1D",
                 "--quiet"]) == 2
    assert "--subject: only --format nwb stores the subject" in capsys.readouterr().err
    assert main(["preprocess", str(SAMPLE), str(tmp_path / "d.nwb"), "--format", "nwb",
                 "--subject", "P1D", "--quiet"]) == 2
    assert "--subject: expected KEY=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "c.h5").exists() and not (tmp_path / "d.nwb").exists()


# -- dspk info -----------------------------------------------------------------------------------
def test_dspk_info_describes_a_zarr_folder(four_shanks, capsys):
    _, _, outs = four_shanks
    capsys.readouterr()
    assert main(["info", str(outs["zarr"])]) == 0
    said = capsys.readouterr().out
    assert f"{outs['zarr']}: a Zarr folder (SpikeInterface's read_zarr) written by dspk" in said
    assert "traces_seg0: 384 channels x 2000 samples float32" in said
    assert "values: raw x 1, in uV" in said
    assert "written by dspk: HighPass -> Reference" in said
    assert "probe (probegroup): 384 channels" in said and "4 shank(s)" in said
    assert "channels: imec0.ap#AP0 .. imec0.ap#AP383; contacts s3e576 .. s1e575" in said
    assert "ADC sample shifts (inter_sample_shift) kept" in said
