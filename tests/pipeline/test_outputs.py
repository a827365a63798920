"""The contract of an output (`dspk.pipeline.outputs`): the registry lists the formats and the
command line offers those it lists; a format of a test's own — one `Output` class and one
`register_output` call, no runner code touched — runs through `Job`'s one lifecycle: written
chunk by chunk in order, kept partial when interrupted, resumed from its last recorded chunk
with the fitted state stored in it, committed; and `dspk.pipeline.record.describe` reads back
what an HDF5 output and a Kilosort folder hold."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import dspk
from dspk import cli
from dspk.io import RecordingError
from dspk.pipeline import Job, JobInterrupted, Pipeline, PipelineError, detect_peaks
from dspk.pipeline.outputs import (HDF5Output, KilosortOutput, NWBOutput, Output, PeaksOutput,
                                   SpanOutput, formats, output_class, register_output,
                                   unregister_output)
from dspk.pipeline.record import describe, write_fitted

FS = 30000.0


def recording(n=6000, c=4, seed=0, geometry=True):
    x = (np.random.default_rng(seed).standard_normal((n, c)) * 40).astype(np.int16)
    return dspk.open_recording(x, fs=FS, gain_to_uv=0.5, layout="samples_channels",
                               geometry=np.c_[np.zeros(c), 20.0 * np.arange(c)]
                               if geometry else None)


# -- a format of the test's own --------------------------------------------------------------------
class FlatFolder(Output):
    """A folder of ``traces.f32`` (float32 [samples, channels], written in place) and
    ``fitted.h5``: resumable, with its fitted state stored where `Output.stored` reads it."""

    format = "flat-test"
    summary = "a flat float32 folder (a test's own format)"
    target = "folder"
    resumes = True
    layouts = ("samples_channels",)
    reader = "numpy"
    fitted_name = "fitted.h5"
    owned = ("traces.f32", "fitted.h5")
    marker = "traces.f32"
    what = "the flat test output"

    def begin(self, job, done, rows):
        partial = self.files.partial
        if done == 0:
            partial.mkdir()
            np.zeros((job.rec.n_samples, job.rec.n_channels), np.float32).tofile(
                partial / "traces.f32")
            with h5py.File(partial / self.fitted_name, "w") as f:
                write_fitted(f, job.pipeline.steps, job.rec.fs, job.states)
        self.fh = open(partial / "traces.f32", "r+b")
        self.c, self.staged, self.written = job.rec.n_channels, job.staged, []
        return done

    def write(self, s0, s1, block, rows):
        self.written.append((s0, s1))
        self.fh.seek(s0 * self.c * 4)
        self.fh.write(np.ascontiguousarray(block if self.staged else block.T).tobytes())
        self.fh.flush()

    def close(self):
        if getattr(self, "fh", None) is not None:
            self.fh.close()
            self.fh = None


@pytest.fixture
def flat():
    register_output(FlatFolder)
    yield FlatFolder
    unregister_output(FlatFolder.format)


def flat_traces(folder, c=4):
    return np.fromfile(folder / "traces.f32", np.float32).reshape(-1, c)


def h5_traces(path):
    with h5py.File(path, "r") as f:
        return f["traces"][:]


# -- the registry ----------------------------------------------------------------------------------
def test_the_registry_lists_the_formats_and_the_command_line_offers_the_listed_ones(flat):
    assert formats()[:5] == ("hdf5", "kilosort", "nwb", "span", "peaks")
    assert formats(listed=True) == ("hdf5", "kilosort", "nwb", "zarr", "flat-test")
    assert [output_class(f) for f in ("hdf5", "kilosort", "nwb", "span", "peaks")] == \
        [HDF5Output, KilosortOutput, NWBOutput, SpanOutput, PeaksOutput]
    assert (HDF5Output.resumes, KilosortOutput.resumes, NWBOutput.resumes) == (True, True, False)
    choices = next(a.choices for a in cli.parser()._subparsers._group_actions[0]
                   .choices["preprocess"]._actions if a.dest == "format")
    assert tuple(choices) == formats(listed=True)
    with pytest.raises(PipelineError, match="format: expected one of 'hdf5', 'kilosort', "
                                            "'nwb', 'span', 'peaks', 'zarr', 'flat-test', "
                                            "got 'phy'"):
        output_class("phy")
    with pytest.raises(PipelineError, match="a format named 'flat-test' is registered"):
        register_output(FlatFolder)
    with pytest.raises(PipelineError, match="is not an Output class"):
        register_output(dict)

    class Nameless(Output):
        pass

    with pytest.raises(PipelineError, match="Nameless has no format name"):
        register_output(Nameless)


def test_a_format_of_ones_own_is_written_by_the_command_line(flat, tmp_path, capsys):
    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        d = f.create_dataset("traces", data=recording().read(scaled=False).T)
        d.attrs["fs"] = FS
    assert cli.main(["preprocess", str(src), str(tmp_path / "flat"), "--format", "flat-test",
                     "--whiten", "global", "--quiet"]) == 0
    h5 = Pipeline.from_options(whiten="global").run(str(src), tmp_path / "o.h5",
                                                    progress=False)
    assert np.array_equal(flat_traces(tmp_path / "flat"), h5_traces(h5))
    assert sorted(os.listdir(tmp_path / "flat")) == ["fitted.h5", "traces.f32"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["preprocess", "--help"])
    assert "flat-test: a flat float32 folder" in " ".join(capsys.readouterr().out.split())


# -- one lifecycle, for an output the runner never heard of ----------------------------------------
def test_the_lifecycle_runs_a_new_format_as_it_runs_the_others(flat, tmp_path, monkeypatch):
    rec = recording()
    whole = Pipeline.from_options(whiten="global").run(rec, tmp_path / "whole", chunk_s=0.05,
                                                       format="flat-test", progress=False)
    assert np.array_equal(flat_traces(whole), h5_traces(Pipeline.from_options(
        whiten="global").run(rec, tmp_path / "o.h5", chunk_s=0.05, progress=False)))
    # refused before any work, by the one check, in the format's words
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("keep")
    with pytest.raises(PipelineError, match=r"holds files dspk did not write \(notes.txt\)"):
        Pipeline.from_options(whiten="global").run(rec, tmp_path / "theirs",
                                                   format="flat-test", overwrite=True)
    with pytest.raises(PipelineError, match="layout: format='flat-test' writes \\[samples, "
                                            "channels\\] as numpy reads it"):
        Pipeline.from_options(whiten="global").run(rec, tmp_path / "x", format="flat-test",
                                                   layout="channels_samples")
    with pytest.raises(PipelineError, match="detect: format='flat-test' holds the traces only"):
        Pipeline.from_options(whiten="global", detect=True).run(rec, tmp_path / "x",
                                                                format="flat-test")
    # interrupted: the partial folder and its progress record are kept
    def stop(done):
        if done >= 2500:
            raise KeyboardInterrupt

    out = tmp_path / "flat"
    with pytest.raises(JobInterrupted, match="flat.partial is kept"):
        Pipeline.from_options(whiten="global").run(rec, out, chunk_s=0.05, format="flat-test",
                                                   progress=False, on_chunk=stop)
    record = json.loads((tmp_path / "flat.partial" / "progress.json").read_text())
    assert record["done"] == 3000 and not out.exists()
    # resumed from there with the fitted state stored in it (nothing refitted), committed
    monkeypatch.setattr(Pipeline, "fit", lambda *a, **k: pytest.fail("refitted on resume"))
    seen = []
    job = Job(Pipeline.from_options(whiten="global"), rec, FlatFolder(out), chunk_s=0.05)
    assert job.run(resume=True, progress=False, on_chunk=seen.append) == out
    assert job.output.written[0] == (3000, 4500) and seen == [4500, 6000]
    assert not (tmp_path / "flat.partial").exists()
    assert flat_traces(out).tobytes() == flat_traces(whole).tobytes()


def test_a_failure_a_resume_cannot_pass_leaves_nothing(flat, tmp_path):
    def damaged(done):
        raise ValueError("a damaged sample")

    with pytest.raises(ValueError, match="damaged"):
        Pipeline.from_options(whiten="global").run(recording(), tmp_path / "flat",
                                                   chunk_s=0.05, format="flat-test",
                                                   progress=False, on_chunk=damaged)
    assert os.listdir(tmp_path) == []


def test_an_output_written_in_one_go_says_nothing_was_kept(tmp_path):
    class OneGo(FlatFolder):
        format, resumes, summary = "one-go-test", False, None

    register_output(OneGo)
    try:
        def stop(done):
            raise KeyboardInterrupt

        with pytest.raises(JobInterrupted, match="one.flat is written in one go: nothing "
                                                 "was kept"):
            Pipeline.from_options(whiten="global").run(recording(), tmp_path / "one.flat",
                                                       format="one-go-test", progress=False,
                                                       on_chunk=stop)
        assert os.listdir(tmp_path) == []
        with pytest.raises(PipelineError, match="resume: format='one-go-test' is written in "
                                                "one go"):
            Pipeline.from_options(whiten="global").run(recording(), tmp_path / "one.flat",
                                                       format="one-go-test", resume=True)
    finally:
        unregister_output(OneGo.format)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 4000), chunk=st.integers(40, 600), stop=st.integers(1, 4),
       fitted=st.booleans())
def test_any_chunking_stopped_anywhere_resumes_to_the_whole_jobs_bytes(flat, tmp_path_factory,
                                                                       n, chunk, stop, fitted):
    """Chunks in order, each once, tiling [0, n) from wherever the job starts or resumes; an
    interruption after any chunk keeps exactly the chunks recorded; the resumed output is the
    uninterrupted job's, byte for byte (and the HDF5 output's samples)."""
    folder = tmp_path_factory.mktemp("flat")
    rec = recording(n=n, seed=n)
    options = dict(chunk_s=chunk / FS, format="flat-test", progress=False)
    p = Pipeline.from_options(highpass=None, whiten="global")
    whole = p.run(rec, folder / "whole", **options)
    h5 = p.run(rec, folder / "o.h5", chunk_s=chunk / FS, progress=False)
    assert np.array_equal(flat_traces(whole), h5_traces(h5))
    halt = min(n, stop * chunk)
    calls = []

    def interrupt(done):
        calls.append(done)
        if done >= halt and done < n:
            raise KeyboardInterrupt

    out = folder / "flat"
    first = FlatFolder(out)
    try:
        Pipeline.from_options(highpass=None, whiten="global").run(
            rec, first, on_chunk=interrupt, **{k: v for k, v in options.items()
                                               if k != "format"})
        assert halt == n                                   # not stopped: nothing to resume
        event("ran through")
        assert first.written == [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
    except JobInterrupted as stopped:
        event("interrupted, resumed")
        assert stopped.kept and stopped.done == calls[-1] >= halt
        assert json.loads((folder / "flat.partial" / "progress.json").read_text())["done"] \
            == stopped.done
        again = FlatFolder(out)
        resumed = Pipeline.from_options(highpass=None, whiten="global")
        if fitted:                         # a fitted pipeline: its own state, checked
            resumed = resumed.fit(rec)
        resumed.run(rec, again, resume=True, **{k: v for k, v in options.items()
                                                if k != "format"})
        assert again.written == [(s, min(n, s + chunk))
                                 for s in range(stopped.done, n, chunk)]
    assert flat_traces(out).tobytes() == flat_traces(whole).tobytes()
    assert sorted(os.listdir(folder)) == ["flat", "o.h5", "whole"]


# -- describe --------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [dict(), dict(output_dtype=np.int16, whiten="none"),
                                     dict(layout="channels_samples", detect=True,
                                          output_dtype=np.int16)],
                         ids=["whitened-float32", "uv-int16", "channels-first-detect"])
def test_describe_reads_back_what_an_hdf5_output_holds(tmp_path, options):
    rec = recording(c=8)
    rec.channel_ids = np.array([f"ch{k}" for k in range(8)])
    rec.shank_ids = np.repeat([0, 1], 4)
    pipe = {k: options.pop(k) for k in ("whiten", "detect") if k in options}
    p = Pipeline.from_options(**{"whiten": "local", "n_neighbors": 4, **pipe})
    out = p.run(rec, tmp_path / "o.h5", chunk_s=0.05, progress=False, **options)
    about = describe(out)
    whitened = pipe.get("whiten", "local") != "none"
    int16 = options.get("output_dtype") == np.int16
    assert about["format"] == "hdf5" and about["path"] == str(out)
    assert about["steps"] == [s["step"] for s in p.options()] and about["pipeline"] == \
        p.options()
    assert (about["fs"], about["n_samples"], about["n_channels"]) == (FS, 6000, 8)
    assert about["dtype"] == (np.int16 if int16 else np.float32)
    assert about["layout"] == options.get("layout", "samples_channels")
    assert about["scale"] == ((0.01 if whitened else 0.1) if int16 else 1.0)
    assert about["units"] == ("whitened (noise SD)" if whitened else "uV")
    assert about["channel_ids"].tolist() == [f"ch{k}" for k in range(8)]
    assert about["shank_ids"].tolist() == rec.shank_ids.tolist()
    assert np.array_equal(about["geometry"], rec.geometry)
    assert about["job"]["fingerprint"] == p.fingerprint()
    if whitened:
        k = [s["step"] for s in p.options()].index("Whiten")
        assert np.array_equal(about["fitted"][f"step{k}_Whiten"]["W"], p.states[k]["W"])
    assert describe(out, fitted=False)["fitted"] is None


def test_describe_reads_back_a_kilosort_folder(tmp_path):
    rec = recording(c=8)
    rec.shank_ids = np.repeat([0, 1], 4)
    p = Pipeline.from_options(whiten="local", n_neighbors=4, bad_channels="2")
    out = p.run(rec, tmp_path / "ks", progress=False, format="kilosort")
    about = describe(out)
    assert (about["format"], about["binary"], about["offset"], about["dtype"]) == \
        ("kilosort", "traces.bin", 0, np.dtype(np.int16))
    assert (about["scale"], about["units"], about["dspk"]) == \
        (1 / 200, "whitened (noise SD)", dspk.__version__)
    assert about["steps"] == ["HighPass", "BadChannels", "Reference", "Whiten"]
    assert np.array_equal(about["geometry"], rec.geometry)
    assert about["shank_ids"].tolist() == rec.shank_ids.tolist()
    assert about["channel_ids"].tolist() == list(range(8))
    assert about["fitted"]["step1_BadChannels"]["labels"][2] != 0     # given
    assert about["job"]["fingerprint"] == p.fingerprint()


def test_describe_refuses_what_dspk_did_not_write(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.h5: no such file"):
        describe(tmp_path / "missing.h5")
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(RecordingError, match="text.h5 is not an HDF5 file"):
        describe(tmp_path / "text.h5")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("traces", data=np.zeros((100, 2), np.float32)).attrs["fs"] = FS
    with pytest.raises(RecordingError, match="other.h5 is not a dspk output"):
        describe(tmp_path / "other.h5")


def test_describe_gives_an_older_outputs_ids_and_units_from_its_steps(tmp_path):
    out = Pipeline.from_options(whiten="global").run(recording(), tmp_path / "o.h5",
                                                     progress=False)
    with h5py.File(out, "a") as f:              # what dspk wrote before ids and units
        del f["channel_ids"]
        del f["traces"].attrs["units"]
    about = describe(out)
    assert about["channel_ids"].tolist() == [0, 1, 2, 3]
    assert about["units"] == "whitened (noise SD)"


# -- what the members add to the one check ---------------------------------------------------------
def test_a_peaks_folder_holding_the_input_is_refused_now_too(tmp_path):
    raw = tmp_path / "peaks" / "raw.bin"
    raw.parent.mkdir()
    recording().read(scaled=False).T.tofile(raw)
    rec = dspk.open_recording(raw, n_channels=4, fs=FS,
                              geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)])
    with pytest.raises(PipelineError, match="is or holds a file of the input"):
        Pipeline.from_options(whiten="global", detect=True).run(
            rec, raw.parent, format="peaks", overwrite=True, progress=False)
    assert os.listdir(raw.parent) == ["raw.bin"]


def test_an_output_that_lies_somewhere_needs_its_name(tmp_path):
    with pytest.raises(PipelineError, match="out_path: format='hdf5' writes a file: name it"):
        Pipeline.from_options(whiten="global").run(recording(), None)
    peaks, _ = detect_peaks(Pipeline.from_options(whiten="global", detect=True),
                            recording(n=30000))
    assert peaks.dtype == dspk.detect.PEAK_DTYPE and os.listdir(tmp_path) == []


def test_a_span_is_checked_against_the_recording_before_any_work(tmp_path):
    rec = recording()
    p = Pipeline.from_options(whiten="global").fit(rec)
    with pytest.raises(ValueError, match="s0, s1: expected 0 <= s0 <= s1 <= 6000, got 0, 7000"):
        p.run_span(rec, tmp_path / "none.h5", 0, 0, 7000)
    assert os.listdir(tmp_path) == []
