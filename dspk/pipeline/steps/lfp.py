"""`ButterBandPass`: a Butterworth band-pass run forward and backward (``sosfiltfilt``), the
filter of IBL's LFP destripe (``ibldsp.voltage.destripe_lfp``: order 3, 0.5–300 Hz), as its
zero-phase impulse response (`dspk.ops.butter.butter_zero_phase`) so that it streams: each
chunk with half the taps of context (6.2 s at 2.5 kHz for IBL's band) gives the one-shot
result. ``--preset ibl-lfp`` puts it after the decimation to 2.5 kHz."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...argnames import arg
from ...ops.butter import ZERO_PHASE_TOLERANCE, butter_zero_phase_taps
from ...ops.fir import _correlate_same
from ..errors import PipelineError
from ..registry import Option, register
from ..stage import Context, Step

__all__ = ["ButterBandPass", "IBL_LFP_BAND_HZ"]

#: IBL's LFP band (``destripe_lfp``'s ``butter_kwargs``: N=3, Wn=[0.5, 300])
IBL_LFP_BAND_HZ = (0.5, 300.0)


@dataclass
class ButterBandPass(Step):
    """``scipy.signal.sosfiltfilt(butter(order, (low_hz, high_hz), "bandpass"), x)`` as a
    zero-phase FIR (`dspk.ops.butter.butter_zero_phase_taps`, truncated at 1e-7 of the
    largest tap), applied by overlap-add FFTs on the run's device.

    In a pipeline made from options it comes after `BadChannels`: IBL's ``destripe_lfp``
    detects bad channels on the unfiltered traces (their power above 0.8 of Nyquist, which
    the band-pass removes), and the interpolation, a spatial product, commutes with the
    filter.

    It differs from ``sosfiltfilt`` on the whole recording only near the recording's two ends
    (within the taps' half length: ``sosfiltfilt`` extends the array by odd reflection, the
    pipeline sees zeros) and by the cut tail (5e-5 of the DC gain for IBL's band at 2.5 kHz).

    Parameters
    ----------
    low_hz, high_hz : float
        The band in Hz (IBL's LFP: 0.5, 300).
    order : int
        The Butterworth filter's order (IBL: 3).

    Examples
    --------
    >>> from dspk.pipeline.steps import ButterBandPass
    >>> ButterBandPass(0.5, 300.0).margin(2500.0)           # samples of context per side
    15509
    """

    low_hz: float = IBL_LFP_BAND_HZ[0]
    high_hz: float = IBL_LFP_BAND_HZ[1]
    order: int = 3

    def __post_init__(self) -> None:
        lo, hi = self.low_hz, self.high_hz
        ok = all(not isinstance(v, bool) and isinstance(v, (int, float, np.number))
                 and np.isfinite(v) and v > 0 for v in (lo, hi))
        if not ok or not lo < hi:
            raise PipelineError(f"{arg('butter_bandpass', (lo, hi))}: expected two band "
                                f"edges in Hz, 0 < LO < HI")
        if isinstance(self.order, bool) or not isinstance(self.order, (int, np.integer)) \
                or self.order < 1:
            raise PipelineError(f"order: expected an integer >= 1, got {self.order!r}")
        self.low_hz, self.high_hz, self.order = float(lo), float(hi), int(self.order)

    def describe(self) -> str:
        """``butter_bandpass=(<low>, <high>)``."""
        return f"butter_bandpass=({self.low_hz:g}, {self.high_hz:g})"

    def taps(self, fs: float) -> np.ndarray:
        """The zero-phase taps at ``fs`` (float64, odd length, symmetric).

        Parameters
        ----------
        fs : float

        Examples
        --------
        >>> from dspk.pipeline.steps import ButterBandPass
        >>> len(ButterBandPass(0.5, 300.0).taps(2500.0))
        31019
        """
        try:
            return butter_zero_phase_taps(fs, self.low_hz, self.high_hz, self.order,
                                          ZERO_PHASE_TOLERANCE)
        except ValueError as exc:
            raise PipelineError(f"{self.describe()}: {exc}") from None

    def check(self, recording: Any) -> None:
        """The band below the recording's Nyquist frequency (after a decimation: its own)."""
        self.taps(recording.fs)

    def margin(self, fs: float) -> int:
        """Half the taps."""
        return len(self.taps(fs)) // 2

    def prepare(self, ctx: Context, state: dict) -> Any:
        """The taps on the run's device, in its dtype."""
        return ctx.xp.asarray(self.taps(ctx.fs).astype(ctx.dtype))

    def record(self, fs: float) -> dict:
        """The taps, written to an output for the record."""
        return {"taps": self.taps(fs)}

    def apply(self, x: Any, ctx: Context, prepared: Any) -> Any:
        """The filter on a block (overlap-add, zeros outside the block)."""
        if prepared.shape[0] > x.shape[1]:
            # a block shorter than the taps (a short recording): the taps' middle, the rest
            # would only meet zeros
            c, h = prepared.shape[0] // 2, x.shape[1] - 1
            return _correlate_same(ctx.xp, x, prepared[c - h:c + h + 1])
        return _correlate_same(ctx.xp, x, prepared)


def _make(butter_bandpass: Any) -> ButterBandPass | None:
    if butter_bandpass is None:
        return None
    lo, hi = butter_bandpass
    return ButterBandPass(lo, hi)


register(ButterBandPass, (
    Option("butter_bandpass", "--butter-bandpass", None, "Butterworth band-pass (order 3) "
           "run forward and backward, as scipy's sosfiltfilt and IBL's LFP destripe (0.5 300), "
           "streamed as its zero-phase FIR (6.2 s of context each side of a chunk for "
           "0.5 Hz at 2.5 kHz: use --chunk 30 or more)", type=float, nargs=2,
           metavar=("LO", "HI")),),
    make=_make)        # imported after .channels, before .reference: between them
