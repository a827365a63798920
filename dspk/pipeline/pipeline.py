"""The `Pipeline`: stages (`dspk.pipeline.steps`, then `dspk.pipeline.sinks`) in order on
[channels, samples] blocks, with their fitted state; fitted on a recording (`Pipeline.fit`),
applied to arrays (`Pipeline.transform`, `Pipeline.apply`) and to blocks of a recording with
their halos (`Pipeline.block`), and run into an output (`dspk.pipeline.outputs`) by a
`dspk.pipeline.Job` (`Pipeline.run`, `Pipeline.run_span`).

A pipeline is its options and its fitted state, nothing else: a run (its sampling rate, the
taps and matrices it prepares, its progress and timings) belongs to the run. The one change a
run makes to a pipeline is the fit it asked for by running an unfitted one.

Examples
--------
>>> import numpy as np, dspk
>>> x = np.random.default_rng(0).standard_normal((4, 6000)).astype(np.float32)
>>> rec = dspk.open_recording(x, fs=30000.0, layout="channels_samples")
>>> p = dspk.Pipeline.from_options(whiten="global", backend="cpu")
>>> p.is_fitted, p.fit(rec).is_fitted
(False, True)
>>> y = p.block(rec, 1000, 2000)           # with the FIR's halo: the samples of the whole
>>> bool(np.allclose(y, p.transform(x)[:, 1000:2000], atol=1e-5))
True
"""

from __future__ import annotations

from contextlib import nullcontext

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..backend import array_module, resolve_backend
from ..io import Recording
from ..linalg import current_engine
from . import record, registry
from .errors import PipelineError
from .job import Job, OnChunk, opened
from .outputs import Output, output_class
from .prepared import FIT_CHUNK_S, FIT_CHUNKS, PreparedPipeline, fitted_states
from .sinks import Detect
from .stage import Context, Sink, check_needs, check_order, front_end
from .stream import read_block

__all__ = ["Pipeline", "preprocess", "fit_spans", "FIT_CHUNKS", "FIT_CHUNK_S"]


def fit_spans(n: int, fs: float, seed: int = 0, n_chunks: int = FIT_CHUNKS,
              chunk_s: float = FIT_CHUNK_S) -> list:
    """The fit chunks: seeded positions spread over a recording of ``n`` samples, one per
    equal part at a random offset inside it (all of a recording shorter than the chunks).

    Parameters
    ----------
    n : int
        Samples of the recording.
    fs : float
        Its sampling rate in Hz.
    seed : int
        Seeds the offsets (the same seed, the same chunks).
    n_chunks : int
        Chunks drawn.
    chunk_s : float
        Their length in seconds.

    Returns
    -------
    list of (int, int)
        The chunks' sample ranges [s0, s1), in order.

    Examples
    --------
    >>> from dspk.pipeline import fit_spans
    >>> fit_spans(30000, 30000.0, n_chunks=2, chunk_s=0.5)      # shorter than the chunks
    [(0, 15000), (15000, 30000)]
    >>> len(fit_spans(3_000_000, 30000.0)), fit_spans(3_000_000, 30000.0)[0][1] - \\
    ...     fit_spans(3_000_000, 30000.0)[0][0]
    (16, 15000)
    """
    length = max(2, int(chunk_s * fs))
    if n <= length * n_chunks:
        return [(s, min(n, s + length)) for s in range(0, n, length)]
    rng = np.random.default_rng(seed)
    part = n // n_chunks
    starts = [k * part + int(rng.integers(0, part - length + 1)) for k in range(n_chunks)]
    return [(s, s + length) for s in starts]


@dataclass
class Pipeline:
    """Stages applied in order to [channels, samples] float traces: steps, then sinks.

    Parameters
    ----------
    steps : sequence of Step and Sink
        The stages: `HighPass`, `BandPass`, `Reference`, `Whiten`, any registered step of
        your own, then the sinks (`Detect`).
    backend : {"auto", "cpu", "gpu"}
        Where the stages run ("gpu" without a GPU is an error; "auto" falls back to the CPU).
    dtype : numpy dtype
        Processing precision, float32 (default) or float64.
    states : list of dict, optional
        One per stage: its fitted arrays (``"W"`` for whitening, the noise and feature PCA
        for Detect). Default: empty (a list of the wrong length is replaced).
    fs : float, optional
        The sampling rate the pipeline was fitted at (set by `fit`; `transform` uses it when
        not given one).

    Attributes
    ----------
    last_run : dict
        The timings of this pipeline's last `run` in this process (a report: `Job.timing`).

    Examples
    --------
    >>> import numpy as np, dspk
    >>> x = np.random.default_rng(0).standard_normal((8, 6000)).astype(np.float32)
    >>> p = dspk.Pipeline.from_options(highpass=300, reference="median", whiten="global")
    >>> p = p.fit(dspk.open_recording(x, fs=30000.0, layout="channels_samples"))
    >>> y = p.transform(x)
    >>> y.shape, y.dtype
    ((8, 6000), dtype('float32'))
    >>> [s["step"] for s in p.options()], p.margin(30000.0)
    (['HighPass', 'Reference', 'Whiten'], 131)

    The job on a file: chunk by chunk, written atomically, readable by `dspk.open_recording`:

    >>> import os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> rec = dspk.open_recording(x, fs=30000.0, layout="channels_samples")
    >>> out = p.run(rec, os.path.join(tmp.name, "out.h5"), chunk_s=0.05, progress=False)
    >>> with dspk.open_recording(out) as done:
    ...     bool(np.allclose(done.read(), y, atol=1e-4))
    True
    >>> tmp.cleanup()
    """

    steps: Sequence[Any]
    backend: str = "auto"
    dtype: Any = np.float32
    states: list = field(default_factory=list)
    fs: float | None = None

    def __post_init__(self) -> None:
        self.steps = list(self.steps)
        check_order(self.steps, registry.stage_classes())
        if np.dtype(self.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise PipelineError(f"dtype: expected float32 or float64, got {self.dtype}")
        self.dtype = np.dtype(self.dtype)
        if len(self.states) != len(self.steps):
            self.states = [{} for _ in self.steps]
        self.last_run: dict = {}

    @classmethod
    def from_options(cls, backend: str = "auto", dtype: Any = np.float32,
                     preset: str | None = None, **options: Any) -> "Pipeline":
        """The pipeline of the command line's options (``dspk preprocess``), as keywords:
        every option of the stage registry (`dspk.pipeline.registry.options`), each stage
        left out when its option says so.

        Parameters
        ----------
        backend : {"auto", "cpu", "gpu"}
        dtype : float32 or float64
        preset : {"ibl", "ibl-lfp", "kilosort"}, optional
            The option values of a known chain (`dspk.pipeline.registry.PRESETS`: IBL's
            destripe, IBL's LFP destripe, Kilosort4's preprocessing); ``options`` given
            win.
        **options
            ``highpass`` (Hz, default 300; None or 0: none), ``bandpass`` ((low, high) Hz,
            replaces the high-pass), ``reference`` ("median", "mean", "none"), ``whiten``
            ("local", "global", "none"), ``n_neighbors`` (32), ``motion`` ("rigid",
            "nonrigid", "none"), ``detect`` (False), ``detect_threshold`` (7.0), and the
            options of steps registered by your code.

        Returns
        -------
        Pipeline

        Raises
        ------
        TypeError
            An unknown option.
        PipelineError
            A value an option does not take.

        Examples
        --------
        >>> import dspk
        >>> [s["step"] for s in dspk.Pipeline.from_options(detect=True).options()]
        ['HighPass', 'Reference', 'Whiten', 'Detect']
        >>> [s["step"] for s in dspk.Pipeline.from_options(preset="ibl").options()]
        ['PhaseShift', 'HighPass', 'BadChannels', 'SpatialHighpass']
        """
        if preset is not None:
            options = {**registry.preset(preset), **options}
        return cls(registry.stages(**options), backend=backend, dtype=dtype)

    # -- description -----------------------------------------------------------------------------
    def margin(self, fs: float) -> int:
        """Samples of context each side of a chunk so that its output equals the one-shot.

        Parameters
        ----------
        fs : float

        Examples
        --------
        >>> import dspk
        >>> dspk.Pipeline.from_options(detect=True).margin(30000.0)      # FIR + detection
        182
        """
        return sum(s.margin(fs) for s in self.steps)

    def options(self) -> list:
        """The stages as JSON-able dicts: ``{"step": class name, **its fields}`` each.

        Examples
        --------
        >>> import dspk
        >>> dspk.Pipeline.from_options(whiten=None, reference="mean").options()
        ... # doctest: +NORMALIZE_WHITESPACE
        [{'step': 'HighPass', 'cutoff_hz': 300.0},
         {'step': 'Reference', 'operator': 'mean', 'groups': 'none'}]
        """
        return record.stage_options(self.steps)

    def fingerprint(self, states: Sequence[dict] | None = None) -> str:
        """A digest of the stages and their fitted arrays (a resumed job must match it;
        `dspk.pipeline.record.fingerprint`).

        Parameters
        ----------
        states : list of dict, optional
            Fitted states to digest instead of this pipeline's.

        Examples
        --------
        >>> import dspk
        >>> len(dspk.Pipeline.from_options(whiten=None).fingerprint())
        64
        """
        return record.fingerprint(self.steps, self.states if states is None else states,
                                  self.dtype)

    @property
    def xp(self) -> Any:
        """The array module the stages run with: ``cupy`` for the GPU backend, else
        ``numpy`` (`dspk.resolve_backend` of ``backend``: "auto" falls back to the CPU).

        Examples
        --------
        >>> import dspk
        >>> dspk.Pipeline.from_options(backend="cpu").xp.__name__
        'numpy'
        """
        if resolve_backend(self.backend) == "gpu":
            import cupy  # noqa: PLC0415 (CuPy only for the GPU backend)

            return cupy
        return np

    @property
    def is_fitted(self) -> bool:
        """Whether every stage that fits something has been fitted (`fit`, `load`, the state
        a resumed job read back, or states given).

        Examples
        --------
        >>> import numpy as np, dspk
        >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
        >>> p = dspk.Pipeline.from_options(whiten="global")
        >>> p.is_fitted, p.fit(dspk.open_recording(x, fs=30000.0)).is_fitted
        (False, True)
        """
        return all(step.is_fitted(st) for step, st in zip(self.steps, self.states))

    @property
    def sinks(self) -> list:
        """The output stages (`dspk.pipeline.Sink`: `Detect`), after the steps.

        Examples
        --------
        >>> import dspk
        >>> dspk.Pipeline.from_options(detect=True).sinks
        [Detect(threshold=7.0, n_neighbors=10, dead_time_ms=0.67, features=3)]
        """
        return [s for s in self.steps if isinstance(s, Sink)]

    @property
    def detector(self) -> Any:
        """The `Detect` sink, or None.

        Examples
        --------
        >>> import dspk
        >>> dspk.Pipeline.from_options(whiten="global", detect=True).detector.threshold
        7.0
        """
        return next((s for s in self.sinks if isinstance(s, Detect)), None)

    @property
    def whitens(self) -> bool:
        """Whether a step whitens (the traces are then in units of the noise's standard
        deviation, not µV: the int16 output's default scale follows).

        Examples
        --------
        >>> import dspk
        >>> dspk.Pipeline.from_options(whiten="none").whitens
        False
        """
        return any(s.whitens for s in self.steps)

    # -- computing -----------------------------------------------------------------------------
    def prepare(self, ctx: Context, upto: int | None = None) -> PreparedPipeline:
        """The stages (the first ``upto``) prepared for a run in ``ctx`` (`PreparedPipeline`:
        the taps at its rate, W on its device); for many blocks of one run, rather than
        `apply` on each.

        Parameters
        ----------
        ctx : Context
        upto : int, optional

        Returns
        -------
        PreparedPipeline

        Raises
        ------
        PipelineError
            A stage that needs fitting and is not fitted.

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Context
        >>> p = dspk.Pipeline.from_options(whiten=None, reference="mean")
        >>> run = p.prepare(Context(fs=3e4, n_channels=2, xp=np, dtype=np.dtype(np.float32)))
        >>> [type(s).__name__ for s, _ in run.steps]
        ['HighPass', 'Reference']
        """
        return PreparedPipeline(self.steps, self.states, ctx, upto)

    def apply(self, x: Any, fs: float, start: int = 0, n_total: int | None = None,
              upto: int | None = None) -> Any:
        """The steps (the first ``upto`` stages) on a float block x [channels, samples] whose
        first sample is sample ``start`` of a recording of ``n_total`` samples, in place
        where a step allows: the samples outside [0, n_total) are set to zero after every
        step (the signal is zero outside the recording), so a block with its halo gives the
        samples of `transform` on the whole recording. The stages are prepared for this call
        (`prepare` once for many blocks).

        Parameters
        ----------
        x : array [channels, samples]
            In the pipeline's dtype (NumPy or CuPy: the result is of the same type).
        fs : float
            The sampling rate in Hz.
        start : int
            The recording's sample at x[:, 0] (negative for a block that begins with a halo
            before the recording).
        n_total : int, optional
            The recording's length (default: the block ends the recording).
        upto : int, optional
            Only the first ``upto`` stages.

        Returns
        -------
        array

        Examples
        --------
        >>> import numpy as np, dspk
        >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
        >>> p = dspk.Pipeline.from_options(highpass=300, whiten=None, backend="cpu")
        >>> m = p.margin(30000.0)
        >>> part = p.apply(x[:, 3000 - m:6000 + m].copy(), 30000.0, 3000 - m, 9000)
        >>> bool(np.allclose(part[:, m:-m], p.transform(x, 30000.0)[:, 3000:6000], atol=1e-5))
        True
        """
        n_total = start + x.shape[1] if n_total is None else n_total
        ctx = Context(fs=float(fs), n_channels=x.shape[0], xp=array_module(x), dtype=self.dtype)
        return self.prepare(ctx, upto).apply(x, start, n_total)

    def transform(self, x: Any, fs: float | None = None) -> Any:
        """The steps on an in-memory [channels, samples] array (µV), zero outside it; returns
        the array type given.

        Parameters
        ----------
        x : array [channels, samples]
        fs : float, optional
            The sampling rate (default: the one `fit` saw).

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Pipeline, Reference
        >>> Pipeline([Reference("mean")]).transform(np.eye(2, dtype=np.float32), fs=1000.0)
        array([[ 0.5, -0.5],
               [-0.5,  0.5]], dtype=float32)
        """
        fs = fs or self.fs
        if fs is None:
            raise PipelineError("fs: unknown (fit the pipeline on a recording or pass fs=)")
        y = x.astype(self.dtype, copy=True)
        front = front_end(self.steps)                       # Decimate: first
        if front is not None:
            y, fs = front.resample(y, Context(fs=float(fs), n_channels=x.shape[0],
                                              xp=array_module(y), dtype=self.dtype))
        return self.apply(y, fs, 0, y.shape[1])

    def block(self, recording: Recording, s0: int, s1: int, upto: int | None = None,
              halo: int = 0, xp: Any = None) -> Any:
        """Samples [s0 - halo, s1 + halo) of the recording through the steps (the first
        ``upto`` stages): read with the stages' margins of context on each side (zeros
        outside the recording) and trimmed — the same samples as the steps on the whole
        recording.

        Parameters
        ----------
        recording : Recording
        s0, s1 : int
            The samples wanted.
        upto : int, optional
            Only the first ``upto`` stages (and their margins).
        halo : int
            Extra samples on each side, at most those stages' margin (a detector's context).
        xp : module, optional
            The array module (default: `xp`).

        Returns
        -------
        array [channels, s1 - s0 + 2 halo]
            A view of the computed block, in the pipeline's dtype.

        Examples
        --------
        >>> import numpy as np, dspk
        >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
        >>> rec = dspk.open_recording(x, fs=30000.0)
        >>> p = dspk.Pipeline.from_options(highpass=300, reference="median", whiten=None)
        >>> y = p.block(rec, 0, 3000)                      # the recording's first chunk
        >>> bool(np.allclose(y, p.transform(x, 30000.0)[:, :3000], atol=1e-5))
        True
        """
        recording = self.source(recording)
        m = sum(s.margin(recording.fs) for s in self.steps[:upto])
        if not 0 <= halo <= m:
            raise ValueError(f"halo: expected 0..{m} (the steps' margin), got {halo}")
        ctx = Context.of(recording, xp or self.xp, self.dtype)
        full = self.prepare(ctx, upto).compute(read_block(recording, s0, s1, m), s0, s1, m)
        return full[:, m - halo:m + (s1 - s0) + halo]

    # -- fitting -------------------------------------------------------------------------------
    def fit(self, recording: Recording, seed: int = 0, n_chunks: int = FIT_CHUNKS,
            chunk_s: float = FIT_CHUNK_S) -> "Pipeline":
        """Fit the stages that fit something on ``n_chunks`` chunks of ``chunk_s`` seconds at
        seeded positions spread over the recording (`fit_spans`), in one pass: each chunk is
        read once, with the whole pipeline's halo, and put through the steps; every stage
        that fits (whitening: its W; detection: its noise and feature PCA) is fitted, in
        order, on the chunks as the stages before it left them. `check` first: a recording
        the stages cannot process is refused before any work. The new state replaces the old
        only when every stage is fitted.

        Parameters
        ----------
        recording : Recording
        seed : int
            Seeds the chunks' positions.
        n_chunks : int
            Chunks drawn.
        chunk_s : float
            Their length in seconds.

        Returns
        -------
        Pipeline
            This pipeline, fitted.

        Raises
        ------
        dspk.backend.DeviceOutOfMemory
            A GPU fit that ran out of device memory with its chunks held on the device, and
            again with them held on the host (`dspk.pipeline.prepared.fitted_states`): the
            message says which option to change (fewer or shorter chunks: ``n_chunks``,
            ``chunk_s``).

        Examples
        --------
        >>> import numpy as np, dspk
        >>> x = np.random.default_rng(0).standard_normal((4, 30000)).astype(np.float32)
        >>> p = dspk.Pipeline.from_options(whiten="global").fit(dspk.open_recording(x, fs=3e4))
        >>> p.states[-1]["W"].shape, p.fs
        ((4, 4), 30000.0)
        """
        self.check(recording)
        fs = float(getattr(recording, "input_fs", recording.fs))     # the rate given
        recording = self.source(recording)
        spans = fit_spans(recording.n_samples, recording.fs, seed, n_chunks, chunk_s)
        ctx = Context.of(recording, self.xp, self.dtype)
        self.states = fitted_states(self.steps, self.states, ctx, spans)
        self.fs = fs
        return self

    def source(self, recording: Recording) -> Recording:
        """The recording the steps read: ``recording`` itself, or, when the first step is a
        front end (`Decimate`), what it makes of it (`dspk.pipeline.steps.decimate.
        DecimatedRecording`: the steps, the fit, the sinks and the output at the new rate).

        Parameters
        ----------
        recording : Recording

        Returns
        -------
        Recording

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Decimate, Pipeline, Reference
        >>> rec = dspk.open_recording(np.zeros((30000, 2), np.int16), fs=30000.0)
        >>> Pipeline([Decimate(12), Reference("mean")]).source(rec).fs
        2500.0
        """
        front = front_end(self.steps)
        return recording if front is None else front.source(recording, self.xp)

    def set_fitted(self, k: int, state: dict) -> None:
        """Replace stage k's fitted state with ``state`` (what its ``fit`` returned).

        Parameters
        ----------
        k : int
            The stage's index (negative counts from the end).
        state : dict

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Pipeline, Whiten
        >>> p = Pipeline([Whiten("global")])
        >>> p.set_fitted(0, {"W": np.eye(2)})
        >>> p.is_fitted
        True
        """
        self.states[k] = dict(state)

    def tune(self, recording: Recording, chunk_s: float = 1.0,
             thorough: bool = True) -> "Pipeline":
        """Take now every tuner decision a job on ``recording`` will need — fit (its chunks),
        a full chunk and the last, shorter one through every stage, the sinks included — so
        that they are in the tuner's cache file before any job starts: processes that share
        the cache then make the same choices (the same bits).

        Parameters
        ----------
        recording : Recording
        chunk_s : float
            The job's chunk length in seconds.
        thorough : bool
            Time every candidate on the whole problem (`dspk.linalg.Engine.thorough`),
            replacing choices first calls made on slices (what ``dspk tune`` does): run it
            before jobs, not between a killed job and its resumption, nor while other
            processes hold the old choices (a thorough choice may round differently). False:
            first-use decisions, where none is stored yet; stored ones are kept (what
            `dspk.dask.preprocess_many` does before its jobs, while other processes may be
            running).

        Returns
        -------
        Pipeline
            This pipeline, fitted.

        Examples
        --------
        >>> import numpy as np, dspk
        >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
        >>> p = dspk.Pipeline.from_options(whiten="global")
        >>> p.tune(dspk.open_recording(x, fs=30000.0), chunk_s=0.1).is_fitted
        True
        """
        job = Job(self, recording, chunk_s=chunk_s)      # checks before any work
        with current_engine().thorough() if thorough else nullcontext():
            self.fit(recording)
            job.rehearse()
        return self

    def check(self, recording: Recording) -> None:
        """Refuse, before any work, a recording the stages cannot process as asked: what
        each needs of it (`dspk.pipeline.Stage.needs`: local whitening and detection need
        the geometry) and each stage's own checks (`dspk.pipeline.Stage.check`: a common
        reference needs more than one channel). `fit`, `tune` and `run` call it first.

        Parameters
        ----------
        recording : Recording
            The recording the pipeline is to be fitted on or run over.

        Raises
        ------
        PipelineError
            Naming the stage, what it needs and what to pass instead.

        Examples
        --------
        >>> import numpy as np, dspk
        >>> rec = dspk.open_recording(np.zeros((3000, 1), np.int16), fs=30000.0)
        >>> dspk.Pipeline.from_options(whiten="global").check(rec)   # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dspk.pipeline.PipelineError: reference='median': the recording has 1 channel; ...
        """
        front = front_end(self.steps)
        if front is not None:
            front.check(getattr(recording, "input_recording", recording))
            recording = self.source(recording)
        for stage in self.steps[front is not None:]:
            stage.check(recording)
            check_needs(stage, recording)

    # -- the fitted state in files -------------------------------------------------------------
    def write_fitted(self, f: Any, fs: float, states: Sequence[dict] | None = None) -> None:
        """The fitted state into an open HDF5 output (`dspk.pipeline.record.write_fitted`:
        ``/fitted/step{k}_{Name}/{key}``); `read_fitted` reads it back.

        Parameters
        ----------
        f : h5py.File or Group
        fs : float
            The sampling rate (of the taps).
        states : list of dict, optional
            The fitted states to write (default: this pipeline's).

        Examples
        --------
        >>> import os, tempfile
        >>> import h5py, numpy as np
        >>> from dspk.pipeline import Pipeline, Whiten
        >>> tmp = tempfile.TemporaryDirectory()
        >>> p = Pipeline([Whiten("global")], states=[{"W": np.eye(2)}])
        >>> with h5py.File(os.path.join(tmp.name, "o.h5"), "w") as f:
        ...     p.write_fitted(f, 30000.0)
        >>> [s["W"].shape for s in p.read_fitted(os.path.join(tmp.name, "o.h5"))]
        [(2, 2)]
        >>> tmp.cleanup()
        """
        record.write_fitted(f, self.steps, fs, self.states if states is None else states)

    def read_fitted(self, path: str | Path) -> list:
        """The fitted state that `write_fitted` stored in an output (or partial) file, one
        dict per stage of this pipeline (this pipeline is not changed;
        `dspk.pipeline.record.read_fitted`).

        Parameters
        ----------
        path : path
            An output of `run` (or its partial file, or a Kilosort folder's ``fitted.h5``).

        Returns
        -------
        list of dict

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, dspk
        >>> tmp = tempfile.TemporaryDirectory()
        >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
        >>> p = dspk.Pipeline.from_options(whiten="global")
        >>> out = p.run(dspk.open_recording(x, fs=30000.0), os.path.join(tmp.name, "o.h5"),
        ...             progress=False)
        >>> bool(np.array_equal(p.read_fitted(out)[-1]["W"], p.states[-1]["W"]))
        True
        >>> tmp.cleanup()
        """
        return record.read_fitted(self.steps, path)

    # -- runs ----------------------------------------------------------------------------------
    def run(self, recording: Recording | str, out_path: str | Output | None,
            chunk_s: float = 1.0, output_dtype: Any = None, output_scale: float | None = None,
            layout: str = "samples_channels", compression: str | None = None,
            overwrite: bool = False, resume: bool = False, progress: bool = True,
            on_chunk: OnChunk | None = None, format: str = "hdf5", inputs: Any = None,
            fsync: bool | None = None, gpu_memory: int | None = None, **options: Any
            ) -> Path | None:
        """Process a recording chunk by chunk into an HDF5 file, a Kilosort folder, an NWB
        file or any registered format (``format``: `dspk.pipeline.outputs`), by a
        `dspk.pipeline.Job`.

        Everything that can be checked is checked first — the output (it exists and
        ``overwrite`` is not set; it is the input or any file of it, under any spelling or
        link; it is not a regular file; its folder is missing or not writable), the options,
        and what the stages need of the recording (geometry for local whitening and
        detection, more than one channel for a common reference) — so a refused job has
        fitted nothing and created no file. Then an unfitted pipeline is fitted (`fit`; or,
        resuming, with the fitted state stored in the partial file), and the chunks are
        written to ``OUT.partial``, renamed ``OUT`` when complete. Two runs of one job write
        the same bytes (no HDF5 object times are stored), and so do a resumed job and one
        that never stopped.

        Parameters
        ----------
        recording : Recording or path
            Opened with `dspk.open_recording` when a path (and closed before returning).
        out_path : str or Output
            The output file (a folder for ``format="kilosort"``); refused if it exists
            unless ``overwrite``. Or an `dspk.pipeline.outputs.Output` made by the caller
            (``format``, ``overwrite`` and ``options`` are then its own).
        chunk_s : float
            Chunk length in seconds (the output does not depend on it).
        output_dtype : float32 or int16, optional
            int16 stores round(y / output_scale) (default scale: 0.01 when whitened — units of
            the noise's standard deviation — else 0.1 µV; a Kilosort folder's whitened
            traces: 1/200), clipped to the int16 range. Default: float32; int16 for a
            Kilosort folder.
        output_scale : float, optional
            The units of one int16 step (see ``output_dtype``).
        layout : {"samples_channels", "channels_samples"}
        compression : None, "gzip" or "lzf"
        overwrite : bool
            Replace an existing output (never a file of the input).
        resume : bool
            Continue a killed job from its partial file, with the fitted state stored there
            (no refit), when the partial job is this one (steps, recording, chunk, output
            type); otherwise (and when there is nothing to resume: said in the log) start
            over. The committed blocks are verified first (the record's own checksum, the
            partial files' sizes, each block's crc32 read back): from the first damaged
            block on, the job writes them again (said in the log). Without ``resume`` a
            partial file found is discarded (logged).
        progress : bool
            A tqdm progress bar with × real time (when tqdm is installed).
        on_chunk : callable, optional
            ``on_chunk(samples_done)``, called (on the job's writer thread) after each chunk
            is committed to the partial file — its data flushed and the resume record
            written — with the samples of the recording done so far. For progress reports,
            or a test that stops the process there as a kill would. An exception it raises
            stops the job as a failed write would.
        format : {"hdf5", "kilosort", "nwb", "peaks", "span"} or a registered format
            ``"hdf5"``: the HDF5 file described here. ``"kilosort"``: ``out_path`` is a folder
            that Kilosort4, Phy and SpikeInterface read as it is (a flat binary, the probe,
            Phy's params.py; resumable); ``"nwb"``: an NWB file with a processed
            ElectricalSeries (needs pynwb; not resumable). Both hold the traces only
            [samples, channels], uncompressed (`dspk.pipeline.outputs.kilosort`,
            `dspk.pipeline.outputs.nwb`). ``"peaks"``: ``dspk detect``'s folder of peaks.
        inputs : mapping or sequence of paths, optional
            Other files the job reads (a probe file, a sidecar): the output is never one of
            them, with ``overwrite`` or without (``{"--probe": path}`` names the option in
            the message).
        fsync : bool, optional
            Flush the output and its folder to the disk before it is named OUT; False skips
            it. Default: on, unless the environment sets ``DSPK_FSYNC=off``.
        gpu_memory : int, optional
            The most bytes of device memory a GPU job's chunks may use: the chunk is sized
            to fit it (default: to the free device memory) and halved when the device runs
            out of memory all the same, down to a floor (the output does not depend on it).
        **options
            The format's own options (its `dspk.pipeline.outputs.Output` class's keywords).

        Returns
        -------
        pathlib.Path or None
            The completed output (None for an output kept in memory).

        Raises
        ------
        PipelineError
            A refused output or option, or a recording the stages cannot process (before any
            work); `dspk.pipeline.lock.LockedError` when another job is writing the same
            output (its lock ``OUT.lock``, taken before any work, names it).
        dspk.pipeline.JobInterrupted
            Ctrl-C (a `KeyboardInterrupt`): the message says where the job stopped; the
            partial file is kept for ``resume=True`` when a chunk was committed.
        RecordingError, OSError
            From reading the input or writing the output during the job. An error that a
            resume could get past (an OSError such as a full disk) keeps ``OUT.partial`` for
            ``resume=True``; any other (a non-finite or damaged input sample, say) deletes
            it.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, dspk
        >>> tmp = tempfile.TemporaryDirectory()
        >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
        >>> p = dspk.Pipeline.from_options(whiten="global")
        >>> done = []
        >>> out = p.run(dspk.open_recording(x, fs=30000.0), os.path.join(tmp.name, "o.h5"),
        ...             chunk_s=0.1, progress=False, on_chunk=done.append)
        >>> done
        [3000, 6000, 9000]
        >>> tmp.cleanup()
        """
        output = out_path if isinstance(out_path, Output) else \
            output_class(format)(out_path, overwrite=overwrite, **options)
        output.check_options(self, layout, compression, resume)   # before the input opens
        with opened(recording) as rec:
            job = Job(self, rec, output, chunk_s=chunk_s, output_dtype=output_dtype,
                      output_scale=output_scale, layout=layout, compression=compression,
                      inputs=inputs, fsync=fsync, gpu_memory=gpu_memory)
            out = job.run(resume=resume, progress=progress, on_chunk=on_chunk)
            self.last_run = job.timing
            return out

    def run_span(self, recording: Recording | str, path: str, offset: int, s0: int, s1: int,
                 chunk_s: float = 1.0, output_dtype: Any = np.float32, scale: float = 1.0,
                 layout: str = "samples_channels", on_chunk: OnChunk | None = None) -> dict:
        """Samples [s0, s1) of a fitted job into an output prepared beforehand
        (`dspk.pipeline.Job.allocate`): the traces dataset of file ``path``, contiguous at
        byte ``offset`` (``[samples, channels]`` or ``[channels, samples]`` by ``layout``),
        written with ``os.pwrite`` — no HDF5 here, so several processes may fill disjoint
        spans of one file at once (`dspk.dask.run_split`). The chunk loop of `run` (reads
        ahead, writes behind); ``s0`` a multiple of the chunk gives the bytes `run` writes
        there.

        Parameters
        ----------
        recording : Recording or path
            Opened with `dspk.open_recording` when a path (and closed before returning).
        path : str
            The prepared output file.
        offset : int
            The byte offset of its traces' samples (`dspk.io.rawio.raw_offset`).
        s0, s1 : int
            The span.
        chunk_s : float
            Chunk length in seconds.
        output_dtype : float32 or int16
        scale : float
            The units of one int16 step.
        layout : {"samples_channels", "channels_samples"}
        on_chunk : callable, optional
            ``on_chunk(samples_done)`` after each chunk is written, with the samples of the
            span done so far (see `run`).

        Returns
        -------
        dict
            The span's timings (seconds): setup, read, compute, write, wall; and its samples.

        Examples
        --------
        >>> import os, tempfile
        >>> import h5py, numpy as np, dspk
        >>> from dspk.io.rawio import create_contiguous, raw_offset
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = os.path.join(tmp.name, "o.h5")
        >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
        >>> rec = dspk.open_recording(x, fs=30000.0)
        >>> p = dspk.Pipeline.from_options(whiten="global").fit(rec)
        >>> with h5py.File(path, "w") as f:
        ...     offset = raw_offset(create_contiguous(f, "traces", (9000, 4), np.float32))
        >>> for a, b in ((0, 6000), (6000, 9000)):             # two spans, one file
        ...     _ = p.run_span(rec, path, offset, a, b, chunk_s=0.1)
        >>> with h5py.File(path, "r") as f:
        ...     bool(np.allclose(f["traces"][:].T, p.transform(x), atol=1e-5))
        True
        >>> tmp.cleanup()
        """
        with opened(recording) as rec:
            job = Job(self, rec, chunk_s=chunk_s, output_dtype=output_dtype,
                      output_scale=scale, layout=layout)
            return job.run_span(path, offset, s0, s1, on_chunk=on_chunk)

    # -- saving ------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Stages and fitted arrays to an .npz file (`dspk.pipeline.record.save_pipeline`;
        `Pipeline.load` reads it back).

        Parameters
        ----------
        path : str

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, dspk
        >>> x = np.random.default_rng(0).standard_normal((4, 3000)).astype(np.float32)
        >>> p = dspk.Pipeline.from_options(whiten="global")
        >>> p = p.fit(dspk.open_recording(x, fs=30000.0))
        >>> tmp = tempfile.TemporaryDirectory()
        >>> p.save(os.path.join(tmp.name, "pipeline.npz"))
        >>> q = dspk.Pipeline.load(os.path.join(tmp.name, "pipeline.npz"))
        >>> q.steps == p.steps, q.fingerprint() == p.fingerprint(), q.fs
        (True, True, 30000.0)
        >>> tmp.cleanup()
        """
        record.save_pipeline(path, self.steps, self.states, backend=self.backend,
                             dtype=str(self.dtype), fs=self.fs)

    @classmethod
    def load(cls, path: str) -> "Pipeline":
        """A pipeline saved by `Pipeline.save`: its stages (registered classes, by name),
        backend, dtype, sampling rate and fitted arrays (no pickles are read;
        `dspk.pipeline.record.read_pipeline`).

        Parameters
        ----------
        path : str
        """
        meta, steps, states = record.read_pipeline(path)
        return cls(steps, backend=meta["backend"], dtype=meta["dtype"], fs=meta["fs"],
                   states=states)


def preprocess(recording: Any, out_path: str, highpass: float | None = 300.0,
               bandpass: tuple | None = None, reference: str | None = "median",
               whiten: str | None = "local", chunk_s: float = 1.0, backend: str = "auto",
               **run_options: Any) -> Path:
    """One call: open (if a path), build the pipeline from the options, fit, run.
    Keywords as `Pipeline.from_options` and `Pipeline.run`.

    Parameters
    ----------
    recording : Recording or path
        Opened with `dspk.open_recording` (no options) when a path, and closed before
        returning (or raising).
    out_path : str
        The output HDF5 file (see `Pipeline.run`).
    highpass, bandpass, reference, whiten, backend :
        As for `Pipeline.from_options`.
    chunk_s : float
        Chunk length in seconds.
    **run_options
        `Pipeline.from_options`'s other keywords (``n_neighbors``, ``dtype``, ``detect``,
        ``detect_threshold``, registered steps' options) and `Pipeline.run`'s
        (``output_dtype``, ``overwrite``, ``resume``, ``progress``, ...).

    Returns
    -------
    pathlib.Path
        The completed output.

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np, dspk
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rec.h5")
    >>> rng = np.random.default_rng(0)
    >>> with h5py.File(path, "w") as f:            # int16 [samples, channels], fs, geometry
    ...     d = f.create_dataset("traces", data=rng.integers(-200, 200, (30000, 6), np.int16))
    ...     d.attrs["fs"] = 30000.0
    ...     d.attrs["geometry"] = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    >>> out = dspk.preprocess(path, os.path.join(tmp.name, "out.h5"), whiten="local",
    ...                       output_dtype=np.int16, progress=False)
    >>> with h5py.File(out, "r") as f:
    ...     sorted(f), f["traces"].shape, f["traces"].dtype, float(f["traces"].attrs["gain_to_uv"])
    (['channel_ids', 'fitted', 'geometry', 'traces'], (30000, 6), dtype('int16'), 0.01)
    >>> tmp.cleanup()
    """
    pipe_keys = {o.name for o in registry.options()} | {"dtype"}
    pipe_options = {k: run_options.pop(k) for k in pipe_keys & set(run_options)}
    p = Pipeline.from_options(highpass=highpass, bandpass=bandpass, reference=reference,
                              whiten=whiten, backend=backend, **pipe_options)
    return p.run(recording, out_path, chunk_s=chunk_s, **run_options)   # closes what it opens
