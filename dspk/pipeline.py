"""The streaming pipeline: a recording in, preprocessed traces (HDF5) out, chunk by chunk.

A `Pipeline` is a list of steps on [channels, samples] float arrays: `HighPass` / `BandPass`
(linear-phase FIR), `Reference` (median or mean across channels) and `Whiten` (global or local
ZCA, fitted on a seeded sample of chunks spread over the recording). A chunk is read with a
halo of ``margin`` samples on each side (the FIR steps' half lengths, summed), processed, and
its inner part written, so the output does not depend on the chunk size (up to float32
rounding of the FFT filters). Outside the recording the signal is zero, as in the one-shot
ops: after every step the samples outside [0, n) are set to zero again, so a chunk at an edge
equals the same samples of `Pipeline.transform` on the whole recording.

Output: HDF5, ``/traces`` [samples, channels] (or [channels, samples]), float32 or int16 with a
scale; with a `Detect` step also ``/spikes`` (`dspk.detect.SPIKE_DTYPE`, sorted by time) and,
row for row, ``/features`` [spikes, neighbours, components] (PCA of each spike's waveform on
its neighbour channels, the PCA fitted on the fit chunks' spikes) and ``/feature_channels``
[spikes, neighbours]; written to ``OUT.partial`` and renamed when complete; ``resume=True``
continues a job that was killed from the last chunk it recorded as written (the progress is
kept next to the partial file and written only after the chunk's data is flushed), with the
fitted state stored in the partial file, giving the same bytes as a job that never stopped
(no HDF5 object times are stored: two runs of a job write the same file). The output is
checked (not the input, not an existing file without ``overwrite``, a folder that exists) and
so is what the steps need of the recording (`Pipeline.check`) before anything is fitted or
written. The input is opened read-only and never written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ._version import __version__
from .backend import array_module, blocked_transpose, resolve_backend, to_numpy
from .io import Recording, open_recording
from .io.rawio import (RawDatasetWriter, create_contiguous, create_dataset, new_file,
                       raw_offset)
from .ops import (CovarianceAccumulator, bandpass_taps, common_reference, fir_filter,
                  highpass_taps, SpatialFilter, whitening_matrix)

__all__ = ["Pipeline", "HighPass", "BandPass", "Reference", "Whiten", "preprocess",
           "PipelineError"]

log = logging.getLogger("dspk.pipeline")

#: chunks drawn (seeded) over the recording to fit whitening, and their length in seconds
FIT_CHUNKS, FIT_CHUNK_S = 16, 0.5
#: the fitted arrays a step's state may hold (saved, written to the output, fingerprinted)
FITTED = ("W", "pca_mean", "pca_components", "noise")


class PipelineError(ValueError):
    """A pipeline that cannot run as asked (the message says why).

    A `ValueError`, so ``except ValueError`` catches it too.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline import Pipeline, PipelineError, Whiten
    >>> x = np.zeros((4, 3000), dtype=np.float32)
    >>> try:
    ...     Pipeline([Whiten("global")]).transform(x, fs=30000.0)
    ... except PipelineError as exc:
    ...     print(exc)
    Whiten: not fitted (call Pipeline.fit(recording) first)
    """


# -- steps -------------------------------------------------------------------------------------
@dataclass
class HighPass:
    """Linear-phase FIR high-pass (`dspk.highpass_taps`): ``|H|`` <= 0.03 below 2/3 of the
    cutoff, >= 0.97 above 4/3 of it.

    A pipeline step: the taps are designed once per sampling rate; its `margin` (half the
    taps) is the context a chunk needs on each side.

    Parameters
    ----------
    cutoff_hz : float
        The -6 dB frequency in Hz.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline import HighPass, Pipeline
    >>> HighPass(300.0).margin(30000.0)             # samples of context per side
    131
    >>> t = np.arange(6000) / 30000.0
    >>> x = np.stack([np.sin(2 * np.pi * 50 * t), np.sin(2 * np.pi * 2000 * t)])
    >>> y = Pipeline([HighPass(300.0)]).transform(x.astype(np.float32), fs=30000.0)
    >>> np.round(np.abs(y[:, 1000:5000]).max(axis=1), 1)   # 50 Hz removed, 2 kHz kept
    array([0., 1.], dtype=float32)
    """
    cutoff_hz: float = 300.0

    def taps(self, fs: float) -> np.ndarray:
        """The FIR taps at sampling rate ``fs`` (float64, odd length)."""
        return highpass_taps(fs, self.cutoff_hz)

    def margin(self, fs: float) -> int:
        """Samples of context a chunk needs on each side: half the taps."""
        return len(self.taps(fs)) // 2

    def apply(self, x: Any, fs: float, state: dict) -> Any:
        """The filter on a block x [channels, samples] (`dspk.fir_filter`); ``state`` keeps
        the taps of the last sampling rate."""
        if state.get("fs") != fs:          # designed once per sampling rate, not per chunk
            state["taps"], state["fs"] = self.taps(fs), fs
        return fir_filter(x, state["taps"])


@dataclass
class BandPass(HighPass):
    """Linear-phase FIR band-pass (`dspk.bandpass_taps`).

    Parameters
    ----------
    cutoff_hz : float
        The lower band edge (gain 0.5) in Hz; the transition widths are 2/3 of it.
    high_hz : float
        The upper band edge (gain 0.5) in Hz, below fs/2.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline import BandPass, Pipeline
    >>> t = np.arange(6000) / 30000.0
    >>> x = np.stack([np.sin(2 * np.pi * f * t) for f in (50.0, 1000.0, 8000.0)])
    >>> y = Pipeline([BandPass(300.0, 3000.0)]).transform(x.astype(np.float32), fs=30000.0)
    >>> np.round(np.abs(y[:, 1000:5000]).max(axis=1), 1)   # only 1 kHz passes
    array([0., 1., 0.], dtype=float32)
    """
    cutoff_hz: float = 300.0
    high_hz: float = 6000.0

    def taps(self, fs: float) -> np.ndarray:
        """The FIR taps at sampling rate ``fs`` (float64, odd length)."""
        return bandpass_taps(fs, self.cutoff_hz, self.high_hz)


@dataclass
class Reference:
    """Common reference across channels, per sample: ``operator`` "median" or "mean".

    Parameters
    ----------
    operator : {"median", "mean"}
        As for `dspk.common_reference` (all channels, one group).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline import Pipeline, Reference
    >>> x = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [10.0, 0.0, 0.0]], dtype=np.float32)
    >>> Pipeline([Reference("median")]).transform(x, fs=30000.0)
    array([[-1.,  0.,  0.],
           [ 0.,  2.,  3.],
           [ 8., -2., -3.]], dtype=float32)
    """
    operator: str = "median"

    def margin(self, fs: float) -> int:
        """0: each sample is referenced on its own."""
        return 0

    def apply(self, x: Any, fs: float, state: dict) -> Any:
        """The reference subtracted from a block x [channels, samples]; `PipelineError` for
        one channel (its own reference: the output would be zeros)."""
        if x.shape[0] < 2:
            raise PipelineError(f"reference={self.operator!r}: the traces have 1 channel; a "
                                f"common reference across channels would subtract it from "
                                f"itself (all zeros). Use reference='none' (--reference none)")
        return common_reference(x, self.operator)


@dataclass
class Whiten:
    """ZCA whitening fitted on the recording: "global", or "local" (each channel against its
    ``n_neighbors`` nearest channels; needs the recording's geometry).

    `Pipeline.fit` computes W (`dspk.whitening_matrix`) from the covariance of the fit chunks
    after the steps before this one; it is kept in the step's state (``"W"``, float64) and
    applied in the traces' dtype.

    Parameters
    ----------
    mode : {"local", "global"}
    n_neighbors : int
        Neighbourhood size for local whitening (at most the channel count is used).
    eps : float, optional
        Regularization, as for `dspk.whitening_matrix`.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline import Pipeline, Whiten
    >>> rng = np.random.default_rng(0)
    >>> x = ((np.eye(6) + 0.5 * np.eye(6, k=1)) @ rng.standard_normal((6, 30000)))
    >>> geom = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    >>> rec = dspk.open_recording(x.astype(np.float32), fs=30000.0, geometry=geom)
    >>> p = Pipeline([Whiten("local", n_neighbors=3)]).fit(rec)
    >>> (p.states[0]["W"] != 0).sum(axis=1)           # 3 non-zeros per row
    array([3, 3, 3, 3, 3, 3])
    """
    mode: str = "local"
    n_neighbors: int = 32
    eps: float | None = None

    def margin(self, fs: float) -> int:
        """0: a spatial step needs no context in time."""
        return 0

    def apply(self, x: Any, fs: float, state: dict) -> Any:
        """W·x for a block x [channels, samples] (`dspk.SpatialFilter` of the fitted W, made
        once per array module and dtype); `PipelineError` before `Pipeline.fit`."""
        if "W" not in state:
            raise PipelineError("Whiten: not fitted (call Pipeline.fit(recording) first)")
        xp = array_module(x)
        cached = state.setdefault("_W_dev", {})
        key = (xp.__name__, x.dtype.str)
        if key not in cached:   # W on x's device and in x's dtype, prepared once
            cached[key] = SpatialFilter(xp.asarray(state["W"].astype(x.dtype)))
        return cached[key](x)


@dataclass
class Detect:
    """Spike detection on the processed traces (`dspk.detect_spikes`), the last step. Its
    margin (the templates' half length plus the dead time) makes the spikes of a chunk those
    of the whole recording: no spike missed or doubled at a chunk edge.

    Parameters
    ----------
    threshold, n_neighbors, dead_time_ms :
        As for `dspk.detect_spikes` (the default templates).
    features : int
        PCA components per neighbour channel written for every spike (0: none).

    Examples
    --------
    >>> from dspk.pipeline import Detect, Pipeline
    >>> p = Pipeline.from_options(whiten="global", detect=True)
    >>> p.steps[-1]
    Detect(threshold=7.0, n_neighbors=10, dead_time_ms=0.67, features=3)
    >>> p.steps[-1].margin(30000.0)                # half the templates + the dead time + 1
    51
    """
    threshold: float = 7.0
    n_neighbors: int = 10
    dead_time_ms: float = 0.67
    #: PCA components per neighbour channel written for every spike (0: none); the PCA is
    #: fitted on the spikes of the fit chunks (`Pipeline.fit`)
    features: int = 3

    def margin(self, fs: float) -> int:
        from .detect import default_templates  # noqa: PLC0415

        return default_templates(fs).shape[1] // 2 + \
            max(1, int(round(self.dead_time_ms * 1e-3 * fs))) + 1

    def apply(self, x: Any, fs: float, state: dict) -> Any:
        return x                     # traces pass through; spikes are taken by Pipeline.run

    def spikes(self, x: Any, fs: float, geometry: Any, state: dict) -> np.ndarray:
        """The spikes of x, the threshold in units of the noise measured on the fit chunks
        (``state["noise"]``; on x itself before the fit)."""
        from .detect import detect_spikes  # noqa: PLC0415

        return detect_spikes(x, geometry, fs, threshold=self.threshold,
                             n_neighbors=self.n_neighbors, dead_time_ms=self.dead_time_ms,
                             noise=state.get("noise"))

    def pca(self, state: dict) -> Any:
        """The fitted feature PCA (None when features are off or nothing was fitted)."""
        if self.features <= 0 or "pca_components" not in state:
            return None
        from .ops import PCA  # noqa: PLC0415

        p = PCA(self.features)
        p.mean_ = state["pca_mean"].astype(np.float32)
        p.components_ = state["pca_components"].astype(np.float32)
        return p

    def features_of(self, x: Any, spikes: np.ndarray, fs: float, geometry: Any,
                    pca: Any) -> tuple:
        """(features float32 [n, neighbours, components], channels int32 [n, neighbours]) of
        spikes local to x (`dspk.spike_features` with the fitted PCA)."""
        from .detect import spike_clips  # noqa: PLC0415

        clips, chans = spike_clips(x, spikes, geometry, fs, self.n_neighbors)
        if len(spikes) == 0:
            feats = np.zeros((0, chans.shape[1], self.features), np.float32)
        else:
            feats = np.asarray(pca.transform(clips), dtype=np.float32)
        return feats, chans.astype(np.int32)


STEP_TYPES = {"HighPass": HighPass, "BandPass": BandPass, "Reference": Reference,
              "Whiten": Whiten, "Detect": Detect}


# -- the pipeline ------------------------------------------------------------------------------
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

    # -- computing ---------------------------------------------------------------------------------
    def _xp(self) -> Any:
        if resolve_backend(self.backend) == "gpu":
            import cupy  # noqa: PLC0415

            return cupy
        return np

    def _run_steps(self, x: Any, fs: float, start: int, n_total: int,
                   upto: int | None = None) -> Any:
        """The steps (the first ``upto``) on a block whose first sample is ``start`` of a
        recording of ``n_total`` samples; samples outside [0, n_total) zeroed after each."""
        lo, hi = max(0, -start), min(x.shape[1], n_total - start)
        for step, state in list(zip(self.steps, self.states))[:upto]:
            x = step.apply(x, fs, state)
            if lo > 0 or hi < x.shape[1]:
                x[:, :lo] = 0
                x[:, hi:] = 0
        return x

    def fit(self, recording: Recording, seed: int = 0, n_chunks: int = FIT_CHUNKS,
            chunk_s: float = FIT_CHUNK_S) -> "Pipeline":
        """Fit the whitening steps on ``n_chunks`` chunks of ``chunk_s`` seconds at seeded
        positions spread over the recording (each chunk passed through the steps before).
        `check` first: a recording the steps cannot process is refused before any work."""
        self.check(recording)
        self.fs = recording.fs
        xp = self._xp()
        for k, step in enumerate(self.steps):
            if not isinstance(step, Whiten):
                continue
            if step.mode == "local" and recording.geometry is None:
                raise PipelineError("whiten='local' needs the recording's geometry (channel "
                                    "positions); pass geometry= when opening it, or use "
                                    "whiten='global'")
            acc = CovarianceAccumulator()
            m = sum(s.margin(recording.fs) for s in self.steps[:k])
            spans = _fit_chunks(recording.n_samples, recording.fs, seed, n_chunks, chunk_s)
            # read in threads (several decompress at once), computed in order
            with ThreadPoolExecutor(READ_AHEAD_COMPRESSED) as pool:
                raws = pool.map(lambda sp: self._read_block(recording, sp[0], sp[1], m), spans)
                for (s0, s1), raw in zip(spans, raws):
                    x = self._compute(raw, recording, s0, s1, m, xp, k)  # the steps before
                    acc.add(x[:, m:m + (s1 - s0)])
            self._set_whitening(k, acc, recording)
        det = self._detector()
        if det is not None:
            self._fit_detector(recording, det, xp, seed, n_chunks, chunk_s)
        return self

    def _detector(self) -> "Detect | None":
        """The Detect step (always the last), or None."""
        return self.steps[-1] if self.steps and isinstance(self.steps[-1], Detect) else None

    def _set_whitening(self, k: int, acc: CovarianceAccumulator, recording: Recording) -> None:
        """Step k's W from the covariance accumulated over the fit chunks."""
        step = self.steps[k]
        cov = acc.result().astype(np.float64)
        if step.mode == "global":
            w = whitening_matrix(cov, eps=step.eps)
        else:
            w = whitening_matrix(cov, eps=step.eps, geometry_um=recording.geometry,
                                 n_neighbors=min(step.n_neighbors, recording.n_channels))
        self.states[k]["W"] = to_numpy(w).astype(np.float64)
        self.states[k].pop("_W_dev", None)
        log.info("fitted %s whitening on %d samples", step.mode, acc.n)

    def tune(self, recording: Recording, chunk_s: float = 1.0) -> "Pipeline":
        """Take now every tuner decision a job on ``recording`` will need — fit (its chunks),
        a full chunk and the last, shorter one through every step, detection included — so
        that they are in the tuner's cache file before any job starts: processes that share
        the cache then make the same choices (the same bits; a resumed job's fitted matrices
        match the killed one's)."""
        self.check(recording)
        self.fit(recording)
        xp = self._xp()
        fs, n = recording.fs, recording.n_samples
        chunk = min(n, max(1, int(round(chunk_s * fs))))
        m = self.margin(fs)
        det = self._detector()
        md = det.margin(fs) if det is not None else 0
        last = n - (n - 1) // chunk * chunk
        for s0, s1 in {(0, chunk), (n - last, n)}:
            full = self._block(recording, s0, s1, xp, margin=m)
            if det is not None:
                near = full[:, m - md:m + (s1 - s0) + md]
                spikes = det.spikes(near, fs, recording.geometry, self.states[-1])
                pca = det.pca(self.states[-1])
                if pca is not None:
                    det.features_of(near, spikes, fs, recording.geometry, pca)
        return self

    def _fit_detector(self, recording: Recording, det: "Detect", xp: Any, seed: int,
                      n_chunks: int, chunk_s: float) -> None:
        """On the fit chunks (the same as the whitening's, through every step): the noise of
        each channel's output of each template (the threshold's unit, `template_noise` on the
        chunks side by side), then the feature PCA on the clips of the spikes detected in
        them."""
        from .detect import spike_clips, template_noise  # noqa: PLC0415
        from .ops import PCA  # noqa: PLC0415

        if recording.geometry is None:
            raise PipelineError("Detect: needs the recording's geometry")
        fs = recording.fs
        m, md = self.margin(fs), det.margin(fs)
        state = self.states[-1]
        for key in ("pca_mean", "pca_components", "noise", "pca_fitted"):
            state.pop(key, None)
        spans = _fit_chunks(recording.n_samples, fs, seed, n_chunks, chunk_s)
        nears = []
        with ThreadPoolExecutor(READ_AHEAD_COMPRESSED) as pool:
            raws = pool.map(lambda sp: self._read_block(recording, sp[0], sp[1], m), spans)
            for (s0, s1), raw in zip(spans, raws):
                full = self._compute(raw, recording, s0, s1, m, xp)
                nears.append(full[:, m - md:m + (s1 - s0) + md])
        state["noise"] = template_noise(
            xp.concatenate([near[:, md:near.shape[1] - md] for near in nears], axis=1), fs)
        log.info("measured the detection noise on %d fit chunks: template output SDs %.2f to "
                 "%.2f (median %.2f)", len(nears), state["noise"].min(), state["noise"].max(),
                 float(np.median(state["noise"])))
        if det.features <= 0:
            return
        state["pca_fitted"] = True
        clips = []
        for near in nears:
            spikes = det.spikes(near, fs, recording.geometry, state)
            if len(spikes):
                clips.append(spike_clips(near, spikes, recording.geometry, fs,
                                         det.n_neighbors)[0])
        total = sum(len(c) for c in clips)
        if total * min(det.n_neighbors, recording.n_channels) <= det.features:
            log.warning("Detect: %d spikes in the fit chunks, too few for %d PCA components: "
                        "no features will be written", total, det.features)
            return
        pca = PCA(det.features).fit(np.concatenate(clips))
        state["pca_mean"] = to_numpy(pca.mean_).astype(np.float64)
        state["pca_components"] = to_numpy(pca.components_).astype(np.float64)
        log.info("fitted the feature PCA on %d spikes", total)

    def _block(self, recording: Recording, s0: int, s1: int, xp: Any, upto: int | None = None,
               margin: int | None = None) -> Any:
        """Samples [s0 - m, s1 + m) through the first ``upto`` steps (zeros outside)."""
        m = sum(s.margin(recording.fs) for s in self.steps[:upto]) if margin is None \
            else margin
        raw = self._read_block(recording, s0, s1, m)
        return self._compute(raw, recording, s0, s1, m, xp, upto)

    def _read_block(self, recording: Recording, s0: int, s1: int, m: int) -> Any:
        """(first sample read, µV block [channels, b - a]) for [s0 - m, s1 + m) clipped to
        the recording."""
        a, b = max(0, s0 - m), min(recording.n_samples, s1 + m)
        return a, recording.read(a, b)

    def _compute(self, raw: tuple, recording: Recording, s0: int, s1: int, m: int, xp: Any,
                 upto: int | None = None) -> Any:
        a, block = raw
        width = s1 - s0 + 2 * m
        if a == s0 - m and block.shape[1] == width:   # inside the recording: no padding
            x = xp.asarray(block).astype(self.dtype, copy=False)
        else:
            x = xp.zeros((recording.n_channels, width), dtype=self.dtype)
            x[:, a - (s0 - m):a - (s0 - m) + block.shape[1]] = \
                xp.asarray(block).astype(self.dtype, copy=False)
        return self._run_steps(x, recording.fs, s0 - m, recording.n_samples, upto)

    def transform(self, x: Any, fs: float | None = None) -> Any:
        """The steps on an in-memory [channels, samples] array (µV), zero outside it; returns
        the array type given."""
        fs = fs or self.fs
        if fs is None:
            raise PipelineError("fs: unknown (fit the pipeline on a recording or pass fs=)")
        y = x.astype(self.dtype, copy=True)
        return self._run_steps(y, fs, 0, x.shape[1])

    # -- the batch job -----------------------------------------------------------------------------
    def run(self, recording: Recording | str, out_path: str, chunk_s: float = 1.0,
            output_dtype: Any = np.float32, output_scale: float | None = None,
            layout: str = "samples_channels", compression: str | None = None,
            overwrite: bool = False, resume: bool = False, progress: bool = True) -> Path:
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
        """
        opened = isinstance(recording, (str, os.PathLike))
        rec = open_recording(recording) if opened else recording
        try:
            return self._run(rec, out_path, chunk_s, output_dtype, output_scale, layout,
                             compression, overwrite, resume, progress)
        finally:
            if opened:
                _close(rec)

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

    def _fitted(self) -> bool:
        """Whether every step that is fitted has been (`fit`, `load`, or a resumed job)."""
        return not any((isinstance(s, Whiten) and "W" not in st) or
                       (isinstance(s, Detect) and ("noise" not in st or
                                                   (s.features > 0 and "pca_fitted" not in st)))
                       for s, st in zip(self.steps, self.states))

    def _run(self, rec: Recording, out_path: str, chunk_s: float, output_dtype: Any,
             output_scale: float | None, layout: str, compression: str | None,
             overwrite: bool, resume: bool, progress: bool) -> Path:
        out = Path(out_path)
        partial = out.with_name(out.name + ".partial")
        progress_file = out.with_name(out.name + ".progress.json")
        # -- every check before any work: nothing fitted, no file created when one fails
        _check_output(out, rec, overwrite)
        out_dtype = np.dtype(output_dtype)
        if out_dtype not in (np.dtype(np.float32), np.dtype(np.int16)):
            raise PipelineError(f"output_dtype: expected float32 or int16, got {out_dtype}")
        if layout not in ("samples_channels", "channels_samples"):
            raise PipelineError(f"layout: expected 'samples_channels' or 'channels_samples', "
                                f"got {layout!r}")
        if compression not in (None, "gzip", "lzf"):
            raise PipelineError(f"compression: expected None, 'gzip' or 'lzf', got "
                                f"{compression!r}")
        if not (chunk_s > 0):
            raise PipelineError(f"chunk_s: expected a positive chunk length in seconds, got "
                                f"{chunk_s}")
        self.check(rec)
        whitened = any(isinstance(s, Whiten) for s in self.steps)
        scale = float(output_scale or (0.01 if whitened else 0.1)) \
            if out_dtype == np.int16 else 1.0
        chunk = max(1, int(round(chunk_s * rec.fs)))
        n = rec.n_samples
        done = state_spikes = 0
        if resume:
            done, state_spikes = self._resume_point(rec, partial, progress_file, chunk,
                                                    out_dtype, scale, layout, compression)
        elif partial.exists():
            log.warning("%s: discarding the partial output of an earlier job (resume=True, "
                        "--resume on the command line, continues it instead)", partial)
        if not self._fitted():
            self.fit(rec)
        self.fs = rec.fs
        job = self._job_record(rec, chunk, out_dtype, scale, layout, compression)
        import h5py  # noqa: PLC0415

        if done == 0:
            for p in (partial, progress_file):
                p.unlink(missing_ok=True)
        try:
            f = h5py.File(partial, "a") if done else new_file(partial)
            if done and "traces" not in f:
                f.close()
                raise OSError("no traces dataset")
        except OSError:
            log.warning("%s: cannot be reopened; starting over", partial)
            partial.unlink(missing_ok=True)
            progress_file.unlink(missing_ok=True)
            done = state_spikes = 0
            f = new_file(partial)
        xp = self._xp()
        decompress0 = getattr(rec, "decompress_s", 0.0)
        bar = _progress(progress, n, done, rec.fs)
        t0 = time.perf_counter()
        try:
            with f:
                timing, staging = self._write_job(f, rec, job, partial, progress_file, done,
                                                  state_spikes, chunk, out_dtype, scale,
                                                  layout, compression, xp, bar)
        except BaseException as exc:
            # an interruption or an OSError (a full disk, say) may pass on a resume: the
            # partial file is kept for it (when a chunk was recorded as written); anything
            # else (a non-finite or damaged input sample, ...) would stop the resumed job at
            # the same place: no partial file is left behind
            if not (_resumable(exc) and progress_file.exists()):
                for p in (partial, progress_file):
                    p.unlink(missing_ok=True)
            raise
        finally:
            if bar is not None:
                bar.close()
        partial.replace(out)
        progress_file.unlink(missing_ok=True)
        dt = time.perf_counter() - t0
        transfer = staging.transfer_s if staging is not None else 0.0
        timing["compute_s"] -= transfer
        self.last_run = {**timing, "transfer_s": transfer,
                         "decompress_s": getattr(rec, "decompress_s", 0.0) - decompress0,
                         "wall_s": dt, "samples": n - done,
                         "x_real_time": (n - done) / rec.fs / max(dt, 1e-9)}
        log.info("%s: %d samples in %.2f s (%.1f x real time; read %.2f s, compute %.2f s, "
                 "write %.2f s, overlapped)", out, n - done, dt, self.last_run["x_real_time"],
                 timing["read_s"], timing["compute_s"], timing["write_s"])
        return out

    def _resume_point(self, rec: Recording, partial: Path, progress_file: Path, chunk: int,
                      out_dtype: Any, scale: float, layout: str,
                      compression: str | None) -> tuple:
        """(samples done, spikes written) of the partial job that this job continues, or
        (0, 0) to start over. An unfitted pipeline takes the fitted state stored in the
        partial file (no refit) when the partial job's record, fingerprint included, is the
        one this job would make with that state."""
        if not partial.exists():
            return 0, 0
        if not progress_file.exists():
            log.warning("%s: no progress record next to it; starting over", partial)
            return 0, 0
        try:
            state = json.loads(progress_file.read_text())
            states = self.states if self._fitted() else self._states_in(partial)
            trial = Pipeline(self.steps, backend=self.backend, dtype=self.dtype,
                             states=states)
            job = trial._job_record(rec, chunk, out_dtype, scale, layout, compression)
            if {k: state.get(k) for k in job} != job or not trial._fitted():
                log.warning("%s: a partial job with other parameters; starting over", partial)
                return 0, 0
            done, spikes = int(state["done"]), int(state.get("spikes", 0))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: unreadable partial job (%s); starting over", partial, exc)
            return 0, 0
        if states is not self.states:
            self.states = states
            log.info("%s: resuming at sample %d with the fitted state stored there", partial,
                     done)
        return done, spikes

    def _states_in(self, path: Path) -> list:
        """The fitted state that `_save_metadata` stored in an output (or partial) file, one
        dict per step."""
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

    def _write_job(self, f: Any, rec: Recording, job: dict, partial: Path,
                   progress_file: Path, done: int, state_spikes: int, chunk: int,
                   out_dtype: Any, scale: float, layout: str, compression: str | None,
                   xp: Any, bar: Any) -> tuple:
        """The job's datasets (made when ``done`` is 0) and its chunks from ``done`` on, into
        the open partial file ``f``; returns (timings, GPU staging or None)."""
        n, c = rec.n_samples, rec.n_channels
        if done == 0:
            shape = (n, c) if layout == "samples_channels" else (c, n)
            # uncompressed: contiguous, each chunk's write lands directly; compressed: HDF5
            # chunks of the job's chunk length, so no write touches part of a chunk (a
            # partial chunk is read back, modified and rewritten)
            rows = min(n, chunk)
            chunks = None if compression is None else \
                ((rows, c) if layout == "samples_channels" else (c, rows))
            if compression is None:
                create_contiguous(f, "traces", shape, out_dtype)
            else:
                create_dataset(f, "traces", shape=shape, dtype=out_dtype, chunks=chunks,
                               compression=compression)
            self._save_metadata(f, rec, job)
        dset = f["traces"]
        # uncompressed output: written with os.pwrite, outside the GIL (dspk.io.rawio)
        raw_out = RawDatasetWriter(str(partial), dset) if raw_offset(dset) is not None \
            else None
        m = self.margin(rec.fs)
        det = self._detector()
        md = det.margin(rec.fs) if det is not None else 0
        feat_pca = None
        if det is not None:
            from .detect import SPIKE_DTYPE  # noqa: PLC0415

            if "spikes" not in f:
                create_dataset(f, "spikes", shape=(0,), maxshape=(None,), dtype=SPIKE_DTYPE,
                               chunks=(65536,))
            f["spikes"].resize((int(state_spikes),))   # drop spikes past the last flush
            feat_pca = det.pca(self.states[-1])
            if feat_pca is not None:
                nn = min(det.n_neighbors, c)
                if "features" not in f:
                    # row i: spike i's PCA features on its neighbour channels
                    create_dataset(f, "features", shape=(0, nn, det.features),
                                   maxshape=(None, nn, det.features), dtype=np.float32,
                                   chunks=(4096, nn, det.features))
                    create_dataset(f, "feature_channels", shape=(0, nn), maxshape=(None, nn),
                                   dtype=np.int32, chunks=(4096, nn))
                f["features"].resize(int(state_spikes), axis=0)
                f["feature_channels"].resize(int(state_spikes), axis=0)
        starts = list(range(done, n, chunk))
        timing = {"read_s": 0.0, "compute_s": 0.0, "write_s": 0.0}
        lock = threading.Lock()
        # the GPU moves raw integer samples as stored (half of float32's bytes for int16)
        # through pinned buffers and transposes, scales, quantizes on the device
        ahead = READ_AHEAD_COMPRESSED if getattr(rec, "compressed", False) else READ_AHEAD
        staging = _Staging(rec, chunk + 2 * m, ahead + 2, (min(n, chunk), c),
                           out_dtype, layout) if _native(rec, xp) else None

        read = self._reader(rec, staging, n, chunk, m, timing, lock)
        write_traces = _trace_writer(raw_out, dset, staging, layout)

        def write(s0: int, s1: int, y: np.ndarray, spikes: np.ndarray | None,
                  feats: tuple | None) -> None:
            t = time.perf_counter()
            write_traces(s0, s1, y)
            total = 0
            if spikes is not None:
                sd = f["spikes"]
                total = sd.shape[0] + len(spikes)
                sd.resize((total,))
                sd[total - len(spikes):] = spikes
                if feats is not None:
                    for name, values in zip(("features", "feature_channels"), feats):
                        f[name].resize(total, axis=0)
                        f[name][total - len(spikes):] = values
            f.flush()
            _write_json(progress_file, {**job, "done": s1, "spikes": total})
            timing["write_s"] += time.perf_counter() - t
            _hook_after_chunk(s1)
            if bar is not None:
                bar.update(s1 - s0)

        try:
            self._chunk_loop(rec, starts, n, chunk, m, xp, staging, ahead, read, write,
                             out_dtype, scale, timing, det, md, feat_pca)
        finally:
            if raw_out is not None:
                raw_out.close()
        return timing, staging

    def _job_record(self, rec: Recording, chunk: int, out_dtype: Any, scale: float,
                    layout: str, compression: str | None) -> dict:
        """What an output was made from and how (its attributes; a resume must match it)."""
        return {"dspk": __version__, "fingerprint": self.fingerprint(), "chunk": chunk,
                "input": getattr(rec, "source", ""), "n_samples": rec.n_samples,
                "n_channels": rec.n_channels, "output_dtype": np.dtype(out_dtype).name,
                "scale": scale, "layout": layout, "compression": compression}

    def _reader(self, rec: Recording, staging: Any, end: int, chunk: int, m: int,
                timing: dict, lock: Any) -> Any:
        """``read(k, s0)``: chunk [s0, min(end, s0 + chunk)) with its halo (slot k of the
        pinned buffers on the GPU)."""
        def read(k: int, s0: int) -> tuple:
            t = time.perf_counter()
            if staging is not None:
                r = staging.read(k, s0, min(end, s0 + chunk), m)
            else:
                r = self._read_block(rec, s0, min(end, s0 + chunk), m)
            with lock:
                timing["read_s"] += time.perf_counter() - t
            return r

        return read

    def run_span(self, recording: Recording | str, path: str, offset: int, s0: int, s1: int,
                 chunk_s: float = 1.0, output_dtype: Any = np.float32, scale: float = 1.0,
                 layout: str = "samples_channels") -> dict:
        """Samples [s0, s1) of a fitted job into an output prepared beforehand: the traces
        dataset of file ``path``, contiguous at byte ``offset`` (``[samples, channels]`` or
        ``[channels, samples]`` by ``layout``), written with ``os.pwrite`` — no HDF5 here, so
        several processes may fill disjoint spans of one file at once (`dspk.dask.run_split`).
        The chunk loop of `run` (reads ahead, writes behind); ``s0`` a multiple of the chunk
        gives the bytes `run` writes there. Returns the span's timings."""
        opened = isinstance(recording, (str, os.PathLike))
        rec = open_recording(recording) if opened else recording
        try:
            return self._run_span(rec, path, offset, s0, s1, chunk_s, output_dtype, scale,
                                  layout)
        finally:
            if opened:
                _close(rec)

    def _run_span(self, rec: Recording, path: str, offset: int, s0: int, s1: int,
                  chunk_s: float, output_dtype: Any, scale: float, layout: str) -> dict:
        t0 = time.perf_counter()
        if self._detector() is not None:
            raise PipelineError("run_span: the Detect step writes spikes; use run")
        if any(isinstance(s, Whiten) and "W" not in st for s, st in zip(self.steps, self.states)):
            raise PipelineError("run_span: fit the pipeline first (every span must use one W)")
        self.fs = rec.fs
        out_dtype = np.dtype(output_dtype)
        n, c = rec.n_samples, rec.n_channels
        if not 0 <= s0 <= s1 <= n:
            raise ValueError(f"s0, s1: expected 0 <= s0 <= s1 <= {n}, got {s0}, {s1}")
        chunk = max(1, int(round(chunk_s * rec.fs)))
        shape = (n, c) if layout == "samples_channels" else (c, n)
        raw_out = RawDatasetWriter(path, offset=offset, shape=shape, dtype=out_dtype)
        xp = self._xp()
        m = self.margin(rec.fs)
        timing = {"read_s": 0.0, "compute_s": 0.0, "write_s": 0.0}
        ahead = READ_AHEAD_COMPRESSED if getattr(rec, "compressed", False) else READ_AHEAD
        staging = _Staging(rec, chunk + 2 * m, ahead + 2, (min(n, chunk), c),
                           out_dtype, layout) if _native(rec, xp) else None
        read = self._reader(rec, staging, s1, chunk, m, timing, threading.Lock())
        write_traces = _trace_writer(raw_out, None, staging, layout)

        def write(a: int, b: int, y: np.ndarray, spikes: Any, feats: Any) -> None:
            t = time.perf_counter()
            write_traces(a, b, y)
            timing["write_s"] += time.perf_counter() - t
            _hook_after_chunk(b - s0)

        timing["setup_s"] = time.perf_counter() - t0
        try:
            self._chunk_loop(rec, list(range(s0, s1, chunk)), s1, chunk, m, xp, staging, ahead,
                             read, write, out_dtype, scale, timing)
        finally:
            raw_out.close()
        return {**timing, "wall_s": time.perf_counter() - t0, "samples": s1 - s0}

    def _chunk_loop(self, rec: Recording, starts: list, end: int, chunk: int, m: int, xp: Any,
                    staging: Any, ahead: int, read: Any, write: Any, out_dtype: Any,
                    scale: float, timing: dict, det: Any = None, md: int = 0,
                    feat_pca: Any = None) -> None:
        """The chunks starting at ``starts`` (each to ``min(end, s0 + chunk)``): read ahead in
        threads, computed here, written in order by one writer thread
        (``write(s0, s1, y, spikes, features)``)."""
        n = end
        # the next `ahead` chunks are read while this one is computed (decompression of
        # several chunks overlaps), the last one written while the next is computed (one
        # writer thread: chunks are written in order)
        with ThreadPoolExecutor(ahead) as reader, ThreadPoolExecutor(1) as writer:
            queue = deque(reader.submit(read, k, starts[k])
                          for k in range(min(ahead, len(starts))))
            pending = None
            for i, s0 in enumerate(starts):
                s1 = min(n, s0 + chunk)
                raw = queue.popleft().result()
                if i + ahead < len(starts):
                    queue.append(reader.submit(read, i + ahead, starts[i + ahead]))
                t = time.perf_counter()
                if staging is not None:
                    raw = staging.to_device(raw, xp)
                full = self._compute(raw, rec, s0, s1, m, xp)
                spikes = feats = None
                if det is not None:
                    # the exact part of the traces around the chunk: [s0 - md, s1 + md);
                    # keep the spikes whose detection sample lies in [s0, s1)
                    near = full[:, m - md:m + (s1 - s0) + md]
                    spikes = det.spikes(near, rec.fs, rec.geometry, self.states[-1])
                    at = spikes["sample_index"] + _detect_lag(rec.fs) - md
                    spikes = spikes[(at >= 0) & (at < s1 - s0)]
                    if feat_pca is not None:
                        feats = det.features_of(near, spikes, rec.fs, rec.geometry,
                                                feat_pca)
                    spikes["sample_index"] += s0 - md
                if staging is not None:
                    y = staging.to_host(i, full[:, m:m + (s1 - s0)], scale)
                else:
                    y = to_numpy(full[:, m:m + (s1 - s0)])
                    if out_dtype == np.int16:
                        y = _quantize(np, y, scale)
                    else:
                        y = np.ascontiguousarray(y)
                timing["compute_s"] += time.perf_counter() - t
                if pending is not None:
                    pending.result()        # a failed write stops the job here
                pending = writer.submit(write, s0, s1, y, spikes, feats)
            if pending is not None:
                pending.result()

    def _save_metadata(self, f: Any, rec: Recording, job: dict) -> None:
        f.attrs["dspk_version"] = __version__
        f.attrs["fs"] = rec.fs
        f.attrs["layout"] = job["layout"]
        f.attrs["pipeline"] = json.dumps(self.options())
        f.attrs["job"] = json.dumps(job)
        traces = f["traces"]
        traces.attrs["fs"] = rec.fs                 # readable by dspk.open_recording
        traces.attrs["layout"] = job["layout"]
        traces.attrs["gain_to_uv"] = job["scale"]
        if rec.geometry is not None:
            f["traces"].attrs["geometry"] = rec.geometry
            create_dataset(f, "geometry", data=rec.geometry)
        # the fitted state (a resumed job reads it back: `_states_in`)
        for k, (step, st) in enumerate(zip(self.steps, self.states)):
            for key in FITTED:
                if key in st:
                    create_dataset(f, f"fitted/step{k}_{type(step).__name__}/{key}",
                                   data=st[key])
            if isinstance(step, HighPass):
                create_dataset(f, f"fitted/step{k}_{type(step).__name__}/taps",
                               data=step.taps(rec.fs))

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


#: chunks read ahead of the one being computed; more for compressed sources, whose chunks
#: are inflated in a thread pool (a 1-s read holds only a few chunks: several reads in flight
#: keep more cores busy; measured on the H200 host, 16 cores, gzip: 2 ahead gave 19x real time)
READ_AHEAD, READ_AHEAD_COMPRESSED = 2, 4


def _quantize(xp: Any, y: Any, scale: float) -> Any:
    """int16 output samples: round(y / scale), clipped (the same operations on either
    backend, so the GPU and the CPU write the same integers)."""
    return xp.clip(xp.rint(y / scale), -32768, 32767).astype(np.int16)


def _native(rec: Recording, xp: Any) -> bool:
    """Whether the job moves raw samples to the device (integer sources on the GPU; float
    sources take the checked, scaled read)."""
    return xp is not np and rec.dtype.kind in "iu"


def _trace_writer(raw_out: Any, dset: Any, staging: Any, layout: str) -> Any:
    """``write(s0, s1, y)``: a chunk of traces into the output (os.pwrite when contiguous,
    else through h5py), in the file's layout; y is [samples, channels] already when the
    device transposed it (staging), else [channels, samples]."""
    def write(s0: int, s1: int, y: np.ndarray) -> None:
        if layout == "samples_channels":
            rows = y if staging is not None else blocked_transpose(y)
            if raw_out is not None:
                raw_out.write(s0, rows, axis=0)
            else:
                dset[s0:s1] = rows
        elif raw_out is not None:
            raw_out.write(s0, y, axis=1)
        else:
            dset[:, s0:s1] = y

    return write


class _Staging:
    """Pinned host buffers for the GPU job: raw input blocks as stored (read into directly,
    ``slots`` of them in rotation: the reads in flight and the one being copied) and output
    blocks in the file's layout and dtype (three in rotation: one being filled, one being
    written, one spare)."""

    def __init__(self, rec: Recording, width: int, slots: int, out_shape: tuple,
                 out_dtype: np.dtype, layout: str) -> None:
        import cupyx  # noqa: PLC0415 (GPU jobs only)

        self.rec, self.layout, self.out_dtype = rec, layout, out_dtype
        c = rec.n_channels
        self._in = [cupyx.empty_pinned(width * c, dtype=rec.dtype) for _ in range(slots)]
        self._out = [cupyx.empty_pinned(out_shape[0] * c, dtype=out_dtype) for _ in range(3)]
        gain, offset = rec.gain_to_uv, rec.offset_to_uv
        self._gain = gain.astype(np.float32) if np.any(gain != 1) else None
        self._offset = offset.astype(np.float32) if np.any(offset != 0) else None
        self._dev: dict = {}
        self.transfer_s = 0.0        # host <-> device copies (main thread)

    def read(self, k: int, s0: int, s1: int, m: int) -> tuple:
        """(first sample, raw block) of [s0 - m, s1 + m) clipped to the recording, read into
        slot k's buffer."""
        rec = self.rec
        a, b = max(0, s0 - m), min(rec.n_samples, s1 + m)
        buf = self._in[k % len(self._in)][:(b - a) * rec.n_channels]
        shape = (b - a, rec.n_channels) if rec.samples_first else (rec.n_channels, b - a)
        return a, rec.read_native(a, b, out=buf.reshape(shape))

    def to_device(self, raw: tuple, xp: Any) -> tuple:
        """(first sample, µV float32 [channels, samples] on the device): the same operations
        as `Recording.read` (cast, times the gain, plus the offset, in float32)."""
        a, block = raw
        if isinstance(block, np.ndarray):
            # straight from the pinned buffer (cupy.asarray would stage it through a pinned
            # buffer of its own: one more host copy)
            d = xp.empty(block.shape, dtype=block.dtype)
            t = time.perf_counter()
            d.set(block)
            self.transfer_s += time.perf_counter() - t
        else:
            d = xp.asarray(block)
        x = xp.ascontiguousarray(d.T if self.rec.samples_first else d, dtype=np.float32)
        if self._gain is not None:
            x *= self._vec("gain", self._gain, xp)
        if self._offset is not None:
            x += self._vec("offset", self._offset, xp)
        return a, x

    def _vec(self, name: str, v: np.ndarray, xp: Any) -> Any:
        if name not in self._dev:
            self._dev[name] = xp.asarray(v)[:, None]
        return self._dev[name]

    def to_host(self, i: int, y: Any, scale: float) -> np.ndarray:
        """The output block in the file's layout and dtype, in pinned buffer i."""
        xp = array_module(y)
        if self.layout == "samples_channels":
            y = xp.ascontiguousarray(y.T)
        if self.out_dtype == np.int16:
            y = _quantize(xp, y, scale)
        else:
            y = xp.ascontiguousarray(y, dtype=self.out_dtype)
        host = self._out[i % len(self._out)][:y.size].reshape(y.shape)
        xp.cuda.get_current_stream().synchronize()    # the chunk's work done: time the copy
        t = time.perf_counter()
        y.get(out=host)
        self.transfer_s += time.perf_counter() - t
        return host


def _detect_lag(fs: float) -> int:
    """Samples from a spike's trough to the sample its detection score peaks at."""
    from .detect import TROUGH_TAP, default_templates  # noqa: PLC0415

    return default_templates(fs).shape[1] // 2 - int(round(TROUGH_TAP * fs / 30000.0))


def _fit_chunks(n: int, fs: float, seed: int, n_chunks: int, chunk_s: float) -> list:
    """Seeded chunk positions spread over the recording: one per equal part, at a random
    offset inside it (all of a recording shorter than the chunks)."""
    length = max(2, int(chunk_s * fs))
    if n <= length * n_chunks:
        return [(s, min(n, s + length)) for s in range(0, n, length)]
    rng = np.random.default_rng(seed)
    part = n // n_chunks
    starts = [k * part + int(rng.integers(0, part - length + 1)) for k in range(n_chunks)]
    return [(s, s + length) for s in starts]


def _close(rec: Recording) -> None:
    """Close a recording this module opened (sources that hold a file have ``close``)."""
    close = getattr(rec, "close", None)
    if close is not None:
        close()


def _check_output(out: Path, rec: Recording, overwrite: bool) -> None:
    """Refuse an output path before any work: the input itself (any spelling, a symbolic or
    hard link), a directory, an existing file without ``overwrite``, a missing or read-only
    folder."""
    source = getattr(rec, "path", None)
    if source is not None and _same_file(source, out):
        raise PipelineError(f"{out}: is the input ({source}); the input is never written")
    if out.is_dir():
        raise PipelineError(f"{out}: is a directory; expected an output file name")
    if out.exists() and not overwrite:
        raise PipelineError(f"{out}: exists; pass overwrite=True (--overwrite) to replace it")
    folder = out.parent
    if not folder.is_dir():
        raise PipelineError(f"{out}: its folder {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PipelineError(f"{out}: its folder {folder} is not writable")


def _same_file(a: Any, b: Any) -> bool:
    """Whether two paths name one file: the same real path (links and ``..`` resolved), or
    the same inode (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:     # one of them does not exist
        return False


def _resumable(exc: BaseException) -> bool:
    """Whether a job stopped by ``exc`` could get further when resumed: an interruption, or an
    OSError (a full disk, a lost mount) or MemoryError that need not happen again — not an
    error of the input's samples or of the pipeline, which would stop it at the same place."""
    return isinstance(exc, (KeyboardInterrupt, SystemExit, OSError, MemoryError))


def _write_json(path: Path, obj: dict) -> None:
    """Atomically: a progress record is either the old one or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def _hook_after_chunk(done: int) -> None:
    """Test hook: DSPK_KILL_AFTER_SAMPLES=N ends the process abruptly (os._exit, no cleanup)
    once N samples are written, as a kill would; with DSPK_KILL_ONCE_FILE=PATH only the first
    process to get there dies (it creates PATH; a killed worker's retried job then runs)."""
    limit = os.environ.get("DSPK_KILL_AFTER_SAMPLES")
    if limit is None or done < int(limit):
        return
    once = os.environ.get("DSPK_KILL_ONCE_FILE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os._exit(137)


class _Progress:
    """A tqdm bar counted in seconds of recording, so its rate reads as × real time."""

    def __init__(self, total: int, done: int, fs: float) -> None:
        from tqdm import tqdm  # noqa: PLC0415

        self.fs = fs
        self.bar = tqdm(total=round(total / fs, 3), initial=round(done / fs, 3),
                        unit="s", desc="dspk preprocess",
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s of "
                                   "recording [{elapsed}<{remaining}, {rate_fmt}: x real time]")

    def update(self, samples: int) -> None:
        self.bar.update(samples / self.fs)

    def close(self) -> None:
        self.bar.close()


def _progress(enabled: bool, total: int, done: int, fs: float) -> Any:
    if not enabled:
        return None
    try:
        return _Progress(total, done, fs)
    except ImportError:
        return None


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
