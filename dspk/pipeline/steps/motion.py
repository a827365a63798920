"""`Motion`: the drift estimated on a pass over the recording (spikes detected and placed,
registered as DREDge does: `dspk.motion`) and each chunk corrected by kriging; the
interpolation kernel it uses (`MOTION_SIGMA_UM`, `MOTION_P`). The pass itself, and its
detector, are `dspk.motion.spikes`'."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...argnames import arg
from ...motion import BORDERS, Correction, MotionError
from ...motion import Motion as MotionEstimate
from ...motion import estimate as estimate_motion
from ...motion.spikes import SpikeSurvey, pass_margin
from ..errors import PipelineError
from ..registry import Option, register
from ..stage import Context, FitBlocks, Step
from .common import _not_fitted, log

#: the drift estimates a `Motion` step makes
MOTION_MODES = ("rigid", "nonrigid")
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

    Fitting it (`dspk.motion.spikes.SpikeSurvey`): the noise of each detection template
    measured on the fit chunks (as `Detect` does), then every chunk of the recording,
    through the steps before this one, searched for spikes (`dspk.detect_spikes` with one
    template and two spatial widths; each channel first scaled to unit robust noise so that
    un-whitened traces are detected in the same units), each spike placed between the
    channels by a grid of point-source candidates (`dspk.motion.localize`), and the drift
    estimated from them (`dspk.motion.estimate`: DREDge's decentralised registration,
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
    white : bool
        Keep whitened noise white through the correction (`dspk.motion.keep_white`: each
        bin's matrix replaced by its polar factor), for a step after `Whiten`; default off
        (Kilosort4's own correction does not).

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
    white: bool = False

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
        if not isinstance(self.white, (bool, np.bool_)):
            raise PipelineError(f"motion white: expected True or False, got {self.white!r}")

    def describe(self) -> str:
        """``motion='<mode>'``."""
        return f"motion={self.mode!r}"

    def fit_pass(self, fs: float) -> int:
        """The pass's context (`dspk.motion.spikes.pass_margin`): the detection's."""
        return pass_margin(fs)

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
        shanks = getattr(ctx.recording, "shank_ids", None)
        inner = ctx.xp.concatenate(list(blocks.inner()), axis=1)
        survey = SpikeSurvey(inner, g, fs, self.threshold, shank_ids=shanks, dtype=ctx.dtype)
        del inner
        found = survey.add_all(blocks.stream, halo=self.fit_pass(fs)).spikes()
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
                              p=self.p, border=self.border, shank_ids=shanks, white=self.white)
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
