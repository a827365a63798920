"""Nothing a user did not name is ever overwritten, and a stopped job says how to go on: the
output is refused when it is any file of the recording or not a regular file, with
--overwrite or without; Ctrl-C and SIGTERM stop a job with one line and exit 130, keeping
its partial output, which --resume completes to the bytes of a job that never stopped;
--resume with nothing to resume says so; command-line messages speak options."""

from __future__ import annotations

import filecmp
import hashlib
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import dspk
from dspk import cli
from dspk.pipeline import JobInterrupted, Pipeline, PipelineError

from tests.recordings import np1_meta, oe_stream, rand16, write_oe, write_sglx

ROOT = Path(__file__).resolve().parents[2]
FS = 30000.0


def digests(folder: Path) -> dict:
    return {p: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode)
            for p in folder.rglob("*") if p.is_file()}


def refused(p, rec, out, match="is the input"):
    with pytest.raises(PipelineError, match=match):
        p.run(rec, out, overwrite=True, progress=False)


# -- never destroy -----------------------------------------------------------------------------
def test_no_file_of_a_spikeglx_recording_is_an_output(tmp_path):
    data = rand16(3000, 385)
    path = write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", data, np1_meta())
    before = digests(tmp_path)
    p = Pipeline.from_options(whiten="global", backend="cpu")
    with dspk.open_recording(path) as rec:
        for target in (path, path.with_suffix(".meta"), tmp_path / "./run_g0_t0.imec0.ap.meta"):
            refused(p, rec, target)
        (tmp_path / "link.meta").symlink_to(path.with_suffix(".meta"))
        os.link(path.with_suffix(".meta"), tmp_path / "hard.meta")
        refused(p, rec, tmp_path / "link.meta")
        refused(p, rec, tmp_path / "hard.meta")
    assert not p.is_fitted                       # refused before any work
    assert {k: v for k, v in digests(tmp_path).items() if k in before} == before
    assert not list(tmp_path.glob("*.partial"))
    # the command line refuses it the same way
    assert cli.main(["preprocess", str(path), str(path.with_suffix(".meta")), "--overwrite",
                     "--whiten", "global", "--quiet"]) == 2
    assert {k: v for k, v in digests(tmp_path).items() if k in before} == before


def test_no_file_of_an_open_ephys_recording_is_an_output(tmp_path):
    streams = [oe_stream("Neuropix-PXI-100.ProbeA-AP", 16, stream_name="ProbeA-AP")]
    rec_dir = write_oe(tmp_path, streams, [rand16(3000, 16, 3)])
    node = rec_dir.parents[1]
    (node / "settings.xml").write_text("<SETTINGS/>")
    (rec_dir / "sync_messages.txt").write_text("Start Time for Neuropix-PXI: 0\n")
    before = digests(tmp_path)
    p = Pipeline.from_options(whiten="global", reference="none", backend="cpu")
    with dspk.open_recording(rec_dir) as rec:
        files = {f.resolve() for f in rec.files()}
        stream = rec_dir / "continuous" / "Neuropix-PXI-100.ProbeA-AP"
        for target in (rec_dir / "structure.oebin", node / "settings.xml",
                       stream / "continuous.dat", stream / "sample_numbers.npy",
                       stream / "timestamps.npy", rec_dir / "sync_messages.txt"):
            assert target.resolve() in files
            refused(p, rec, target)
    assert digests(tmp_path) == before


def test_an_output_that_is_not_a_regular_file_is_refused(tmp_path):
    rec = dspk.open_recording(rand16(3000, 4), fs=FS)
    p = Pipeline.from_options(whiten=None, backend="cpu")
    for device in ("/dev/null", "/dev/full"):
        if not os.path.exists(device):
            continue
        mode = os.stat(device).st_mode
        refused(p, rec, device, "is not a regular file .a character device")
        assert os.stat(device).st_mode == mode and stat.S_ISCHR(os.stat(device).st_mode)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(p, rec, fifo, "is not a regular file .a FIFO")
    refused(p, rec, tmp_path, "is a directory")
    # the job's own files beside the output are checked too
    (tmp_path / "o.h5.partial").mkdir()
    refused(p, rec, tmp_path / "o.h5", "o.h5.partial: is not a regular file .a directory")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["fifo", "o.h5.partial"]


# -- interruption and resume -------------------------------------------------------------------
def _h5_recording(path: Path, seconds: float, c: int = 16) -> Path:
    rng = np.random.default_rng(2)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", data=(rng.standard_normal((int(seconds * FS), c)) *
                                             40).astype(np.int16))
        d.attrs["fs"] = FS
        d.attrs["geometry"] = np.c_[np.zeros(c), 20.0 * np.arange(c)]
    return path


def test_overwrite_replaces_the_output_atomically(tmp_path):
    """An output replaced with overwrite: a reader holding the old file still reads it whole
    (the rename is atomic), the new output is complete, nothing else is left in the folder,
    and a link to the old output elsewhere keeps it."""
    x = np.random.default_rng(2).standard_normal((4, 6000)).astype(np.float32)
    out = tmp_path / "o.h5"
    p = Pipeline.from_options(whiten=None, reference="mean")
    p.run(dspk.open_recording(x, fs=FS), out, progress=False)
    before = out.read_bytes()
    keep = tmp_path / "kept.h5"
    os.link(out, keep)                                   # a user's own second name for it
    with open(out, "rb") as reader:
        p.run(dspk.open_recording(2 * x, fs=FS), out, overwrite=True, progress=False)
        assert reader.read() == before                   # the old file, whole
    assert sorted(q.name for q in tmp_path.iterdir()) == ["kept.h5", "o.h5"]
    assert keep.read_bytes() == before
    with h5py.File(out, "r") as f, h5py.File(keep, "r") as g:       # the steps are linear
        np.testing.assert_allclose(f["traces"][:], 2 * g["traces"][:], rtol=1e-5, atol=1e-5)


def test_ctrl_c_keeps_the_partial_output_and_says_how_to_resume(tmp_path):
    src = _h5_recording(tmp_path / "in.h5", 3.0)
    whole = Pipeline.from_options(whiten="local", n_neighbors=4, detect=True, backend="cpu") \
        .run(str(src), tmp_path / "whole.h5", chunk_s=0.5, progress=False)
    calls = []

    def ctrl_c(done):
        calls.append(done)
        if len(calls) == 3:
            raise KeyboardInterrupt

    p = Pipeline.from_options(whiten="local", n_neighbors=4, detect=True, backend="cpu")
    with pytest.raises(JobInterrupted) as stopped:
        p.run(str(src), tmp_path / "o.h5", chunk_s=0.5, progress=False, on_chunk=ctrl_c)
    assert isinstance(stopped.value, KeyboardInterrupt)
    assert stopped.value.done == 45000 and stopped.value.kept
    assert "interrupted at 1.5 s of 3.0 s" in str(stopped.value)
    assert "o.h5.partial is kept" in str(stopped.value) and "resume=True" in str(stopped.value)
    assert (tmp_path / "o.h5.partial").exists() and not (tmp_path / "o.h5").exists()
    out = Pipeline.from_options(whiten="local", n_neighbors=4, detect=True, backend="cpu") \
        .run(str(src), tmp_path / "o.h5", chunk_s=0.5, progress=False, resume=True)
    assert filecmp.cmp(out, whole, shallow=False)


def test_ctrl_c_before_any_chunk_keeps_nothing(tmp_path, monkeypatch):
    rec = dspk.open_recording(rand16(30000, 4), fs=FS)

    def ctrl_c(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dspk.pipeline.job.ChunkStream, "run", ctrl_c)
    with pytest.raises(JobInterrupted, match="before any chunk was written: nothing was kept"):
        Pipeline.from_options(whiten=None, backend="cpu").run(rec, tmp_path / "o.h5",
                                                              progress=False)
    assert list(tmp_path.iterdir()) == []


def test_resume_with_nothing_to_resume_says_so(tmp_path, caplog):
    rec = dspk.open_recording(rand16(30000, 4), fs=FS)
    with caplog.at_level(logging.WARNING, logger="dspk.pipeline"):
        Pipeline.from_options(whiten=None, backend="cpu").run(rec, tmp_path / "o.h5",
                                                              resume=True, progress=False)
    assert any("o.h5.partial: nothing to resume" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "o.h5").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_command_line_stops_on_a_signal_and_resumes(tmp_path, sig):
    """`dspk preprocess` stopped by Ctrl-C (SIGINT) or SIGTERM once chunks are committed: exit
    130, a last line saying where it stopped and that --resume continues, OUT.partial kept;
    the same command with --resume gives the bytes of a job that never stopped, and
    --resume with nothing to resume says so."""
    _h5_recording(tmp_path / "in.h5", 20.0, c=32)       # 400 chunks: ~3 s a run on 2 cores
    args = [sys.executable, "-m", "dspk", "preprocess", "in.h5", "out.h5", "--whiten",
            "global", "--chunk", "0.05", "--quiet", "--backend", "cpu"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    job = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    progress = tmp_path / "out.h5.progress.json"
    deadline = time.monotonic() + 120
    while not progress.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    job.send_signal(sig)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("dspk: interrupted at ") and "out.h5.partial is kept" in last
    assert "--resume" in last and "resume=True" not in last
    assert (tmp_path / "out.h5.partial").exists() and not (tmp_path / "out.h5").exists()
    again = subprocess.run(args + ["--resume"], cwd=tmp_path, env=env, capture_output=True,
                           text=True)
    assert again.returncode == 0, again.stderr
    assert "resuming at sample" in again.stderr
    whole = subprocess.run(args[:5] + ["whole.h5"] + args[6:], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    assert filecmp.cmp(tmp_path / "out.h5", tmp_path / "whole.h5", shallow=False)
    nothing = subprocess.run(args[:5] + ["new.h5"] + args[6:] + ["--resume"], cwd=tmp_path,
                             env=env, capture_output=True, text=True)
    assert nothing.returncode == 0 and "new.h5.partial: nothing to resume" in nothing.stderr


# -- command-line messages speak options --------------------------------------------------------
def test_command_line_messages_name_options(tmp_path, capsys):
    raw = tmp_path / "raw.bin"
    rand16(3000, 4).tofile(raw)
    assert cli.main(["info", str(raw), "--n-channels", "4"]) == 2
    err = capsys.readouterr().err
    assert "--fs" in err and "fs=" not in err, err
    assert dspk.argnames.arg("fs") == "fs="          # the spelling is restored afterwards
    sglx = tmp_path / "run_g0_t0.imec0.ap.bin"
    rand16(3000, 385).tofile(sglx)
    assert cli.main(["info", str(sglx)]) == 2
    err = capsys.readouterr().err
    assert "run_g0_t0.imec0.ap.meta" in err and "missing" in err, err
    assert "--n-channels" in err and "n_channels=" not in err, err
