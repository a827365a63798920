"""The temporal filters: `HighPass` and `BandPass`, linear-phase FIR (`dspk.fir_filter`); one
set of options makes either."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ops import bandpass_taps, fir_filter, highpass_taps
from ..registry import Option, register
from ..stage import Context, Step


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
