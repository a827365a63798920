"""The preprocessing steps: each one class (a dataclass of its options, implementing the
`dspk.pipeline.Step` contract) and one `dspk.pipeline.registry.register` call that gives it
its options on the command line, in `Pipeline.from_options` and in `dspk.dask`.

- `Saturation`: samples at or beyond a level (saturated ADCs) set to zero
  (`dspk.ops.blank_saturation`);
- `PhaseShift`: the ADC sample-shift correction of Neuropixels recordings
  (`dspk.ops.phase_shift`, the shifts the recording gives);
- `HighPass` / `BandPass`: linear-phase FIR filters (`dspk.fir_filter`);
- `BadChannels`: bad channels detected on the fit chunks (`dspk.ops.detect_bad_channels`)
  or given, replaced by their good neighbours' kriging (`dspk.ops.interpolation_matrix`);
- `SpatialHighpass`: destriping, SpikeInterface's ``highpass_spatial_filter`` / IBL's
  ``kfilt`` (`dspk.ops.highpass_spatial_filter`);
- `Reference`: median or mean across channels (`dspk.common_reference`);
- `Whiten`: ZCA whitening fitted on the recording (`dspk.whitening_matrix`, global or local);
- `Motion`: drift estimated on a pass over the recording (`dspk.motion.estimate`) and
  corrected by kriging (`dspk.motion.correct`).

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
from typing import Any

import numpy as np

from ..argnames import arg
from ..backend import array_module, to_numpy
from ..detect import NOISE_SAMPLES, default_templates, detect_spikes, template_noise
from ..io.subset import parse_channels
from ..motion import BORDERS, Correction, MotionError, localize
from ..motion import Motion as MotionEstimate
from ..motion import estimate as estimate_motion
from ..ops import (CovarianceAccumulator, SpatialFilter, agc_window, bandpass_taps,
                   blank_saturation, common_reference, detect_bad_channels, fir_filter,
                   highpass_spatial_filter, highpass_spatial_matrix, highpass_taps,
                   interpolation_matrix, phase_shift, whitening_matrix)
from .errors import PipelineError
from .registry import Option, register
from .sinks import Detect
from .stage import Context, FitBlocks, Step

__all__ = ["Saturation", "PhaseShift", "HighPass", "BandPass", "BadChannels",
           "SpatialHighpass", "Reference", "Whiten", "Motion"]

# one logger for all of the pipeline's messages (the command line prints its name)
log = logging.getLogger("dspk.pipeline")

#: the channel groups a reference or a whitening can be taken within
GROUPS = ("none", "shank")


def _check_groups(option: str, groups: str) -> None:
    if groups not in GROUPS:
        raise PipelineError(f"{arg(option)}: expected 'shank' or 'none', got {groups!r}")


def _not_fitted(step: str) -> PipelineError:
    """What `prepare` raises for a step whose state is not fitted yet."""
    return PipelineError(f"{step}: not fitted (call Pipeline.fit(recording) first)")


@dataclass
class Saturation(Step):
    """Saturated samples blanked: every sample at or beyond ``±threshold_uv`` (the traces'
    µV, both inclusive) set to 0, as SpikeInterface's ``blank_saturation(recording,
    abs_threshold, direction="both", fill_value=0)`` (`dspk.ops.blank_saturation`). Zero
    rather than the reference's median fill: a fill computed per chunk would make the output
    depend on the chunking; 0 is the median of high-passed traces.

    Parameters
    ----------
    threshold_uv : float
        The saturation level in µV (positive).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline import Pipeline, Saturation
    >>> x = np.array([[10.0, 600.0, -700.0, 20.0]], dtype=np.float32)
    >>> Pipeline([Saturation(500.0)]).transform(x, fs=30000.0)
    array([[10.,  0.,  0., 20.]], dtype=float32)
    """
    threshold_uv: float = 0.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.threshold_uv) and self.threshold_uv > 0):
            raise PipelineError(f"{arg('saturation')}: expected a positive level in µV, got "
                                f"{self.threshold_uv!r}")

    def describe(self) -> str:
        """``saturation=<µV>``."""
        return f"saturation={self.threshold_uv:g}"

    def apply(self, x: Any, ctx: Context, prepared: Any) -> Any:
        """The block x [channels, samples] with its saturated samples set to 0."""
        return blank_saturation(x, self.threshold_uv, direction="both", fill=0.0)


register(Saturation, (
    Option("saturation", "--saturation", None, "blank samples at or beyond +-UV (saturated "
           "ADCs) to 0", type=float, metavar="UV"),),
    make=lambda saturation: None if saturation is None else Saturation(float(saturation)))


#: the largest ADC sample shift (samples) `PhaseShift` takes: Neuropixels' are in [0, 1), so
#: a chunk's context (its margin) is the filters' half-length plus one sample
MAX_SAMPLE_SHIFT = 1.0


@dataclass
class PhaseShift(Step):
    """The correction of Neuropixels' ADC sample shifts: each channel delayed by the fraction
    of a sample its ADC sampled it late (`Recording.sample_shifts`), as SpikeInterface's
    ``phase_shift`` (`dspk.ops.phase_shift`: one windowed-sinc FIR per distinct shift).

    The shifts are this step's fitted state (``"shifts"``, float64 [channels]; empty when the
    recording does not give them: then the step passes the traces through, and says so in
    the log), taken from the recording when the pipeline is fitted, so saved pipelines and
    Dask workers apply the same ones. Fitting it reads nothing.

    Parameters
    ----------
    taps : int
        Taps of each fractional-delay filter (odd; default 63: design error 2e-9 up to 0.8 of
        Nyquist).

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline import PhaseShift, Pipeline
    >>> x = np.random.default_rng(0).standard_normal((2, 3000)).astype(np.float32)
    >>> rec = dspk.open_recording(x, fs=30000.0)
    >>> p = Pipeline([PhaseShift()]).fit(rec)       # an array: no shifts known
    >>> p.states[0]["shifts"].size, bool((p.transform(x) == x).all())
    (0, True)
    """
    taps: int = 63

    fitted = ("shifts",)
    reads_blocks = False

    def describe(self) -> str:
        """``phase_shift='auto'``."""
        return "phase_shift='auto'"

    def margin(self, fs: float) -> int:
        """The filters' reach: half the taps, plus one sample of shift."""
        return self.taps // 2 + int(MAX_SAMPLE_SHIFT)

    def fit(self, blocks: FitBlocks, ctx: Context) -> dict:
        """``{"shifts": ...}``: the recording's `sample_shifts` (empty when it has none);
        `PipelineError` for a shift beyond `MAX_SAMPLE_SHIFT` or one of the wrong length."""
        rec = ctx.recording
        shifts = None if rec is None else getattr(rec, "sample_shifts", None)
        if shifts is None:
            log.info("phase shift: the recording does not give its ADC sample shifts; not "
                     "applied")
            return {"shifts": np.zeros(0)}
        shifts = np.asarray(shifts, dtype=np.float64)
        if shifts.shape != (ctx.n_channels,) or not np.isfinite(shifts).all() or \
                np.abs(shifts).max(initial=0.0) > MAX_SAMPLE_SHIFT:
            raise PipelineError(f"{arg('phase_shift')}: the recording's sample shifts must be "
                                f"{ctx.n_channels} finite values within ±{MAX_SAMPLE_SHIFT:g} "
                                f"sample, got shape {shifts.shape}, largest "
                                f"{float(np.abs(shifts).max(initial=0.0))!r}")
        log.info("phase shift: ADC sample shifts from the recording (%d distinct)",
                 len(np.unique(shifts)))
        return {"shifts": shifts}

    def prepare(self, ctx: Context, state: dict) -> np.ndarray | None:
        """The shifts (None: none known, the step passes the traces through)."""
        if "shifts" not in state:
            raise _not_fitted("PhaseShift")
        shifts = np.asarray(state["shifts"], dtype=np.float64)
        return shifts if shifts.size else None

    def apply(self, x: Any, ctx: Context, prepared: np.ndarray | None) -> Any:
        """Each channel of the block x delayed by its shift (x itself when none are known)."""
        if prepared is None:
            return x
        return phase_shift(x, prepared, taps=self.taps)


register(PhaseShift, (
    Option("phase_shift", "--phase-shift", "off", "correct Neuropixels' ADC sample shifts "
           "(auto: where the recording gives them, e.g. a SpikeGLX .meta)",
           choices=("auto", "off")),),
    make=lambda phase_shift: PhaseShift() if phase_shift == "auto" else None)


@dataclass
class HighPass(Step):
    """Linear-phase FIR high-pass (`dspk.highpass_taps`): ``|H|`` <= 0.03 below 2/3 of the
    cutoff, >= 0.97 above 4/3 of it.

    A pipeline step: the taps are designed once per run (at its sampling rate); its `margin`
    (half the taps) is the context a chunk needs on each side.

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
        """The FIR taps at sampling rate ``fs`` (float64, odd length).

        Parameters
        ----------
        fs : float

        Examples
        --------
        >>> from dspk.pipeline import HighPass
        >>> len(HighPass(300.0).taps(30000.0))
        263
        """
        return highpass_taps(fs, self.cutoff_hz)

    def margin(self, fs: float) -> int:
        """Samples of context a chunk needs on each side: half the taps."""
        return len(self.taps(fs)) // 2

    def describe(self) -> str:
        """``highpass=<cutoff>`` (the option that asks for it)."""
        return f"highpass={self.cutoff_hz:g}"

    def prepare(self, ctx: Context, state: dict) -> np.ndarray:
        """The taps at the run's sampling rate (designed once per run, not per chunk)."""
        return self.taps(ctx.fs)

    def record(self, fs: float) -> dict:
        """The taps, written to an output for the record."""
        return {"taps": self.taps(fs)}

    def apply(self, x: Any, ctx: Context, prepared: np.ndarray) -> Any:
        """The filter on a block x [channels, samples] (`dspk.fir_filter`)."""
        return fir_filter(x, prepared)


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

    def describe(self) -> str:
        """``bandpass=(<low>, <high>)``."""
        return f"bandpass=({self.cutoff_hz:g}, {self.high_hz:g})"


def _make_filter(highpass: float | None, bandpass: Any) -> HighPass | None:
    """A band-pass replaces the high-pass; a high-pass of None or 0 is none."""
    if bandpass is not None:
        lo, hi = bandpass
        return BandPass(float(lo), float(hi))
    return HighPass(float(highpass)) if highpass else None


register(HighPass, (
    Option("highpass", "--highpass", 300.0, "FIR high-pass cutoff in Hz (0: none)",
           type=float, metavar="HZ", group="band"),
    Option("bandpass", "--bandpass", None, "FIR band-pass edges in Hz, instead of the "
           "high-pass", type=float, nargs=2, metavar=("LO", "HI"), group="band")),
    make=_make_filter)
register(BandPass)         # made by the high-pass's options; by name in saved pipelines


#: `BadChannels`' labels as stored (its fitted ``"labels"``): index = code
BAD_CHANNEL_LABELS = ("good", "dead", "noise", "out", "given")


@dataclass
class BadChannels(Step):
    """Bad channels replaced by a kriging of their good neighbours: detected on the fit
    chunks as SpikeInterface's ``detect_bad_channels(method="coherence+psd")`` (IBL's:
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
                found = detect_bad_channels(x, ctx.geometry, ctx.fs,
                                            num_random_chunks=None)
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
    every channel or within each shank (``groups="shank"``: SpikeInterface's
    ``common_reference(recording, groups=...)`` by shank).

    Per shank, the channels' shanks (`Recording.shank_ids`) are the step's fitted state
    (``"shanks"``), taken from the recording when the pipeline is fitted (nothing read).

    Parameters
    ----------
    operator : {"median", "mean"}
        As for `dspk.common_reference`.
    groups : {"none", "shank"}
        One reference for all channels, or one per shank.

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
        _check_groups("reference_groups", self.groups)

    @property
    def fitted(self) -> tuple[str, ...]:        # type: ignore[override]
        """``("shanks",)`` per shank, else nothing."""
        return ("shanks",) if self.groups == "shank" else ()

    @property
    def needs(self) -> tuple[str, ...]:
        """Per shank: the channels' shanks."""
        return ("shank_ids",) if self.groups == "shank" else ()

    def describe(self) -> str:
        """``reference='<operator>'`` (and ``reference_groups='shank'``)."""
        groups = "" if self.groups == "none" else f", reference_groups={self.groups!r}"
        return f"reference={self.operator!r}{groups}"

    def instead(self, need: str) -> str:
        """One reference for all channels needs no shanks."""
        return "use reference_groups='none' (--reference-groups none)" \
            if need == "shank_ids" else ""

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
        """``{"shanks": int64 [channels]}``: the recording's `shank_ids` (per shank only)."""
        shanks = getattr(ctx.recording, "shank_ids", None)
        if shanks is None or len(shanks) != ctx.n_channels:
            raise PipelineError(f"{self.describe()} needs the recording's shanks (a SpikeGLX "
                                f"recording gives them); "
                                f"{self.instead('shank_ids')}")
        shanks = np.asarray(shanks, dtype=np.int64)
        log.info("common reference within each of %d shank(s)", len(np.unique(shanks)))
        return {"shanks": shanks}

    def prepare(self, ctx: Context, state: dict) -> list | None:
        """Per shank, the channel indices of each shank; else None (all channels)."""
        if self.groups == "none":
            return None
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
    Option("reference_groups", "--reference-groups", "none", "one reference per shank "
           "(shank: the recording's shanks, e.g. a multi-shank SpikeGLX probe) or for all "
           "channels", choices=GROUPS)),
    make=lambda reference, reference_groups: None if reference in (None, "none")
    else Reference(reference, reference_groups or "none"))


@dataclass
class Whiten(Step):
    """ZCA whitening fitted on the recording: "global", or "local" (each channel against its
    ``n_neighbors`` nearest channels; needs the recording's geometry).

    `fit` computes W (`dspk.whitening_matrix`) from the covariance of the fit chunks after
    the steps before this one; it is the step's fitted state (``"W"``, float64), applied in
    the traces' dtype.

    Parameters
    ----------
    mode : {"local", "global"}
    n_neighbors : int
        Neighbourhood size for local whitening (at most the channel count is used).
    eps : float, optional
        Regularization, as for `dspk.whitening_matrix`.
    groups : {"none", "shank"}
        Whiten across all channels, or within each shank (W block-diagonal; needs the
        recording's `shank_ids`).

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
    groups: str = "none"

    fitted = ("W",)
    whitens = True

    def __post_init__(self) -> None:
        _check_groups("whiten_groups", self.groups)

    @property
    def needs(self) -> tuple[str, ...]:
        """Local whitening needs the geometry; whitening per shank the channels' shanks."""
        return (("geometry",) if self.mode == "local" else ()) + \
            (("shank_ids",) if self.groups == "shank" else ())

    def describe(self) -> str:
        """``whiten='<mode>'`` (and ``whiten_groups='shank'``)."""
        groups = "" if self.groups == "none" else f", whiten_groups={self.groups!r}"
        return f"whiten={self.mode!r}{groups}"

    def instead(self, need: str) -> str:
        """Global whitening needs no geometry; whitening across shanks no shanks."""
        if need == "shank_ids":
            return "use whiten_groups='none' (--whiten-groups none)"
        return "use whiten='global' (--whiten global)" if need == "geometry" else ""

    def fit(self, blocks: FitBlocks, ctx: Context) -> dict:
        """``{"W": float64 [channels, channels]}`` from the covariance of the fit chunks
        (their own samples, after the steps before this one), accumulated chunk by chunk in
        order (`dspk.CovarianceAccumulator`).

        Parameters
        ----------
        blocks : FitBlocks
        ctx : Context
            Its geometry for local whitening.

        Returns
        -------
        dict

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Context, FitBlocks, Whiten
        >>> x = np.random.default_rng(0).standard_normal((3, 9000))
        >>> ctx = Context(fs=30000.0, n_channels=3, xp=np, dtype=np.dtype(np.float64))
        >>> Whiten("global").fit(FitBlocks([x], halo=0), ctx)["W"].shape
        (3, 3)
        """
        acc = CovarianceAccumulator()
        for x in blocks.inner():
            acc.add(x)
        shanks = getattr(ctx.recording, "shank_ids", None) if self.groups == "shank" else None
        return self.from_covariance(acc, ctx.geometry, shanks)

    def from_covariance(self, covariance: CovarianceAccumulator, geometry: Any = None,
                        shank_ids: Any = None) -> dict:
        """``{"W": ...}`` from an accumulated covariance (`fit`'s last part).

        Parameters
        ----------
        covariance : CovarianceAccumulator
        geometry : [channels, 2] array, optional
            Needed by local whitening.
        shank_ids : [channels] array, optional
            Needed per shank (``groups="shank"``): W is then block-diagonal, each shank
            whitened on its own channels' covariance (Kilosort4's and SpikeInterface's
            per-shank whitening).

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Whiten
        >>> acc = dspk.CovarianceAccumulator()
        >>> _ = acc.add(np.random.default_rng(0).standard_normal((3, 9000)))
        >>> Whiten("global").from_covariance(acc)["W"].shape
        (3, 3)
        """
        if self.mode == "local" and geometry is None:
            raise PipelineError("whiten='local' needs the recording's geometry (channel "
                                "positions); pass geometry= when opening it, or use "
                                "whiten='global'")
        cov = covariance.result().astype(np.float64)
        if self.groups == "none":
            w = self._zca(cov, geometry)
        else:
            if shank_ids is None or len(shank_ids) != cov.shape[0]:
                raise PipelineError(f"{self.describe()} needs the recording's shanks; "
                                    f"{self.instead('shank_ids')}")
            shanks = np.asarray(shank_ids)
            w = np.zeros_like(cov)
            for s in np.unique(shanks):
                g = np.flatnonzero(shanks == s)
                w[np.ix_(g, g)] = self._zca(cov[np.ix_(g, g)],
                                            None if geometry is None else np.asarray(geometry)[g])
        log.info("fitted %s whitening on %d samples%s", self.mode, covariance.n,
                 "" if self.groups == "none" else " within each shank")
        return {"W": to_numpy(w).astype(np.float64)}

    def _zca(self, cov: np.ndarray, geometry: Any) -> np.ndarray:
        if self.mode == "global":
            return whitening_matrix(cov, eps=self.eps)
        return whitening_matrix(cov, eps=self.eps, geometry_um=geometry,
                                n_neighbors=min(self.n_neighbors, cov.shape[0]))

    def prepare(self, ctx: Context, state: dict) -> SpatialFilter:
        """W on the run's device, in its dtype, as a `dspk.SpatialFilter`; `PipelineError`
        before the fit."""
        if "W" not in state:
            raise _not_fitted("Whiten")
        return SpatialFilter(ctx.xp.asarray(state["W"].astype(ctx.dtype)))

    def apply(self, x: Any, ctx: Context, prepared: SpatialFilter) -> Any:
        """W·x for a block x [channels, samples]."""
        return prepared(x)


register(Whiten, (
    Option("whiten", "--whiten", "local", "ZCA whitening: local needs channel positions "
           "(--probe)", choices=("global", "local", "none")),
    Option("n_neighbors", "--neighbors", 32, "channels per neighbourhood for local whitening",
           type=int, metavar="N"),
    Option("whiten_groups", "--whiten-groups", "none", "whiten within each shank (shank: the "
           "recording's shanks; W block-diagonal) or across all channels",
           choices=GROUPS)),
    make=lambda whiten, n_neighbors, whiten_groups: None if whiten in (None, "none")
    else Whiten(whiten, int(n_neighbors), groups=whiten_groups or "none"))


#: the drift estimates a `Motion` step makes
MOTION_MODES = ("rigid", "nonrigid")
#: the detector of a `Motion` step's pass: one template of the default bank (its middle
#: width) and two spatial widths (µm). Measured on SpikeInterface's drifting ground truth
#: (128 channels x 120 s, 2 cores): the pass 4.5x faster than with the default detector
#: (6 templates, 5 widths), the same spikes within 0.2 % and the same drift error (0.33 against
#: 0.35 µm RMS): the estimate needs the spikes' times and places, not their shapes
MOTION_TEMPLATE, MOTION_WIDTHS_UM = 2, (15.0, 35.0)
#: the interpolation kernel of a `Motion` step, ``exp(−(d/sigma_um)^p)``: Kilosort4's
#: drift-correction kernel, the Gaussian ``exp(−d²/(2·20²))``. The step corrects traces that
#: are whitened (it comes after `Whiten`), whose spike footprints are sharper than the raw
#: ones; SpikeInterface's kriging kernel (20 µm, p=1, `dspk.motion.correct`'s default) then
#: smooths them by an amount that changes with the drift's fraction of the contact pitch, so a
#: unit's amplitude changes with the drift. Measured on SpikeInterface's drifting ground truth
#: (NP1.0, 64 channels x 120 s, corrected by the true motion, benchmarks/bench_sorting.py's
#: unit diagnostic): each unit's peak amplitude over 12-s bins varied by 18.5 % (median CV)
#: with SpikeInterface's kernel, 9.7 % with this one (1.5 % on the static recording); noise SD
#: 0.66 and 0.85 of the whitened traces' 1; Kilosort4 on the step's output (its own
#: estimate) found 9 well-detected units of 30 with this kernel, 8 with that one (Kilosort4
#: alone: 11).
MOTION_SIGMA_UM, MOTION_P = 20.0 * 2.0 ** 0.5, 2.0


@dataclass
class Motion(Step):
    """Drift (motion) correction: the drift estimated on a pass over the whole recording and
    each chunk corrected by it — SpikeInterface's ``correct_motion``, Kilosort's drift
    correction.

    Fitting it: the noise of each detection template measured on the fit chunks (as
    `Detect` does), then every chunk of the recording, through the steps before this one,
    searched for spikes (`dspk.detect_spikes` with one template and two spatial widths,
    `MOTION_TEMPLATE` and `MOTION_WIDTHS_UM`; each channel first scaled to unit robust noise
    so that un-whitened traces are detected in the same units), each spike placed between
    the channels by a grid of point-source candidates (`dspk.motion.localize`), and the
    drift estimated from them (`dspk.motion.estimate`: DREDge's decentralised registration,
    rigid or non-rigid, per shank). Applying it: each sample's channels re-sampled at their
    positions moved by the drift of its time bin, by kriging (`dspk.motion.correct`). A
    recording with too few spikes for the estimate is refused with the count needed.

    Fitted state: the `dspk.motion.Motion` (`Motion.to_state`'s arrays: ``time_edges_s``,
    ``depths_um``, ``displacement``, ``bin_shanks``, ``geometry``, ``channel_shanks``); a
    pipeline fitted on one probe refuses another's recording.

    Parameters
    ----------
    mode : {"rigid", "nonrigid"}
        One displacement per time bin (and shank), or one per window along depth.
    bin_s : float
        The estimate's time bins (s).
    threshold : float
        The detection threshold of the pass, in noise SDs (as `dspk.detect_spikes`).
    border : {"zeros", "extrapolate"}
        A channel moved beyond its shank's extent: zeros, or the kriging's extrapolation
        (`dspk.motion.correct`).
    sigma_um, p : float
        The interpolation's kernel ``exp(−(d/sigma_um)^p)`` (`dspk.motion.correct`); by
        default Kilosort4's Gaussian (`MOTION_SIGMA_UM`, `MOTION_P`: why there).

    Examples
    --------
    >>> from dspk.pipeline import Motion, Pipeline
    >>> step = Motion("rigid")
    >>> step.describe(), step.needs, step.margin(30000.0)
    ("motion='rigid'", ('geometry',), 0)
    >>> [s["step"] for s in Pipeline.from_options(motion="nonrigid").options()]
    ['HighPass', 'Reference', 'Whiten', 'Motion']
    """
    mode: str = "nonrigid"
    bin_s: float = 2.0
    threshold: float = 7.0
    border: str = "zeros"
    sigma_um: float = MOTION_SIGMA_UM
    p: float = MOTION_P

    fitted = ("time_edges_s", "depths_um", "displacement", "bin_shanks", "geometry",
              "channel_shanks")
    needs = ("geometry",)

    def __post_init__(self) -> None:
        if self.mode not in MOTION_MODES:
            raise PipelineError(f"{arg('motion')}: expected 'rigid', 'nonrigid' or 'none', "
                                f"got {self.mode!r}")
        if not (np.isfinite(self.bin_s) and self.bin_s > 0):
            raise PipelineError(f"motion bin_s: expected a positive time bin in seconds, got "
                                f"{self.bin_s!r}")
        if not (np.isfinite(self.threshold) and self.threshold > 0):
            raise PipelineError(f"motion threshold: expected a positive number of noise SDs, "
                                f"got {self.threshold!r}")
        if self.border not in BORDERS:
            raise PipelineError(f"motion border: expected 'zeros' or 'extrapolate', got "
                                f"{self.border!r}")
        for name in ("sigma_um", "p"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
                raise PipelineError(f"motion {name}: expected a positive number, got {v!r}")

    def describe(self) -> str:
        """``motion='<mode>'``."""
        return f"motion={self.mode!r}"

    def fit_pass(self, fs: float) -> int:
        """The detection's context: the templates' half length and the dead time."""
        return Detect(self.threshold).margin(fs)

    def check(self, recording: Any) -> None:
        """Refuse a recording shorter than two time bins (no drift can be estimated).

        Parameters
        ----------
        recording : Recording

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Motion
        >>> rec = dspk.open_recording(np.zeros((30000, 4), np.int16), fs=30000.0,
        ...                           geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)])
        >>> Motion().check(rec)                      # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dspk.pipeline.PipelineError: motion='nonrigid': the recording lasts 1 s, ...
        """
        duration = recording.n_samples / recording.fs
        if duration < 2 * self.bin_s:
            raise PipelineError(f"{self.describe()}: the recording lasts {duration:g} s, less "
                                f"than two time bins of {self.bin_s:g} s: no drift can be "
                                f"estimated (use motion='none', --motion none)")

    def fit(self, blocks: FitBlocks, ctx: Context) -> dict:
        """The drift of the recording (`dspk.motion.Motion.to_state`), from the spikes of a
        pass over it (``blocks.stream``); the detection's units from the fit chunks.

        Parameters
        ----------
        blocks : FitBlocks
            The fit chunks and the pass, through the steps before this one.
        ctx : Context

        Returns
        -------
        dict
        """
        fs, g = ctx.fs, np.asarray(ctx.geometry, np.float64)
        xp = ctx.xp
        inner = xp.concatenate(list(blocks.inner()), axis=1)
        # each channel to unit robust noise (whitened traces: ~1 already; the median of
        # |x| / 0.6745 on evenly spaced samples, on the host), then the noise of each
        # template's output in those units (the detection threshold's unit)
        step = max(1, inner.shape[1] // NOISE_SAMPLES)
        sd = np.median(np.abs(to_numpy(inner[:, ::step])), axis=1).astype(np.float64) / 0.6745
        scale = np.where(sd > 0, 1.0 / np.where(sd > 0, sd, 1.0), 0.0)
        scale_d = xp.asarray(scale.astype(ctx.dtype))[:, None]
        templates = default_templates(fs)[MOTION_TEMPLATE:MOTION_TEMPLATE + 1]
        noise = template_noise(inner * scale_d, fs, templates)
        del inner
        halo = self.fit_pass(fs)
        lag = Detect(self.threshold).lag(fs)
        times, ys, amps, chans = [], [], [], []
        shanks = getattr(ctx.recording, "shank_ids", None)
        for s0, s1, block in blocks.stream:
            x = block * scale_d
            spikes = detect_spikes(x, g, fs, templates=templates, threshold=self.threshold,
                                   widths_um=MOTION_WIDTHS_UM, noise=noise, shank_ids=shanks)
            at = spikes["sample_index"] + lag - halo
            spikes = spikes[(at >= 0) & (at < s1 - s0)]
            if len(spikes) == 0:
                continue
            _, y, _ = localize(x, spikes, g, fs)
            times.append((spikes["sample_index"] + (s0 - halo)) / fs)
            ys.append(y)
            amps.append(spikes["amplitude"].astype(np.float64))
            chans.append(spikes["channel_index"])
        found = {"time_s": np.concatenate(times) if times else np.zeros(0),
                 "y": np.concatenate(ys) if ys else np.zeros(0),
                 "amplitude": np.concatenate(amps) if amps else np.zeros(0),
                 "channel_index": np.concatenate(chans) if chans else np.zeros(0, np.int64)}
        duration = ctx.recording.n_samples / fs
        try:
            motion = estimate_motion(found, g, duration, rigid=self.mode == "rigid",
                                     bin_s=self.bin_s, shank_ids=shanks)
        except MotionError as exc:
            raise PipelineError(f"{self.describe()}: {exc}") from None
        lo, hi = motion.drift_range()
        log.info("motion (%s): %d spikes, %d time bins of %g s, displacement %.3g..%.3g µm",
                 self.mode, len(found["y"]), len(motion.time_centres_s), self.bin_s, lo, hi)
        return motion.to_state()

    def prepare(self, ctx: Context, state: dict) -> Correction:
        """The correction (`dspk.motion.Correction`) of the fitted drift, for the run's probe;
        `PipelineError` before the fit or for another probe."""
        if not self.is_fitted(state):
            raise _not_fitted(self.describe())
        try:
            motion = MotionEstimate.from_state(state)
            shanks = getattr(ctx.recording, "shank_ids", None)
            geometry = ctx.geometry
            if geometry is None:     # an array transformed: the probe the motion was fitted on
                geometry, shanks = motion.geometry, motion.channel_shanks
            return Correction(np.asarray(geometry, np.float64), motion, sigma_um=self.sigma_um,
                              p=self.p, border=self.border, shank_ids=shanks)
        except MotionError as exc:
            raise PipelineError(f"{self.describe()}: {exc}") from None

    def apply(self, x: Any, ctx: Context, prepared: Correction) -> Any:
        """Refused: the correction depends on the block's time (`apply_at`)."""
        raise PipelineError(f"{self.describe()}: the correction needs the block's position in "
                            f"the recording (apply_at)")

    def apply_at(self, x: Any, ctx: Context, prepared: Correction, start: int) -> Any:
        """The block x (whose first sample is the recording's sample ``start``) corrected."""
        return prepared(x, start / ctx.fs, ctx.fs)


register(Motion, (
    Option("motion", "--motion", "none", "drift correction: estimated on a pass over the "
           "recording (spikes detected, registered as DREDge does), rigid or non-rigid along "
           "depth, per shank; needs channel positions", choices=MOTION_MODES + ("none",)),),
    make=lambda motion: None if motion in (None, "none") else Motion(motion))
