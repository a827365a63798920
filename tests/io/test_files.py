"""Recording.files(): every file on disk that belongs to a recording, per format, the same after
spec().open() and reopen() (the class is rebuilt in workers): what an output must never be."""

import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from dspk.io import HDF5Recording, open_recording

from tests.recordings import TinySIRecording, neuropixels_oe, np1_meta, rand16, write_sglx

DATA = str(Path(__file__).resolve().parents[2] / "data")


def same_after_reopening(rec):
    """files() of the recording, checked equal on its spec().open() and reopen()."""
    files = rec.files()
    with rec.spec().open() as again:
        assert again.files() == files
    with rec.reopen() as again:
        assert again.files() == files
    return files


def test_in_memory_recordings_hold_no_file():
    rec = open_recording(np.zeros((3000, 4), np.int16), fs=3e4)
    assert same_after_reopening(rec) == ()

    assert open_recording(TinySIRecording()).files() == ()


def test_flat_binary_is_its_file(tmp_path):
    path = tmp_path / "rec.dat"
    rand16(100, 3).tofile(path)
    rec = open_recording(path, n_channels=3, fs=3e4)
    assert same_after_reopening(rec) == (path.resolve(),)
    # given through a symbolic link: the file it points to
    link = tmp_path / "link.dat"
    link.symlink_to(path)
    assert open_recording(link, n_channels=3, fs=3e4).files() == (path.resolve(),)


def test_spikeglx_is_the_bin_and_its_meta(tmp_path):
    path = write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", rand16(50, 385), np1_meta())
    want = {path.resolve(), path.with_suffix(".meta").resolve()}
    for source in (path, path.with_suffix(".meta")):
        files = same_after_reopening(open_recording(source))
        assert set(files) == want and len(files) == 2
        assert all(p.is_absolute() for p in files)


def test_open_ephys_is_every_file_of_the_recording_folder_and_the_settings(tmp_path):
    rec_dir, _ = neuropixels_oe(tmp_path)
    node = rec_dir.parent.parent
    (node / "settings.xml").write_text("<SETTINGS/>")
    (node / "settings_2.xml").write_text("<SETTINGS/>")
    (rec_dir / "sync_messages.txt").write_text("Software Time: 0\n")
    ttl = rec_dir / "events" / "Neuropix-PXI-100.ProbeA-AP" / "TTL"
    ttl.mkdir(parents=True)
    for name in ("states.npy", "sample_numbers.npy", "timestamps.npy"):
        np.save(ttl / name, np.zeros(3))
    # not the recording's: another recording of the experiment, a file above the Record Node
    other = rec_dir.parent / "recording2"
    other.mkdir()
    (other / "structure.oebin").write_text("{}")
    (tmp_path / "notes.txt").write_text("x")
    (node / "unrelated.txt").write_text("x")

    want = {p.resolve() for p in rec_dir.rglob("*") if p.is_file()} | \
        {(node / "settings.xml").resolve(), (node / "settings_2.xml").resolve()}
    names = {p.name for p in want}
    assert {"structure.oebin", "continuous.dat", "sample_numbers.npy", "timestamps.npy",
            "sync_messages.txt", "states.npy", "settings.xml", "settings_2.xml"} <= names
    dat = rec_dir / "continuous" / "Neuropix-PXI-100.ProbeA-LFP" / "continuous.dat"
    for source, kw in ((rec_dir, {}), (rec_dir / "structure.oebin", {}), (dat, {}),
                       (rec_dir, {"dataset": "2"})):
        files = same_after_reopening(open_recording(source, **kw))
        assert set(files) == want and len(files) == len(want)
    # every stream's data is listed, whichever stream is read
    assert dat.resolve() in set(open_recording(rec_dir).files())


def test_open_ephys_outside_the_gui_layout_lists_its_folder_only(tmp_path):
    rec_dir, _ = neuropixels_oe(tmp_path)
    moved = tmp_path / "copied"
    rec_dir.rename(moved)
    (tmp_path / "settings.xml").write_text("<SETTINGS/>")       # not a Record Node's
    files = open_recording(moved).files()
    assert set(files) == {p.resolve() for p in moved.rglob("*") if p.is_file()}


def test_hdf5_and_nwb_are_the_file(tmp_path):
    path = tmp_path / "rec.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("traces", data=rand16(3000, 4)).attrs["fs"] = 3e4
    with open_recording(path) as rec:
        assert same_after_reopening(rec) == (path.resolve(),)
    nwb = os.path.join(DATA, "sample.nwb")
    with open_recording(nwb) as rec:
        assert same_after_reopening(rec) == (Path(nwb).resolve(),)


def test_hdf5_through_an_external_link_lists_the_linked_file(tmp_path):
    target = tmp_path / "target.h5"
    with h5py.File(target, "w") as f:
        f.create_dataset("traces", data=rand16(3000, 4)).attrs["fs"] = 3e4
    path = tmp_path / "links.h5"
    with h5py.File(path, "w") as f:
        f["traces"] = h5py.ExternalLink(str(target), "/traces")
    with HDF5Recording(path, "traces", allow_external_links=True) as rec:
        assert same_after_reopening(rec) == (path.resolve(), target.resolve())


def test_hdf5_with_external_raw_storage_lists_the_raw_file(tmp_path):
    raw = tmp_path / "samples.raw"
    data = rand16(3000, 4)
    data.tofile(raw)
    path = tmp_path / "ext.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", shape=data.shape, dtype=np.int16,
                             external=[(str(raw), 0, data.nbytes)])
        d.attrs["fs"] = 3e4
    with HDF5Recording(path) as rec:
        np.testing.assert_array_equal(rec.read(0, 5, scaled=False), data[:5].T)
        assert raw.resolve() in rec.files() and rec.files()[0] == path.resolve()


@pytest.mark.parametrize("fmt", ["binary", "spikeglx", "hdf5"])
def test_files_exist_and_are_distinct(tmp_path, fmt):
    if fmt == "binary":
        rand16(10, 2).tofile(tmp_path / "x.bin")
        rec = open_recording(tmp_path / "x.bin", n_channels=2, fs=1e3)
    elif fmt == "spikeglx":
        rec = open_recording(write_sglx(tmp_path, "x.imec0.ap.bin", rand16(10, 385),
                                        np1_meta()))
    else:
        with h5py.File(tmp_path / "x.h5", "w") as f:
            f.create_dataset("t", data=rand16(3000, 2)).attrs["fs"] = 3e4
        rec = open_recording(tmp_path / "x.h5")
    files = rec.files()
    assert len(set(files)) == len(files) and all(p.is_file() for p in files)
