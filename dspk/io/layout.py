"""Moving samples-first blocks (as files store them) into dspk's [channels, samples] layout on
the CPU, without NumPy's slow strided transpose copy."""

from __future__ import annotations

import numpy as np

from ..backend import TRANSPOSE_TILE, blocked_transpose

__all__ = ["to_channels_first", "TRANSPOSE_TILE"]


def to_channels_first(block: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """[samples, channels] -> a C-contiguous [channels, samples] copy (`blocked_transpose`;
    any 2-D array: also the way back, for writing [samples, channels] files).

    Parameters
    ----------
    block : numpy.ndarray
        A 2-D host array, any dtype and strides.
    out : numpy.ndarray, optional
        A C-contiguous array of the transposed shape and the same dtype to write into.

    Returns
    -------
    numpy.ndarray
        The transpose, C-contiguous (``out`` when given).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io import to_channels_first
    >>> block = np.arange(6, dtype=np.int16).reshape(3, 2)       # 3 samples x 2 channels
    >>> y = to_channels_first(block)
    >>> y, y.flags.c_contiguous
    (array([[0, 2, 4],
           [1, 3, 5]], dtype=int16), True)
    """
    return blocked_transpose(block, out)
