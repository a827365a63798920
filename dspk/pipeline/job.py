"""A `Job`: one run of a pipeline over a recording into an output (`dspk.pipeline.outputs`),
and the one lifecycle every output goes through — the output checked before any work, the
partial output of a killed job found and its fitted state adopted (or the pipeline fitted),
the output begun, every chunk computed and written on the writer thread in order, the
progress recorded after each, and the output committed — or, interrupted, its partial kept
for a resume when a resume could get past the error. `Pipeline.run`, `Pipeline.run_span`,
`Pipeline.tune`, `detect_peaks` and every writer of `dspk.dask` run their pipelines through
it.

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

from ..argnames import arg
from ..io import Recording, open_recording
from .checksum import CHECKSUM, PendingChecksum, block_checksum, committed_blocks
from .flush import EarlyFlush, early_flush_default
from .errors import PipelineError
from .lock import OutputLock
from .outputs import (HDF5Output, Output, PartialOutput, SpanOutput, check_output_options,
                      chunk_samples, int16_scale)
from .outputs.base import read_files
from .prepared import PreparedPipeline
from .record import UNITS_UV, UNITS_WHITENED, job_record
from .stage import Context
from .stream import (ChunkStream, GpuMemory, Staging, ahead, output_block, raw_transfer,
                     read_block)

# Job and JobInterrupted are documented where they are imported from: dspk.pipeline
# (PartialOutput is importable here as before: its home is dspk.pipeline.outputs)
__all__ = ["opened", "raw_transfer", "resumable", "progress_bar", "OnChunk", "step_files",
           "fsync_default"]

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


def fsync_default() -> bool:
    """Whether a job flushes its output to the disk before naming it when not told
    (``fsync=None``): yes, unless ``DSPK_FSYNC`` is ``0``, ``off``, ``false`` or ``no`` (a
    test suite's scratch outputs, say).

    Examples
    --------
    >>> import os
    >>> from dspk.pipeline.job import fsync_default
    >>> fsync_default() == (os.environ.get("DSPK_FSYNC", "on").lower()
    ...                     not in ("0", "off", "false", "no"))
    True
    """
    return os.environ.get("DSPK_FSYNC", "on").strip().lower() not in ("0", "off", "false",
                                                                        "no")


def step_files(pipeline: Any) -> dict:
    """The files the pipeline's steps read, by the step field that names them
    (``{"RemoveArtifacts.triggers": ["stim.csv"]}``): a field whose value is a path to an
    existing file. A job's output is never one of them.

    Parameters
    ----------
    pipeline : Pipeline

    Examples
    --------
    >>> import dspk
    >>> from dspk.pipeline.job import step_files
    >>> step_files(dspk.Pipeline.from_options(whiten="global"))
    {}
    """
    found: dict = {}
    for step in getattr(pipeline, "steps", ()):
        fields = getattr(step, "__dataclass_fields__", None)
        for name in fields or ():
            value = getattr(step, name, None)
            values = value if isinstance(value, (list, tuple)) else [value]
            paths = [v for v in values if isinstance(v, os.PathLike) or
                     (isinstance(v, str) and 0 < len(v) < 4096 and os.path.isfile(v))]
            if paths:
                found[f"{type(step).__name__}.{name}"] = paths
    return found


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
    resumes : bool
        Whether the output could be resumed at all (else it is written in one go).

    Examples
    --------
    >>> from pathlib import Path
    >>> from dspk.pipeline import JobInterrupted
    >>> print(JobInterrupted(Path("o.h5"), 60000, 90000, 30000.0, kept=True))
    ... # doctest: +NORMALIZE_WHITESPACE
    interrupted at 2.0 s of 3.0 s of the recording (sample 60000 of 90000); o.h5.partial is
    kept: run the same job again with resume=True to continue it
    """

    def __init__(self, out: Path, done: int, total: int, fs: float, kept: bool,
                 resumes: bool = True) -> None:
        self.out, self.done, self.total, self.fs, self.kept = out, done, total, fs, kept
        where = (f"interrupted at {done / fs:.1f} s of {total / fs:.1f} s of the recording "
                 f"(sample {done} of {total})")
        if kept:
            msg = (f"{where}; {PartialOutput(out).partial} is kept: run the same job again "
                   f"with {arg('resume', True)} to continue it")
        elif not resumes:
            msg = f"{where}; {out} is written in one go: nothing was kept"
        else:
            msg = f"{where}, before any chunk was written: nothing was kept to resume"
        super().__init__(msg)


class Job:
    """One run of a pipeline over a recording into an output.

    Constructing it checks everything that can be checked before any work: the output
    (`dspk.pipeline.outputs.Output.check`: not any file of the input, a regular file or a
    folder of its own, not an existing one without ``overwrite``, a writable folder; and
    the options its format refuses), the output options, and what the pipeline's stages need
    of the recording. A job never changes its pipeline, except to fit an unfitted one when
    it runs (`Pipeline.fit`, or the fitted state of the partial output it resumes; a pipeline
    with nothing to fit records the recording's rate, as `fit` would).

    Parameters
    ----------
    pipeline : Pipeline
    recording : Recording
    out : path or Output, optional
        The output: a path is an HDF5 output file (`dspk.pipeline.outputs.HDF5Output`);
        None for a job that only rehearses (`Pipeline.tune`) or writes spans into a file
        prepared by another (`run_span`).
    chunk_s : float
        Chunk length in seconds (the output does not depend on it).
    output_dtype : float32 or int16, optional
        Default: the output's (`Output.default_dtype`: int16 for a Kilosort folder, else
        float32).
    output_scale : float, optional
        The units of one int16 step (default: the output's `Output.whitened_step` whitened,
        else 0.1 µV).
    layout : {"samples_channels", "channels_samples"}
    compression : None, "gzip" or "lzf"
    overwrite : bool
        Replace an existing output given as a path (never a file of the input).
    inputs : mapping or sequence of paths, optional
        Other files the job reads — a probe file, a sidecar, a file named by an option —
        that OUT may never be, with ``overwrite`` or without: ``{"--probe": "p.json"}``
        names each by its option in the message (`dspk.pipeline.outputs.base.read_files`).
    fsync : bool, optional
        Flush the output (and its folder) to the disk before it is named OUT; False skips
        it (scratch outputs, a disk whose loss does not matter). Default: on, unless the
        environment sets ``DSPK_FSYNC=off`` (`fsync_default`).
    gpu_memory : int, optional
        The most bytes of device memory the job's chunks may use (a GPU job; default: the
        free device memory). The chunk is sized to fit it, and halved when the device runs
        out of memory (`dspk.pipeline.stream.GpuMemory`).

    Attributes
    ----------
    output : Output or None
        What the job writes into (`files`: its partial file or folder).
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

    def __init__(self, pipeline: Any, recording: Recording,
                 out: str | os.PathLike | Output | None = None, *, chunk_s: float = 1.0,
                 output_dtype: Any = None, output_scale: float | None = None,
                 layout: str = "samples_channels", compression: str | None = None,
                 overwrite: bool = False, inputs: Any = None, fsync: bool | None = None,
                 gpu_memory: int | None = None) -> None:
        output = out if out is None or isinstance(out, Output) else \
            HDF5Output(out, overwrite=overwrite)
        recording = pipeline.source(recording)   # a Decimate: the job runs at its rate
        # every check before any work: nothing fitted, no file created when one fails
        if output is not None:
            output.check_options(pipeline, layout, compression, resume=False)
            output.check(recording, {**read_files(inputs), **step_files(pipeline)})
            output.fsync = fsync_default() if fsync is None else bool(fsync)
        kind = type(output) if output is not None else HDF5Output
        self.out_dtype = check_output_options(
            kind.default_dtype if output_dtype is None else output_dtype, layout, compression,
            chunk_s)
        pipeline.check(recording)
        self.output, self.pipeline, self.rec = output, pipeline, recording
        self.layout, self.compression = layout, compression
        self.scale = int16_scale(self.out_dtype, output_scale, pipeline.whitens,
                                 kind.whitened_step)
        self.units = UNITS_WHITENED if pipeline.whitens else UNITS_UV
        self.chunk = chunk_samples(chunk_s, recording.fs)
        # the job's record keeps the chunk asked for: a GPU job's own (sized to the device's
        # memory, halved when it runs out) never changes the output
        self.requested_chunk = self.chunk
        self.xp = pipeline.xp
        self.gpu = GpuMemory(self.xp, gpu_memory, recording.n_channels,
                             pipeline.margin(recording.fs), recording.fs)
        # integer samples move to the device as stored when traces are written; detection
        # alone reads on the host, as it always has (the same peaks, bit for bit)
        self.staged = raw_transfer(recording, self.xp) and (output is None or output.traces)
        self.timing: dict = {}
        self.done = 0
        self.states: list = []
        self.job_record: dict = {}
        self.prepared: PreparedPipeline | None = None

    @property
    def files(self) -> PartialOutput | None:
        """The output's partial file or folder and resume record (None without one)."""
        return None if self.output is None else self.output.files

    # -- what the job is -----------------------------------------------------------------------
    def record(self, states: list) -> dict:
        """The job's record with these fitted states (`dspk.pipeline.record.job_record`)."""
        return job_record(self.pipeline.fingerprint(states), self.rec, self.requested_chunk,
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
            p.fs = float(getattr(self.rec, "input_fs", self.rec.fs))
        return [dict(st) for st in p.states]

    def _prepare(self) -> None:
        """The fitted states (fitting when needed), the job's record and the pipeline
        prepared for the run: what `Output.begin` reads."""
        p = self.pipeline
        self.states = self.fitted_states()
        self.job_record = self.record(self.states)
        self.prepared = PreparedPipeline(p.steps, self.states, Context.of(self.rec, self.xp,
                                                                          p.dtype))

    # -- the whole job -------------------------------------------------------------------------
    def run(self, resume: bool = False, progress: bool = True,
            on_chunk: OnChunk | None = None,
            elsewhere: Callable[[Output], Any] | None = None) -> Path | None:
        """The output's lifecycle: its partial output resumed or discarded, the pipeline
        fitted when needed, the output begun, every chunk written in order (this process's
        chunk loop, or ``elsewhere``), and the output committed.

        Parameters
        ----------
        resume : bool
            Continue the partial output of a killed run of this job (see `Pipeline.run`).
        progress : bool
            A progress bar (tqdm).
        on_chunk : callable, optional
            ``on_chunk(samples_done)`` after each committed chunk (samples of the output's
            span done so far: of the recording, or of a `SpanOutput`'s span).
        elsewhere : callable, optional
            ``elsewhere(output)``: the chunks written by other processes into the begun (and
            closed) output instead of by this one — `dspk.dask.run_split`'s spans.

        Returns
        -------
        pathlib.Path or None
            The completed output (None for one kept in memory).
        """
        output = self.output
        if output is None:
            raise PipelineError("run: the job has no output (give out=)")
        # one job per output: the lock is taken before any work (a second job is refused
        # at once, naming this one) and held until the output is committed or given up
        lock = None if output.files is None else OutputLock(output.files.lock, output.out)
        if lock is not None:
            lock.acquire()
        try:
            with self.gpu.capped():
                return self._run(resume, progress, on_chunk, elsewhere)
        finally:
            if lock is not None:
                lock.release()

    def _run(self, resume: bool, progress: bool, on_chunk: OnChunk | None,
             elsewhere: Callable[[Output], Any] | None) -> Path | None:
        output, rec, n = self.output, self.rec, self.rec.n_samples
        start, stop = output.samples(n)
        done, rows, blocks = self._resume_point(start) if resume else (start, {}, None)
        if not resume and output.has_partial():
            hint = (" (resume=True, --resume on the command line, continues it instead)"
                    if output.resumes else "")
            log.warning("%s: discarding the partial output of an earlier job%s",
                        output.files.partial, hint)
        self._prepare()
        if done == start:
            output.discard()
            blocks = None
        output.blocks = committed_blocks() if blocks is None else committed_blocks(
            blocks["ends"], blocks["crc"], blocks["rows"], blocks["order"])
        self.done = done
        decompress0 = rec.decompress_s
        bar = None
        t0 = time.perf_counter()
        # an interruption or an OSError (a full disk, say) may pass on a resume: the partial
        # output is kept for it (when a chunk was recorded as written); anything else (a
        # non-finite or damaged input sample, ...) would stop the resumed job at the same
        # place: nothing is left behind
        try:
            with output.writing(keep=lambda exc: resumable(exc) and output.has_progress()):
                self.done = done = output.begin(self, done, rows)
                if blocks is not None and done > start:
                    self.done = done = self._verified(start, done, blocks)
                if elsewhere is not None:
                    output.close()
                    elsewhere(output)
                else:
                    bar = progress_bar(progress, stop - start, done - start, rec.fs)
                    self._loop(stop, start, bar, on_chunk)
                self.events(output)
        except KeyboardInterrupt as exc:
            raise JobInterrupted(output.out or Path(output.format), self.done, n, rec.fs,
                                 output.has_partial(), output.resumes) from exc
        finally:
            if bar is not None:
                bar.close()
        if elsewhere is None:
            self._finish(t0, stop - done, rec.decompress_s - decompress0)
            log.info("%s: %d samples in %.2f s (%.1f x real time; read %.2f s, compute "
                     "%.2f s, write %.2f s, overlapped)", output.out or output.format,
                     stop - done, self.timing["wall_s"], self.timing["x_real_time"],
                     self.timing["read_s"], self.timing["compute_s"],
                     self.timing["write_s"])
        return output.out

    def events(self, output: Output) -> None:
        """The recording's edges (`dspk.io.events.recording_events`: its sync bits or Open
        Ephys TTL lines) handed to an output that keeps them — one with an ``events(table,
        fs, source)`` method — once its traces are written; nothing for a recording
        without any."""
        hook = getattr(output, "events", None)
        if hook is None:
            return
        from ..io.events import recording_events  # noqa: PLC0415

        rec = getattr(self.rec, "input_recording", self.rec)  # (decimated: the input's)
        table = recording_events(rec)
        if table is not None:
            hook(table, rec.fs, rec.source)

    def _loop(self, stop: int, origin: int, bar: Any, on_chunk: OnChunk | None) -> None:
        """The chunks from `done` to ``stop``; a GPU job whose device runs out of memory
        frees its pools and goes on from the last committed chunk with half the chunk
        (`GpuMemory.smaller`: the output does not depend on it), down to a floor."""
        self._shrinking(lambda: self._chunks(range(self.done, stop, self.chunk), stop, origin,
                                             bar, on_chunk))

    def _shrinking(self, attempt: Callable[[], None],
                   goes_on: str = "the job goes on from its last written chunk") -> None:
        """``attempt()`` with `chunk` sized to the device's memory (`GpuMemory.fit_chunk`),
        and again with half of it each time the device runs out of memory (`GpuMemory.
        smaller`, its pools freed first), down to the floor: the chunk loop's, and a
        rehearsal's (the tuner's decisions taken at the chunk the job will run)."""
        self.chunk = self.gpu.fit_chunk(self.chunk)
        while True:
            try:
                attempt()
                return
            except Exception as exc:
                smaller = self.gpu.smaller(self.chunk, exc, goes_on)
                if smaller is None:
                    raise
            # out of the except block: the failed chunk's arrays (held by the error's
            # frames) are gone, and the pools can give their memory back
            self.gpu.free()
            self.chunk = smaller

    @property
    def block_order(self) -> str:
        """The order of the samples of a block as the job hands it to the output (what its
        crc32 is computed over): the file's layout when the device transposed it, else
        [channels, samples]."""
        return "samples_channels" if self.staged and self.layout == "samples_channels" \
            else "channels_samples"

    def _verified(self, start: int, done: int, blocks: dict) -> int:
        """The sample to continue from after checking the committed blocks of the partial
        output against their record (the files' sizes, each block's crc32, read back): the
        first damaged block and all after it are written again (said in the log); the
        output is reopened there when it is one."""
        output, partial = self.output, self.output.files.partial
        sizes = dict(blocks.get("sizes") or {})
        found = output.files.sizes()
        short = [f"{name} ({found.get(name, 0)} < {size} bytes)" for name, size in
                 sizes.items() if found.get(name, 0) < size]
        if short:
            log.warning("%s: shorter than its resume record says: %s; its blocks are checked",
                        partial, ", ".join(short))
        ends, crcs = blocks["ends"], blocks["crc"]
        s0, bad, why = start, None, ""
        for k, (s1, crc) in enumerate(zip(ends, crcs)):
            if crc is None:
                s0 = s1
                continue
            try:
                stored = output.read_back(s0, s1)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                bad, why = k, f"cannot be read back ({exc})"
                break
            if stored is None:
                if short:
                    bad, why = 0, "cannot be checked in a damaged file"
                    s0 = start
                break
            if blocks["order"][k] != self.layout[0]:
                stored = stored.T
            if block_checksum(stored) != crc:
                bad, why = k, "do not match their checksum"
                break
            s0 = s1
        if bad is None:
            return done
        redo = start if bad == 0 else ends[bad - 1]
        log.warning("%s: samples %d to %d %s: damaged; the job writes them again from "
                    "sample %d", partial, redo, ends[bad], why, redo)
        rows = blocks["rows"][bad - 1] if bad > 0 else {}
        output.close()
        if redo == start:               # nothing kept: a new partial output, as a new job's
            output.discard()
        output.blocks = committed_blocks(ends[:bad], crcs[:bad], blocks["rows"][:bad],
                                         blocks["order"][:bad])
        return output.begin(self, redo, dict(rows))

    def _resume_point(self, start: int) -> tuple:
        """(sample to continue from, rows written per table, the committed blocks to verify)
        of the partial output that this job continues, its fitted state adopted by an
        unfitted pipeline; or (``start``, {}, None) to start over (said in the log). The
        partial job's record must be intact (its own checksum), its blocks must tile the
        samples it says are done, and its job record, the options' fingerprint included,
        must be the one this job makes with that fitted state."""
        output, p = self.output, self.pipeline
        partial = None if output.files is None else output.files.partial
        over = start, {}, None
        if not output.has_partial():
            log.warning("%s: nothing to resume (no partial output of an earlier job); the "
                        "job starts from the beginning", partial)
            return over
        if not output.has_progress():
            log.warning("%s: no progress record next to it; starting over", partial)
            return over
        try:
            record, stored = output.stored(None if p.is_fitted else p.steps)
            states = p.states if stored is None else stored
            job = self.record(states)
            other = sorted(k for k in job if record.get(k) != job[k])
            if other or not all(s.is_fitted(st) for s, st in zip(p.steps, states)):
                said = ", ".join("the steps' options or fitted state" if k == "fingerprint"
                                 else k for k in other) or "an unfitted step"
                log.warning("%s: a partial job with other parameters (%s differ); starting "
                            "over", partial, said)
                return over
            done, rows = int(record["done"]), dict(record.get("rows", {}))
            blocks = _checked_blocks(record, start, done)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: unreadable partial job (%s); starting over", partial, exc)
            return over
        if stored is not None:
            for k, st in enumerate(stored):       # the fit the partial output was made with
                p.set_fitted(k, st)
            log.info("%s: resuming at sample %d with the fitted state stored there", partial,
                     done)
        return done, rows, blocks

    # -- spans ---------------------------------------------------------------------------------
    def allocate(self) -> int:
        """Begin the output for spans written by several processes (`run_span`): its
        ``OUT.partial`` with contiguous, allocated ``/traces`` and the metadata and fitted
        state of `run`'s output (the same file once every span is in; `commit` names it).
        Fits an unfitted pipeline first. Returns the byte offset of the traces' samples.
        (`run` with ``elsewhere`` does all of it.)

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
        output = self.output
        if output is None:
            raise PipelineError("allocate: the job has no output (give out=)")
        if self.pipeline.sinks:
            raise PipelineError("spans write traces only; the Detect step writes spikes: "
                                "use Pipeline.run (preprocess_many on a cluster)")
        if self.compression is not None:
            raise PipelineError(f"compression: spans write the traces in place, "
                                f"uncompressed; leave {arg('compression')} out")
        self._prepare()
        output.discard()
        try:
            output.begin(self, 0, {})
        finally:
            output.close()
        return output.offset

    def commit(self) -> Path:
        """Name the output of `allocate` when every span is in."""
        self.output.commit()
        return self.output.out

    def run_span(self, path: str | os.PathLike, offset: int, s0: int, s1: int,
                 on_chunk: OnChunk | None = None) -> dict:
        """Samples [s0, s1) into the traces of a file prepared by `allocate` (``path``,
        contiguous at byte ``offset``): a `dspk.pipeline.outputs.SpanOutput`, so several
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
        p = self.pipeline
        if p.sinks:
            raise PipelineError("run_span: the Detect step writes spikes; use run")
        if not p.is_fitted:
            raise PipelineError("run_span: fit the pipeline first (every span must use one W)")
        self.output = SpanOutput(path, offset=offset, s0=s0, s1=s1)
        self.output.samples(self.rec.n_samples)        # checked before any work
        self.run(progress=False, on_chunk=on_chunk)
        return {**{k: self.timing[k] for k in ("read_s", "compute_s", "write_s")},
                "setup_s": self.timing["wall_s"] - self.timing["loop_s"],
                "wall_s": time.perf_counter() - t0, "samples": s1 - s0}

    def rehearse(self) -> None:
        """A full chunk and the last, shorter one through every stage, as a job computes
        them (the same shapes: the same tuner decisions), writing nothing (`Pipeline.tune`).
        A GPU job's chunk is first sized to the device's memory and halved when the device
        runs out, as the job's own loop does (`dspk.pipeline.stream.GpuMemory`): the tuner
        decides for the chunks the job will run.

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Job
        >>> rec = dspk.open_recording(np.ones((3000, 2), np.float32), fs=3e4)
        >>> Job(dspk.Pipeline.from_options(whiten=None), rec, chunk_s=0.04).rehearse()
        """
        rec, p = self.rec, self.pipeline
        n, fs = rec.n_samples, rec.fs
        run = p.prepare(Context.of(rec, self.xp, p.dtype))
        m = p.margin(fs)

        def rehearsal() -> None:
            chunk = min(n, self.chunk)
            last = n - (n - 1) // chunk * chunk
            for s0, s1 in sorted({(0, chunk), (n - last, n)}):
                run.rows(run.compute(read_block(rec, s0, s1, m), s0, s1, m), s0, s1, m)

        # a GPU's chunk as the job's loop will have it: sized to the device's memory, and
        # halved when the device runs out (the tuner's keys are those of the chunks it runs)
        self._shrinking(rehearsal, "the rehearsal goes on")

    # -- the chunk loop --------------------------------------------------------------------------
    def _chunks(self, starts: range, end: int, origin: int, bar: Any,
                on_chunk: OnChunk | None) -> None:
        """The one chunk loop: the chunks starting at ``starts`` (each to ``min(end, s0 +
        chunk)``) computed with the prepared pipeline — their traces as stored and what the
        output keeps of them (`Output.rows_of`) — and written in order on the writer thread
        (`Output.write`, then `Output.committed`, then ``on_chunk``), reading ahead and
        writing behind (`dspk.pipeline.stream.ChunkStream`). Fills `timing`."""
        rec, p, xp, output, run = self.rec, self.pipeline, self.xp, self.output, self.prepared
        m = p.margin(rec.fs)
        staging = Staging(rec, self.chunk + 2 * m, ahead(rec) + 2,
                          (min(rec.n_samples, self.chunk), rec.n_channels), self.out_dtype,
                          self.layout) if self.staged else None
        stream = ChunkStream(rec, self.chunk, m, staging, xp)
        timing = stream.timing
        # the partial output flushed to the disk while the job writes it, so that the
        # commit's flush finds little left (`dspk.pipeline.flush`)
        early = EarlyFlush(output.files.partial) if (
            output.fsync and output.files is not None and output.traces and
            early_flush_default()) else None

        def compute(i: int, raw: tuple, s0: int, s1: int) -> tuple:
            full = run.compute(stream.to_device(raw), s0, s1, m)
            rows = output.rows_of(run, full, s0, s1, m)
            y = output_block(i, full[:, m:m + (s1 - s0)], staging, self.out_dtype,
                             self.scale) if output.traces else None
            return y, rows

        order = self.block_order

        def write(s0: int, s1: int, result: tuple) -> None:
            t = time.perf_counter()
            y, rows = result
            # the block's checksum on the writer thread's side (a staged block is then on
            # the host): in `compute` it waited for the device's copy of each chunk before
            # the next could be queued — the H100's int16 job fell from 116x to 40x real
            # time there; taken after the write, it still added ~0.2 s of 0.66 to a 60-s
            # job: now it runs on the pool during the write (both only read y)
            pending = None if y is None else PendingChecksum(y)
            output.write(s0, s1, y, rows)
            crc = None if pending is None else pending.result()
            if early is not None and y is not None:
                early.wrote(y.nbytes)
            output.committed(self.job_record, s1, crc, order)   # a resume starts after s1
            self.done = s1
            if on_chunk is not None:
                on_chunk(s1 - origin)
            if bar is not None:
                bar.update(s1 - s0)
            timing["write_s"] += time.perf_counter() - t

        try:
            stream.run(list(starts), end, compute, write)
        finally:
            if early is not None:
                early.close()
            transfer = staging.transfer_s if staging is not None else 0.0
            self.timing = {**timing, "compute_s": timing["compute_s"] - transfer,
                           "transfer_s": transfer, "events": list(stream.events),
                           "early_flush_s": 0.0 if early is None else early.seconds}

    def _finish(self, t0: float, samples: int, decompress_s: float) -> None:
        dt = time.perf_counter() - t0
        self.timing.update(decompress_s=decompress_s, wall_s=dt, samples=samples,
                           x_real_time=samples / self.rec.fs / max(dt, 1e-9))


def _checked_blocks(record: dict, start: int, done: int) -> dict:
    """The committed blocks of a resume record, with the partial output's recorded sizes;
    ValueError when they do not tile [start, done) (a record edited, or of an older dspk)."""
    blocks = record.get("blocks")
    if not isinstance(blocks, dict):
        raise ValueError("it records no checksums of its blocks")
    if blocks.get("checksum") != CHECKSUM:
        raise ValueError(f"its blocks' checksums are of another kind "
                         f"({blocks.get('checksum')!r}, an older dspk's)")
    ends, crcs, rows, order = (blocks.get(k) for k in ("ends", "crc", "rows", "order"))
    if not (isinstance(ends, list) and isinstance(crcs, list) and isinstance(rows, list)
            and isinstance(order, str) and len(ends) == len(crcs) == len(rows) == len(order)
            and set(order) <= {"c", "s"}):
        raise ValueError("its blocks are malformed")
    if any(not isinstance(e, int) for e in ends) or \
            [e for e in ends if e <= start] or sorted(set(ends)) != ends or \
            (ends and ends[-1] != done) or (not ends and done != start):
        raise ValueError(f"its blocks do not reach sample {done} in order")
    return {"ends": ends, "crc": crcs, "rows": rows, "order": order, "checksum": CHECKSUM,
            "sizes": record.get("sizes") or {}}


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
