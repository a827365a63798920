"""One policy for non-finite samples (NaN, ±inf) at dspk's public array API.

A NaN or an infinity in a recording is a damaged sample, not a signal: every product, filter
and reference spreads it (a FIR filter over its taps, a spatial filter or a median reference
over every channel, a covariance over a whole row and column), so the output is silently
wrong far from the damage. The public operations (`dspk.ops`, `dspk.detect`, `dspk.PCA`,
`dspk.Pipeline.transform` / ``apply``) therefore refuse non-finite input with a
`NonFiniteError` (a `ValueError`) that names the argument and the first non-finite element —
channel and sample for [channels, samples] traces — whatever the tuner's cache holds. An
operation that documents another behaviour keeps it (`dspk.ops.blank_saturation` leaves NaN
in place: it compares false with the threshold). The product engine (`dspk.linalg.matmul`) is
arithmetic, not signal processing: it propagates NaN and infinity as IEEE arithmetic does, on
a cold cache as on a warm one (its tuner chooses on a finite probe when the operands are not
finite).

The check is one reduction over the input (`is_finite`: a sum, whose result is finite
exactly when every element is, unless a sum of finite values overflows, which then takes the
exact element-wise test), made once per call at the API's boundary: an operation called by
another one (`dspk.covariance` by `dspk.PCA`, `dspk.fir_bank` by `dspk.detect_spikes`) or by
a pipeline's steps, on blocks whose input was checked as it entered (`checked`), does not
check again. Integer data (int16 recordings) cannot hold NaN and is never scanned.

Examples
--------
>>> import numpy as np
>>> from dspk.finite import check_finite
>>> x = np.zeros((4, 100), np.float32)
>>> check_finite(x, "x")                      # nothing to say
>>> x[2, 17] = np.nan
>>> try:
...     check_finite(x, "x")
... except ValueError as e:
...     print(str(e).split(";")[0])
x: not finite at channel 2, sample 17 (nan)
"""

from __future__ import annotations

import cmath
import contextvars
import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np

from .backend import array_module, is_cupy_array

__all__ = ["NonFiniteError", "check_finite", "is_finite", "first_nonfinite", "api", "checked",
           "outermost"]

F = TypeVar("F", bound=Callable[..., Any])

#: how many public calls (or `checked` blocks) enclose the current code, in this thread and
#: context: 1 inside the outermost public call, which checks its inputs; deeper calls trust
#: them (a context variable: each thread starts at 0, so a thread of its own checks again)
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("dspk_api_depth", default=0)

#: what each axis of an array of that many dimensions is called in the message
AXES = {1: ("element",), 2: ("channel", "sample"), 3: ("row", "channel", "sample")}


class NonFiniteError(ValueError):
    """Non-finite (NaN or infinite) values where dspk needs finite ones. A `ValueError`."""


def _floating(x: Any) -> bool:
    """Whether ``x`` is a NumPy or CuPy array of a dtype that can hold NaN."""
    return (isinstance(x, np.ndarray) or is_cupy_array(x)) and x.dtype.kind in "fc"


def is_finite(x: Any) -> bool:
    """Whether every element of the array ``x`` is finite: one reduction, no temporary array.

    The sum of the elements is NaN or infinite when any element is, so a finite sum settles
    it in one pass over ``x`` (NumPy's pairwise sum reads it at memory speed, where
    ``isfinite(x).all()`` writes and reads a boolean array as well). A sum that overflows (the
    elements being finite but huge) is told apart by the exact element-wise test. Integer
    arrays are finite. On CuPy it is one reduction and one host synchronisation; the sum is
    tested on the host (``cmath.isfinite``): CuPy's ``isfinite`` of it would be one more
    launch, and one more kernel for NVRTC to compile in a fresh process's first checked call
    (80-130 ms on an H100, in most public calls' first use).

    Examples
    --------
    >>> import numpy as np
    >>> is_finite(np.ones((2, 3))), is_finite(np.array([1.0, np.inf])), is_finite(
    ...     np.full(4, 3e38, np.float32))
    (True, False, True)
    """
    if not _floating(x):
        return True
    xp = array_module(x)
    if cmath.isfinite(x.sum().item()):      # (a Python float or complex: on the host)
        return True
    return bool(xp.isfinite(x).all())          # NaN/inf, or finite values whose sum overflowed


def first_nonfinite(x: Any) -> tuple[int, ...] | None:
    """The index of the first non-finite element of ``x`` in C order, or None (a full scan:
    for the error message, after `is_finite` said no).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.zeros((3, 4)); x[1, 2] = np.inf; x[2, 0] = np.nan
    >>> first_nonfinite(x)
    (1, 2)
    """
    if not _floating(x):
        return None
    xp = array_module(x)
    bad = xp.argwhere(~xp.isfinite(x))
    if bad.shape[0] == 0:
        return None
    return tuple(int(v) for v in bad[0])


def nonfinite_message(x: Any, name: str, where: tuple[int, ...],
                      axes: Sequence[str] | None = None) -> str:
    """The error message for a non-finite element of ``x`` at ``where``."""
    axes = tuple(axes) if axes is not None else AXES.get(len(where), ())
    if len(axes) == len(where):
        at = ", ".join(f"{a} {i}" for a, i in zip(axes, where))
    else:
        at = f"index {where}"
    value = float(x[where].real) if x.dtype.kind == "c" else float(x[where])
    return (f"{name}: not finite at {at} ({value!r}); NaN and infinity are damaged samples "
            f"that every filter would spread: repair or zero them first (numpy.nan_to_num), "
            f"or read the recording with dspk.open_recording, which names them")


def check_finite(x: Any, name: str = "x", axes: Sequence[str] | None = None,
                 force: bool = False) -> None:
    """Refuse non-finite values in the array ``x`` with a `NonFiniteError` naming ``name``
    and the first such element (channel and sample for a 2-D array, or the ``axes`` given).

    Checked only at the API's boundary (see the module docstring): inside a public call made
    by another one, or in a `checked` block, it returns at once, unless ``force``. Anything
    that is not a floating NumPy/CuPy array passes (the callers' own checks say what is
    wrong with it).

    Parameters
    ----------
    x : array
    name : str
        The argument's name, as the caller's signature spells it.
    axes : sequence of str, optional
        What each axis is called (default: channel, sample for 2-D arrays).
    force : bool
        Check even inside another public call.

    Raises
    ------
    NonFiniteError
    """
    if not force and _DEPTH.get() > 1:
        return
    if is_finite(x):
        return
    where = first_nonfinite(x)
    if where is None:                          # (not reached: is_finite said there is one)
        return
    raise NonFiniteError(nonfinite_message(x, name, where, axes))


def outermost() -> bool:
    """Whether the code runs in the outermost public call (or outside any), where inputs are
    checked."""
    return _DEPTH.get() <= 1


def api(fn: F) -> F:
    """Mark ``fn`` as a public entry point: its `check_finite` calls check when it is the
    outermost one, and the public functions it calls do not check again.

    Examples
    --------
    >>> import numpy as np
    >>> @api
    ... def inner(x):
    ...     check_finite(x, "x")
    ...     return x.sum()
    >>> @api
    ... def outer(x):
    ...     check_finite(x, "x")
    ...     return inner(x)                      # no second scan
    >>> float(outer(np.ones(3)))
    3.0
    """
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        token = _DEPTH.set(_DEPTH.get() + 1)
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH.reset(token)

    return wrapper  # type: ignore[return-value]


@contextmanager
def checked() -> Iterator[None]:
    """Within the block the inputs of public calls are taken as checked: for code that
    checked its data once (a pipeline's block, checked as it entered or read by a recording
    that checks) and passes it through several operations, each of which would scan it again
    (on the GPU, a host synchronisation each).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[np.nan, 1.0]])
    >>> with checked():
    ...     check_finite(x, "x")                 # trusted: no scan
    """
    token = _DEPTH.set(max(_DEPTH.get(), 1) + 1)   # deeper than any outermost call
    try:
        yield
    finally:
        _DEPTH.reset(token)
