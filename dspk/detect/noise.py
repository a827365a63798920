"""The noise detection measures itself in: a robust noise SD, the median absolute value /
0.6745 (`MAD_TO_SD`), taken on evenly spaced samples of a batch (`_noise_samples`); on the host
by a sort of the values' top bits (`_host_abs_median`), on the GPU by bisection on the value
(`_abs_median`). Also the check that traces look whitened (`_noise_check`) and the inverse of
each template output's noise, which scales it to unit noise (`_inverse_noise`).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..backend import array_module, to_numpy
from ..linalg import MatrixView
from ..linalg.host_checks import to_host
from ..linalg.threads import parallel_blocks


#: samples per channel the whitening check looks at (a warning needs no more)
NOISE_CHECK_SAMPLES = 2048


def _noise_check(x: Any) -> None:
    """Warn when x is clearly not whitened: the median over channels of a robust noise SD
    (median |x| / 0.6745 on an evenly spaced sample of the batch; whitened data is high-passed,
    so its median is ~0) far from 1."""
    xp = array_module(x)
    n = x.shape[1]
    sub = x[:, ::max(1, n // NOISE_CHECK_SAMPLES)]
    if xp is np:
        per_channel = _host_abs_median(sub)
    else:
        # dspk's prebuilt gather and median kernels (an odd count: the middle value), not
        # cupy.median, whose kernels would be compiled in a first call (4.8 s measured on an
        # H100 with an empty CuPy cache)
        m = sub.shape[1] - (1 - sub.shape[1] % 2)
        rows = MatrixView.of(sub[:, :m]).contiguous().to_array()[0]
        per_channel = to_host(_abs_median(xp, rows))
    sd = float(np.median(per_channel)) / 0.6745
    if not 0.5 <= sd <= 2.0:
        warnings.warn(f"x: the noise SD is {sd:.3g} (median over channels); detection expects "
                      f"whitened data (noise SD 1) and its threshold is in noise SDs",
                      stacklevel=3)


#: the noise of each template's output is measured on this many samples of the batch, evenly
#: spaced (far enough apart to be nearly independent: the SD to a few per cent); odd, so the
#: median is one of them
NOISE_SAMPLES = 8191
#: median |output| / MAD_TO_SD is the SD of Gaussian noise
MAD_TO_SD = 0.6744897501960817
#: the GPU filters the batch for the noise in channel blocks of at most this many bytes
NOISE_BLOCK_BYTES = 128 << 20
#: bisection steps of the GPU's median from [0, max]: the brackets meet (adjacent values, so the
#: result is the middle value itself) within 64 halvings unless max / median > 2^11 (float64)
MEDIAN_BISECTIONS = 64


def _noise_samples(n: int, taps: int) -> np.ndarray:
    """The samples the noise is measured on: evenly spaced, away from the batch's edges (where
    the filter sees zeros) when the batch is long enough."""
    half = taps // 2
    lo, hi = (half, n - half) if n - 2 * half >= NOISE_SAMPLES else (0, n)
    m = min(NOISE_SAMPLES, hi - lo)
    if m > 1 and m % 2 == 0:
        m -= 1                                    # odd: the median is one of the samples
    return lo + (np.arange(m, dtype=np.int64) * (hi - lo)) // m


def _abs_median(xp: Any, a: Any) -> Any:
    """The median of |a| along the last axis (odd length). NumPy's; on the GPU by bisection on
    the value (a count per row and step, `MEDIAN_BISECTIONS` steps, no sort: CuPy's sort of
    2 304 rows of 8 191 took 6.3 ms on an H200), which ends on the middle value itself or its
    float neighbour: in one kernel with each row in shared memory when it fits
    (`dspk.detect._gpu.row_abs_median`), else with CuPy array operations."""
    if xp is np:
        return _host_abs_median(a)
    from ._gpu import RM_MAX_BYTES, row_abs_median  # noqa: PLC0415 (GPU-only)

    if a.shape[-1] * a.itemsize <= RM_MAX_BYTES:             # each row in shared memory
        flat = a.reshape(-1, a.shape[-1])
        return row_abs_median(flat, MEDIAN_BISECTIONS).reshape(a.shape[:-1])
    a = xp.abs(a)
    half = (a.shape[-1] + 1) // 2
    lo = xp.zeros(a.shape[:-1], dtype=a.dtype)
    hi = a.max(axis=-1)
    for _ in range(MEDIAN_BISECTIONS):
        mid = (lo + hi) * a.dtype.type(0.5)
        enough = (a <= mid[..., None]).sum(axis=-1) >= half
        hi = xp.where(enough, mid, hi)
        lo = xp.where(enough, lo, mid)
    return hi


#: rows per block of the host median (blocks run on the engine's threads; a block's keys and
#: values stay in cache)
MEDIAN_BLOCK_ROWS = 24


def _host_abs_median(a: np.ndarray) -> np.ndarray:
    """``np.median(np.abs(a), axis=-1)``, the same values, in blocks of `MEDIAN_BLOCK_ROWS`
    rows on the engine's threads: for rows of odd length the middle value by `_middle_value`
    (a block with a NaN, and even lengths, go to np.median)."""
    m = a.shape[-1]
    flat = a.reshape(-1, m)
    if m % 2 == 0 or flat.shape[0] == 0:
        return np.median(np.abs(a), axis=-1)

    parts = parallel_blocks(lambda r0: _abs_median_rows(flat[r0:r0 + MEDIAN_BLOCK_ROWS]),
                            range(0, flat.shape[0], MEDIAN_BLOCK_ROWS))
    return np.concatenate(parts).reshape(a.shape[:-1])


def _abs_median_rows(a: np.ndarray) -> np.ndarray:
    """The median of |a| of each row of ``a`` [rows, odd m] on the calling thread: the middle
    value by `_middle_value`, or np.median where a row has a NaN (the same values)."""
    v = np.abs(a)
    return np.median(v, axis=-1) if np.isnan(v.max()) else _middle_value(v)


def _middle_value(v: np.ndarray) -> np.ndarray:
    """The middle value of each row of ``v`` [rows, odd m] (non-negative float32/float64, no
    NaN), as np.partition gives it, without its comparisons (its mispredicted branches cost
    ~55 µs per row of 8191): the bits of a non-negative float order like the float, so the
    rows' top 16 bits are sorted (NumPy's stable sort of 16-bit integers is a radix sort), the
    middle row key found, and only the values with that key (a few dozen) sorted in full.
    Measured (one thread, blocks of 24 rows): 2304 rows of 8191, 84–91 ms of CPU against
    120–125 ms for np.partition."""
    mid = v.shape[1] // 2
    bits = v.view(np.uint32 if v.itemsize == 4 else np.uint64)
    key = (bits >> (8 * v.itemsize - 16)).astype(np.uint16)
    ordered = np.sort(key, axis=1, kind="stable")
    middle = ordered[:, mid:mid + 1]
    below = np.count_nonzero(ordered < middle, axis=1)          # values under the middle key
    same = key == middle
    count = np.count_nonzero(same, axis=1)
    width = int(count.max())
    tied = np.full((len(v), width), np.inf, dtype=v.dtype)      # those values, row by row
    tied[np.arange(width) < count[:, None]] = v[same]
    tied.sort(axis=1)
    return tied[np.arange(len(v)), mid - below]


def _inverse_noise(noise: Any, c: int, k: int) -> np.ndarray:
    """1 / noise [C, k] (0 where a channel has no noise: a dead or flat channel adds nothing)."""
    sd = np.asarray(to_numpy(noise), dtype=np.float64)
    if sd.shape != (c, k):
        raise ValueError(f"noise: expected the noise SD of each channel's output of each "
                         f"template, [{c}, {k}], got shape {sd.shape}")
    if not np.all(np.isfinite(sd)) or np.any(sd < 0):
        raise ValueError("noise: expected finite, non-negative noise SDs")
    with np.errstate(divide="ignore"):
        return np.where(sd > 0, 1.0 / sd, 0.0)
