"""What the channels share, removed: `SpatialHighpass` (destriping, a spatial high-pass along
the probe's depth) and `Reference` (the median or mean across channels, within each shank, or
within the channels sampled at each ADC instant)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...backend import array_module, to_numpy
from ...argnames import arg
from ...ops import (adc_groups, agc_window, common_reference, highpass_spatial_filter,
                    highpass_spatial_matrix)
from ..errors import PipelineError
from ..registry import Option, register
from ..stage import Context, FitBlocks, Step
from .common import GROUPS, _not_fitted, log

#: the channel groups a reference can be taken within: all channels, each shank, or the
#: channels sampled at each ADC instant (CatGT's demultiplexed CAR, ``-gbldmx``)
REFERENCE_GROUPS = GROUPS + ("adc",)


@dataclass
class SpatialHighpass(Step):
    """Destriping: a spatial Butterworth high-pass along the probe's depth, with automatic gain
    control, as SpikeInterface's ``highpass_spatial_filter`` (IBL's ``kfilt``;
    `dspk.ops.highpass_spatial_filter`: one [C, C] matrix on `dspk.spatial_filter`, the AGC's
    Hann window on `dspk.fir_filter`), each shank on its own where the recording gives its
    shanks.

    Fitted state: ``"rms"`` (each channel's RMS over the fit chunks, after the steps before
    this one: the AGC's floor is ``epsilon · rms``, fixed for the recording as SpikeInterface
    fixes it from random chunks; a per-chunk RMS would make the output depend on the
    chunking), and the ``"geometry"`` and ``"shanks"`` the filter is built from.

    Parameters
    ----------
    apply_agc : bool
        The automatic gain control (SpikeInterface's default: on); its window's half length
        (1500 samples at 30 kHz) is the step's margin.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline import Pipeline, SpatialHighpass
    >>> rng = np.random.default_rng(0)
    >>> geom = np.c_[np.zeros(96), 20.0 * np.arange(96)]
    >>> stripe = rng.standard_normal(9000)
    >>> x = (rng.standard_normal((96, 9000)) + 5 * stripe).astype(np.float32)
    >>> rec = dspk.open_recording(x, fs=30000.0, geometry=geom)
    >>> y = Pipeline([SpatialHighpass(apply_agc=False)]).fit(rec).transform(x)
    >>> bool(np.abs(y.mean(axis=0)).std() < 0.2 * np.abs(x.mean(axis=0)).std())   # removed
    True
    """
    apply_agc: bool = True

    fitted = ("rms", "geometry", "shanks")
    needs = ("geometry",)

    def describe(self) -> str:
        """``spatial_highpass=True`` (``apply_agc=False`` when off)."""
        return "spatial_highpass=True" + ("" if self.apply_agc else ", apply_agc=False")

    def margin(self, fs: float) -> int:
        """The AGC window's half length (none without AGC)."""
        return len(agc_window(fs)) // 2 if self.apply_agc else 0

    def check(self, recording: Any) -> None:
        """Refuse, before any work, a geometry the filter cannot order along depth (a group
        whose channels all sit at one depth, too few channels for the padding).

        Parameters
        ----------
        recording : Recording

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import SpatialHighpass
        >>> flat = np.c_[20.0 * np.arange(64), np.zeros(64)]   # 64 channels at one depth
        >>> rec = dspk.open_recording(np.zeros((3000, 64), np.int16), fs=3e4, geometry=flat)
        >>> SpatialHighpass().check(rec)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dspk.pipeline.PipelineError: spatial_highpass=True: geometry: the 64 channels of group 0 ...
        """
        if recording.geometry is None:
            return                       # the pipeline's `needs` check says what is missing
        shanks = getattr(recording, "shank_ids", None)
        try:
            highpass_spatial_matrix(recording.geometry, groups=shanks)
        except ValueError as e:
            raise PipelineError(f"{self.describe()}: {e}") from None

    def fit(self, blocks: FitBlocks, ctx: Context) -> dict:
        """``{"rms", "geometry", "shanks"}`` (shanks: -1 everywhere when the recording does
        not give them: one group)."""
        sq, n = np.zeros(ctx.n_channels), 0
        for x in blocks.inner():
            # where the chunk is: on the GPU only the sums come back (each fit chunk copied
            # to the host and widened there took half of the IBL chain's GPU fit, profiled)
            xp = array_module(x)
            h = x.astype(np.float64)
            sq += to_numpy(xp.einsum("ij,ij->i", h, h))
            n += h.shape[1]
        if n == 0:
            raise PipelineError(f"{self.describe()}: no fit chunk to measure the RMS on")
        shanks = getattr(ctx.recording, "shank_ids", None)
        return {"rms": np.sqrt(sq / n), "geometry": np.asarray(ctx.geometry, np.float64),
                "shanks": np.full(ctx.n_channels, -1, np.int64) if shanks is None
                else np.asarray(shanks, np.int64)}

    def prepare(self, ctx: Context, state: dict) -> dict:
        """The filter's keywords from the fitted state."""
        if not self.is_fitted(state):
            raise _not_fitted(self.describe())
        shanks = np.asarray(state["shanks"])
        return dict(geometry=np.asarray(state["geometry"]), rms_values=np.asarray(state["rms"]),
                    groups=None if (shanks < 0).all() else shanks)

    def apply(self, x: Any, ctx: Context, prepared: dict) -> Any:
        """The destriped block x [channels, samples]."""
        return highpass_spatial_filter(x, prepared["geometry"], ctx.fs,
                                       apply_agc=self.apply_agc,
                                       rms_values=prepared["rms_values"],
                                       groups=prepared["groups"])


register(SpatialHighpass, (
    Option("spatial_highpass", "--spatial-highpass", False, "destripe: a spatial high-pass "
           "along depth with automatic gain control, as SpikeInterface's "
           "highpass_spatial_filter (IBL's kfilt)", switch=True),),
    make=lambda spatial_highpass: SpatialHighpass() if spatial_highpass else None)


@dataclass
class Reference(Step):
    """Common reference across channels, per sample: ``operator`` "median" or "mean", over
    every channel, within each shank (``groups="shank"``: SpikeInterface's
    ``common_reference(recording, groups=...)`` by shank), or within the channels sampled at
    each ADC instant (``groups="adc"``: CatGT's demultiplexed CAR ``-gbldmx`` with
    ``operator="mean"``; `dspk.ops.demux_reference`).

    Per shank, the channels' shanks (`Recording.shank_ids`) are the step's fitted state
    (``"shanks"``); per ADC instant, their ADC sample shifts (`Recording.sample_shifts`,
    ``"shifts"``: channels with one shift were sampled together); taken from the recording
    when the pipeline is fitted (nothing read).

    Parameters
    ----------
    operator : {"median", "mean"}
        As for `dspk.common_reference`.
    groups : {"none", "shank", "adc"}
        One reference for all channels, one per shank, or one per ADC instant.

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
    groups: str = "none"

    reads_blocks = False

    def __post_init__(self) -> None:
        if self.groups not in REFERENCE_GROUPS:
            raise PipelineError(f"{arg('reference_groups')}: expected 'none', 'shank' or "
                                f"'adc', got {self.groups!r}")

    @property
    def fitted(self) -> tuple[str, ...]:        # type: ignore[override]
        """``("shanks",)`` per shank, ``("shifts",)`` per ADC instant, else nothing."""
        return {"shank": ("shanks",), "adc": ("shifts",)}.get(self.groups, ())

    @property
    def needs(self) -> tuple[str, ...]:
        """Per shank: the channels' shanks; per ADC instant: their sample shifts."""
        return {"shank": ("shank_ids",), "adc": ("sample_shifts",)}.get(self.groups, ())

    def describe(self) -> str:
        """``reference='<operator>'`` (and ``reference_groups='shank'`` or ``'adc'``)."""
        groups = "" if self.groups == "none" else f", reference_groups={self.groups!r}"
        return f"reference={self.operator!r}{groups}"

    def instead(self, need: str) -> str:
        """One reference for all channels needs no shanks and no sample shifts."""
        return "use reference_groups='none' (--reference-groups none)" \
            if need in ("shank_ids", "sample_shifts") else ""

    def _one_channel(self, where: str) -> PipelineError:
        return PipelineError(f"{self.describe()}: {where} 1 channel; a common reference "
                             f"across channels would subtract it from itself (all zeros). "
                             f"Use reference='none' (--reference none)")

    def check(self, recording: Any) -> None:
        """Refuse a recording of one channel (its own reference: the output would be zeros).

        Parameters
        ----------
        recording : Recording

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Reference
        >>> Reference().check(dspk.open_recording(np.zeros((3000, 1), np.int16), fs=3e4))
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dspk.pipeline.PipelineError: reference='median': the recording has 1 channel; ...
        """
        if recording.n_channels < 2:
            raise self._one_channel("the recording has")

    def fit(self, blocks: FitBlocks, ctx: Context) -> dict:
        """``{"shanks": int64 [channels]}``: the recording's `shank_ids` (per shank); or
        ``{"shifts": float64 [channels]}``: its `sample_shifts` (per ADC instant; each
        instant must have two channels or more)."""
        if self.groups == "adc":
            return self._fit_shifts(ctx)
        shanks = getattr(ctx.recording, "shank_ids", None)
        if shanks is None or len(shanks) != ctx.n_channels:
            raise PipelineError(f"{self.describe()} needs the recording's shanks (a SpikeGLX "
                                f"recording gives them); "
                                f"{self.instead('shank_ids')}")
        shanks = np.asarray(shanks, dtype=np.int64)
        log.info("common reference within each of %d shank(s)", len(np.unique(shanks)))
        return {"shanks": shanks}

    def _fit_shifts(self, ctx: Context) -> dict:
        shifts = getattr(ctx.recording, "sample_shifts", None)
        if shifts is None or len(shifts) != ctx.n_channels:
            raise PipelineError(f"{self.describe()} needs the recording's ADC sample shifts "
                                f"(a SpikeGLX or Open Ephys Neuropixels recording gives "
                                f"them); {self.instead('sample_shifts')}")
        shifts = np.asarray(shifts, dtype=np.float64)
        groups = adc_groups(shifts)
        lone = [int(g[0]) for g in groups if len(g) < 2]
        if lone:
            raise PipelineError(f"{self.describe()}: channel {lone[0]} is the only one "
                                f"sampled at its ADC instant ({len(lone)} such channel(s)): "
                                f"its reference would be itself. Keep whole ADC groups (all "
                                f"of the probe's channels), or "
                                f"{self.instead('sample_shifts')}")
        log.info("common reference within each of %d ADC instant(s) (%d-%d channels each)",
                 len(groups), min(len(g) for g in groups), max(len(g) for g in groups))
        return {"shifts": shifts}

    def prepare(self, ctx: Context, state: dict) -> list | None:
        """Per shank or ADC instant, the channel indices of each group; else None (all
        channels)."""
        if self.groups == "none":
            return None
        if self.groups == "adc":
            if "shifts" not in state:
                raise _not_fitted(self.describe())
            return adc_groups(np.asarray(state["shifts"]))
        if "shanks" not in state:
            raise _not_fitted(self.describe())
        shanks = np.asarray(state["shanks"])
        return [np.flatnonzero(shanks == s) for s in np.unique(shanks)]

    def apply(self, x: Any, ctx: Context, prepared: list | None) -> Any:
        """The reference subtracted from a block x [channels, samples]; `PipelineError` for
        one channel."""
        if x.shape[0] < 2:
            raise self._one_channel("the traces have")
        return common_reference(x, self.operator, groups=prepared)


register(Reference, (
    Option("reference", "--reference", "median", "common reference across channels",
           choices=("median", "mean", "none")),
    Option("reference_groups", "--reference-groups", "none", "one reference for all "
           "channels, per shank (shank: the recording's shanks, e.g. a multi-shank SpikeGLX "
           "probe), or per ADC instant (adc: the channels a Neuropixels probe samples "
           "together, CatGT's demultiplexed CAR -gbldmx with --reference mean)",
           choices=REFERENCE_GROUPS)),
    make=lambda reference, reference_groups: None if reference in (None, "none")
    else Reference(reference, reference_groups or "none"))
