"""Nothing lost, nothing silently wrong (issue 45, items 1, 2, 3, 6 and 7): the files a job
reads are never its output; one job per output (a lock, refused at once, stale ones taken
over — with real processes); a resume verifies the committed blocks and redoes the damaged
ones; the output is flushed to the disk before it is named; a GPU job whose device runs out
of memory halves its chunk, its fit holds its chunks on the host, its tuning rehearsal halves
its chunk too (CPU tests with a fake out-of-memory error; the real ones are ``gpu`` tests
under ``CUPY_GPU_MEMORY_LIMIT``).

Small files (8 channels, 4 s): the whole file runs in a few seconds on 2 cores.
"""

from __future__ import annotations

import filecmp
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import dspk
from dspk import cli
from dspk.pipeline import Pipeline, PipelineError
from dspk.pipeline import lock as lockmod
from dspk.pipeline.lock import LockedError, OutputLock, lock_holder
from dspk.pipeline.prepared import PreparedPipeline
from dspk.pipeline.stream import GpuMemory, out_of_memory

ROOT = Path(__file__).resolve().parents[2]
FS = 30000.0
C = 8
N = 120000                      # 4 s


def raw_file(tmp_path, c=C, n=N) -> Path:
    path = tmp_path / "raw.bin"
    if not path.exists():
        rng = np.random.default_rng(0)
        (rng.standard_normal((n, c)) * 30).astype(np.int16).tofile(path)
    return path


def probe_csv(tmp_path, c=C, name="probe.csv") -> Path:
    path = tmp_path / name
    path.write_text("".join(f"0,{20 * i}\n" for i in range(c)))
    return path


def rec_of(tmp_path):
    return dspk.open_recording(str(raw_file(tmp_path)), fs=FS, n_channels=C)


def pipe(**options):
    return Pipeline.from_options(**{"whiten": "global", "backend": "cpu", **options})


def traces(path) -> np.ndarray:
    import h5py
    with h5py.File(path, "r") as f:
        return f["traces"][:]


def whole(tmp_path, name="whole.h5", **options) -> Path:
    with rec_of(tmp_path) as rec:
        return pipe(**options).run(rec, tmp_path / name, chunk_s=0.5, progress=False)


class Stop:
    """on_chunk: a KeyboardInterrupt once ``samples`` are committed (the partial is kept)."""

    def __init__(self, samples):
        self.samples = samples

    def __call__(self, done):
        if done >= self.samples:
            raise KeyboardInterrupt


def partial_job(tmp_path, out, stop=60000, **options) -> Path:
    with rec_of(tmp_path) as rec, pytest.raises(KeyboardInterrupt):
        pipe(**options).run(rec, out, chunk_s=0.5, progress=False, on_chunk=Stop(stop))
    assert Path(str(out) + ".partial").exists()
    return Path(str(out) + ".partial")


def resume(tmp_path, out, **options) -> Path:
    with rec_of(tmp_path) as rec:
        return pipe(**options).run(rec, out, chunk_s=0.5, progress=False, resume=True)


def cli_main(*argv) -> int:
    return cli.main([str(a) for a in argv])


# -- 1. the files a job reads are never OUT --------------------------------------------------------
@pytest.mark.parametrize("suffix", [".csv", ".json", ".prb"])
def test_the_probe_file_is_never_out(tmp_path, capsys, suffix):
    raw_file(tmp_path)
    probe = probe_csv(tmp_path)
    if suffix != ".csv":                       # the same positions in the other formats
        geometry = dspk.io.read_probe(probe)
        probe = tmp_path / f"probe{suffix}"
        if suffix == ".json":
            probe.write_text(json.dumps({"specification": "probeinterface", "probes": [{
                "ndim": 2, "si_units": "um", "contact_positions": geometry.tolist(),
                "device_channel_indices": list(range(C))}]}))
        else:
            probe.write_text("channel_groups = {0: {'channels': %r, 'geometry': {%s}}}\n" % (
                list(range(C)), ", ".join(f"{i}: ({x}, {y})" for i, (x, y) in
                                          enumerate(geometry))))
    before = probe.read_bytes()
    for extra in ([], ["--overwrite"]):
        rc = cli_main("preprocess", tmp_path / "raw.bin", probe, "--probe", probe, "--fs", FS,
                      "--n-channels", C, "--quiet", *extra)
        err = capsys.readouterr().err
        assert rc == 2 and "--probe" in err and "never written" in err, err
    assert probe.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"raw.bin", "probe.csv",
                                                                 probe.name})


def test_a_probe_inside_a_kilosort_out_or_named_as_the_partial_is_refused(tmp_path, capsys):
    raw_file(tmp_path)
    ks = tmp_path / "ks"
    ks.mkdir()
    probe = probe_csv(ks)
    rc = cli_main("preprocess", tmp_path / "raw.bin", ks, "--format", "kilosort", "--probe",
                  probe, "--fs", FS, "--n-channels", C, "--quiet", "--overwrite")
    assert rc == 2 and "--probe" in capsys.readouterr().err
    probe2 = tmp_path / "o.h5.progress.json"            # a probeinterface file by its name
    probe2.write_text(json.dumps({"specification": "probeinterface", "probes": [{
        "ndim": 2, "si_units": "um", "contact_positions": [[0, 20 * i] for i in range(C)]}]}))
    rc = cli_main("preprocess", tmp_path / "raw.bin", tmp_path / "o.h5", "--probe", probe2,
                  "--fs", FS, "--n-channels", C, "--quiet")
    err = capsys.readouterr().err
    assert rc == 2 and "o.h5.progress.json beside OUT" in err, err
    assert probe.exists() and probe2.exists()


def test_python_inputs_and_step_files_are_protected(tmp_path):
    rec = rec_of(tmp_path)
    side = tmp_path / "side.json"
    side.write_text("{}")
    with pytest.raises(PipelineError, match=r"^sidecar: .*side.json is OUT"):
        pipe().run(rec, side, overwrite=True, progress=False, inputs={"sidecar": side})
    with pytest.raises(PipelineError, match=r"^inputs: "):
        pipe().run(rec, side, overwrite=True, progress=False, inputs=[side])
    stim = tmp_path / "stim.csv"
    stim.write_text("30000\n60000\n")
    with pytest.raises(PipelineError, match=r"RemoveArtifacts.source: .*stim.csv is OUT"):
        pipe(artifacts=str(stim)).run(rec, stim, overwrite=True, progress=False)
    with pytest.raises(PipelineError, match=r"inputs: expected paths"):
        pipe().run(rec, tmp_path / "o.h5", progress=False, inputs={"x": [3]})
    assert side.read_text() == "{}" and stim.read_text() == "30000\n60000\n"
    rec.close()


# -- 2. one job per output -------------------------------------------------------------------------
HOLD = """
import os, sys, time
import dspk
tmp = sys.argv[1]
def hold(done):
    if done == 15000:
        open(os.path.join(tmp, "started"), "w").close()
        t0 = time.time()
        while not os.path.exists(os.path.join(tmp, "go")) and time.time() - t0 < 60:
            time.sleep(0.02)
    if done >= int(sys.argv[2]):
        os._exit(137)
rec = dspk.open_recording("raw.bin", fs=30000.0, n_channels=8)
dspk.Pipeline.from_options(whiten="global", backend="cpu").run(
    rec, os.path.join(tmp, "o.h5"), chunk_s=0.5, progress=False, on_chunk=hold,
    resume=True)
"""


def holder(tmp_path, kill_at=10**9) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), str(kill_at)],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout=60.0) -> None:
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, "the first job never started"
        time.sleep(0.02)


def dspk_preprocess(tmp_path, *extra) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "dspk", "preprocess", "raw.bin", "o.h5",
                           "--fs", "30000", "--n-channels", "8", "--whiten", "global",
                           "--backend", "cpu", "--chunk", "0.5", "--quiet", *extra],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_second_job_on_the_same_out_is_refused_at_once(tmp_path):
    raw_file(tmp_path)
    first = holder(tmp_path)
    try:
        wait_for(tmp_path / "started", first)
        t0 = time.perf_counter()
        second = dspk_preprocess(tmp_path, "--overwrite")
        assert time.perf_counter() - t0 < 30
        assert second.returncode == 2, second.stderr
        assert f"pid {first.pid}" in second.stderr and "another job is writing it" in \
            second.stderr and "started 20" in second.stderr, second.stderr
        assert (tmp_path / "o.h5.partial").exists()          # the first's, untouched
        (tmp_path / "go").touch()
        assert first.wait(timeout=120) == 0, first.communicate()
    finally:
        if first.poll() is None:
            first.kill()
    np.testing.assert_array_equal(traces(tmp_path / "o.h5"), traces(whole(tmp_path)))
    assert not (tmp_path / "o.h5.lock").exists()


def test_a_stale_lock_is_taken_over_and_said(tmp_path):
    raw_file(tmp_path)
    (tmp_path / "go").touch()
    killed = holder(tmp_path, kill_at=45000)
    assert killed.wait(timeout=120) == 137
    assert lock_holder(tmp_path / "o.h5.lock")["pid"] == killed.pid        # left behind
    done = dspk_preprocess(tmp_path, "--resume")
    assert done.returncode == 0, done.stderr
    assert f"took over the lock of a job that is gone (pid {killed.pid}" in done.stderr
    assert "resuming at sample 45000" in done.stderr, done.stderr
    np.testing.assert_array_equal(traces(tmp_path / "o.h5"), traces(whole(tmp_path)))
    assert not (tmp_path / "o.h5.lock").exists()


def test_lock_without_flock_uses_an_exclusive_file(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(lockmod, "fcntl", None)
    path = tmp_path / "o.h5.lock"
    with OutputLock(path):
        with pytest.raises(LockedError, match=f"pid {os.getpid()} on host"):
            OutputLock(path).acquire()
    assert not path.exists()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    import socket
    path.write_text(json.dumps({"pid": int(gone), "host": socket.gethostname(),
                                "started": "2026-01-01T00:00:00+00:00"}))
    with caplog.at_level(logging.WARNING, "dspk.pipeline"), OutputLock(path) as lk:
        assert lk.taken_over["pid"] == int(gone)
    assert f"pid {gone}" in caplog.text


def test_two_jobs_in_one_process_and_a_lock_that_is_no_file(tmp_path):
    rec = rec_of(tmp_path)
    out = tmp_path / "o.h5"
    with OutputLock(out.with_name("o.h5.lock")):
        with pytest.raises(LockedError, match="another job is writing it"):
            pipe().run(rec, out, progress=False)
    assert not out.exists() and not Path(str(out) + ".partial").exists()
    (tmp_path / "o.h5.lock").mkdir()
    with pytest.raises(PipelineError, match="o.h5.lock: is not a regular file"):
        pipe().run(rec, out, progress=False)
    rec.close()


# -- 3. verified resume ----------------------------------------------------------------------------
def test_record_holds_checksums_of_every_block(tmp_path):
    out = tmp_path / "o.h5"
    partial_job(tmp_path, out, stop=60000)
    record = json.loads((tmp_path / "o.h5.progress.json").read_text())
    blocks = record["blocks"]
    assert blocks["ends"] == [15000, 30000, 45000, 60000] and len(blocks["crc"]) == 4
    assert blocks["order"] == "cccc" and record["sizes"]["o.h5.partial"] > 0
    assert isinstance(record["check"], int) and record["fingerprint"]


def test_an_edited_record_starts_over_and_says_so(tmp_path, caplog):
    out = tmp_path / "o.h5"
    partial_job(tmp_path, out)
    progress = tmp_path / "o.h5.progress.json"
    record = json.loads(progress.read_text())
    record["done"] = N                          # "skip" the rest: zeros, before this work
    progress.write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, "dspk.pipeline"):
        got = resume(tmp_path, out)
    assert "checksum does not match" in caplog.text and "starting over" in caplog.text
    assert filecmp.cmp(got, whole(tmp_path), shallow=False)


def test_an_edited_record_with_its_checksum_redone_still_needs_tiling_blocks(tmp_path, caplog):
    from dspk.pipeline.outputs.partial import record_check
    out = tmp_path / "o.h5"
    partial_job(tmp_path, out)
    progress = tmp_path / "o.h5.progress.json"
    record = json.loads(progress.read_text())
    record["done"] = 90000
    record["check"] = record_check(record)
    progress.write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, "dspk.pipeline"):
        got = resume(tmp_path, out)
    assert "do not reach sample 90000" in caplog.text
    assert filecmp.cmp(got, whole(tmp_path), shallow=False)


def test_a_record_of_another_checksum_starts_over_and_says_so(tmp_path, caplog):
    """A record whose blocks were checksummed another way (an older dspk's one crc32 per
    block) cannot be verified with this one: the job starts over rather than trusting it."""
    from dspk.pipeline.outputs.partial import record_check
    out = tmp_path / "o.h5"
    partial_job(tmp_path, out)
    progress = tmp_path / "o.h5.progress.json"
    record = json.loads(progress.read_text())
    del record["blocks"]["checksum"]
    record["check"] = record_check(record)
    progress.write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, "dspk.pipeline"):
        got = resume(tmp_path, out)
    assert "checksums are of another kind" in caplog.text and "starting over" in caplog.text
    assert filecmp.cmp(got, whole(tmp_path), shallow=False)


def test_block_checksum_pieces_whatever_the_threads(monkeypatch):
    """A block of many pieces: the same checksum computed on the pool or on one thread (the
    pieces are fixed), and any changed byte changes it."""
    import zlib
    import dspk.pipeline.checksum as cs
    rng = np.random.default_rng(3)
    a = rng.standard_normal((7, 3 * cs.PIECE // 4 + 11)).astype(np.float32)   # ~5.25 pieces
    raw = a.reshape(-1).view(np.uint8)
    crcs = [zlib.crc32(raw[i:i + cs.PIECE]) for i in range(0, raw.size, cs.PIECE)]
    serial = zlib.crc32(np.asarray(crcs, "<u4").tobytes())
    assert len(crcs) >= cs.POOL_FROM and cs.block_checksum(a) == serial
    monkeypatch.setattr(cs, "POOL_FROM", 10 ** 9)                # one thread
    assert cs.block_checksum(a) == serial
    b = a.copy()
    b[6, -1] = np.nextafter(b[6, -1], np.inf)
    assert cs.block_checksum(b) != serial


def test_a_damaged_block_is_redone_from_there(tmp_path, caplog):
    import h5py
    from dspk.io.rawio import raw_offset
    out = tmp_path / "o.h5"
    partial = partial_job(tmp_path, out, stop=90000)
    with h5py.File(partial, "r") as f:
        at = raw_offset(f["traces"]) + 40000 * C * 4          # in block [30000, 45000)
    with open(partial, "r+b") as f:
        f.seek(at)
        f.write(b"\0" * 64)
    with caplog.at_level(logging.WARNING, "dspk.pipeline"):
        got = resume(tmp_path, out)
    assert "samples 30000 to 45000 do not match their checksum" in caplog.text
    assert "writes them again from sample 30000" in caplog.text
    assert filecmp.cmp(got, whole(tmp_path), shallow=False)


def test_a_truncated_partial_file_is_not_continued(tmp_path, caplog):
    out = tmp_path / "o.h5"
    partial = partial_job(tmp_path, out, stop=90000)
    size = partial.stat().st_size
    with open(partial, "r+b") as f:
        f.truncate(size // 2)
    with caplog.at_level(logging.WARNING, "dspk.pipeline"):
        got = resume(tmp_path, out)
    assert "starting over" in caplog.text or "writes them again" in caplog.text
    assert filecmp.cmp(got, whole(tmp_path), shallow=False)


def test_changed_options_start_over_naming_what_differs(tmp_path, caplog):
    out = tmp_path / "o.h5"
    partial_job(tmp_path, out)
    with caplog.at_level(logging.WARNING, "dspk.pipeline"):
        got = resume(tmp_path, out, highpass=400.0)
    assert "other parameters (the steps' options or fitted state differ)" in caplog.text
    assert filecmp.cmp(got, whole(tmp_path, "w400.h5", highpass=400.0), shallow=False)


@pytest.mark.parametrize("at, redo", [(20000, 15000), (100, 0)])
def test_a_damaged_kilosort_binary_is_redone(tmp_path, caplog, at, redo):
    probe = probe_csv(tmp_path)
    out = tmp_path / "ks"
    opts = dict(whiten="global", backend="cpu")
    with dspk.open_recording(str(raw_file(tmp_path)), fs=FS, n_channels=C,
                             geometry=str(probe)) as rec:
        ref = Pipeline.from_options(**opts).run(rec, tmp_path / "ref", format="kilosort",
                                                chunk_s=0.5, progress=False)
        with pytest.raises(KeyboardInterrupt):
            Pipeline.from_options(**opts).run(rec, out, format="kilosort", chunk_s=0.5,
                                              progress=False, on_chunk=Stop(60000))
        binary = next(p for p in (tmp_path / "ks.partial").iterdir() if p.suffix in
                      (".bin", ".dat"))
        with open(binary, "r+b") as f:
            f.seek(at * C * 2)
            f.write(b"\1" * 32)
        with caplog.at_level(logging.WARNING, "dspk.pipeline"):
            Pipeline.from_options(**opts).run(rec, out, format="kilosort", chunk_s=0.5,
                                              progress=False, resume=True)
    assert f"samples {redo} to {redo + 15000} do not match their checksum" in caplog.text
    assert (out / binary.name).read_bytes() == (ref / binary.name).read_bytes()


# -- 7. durability ---------------------------------------------------------------------------------
def test_the_output_and_its_folder_are_flushed_before_and_after_the_rename(tmp_path,
                                                                            monkeypatch):
    from dspk.pipeline.outputs import partial as partial_mod
    monkeypatch.delenv("DSPK_FSYNC", raising=False)
    synced = []
    real = partial_mod.fsync_path
    monkeypatch.setattr(partial_mod, "fsync_path",
                        lambda p: (synced.append((Path(p).name, Path(str(p)).exists(),
                                                  (tmp_path / "o.h5").exists())), real(p)))
    out = whole(tmp_path, "o.h5")
    assert synced == [("o.h5.partial", True, False), (tmp_path.name, True, False),
                      (tmp_path.name, True, True)]
    synced.clear()
    with rec_of(tmp_path) as rec:
        pipe().run(rec, tmp_path / "n.h5", progress=False, fsync=False)
    assert synced == [] and out.exists()
    monkeypatch.setenv("DSPK_FSYNC", "off")
    with rec_of(tmp_path) as rec:
        pipe().run(rec, tmp_path / "e.h5", progress=False)
    assert synced == []
    with rec_of(tmp_path) as rec:
        pipe().run(rec, tmp_path / "t.h5", progress=False, fsync=True)
    assert [name for name, *_ in synced] == ["t.h5.partial", tmp_path.name, tmp_path.name]
    synced.clear()
    monkeypatch.delenv("DSPK_FSYNC")
    assert cli_main("preprocess", tmp_path / "raw.bin", tmp_path / "c.h5", "--fs", FS,
                    "--n-channels", C, "--whiten", "global", "--quiet", "--no-fsync") == 0
    assert synced == []


def test_early_flushes_change_no_byte_and_only_follow_fsync(tmp_path, monkeypatch):
    # the partial output flushed while the job writes it (`dspk.pipeline.flush`): the same
    # bytes as without, flushes during the job (a small EVERY here), none without fsync
    from dspk.pipeline import flush as flush_mod
    from dspk.pipeline import job as job_mod
    monkeypatch.delenv("DSPK_FSYNC", raising=False)
    made = []

    class Counting(flush_mod.EarlyFlush):
        def __init__(self, path):
            super().__init__(path, every=1 << 16)
            made.append(self)

    monkeypatch.setattr(job_mod, "EarlyFlush", Counting)
    monkeypatch.setenv("DSPK_EARLY_FLUSH", "off")
    plain = whole(tmp_path, "plain.h5")
    assert made == []
    monkeypatch.setenv("DSPK_EARLY_FLUSH", "on")
    early = whole(tmp_path, "early.h5")
    assert len(made) == 1 and made[0].flushes >= 1
    assert made[0].path.name == "early.h5.partial"
    np.testing.assert_array_equal(traces(early), traces(plain))
    with rec_of(tmp_path) as rec:                    # no fsync: no early flush either
        pipe().run(rec, tmp_path / "n.h5", progress=False, fsync=False)
    assert len(made) == 1
    # a folder output: its partial folder's files
    with dspk.open_recording(str(raw_file(tmp_path)), fs=FS, n_channels=C,
                             geometry=np.c_[np.zeros(C), 20.0 * np.arange(C)]) as rec:
        pipe().run(rec, tmp_path / "ks", format="kilosort", progress=False, chunk_s=0.5)
    assert len(made) == 2 and made[1].flushes >= 1 and made[1].path.name.endswith(".partial")


def test_early_flush_outlives_a_vanished_file_and_says_its_default(tmp_path, monkeypatch):
    from dspk.pipeline.flush import MIN_CPUS, EarlyFlush, early_flush_default
    path = tmp_path / "gone.partial"
    path.write_bytes(b"x" * 100)
    with EarlyFlush(path, every=10) as flush:
        flush.wrote(50)
        for _ in range(500):
            if flush.flushes:
                break
            time.sleep(0.01)
        path.unlink()                                # a discarded partial: no error
        flush.wrote(50)
        for _ in range(500):
            if flush.flushes == 2:
                break
            time.sleep(0.01)
    assert flush.flushes == 2
    for said, want in (("on", True), ("1", True), ("off", False), ("no", False)):
        monkeypatch.setenv("DSPK_EARLY_FLUSH", said)
        assert early_flush_default() is want
    monkeypatch.setenv("DSPK_EARLY_FLUSH", "")
    monkeypatch.setattr(os, "cpu_count", lambda: MIN_CPUS - 1)
    assert early_flush_default() is False
    monkeypatch.setattr(os, "cpu_count", lambda: MIN_CPUS)
    assert early_flush_default() is True


# -- 5. device memory: the chunk halved on out-of-memory (a fake one here) -------------------------
class OutOfMemoryError(MemoryError):
    """What CuPy raises (by name)."""


def test_out_of_memory_is_recognised_by_name_and_cause():
    assert out_of_memory(OutOfMemoryError("x"))
    try:
        try:
            raise OutOfMemoryError("deep")
        except MemoryError as exc:
            raise RuntimeError("a step failed") from exc
    except RuntimeError as wrapped:
        assert out_of_memory(wrapped)
    assert out_of_memory(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED"))
    assert out_of_memory(RuntimeError("Out of memory allocating 9,437,184 bytes"))
    assert not out_of_memory(MemoryError("host")) and not out_of_memory(ValueError("x"))


def test_gpu_memory_sizes_halves_and_stops_at_the_floor(caplog):
    gm = GpuMemory(np, None, 384, 200, FS, enabled=True)
    assert gm.floor == 600
    with caplog.at_level(logging.WARNING, "dspk.pipeline"):
        assert gm.fit_chunk(30000, budget=10**12) == 30000
        small = gm.fit_chunk(30000, budget=100_000_000)
        assert small == 100_000_000 // 2 // (64 * 384) - 400
        assert "instead of 30000" in caplog.text
        assert gm.fit_chunk(30000, budget=0) == 600
        assert gm.smaller(1000, OutOfMemoryError()) == 600
        assert "goes on from its last written chunk with chunks of 600" in caplog.text
        assert gm.smaller(600, OutOfMemoryError()) is None
        assert "the shortest a job takes" in caplog.text
        assert gm.smaller(30000, ValueError("a NaN")) is None
    off = GpuMemory(np, None, 384, 200, FS)           # a CPU job: nothing changes
    assert off.fit_chunk(30000, budget=1) == 30000 and off.smaller(30000,
                                                                   OutOfMemoryError()) is None
    for bad in (0, -5, 1.5, "1G", True):
        with pytest.raises(ValueError, match="gpu_memory: expected a positive number"):
            GpuMemory(np, bad, 8, 0, FS)


def test_a_job_out_of_memory_goes_on_with_half_the_chunk(tmp_path, monkeypatch, caplog):
    """The fake device holds chunks of 4000 samples and its halo at most: a job asked for
    0.5 s chunks fails its first, halves twice and completes, equal to an unlimited run."""
    ref = whole(tmp_path)
    real = PreparedPipeline.compute
    widths = []

    def compute(self, x, s0, s1, m):
        widths.append(s1 - s0)
        if s1 - s0 > 4000:
            raise OutOfMemoryError("Out of memory allocating 9,437,184 bytes")
        return real(self, x, s0, s1, m)

    p = pipe()
    with rec_of(tmp_path) as rec:
        p.fit(rec)
    monkeypatch.setattr(PreparedPipeline, "compute", compute)
    from dspk.pipeline import job as jobmod
    made = []
    real_gm = jobmod.GpuMemory

    def on_cpu(xp, cap, c, m, fs):
        made.append(real_gm(xp, cap, c, m, fs, enabled=True))
        return made[-1]

    monkeypatch.setattr(jobmod, "GpuMemory", on_cpu)
    with caplog.at_level(logging.WARNING, "dspk.pipeline"), rec_of(tmp_path) as rec:
        out = p.run(rec, tmp_path / "o.h5", chunk_s=0.5, progress=False,
                    gpu_memory=10**12)
    assert widths[:2] == [15000, 7500] and set(widths[3:-1]) == {3750}
    assert caplog.text.count("ran out of memory") == 2
    y, r = traces(out), traces(ref)
    assert np.abs(y - r).max() <= 1e-5 * np.abs(r).max()


def test_a_fit_out_of_memory_is_made_again_with_its_chunks_on_the_host(tmp_path, monkeypatch,
                                                                       caplog):
    """The fit's chunks held on the device run out of memory (the whitening's fit fails
    while its chunks are not loaded one at a time): its pools freed, the fit is made again
    on the same chunks held on the host, giving the same W."""
    from dspk.pipeline import Whiten
    with rec_of(tmp_path) as rec:
        ref = pipe(highpass=300.0).fit(rec).states[-1]["W"]
    real, lazy = Whiten.fit, []

    def fit(self, blocks, ctx):
        lazy.append(blocks._load is not None)
        if not lazy[-1]:
            raise OutOfMemoryError("Out of memory allocating 377,487,360 bytes")
        return real(self, blocks, ctx)

    monkeypatch.setattr(Whiten, "fit", fit)
    with caplog.at_level(logging.WARNING, "dspk.pipeline"), rec_of(tmp_path) as rec:
        p = pipe(highpass=300.0).fit(rec)
    assert lazy == [False, True]
    assert "fitting again with them on the host" in caplog.text
    np.testing.assert_array_equal(p.states[-1]["W"], ref)


def test_a_fit_out_of_memory_for_good_names_what_to_change(tmp_path, monkeypatch, capsys):
    """Out of memory on the host too: DeviceOutOfMemory saying what was fitted on what and
    which options to change — in Python's spelling, and the command line's (exit 2, one
    line, no traceback, no file)."""
    from dspk.backend import DeviceOutOfMemory, out_of_memory
    from dspk.pipeline import Whiten

    def fit(self, blocks, ctx):
        raise OutOfMemoryError("Out of memory allocating 377,487,360 bytes")

    monkeypatch.setattr(Whiten, "fit", fit)
    with rec_of(tmp_path) as rec, pytest.raises(DeviceOutOfMemory) as info:
        pipe().fit(rec)
    said = str(info.value)
    assert out_of_memory(info.value)
    for part in ("fitting Whiten on 8 fit chunks of 0.5 s of 8 channels, even with the chunks "
                 "held on the host (Out of memory allocating", "(gpu_memory=)",
                 "Pipeline.fit(recording, n_chunks=, chunk_s=)", "(backend='cpu')"):
        assert part in said, said
    rc = cli_main("preprocess", raw_file(tmp_path), tmp_path / "o.h5", "--fs", FS,
                  "--n-channels", C, "--whiten", "global", "--quiet")
    err = capsys.readouterr().err
    assert rc == 2 and "dspk: error: the device ran out of memory fitting Whiten" in err, err
    assert "(--gpu-memory)" in err and "(--backend cpu)" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.bin"]


def test_a_tuning_rehearsal_out_of_memory_goes_on_with_half_the_chunk(tmp_path, monkeypatch,
                                                                      caplog):
    """`Pipeline.tune`'s rehearsal (`Job.rehearse`) runs the chunks the job will: sized and
    halved as the job's loop does, when the device runs out of memory (the same retry)."""
    from dspk.pipeline import Job
    from dspk.pipeline import job as jobmod
    real, widths = PreparedPipeline.compute, []

    def compute(self, x, s0, s1, m):
        widths.append(s1 - s0)
        if s1 - s0 > 4000:
            raise OutOfMemoryError("Out of memory allocating 9,437,184 bytes")
        return real(self, x, s0, s1, m)

    real_gm = jobmod.GpuMemory
    monkeypatch.setattr(jobmod, "GpuMemory",
                        lambda xp, cap, c, m, fs: real_gm(xp, cap, c, m, fs, enabled=True))
    p = pipe()
    with rec_of(tmp_path) as rec:
        p.fit(rec)
        monkeypatch.setattr(PreparedPipeline, "compute", compute)
        job = Job(p, rec, chunk_s=0.5)
        with caplog.at_level(logging.WARNING, "dspk.pipeline"):
            job.rehearse()
    assert widths == [15000, 7500, 3750, 3750] and job.chunk == 3750
    assert "the rehearsal goes on with chunks of 3750" in caplog.text


# -- 5. the real thing, on a GPU -------------------------------------------------------------------
GPU_JOB = """
import sys
import numpy as np, dspk
from tests.groundtruth import make
c = 384
geom = np.c_[np.tile([0.0, 32.0], c // 2), 20.0 * (np.arange(c) // 2)]
d = make(seconds=3.0, geometry=geom, seed=1)
x = np.round(d["x"] * 20).astype(np.int16)              # [channels, samples], 20 steps per SD
rec = dspk.open_recording(x, fs=30000.0, layout="channels_samples", geometry=geom)
p = dspk.Pipeline.from_options(whiten="local", detect=True, backend="gpu")
p.run(rec, sys.argv[1], chunk_s=2.0, progress=False)
"""


@pytest.mark.gpu
def test_a_gpu_job_completes_under_an_800_mb_limit(tmp_path):
    """Issue 45's case: 384 channels, local whitening and detection under
    CUPY_GPU_MEMORY_LIMIT=800000000 completes (the chunk sized to the limit, halved if the
    device runs out all the same) and equals the job without the limit."""
    import h5py
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    free = subprocess.run([sys.executable, "-c", GPU_JOB, str(tmp_path / "free.h5")],
                          env=env, capture_output=True, text=True, cwd=ROOT)
    assert free.returncode == 0, free.stderr
    env["CUPY_GPU_MEMORY_LIMIT"] = "800000000"
    capped = subprocess.run([sys.executable, "-c", GPU_JOB, str(tmp_path / "capped.h5")],
                            env=env, capture_output=True, text=True, cwd=ROOT)
    assert capped.returncode == 0, capped.stderr
    assert "instead of 60000" in capped.stderr or "ran out of memory" in capped.stderr, \
        capped.stderr
    with h5py.File(tmp_path / "free.h5") as a, h5py.File(tmp_path / "capped.h5") as b:
        ya, yb = a["traces"][:], b["traces"][:]
        assert np.abs(ya - yb).max() <= 2e-5 * np.abs(ya).max()
        sa, sb = a["spikes"][:], b["spikes"][:]
    assert len(sa) > 50
    # the same spikes (a threshold crossing by a rounding's width may differ: a handful)
    differ = set(sa["sample_index"].tolist()) ^ set(sb["sample_index"].tolist())
    assert len(differ) <= max(2, len(sa) // 500), len(differ)


GPU_FIT = """
import logging, sys
import numpy as np, dspk
from dspk.backend import DeviceOutOfMemory
from tests.groundtruth import make
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
c = 384
geom = np.c_[np.tile([0.0, 32.0], c // 2), 20.0 * (np.arange(c) // 2)]
d = make(seconds=8.0, geometry=geom, seed=1)
x = np.round(d["x"] * 20).astype(np.int16)
rec = dspk.open_recording(x, fs=30000.0, layout="channels_samples", geometry=geom)
p = dspk.Pipeline.from_options(whiten="local", backend="gpu")
try:
    p.fit(rec)
except DeviceOutOfMemory as exc:
    print(f"REFUSED: {exc}")
    sys.exit(3)
np.save(sys.argv[1], p.states[-1]["W"])
"""


@pytest.mark.gpu
def test_a_gpu_fit_out_of_memory_holds_its_chunks_on_the_host_or_says_what_to_change(
        tmp_path):
    """Issue 45's fit under CUPY_GPU_MEMORY_LIMIT: 16 fit chunks of 0.5 s of 384 channels
    (375 MB in float32 with their halos) do not fit in 350 MB: the fit is made again with
    them on the host, one on the device at a time, and gives the W of the fit without a
    limit; in 16 MB not one chunk (23 MB) fits:
    DeviceOutOfMemory names what to change (no CuPy traceback)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def fit(name, limit=None):
        e = dict(env) if limit is None else dict(env, CUPY_GPU_MEMORY_LIMIT=str(limit))
        return subprocess.run([sys.executable, "-c", GPU_FIT, str(tmp_path / name)], env=e,
                              capture_output=True, text=True, cwd=ROOT, timeout=600)

    free = fit("free.npy")
    assert free.returncode == 0, free.stderr
    capped = fit("capped.npy", 350_000_000)
    assert capped.returncode == 0, capped.stdout + capped.stderr
    assert "fitting again with them on the host" in capped.stderr, capped.stderr
    wa, wb = np.load(tmp_path / "free.npy"), np.load(tmp_path / "capped.npy")
    assert np.abs(wa - wb).max() <= 1e-5 * np.abs(wa).max()
    tiny = fit("tiny.npy", 16_000_000)
    assert tiny.returncode == 3, tiny.stdout + tiny.stderr
    assert "REFUSED: the device ran out of memory fitting Whiten on 16 fit chunks of 0.5 s " \
           "of 384 channels" in tiny.stdout and "gpu_memory=" in tiny.stdout, tiny.stdout
    assert "Traceback" not in tiny.stderr, tiny.stderr


def test_the_lock_module_examples_run():
    """dspk.pipeline.lock's docstring examples (the module is not in test_doctests' list)."""
    import doctest
    result = doctest.testmod(lockmod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_a_folder_output_flushes_every_file_before_its_rename(tmp_path, monkeypatch):
    from dspk.pipeline.outputs import FolderOutput
    from dspk.pipeline.outputs import partial as partial_mod
    synced = []
    monkeypatch.setattr(partial_mod, "fsync_path",
                        lambda p: synced.append((os.path.relpath(p, tmp_path),
                                                 (tmp_path / "ks").exists())))
    files = FolderOutput(tmp_path / "ks")
    files.partial.mkdir()
    (files.partial / "a.bin").write_bytes(b"1")
    (files.partial / "params.py").write_text("x = 1\n")
    files.commit()
    assert sorted(synced[:2]) == [("ks.partial/a.bin", False), ("ks.partial/params.py", False)]
    assert synced[2:] == [("ks.partial", False), (".", False), (".", True)]
    synced.clear()
    FolderOutput(tmp_path / "k2").partial.mkdir()
    FolderOutput(tmp_path / "k2").commit(fsync=False)
    assert synced == [] and (tmp_path / "k2").is_dir()
