"""Batch jobs (`Pipeline.run`, `dspk.preprocess`): checks before any work, resuming with the
stored fitted state, byte-identical outputs, degenerate and damaged inputs, and files closed."""

import filecmp
import logging
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

import dspk
from dspk.io import RecordingError
from dspk.pipeline import Pipeline, PipelineError
from dspk.pipeline.job import PartialOutput

from tests.killable import run_killable_job

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "sample.nwb"
FS = 30000.0


def recording(n=30000, c=8, seed=0, dtype=np.int16):
    rng = np.random.default_rng(seed)
    geom = np.c_[np.tile([0.0, 32.0], c // 2), np.repeat(np.arange(c // 2) * 20.0, 2)]
    x = (rng.standard_normal((n, c)) * 40).astype(dtype)
    return dspk.open_recording(x, fs=FS, geometry=geom)


def h5_input(path, n=30000, c=8, **create):
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", data=(rng.standard_normal((n, c)) * 40).astype(np.int16),
                             **create)
        d.attrs["fs"] = FS
        d.attrs["geometry"] = np.c_[np.zeros(c), 20.0 * np.arange(c)]
    return path


@pytest.fixture
def no_fit(monkeypatch):
    """Pipeline.fit raises: a test passes only if nothing was fitted."""
    def fit(self, *args, **kwargs):
        raise AssertionError("Pipeline.fit was called")

    monkeypatch.setattr(Pipeline, "fit", fit)


# -- checks before any work --------------------------------------------------------------------
def test_refused_outputs_fit_nothing_and_create_no_file(tmp_path, no_fit):
    src = h5_input(tmp_path / "in.h5")
    rec = dspk.open_recording(src)
    p = Pipeline.from_options(whiten="local", n_neighbors=4, detect=True)
    out = tmp_path / "o.h5"
    out.write_bytes(b"keep me")
    with pytest.raises(PipelineError, match=f"{out}: exists; pass overwrite=True"):
        p.run(rec, out, progress=False)
    assert out.read_bytes() == b"keep me"
    (tmp_path / "sub").mkdir()
    os.symlink(src, tmp_path / "link.h5")
    for same in (src, tmp_path / "link.h5", tmp_path / "sub" / ".." / "in.h5",
                 str(src).replace("/in.h5", "/./in.h5")):
        with pytest.raises(PipelineError, match="is the input"):
            p.run(rec, same, overwrite=True, progress=False)
    os.link(src, tmp_path / "hard.h5")                       # another name, the same inode
    with pytest.raises(PipelineError, match="is the input"):
        p.run(rec, tmp_path / "hard.h5", overwrite=True, progress=False)
    missing = tmp_path / "nope" / "o.h5"
    with pytest.raises(PipelineError, match=f"{missing}: its folder {missing.parent} does not"):
        p.run(rec, missing, progress=False)
    assert not missing.parent.exists()
    with pytest.raises(PipelineError, match="is a directory"):
        p.run(rec, tmp_path / "sub", overwrite=True, progress=False)
    left = sorted(q.name for q in tmp_path.iterdir())
    assert left == ["hard.h5", "in.h5", "link.h5", "o.h5", "sub"]       # no partial file
    rec.close()


def test_steps_that_need_geometry_or_channels_are_refused_before_work(tmp_path, no_fit):
    flat = dspk.open_recording(np.zeros((30000, 4), np.int16), fs=FS)      # no geometry
    for options, match in ((dict(whiten="local"), "whiten='local' needs the recording's "
                            "geometry.*--probe FILE.*whiten='global'"),
                           (dict(whiten="global", detect=True),
                            "detect=True needs the recording's geometry.*--probe FILE")):
        with pytest.raises(PipelineError, match=match):
            Pipeline.from_options(**options).run(flat, tmp_path / "o.h5", progress=False)
        with pytest.raises(PipelineError, match=match):
            Pipeline.from_options(**options).tune(flat)
    assert list(tmp_path.iterdir()) == []


# -- one channel, zero samples, damaged and non-finite inputs ----------------------------------
def test_one_channel_with_a_common_reference_is_refused_not_zeroed(tmp_path):
    x = (np.random.default_rng(0).standard_normal((30000, 1)) * 40).astype(np.int16)
    rec = dspk.open_recording(x, fs=FS, layout="samples_channels")
    for ref in ("median", "mean"):
        p = Pipeline.from_options(reference=ref, whiten="global")
        with pytest.raises(PipelineError, match=f"reference='{ref}': the recording has 1 "
                                                f"channel.*reference='none'"):
            p.run(rec, tmp_path / "o.h5", progress=False)
        with pytest.raises(PipelineError, match="reference='none'"):
            p.fit(rec)
        with pytest.raises(PipelineError, match="1 channel"):
            Pipeline.from_options(reference=ref, whiten=None).transform(
                x.T.astype(np.float32), fs=FS)
    assert list(tmp_path.iterdir()) == []
    out = Pipeline.from_options(reference="none", whiten="global").run(
        rec, tmp_path / "o.h5", progress=False)
    with h5py.File(out, "r") as f:
        assert np.abs(f["traces"][:]).max() > 0.5


def test_zero_samples_are_reported_as_samples(tmp_path):
    for shape, layout in (((0, 8), None), ((8, 0), None), ((0, 8), "samples_channels")):
        with h5py.File(tmp_path / "z.h5", "w") as f:
            d = f.create_dataset("x", shape=shape, dtype=np.int16)
            d.attrs["fs"] = FS
            if layout:
                d.attrs["layout"] = layout
        with pytest.raises(RecordingError, match="0 sample") as err:
            dspk.open_recording(tmp_path / "z.h5")
        assert "channel" not in str(err.value)
    (tmp_path / "z.bin").write_bytes(b"")
    with pytest.raises(RecordingError, match="z.bin: 0 sample"):
        dspk.open_recording(tmp_path / "z.bin", n_channels=8, fs=FS)
    for shape in ((0, 8), (8, 0)):
        with pytest.raises(RecordingError, match=r"array \(.*\): 0 sample"):
            dspk.open_recording(np.zeros(shape, np.int16), fs=FS)


def _damage_chunk(path, dataset, coord):
    with h5py.File(path, "r") as f:
        info = f[dataset].id.get_chunk_info_by_coord(coord)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 8)
        fh.write(b"\xff" * 64)


@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_a_damaged_chunk_names_the_file_and_the_samples(tmp_path, compression):
    """gzip chunks inflated by dspk's reader and lzf chunks read through h5py alike: the error
    names the file, the dataset and the chunk's samples; the job leaves no partial file."""
    src = h5_input(tmp_path / "in.h5", chunks=(4096, 8), compression=compression)
    _damage_chunk(src, "traces", (8192, 0))
    p = Pipeline.from_options(whiten="global")
    p.fit(dspk.open_recording(recording(c=8).read(scaled=False).T.copy(), fs=FS,
                              geometry=None, layout="samples_channels"))  # fitted elsewhere
    with dspk.open_recording(src) as rec:
        with pytest.raises(RecordingError, match=f"{src}:/traces: the (gzip )?chunk of samples "
                                                 f"8192..12287.* damaged"):
            p.run(rec, tmp_path / "o.h5", chunk_s=0.1, progress=False)
    assert sorted(q.name for q in tmp_path.iterdir()) == ["in.h5"]


def test_non_finite_input_leaves_no_partial_file(tmp_path):
    """A NaN stops the job (a resume would stop there too): no partial, no progress file."""
    x = (np.random.default_rng(0).standard_normal((30000, 8)) * 40).astype(np.float32)
    x[21000, 3] = np.nan
    rec = dspk.open_recording(x, fs=FS)
    with pytest.raises(RecordingError, match="non-finite sample .* channel 3, sample 21000"):
        Pipeline.from_options(whiten=None).run(rec, tmp_path / "o.h5", chunk_s=0.2,
                                               progress=False)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_job_keeps_its_partial_file_and_resumes(tmp_path, monkeypatch):
    rec = recording()
    p = Pipeline.from_options(whiten="global")
    whole = p.run(rec, tmp_path / "whole.h5", chunk_s=0.2, progress=False)
    calls = {"n": 0}
    real = PartialOutput.record

    def interrupted(self, job, done, spikes):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        real(self, job, done, spikes)

    monkeypatch.setattr(PartialOutput, "record", interrupted)
    with pytest.raises(KeyboardInterrupt):
        p.run(rec, tmp_path / "o.h5", chunk_s=0.2, progress=False)
    monkeypatch.undo()
    assert (tmp_path / "o.h5.partial").exists() and not (tmp_path / "o.h5").exists()
    out = Pipeline.from_options(whiten="global").run(rec, tmp_path / "o.h5", chunk_s=0.2,
                                                     resume=True, progress=False)
    assert filecmp.cmp(out, whole, shallow=False)


# -- resuming, reproducible bytes --------------------------------------------------------------
def run_job(tmp_path, out, kill_after=None):
    return run_killable_job(tmp_path, out,
                            "whiten='local', n_neighbors=8, detect=True, backend='cpu'",
                            kill_after, by_path=True)


@pytest.mark.slow
def test_resume_uses_the_stored_fit_and_gives_the_same_bytes(tmp_path, monkeypatch):
    """Killed twice (os._exit, as a kill), then resumed here with Pipeline.fit made to raise:
    the fitted state comes from the partial file, and the output is byte for byte the
    uninterrupted job's (no HDF5 object times; the same layout of the file)."""
    whole = tmp_path / "whole.h5"
    assert run_job(tmp_path, whole) == 0
    out = tmp_path / "resumed.h5"
    for kill_after in (30000, 120000):
        assert run_job(tmp_path, out, kill_after) == 137
    assert (tmp_path / "resumed.h5.partial").exists()
    monkeypatch.setattr(Pipeline, "fit", lambda *a, **k: pytest.fail("refitted on resume"))
    p = Pipeline.from_options(whiten="local", n_neighbors=8, detect=True, backend="cpu")
    p.run(str(SAMPLE), out, chunk_s=0.5, resume=True, progress=False)
    assert filecmp.cmp(out, whole, shallow=False)
    with h5py.File(out, "r") as f:
        assert len(f["spikes"]) > 100 and len(f["features"]) == len(f["spikes"])


@pytest.mark.slow
def test_two_clean_runs_write_the_same_bytes(tmp_path):
    """Every group and dataset of an output (traces, spikes, features, geometry, fitted state)
    is written without object times: two runs, a second apart or not, are the same file."""
    rec = dspk.open_recording(SAMPLE)
    for i, opts in enumerate((dict(), dict(output_dtype=np.int16, compression="gzip"))):
        p = Pipeline.from_options(whiten="local", n_neighbors=8, detect=True, backend="cpu")
        a = p.run(rec, tmp_path / f"a{i}.h5", chunk_s=0.5, progress=False, **opts)
        b = Pipeline.from_options(whiten="local", n_neighbors=8, detect=True,
                                  backend="cpu").run(rec, tmp_path / f"b{i}.h5", chunk_s=0.5,
                                                     progress=False, **opts)
        assert filecmp.cmp(a, b, shallow=False)
        with h5py.File(a, "r") as f:
            names = [""]
            f.visit(names.append)
            assert {"spikes", "features", "fitted/step2_Whiten/W"} <= set(names)
            for name in names:
                info = h5py.h5o.get_info(f[name or "/"].id)
                assert (info.ctime, info.mtime, info.atime, info.btime) == (0, 0, 0, 0), name
    rec.close()


def test_new_file_stores_no_times_with_an_older_h5py(tmp_path, monkeypatch):
    """h5py before 3.15 has no track_times for files: the file creation list says it."""
    from dspk.io.rawio import create_contiguous, create_dataset, new_file

    real = h5py.File

    def old_file(*args, **kwargs):
        if "track_times" in kwargs:
            raise TypeError("'track_times' is an invalid keyword argument for this function")
        return real(*args, **kwargs)

    monkeypatch.setattr(h5py, "File", old_file)
    with new_file(tmp_path / "x.h5") as f:
        create_contiguous(f, "traces", (10, 2), np.float32)
        create_dataset(f, "a/b/c", data=np.arange(3))
    monkeypatch.undo()
    with h5py.File(tmp_path / "x.h5", "r") as f:
        for name in ("/", "traces", "a", "a/b", "a/b/c"):
            assert h5py.h5o.get_info(f[name].id).ctime == 0, name


def test_a_partial_file_without_resume_is_discarded_and_said(tmp_path, caplog):
    rec = recording()
    (tmp_path / "o.h5.partial").write_bytes(b"old")
    with caplog.at_level(logging.WARNING, logger="dspk.pipeline"):
        Pipeline.from_options(whiten=None).run(rec, tmp_path / "o.h5", progress=False)
    assert any("o.h5.partial: discarding the partial output" in r.getMessage()
               for r in caplog.records)
    assert not (tmp_path / "o.h5.partial").exists()


# -- files closed ------------------------------------------------------------------------------
def test_path_opened_recordings_are_closed(tmp_path, monkeypatch):
    """preprocess() and Pipeline.run() close the recording they opened from a path, when the
    job completes and when it fails; a Recording passed in is left open."""
    from dspk.io.hdf5 import HDF5Recording

    closed = []
    real = HDF5Recording.close
    monkeypatch.setattr(HDF5Recording, "close", lambda self: (closed.append(self), real(self)))
    src = h5_input(tmp_path / "in.h5")
    dspk.preprocess(src, tmp_path / "a.h5", whiten="global", progress=False)
    assert len(closed) == 1
    Pipeline.from_options(whiten="global").run(src, tmp_path / "b.h5", progress=False)
    assert len(closed) == 2
    with pytest.raises(PipelineError, match="exists"):
        dspk.preprocess(src, tmp_path / "a.h5", whiten="global", progress=False)
    assert len(closed) == 3
    rec = dspk.open_recording(src)
    Pipeline.from_options(whiten="global").run(rec, tmp_path / "c.h5", progress=False)
    assert len(closed) == 3 and rec.read(0, 10).shape == (8, 10)
    rec.close()
