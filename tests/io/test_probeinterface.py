"""SpikeGLX and Open Ephys probes read through probeinterface: on probeinterface's own test
metadata (tests/data/probeinterface), dspk's geometry, shanks and contact ids are those
probeinterface gives, and its channel order, gains, groups and sample shifts those of
SpikeInterface; an Open Ephys recording whose settings hold its probe needs no probe file."""

import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

import dspk
from dspk.cli import main
from dspk.io.neuropixels import openephys_settings
from dspk.io.spikeglx import SpikeGLXRecording

from tests.recordings import oe_stream, write_oe

pi = pytest.importorskip("probeinterface")

DATA = Path(__file__).resolve().parents[1] / "data" / "probeinterface"
METAS = sorted((DATA / "spikeglx").glob("*.meta"))
SETTINGS = sorted((DATA / "openephys").glob("*.settings.xml"))
#: the Open Ephys recordings of the settings files: (Record Node, stream, channel names)
OE_STREAMS = {
    "OE_Neuropix-PXI-NP1-binary": ("Record Node 101", "Neuropix-PXI-100.ProbeA",
                                   [f"CH{i}" for i in range(384)]),
    "OE_Neuropix-PXI-NP2-multishank-binary": ("Record Node 109", "Neuropix-PXI-103.ProbeA",
                                              [f"CH{i + 1}" for i in range(384)] +
                                              ["CH_SYNC"]),
    "OE_OneBox-NP2014-binary": ("Record Node 101", "OneBox-111.ProbeA",
                                [f"CH{i}" for i in range(384)] + ["CH_SYNC"]),
}


def spikeglx(meta, folder, n=10):
    """A SpikeGLX stream around probeinterface's .meta: ``n`` samples of zeros, the meta's
    ``fileSizeBytes`` set to match."""
    text = meta.read_text(encoding="utf-8", errors="replace")
    saved = int(re.search(r"^nSavedChans=(\d+)", text, re.M).group(1))
    stem = "run_g0_t0.imec.ap" if "imProbeOpt" in text else "run_g0_t0.imec0.ap"
    folder.mkdir(parents=True, exist_ok=True)
    np.zeros((n, saved), np.int16).tofile(folder / f"{stem}.bin")
    (folder / f"{stem}.meta").write_text(re.sub(r"fileSizeBytes=\d+",
                                                f"fileSizeBytes={2 * n * saved}", text))
    return folder / f"{stem}.bin"


def wired(probe):
    """probeinterface's probe, row i for device channel i."""
    order = np.argsort(probe.device_channel_indices)
    shanks = np.zeros(len(order), int) if probe.shank_ids is None else \
        np.array([int(s) if s != "" else 0 for s in probe.shank_ids[order]])
    return probe.contact_positions[order], shanks, probe.contact_ids[order]


def test_the_metadata_are_probeinterfaces_test_files():
    assert len(METAS) == 19 and len(SETTINGS) == 3
    assert "MIT License" in (DATA / "LICENSE").read_text()


@pytest.mark.parametrize("meta", METAS, ids=lambda p: p.stem)
def test_spikeglx_geometry_shanks_and_contacts_are_probeinterfaces(meta, tmp_path):
    rec = dspk.open_recording(spikeglx(meta, tmp_path))
    geometry, shanks, contacts = wired(pi.read_spikeglx(meta))
    assert isinstance(rec, SpikeGLXRecording) and rec.n_channels == len(geometry)
    np.testing.assert_array_equal(rec.geometry, geometry)
    assert rec.shank_ids.tolist() == shanks.tolist()
    assert rec.contact_ids.tolist() == contacts.tolist()


def test_the_probes_dspks_own_tables_got_wrong(tmp_path):
    # NP-Ultra (NP1100): no layout in dspk's tables, probeinterface knows it (6 µm pitch)
    ultra = dspk.open_recording(spikeglx(DATA / "spikeglx" / "NP-Ultra.meta", tmp_path / "u"))
    assert ultra.geometry is not None and sorted(set(np.diff(
        np.unique(ultra.geometry[:, 0])).round(6))) == [6.0]
    # NP1015 with imDatPrb_type=0: two aligned columns, not NP1.0's staggered four
    nhp = dspk.open_recording(spikeglx(
        DATA / "spikeglx" / "non_human_primate_short_linear_probe_type_0.meta", tmp_path / "n"))
    assert len(np.unique(nhp.geometry[:, 0])) == 2


@pytest.mark.parametrize("name", ["NP-Ultra", "NP2020_sample_g0_t0.imec0.ap",
                                  "NP2_2013_subset_channels.imec0.ap",
                                  "NP2_4_shanks.imec0.ap", "Noise_g0_t0.imec0.ap",
                                  "non_human_primate_short_linear_probe_type_0"])
def test_spikeglx_matches_spikeinterface(name, tmp_path):
    se = pytest.importorskip("spikeinterface.extractors")
    path = spikeglx(DATA / "spikeglx" / f"{name}.meta", tmp_path)
    rec = dspk.open_recording(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        si = se.read_spikeglx(tmp_path, stream_id="imec0.ap")
    assert si.get_num_channels() == rec.n_channels
    np.testing.assert_array_equal(si.get_channel_locations(), rec.geometry)
    np.testing.assert_allclose(si.get_channel_gains(), rec.gain_to_uv, rtol=1e-12)
    np.testing.assert_array_equal(si.get_property("group"), rec.shank_ids)
    np.testing.assert_allclose(si.get_property("inter_sample_shift"), rec.sample_shifts)


def open_ephys(settings, root):
    """The recording folder of probeinterface's settings file: its stream (10 samples of
    zeros), in the GUI's layout with the settings beside it."""
    node, stream, names = OE_STREAMS[settings.name.split(".settings")[0]]
    rec_dir = write_oe(root, [oe_stream(stream, len(names), names=names)],
                       [np.zeros((10, len(names)), np.int16)])
    if node != "Record Node 101":
        rec_dir = Path(shutil.move(str(root / "Record Node 101"), str(root / node))) / \
            "experiment1" / "recording1"
    (root / node / "settings.xml").write_bytes(settings.read_bytes())
    return rec_dir, stream


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda p: p.name.split(".")[0])
def test_open_ephys_probe_from_the_settings(settings, tmp_path):
    rec_dir, stream = open_ephys(settings, tmp_path)
    rec = dspk.open_recording(tmp_path)
    assert openephys_settings(str(rec_dir / "structure.oebin")) == \
        str(rec_dir.parents[1] / "settings.xml")
    probe = pi.read_openephys_neuropixels(rec_dir.parents[1] / "settings.xml",
                                          stream_name=stream)
    geometry, shanks, contacts = wired(probe)
    assert rec.n_channels == 384 and "CH_SYNC" not in rec.channel_names   # the sync word
    np.testing.assert_array_equal(rec.geometry, geometry)
    assert rec.shank_ids.tolist() == shanks.tolist()
    assert rec.contact_ids.tolist() == contacts.tolist()
    assert rec.channel_ids.tolist() == rec.channel_names


def test_open_ephys_matches_spikeinterface(tmp_path):
    se = pytest.importorskip("spikeinterface.extractors")
    settings = DATA / "openephys" / "OE_Neuropix-PXI-NP2-multishank-binary.settings.xml"
    rec_dir, stream = open_ephys(settings, tmp_path)
    (rec_dir / "sync_messages.txt").write_text("Software Time: 0\n")
    rec = dspk.open_recording(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        si = se.read_openephys(tmp_path, stream_name=f"Record Node 109#{stream}")
    assert list(si.get_channel_ids()) == rec.channel_ids.tolist()
    np.testing.assert_array_equal(si.get_channel_locations(), rec.geometry)
    np.testing.assert_allclose(si.get_channel_gains(), rec.gain_to_uv, rtol=1e-12)
    np.testing.assert_array_equal(si.get_property("group"), rec.shank_ids)
    np.testing.assert_array_equal(si.get_property("inter_sample_shift"), rec.sample_shifts)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda p: p.name.split(".")[0])
def test_open_ephys_sample_shifts_are_spikeinterfaces_rule(settings, tmp_path):
    """Each channel's ADC shift from the settings' sampling order, as SpikeInterface's
    readers compute it (its function on probeinterface's probe), in the recording's order."""
    nu = pytest.importorskip("spikeinterface.extractors.neuropixels_utils")
    rec_dir, stream = open_ephys(settings, tmp_path)
    rec = dspk.open_recording(tmp_path)
    probe = pi.read_openephys_neuropixels(rec_dir.parents[1] / "settings.xml",
                                          stream_name=stream)
    want = nu.get_neuropixels_sample_shifts_from_probe(probe)[
        np.argsort(probe.device_channel_indices)]
    np.testing.assert_array_equal(rec.sample_shifts, want)
    assert 0 <= rec.sample_shifts.min() and rec.sample_shifts.max() < 1
    assert len(np.unique(rec.sample_shifts)) in (13 - 1, 16)   # NP1.0: 12 of 13 slots used
    np.testing.assert_array_equal(rec.reopen().sample_shifts, rec.sample_shifts)


def test_open_ephys_without_its_settings_has_no_geometry(tmp_path):
    rec_dir, _ = open_ephys(SETTINGS[0], tmp_path)
    (rec_dir.parents[1] / "settings.xml").unlink()
    rec = dspk.open_recording(tmp_path)
    assert rec.geometry is None and rec.shank_ids is None and rec.contact_ids is None
    # the second experiment's settings are settings_2.xml: experiment1's are not used
    (rec_dir.parents[1] / "settings_2.xml").write_bytes(SETTINGS[0].read_bytes())
    assert dspk.open_recording(tmp_path).geometry is None


def test_open_ephys_preprocess_needs_no_probe_file(tmp_path, capsys):
    rec_dir, _ = open_ephys(SETTINGS[0], tmp_path)
    rng = np.random.default_rng(0)
    dat = next(rec_dir.glob("continuous/*/continuous.dat"))
    x = (rng.standard_normal((6000, 384)) * 20).astype(np.int16)
    x.tofile(dat)
    for name in ("sample_numbers.npy", "timestamps.npy"):
        np.save(dat.parent / name, np.arange(6000))
    out = tmp_path / "ks"
    assert main(["preprocess", str(tmp_path), str(out), "--format", "kilosort",
                 "--neighbors", "4", "--quiet"]) == 0
    about = json.loads((out / "dspk.json").read_text())
    assert about["channel_ids"][:2] == ["CH0", "CH1"] and about["n_channels"] == 384
    probe = json.loads((out / "probe.json").read_text())["probes"][0]
    assert probe["contact_ids"][:2] == ["s0e0", "s0e1"]
