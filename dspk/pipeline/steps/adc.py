"""The steps that undo what the ADCs did: `Saturation` (samples at or beyond the saturation
level set to zero) and `PhaseShift` (Neuropixels' ADC sample shifts corrected)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...argnames import arg
from ...ops import blank_saturation, phase_shift
from ..errors import PipelineError
from ..registry import Option, register
from ..stage import Context, FitBlocks, Step
from .common import _not_fitted, log


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
