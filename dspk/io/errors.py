"""What ``dspk.io`` raises and warns: below every other module of the package (the probe readers
and the recordings both raise `RecordingError`)."""

from __future__ import annotations

__all__ = ["RecordingError", "RecordingWarning"]


class RecordingError(ValueError):
    """A recording that cannot be opened or read as asked (the message says why).

    A `ValueError`, so ``except ValueError`` catches it too.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import RecordingError, open_recording
    >>> rec = open_recording(np.zeros((3000, 4), dtype=np.int16), fs=30000.0)
    >>> rec.read(0, 5000)                                      # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.io.errors.RecordingError: read: expected 0 <= start <= stop <= 3000, got ...
    """


class RecordingWarning(UserWarning):
    """A recording that opens, but whose files disagree with what its metadata imply in a way
    that cannot be told for certain from the files alone (the message says what was found and
    what was expected): a SpikeGLX ``.bin`` shorter or longer than its ``.meta``'s
    ``fileTimeSecs`` when the ``.meta`` has no ``fileSizeBytes``.

    Examples
    --------
    >>> import warnings
    >>> from dspk.io import RecordingWarning
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warnings.warn("x.ap.bin: 100 samples on disk, its .meta implies 300",
    ...                   RecordingWarning)
    >>> caught[0].category.__name__, issubclass(RecordingWarning, UserWarning)
    ('RecordingWarning', True)
    """
