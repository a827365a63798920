"""The writers behind the Kilosort folder and the NWB output (`dspk.io.kilosort`,
`dspk.io.nwb`) on their own: what they write, and every argument they refuse, named."""

import json
import os

import numpy as np
import pytest

from dspk.io import RecordingError
from dspk.io.kilosort import (kilosort_probe, write_chanmap_mat, write_kilosort_probe,
                              write_phy_params, write_probeinterface)
from dspk.io.nwb import create_processed_series, input_metadata

GEOMETRY = np.c_[np.zeros(4), 20.0 * np.arange(4)]


def test_kilosort_probe_values():
    probe = kilosort_probe(GEOMETRY, shank_ids=np.array([0, 0, 1, 1], np.int32))
    assert probe == {"chanMap": [0, 1, 2, 3], "xc": [0.0] * 4, "yc": [0.0, 20.0, 40.0, 60.0],
                     "kcoords": [0.0, 0.0, 1.0, 1.0], "n_chan": 4}


@pytest.mark.parametrize("geometry, shanks, message", [
    (np.zeros((4, 3)), None, r"geometry: expected \[channels, 2\] positions in µm"),
    (None, None, r"geometry: expected \[channels, 2\] positions in µm, got None"),
    (np.full((2, 2), np.nan), None, "geometry: positions must be finite"),
    (GEOMETRY, [0, 1], r"shank_ids: expected 4 integers >= 0"),
    (GEOMETRY, [0.0, 0.0, 1.0, 1.0], r"shank_ids: expected 4 integers >= 0"),
    (GEOMETRY, [0, 0, -1, 1], r"shank_ids: expected 4 integers >= 0"),
])
def test_kilosort_probe_refuses(geometry, shanks, message):
    with pytest.raises(RecordingError, match=message):
        kilosort_probe(geometry, shanks)


def test_probe_files_refuse_what_their_readers_would_not_read(tmp_path):
    with pytest.raises(RecordingError, match="Kilosort4 reads a JSON probe only from a file "
                                             "named \\*.json"):
        write_kilosort_probe(tmp_path / "chanMap.txt", GEOMETRY)
    with pytest.raises(RecordingError, match="contact_ids: expected 4 ids"):
        write_probeinterface(tmp_path / "probe.json", GEOMETRY, contact_ids=["a", "b"])
    with pytest.raises(RecordingError, match="geometry: positions must be finite"):
        write_chanmap_mat(tmp_path / "chanMap.mat", np.full((2, 2), np.inf))
    assert os.listdir(tmp_path) == []


def test_probeinterface_json_carries_shanks_and_contact_ids(tmp_path):
    path = write_probeinterface(tmp_path / "probe.json", GEOMETRY, [0, 0, 1, 1],
                                contact_ids=["e0", "e1", "s1e0", "s1e1"])
    probe = json.loads(path.read_text())["probes"][0]
    assert probe["shank_ids"] == ["0", "0", "1", "1"]
    assert probe["contact_ids"] == ["e0", "e1", "s1e0", "s1e1"]
    assert probe["device_channel_indices"] == [0, 1, 2, 3] and probe["si_units"] == "um"


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype="float64"), "dtype: expected one of int16, uint16, int32, float32"),
    (dict(n_channels=0), "n_channels: expected at least 1 channel, got 0"),
    (dict(fs=0.0), "fs: expected a positive sampling rate in Hz, got 0.0"),
    (dict(offset=-1), "offset: expected a byte offset >= 0, got -1"),
])
def test_phy_params_refuse(tmp_path, kwargs, message):
    args = {**dict(dat_path="traces.bin", n_channels=4, dtype="int16", fs=30000.0), **kwargs}
    with pytest.raises(RecordingError, match=message):
        write_phy_params(tmp_path / "params.py", **args)
    assert not (tmp_path / "params.py").exists()


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype=np.float64), "dtype: expected float32 or int16 samples, got float64"),
    (dict(channel_ids=None, geometry=None), "channel_ids: give the channel ids or the "
                                            "geometry"),
    (dict(n_samples=0), "n_samples, channel_ids: expected at least one sample and one"),
    (dict(fs=-1.0), "fs: expected a positive sampling rate in Hz, got -1.0"),
    (dict(conversion=0.0), "conversion: expected positive volts per unit, got 0.0"),
    (dict(geometry=np.zeros((3, 2))), r"geometry: expected \[4, 2\] positions in µm, got "
                                      r"shape \(3, 2\)"),
    (dict(shank_ids=[0, 1]), "shank_ids: expected 4 integers"),
])
def test_nwb_series_refuses(tmp_path, kwargs, message):
    args = dict(n_samples=100, fs=30000.0, dtype=np.float32, conversion=1e-6,
                description="d", filtering="f", channel_ids=["a", "b", "c", "d"])
    with pytest.raises(RecordingError, match=message):
        create_processed_series(tmp_path / "x.nwb", **{**args, **kwargs})
    assert os.listdir(tmp_path) == []


def test_nwb_series_without_geometry_has_no_positions(tmp_path):
    pynwb = pytest.importorskip("pynwb")
    path = tmp_path / "x.nwb"
    create_processed_series(path, n_samples=100, fs=30000.0, dtype=np.int16,
                            conversion=1e-7, description="d", filtering="f",
                            channel_ids=[3, 5])
    with pynwb.NWBHDF5IO(str(path), "r") as io:
        table = io.read().electrodes.to_dataframe()
    assert "rel_x" not in table and table["channel_name"].tolist() == ["3", "5"]
    assert input_metadata([path])["session_start"].tzinfo is not None
    assert "subject" not in input_metadata([path])
    assert input_metadata([tmp_path / "none.h5"]) == {}
