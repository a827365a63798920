"""The `Pipeline`: steps (`dspk.pipeline.steps`) in order on [channels, samples] blocks, fitted
on the recording, applied to arrays (`Pipeline.transform`, `Pipeline.apply`), to blocks of a
recording with their halos (`Pipeline.block`), and run as a chunked, resumable job into an
HDF5 file (`Pipeline.run`, `Pipeline.run_span`; the job's files, buffers and loop:
`dspk.pipeline.job`).

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

import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .._version import __version__
from ..backend import resolve_backend
from ..io import Recording
from ..io.rawio import RawDatasetWriter, create_dataset, new_file
from ..ops import CovarianceAccumulator
from .errors import PipelineError
from .job import (READ_AHEAD_COMPRESSED, ChunkStream, OnChunk, PartialOutput, TraceOutput,
                  check_output, check_output_options, chunk_samples, job_record, opened,
                  int16_scale, output_block, progress_bar, read_block, resumable,
                  write_metadata, write_traces)
from .steps import FITTED, STEP_TYPES, BandPass, Detect, HighPass, Reference, Whiten, log

__all__ = ["Pipeline", "preprocess", "fit_spans", "FIT_CHUNKS", "FIT_CHUNK_S"]

#: chunks drawn (seeded) over the recording to fit whitening, and their length in seconds
FIT_CHUNKS, FIT_CHUNK_S = 16, 0.5


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
        Seeds the offsets (the same seed, the same chunks: `Pipeline.fit` and
        `dspk.dask.fit` fit on the same samples).
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
    """Steps applied in order to [channels, samples] float traces.

    Parameters
    ----------
    steps : sequence of HighPass, BandPass, Reference, Whiten, Detect (last)
    backend : {"auto", "cpu", "gpu"}
        Where the steps run ("gpu" without a GPU is an error; "auto" falls back to the CPU).
    dtype : numpy dtype
        Processing precision, float32 (default) or float64.
    states : list of dict, optional
        One per step: what `fit` computed (``"W"`` for whitening, the feature PCA for
        Detect) and per-rate caches. Default: empty (a list of the wrong length is replaced).
    fs : float, optional
        The sampling rate, set by `fit` and `run` (`transform` uses it when not given one).

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
        for s in self.steps:
            if type(s).__name__ not in STEP_TYPES:
                raise PipelineError(f"steps: {s!r} is not a pipeline step "
                                    f"({', '.join(STEP_TYPES)})")
        if any(isinstance(st, Detect) for st in self.steps[:-1]):
            raise PipelineError("steps: Detect must be the last step")
        if np.dtype(self.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise PipelineError(f"dtype: expected float32 or float64, got {self.dtype}")
        self.dtype = np.dtype(self.dtype)
        if len(self.states) != len(self.steps):
            self.states = [{} for _ in self.steps]

    @classmethod
    def from_options(cls, highpass: float | None = 300.0, bandpass: tuple | None = None,
                     reference: str | None = "median", whiten: str | None = "local",
                     n_neighbors: int = 32, backend: str = "auto",
                     dtype: Any = np.float32, detect: bool = False,
                     detect_threshold: float = 7.0) -> "Pipeline":
        """The pipeline of the command line's options (``dspk preprocess``), as keywords:
        a band-pass replaces the high-pass; ``None``/"none" leaves a step out; ``detect``
        appends spike detection (`Detect`, written to the output's /spikes)."""
        steps: list = []
        if bandpass is not None:
            lo, hi = bandpass
            steps.append(BandPass(float(lo), float(hi)))
        elif highpass is not None:
            steps.append(HighPass(float(highpass)))
        if reference not in (None, "none"):
            if reference not in ("median", "mean"):
                raise PipelineError(f"reference: expected 'median', 'mean' or 'none', got "
                                    f"{reference!r}")
            steps.append(Reference(reference))
        if whiten not in (None, "none"):
            if whiten not in ("global", "local"):
                raise PipelineError(f"whiten: expected 'global', 'local' or 'none', got "
                                    f"{whiten!r}")
            steps.append(Whiten(whiten, int(n_neighbors)))
        if detect:
            steps.append(Detect(float(detect_threshold)))
        return cls(steps, backend=backend, dtype=dtype)

    # -- description -----------------------------------------------------------------------------
    def margin(self, fs: float) -> int:
        """Samples of context each side of a chunk so that its output equals the one-shot."""
        return sum(s.margin(fs) for s in self.steps)

    def options(self) -> list:
        """The steps as JSON-able dicts: ``{"step": class name, **its fields}`` each."""
        return [{"step": type(s).__name__, **asdict(s)} for s in self.steps]

    def fingerprint(self) -> str:
        """A digest of the steps and fitted matrices (a resumed job must match it)."""
        h = hashlib.sha256(json.dumps(self.options(), sort_keys=True).encode())
        h.update(str(self.dtype).encode())
        for st in self.states:
            for key in FITTED:
                if key in st:
                    h.update(np.ascontiguousarray(st[key]).tobytes())
        return h.hexdigest()

    # -- what it is --------------------------------------------------------------------------
    @property
    def xp(self) -> Any:
        """The array module the steps run with: ``cupy`` for the GPU backend, else
        ``numpy`` (`dspk.resolve_backend` of ``backend``: "auto" falls back to the CPU).

        Examples
        --------
        >>> import dspk
        >>> dspk.Pipeline.from_options(backend="cpu").xp.__name__
        'numpy'
        """
        if resolve_backend(self.backend) == "gpu":
            import cupy  # noqa: PLC0415

            return cupy
        return np

    @property
    def is_fitted(self) -> bool:
        """Whether every step that fits something has been fitted (`fit`, `load`, the state
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
    def detector(self) -> Detect | None:
        """The `Detect` step (always the last one), or None.

        Examples
        --------
        >>> import dspk
        >>> dspk.Pipeline.from_options(whiten="global", detect=True).detector.threshold
        7.0
        """
        return self.steps[-1] if self.steps and isinstance(self.steps[-1], Detect) else None

    # -- computing -----------------------------------------------------------------------------
    def apply(self, x: Any, fs: float, start: int = 0, n_total: int | None = None,
              upto: int | None = None) -> Any:
        """The steps (the first ``upto``) on a float block x [channels, samples] whose first
        sample is sample ``start`` of a recording of ``n_total`` samples, in place where a
        step allows: the samples outside [0, n_total) are set to zero after every step (the
        signal is zero outside the recording), so a block with its halo gives the samples of
        `transform` on the whole recording.

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
            Only the first ``upto`` steps.

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
        lo, hi = max(0, -start), min(x.shape[1], n_total - start)
        for step, state in list(zip(self.steps, self.states))[:upto]:
            x = step.apply(x, fs, state)
            if lo > 0 or hi < x.shape[1]:
                x[:, :lo] = 0
                x[:, hi:] = 0
        return x

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
        return self.apply(y, fs, 0, x.shape[1])

    def block(self, recording: Recording, s0: int, s1: int, upto: int | None = None,
              halo: int = 0, xp: Any = None) -> Any:
        """Samples [s0 - halo, s1 + halo) of the recording through the steps (the first
        ``upto``): read with the steps' margins of context on each side (zeros outside the
        recording) and trimmed — the same samples as the steps on the whole recording.

        Parameters
        ----------
        recording : Recording
        s0, s1 : int
            The samples wanted.
        upto : int, optional
            Only the first ``upto`` steps (and their margins).
        halo : int
            Extra samples on each side, at most those steps' margin (a detector's context).
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
        m = sum(s.margin(recording.fs) for s in self.steps[:upto])
        if not 0 <= halo <= m:
            raise ValueError(f"halo: expected 0..{m} (the steps' margin), got {halo}")
        raw = read_block(recording, s0, s1, m)
        full = self._compute(raw, recording, s0, s1, m, xp or self.xp, upto)
        return full[:, m - halo:m + (s1 - s0) + halo]

    def _compute(self, raw: tuple, recording: Recording, s0: int, s1: int, m: int, xp: Any,
                 upto: int | None = None) -> Any:
        """The steps on a block read with `read_block` (first sample, µV block), padded with
        zeros where the halo lies outside the recording: [s0 - m, s1 + m)."""
        a, block = raw
        width = s1 - s0 + 2 * m
        if a == s0 - m and block.shape[1] == width:   # inside the recording: no padding
            x = xp.asarray(block).astype(self.dtype, copy=False)
        else:
            x = xp.zeros((recording.n_channels, width), dtype=self.dtype)
            x[:, a - (s0 - m):a - (s0 - m) + block.shape[1]] = \
                xp.asarray(block).astype(self.dtype, copy=False)
        return self.apply(x, recording.fs, s0 - m, recording.n_samples, upto)

    # -- fitting -------------------------------------------------------------------------------
    def fit(self, recording: Recording, seed: int = 0, n_chunks: int = FIT_CHUNKS,
            chunk_s: float = FIT_CHUNK_S) -> "Pipeline":
        """Fit the steps that fit something on ``n_chunks`` chunks of ``chunk_s`` seconds at
        seeded positions spread over the recording (`fit_spans`; each chunk passed through
        the steps before): whitening on their covariance (`Whiten.fit`), then detection's
        noise and feature PCA (`Detect.fit`). `check` first: a recording the steps cannot
        process is refused before any work.

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

        Examples
        --------
        >>> import numpy as np, dspk
        >>> x = np.random.default_rng(0).standard_normal((4, 30000)).astype(np.float32)
        >>> p = dspk.Pipeline.from_options(whiten="global").fit(dspk.open_recording(x, fs=3e4))
        >>> p.states[-1]["W"].shape, p.fs
        ((4, 4), 30000.0)
        """
        self.check(recording)
        self.fs = recording.fs
        xp = self.xp
        spans = fit_spans(recording.n_samples, recording.fs, seed, n_chunks, chunk_s)
        for k, step in enumerate(self.steps):
            if not isinstance(step, Whiten):
                continue
            acc = CovarianceAccumulator()
            m = sum(s.margin(recording.fs) for s in self.steps[:k])
            for (s0, s1), x in zip(spans, self._fit_blocks(recording, spans, m, xp, k)):
                acc.add(x[:, m:m + (s1 - s0)])
            self.set_fitted(k, step.fit(acc, recording.geometry))
        det = self.detector
        if det is not None:
            if recording.geometry is None:
                raise PipelineError("Detect: needs the recording's geometry")
            m, md = self.margin(recording.fs), det.margin(recording.fs)
            self.set_fitted(-1, {})        # no noise of an earlier fit while measuring
            nears = [full[:, m - md:m + (s1 - s0) + md] for (s0, s1), full in
                     zip(spans, self._fit_blocks(recording, spans, m, xp))]
            self.set_fitted(-1, det.fit(nears, recording.fs, recording.geometry))
        return self

    def _fit_blocks(self, recording: Recording, spans: list, m: int, xp: Any,
                    upto: int | None = None) -> Any:
        """The fit chunks with m samples of context through the first ``upto`` steps, in
        order: read in threads (several decompress at once), computed here."""
        with ThreadPoolExecutor(READ_AHEAD_COMPRESSED) as pool:
            raws = pool.map(lambda sp: read_block(recording, sp[0], sp[1], m), spans)
            for (s0, s1), raw in zip(spans, raws):
                yield self._compute(raw, recording, s0, s1, m, xp, upto)

    def set_fitted(self, k: int, state: dict) -> None:
        """Replace step k's fitted state with ``state`` (what its ``fit`` returned), dropping
        what it had cached from the old one (a whitening matrix on the device, say).

        Parameters
        ----------
        k : int
            The step's index (negative counts from the end).
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
        self.states[k].clear()
        self.states[k].update(state)

    def tune(self, recording: Recording, chunk_s: float = 1.0) -> "Pipeline":
        """Take now every tuner decision a job on ``recording`` will need — fit (its chunks),
        a full chunk and the last, shorter one through every step, detection included — so
        that they are in the tuner's cache file before any job starts: processes that share
        the cache then make the same choices (the same bits; a resumed job's fitted matrices
        match the killed one's).

        Parameters
        ----------
        recording : Recording
        chunk_s : float
            The job's chunk length in seconds.

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
        self.check(recording)
        self.fit(recording)
        fs, n = recording.fs, recording.n_samples
        chunk = min(n, chunk_samples(chunk_s, fs))
        det = self.detector
        md = det.margin(fs) if det is not None else 0
        last = n - (n - 1) // chunk * chunk
        for s0, s1 in {(0, chunk), (n - last, n)}:
            # computed with the job's margin (the shapes of the job's chunks: its products)
            near = self.block(recording, s0, s1, halo=md)
            if det is not None:
                spikes = det.spikes(near, fs, recording.geometry, self.states[-1])
                pca = det.pca(self.states[-1])
                if pca is not None:
                    det.features_of(near, spikes, fs, recording.geometry, pca)
        return self

    def check(self, recording: Recording) -> None:
        """Refuse, before any work, a recording the steps cannot process as asked.

        Local whitening and detection need the recording's geometry; a common reference
        needs more than one channel (the reference of one channel is the channel itself:
        its output would be zeros). `fit`, `tune` and `run` call it first.

        Parameters
        ----------
        recording : Recording
            The recording the pipeline is to be fitted on or run over.

        Raises
        ------
        PipelineError
            Naming the step, what it needs and what to pass instead.

        Examples
        --------
        >>> import numpy as np, dspk
        >>> rec = dspk.open_recording(np.zeros((3000, 1), np.int16), fs=30000.0)
        >>> dspk.Pipeline.from_options(whiten="global").check(rec)   # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dspk.pipeline.PipelineError: reference='median': the recording has 1 channel; ...
        """
        for step in self.steps:
            if isinstance(step, Reference) and recording.n_channels < 2:
                raise PipelineError(
                    f"reference={step.operator!r}: the recording has 1 channel; a common "
                    f"reference across channels would subtract it from itself (all zeros). "
                    f"Use reference='none' (--reference none)")
            if recording.geometry is None and (isinstance(step, Detect) or
                                               (isinstance(step, Whiten) and
                                                step.mode == "local")):
                what = "detect=True" if isinstance(step, Detect) else "whiten='local'"
                alt = "" if isinstance(step, Detect) else \
                    ", or use whiten='global' (--whiten global)"
                raise PipelineError(
                    f"{what} needs the recording's geometry (channel positions in µm), and "
                    f"{getattr(recording, 'source', '') or 'the recording'} has none: pass "
                    f"geometry= to dspk.open_recording (--probe FILE on the command line)"
                    f"{alt}")

    # -- the fitted state in files -------------------------------------------------------------
    def write_fitted(self, f: Any, fs: float) -> None:
        """The fitted state into an open HDF5 output: ``/fitted/step{k}_{Name}/{key}`` for
        each fitted array (and the FIR steps' taps, for the record); `read_fitted` reads it
        back.

        Parameters
        ----------
        f : h5py.File or Group
        fs : float
            The sampling rate (of the taps).

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
        for k, (step, st) in enumerate(zip(self.steps, self.states)):
            for key in FITTED:
                if key in st:
                    create_dataset(f, f"fitted/step{k}_{type(step).__name__}/{key}",
                                   data=st[key])
            if isinstance(step, HighPass):
                create_dataset(f, f"fitted/step{k}_{type(step).__name__}/taps",
                               data=step.taps(fs))

    def read_fitted(self, path: str | Path) -> list:
        """The fitted state that `write_fitted` stored in an output (or partial) file, one
        dict per step of this pipeline (this pipeline is not changed).

        Parameters
        ----------
        path : path
            An output of `run` (or its partial file).

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
        import h5py  # noqa: PLC0415

        states: list = [{} for _ in self.steps]
        with h5py.File(path, "r") as f:
            for k, step in enumerate(self.steps):
                group = f.get(f"fitted/step{k}_{type(step).__name__}")
                for key in FITTED:
                    if group is not None and key in group:
                        states[k][key] = np.asarray(group[key][()], dtype=np.float64)
                if isinstance(step, Detect):
                    states[k]["pca_fitted"] = True
        return states

    # -- the batch job -------------------------------------------------------------------------
    def run(self, recording: Recording | str, out_path: str, chunk_s: float = 1.0,
            output_dtype: Any = np.float32, output_scale: float | None = None,
            layout: str = "samples_channels", compression: str | None = None,
            overwrite: bool = False, resume: bool = False, progress: bool = True,
            on_chunk: OnChunk | None = None) -> Path:
        """Process a recording chunk by chunk into an HDF5 file.

        Everything that can be checked is checked first — the output (it exists and
        ``overwrite`` is not set; it is the input, under any spelling or link; its folder is
        missing or not writable), the options, and what the steps need of the recording
        (geometry for local whitening and detection, more than one channel for a common
        reference) — so a refused job has fitted nothing and created no file. Then the
        pipeline is fitted unless it is already (or unless a resumed job's partial file holds
        its fitted state), and the chunks are written to ``OUT.partial``, renamed ``OUT``
        when complete. Two runs of one job write the same bytes (no HDF5 object times are
        stored), and so do a resumed job and one that never stopped.

        Parameters
        ----------
        recording : Recording or path
            Opened with `dspk.open_recording` when a path (and closed before returning).
        out_path : str
            The output file; refused if it exists unless ``overwrite``.
        chunk_s : float
            Chunk length in seconds (the output does not depend on it).
        output_dtype : float32 or int16
            int16 stores round(y / output_scale) (default scale: 0.01 when whitened — units of
            the noise's standard deviation — else 0.1 µV), clipped to the int16 range.
        output_scale : float, optional
            The units of one int16 step (see ``output_dtype``).
        layout : {"samples_channels", "channels_samples"}
        compression : None, "gzip" or "lzf"
        overwrite : bool
            Replace an existing output.
        resume : bool
            Continue a killed job from its partial file, with the fitted state stored there
            (no refit), when the partial job is this one (steps, recording, chunk, output
            type); otherwise start over. Without ``resume`` a partial file found is discarded
            (logged).
        progress : bool
            A tqdm progress bar with × real time (when tqdm is installed).
        on_chunk : callable, optional
            ``on_chunk(samples_done)``, called (on the job's writer thread) after each chunk
            is committed to the partial file — its data flushed and the resume record
            written — with the samples of the recording done so far. For progress reports,
            or a test that stops the process there as a kill would. An exception it raises
            stops the job as a failed write would.

        Returns
        -------
        pathlib.Path
            The completed output.

        Raises
        ------
        PipelineError
            A refused output or option, or a recording the steps cannot process (before any
            work).
        RecordingError, OSError
            From reading the input or writing the output during the job. An error that a
            resume could get past (an interruption, an OSError such as a full disk) keeps
            ``OUT.partial`` for ``resume=True``; any other (a non-finite or damaged input
            sample, say) deletes it.

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
        with opened(recording) as rec:
            return self._run(rec, out_path, chunk_s, output_dtype, output_scale, layout,
                             compression, overwrite, resume, progress, on_chunk)

    def _run(self, rec: Recording, out_path: str, chunk_s: float, output_dtype: Any,
             output_scale: float | None, layout: str, compression: str | None,
             overwrite: bool, resume: bool, progress: bool, on_chunk: OnChunk | None) -> Path:
        # -- every check before any work: nothing fitted, no file created when one fails
        out = check_output(out_path, rec, overwrite)
        files = PartialOutput(out)
        out_dtype = check_output_options(output_dtype, layout, compression, chunk_s)
        self.check(rec)
        scale = int16_scale(out_dtype, output_scale,
                             any(isinstance(s, Whiten) for s in self.steps))
        chunk = chunk_samples(chunk_s, rec.fs)
        n = rec.n_samples
        done = spikes = 0
        if resume:
            done, spikes = self._resume_point(rec, files, chunk, out_dtype, scale, layout,
                                              compression)
        elif files.partial.exists():
            log.warning("%s: discarding the partial output of an earlier job (resume=True, "
                        "--resume on the command line, continues it instead)", files.partial)
        if not self.is_fitted:
            self.fit(rec)
        self.fs = rec.fs
        job = job_record(self.fingerprint(), rec, chunk, out_dtype, scale, layout, compression)
        if done == 0:
            files.discard()
        f, done, spikes = _open_partial(files, done, spikes)
        decompress0 = rec.decompress_s
        bar = progress_bar(progress, n, done, rec.fs)
        t0 = time.perf_counter()
        # an interruption or an OSError (a full disk, say) may pass on a resume: the partial
        # file is kept for it (when a chunk was recorded as written); anything else (a
        # non-finite or damaged input sample, ...) would stop the resumed job at the same
        # place: no partial file is left behind
        with files.writing(keep=lambda exc: resumable(exc) and files.progress.exists()):
            try:
                with f:
                    timing, staging = self._write(f, rec, job, files, done, spikes, chunk,
                                                  out_dtype, scale, layout, compression, bar,
                                                  on_chunk)
            finally:
                if bar is not None:
                    bar.close()
        dt = time.perf_counter() - t0
        transfer = staging.transfer_s if staging is not None else 0.0
        timing["compute_s"] -= transfer
        self.last_run = {**timing, "transfer_s": transfer,
                         "decompress_s": rec.decompress_s - decompress0,
                         "wall_s": dt, "samples": n - done,
                         "x_real_time": (n - done) / rec.fs / max(dt, 1e-9)}
        log.info("%s: %d samples in %.2f s (%.1f x real time; read %.2f s, compute %.2f s, "
                 "write %.2f s, overlapped)", out, n - done, dt, self.last_run["x_real_time"],
                 timing["read_s"], timing["compute_s"], timing["write_s"])
        return out

    def _resume_point(self, rec: Recording, files: PartialOutput, chunk: int, out_dtype: Any,
                      scale: float, layout: str, compression: str | None) -> tuple:
        """(samples done, spikes written) of the partial job that this job continues, or
        (0, 0) to start over. An unfitted pipeline takes the fitted state stored in the
        partial file (no refit) when the partial job's record, fingerprint included, is the
        one this job would make with that state."""
        partial = files.partial
        if not partial.exists():
            return 0, 0
        if not files.progress.exists():
            log.warning("%s: no progress record next to it; starting over", partial)
            return 0, 0
        try:
            record = files.read_record()
            states = self.states if self.is_fitted else self.read_fitted(partial)
            trial = Pipeline(self.steps, backend=self.backend, dtype=self.dtype,
                             states=states)
            job = job_record(trial.fingerprint(), rec, chunk, out_dtype, scale, layout,
                             compression)
            if {k: record.get(k) for k in job} != job or not trial.is_fitted:
                log.warning("%s: a partial job with other parameters; starting over", partial)
                return 0, 0
            done, spikes = int(record["done"]), int(record.get("spikes", 0))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: unreadable partial job (%s); starting over", partial, exc)
            return 0, 0
        if states is not self.states:
            self.states = states
            log.info("%s: resuming at sample %d with the fitted state stored there", partial,
                     done)
        return done, spikes

    def _write(self, f: Any, rec: Recording, job: dict, files: PartialOutput, done: int,
               spikes_done: int, chunk: int, out_dtype: Any, scale: float, layout: str,
               compression: str | None, bar: Any, on_chunk: OnChunk | None) -> tuple:
        """The job's datasets (made when ``done`` is 0) and its chunks from ``done`` on, into
        the open partial file ``f``; returns (timings, GPU staging or None)."""
        n, c = rec.n_samples, rec.n_channels
        if done == 0:
            TraceOutput.create_traces(f, (n, c) if layout == "samples_channels" else (c, n),
                                      out_dtype, layout, chunk, compression)
            write_metadata(f, rec, job, self.options())
            self.write_fitted(f, rec.fs)    # a resumed job reads it back (read_fitted)
        m = self.margin(rec.fs)
        stream = ChunkStream(rec, self.xp, chunk, m, out_dtype, layout)
        output = TraceOutput(f, files.partial, layout, transposed=stream.staging is not None)
        det = self.detector
        md = det.margin(rec.fs) if det is not None else 0
        pca = None
        if det is not None:
            from ..detect import SPIKE_DTYPE  # noqa: PLC0415

            pca = det.pca(self.states[-1])
            output.spike_datasets(SPIKE_DTYPE, None if pca is None else
                                  (min(det.n_neighbors, c), det.features), spikes_done)
        timing = stream.timing

        def compute(i: int, raw: tuple, s0: int, s1: int) -> tuple:
            full = self._compute(stream.to_device(raw), rec, s0, s1, m, stream.xp)
            spikes = feats = None
            if det is not None:
                # the exact part of the traces around the chunk: [s0 - md, s1 + md)
                near = full[:, m - md:m + (s1 - s0) + md]
                spikes, feats = det.chunk_spikes(near, s0, s1, rec.fs, rec.geometry,
                                                 self.states[-1], pca)
            y = output_block(i, full[:, m:m + (s1 - s0)], stream.staging, out_dtype, scale)
            return y, spikes, feats

        def write(s0: int, s1: int, result: tuple) -> None:
            y, spikes, feats = result
            t = time.perf_counter()
            output.write(s0, s1, y)
            total = output.append_spikes(spikes, feats) if spikes is not None else 0
            f.flush()
            files.record(job, s1, total)        # committed: a resume starts after s1
            timing["write_s"] += time.perf_counter() - t
            if on_chunk is not None:
                on_chunk(s1)
            if bar is not None:
                bar.update(s1 - s0)

        try:
            stream.run(list(range(done, n, chunk)), n, compute, write)
        finally:
            output.close()
        return timing, stream.staging

    def run_span(self, recording: Recording | str, path: str, offset: int, s0: int, s1: int,
                 chunk_s: float = 1.0, output_dtype: Any = np.float32, scale: float = 1.0,
                 layout: str = "samples_channels", on_chunk: OnChunk | None = None) -> dict:
        """Samples [s0, s1) of a fitted job into an output prepared beforehand: the traces
        dataset of file ``path``, contiguous at byte ``offset`` (``[samples, channels]`` or
        ``[channels, samples]`` by ``layout``), written with ``os.pwrite`` — no HDF5 here, so
        several processes may fill disjoint spans of one file at once (`dspk.dask.run_split`).
        The chunk loop of `run` (reads ahead, writes behind); ``s0`` a multiple of the chunk
        gives the bytes `run` writes there.

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
            return self._run_span(rec, path, offset, s0, s1, chunk_s, output_dtype, scale,
                                  layout, on_chunk)

    def _run_span(self, rec: Recording, path: str, offset: int, s0: int, s1: int,
                  chunk_s: float, output_dtype: Any, scale: float, layout: str,
                  on_chunk: OnChunk | None) -> dict:
        t0 = time.perf_counter()
        if self.detector is not None:
            raise PipelineError("run_span: the Detect step writes spikes; use run")
        if not self.is_fitted:
            raise PipelineError("run_span: fit the pipeline first (every span must use one W)")
        self.fs = rec.fs
        out_dtype = np.dtype(output_dtype)
        n, c = rec.n_samples, rec.n_channels
        if not 0 <= s0 <= s1 <= n:
            raise ValueError(f"s0, s1: expected 0 <= s0 <= s1 <= {n}, got {s0}, {s1}")
        chunk = chunk_samples(chunk_s, rec.fs)
        shape = (n, c) if layout == "samples_channels" else (c, n)
        raw_out = RawDatasetWriter(path, offset=offset, shape=shape, dtype=out_dtype)
        m = self.margin(rec.fs)
        stream = ChunkStream(rec, self.xp, chunk, m, out_dtype, layout)
        timing = stream.timing
        transposed = stream.staging is not None

        def compute(i: int, raw: tuple, a: int, b: int) -> np.ndarray:
            full = self._compute(stream.to_device(raw), rec, a, b, m, stream.xp)
            return output_block(i, full[:, m:m + (b - a)], stream.staging, out_dtype, scale)

        def write(a: int, b: int, y: np.ndarray) -> None:
            t = time.perf_counter()
            write_traces(raw_out, None, a, b, y, layout, transposed)
            timing["write_s"] += time.perf_counter() - t
            if on_chunk is not None:
                on_chunk(b - s0)

        timing["setup_s"] = time.perf_counter() - t0
        try:
            stream.run(list(range(s0, s1, chunk)), s1, compute, write)
        finally:
            raw_out.close()
        return {**timing, "wall_s": time.perf_counter() - t0, "samples": s1 - s0}


    # -- saving ------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Steps and fitted matrices to an .npz file (`Pipeline.load` reads it back).

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
        arrays = {f"{key}{k}": st[key] for k, st in enumerate(self.states)
                  for key in FITTED if key in st}
        meta = {"steps": self.options(), "backend": self.backend, "dtype": str(self.dtype),
                "fs": self.fs, "dspk": __version__}
        np.savez(path, meta=json.dumps(meta), **arrays)

    @classmethod
    def load(cls, path: str) -> "Pipeline":
        """A pipeline saved by `Pipeline.save`: its steps, backend, dtype, sampling rate and
        fitted matrices (no pickles are read)."""
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            steps = []
            for spec in meta["steps"]:
                spec = dict(spec)
                kind = spec.pop("step")
                if kind not in STEP_TYPES:
                    raise PipelineError(f"{path}: unknown step {kind!r}")
                steps.append(STEP_TYPES[kind](**spec))
            p = cls(steps, backend=meta["backend"], dtype=meta["dtype"], fs=meta["fs"])
            for k in range(len(steps)):
                for key in FITTED:
                    if f"{key}{k}" in z:
                        p.states[k][key] = z[f"{key}{k}"]
                if "pca_components" in p.states[k]:
                    p.states[k]["pca_fitted"] = True
        return p


def _open_partial(files: PartialOutput, done: int, spikes: int) -> tuple:
    """(open h5py file, samples done, spikes written): the partial file reopened to continue
    at ``done``, or a new one (``done`` 0, or a partial file that cannot be reopened: then
    the job starts over)."""
    import h5py  # noqa: PLC0415

    try:
        f = h5py.File(files.partial, "a") if done else new_file(files.partial)
        if done and "traces" not in f:
            f.close()
            raise OSError("no traces dataset")
    except OSError:
        log.warning("%s: cannot be reopened; starting over", files.partial)
        files.discard()
        return new_file(files.partial), 0, 0
    return f, done, spikes


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
        ``detect_threshold``) and `Pipeline.run`'s (``output_dtype``, ``overwrite``,
        ``resume``, ``progress``, ...).

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
    (['fitted', 'geometry', 'traces'], (30000, 6), dtype('int16'), 0.01)
    >>> tmp.cleanup()
    """
    pipe_keys = {"n_neighbors", "dtype", "detect", "detect_threshold"}
    pipe_options = {k: run_options.pop(k) for k in pipe_keys & set(run_options)}
    p = Pipeline.from_options(highpass=highpass, bandpass=bandpass, reference=reference,
                              whiten=whiten, backend=backend, **pipe_options)
    return p.run(recording, out_path, chunk_s=chunk_s, **run_options)   # closes what it opens
