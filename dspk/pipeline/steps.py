"""The pipeline's steps: small objects on [channels, samples] float blocks.

Every step has

- ``margin(fs)``: its halo, the samples of context a chunk needs on each side so that the
  step's output on the chunk equals its output on the whole recording;
- ``apply(x, fs, state)``: the step on a block;
- ``fit(...)`` where it learns something from the recording (`Whiten`: the covariance;
  `Detect`: the noise of its template outputs and the feature PCA), returning the fitted
  ``state`` (a dict of arrays, saved with the pipeline and in its outputs);
- ``is_fitted(state)``: whether ``state`` holds what ``apply`` needs.

A step holds its options only (a dataclass: `dspk.pipeline.Pipeline.options` writes them as
JSON); its fitted state lives in the pipeline's ``states``, one dict per step, so a step can
be shared, compared and saved as its options.

Examples
--------
>>> import numpy as np
>>> from dspk.pipeline import HighPass, Reference
>>> steps = [HighPass(300.0), Reference("median")]
>>> [s.margin(30000.0) for s in steps], [s.is_fitted({}) for s in steps]
([131, 0], [True, True])
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..backend import array_module, to_numpy
from ..ops import (CovarianceAccumulator, SpatialFilter, bandpass_taps, common_reference,
                   fir_filter, highpass_taps, whitening_matrix)
from .errors import PipelineError

__all__ = ["Step", "HighPass", "BandPass", "Reference", "Whiten", "Detect", "STEP_TYPES",
           "FITTED"]

# one logger for all of the pipeline's messages (the command line prints its name)
log = logging.getLogger("dspk.pipeline")

#: the fitted arrays a step's state may hold (saved, written to the output, fingerprinted)
FITTED = ("W", "pca_mean", "pca_components", "noise")


class Step:
    """What every pipeline step has: a halo (`margin`), `apply`, and `is_fitted` (true for
    steps that fit nothing). Subclasses are dataclasses of their options.

    Examples
    --------
    >>> from dspk.pipeline import Step, Whiten
    >>> isinstance(Whiten(), Step), Whiten().is_fitted({}), Whiten().margin(30000.0)
    (True, False, 0)
    """

    def margin(self, fs: float) -> int:
        """Samples of context a chunk needs on each side (its halo): none by default.

        Parameters
        ----------
        fs : float
            The sampling rate in Hz.

        Examples
        --------
        >>> from dspk.pipeline import Reference
        >>> Reference().margin(30000.0)
        0
        """
        return 0

    def is_fitted(self, state: dict) -> bool:
        """Whether ``state`` holds what `apply` needs (always, for a step that fits nothing).

        Parameters
        ----------
        state : dict
            The step's fitted state (the pipeline's ``states[k]``).

        Examples
        --------
        >>> from dspk.pipeline import HighPass
        >>> HighPass().is_fitted({})
        True
        """
        return True

    def apply(self, x: Any, fs: float, state: dict) -> Any:  # pragma: no cover - abstract
        """The step on a block x [channels, samples]."""
        raise NotImplementedError


@dataclass
class HighPass(Step):
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
class Reference(Step):
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
class Whiten(Step):
    """ZCA whitening fitted on the recording: "global", or "local" (each channel against its
    ``n_neighbors`` nearest channels; needs the recording's geometry).

    `Pipeline.fit` computes W (`dspk.whitening_matrix`) from the covariance of the fit chunks
    after the steps before this one (`fit`); it is kept in the step's state (``"W"``,
    float64) and applied in the traces' dtype.

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

    def is_fitted(self, state: dict) -> bool:
        """Whether ``state`` holds W.

        Parameters
        ----------
        state : dict
            The step's fitted state.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Whiten
        >>> Whiten().is_fitted({}), Whiten().is_fitted({"W": np.eye(2)})
        (False, True)
        """
        return "W" in state

    def fit(self, covariance: CovarianceAccumulator, geometry: Any = None) -> dict:
        """The fitted state, ``{"W": float64 [channels, channels]}``, from the covariance
        accumulated over the fit chunks (after the steps before this one).

        Parameters
        ----------
        covariance : CovarianceAccumulator
            The samples' covariance (`dspk.CovarianceAccumulator`; partial accumulators of
            several workers merged in the chunks' order give the same W, bit for bit).
        geometry : [channels, 2] array, optional
            Contact positions in µm; needed by local whitening.

        Returns
        -------
        dict

        Raises
        ------
        PipelineError
            Local whitening without a geometry.

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Whiten
        >>> acc = dspk.CovarianceAccumulator()
        >>> _ = acc.add(np.random.default_rng(0).standard_normal((3, 9000)))
        >>> Whiten("global").fit(acc)["W"].shape
        (3, 3)
        """
        if self.mode == "local" and geometry is None:
            raise PipelineError("whiten='local' needs the recording's geometry (channel "
                                "positions); pass geometry= when opening it, or use "
                                "whiten='global'")
        cov = covariance.result().astype(np.float64)
        if self.mode == "global":
            w = whitening_matrix(cov, eps=self.eps)
        else:
            w = whitening_matrix(cov, eps=self.eps, geometry_um=geometry,
                                 n_neighbors=min(self.n_neighbors, cov.shape[0]))
        log.info("fitted %s whitening on %d samples", self.mode, covariance.n)
        return {"W": to_numpy(w).astype(np.float64)}

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
class Detect(Step):
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
        """Half the templates plus the dead time, plus one sample."""
        from ..detect import default_templates  # noqa: PLC0415

        return default_templates(fs).shape[1] // 2 + \
            max(1, int(round(self.dead_time_ms * 1e-3 * fs))) + 1

    def lag(self, fs: float) -> int:
        """Samples from a spike's trough to the sample its detection score peaks at."""
        from ..detect import TROUGH_TAP, default_templates  # noqa: PLC0415

        return default_templates(fs).shape[1] // 2 - int(round(TROUGH_TAP * fs / 30000.0))

    def is_fitted(self, state: dict) -> bool:
        """Whether ``state`` holds the noise (and, with features, a fitted PCA: a fit that
        found too few spikes counts as fitted, and writes no features).

        Parameters
        ----------
        state : dict
            The step's fitted state.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Detect
        >>> Detect(features=0).is_fitted({"noise": np.ones((4, 3))}), Detect().is_fitted({})
        (True, False)
        """
        return "noise" in state and (self.features <= 0 or "pca_fitted" in state)

    def apply(self, x: Any, fs: float, state: dict) -> Any:
        """The traces pass through (the spikes are taken by the job: `spikes`)."""
        return x

    def fit(self, blocks: Sequence[Any], fs: float, geometry: Any) -> dict:
        """The fitted state from the fit chunks through every step before: the noise of each
        channel's output of each template (the threshold's unit, `dspk.detect.template_noise`
        on the chunks side by side), then the feature PCA on the clips of the spikes
        detected in them.

        Parameters
        ----------
        blocks : sequence of arrays
            The fit chunks [channels, samples] with this step's `margin` of context on each
            side (the noise is measured on the inner parts).
        fs : float
            The sampling rate in Hz.
        geometry : [channels, 2] array
            Contact positions in µm.

        Returns
        -------
        dict
            ``noise``, ``pca_fitted`` and (with enough spikes) ``pca_mean``,
            ``pca_components``.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Detect
        >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
        >>> geom = np.c_[np.zeros(4), 20.0 * np.arange(4)]
        >>> state = Detect(features=0).fit([x], 30000.0, geom)
        >>> sorted(state), Detect(features=0).is_fitted(state)
        (['noise'], True)
        """
        from ..detect import spike_clips, template_noise  # noqa: PLC0415
        from ..ops import PCA  # noqa: PLC0415

        if geometry is None:
            raise PipelineError("Detect: needs the recording's geometry")
        md = self.margin(fs)
        xp = array_module(blocks[0])
        state: dict = {}
        state["noise"] = template_noise(
            xp.concatenate([b[:, md:b.shape[1] - md] for b in blocks], axis=1), fs)
        log.info("measured the detection noise on %d fit chunks: template output SDs %.2f to "
                 "%.2f (median %.2f)", len(blocks), state["noise"].min(), state["noise"].max(),
                 float(np.median(state["noise"])))
        if self.features <= 0:
            return state
        state["pca_fitted"] = True
        clips = []
        for near in blocks:
            spikes = self.spikes(near, fs, geometry, state)
            if len(spikes):
                clips.append(spike_clips(near, spikes, geometry, fs, self.n_neighbors)[0])
        total = sum(len(c) for c in clips)
        n_channels = blocks[0].shape[0]
        if total * min(self.n_neighbors, n_channels) <= self.features:
            log.warning("Detect: %d spikes in the fit chunks, too few for %d PCA components: "
                        "no features will be written", total, self.features)
            return state
        pca = PCA(self.features).fit(np.concatenate(clips))
        state["pca_mean"] = to_numpy(pca.mean_).astype(np.float64)
        state["pca_components"] = to_numpy(pca.components_).astype(np.float64)
        log.info("fitted the feature PCA on %d spikes", total)
        return state

    def spikes(self, x: Any, fs: float, geometry: Any, state: dict) -> np.ndarray:
        """The spikes of x, the threshold in units of the noise measured on the fit chunks
        (``state["noise"]``; on x itself before the fit)."""
        from ..detect import detect_spikes  # noqa: PLC0415

        return detect_spikes(x, geometry, fs, threshold=self.threshold,
                             n_neighbors=self.n_neighbors, dead_time_ms=self.dead_time_ms,
                             noise=state.get("noise"))

    def chunk_spikes(self, near: Any, s0: int, s1: int, fs: float, geometry: Any,
                     state: dict, pca: Any = None) -> tuple:
        """(spikes, features or None) of chunk [s0, s1), from ``near``, the exact traces of
        [s0 - margin, s1 + margin): the spikes whose detection sample lies in the chunk (so
        that neighbouring chunks neither miss nor double one), their sample indices made
        global."""
        md = self.margin(fs)
        spikes = self.spikes(near, fs, geometry, state)
        at = spikes["sample_index"] + self.lag(fs) - md
        spikes = spikes[(at >= 0) & (at < s1 - s0)]
        feats = None
        if pca is not None:
            feats = self.features_of(near, spikes, fs, geometry, pca)
        spikes["sample_index"] += s0 - md
        return spikes, feats

    def pca(self, state: dict) -> Any:
        """The fitted feature PCA (None when features are off or nothing was fitted)."""
        if self.features <= 0 or "pca_components" not in state:
            return None
        from ..ops import PCA  # noqa: PLC0415

        p = PCA(self.features)
        p.mean_ = state["pca_mean"].astype(np.float32)
        p.components_ = state["pca_components"].astype(np.float32)
        return p

    def features_of(self, x: Any, spikes: np.ndarray, fs: float, geometry: Any,
                    pca: Any) -> tuple:
        """(features float32 [n, neighbours, components], channels int32 [n, neighbours]) of
        spikes local to x (`dspk.spike_features` with the fitted PCA)."""
        from ..detect import spike_clips  # noqa: PLC0415

        clips, chans = spike_clips(x, spikes, geometry, fs, self.n_neighbors)
        if len(spikes) == 0:
            feats = np.zeros((0, chans.shape[1], self.features), np.float32)
        else:
            feats = np.asarray(pca.transform(clips), dtype=np.float32)
        return feats, chans.astype(np.int32)


#: the step classes by name (the names stored in saved pipelines and output files)
STEP_TYPES = {"HighPass": HighPass, "BandPass": BandPass, "Reference": Reference,
              "Whiten": Whiten, "Detect": Detect}
