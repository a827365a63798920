"""`BadChannels`: bad channels detected on the fit chunks (or given) and replaced by a kriging
of their good neighbours; `BAD_CHANNEL_LABELS`, the labels its fitted state stores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...argnames import arg
from ...io.subset import parse_channels
from ...ops import SpatialFilter, detect_bad_channels, interpolation_matrix
from ..errors import PipelineError
from ..registry import Option, register
from ..stage import Context, FitBlocks, Step
from .common import _not_fitted, log


#: IBL's noise threshold on the power above 0.8 of Nyquist (µV²/Hz) for the LFP band, used at
#: rates up to `LFP_MAX_FS` (ibldsp's ``detect_bad_channels``: 0.02 above, 1.4 at or below)
LFP_PSD_HF_THRESHOLD = 1.4
LFP_MAX_FS = 2600.0

#: `BadChannels`' labels as stored (its fitted ``"labels"``): index = code
BAD_CHANNEL_LABELS = ("good", "dead", "noise", "out", "given")


@dataclass
class BadChannels(Step):
    """Bad channels replaced by a kriging of their good neighbours: detected on the fit
    chunks as SpikeInterface's ``detect_bad_channels(method="coherence+psd")`` (IBL's, with
    IBL's LFP noise threshold, 1.4 µV²/Hz, at rates up to 2.6 kHz:
    `dspk.ops.detect_bad_channels` on each fit chunk, after the steps before this one — a
    high-pass —, each channel's most frequent label), or given by index; then
    ``spatial_filter(interpolation_matrix(geometry, bad), x)``, SpikeInterface's
    ``interpolate_bad_channels``.

    Fitted state: ``"labels"`` (int8 per channel, codes of `BAD_CHANNEL_LABELS`: good, dead,
    noise, out, given) and ``"W"`` (the interpolation matrix, float64).

    Parameters
    ----------
    channels : str
        ``"detect"``, or the bad channels' 0-based indices and inclusive ranges
        (``"3,17,200-203"``).
    sigma_um, p : float
        The kriging's length scale and exponent (SpikeInterface's defaults).

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline import BadChannels, Pipeline
    >>> x = np.random.default_rng(0).standard_normal((6, 3000)).astype(np.float32)
    >>> geom = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    >>> rec = dspk.open_recording(x, fs=30000.0, geometry=geom)
    >>> p = Pipeline([BadChannels("2")]).fit(rec)
    >>> p.states[0]["labels"].tolist()
    [0, 0, 4, 0, 0, 0]
    >>> y = p.transform(x)
    >>> bool((y[[0, 1, 3, 4, 5]] == x[[0, 1, 3, 4, 5]]).all()), bool((y[2] != x[2]).any())
    (True, True)
    """
    channels: str = "detect"
    sigma_um: float = 20.0
    p: float = 1.3

    fitted = ("labels", "W")
    needs = ("geometry",)

    def __post_init__(self) -> None:
        if self.channels != "detect":
            parse_channels(self.channels)        # refused now, naming --bad-channels' value

    @property
    def reads_blocks(self) -> bool:              # type: ignore[override]
        """Detection reads the fit chunks; given channels need none."""
        return self.channels == "detect"

    def describe(self) -> str:
        """``bad_channels='<detect or indices>'``."""
        return f"bad_channels={self.channels!r}"

    def fit(self, blocks: FitBlocks, ctx: Context) -> dict:
        """``{"labels", "W"}``: each channel's label (detected: its most frequent over the
        fit chunks, ties to good) and the interpolation matrix of the bad ones."""
        n = ctx.n_channels
        if self.channels == "detect":
            codes = {name: i for i, name in enumerate(BAD_CHANNEL_LABELS)}
            votes = np.zeros((n, 4), dtype=np.int64)
            for x in blocks.inner():
                lfp = {"psd_hf_threshold": LFP_PSD_HF_THRESHOLD} if ctx.fs <= LFP_MAX_FS \
                    else {}                       # IBL's LFP threshold at LFP rates
                found = detect_bad_channels(x, ctx.geometry, ctx.fs,
                                            num_random_chunks=None, **lfp)
                votes[np.arange(n), [codes[v] for v in found.labels]] += 1
            if not votes.any():
                raise PipelineError(f"{self.describe()}: no fit chunk to detect on")
            labels = np.argmax(votes, axis=1).astype(np.int8)   # ties: the first, good
        else:
            idx = parse_channels(self.channels)
            if idx.max(initial=-1) >= n:
                raise PipelineError(f"{arg('bad_channels')}: channel {int(idx.max())} is "
                                    f"not one of the recording's 0..{n - 1}")
            labels = np.zeros(n, dtype=np.int8)
            labels[idx] = BAD_CHANNEL_LABELS.index("given")
        bad = labels != 0
        if bad.all():
            raise PipelineError(f"{self.describe()}: every channel is bad; nothing to "
                                f"interpolate from")
        log.info("bad channels: %s", ", ".join(
            f"{BAD_CHANNEL_LABELS[c]} {np.flatnonzero(labels == c).tolist()}"
            for c in range(1, len(BAD_CHANNEL_LABELS)) if (labels == c).any()) or "none")
        w = interpolation_matrix(ctx.geometry, bad, sigma_um=self.sigma_um, p=self.p)
        return {"labels": labels, "W": np.asarray(w, dtype=np.float64)}

    def prepare(self, ctx: Context, state: dict) -> SpatialFilter | None:
        """The interpolation on the run's device (None: no bad channel, nothing to do)."""
        if not self.is_fitted(state):
            raise _not_fitted(self.describe())
        if not np.asarray(state["labels"]).any():
            return None
        return SpatialFilter(ctx.xp.asarray(np.asarray(state["W"]).astype(ctx.dtype)))

    def apply(self, x: Any, ctx: Context, prepared: SpatialFilter | None) -> Any:
        """The bad channels of the block x replaced (x itself when there are none)."""
        return x if prepared is None else prepared(x)


register(BadChannels, (
    Option("bad_channels", "--bad-channels", "none", "bad channels replaced by their good "
           "neighbours: detect (on the fit chunks, as SpikeInterface's coherence+psd), or "
           "their 0-based indices (3,17,200-203)", metavar="detect|none|IDS"),),
    make=lambda bad_channels: None if bad_channels in (None, "none")
    else BadChannels(str(bad_channels)))
