"""How a message names what a user can pass: a keyword (``fs=``) in Python, an option (``--fs``)
on the command line.

An error tells the user what to pass instead; a user of ``dspk preprocess`` cannot pass
``gain_to_uv=``. Messages spell every argument through `arg`, and the command line
(`dspk.cli`) runs inside `command_line_spelling` with the table of its options, so the same
check speaks Python in a notebook and options in a shell. Arguments the command line has no
option for keep their Python spelling.

Examples
--------
>>> from dspk.argnames import arg, command_line_spelling
>>> f"pass {arg('fs')} (the sampling rate in Hz)"
'pass fs= (the sampling rate in Hz)'
>>> with command_line_spelling({"fs": "--fs", "reference": "--reference"}):
...     arg("fs"), arg("reference", "none"), arg("dtype", "int16")
('--fs', '--reference none', "dtype='int16'")
>>> arg("reference", "none")
"reference='none'"
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

__all__ = ["arg", "command_line_spelling"]

_UNSET = object()


class _Spelling:
    """The option table in force (None: Python keywords). One per process, not per thread:
    a job's reader and writer threads raise errors that the command line prints too."""

    def __init__(self) -> None:
        self.options: Mapping[str, str] | None = None
        self.lock = threading.Lock()


_SPELLING = _Spelling()


def arg(name: str, value: Any = _UNSET) -> str:
    """The argument ``name`` as the user spells it, with ``value`` when given.

    Parameters
    ----------
    name : str
        The Python keyword (``"fs"``, ``"gain_to_uv"``, ``"geometry"``).
    value : optional
        A value to show with it: ``name=value!r`` in Python, ``--option value`` on the
        command line (``True``: the switch alone).

    Returns
    -------
    str

    Examples
    --------
    >>> from dspk.argnames import arg, command_line_spelling
    >>> arg("overwrite", True), arg("whiten", "global")
    ('overwrite=True', "whiten='global'")
    >>> with command_line_spelling({"overwrite": "--overwrite", "whiten": "--whiten"}):
    ...     arg("overwrite", True), arg("whiten", "global")
    ('--overwrite', '--whiten global')
    """
    options = _SPELLING.options
    if options is not None and name in options:
        flag = options[name]
        if value is _UNSET or value is True:
            return flag
        return f"{flag} {value}"
    if value is _UNSET:
        return f"{name}="
    return f"{name}={value!r}"


@contextmanager
def command_line_spelling(options: Mapping[str, str]) -> Iterator[None]:
    """Within the block, `arg` spells the keywords of ``options`` as their command-line
    options (``{"fs": "--fs", "geometry": "--probe FILE"}``); the table before it is restored
    at the end.

    Parameters
    ----------
    options : mapping
        Python keyword -> command-line option.

    Examples
    --------
    >>> from dspk.argnames import arg, command_line_spelling
    >>> with command_line_spelling({"geometry": "--probe FILE"}):
    ...     arg("geometry")
    '--probe FILE'
    """
    with _SPELLING.lock:
        before, _SPELLING.options = _SPELLING.options, dict(options)
    try:
        yield
    finally:
        with _SPELLING.lock:
            _SPELLING.options = before
