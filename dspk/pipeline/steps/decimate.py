"""`Decimate`: the recording taken to a lower sampling rate (`dspk.ops.decimate`: every q-th
sample behind the anti-alias FIR of ``scipy.signal.decimate(ftype="fir")``) before the other
steps — a wideband stream (Neuropixels 2.0) to the LFP band's 2.5 kHz, say. The steps after
it, the fit, the sinks and the output all run at the lower rate: a job reads the recording
through `DecimatedRecording`, whose samples are the decimation of the whole recording
(each block read with the filter's half length of context on each side, zeros outside the
recording), so the output does not depend on the chunk size and is written at its own rate
(``fs / q``: the output's ``fs``, the Kilosort folder's params.py, the NWB series' rate).

`Decimate` is a front end: it is the first step of a pipeline or none. On an in-memory array
(`dspk.Pipeline.transform`) it decimates the whole array, then the other steps run at the
new rate.

Examples
--------
>>> import numpy as np, dspk
>>> from dspk.pipeline import Decimate, Pipeline, Reference
>>> x = np.random.default_rng(0).standard_normal((4, 30000)).astype(np.float32)
>>> p = Pipeline([Decimate(12), Reference("median")])
>>> p.transform(x, fs=30000.0).shape                    # 30 kHz -> 2.5 kHz
(4, 2500)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...argnames import arg
from ...io.recording import Recording, RecordingSpec
from ...ops.decimate import decimate, decimate_taps
from ..errors import PipelineError
from ..registry import Option, register
from ..stage import Context, Step

__all__ = ["Decimate", "DecimatedRecording", "RATE_TOLERANCE"]

#: how far ``fs / target_hz`` may be from a whole number (relative) for `Decimate`'s target
RATE_TOLERANCE = 1e-6


class DecimatedRecording(Recording):
    """A recording decimated by ``q`` (`dspk.ops.decimate` with its default filter): sample
    k is the anti-aliased parent's sample k·q, computed from the parent's samples
    ``[k·q − 10·q, k·q + 10·q]`` (zeros outside it), so any block read equals the same
    samples of the decimation of the whole recording (within float rounding: the product
    may take another kernel for another block shape). float32 µV (gain 1); ``fs / q``;
    ``ceil(n / q)`` samples; the parent's channels, geometry, shanks, ids and files; sample
    shifts divided by q (a fraction of the new sample period); no sync words (the events stay
    the parent's: ``input_recording``).

    Parameters
    ----------
    parent : Recording or RecordingSpec
    q : int
        The decimation factor (>= 2).
    xp : module, optional
        Where the decimation runs: ``numpy`` (default) or ``cupy`` (blocks are then CuPy
        arrays, as an `dspk.io.ArrayRecording` of CuPy arrays gives).
    own : bool
        Close the parent with this recording (a spec given is always owned).

    Attributes
    ----------
    input_recording : Recording
        The parent.
    q : int
    input_fs : float
        The parent's rate.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.signal import decimate as scipy_decimate
    >>> from dspk.io import open_recording
    >>> from dspk.pipeline.steps.decimate import DecimatedRecording
    >>> x = np.random.default_rng(0).standard_normal((30000, 2)).astype(np.float32)
    >>> rec = DecimatedRecording(open_recording(x, fs=30000.0), 12)
    >>> rec.fs, rec.n_samples
    (2500.0, 2500)
    >>> ref = scipy_decimate(x.T.astype(np.float64), 12, ftype="fir")
    >>> bool(np.abs(rec.read(700, 1300) - ref[:, 700:1300]).max() < 1e-5)
    True
    """

    samples_first = False

    def __init__(self, parent: Any, q: int, xp: Any = None, own: bool = False) -> None:
        if isinstance(parent, RecordingSpec):
            parent, own = parent.open(), True
        decimate_taps(q)                           # q refused here, naming it
        q = int(q)
        n = int(math.ceil(parent.n_samples / q))
        if n < 2:
            raise PipelineError(f"{arg('decimate', q)}: the recording's {parent.n_samples} "
                                f"samples decimate to {n}; expected at least 2")
        super().__init__(fs=parent.fs / q, n_channels=parent.n_channels, n_samples=n,
                         dtype=np.float32, geometry=parent.geometry,
                         source=f"{parent.source} [decimated by {q}]")
        self.input_recording, self.q, self.input_fs, self._own = parent, q, float(parent.fs), own
        self.xp = np if xp is None else xp
        self.half = (len(decimate_taps(q)) - 1) // 2           # 10·q
        shifts = parent.sample_shifts
        self.sample_shifts = None if shifts is None else np.asarray(shifts, np.float64) / q
        self.shank_ids, self.channel_ids = parent.shank_ids, parent.channel_ids
        self.contact_ids = parent.contact_ids
        self.compressed = parent.compressed

    @property
    def decompress_s(self) -> float:             # type: ignore[override]
        """The parent's decompression time."""
        return float(getattr(self.input_recording, "decompress_s", 0.0))

    @decompress_s.setter
    def decompress_s(self, value: float) -> None:
        pass

    def _read(self, start: int, stop: int, idx: np.ndarray) -> Any:
        parent, q, h, xp = self.input_recording, self.q, self.half, self.xp
        a, b = start * q - h, stop * q + h            # the outputs' centres and their context
        lo, hi = max(0, a), min(parent.n_samples, b)
        x = xp.zeros((len(idx), b - a), dtype=np.float32)
        if hi > lo:
            x[:, lo - a:hi - a] = xp.asarray(parent.read(lo, hi, channels=idx))
        return decimate(x, q, halo=h)[:, :stop - start]

    def files(self) -> tuple:
        """The parent's files."""
        return self.input_recording.files()

    def spec(self) -> RecordingSpec:
        """The parent's spec, decimated again where it is opened (on the CPU)."""
        return RecordingSpec(cls=DecimatedRecording,
                             kwargs=dict(parent=self.input_recording.spec(), q=self.q))

    def close(self) -> None:
        """Closes the parent too when this recording owns it."""
        if self._own:
            self.input_recording.close()
        super().close()


@dataclass
class Decimate(Step):
    """The recording decimated before the other steps (module notes): by ``q``, or to
    ``target_hz`` (``q = fs / target_hz``, a whole number; a recording already at the target
    rate is left as it is — an LFP stream at 2.5 kHz, where a wideband one is decimated).

    Parameters
    ----------
    q : int, optional
        The decimation factor (>= 2).
    target_hz : float, optional
        The rate wanted instead (exactly one of ``q`` and ``target_hz``).

    Examples
    --------
    >>> from dspk.pipeline import Decimate
    >>> Decimate(target_hz=2500.0).factor(30000.0), Decimate(target_hz=2500.0).factor(2500.0)
    (12, 1)
    >>> Decimate(12).describe()
    'decimate=12'
    """

    q: int | None = None
    target_hz: float | None = None
    #: a front end: applied to the recording the other steps read (`source`)
    front_end = True

    def __post_init__(self) -> None:
        if (self.q is None) == (self.target_hz is None):
            raise PipelineError(f"{arg('decimate')}: give a factor or {arg('decimate_to')} "
                                f"a rate (one of them)")
        if self.q is not None:
            if isinstance(self.q, bool) or not isinstance(self.q, (int, np.integer)) or \
                    self.q < 2:
                raise PipelineError(f"{arg('decimate', self.q)}: expected a whole factor "
                                    f">= 2")
            self.q = int(self.q)
        else:
            t = self.target_hz
            if isinstance(t, bool) or not isinstance(t, (int, float, np.number)) or \
                    not np.isfinite(t) or t <= 0:
                raise PipelineError(f"{arg('decimate_to', t)}: expected a positive rate in "
                                    f"Hz")
            self.target_hz = float(t)

    def describe(self) -> str:
        """``decimate=<q>`` or ``decimate_to=<Hz>``."""
        return f"decimate={self.q}" if self.q is not None else \
            f"decimate_to={self.target_hz:g}"

    def factor(self, fs: float) -> int:
        """The factor at input rate ``fs`` (1: nothing to do).

        Parameters
        ----------
        fs : float

        Raises
        ------
        PipelineError
            A target above ``fs``, or not ``fs`` over a whole number.

        Examples
        --------
        >>> from dspk.pipeline import Decimate
        >>> Decimate(target_hz=7000.0).factor(30000.0)              # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dspk.pipeline.PipelineError: decimate_to=7000.0: ... not a whole factor ...
        """
        if self.q is not None:
            return self.q
        r = float(fs) / self.target_hz
        q = int(round(r))
        if q < 1 or abs(r - q) > RATE_TOLERANCE * r:
            raise PipelineError(f"{arg('decimate_to', self.target_hz)}: the recording's "
                                f"{fs:g} Hz over {self.target_hz:g} Hz is {r:.6g}, not a "
                                f"whole factor >= 1")
        return q

    def check(self, recording: Any) -> None:
        """The factor at the recording's rate, and at least 2 samples after it."""
        q = self.factor(recording.fs)
        if q > 1 and math.ceil(recording.n_samples / q) < 2:
            raise PipelineError(f"{self.describe()}: the recording's {recording.n_samples} "
                                f"samples decimate to fewer than 2")

    def source(self, recording: Any, xp: Any = None) -> Any:
        """The recording the other steps read: ``recording`` decimated
        (`DecimatedRecording`), or itself at factor 1 or when it is decimated already.

        Parameters
        ----------
        recording : Recording
        xp : module, optional
            Where the decimation runs (the pipeline's array module).

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Decimate
        >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
        >>> Decimate(12).source(rec).fs, Decimate(target_hz=3e4).source(rec) is rec
        (2500.0, True)
        """
        if isinstance(recording, DecimatedRecording):
            return recording
        q = self.factor(recording.fs)
        return recording if q == 1 else DecimatedRecording(recording, q, xp)

    def resample(self, x: Any, ctx: Context) -> tuple[Any, float]:
        """The whole array x decimated and its new rate (`dspk.Pipeline.transform`; a job
        decimates its recording instead: `source`).

        Parameters
        ----------
        x : array [channels, samples]
        ctx : Context
            Its rate (``ctx.fs``).

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Context, Decimate
        >>> ctx = Context(fs=3e4, n_channels=2, xp=np, dtype=np.dtype(np.float32))
        >>> y, fs = Decimate(3).resample(np.zeros((2, 30), np.float32), ctx)
        >>> y.shape, fs
        ((2, 10), 10000.0)
        """
        q = self.factor(ctx.fs)
        return self.apply(x, ctx, q), ctx.fs / q

    def prepare(self, ctx: Context, state: dict) -> int:
        """The factor at the array's rate (`dspk.Pipeline.transform`)."""
        return self.factor(ctx.fs)

    def apply(self, x: Any, ctx: Context, prepared: int) -> Any:
        """The whole array x decimated (`dspk.ops.decimate`); a job never calls it (its
        recording is decimated: `source`)."""
        return x if prepared == 1 else decimate(x, prepared)


def _make(decimate: int | None, decimate_to: float | None) -> Decimate | None:
    if decimate is None and decimate_to in (None, 0, 0.0):
        return None
    if decimate is not None and decimate_to not in (None, 0, 0.0):
        raise PipelineError(f"{arg('decimate', decimate)}, {arg('decimate_to', decimate_to)}:"
                            f" give one of them")
    return Decimate(q=decimate) if decimate is not None else Decimate(target_hz=decimate_to)


register(Decimate, (
    Option("decimate", "--decimate", None, "decimate the recording by Q before the other "
           "steps (scipy.signal.decimate's FIR anti-alias filter; the output at fs/Q)",
           type=int, metavar="Q", group="decimate"),
    Option("decimate_to", "--decimate-to", None, "decimate to this rate in Hz (fs/HZ a whole "
           "number; a recording already at it is left as it is), e.g. 2500 for the LFP band",
           type=float, metavar="HZ", group="decimate")),
    make=_make, before="Saturation")
