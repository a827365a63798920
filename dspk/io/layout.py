"""Moving samples-first blocks (as files store them) into dspk's [channels, samples] layout on
the CPU, without NumPy's slow strided transpose copy."""

from __future__ import annotations

import numpy as np

from ..backend import TRANSPOSE_TILE, blocked_transpose

__all__ = ["to_channels_first", "TRANSPOSE_TILE"]


def to_channels_first(block: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """[samples, channels] -> a C-contiguous [channels, samples] copy (`blocked_transpose`;
    any 2-D array: also the way back, for writing [samples, channels] files)."""
    return blocked_transpose(block, out)
