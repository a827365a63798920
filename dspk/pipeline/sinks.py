"""The output stages (`dspk.pipeline.Sink`): what a pipeline writes beside the traces.

`Detect`: spikes detected on the processed traces (`dspk.detect_spikes`, in units of the noise
fitted on the fit chunks), written to ``/spikes``, and each spike's PCA features on its
neighbour channels (``/features``, ``/feature_channels``), the PCA fitted on the spikes of
the fit chunks.

Examples
--------
>>> from dspk.pipeline import Detect, Pipeline
>>> p = Pipeline.from_options(whiten="global", detect=True)
>>> p.steps[-1]
Detect(threshold=7.0, n_neighbors=10, dead_time_ms=0.67, features=3)
>>> p.steps[-1].margin(30000.0)                # half the templates + the dead time + 1
51
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import to_numpy
from ..detect import (SPIKE_DTYPE, detect_spikes, detection_lag, detection_margin, spike_clips,
                      template_noise)
from ..ops import PCA
from .registry import Option, register
from .stage import Context, FitBlocks, Sink, Table

__all__ = ["Detect"]

log = logging.getLogger("dspk.pipeline")


@dataclass
class Detect(Sink):
    """Spike detection on the processed traces (`dspk.detect_spikes`), written beside them.
    Its margin (the templates' half length plus the dead time) makes the spikes of a chunk
    those of the whole recording: no spike missed or doubled at a chunk edge.

    Parameters
    ----------
    threshold, n_neighbors, dead_time_ms :
        As for `dspk.detect_spikes` (the default templates).
    features : int
        PCA components per neighbour channel written for every spike (0: none); the PCA is
        fitted on the spikes of the fit chunks.

    Examples
    --------
    >>> from dspk.pipeline import Detect
    >>> Detect().margin(30000.0), Detect().needs, Detect().describe()
    (51, ('geometry',), 'detect=True')
    """
    threshold: float = 7.0
    n_neighbors: int = 10
    dead_time_ms: float = 0.67
    features: int = 3

    fitted = ("pca_mean", "pca_components", "noise")

    @property
    def needs(self) -> tuple[str, ...]:
        """The geometry (neighbourhoods)."""
        return ("geometry",)

    def describe(self) -> str:
        """``detect=True``."""
        return "detect=True"

    def margin(self, fs: float) -> int:
        """Half the templates plus the dead time, plus one sample."""
        return detection_margin(fs, self.dead_time_ms)

    def lag(self, fs: float) -> int:
        """Samples from a spike's trough to the sample its detection score peaks at.

        Parameters
        ----------
        fs : float

        Examples
        --------
        >>> from dspk.pipeline import Detect
        >>> Detect().lag(30000.0)
        10
        """
        return detection_lag(fs)

    def is_fitted(self, state: dict) -> bool:
        """Whether ``state`` holds the noise (the feature PCA is fitted with it, when the fit
        chunks hold enough spikes; without it no features are written).

        Parameters
        ----------
        state : dict
            The fitted state.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Detect
        >>> Detect(features=0).is_fitted({"noise": np.ones((4, 3))}), Detect().is_fitted({})
        (True, False)
        """
        return "noise" in state

    def _spikes(self, x: Any, ctx: Context, noise: Any) -> np.ndarray:
        return detect_spikes(x, ctx.geometry, ctx.fs, threshold=self.threshold,
                             n_neighbors=self.n_neighbors, dead_time_ms=self.dead_time_ms,
                             noise=noise)

    def fit(self, blocks: FitBlocks, ctx: Context) -> dict:
        """The noise of each channel's output of each template (the threshold's unit,
        `dspk.detect.template_noise` on the fit chunks side by side), then the feature PCA
        on the clips of the spikes detected in them.

        Parameters
        ----------
        blocks : FitBlocks
            The fit chunks through every step, with this stage's margin of context.
        ctx : Context
            Its geometry and sampling rate.

        Returns
        -------
        dict
            ``noise`` and (with enough spikes) ``pca_mean``, ``pca_components``.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Context, Detect, FitBlocks
        >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
        >>> ctx = Context(fs=30000.0, n_channels=4, xp=np, dtype=np.dtype(np.float32),
        ...               geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)])
        >>> state = Detect(features=0).fit(FitBlocks([x], halo=51), ctx)
        >>> sorted(state), Detect(features=0).is_fitted(state)
        (['noise'], True)
        """
        xp = ctx.xp
        state: dict = {"noise": template_noise(xp.concatenate(list(blocks.inner()), axis=1),
                                               ctx.fs)}
        log.info("measured the detection noise on %d fit chunks: template output SDs %.2f to "
                 "%.2f (median %.2f)", len(blocks), state["noise"].min(), state["noise"].max(),
                 float(np.median(state["noise"])))
        if self.features <= 0:
            return state
        clips = []
        for near in blocks:
            spikes = self._spikes(near, ctx, state["noise"])
            if len(spikes):
                clips.append(spike_clips(near, spikes, ctx.geometry, ctx.fs,
                                         self.n_neighbors)[0])
        total = sum(len(c) for c in clips)
        if total * min(self.n_neighbors, ctx.n_channels) <= self.features:
            log.warning("Detect: %d spikes in the fit chunks, too few for %d PCA components: "
                        "no features will be written", total, self.features)
            return state
        pca = PCA(self.features).fit(np.concatenate(clips))
        state["pca_mean"] = to_numpy(pca.mean_).astype(np.float64)
        state["pca_components"] = to_numpy(pca.components_).astype(np.float64)
        log.info("fitted the feature PCA on %d spikes", total)
        return state

    def pca(self, state: dict) -> PCA | None:
        """The fitted feature PCA (None when features are off or nothing was fitted).

        Parameters
        ----------
        state : dict
            The fitted state.

        Examples
        --------
        >>> from dspk.pipeline import Detect
        >>> Detect().pca({}) is None
        True
        """
        if self.features <= 0 or "pca_components" not in state:
            return None
        p = PCA(self.features)
        p.mean_ = state["pca_mean"].astype(np.float32)
        p.components_ = state["pca_components"].astype(np.float32)
        return p

    def prepare(self, ctx: Context, state: dict) -> tuple:
        """(noise, the feature PCA or None)."""
        return state.get("noise"), self.pca(state)

    def tables(self, ctx: Context, state: dict) -> list:
        """``spikes`` (`dspk.detect.SPIKE_DTYPE`) and, with a fitted PCA, ``features``
        [neighbours, components] float32 and ``feature_channels`` [neighbours] int32.

        Parameters
        ----------
        ctx : Context
        state : dict

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Context, Detect
        >>> ctx = Context(fs=30000.0, n_channels=4, xp=np, dtype=np.dtype(np.float32))
        >>> [t.name for t in Detect().tables(ctx, {"noise": np.ones((4, 6))})]
        ['spikes']
        """
        tables = [Table("spikes", SPIKE_DTYPE, (), 65536)]
        if self.pca(state) is not None:
            nn = min(self.n_neighbors, ctx.n_channels)
            # row i: spike i's PCA features on its neighbour channels
            tables += [Table("features", np.dtype(np.float32), (nn, self.features), 4096),
                       Table("feature_channels", np.dtype(np.int32), (nn,), 4096)]
        return tables

    def rows(self, near: Any, s0: int, s1: int, ctx: Context, prepared: tuple) -> tuple:
        """The spikes of chunk [s0, s1) (and their features): those whose detection sample
        lies in the chunk, so that neighbouring chunks neither miss nor double one, their
        sample indices made global.

        Parameters
        ----------
        near : array
            The traces of [s0 − margin, s1 + margin).
        s0, s1 : int
        ctx : Context
        prepared : tuple
            (noise, PCA or None) from `prepare`.
        """
        noise, pca = prepared
        md = self.margin(ctx.fs)
        spikes = self._spikes(near, ctx, noise)
        at = spikes["sample_index"] + self.lag(ctx.fs) - md
        spikes = spikes[(at >= 0) & (at < s1 - s0)]
        out: tuple = ()
        if pca is not None:
            clips, chans = spike_clips(near, spikes, ctx.geometry, ctx.fs, self.n_neighbors)
            if len(spikes) == 0:
                feats = np.zeros((0, chans.shape[1], self.features), np.float32)
            else:
                feats = np.asarray(pca.transform(clips), dtype=np.float32)
            out = (feats, chans.astype(np.int32))
        spikes["sample_index"] += s0 - md
        return (spikes,) + out


register(Detect, (
    Option("detect", "--detect", False, "also detect spikes (/spikes and /features of the "
           "output; needs channel positions)", switch=True),
    Option("detect_threshold", "--threshold", 7.0, "detection threshold in noise SDs",
           type=float, metavar="SDS")),
    make=lambda detect, detect_threshold: Detect(float(detect_threshold)) if detect else None)
