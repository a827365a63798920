"""The probe geometries the tests share (one definition, not one per file)."""

from __future__ import annotations

import numpy as np

#: NP1.0's four staggered column positions (µm), as SpikeGLX's imro tables give them
NP1_X = np.array([43.0, 11.0, 59.0, 27.0])


def np1_geometry(n: int = 384) -> np.ndarray:
    """NP1.0: staggered columns (x = 43, 11, 59, 27), two contacts per 20-µm row, [n, 2] µm."""
    c = np.arange(n)
    return np.c_[NP1_X[c % 4], 20.0 * (c // 2)]


def np2_geometry(n: int = 384) -> np.ndarray:
    """NP2.0 single shank: two columns 32 µm apart, 15-µm rows, [n, 2] µm."""
    c = np.arange(n)
    return np.c_[27.0 + 32.0 * (c % 2), 15.0 * (c // 2)]
