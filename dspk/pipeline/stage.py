"""The contract every pipeline stage implements: a `Step` (a transformation of [channels,
samples] blocks) or a `Sink` (an output stage that receives the processed blocks and yields
rows of the output's tables: detected spikes and their features).

A stage is a dataclass of its options. What it learns from a recording (`fit`) is its fitted
state: a dict of the arrays named in ``fitted``, saved with the pipeline and in its outputs.
What a run derives from the fitted state and the run's sampling rate and array module (filter
taps, a whitening matrix on the device) is made by `prepare` and belongs to the run, never to
the state: a pipeline is its options and its fitted state, and a run leaves both as they were.

Each stage says what it needs of the recording (`needs`: names of `Recording` attributes,
checked in one place with one message each, `NEEDS`), refuses what it cannot process
(`check`), and how much context in time a chunk needs on each side (`margin`).

Examples
--------
A step that fits nothing (the smallest step; ``dspk.pipeline.register`` adds it to the options
of the command line and of `Pipeline.from_options`):

>>> from dataclasses import dataclass
>>> import numpy as np
>>> from dspk.pipeline import Pipeline, Step
>>> @dataclass
... class Gain(Step):
...     factor: float = 2.0
...     def apply(self, x, ctx, prepared):
...         x *= self.factor
...         return x
>>> Pipeline([Gain(3.0)]).transform(np.ones((2, 4), np.float32), fs=1000.0)
array([[3., 3., 3., 3.],
       [3., 3., 3., 3.]], dtype=float32)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Iterator, Sequence

import numpy as np

from .errors import PipelineError

__all__ = ["Context", "Stage", "Step", "Sink", "Table", "FitBlocks", "Need", "NEEDS",
           "check_order", "front_end",
           "check_needs"]


@dataclass(frozen=True)
class Context:
    """What a stage knows of the run it is in.

    Parameters
    ----------
    fs : float
        The sampling rate in Hz.
    n_channels : int
        Channels of the traces.
    xp : module
        The array module of the blocks (``numpy`` or ``cupy``).
    dtype : numpy.dtype
        The processing precision (float32 or float64).
    geometry : [channels, 2] array, optional
        Contact positions in µm (None for an array without one).
    recording : Recording, optional
        The recording itself, for what else a stage needs of it (see `NEEDS`); None for
        in-memory arrays.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline import Context
    >>> ctx = Context(fs=30000.0, n_channels=4, xp=np, dtype=np.dtype(np.float32))
    >>> ctx.geometry is None, ctx.xp.__name__
    (True, 'numpy')
    """

    fs: float
    n_channels: int
    xp: Any
    dtype: np.dtype
    geometry: Any = None
    recording: Any = None

    @classmethod
    def of(cls, recording: Any, xp: Any, dtype: Any) -> "Context":
        """The context of a run over ``recording`` (its rate, channels and geometry).

        Parameters
        ----------
        recording : Recording
        xp : module
        dtype : numpy dtype

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Context
        >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
        >>> Context.of(rec, np, np.float32).n_channels
        2
        """
        return cls(fs=float(recording.fs), n_channels=int(recording.n_channels), xp=xp,
                   dtype=np.dtype(dtype), geometry=recording.geometry, recording=recording)


@dataclass(frozen=True)
class Need:
    """Something a stage needs of the recording: whether a recording has it, and what a user
    does to give it (one message per need, wherever it is checked).

    Parameters
    ----------
    what : str
        What it is, as a message names it.
    has : callable
        ``has(recording) -> bool``.
    how : str
        How to give it (options in both spellings).

    Examples
    --------
    >>> from dspk.pipeline import NEEDS
    >>> NEEDS["geometry"].what
    'the channel positions in µm'
    """

    what: str
    has: Callable[[Any], bool]
    how: str


#: what a stage may list in ``needs``: a recording attribute that must not be None
NEEDS = {
    "geometry": Need("the channel positions in µm",
                     lambda rec: getattr(rec, "geometry", None) is not None,
                     "pass geometry= to dspk.open_recording (--probe FILE on the command "
                     "line)"),
    "shank_ids": Need("the channels' shanks",
                      lambda rec: getattr(rec, "shank_ids", None) is not None,
                      "open a recording whose metadata says them (a SpikeGLX .meta)"),
}


def check_needs(stage: "Stage", recording: Any) -> None:
    """Refuse ``recording`` when it lacks something ``stage`` needs (`Stage.needs`).

    Parameters
    ----------
    stage : Stage
    recording : Recording

    Raises
    ------
    PipelineError
        Naming the stage as the user asked for it, what it needs, how to give it, and the
        stage's own alternative (`Stage.instead`).

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline import Whiten, check_needs
    >>> rec = dspk.open_recording(np.zeros((3000, 4), np.int16), fs=30000.0)
    >>> check_needs(Whiten("global"), rec)                  # needs nothing
    >>> check_needs(Whiten("local"), rec)                   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: whiten='local' needs the recording's geometry (...
    """
    for name in stage.needs:
        need = NEEDS.get(name)
        if need is None:    # a stage of a newer kind: its need is an attribute by that name
            need = Need(f"its {name.replace('_', ' ')}",
                        lambda rec, name=name: getattr(rec, name, None) is not None,
                        f"the recording's reader does not provide {name}")
        if not need.has(recording):
            source = getattr(recording, "source", "") or "the recording"
            instead = stage.instead(name)
            raise PipelineError(
                f"{stage.describe()} needs the recording's {name} ({need.what}), and "
                f"{source} has none: {need.how}{', or ' + instead if instead else ''}")


class Stage:
    """What every stage of a pipeline has (see `Step` and `Sink`).

    Attributes
    ----------
    fitted : tuple of str
        The names of the arrays `fit` returns (empty: the stage fits nothing). They are
        saved by `dspk.pipeline.Pipeline.save`, written to outputs and fingerprinted.
    whitens : bool
        Whether the traces after it are in units of the noise's standard deviation, not µV
        (an int16 output's default scale follows).
    reads_blocks : bool
        Whether `fit` reads the fit chunks (False: its state comes from the recording alone,
        and a pipeline whose fitted stages all say so reads nothing to fit them).

    Examples
    --------
    >>> from dspk.pipeline import Detect, HighPass, Stage, Whiten
    >>> [isinstance(s, Stage) for s in (HighPass(), Detect())], Whiten.fitted
    ([True, True], ('W',))
    """

    fitted: ClassVar[tuple[str, ...]] = ()
    whitens: ClassVar[bool] = False
    reads_blocks: ClassVar[bool] = True

    @property
    def needs(self) -> tuple[str, ...]:
        """What the stage needs of the recording (keys of `NEEDS`, or other `Recording`
        attributes): none by default.

        Examples
        --------
        >>> from dspk.pipeline import Reference, Whiten
        >>> Reference().needs, Whiten("local").needs
        ((), ('geometry',))
        """
        return ()

    def describe(self) -> str:
        """The stage as a user asks for it, for messages (default: its class name).

        Examples
        --------
        >>> from dspk.pipeline import Whiten
        >>> Whiten("global").describe()
        "whiten='global'"
        """
        return type(self).__name__

    def instead(self, need: str) -> str:
        """What a user can ask for instead when the recording lacks ``need`` (empty: nothing).

        Parameters
        ----------
        need : str

        Examples
        --------
        >>> from dspk.pipeline import Whiten
        >>> Whiten("local").instead("geometry")
        "use whiten='global' (--whiten global)"
        """
        return ""

    def check(self, recording: Any) -> None:
        """Refuse, before any work, a recording this stage cannot process (beyond `needs`,
        which the pipeline checks): nothing to refuse by default.

        Parameters
        ----------
        recording : Recording

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import HighPass
        >>> HighPass().check(dspk.open_recording(np.zeros((3000, 1), np.int16), fs=3e4))
        """

    def fit_pass(self, fs: float) -> int | None:
        """Whether `fit` reads, beside the fit chunks, a pass over the whole recording
        (`FitBlocks.stream`: the recording in chunks, each through the steps before this
        stage) and the samples of context it needs on each side of those chunks; None (the
        default): no pass. A drift estimate reads one (`dspk.pipeline.Motion`).

        Parameters
        ----------
        fs : float
            The sampling rate in Hz.

        Examples
        --------
        >>> from dspk.pipeline import Motion, Whiten
        >>> Whiten().fit_pass(30000.0) is None, Motion().fit_pass(30000.0)
        (True, 51)
        """
        return None

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
        """Whether ``state`` holds every array in `fitted` (always, for a stage that fits
        nothing).

        Parameters
        ----------
        state : dict
            The stage's fitted state.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import HighPass, Whiten
        >>> HighPass().is_fitted({}), Whiten().is_fitted({}), Whiten().is_fitted({"W": np.eye(2)})
        (True, False, True)
        """
        return all(key in state for key in self.fitted)

    def fit(self, blocks: "FitBlocks", ctx: Context) -> dict:
        """The fitted state from the fit chunks (`FitBlocks`: each chunk through every stage
        before this one, with this stage's margin of context); only for stages that have
        `fitted` arrays.

        Parameters
        ----------
        blocks : FitBlocks
        ctx : Context

        Returns
        -------
        dict
            The arrays named in `fitted` (NumPy).
        """
        raise NotImplementedError(f"{type(self).__name__} fits nothing")

    def prepare(self, ctx: Context, state: dict) -> Any:
        """What the stage needs to run, made once per run from its fitted state and the run's
        context (taps at the run's rate, a matrix on the device); default: the state.

        Parameters
        ----------
        ctx : Context
        state : dict
            The fitted state.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Context, HighPass
        >>> ctx = Context(fs=30000.0, n_channels=2, xp=np, dtype=np.dtype(np.float32))
        >>> HighPass(300.0).prepare(ctx, {}).shape          # the taps at 30 kHz
        (263,)
        """
        return state

    def record(self, fs: float) -> dict:
        """Arrays written to an output beside the fitted state, for the record (a filter's
        taps): none by default.

        Parameters
        ----------
        fs : float

        Examples
        --------
        >>> from dspk.pipeline import Reference
        >>> Reference().record(30000.0)
        {}
        """
        return {}


class Step(Stage):
    """A transformation of [channels, samples] blocks: `apply`, after `prepare`.

    Subclasses are dataclasses of their options and implement `apply`; a step that learns
    from the recording lists its arrays in ``fitted`` and implements `fit`.

    Examples
    --------
    >>> from dspk.pipeline import Step, Whiten
    >>> isinstance(Whiten(), Step), Whiten().is_fitted({}), Whiten().margin(30000.0)
    (True, False, 0)
    """

    def apply(self, x: Any, ctx: Context, prepared: Any) -> Any:
        """The step on a block x [channels, samples] (in place where it can); returns the
        block.

        Parameters
        ----------
        x : array [channels, samples]
            In the run's dtype and array module.
        ctx : Context
        prepared : object
            What `prepare` made.
        """
        raise NotImplementedError

    def apply_at(self, x: Any, ctx: Context, prepared: Any, start: int) -> Any:
        """`apply` on a block whose first sample is sample ``start`` of the recording
        (negative for a block that begins with a halo before it): what the pipeline calls. A
        step whose output depends on the time (a drift correction) implements this instead of
        `apply`; by default the position is not needed.

        Parameters
        ----------
        x : array [channels, samples]
        ctx : Context
        prepared : object
            What `prepare` made.
        start : int
            The recording's sample at x[:, 0].

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Context, Reference
        >>> ctx = Context(fs=1e3, n_channels=2, xp=np, dtype=np.dtype(np.float32))
        >>> Reference("mean").apply_at(np.eye(2, dtype=np.float32), ctx, None, start=500)
        array([[ 0.5, -0.5],
               [-0.5,  0.5]], dtype=float32)
        """
        return self.apply(x, ctx, prepared)


@dataclass(frozen=True)
class Table:
    """A table a sink writes, one row per item (a spike), appended chunk by chunk.

    Parameters
    ----------
    name : str
        The dataset's name in the output.
    dtype : numpy dtype
        The row type (a structured dtype for a record per row).
    shape : tuple of int
        The shape of one row (empty for a record).
    chunk : int
        Rows per HDF5 chunk.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline import Table
    >>> Table("features", np.dtype(np.float32), (10, 3), 4096).shape
    (10, 3)
    """

    name: str
    dtype: np.dtype
    shape: tuple = ()
    chunk: int = 4096


class Sink(Stage):
    """An output stage: it receives the processed traces of each chunk, with its `margin` of
    exact context on each side, and yields rows of its tables (`tables`), written beside the
    traces in the chunks' order. It comes after every step; what it fits (a noise level, a
    feature PCA) is fitted with the steps, in the same pass.

    Examples
    --------
    >>> from dspk.pipeline import Detect, Sink
    >>> isinstance(Detect(), Sink)
    True
    """

    def tables(self, ctx: Context, state: dict) -> list:
        """The `Table` s written (their names unique within a pipeline).

        Parameters
        ----------
        ctx : Context
        state : dict
            The fitted state (a table may exist only when something was fitted).
        """
        raise NotImplementedError

    def rows(self, near: Any, s0: int, s1: int, ctx: Context, prepared: Any) -> tuple:
        """The rows of chunk [s0, s1), one array per table, from ``near``: the processed
        traces of [s0 − margin, s1 + margin).

        Parameters
        ----------
        near : array [channels, s1 − s0 + 2 margin]
        s0, s1 : int
            The chunk's samples in the recording.
        ctx : Context
        prepared : object
            What `prepare` made.
        """
        raise NotImplementedError


class FitBlocks(Sequence):
    """The fit chunks as a stage's `fit` receives them: each through every step before the
    stage, with ``halo`` samples of exact context on each side (the stage's margin); and, for
    a stage that asks for one (`Stage.fit_pass`), the pass over the whole recording.

    Parameters
    ----------
    blocks : sequence of arrays
        [channels, halo + length + halo] each.
    halo : int
    stream : iterable, optional
        The pass (`Stage.fit_pass`): ``(s0, s1, block)`` for consecutive chunks [s0, s1) of
        the recording, each block through the steps before the stage, with the context the
        stage asked for on each side (zeros outside the recording); computed as it is
        iterated (once). Empty for a stage that asks for no pass.
    load : callable, optional
        ``load(item)``: the block of each item of ``blocks``, made when it is read (indexed
        or iterated). A fit whose device ran out of memory holding every chunk keeps them on
        the host and moves each to the device as the stage reads it
        (`dspk.pipeline.prepared.fitted_states`); a stage iterating them holds one at a time.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline import FitBlocks
    >>> fb = FitBlocks([np.arange(10.0)[None]], halo=2)
    >>> len(fb), [b.tolist() for b in fb.inner()]
    (1, [[[2.0, 3.0, 4.0, 5.0, 6.0, 7.0]]])
    >>> FitBlocks([np.arange(4.0)[None]], halo=0, load=lambda b: 2 * b)[0].tolist()
    [[0.0, 2.0, 4.0, 6.0]]
    """

    def __init__(self, blocks: Sequence[Any], halo: int, stream: Iterable = (),
                 load: Callable[[Any], Any] | None = None) -> None:
        self._blocks = list(blocks)
        self.halo = int(halo)
        self.stream = stream
        self._load = load

    def __getitem__(self, i: Any) -> Any:
        if self._load is None:
            return self._blocks[i]
        if isinstance(i, slice):
            return [self._load(b) for b in self._blocks[i]]
        return self._load(self._blocks[i])

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self) -> Iterator[Any]:
        if self._load is None:
            return iter(self._blocks)
        return (self._load(b) for b in self._blocks)

    def inner(self) -> Iterable[Any]:
        """The blocks without their halo: the fit chunks' own samples.

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import FitBlocks
        >>> [b.shape for b in FitBlocks([np.zeros((2, 7))], halo=0).inner()]
        [(2, 7)]
        """
        h = self.halo
        return (b[:, h:b.shape[1] - h] for b in self)


def check_order(steps: Sequence["Stage"], names: Iterable[str] = ()) -> None:
    """Refuse a list of steps a pipeline cannot run: something that is not a stage (``names``:
    the registered ones, for the message), a front end (`Decimate`: it changes the recording
    the others read) anywhere but first or twice, a sink (`Detect`) before a step.

    Examples
    --------
    >>> from dspk.pipeline import Detect, Reference
    >>> from dspk.pipeline.stage import check_order
    >>> check_order([Reference("mean"), Detect()])
    >>> check_order([Detect(), Reference("mean")])
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: steps: Detect must be the last step (sinks after every step)
    """
    for s in steps:
        if not isinstance(s, Stage):
            raise PipelineError(f"steps: {s!r} is not a pipeline step ({', '.join(names)})")
    fronts = [k for k, s in enumerate(steps) if getattr(s, "front_end", False)]
    if fronts and fronts != [0]:
        raise PipelineError(f"steps: {steps[fronts[-1]].describe()} must be the first step (it "
                            f"changes the recording the other steps read), and the only one of "
                            f"its kind")
    kinds = [isinstance(s, Sink) for s in steps]
    if kinds != sorted(kinds):
        raise PipelineError("steps: Detect must be the last step (sinks after every step)")


def front_end(steps: Sequence["Stage"]) -> "Stage | None":
    """The first step when it is a front end (``front_end = True``: `Decimate`, which changes
    the recording the other steps read), else None.

    Examples
    --------
    >>> from dspk.pipeline import Decimate, Reference
    >>> from dspk.pipeline.stage import front_end
    >>> front_end([Decimate(12), Reference("mean")]).q, front_end([Reference("mean")])
    (12, None)
    """
    return steps[0] if steps and getattr(steps[0], "front_end", False) else None
