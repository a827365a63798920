"""The demultiplexed common reference of Neuropixels probes: the median or mean over the
channels sampled at the same ADC instant, subtracted from each of them — CatGT's
``-gbldmx`` ("global demuxed CAR", the filter SpikeGLX's viewers offer too).

A probe digitises its channels in turns: within each sample period every ADC samples one of
its channels after another (NP1.0: 12 channels per ADC, 13 slots; NP2.0: 16), so channel c is
sampled ``sample_shifts[c]`` of a period late (`dspk.io.adc`, `Recording.sample_shifts`).
A global reference mixes channels sampled at up to 12/13 of a period apart; a transient
faster than that (a lick, a stimulation edge, a ground bounce) leaves a residue on every
channel whose instant differs from the reference's. The channels that share a shift were
sampled together (one per ADC: 32 of NP1.0's 384), and their median or mean is the
artefact as those channels saw it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..finite import api, check_finite
from ._checks import traces
from .spatial import common_reference

__all__ = ["adc_groups", "demux_reference"]


def adc_groups(sample_shifts: Any) -> list[np.ndarray]:
    """The channels sampled at the same ADC instant: the indices of each distinct sample
    shift, in increasing order of shift.

    Parameters
    ----------
    sample_shifts : array-like
        [channels] ADC sample shifts (a recording's ``sample_shifts``: k/13 on NP1.0, k/16
        on NP2.0), finite.

    Returns
    -------
    list of numpy.ndarray
        int64 channel indices, one array per instant (a partition of the channels).

    Raises
    ------
    ValueError
        Not a 1-D array of finite numbers.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io.adc import neuropixels_sample_shifts
    >>> from dspk.ops import adc_groups
    >>> shifts = neuropixels_sample_shifts(np.arange(384), "NP1000")
    >>> groups = adc_groups(shifts)
    >>> len(groups), [len(g) for g in groups][:3], groups[1][:4].tolist()   # 32 per instant
    (12, [32, 32, 32], [2, 3, 26, 27])
    """
    s = sample_shifts.get() if hasattr(sample_shifts, "get") else sample_shifts
    try:
        s = np.asarray(s, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"sample_shifts: expected one number per channel, got "
                        f"{type(sample_shifts).__name__}") from None
    if s.ndim != 1 or s.size == 0 or not np.all(np.isfinite(s)):
        raise ValueError(f"sample_shifts: expected a non-empty 1-D array of finite shifts (a "
                         f"recording's sample_shifts), got shape {s.shape}")
    values, inverse = np.unique(s, return_inverse=True)
    return [np.flatnonzero(inverse == i) for i in range(len(values))]


@api
def demux_reference(x: Any, sample_shifts: Any, operator: str = "mean") -> Any:
    """Subtract from each channel the median or mean, per sample, of the channels sampled at
    its ADC instant (`adc_groups`): CatGT's ``-gbldmx`` (its CAR is the mean, the default
    here), `dspk.ops.common_reference` within each group.

    The direct definition, which tests/io/test_demux.py checks it against:
    ``y[c, t] = x[c, t] − op{x[c', t] : sample_shifts[c'] == sample_shifts[c]}``.
    CatGT also leaves out of the average the probe's reference sites and channels a user
    excludes; here every channel given takes part (pass the channels to average over).

    Parameters
    ----------
    x : array
        [channels, samples], float32 or float64 (NumPy or CuPy).
    sample_shifts : array-like
        [channels] ADC sample shifts, in x's channel order (`Recording.sample_shifts`).
    operator : {"mean", "median"}

    Returns
    -------
    array
        x's shape, dtype and array type.

    Raises
    ------
    ValueError
        Shifts of the wrong length, an instant sampled by a single channel (its reference
        would be itself), an unknown operator.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import demux_reference
    >>> x = np.array([[1.0, 2.0], [3.0, 6.0], [10.0, 0.0], [20.0, 4.0]], dtype=np.float32)
    >>> demux_reference(x, [0.0, 0.0, 0.5, 0.5])         # channels 0,1 and 2,3 together
    array([[-1., -2.],
           [ 1.,  2.],
           [-5., -2.],
           [ 5.,  2.]], dtype=float32)
    """
    traces(x)
    check_finite(x, "x")
    if operator not in ("median", "mean"):
        raise ValueError(f"operator: expected 'median' or 'mean', got {operator!r}")
    groups = adc_groups(sample_shifts)
    n = sum(len(g) for g in groups)
    if n != x.shape[0]:
        raise ValueError(f"sample_shifts: {n} shifts for {x.shape[0]} channels; pass the "
                         f"shifts in x's channel order (recording.sample_shifts)")
    lone = [int(g[0]) for g in groups if len(g) < 2]
    if lone:
        raise ValueError(f"sample_shifts: channel {lone[0]} is the only one sampled at its "
                         f"instant ({len(lone)} such); its reference would be itself. Keep "
                         f"whole ADC groups (a probe's full set of channels), or use a "
                         f"global reference")
    return common_reference(x, operator, groups=groups)
