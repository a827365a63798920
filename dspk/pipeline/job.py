"""A `Job`: one run of a pipeline over a recording — its span, its output (checked before any
work, written as ``OUT.partial``, committed when complete), its resume record, its progress
and what happens when it is interrupted. `Pipeline.run`, `Pipeline.run_span`,
`Pipeline.tune` and every writer of `dspk.dask` run their pipelines through it.

A job reports each chunk it has committed through its ``on_chunk`` callback
(``on_chunk(samples_done)``), after the chunk's data is flushed and the resume record written:
a callback that ends the process there (as a kill would) leaves a partial output that a
resumed job completes. A job interrupted by Ctrl-C raises `JobInterrupted` (a
`KeyboardInterrupt`) saying where it stopped and how to continue.

Examples
--------
>>> import os, tempfile
>>> import numpy as np, dspk
>>> from dspk.pipeline import Job
>>> tmp = tempfile.TemporaryDirectory()
>>> rec = dspk.open_recording(np.random.default_rng(0).standard_normal((4, 9000)), fs=3e4)
>>> p = dspk.Pipeline.from_options(whiten="global")
>>> job = Job(p, rec, os.path.join(tmp.name, "o.h5"), chunk_s=0.1)
>>> job.run(progress=False).name, job.timing["samples"]
('o.h5', 9000)
>>> tmp.cleanup()
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..argnames import arg
from ..io import Recording, open_recording
from ..io.hdf5 import h5py_module
from ..io.rawio import RawDatasetWriter, create_contiguous, new_file, raw_offset
from .errors import PipelineError
from .output import (PartialOutput, TraceOutput, check_output, check_output_options,
                     UNITS_UV, UNITS_WHITENED, chunk_samples, int16_scale, job_record,
                     write_metadata, write_traces)
from .prepared import PreparedPipeline
from .stage import Context
from .stream import ChunkStream, Staging, ahead, output_block, raw_transfer, read_block

# Job and JobInterrupted are documented where they are imported from: dspk.pipeline
__all__ = ["opened", "raw_transfer", "resumable", "progress_bar", "OnChunk"]

log = logging.getLogger("dspk.pipeline")

#: ``on_chunk(samples_done)``: called after each chunk is committed
OnChunk = Callable[[int], Any]


@contextmanager
def opened(recording: Recording | str | os.PathLike,
           **open_options: Any) -> Iterator[Recording]:
    """The recording, opened with `dspk.open_recording` when given a path (and closed at the
    end of the block, whether it completes or fails); a `Recording` passed in is used as it
    is and left open.

    Parameters
    ----------
    recording : Recording or path
    **open_options
        `dspk.open_recording` keywords, for a path.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.job import opened
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
    >>> with opened(rec) as r:
    ...     r is rec
    True
    >>> rec.closed
    False
    """
    if not isinstance(recording, (str, os.PathLike)):
        yield recording
        return
    with open_recording(recording, **open_options) as rec:
        yield rec


def resumable(exc: BaseException) -> bool:
    """Whether a job stopped by ``exc`` could get further when resumed: an interruption, or an
    OSError (a full disk, a lost mount) or MemoryError that need not happen again — not an
    error of the input's samples or of the pipeline, which would stop it at the same place.

    Parameters
    ----------
    exc : BaseException

    Examples
    --------
    >>> from dspk.pipeline.job import resumable
    >>> resumable(KeyboardInterrupt()), resumable(ValueError("a NaN sample"))
    (True, False)
    """
    return isinstance(exc, (KeyboardInterrupt, SystemExit, OSError, MemoryError))


class JobInterrupted(KeyboardInterrupt):
    """A job stopped by Ctrl-C (or SIGTERM, on the command line): where it stopped, and
    whether its partial output was kept for a resume.

    Parameters
    ----------
    out : pathlib.Path
        The output the job was writing.
    done, total : int
        Samples committed, and the recording's.
    fs : float
        The sampling rate.
    kept : bool
        Whether ``OUT.partial`` was kept (a chunk had been committed).

    Examples
    --------
    >>> from pathlib import Path
    >>> from dspk.pipeline import JobInterrupted
    >>> print(JobInterrupted(Path("o.h5"), 60000, 90000, 30000.0, kept=True))
    ... # doctest: +NORMALIZE_WHITESPACE
    interrupted at 2.0 s of 3.0 s of the recording (sample 60000 of 90000); o.h5.partial is
    kept: run the same job again with resume=True to continue it
    """

    def __init__(self, out: Path, done: int, total: int, fs: float, kept: bool) -> None:
        self.out, self.done, self.total, self.fs, self.kept = out, done, total, fs, kept
        where = (f"interrupted at {done / fs:.1f} s of {total / fs:.1f} s of the recording "
                 f"(sample {done} of {total})")
        if kept:
            msg = (f"{where}; {PartialOutput(out).partial} is kept: run the same job again "
                   f"with {arg('resume', True)} to continue it")
        else:
            msg = f"{where}, before any chunk was written: nothing was kept to resume"
        super().__init__(msg)


class Job:
    """One run of a pipeline over a recording into an output.

    Constructing it checks everything that can be checked before any work: the output (not
    any file of the input, a regular file, not an existing one without ``overwrite``, a
    writable folder), the output options, and what the pipeline's stages need of the
    recording. A job never changes its pipeline, except to fit an unfitted one when it runs
    (`Pipeline.fit`, or the fitted state of the partial output it resumes; a pipeline with
    nothing to fit records the recording's rate, as `fit` would).

    Parameters
    ----------
    pipeline : Pipeline
    recording : Recording
    out : path, optional
        The output file; None for a job that writes spans into a file prepared by another
        (`run_span`).
    chunk_s : float
        Chunk length in seconds (the output does not depend on it).
    output_dtype : float32 or int16
    output_scale : float, optional
        The units of one int16 step (default: 0.01 whitened, else 0.1 µV).
    layout : {"samples_channels", "channels_samples"}
    compression : None, "gzip" or "lzf"
    overwrite : bool
        Replace an existing output (never a file of the input).

    Attributes
    ----------
    files : PartialOutput or None
        The output, its partial file and resume record.
    timing : dict
        After a run: seconds reading (summed over threads), computing, writing, moving to and
        from the device, decompressing, the wall time, samples and × real time.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline import Job
    >>> rec = dspk.open_recording(np.zeros((3000, 4), np.int16), fs=30000.0)
    >>> Job(dspk.Pipeline.from_options(), rec, "out.h5")        # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: whiten='local' needs the recording's geometry ...
    """

    def __init__(self, pipeline: Any, recording: Recording, out: str | os.PathLike | None = None,
                 *, chunk_s: float = 1.0, output_dtype: Any = np.float32,
                 output_scale: float | None = None, layout: str = "samples_channels",
                 compression: str | None = None, overwrite: bool = False) -> None:
        # every check before any work: nothing fitted, no file created when one fails
        self.files = None if out is None else \
            PartialOutput(check_output(out, recording, overwrite))
        self.out_dtype = check_output_options(output_dtype, layout, compression, chunk_s)
        pipeline.check(recording)
        self.pipeline, self.rec = pipeline, recording
        self.layout, self.compression = layout, compression
        self.scale = int16_scale(self.out_dtype, output_scale, pipeline.whitens)
        self.units = UNITS_WHITENED if pipeline.whitens else UNITS_UV
        self.chunk = chunk_samples(chunk_s, recording.fs)
        self.xp = pipeline.xp
        self.staged = raw_transfer(recording, self.xp)
        self.timing: dict = {}
        self.done = 0

    # -- what the job is -----------------------------------------------------------------------
    def record(self, states: list) -> dict:
        """The job's record with these fitted states (`dspk.pipeline.output.job_record`)."""
        return job_record(self.pipeline.fingerprint(states), self.rec, self.chunk,
                          self.out_dtype, self.scale, self.layout, self.compression)

    def fitted_states(self) -> list:
        """The pipeline's fitted states, fitting it first when it has not been fitted: `fit`
        when a stage needs fitting; a pipeline with nothing left to fit and no rate yet
        takes the recording's (what `fit` would record) — never another change.

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Job
        >>> rec = dspk.open_recording(np.ones((3000, 2), np.float32), fs=3e4)
        >>> sorted(Job(dspk.Pipeline.from_options(whiten="global"), rec).fitted_states()[-1])
        ['W']
        """
        p = self.pipeline
        if not p.is_fitted:
            p.fit(self.rec)
        elif p.fs is None:
            p.fs = float(self.rec.fs)
        return [dict(st) for st in p.states]

    # -- the whole job -------------------------------------------------------------------------
    def run(self, resume: bool = False, progress: bool = True,
            on_chunk: OnChunk | None = None) -> Path:
        """Fit (when needed), write every chunk to ``OUT.partial``, commit it as ``OUT``.

        Parameters
        ----------
        resume : bool
            Continue the partial output of a killed run of this job (see `Pipeline.run`).
        progress : bool
            A progress bar (tqdm).
        on_chunk : callable, optional
            ``on_chunk(samples_done)`` after each committed chunk.

        Returns
        -------
        pathlib.Path
            The completed output.
        """
        files, rec, n = self.files, self.rec, self.rec.n_samples
        if files is None:
            raise PipelineError("run: the job has no output (give out=)")
        done, rows, stored = self._resume_point() if resume else (0, {}, None)
        if not resume and files.partial.exists():
            log.warning("%s: discarding the partial output of an earlier job (resume=True, "
                        "--resume on the command line, continues it instead)", files.partial)
        if stored is not None and not self.pipeline.is_fitted:
            for k, st in enumerate(stored):       # the fit the partial output was made with
                self.pipeline.set_fitted(k, st)
            log.info("%s: resuming at sample %d with the fitted state stored there",
                     files.partial, done)
        states = self.fitted_states()
        job = self.record(states)
        if done == 0:
            files.discard()
        f, done, rows = self._open_partial(done, rows)
        self.done = done
        decompress0 = rec.decompress_s
        bar = progress_bar(progress, n, done, rec.fs)
        t0 = time.perf_counter()
        # an interruption or an OSError (a full disk, say) may pass on a resume: the partial
        # file is kept for it (when a chunk was recorded as written); anything else (a
        # non-finite or damaged input sample, ...) would stop the resumed job at the same
        # place: no partial file is left behind
        try:
            with files.writing(keep=lambda exc: resumable(exc) and files.progress.exists()):
                try:
                    with f:
                        self._write_all(f, states, job, rows, bar, on_chunk)
                finally:
                    if bar is not None:
                        bar.close()
        except KeyboardInterrupt as exc:
            raise JobInterrupted(files.out, self.done, n, rec.fs,
                                 files.partial.exists()) from exc
        self._finish(t0, n - done, rec.decompress_s - decompress0)
        log.info("%s: %d samples in %.2f s (%.1f x real time; read %.2f s, compute %.2f s, "
                 "write %.2f s, overlapped)", files.out, n - done, self.timing["wall_s"],
                 self.timing["x_real_time"], self.timing["read_s"], self.timing["compute_s"],
                 self.timing["write_s"])
        return files.out

    def _resume_point(self) -> tuple:
        """(samples done, rows written per table, fitted states or None) of the partial job
        that this job continues, or (0, {}, None) to start over (said in the log). The
        fitted state is the pipeline's when it is fitted, else the one stored in the partial
        file; the partial job's record, fingerprint included, must be the one this job
        makes with it."""
        files = self.files
        partial = files.partial
        if not partial.exists():
            log.warning("%s: nothing to resume (no partial output of an earlier job); the "
                        "job starts from the beginning", partial)
            return 0, {}, None
        if not files.progress.exists():
            log.warning("%s: no progress record next to it; starting over", partial)
            return 0, {}, None
        try:
            record = files.read_record()
            p = self.pipeline
            states = p.states if p.is_fitted else p.read_fitted(partial)
            job = self.record(states)
            if {k: record.get(k) for k in job} != job or \
                    not all(s.is_fitted(st) for s, st in zip(p.steps, states)):
                log.warning("%s: a partial job with other parameters; starting over", partial)
                return 0, {}, None
            done, rows = int(record["done"]), dict(record.get("rows", {}))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: unreadable partial job (%s); starting over", partial, exc)
            return 0, {}, None
        return done, rows, None if p.is_fitted else states

    def _open_partial(self, done: int, rows: dict) -> tuple:
        """(open h5py file, samples done, rows written): the partial file reopened to
        continue at ``done``, or a new one (``done`` 0, or a partial file that cannot be
        reopened: then the job starts over)."""
        files = self.files
        try:
            f = h5py_module().File(files.partial, "a") if done else new_file(files.partial)
            if done and "traces" not in f:
                f.close()
                raise OSError("no traces dataset")
        except OSError:
            log.warning("%s: cannot be reopened; starting over", files.partial)
            files.discard()
            return new_file(files.partial), 0, {}
        return f, done, rows

    def _write_all(self, f: Any, states: list, job: dict, rows: dict, bar: Any,
                   on_chunk: OnChunk | None) -> None:
        """The job's datasets (made when nothing is done yet) and its chunks from
        `done` on, into the open partial file ``f``."""
        rec, files, p = self.rec, self.files, self.pipeline
        n, c = rec.n_samples, rec.n_channels
        if self.done == 0:
            TraceOutput.create_traces(f, (n, c) if self.layout == "samples_channels" else
                                      (c, n), self.out_dtype, self.layout, self.chunk,
                                      self.compression)
            write_metadata(f, rec, job, p.options(), self.units)
            p.write_fitted(f, rec.fs, states)    # a resumed job reads it back (read_fitted)
        output = TraceOutput(f, files.partial, self.layout, transposed=self.staged)
        counts = dict(rows)

        def write(s0: int, s1: int, y: np.ndarray, sink_rows: list) -> None:
            output.write(s0, s1, y)
            counts.update(output.append(sink_rows))
            f.flush()
            files.record(job, s1, counts)        # committed: a resume starts after s1
            self.done = s1
            if on_chunk is not None:
                on_chunk(s1)
            if bar is not None:
                bar.update(s1 - s0)

        try:
            self._loop(states, range(self.done, n, self.chunk), n, write,
                       lambda run: output.open_tables(run.tables(), rows))
        finally:
            output.close()

    # -- spans ---------------------------------------------------------------------------------
    def allocate(self) -> int:
        """Create ``OUT.partial`` for spans written by several processes (`run_span`):
        contiguous, allocated ``/traces`` with the metadata and fitted state of `run`'s
        output (the same file once every span is in; `commit` names it). Fits an unfitted
        pipeline first. Returns the byte offset of the traces' samples.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Job
        >>> tmp = tempfile.TemporaryDirectory()
        >>> rec = dspk.open_recording(np.ones((3000, 2), np.float32), fs=3e4)
        >>> job = Job(dspk.Pipeline.from_options(whiten=None, reference="mean"), rec,
        ...           os.path.join(tmp.name, "o.h5"), chunk_s=0.05)
        >>> offset = job.allocate()
        >>> _ = dspk.Pipeline.from_options(whiten=None, reference="mean").run_span(
        ...     rec, job.files.partial, offset, 0, 3000, chunk_s=0.05)
        >>> job.commit().name
        'o.h5'
        >>> tmp.cleanup()
        """
        if self.files is None:
            raise PipelineError("allocate: the job has no output (give out=)")
        if self.pipeline.sinks:
            raise PipelineError("spans write traces only; the Detect step writes spikes: "
                                "use Pipeline.run (preprocess_many on a cluster)")
        states = self.fitted_states()
        rec, files = self.rec, self.files
        n, c = rec.n_samples, rec.n_channels
        files.discard()
        with new_file(files.partial) as f:
            shape = (n, c) if self.layout == "samples_channels" else (c, n)
            dset = create_contiguous(f, "traces", shape, self.out_dtype)
            write_metadata(f, rec, self.record(states), self.pipeline.options(), self.units)
            self.pipeline.write_fitted(f, rec.fs, states)
            return raw_offset(dset)

    def commit(self) -> Path:
        """Name the output of `allocate` when every span is in."""
        return self.files.commit()

    def run_span(self, path: str | os.PathLike, offset: int, s0: int, s1: int,
                 on_chunk: OnChunk | None = None) -> dict:
        """Samples [s0, s1) into the traces of a file prepared by `allocate` (``path``,
        contiguous at byte ``offset``), through ``os.pwrite``: no HDF5 here, so several
        processes fill disjoint spans at once. The pipeline must be fitted (every span the
        same W) and write no sinks.

        Parameters
        ----------
        path : path
        offset : int
        s0, s1 : int
        on_chunk : callable, optional
            ``on_chunk(samples_done)`` with the samples of the span done so far.

        Returns
        -------
        dict
            The span's timings (seconds) and its samples.
        """
        t0 = time.perf_counter()
        p, rec = self.pipeline, self.rec
        if p.sinks:
            raise PipelineError("run_span: the Detect step writes spikes; use run")
        if not p.is_fitted:
            raise PipelineError("run_span: fit the pipeline first (every span must use one W)")
        n, c = rec.n_samples, rec.n_channels
        if not 0 <= s0 <= s1 <= n:
            raise ValueError(f"s0, s1: expected 0 <= s0 <= s1 <= {n}, got {s0}, {s1}")
        shape = (n, c) if self.layout == "samples_channels" else (c, n)
        raw_out = RawDatasetWriter(str(path), offset=offset, shape=shape, dtype=self.out_dtype)
        setup = time.perf_counter() - t0

        def write(a: int, b: int, y: np.ndarray, sink_rows: list) -> None:
            write_traces(raw_out, None, a, b, y, self.layout, self.staged)
            if on_chunk is not None:
                on_chunk(b - s0)

        try:
            self._loop([dict(st) for st in p.states], range(s0, s1, self.chunk), s1, write)
        finally:
            raw_out.close()
        return {**{k: self.timing[k] for k in ("read_s", "compute_s", "write_s")},
                "setup_s": setup, "wall_s": time.perf_counter() - t0, "samples": s1 - s0}

    def rehearse(self) -> None:
        """A full chunk and the last, shorter one through every stage, as a job computes
        them (the same shapes: the same tuner decisions), writing nothing (`Pipeline.tune`).

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Job
        >>> rec = dspk.open_recording(np.ones((3000, 2), np.float32), fs=3e4)
        >>> Job(dspk.Pipeline.from_options(whiten=None), rec, chunk_s=0.04).rehearse()
        """
        rec, p = self.rec, self.pipeline
        n, fs = rec.n_samples, rec.fs
        chunk = min(n, self.chunk)
        last = n - (n - 1) // chunk * chunk
        run = p.prepare(Context.of(rec, self.xp, p.dtype))
        m = p.margin(fs)
        for s0, s1 in sorted({(0, chunk), (n - last, n)}):
            run.rows(run.compute(read_block(rec, s0, s1, m), s0, s1, m), s0, s1, m)

    # -- the chunk loop --------------------------------------------------------------------------
    def _loop(self, states: list, starts: range, end: int,
              write: Callable[[int, int, np.ndarray, list], None],
              opened_run: Callable[[Any], None] | None = None) -> None:
        """The chunks starting at ``starts`` (each to ``min(end, s0 + chunk)``) computed with
        the pipeline prepared once for this job, and written in order by ``write(s0, s1,
        block, sink rows)`` on the writer thread, reading ahead and writing behind
        (`dspk.pipeline.stream.ChunkStream`). Fills `timing`."""
        rec, p, xp = self.rec, self.pipeline, self.xp
        run = PreparedPipeline(p.steps, states, Context.of(rec, xp, p.dtype))
        if opened_run is not None:
            opened_run(run)
        m = p.margin(rec.fs)
        staging = Staging(rec, self.chunk + 2 * m, ahead(rec) + 2,
                          (min(rec.n_samples, self.chunk), rec.n_channels), self.out_dtype,
                          self.layout) if self.staged else None
        stream = ChunkStream(rec, self.chunk, m, staging, xp)
        timing = stream.timing

        def compute(i: int, raw: tuple, s0: int, s1: int) -> tuple:
            full = run.compute(stream.to_device(raw), s0, s1, m)
            sink_rows = run.rows(full, s0, s1, m)
            y = output_block(i, full[:, m:m + (s1 - s0)], staging, self.out_dtype, self.scale)
            return y, sink_rows

        def timed_write(s0: int, s1: int, result: tuple) -> None:
            t = time.perf_counter()
            write(s0, s1, *result)
            timing["write_s"] += time.perf_counter() - t

        try:
            stream.run(list(starts), end, compute, timed_write)
        finally:
            transfer = staging.transfer_s if staging is not None else 0.0
            self.timing = {**timing, "compute_s": timing["compute_s"] - transfer,
                           "transfer_s": transfer, "events": list(stream.events)}

    def _finish(self, t0: float, samples: int, decompress_s: float) -> None:
        dt = time.perf_counter() - t0
        self.timing.update(decompress_s=decompress_s, wall_s=dt, samples=samples,
                           x_real_time=samples / self.rec.fs / max(dt, 1e-9))


# -- progress ------------------------------------------------------------------------------------
class _Progress:
    """A tqdm bar counted in seconds of recording, so its rate reads as × real time."""

    def __init__(self, total: int, done: int, fs: float) -> None:
        from tqdm import tqdm  # noqa: PLC0415 (tqdm is imported by the jobs that show a bar)

        self.fs = fs
        self.bar = tqdm(total=round(total / fs, 3), initial=round(done / fs, 3),
                        unit="s", desc="dspk preprocess",
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s of "
                                   "recording [{elapsed}<{remaining}, {rate_fmt}: x real time]")

    def update(self, samples: int) -> None:
        self.bar.update(samples / self.fs)

    def close(self) -> None:
        self.bar.close()


def progress_bar(enabled: bool, total: int, done: int, fs: float) -> Any:
    """A progress bar with ``update(samples)`` and ``close()``, counted in seconds of
    recording (its rate reads as × real time); None when not ``enabled`` or tqdm is not
    installed.

    Parameters
    ----------
    enabled : bool
    total, done : int
        Samples of the job, and done before it starts (a resumed job).
    fs : float
        The sampling rate in Hz.

    Examples
    --------
    >>> from dspk.pipeline.job import progress_bar
    >>> progress_bar(False, 30000, 0, 30000.0) is None
    True
    """
    if not enabled:
        return None
    try:
        return _Progress(total, done, fs)
    except ImportError:
        return None
