"""The one registry of pipeline stages and their options: `Pipeline.from_options`, the
command line (``dspk preprocess``, ``tune``, ``preprocess-many``), `dspk.dask.preprocess_many`
and `Pipeline.load` all read it. Adding a step is one class and one `register` call.

An entry is a stage class, the `Option` s that ask for it, and ``make(**values)``, which
builds the stage from those options' values (None: left out). The entries' order is the order
of the stages in a pipeline made from options (filters, reference, whitening, then sinks);
``before=`` places a new entry.

Examples
--------
>>> from dspk.pipeline import registry
>>> [o.name for o in registry.options()][:4]
['decimate', 'decimate_to', 'saturation', 'artifacts']
>>> registry.stages(highpass=300.0, reference="none", whiten="global")
... # doctest: +NORMALIZE_WHITESPACE
[HighPass(cutoff_hz=300.0), Whiten(mode='global', n_neighbors=32, eps=None, groups='none')]
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..argnames import arg
from .errors import PipelineError
from .stage import Sink, Stage

__all__ = ["Option", "register", "unregister", "options", "stage_class", "stage_classes",
           "stages", "PRESETS", "preset"]


@dataclass(frozen=True)
class Option:
    """One option that asks for a stage: a keyword of `Pipeline.from_options` (and of
    `dspk.dask.preprocess_many`) and an option of the command line.

    Parameters
    ----------
    name : str
        The Python keyword (``"n_neighbors"``).
    flag : str
        The command-line option (``"--neighbors"``).
    default : object
        Its value when not given.
    help : str
        One line for ``--help``.
    type : callable, optional
        Converts a command-line string (``float``, ``int``); None for a string.
    choices : tuple, optional
        The values allowed (checked in Python too).
    nargs : int, optional
        Values the command-line option takes (e.g. 2 for a band).
    metavar : str or tuple, optional
        The value's name in ``--help``.
    switch : bool
        A command-line switch (``--detect``): True when given.
    group : str, optional
        Options of one group are mutually exclusive on the command line.

    Examples
    --------
    >>> from dspk.pipeline.registry import Option
    >>> Option("gain", "--gain", None, "multiply the traces", type=float).flag
    '--gain'
    """

    name: str
    flag: str
    default: Any
    help: str
    type: Callable[[str], Any] | None = None
    choices: tuple | None = None
    nargs: int | None = None
    metavar: Any = None
    switch: bool = False
    group: str | None = None

    def check(self, value: Any) -> None:
        """Refuse a value outside `choices`.

        Parameters
        ----------
        value : object

        Raises
        ------
        PipelineError

        Examples
        --------
        >>> from dspk.pipeline.registry import Option
        >>> Option("reference", "--reference", "median", "", choices=("median", "none")
        ...        ).check("average")
        Traceback (most recent call last):
        ...
        dspk.pipeline.PipelineError: reference: expected 'median' or 'none', got 'average'
        """
        if self.choices is not None and value not in self.choices and value is not None:
            allowed = [repr(c) for c in self.choices]
            listed = ", ".join(allowed[:-1]) + " or " + allowed[-1] if len(allowed) > 1 \
                else allowed[0]
            raise PipelineError(f"{self.name}: expected {listed}, got {value!r}")


@dataclass(frozen=True)
class _Entry:
    cls: type
    options: tuple
    make: Callable[..., Any] | None


class _Registry:
    """The entries, in pipeline order, and the classes by name (for loading saved pipelines
    and outputs)."""

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.lock = threading.Lock()


_REGISTRY = _Registry()


def register(cls: type, options: tuple = (), make: Callable[..., Any] | None = None,
             before: str | None = None) -> type:
    """Add a stage class to the registry, with the options that ask for it.

    Parameters
    ----------
    cls : type
        A `Step` or `Sink` subclass (a dataclass of its options); its name is the name
        saved pipelines and outputs store, unique in the registry.
    options : tuple of Option
        The options that ask for it (none: the class can be loaded and used in
        `Pipeline` directly, but no option makes it).
    make : callable, optional
        ``make(**values)`` -> a stage or None, given every option's value (defaults filled
        in); required with ``options``.
    before : str, optional
        The name of a registered class this one is placed before (default: after every
        step, before the sinks; a sink: at the end).

    Returns
    -------
    type
        ``cls``.

    Raises
    ------
    PipelineError
        A name or option already registered, a class that is not a stage, options without
        ``make``, an unknown ``before``.

    Examples
    --------
    >>> from dataclasses import dataclass
    >>> from dspk.pipeline import Step, registry
    >>> from dspk.pipeline.registry import Option
    >>> @dataclass
    ... class Gain(Step):
    ...     factor: float = 1.0
    ...     def apply(self, x, ctx, prepared):
    ...         x *= self.factor
    ...         return x
    >>> _ = registry.register(Gain, (Option("gain", "--gain", None, "multiply by G",
    ...                                      type=float),),
    ...                       make=lambda gain: None if gain is None else Gain(gain),
    ...                       before="Whiten")
    >>> [type(s).__name__ for s in registry.stages(gain=2.0, reference="none")]
    ['HighPass', 'Gain', 'Whiten']
    >>> registry.unregister("Gain")
    """
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise PipelineError(f"register: {cls!r} is not a Step or Sink class")
    if options and make is None:
        raise PipelineError(f"register: {cls.__name__} has options but no make()")
    with _REGISTRY.lock:
        entries = _REGISTRY.entries
        if any(e.cls.__name__ == cls.__name__ for e in entries):
            raise PipelineError(f"register: a stage named {cls.__name__} is registered")
        taken = {o.name for e in entries for o in e.options} | \
            {o.flag for e in entries for o in e.options}
        for o in options:
            if o.name in taken or o.flag in taken:
                raise PipelineError(f"register: option {o.name} ({o.flag}) is taken")
        names = [e.cls.__name__ for e in entries]
        if before is not None:
            if before not in names:
                raise PipelineError(f"register: before={before!r}: no such stage "
                                    f"({', '.join(names)})")
            at = names.index(before)
        elif issubclass(cls, Sink):
            at = len(entries)
        else:
            at = next((i for i, e in enumerate(entries) if issubclass(e.cls, Sink)),
                      len(entries))
        entries.insert(at, _Entry(cls, tuple(options), make))
    return cls


def unregister(name: str) -> None:
    """Remove the class called ``name`` (and its options) from the registry.

    Parameters
    ----------
    name : str

    Examples
    --------
    >>> from dspk.pipeline import registry
    >>> registry.unregister("NoSuchStep")
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: unregister: no stage named NoSuchStep
    """
    with _REGISTRY.lock:
        for i, e in enumerate(_REGISTRY.entries):
            if e.cls.__name__ == name:
                del _REGISTRY.entries[i]
                return
    raise PipelineError(f"unregister: no stage named {name}")


def options() -> list:
    """Every registered `Option`, in pipeline order.

    Examples
    --------
    >>> from dspk.pipeline import registry
    >>> [o.flag for o in registry.options()]           # doctest: +NORMALIZE_WHITESPACE
    ['--decimate', '--decimate-to', '--saturation', '--artifacts', '--artifact-window',
     '--artifact-mode', '--phase-shift', '--highpass', '--bandpass', '--bad-channels',
     '--butter-bandpass',
     '--spatial-highpass', '--reference', '--reference-groups', '--whiten', '--neighbors',
     '--whiten-groups', '--motion', '--detect', '--threshold']
    """
    return [o for e in list(_REGISTRY.entries) for o in e.options]


def stage_classes() -> dict:
    """The registered stage classes by name.

    Examples
    --------
    >>> from dspk.pipeline import registry
    >>> sorted(registry.stage_classes())      # doctest: +NORMALIZE_WHITESPACE
    ['BadChannels', 'BandPass', 'ButterBandPass', 'Decimate', 'Detect', 'HighPass', 'Motion',
     'PhaseShift', 'Reference', 'RemoveArtifacts', 'Saturation', 'SpatialHighpass', 'Whiten']
    """
    return {e.cls.__name__: e.cls for e in list(_REGISTRY.entries)}


def stage_class(name: str, where: str = "") -> type:
    """The registered class called ``name`` (for a saved pipeline or an output's steps).

    Parameters
    ----------
    name : str
    where : str
        Where the name was read, for the message.

    Raises
    ------
    PipelineError
        An unknown name (a stage registered by code not imported here).

    Examples
    --------
    >>> from dspk.pipeline import registry
    >>> registry.stage_class("Whiten").__name__
    'Whiten'
    """
    classes = stage_classes()
    if name not in classes:
        raise PipelineError(f"{where + ': ' if where else ''}unknown step {name!r} (registered: "
                            f"{', '.join(classes)}; a step of your own must be registered "
                            f"before it is loaded)")
    return classes[name]


def stages(**values: Any) -> list:
    """The stages the options ask for, in pipeline order.

    Parameters
    ----------
    **values
        Option values by keyword; the others take their defaults.

    Returns
    -------
    list of Stage

    Raises
    ------
    TypeError
        An unknown keyword.
    PipelineError
        A value outside an option's choices.

    Examples
    --------
    >>> from dspk.pipeline import registry
    >>> registry.stages(bandpass=(300, 3000), reference="mean", whiten=None, detect=True)
    ... # doctest: +NORMALIZE_WHITESPACE
    [BandPass(cutoff_hz=300.0, high_hz=3000.0), Reference(operator='mean', groups='none'),
     Detect(threshold=7.0, n_neighbors=10, dead_time_ms=0.67, features=3)]
    """
    entries = list(_REGISTRY.entries)
    known = {o.name for e in entries for o in e.options}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TypeError(f"unknown pipeline option(s) {unknown} (options: {sorted(known)})")
    made = []
    for e in entries:
        if not e.options:
            continue
        given = {o.name: values.get(o.name, o.default) for o in e.options}
        for o in e.options:
            o.check(given[o.name])
        stage = e.make(**given)
        if stage is not None:
            made.append(stage)
    return made


#: option values of the chains users know, by name (``dspk preprocess --preset NAME``,
#: ``Pipeline.from_options(preset=NAME)``); options given alongside win
PRESETS = {
    # IBL's destripe: ADC shift correction, high-pass, bad channels interpolated, spatial
    # high-pass with AGC (ibl-neuropixel's `destripe`; no common reference, no whitening)
    "ibl": dict(phase_shift="auto", highpass=300.0, bad_channels="detect",
                spatial_highpass=True, reference="none", whiten="none"),
    # Kilosort4's: high-pass, median across channels, local whitening on 32 channels (KS4
    # takes its median before its high-pass; here the high-pass comes first)
    "kilosort": dict(highpass=300.0, reference="median", whiten="local", n_neighbors=32),
    # IBL's LFP destripe (ibldsp.voltage.destripe_lfp): a wideband stream decimated to 2.5 kHz
    # first (an LFP stream at 2.5 kHz is left as it is), the ADC shift correction, its
    # Butterworth band-pass 0.5-300 Hz (order 3, forward and backward), bad channels with
    # the LFP noise threshold, and its spatial filter: k_filter=False, the median across
    # each shank's channels
    "ibl-lfp": dict(decimate_to=2500.0, phase_shift="auto", highpass=0.0,
                    butter_bandpass=(0.5, 300.0), bad_channels="detect",
                    spatial_highpass=False, reference="median", reference_groups="shank",
                    whiten="none"),
}


def preset(name: str) -> dict:
    """The option values of a preset (`PRESETS`).

    Parameters
    ----------
    name : str

    Raises
    ------
    PipelineError
        An unknown name (the message lists the known ones).

    Examples
    --------
    >>> from dspk.pipeline import registry
    >>> stages(**registry.preset("kilosort"))     # doctest: +NORMALIZE_WHITESPACE
    [HighPass(cutoff_hz=300.0), Reference(operator='median', groups='none'),
     Whiten(mode='local', n_neighbors=32, eps=None, groups='none')]
    """
    if name not in PRESETS:
        raise PipelineError(f"{arg('preset')}: expected one of {', '.join(sorted(PRESETS))}, "
                            f"got {name!r}")
    return dict(PRESETS[name])
