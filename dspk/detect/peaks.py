"""Spikes in SpikeInterface's form: its peaks (`PEAK_DTYPE`) and peak locations
(`PEAK_LOCATION_DTYPE`), from dspk's spikes (`spikes_to_peaks`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import array_module, to_numpy

#: SpikeInterface's peaks (``spikeinterface.core.node_pipeline.base_peak_dtype``, what its
#: ``detect_peaks`` returns and ``NumpySorting.from_peaks``, ``select_peaks`` and its motion
#: estimation take): `spikes_to_peaks` gives them
PEAK_DTYPE = np.dtype([("sample_index", np.int64), ("channel_index", np.int64),
                       ("amplitude", np.float64), ("segment_index", np.int64)])
#: SpikeInterface's ``peak_locations`` (as its ``localize_peaks`` returns them: x, y in µm),
#: row for row with the peaks
PEAK_LOCATION_DTYPE = np.dtype([("x", np.float64), ("y", np.float64)])


def spikes_to_peaks(spikes: np.ndarray, traces: Any = None, start: int = 0,
                    segment_index: int = 0) -> tuple:
    """Spikes (`SPIKE_DTYPE`) as SpikeInterface's peaks and peak locations.

    dspk's spikes carry the detection score as ``amplitude`` (positive, in noise SDs of the
    combined template output) and the detecting channel's position as ``x``, ``y`` inside the
    array; SpikeInterface's peaks (`PEAK_DTYPE`) carry the signed trace value at the peak
    as ``amplitude`` (float64), a ``segment_index``, and keep the locations in a separate
    array (`PEAK_LOCATION_DTYPE`). With ``traces`` (the traces the spikes were detected in,
    or any block of them) the amplitude is the trace's value at each spike's trough on its
    channel — what SpikeInterface's ``detect_peaks`` reports; without them it is the score
    negated (the templates are troughs, so a spike's trace value is negative; the magnitude
    is then in noise SDs of the score, not of the trace).

    Parameters
    ----------
    spikes : numpy.ndarray
        `SPIKE_DTYPE` (`detect_spikes`, or the ``/spikes`` of a dspk output); ``x`` and ``y``
        are optional (the locations are then NaN).
    traces : array [channels, samples], optional
        NumPy or CuPy (only the spikes' samples are moved to the host); its column 0 is
        sample ``start``.
    start : int
        The sample of ``traces[:, 0]`` (for a block of a longer recording).
    segment_index : int
        The SpikeInterface segment the spikes belong to (≥ 0).

    Returns
    -------
    (peaks, locations)
        `PEAK_DTYPE` and `PEAK_LOCATION_DTYPE` arrays, row for row, in the spikes' order
        (by sample, as SpikeInterface's are).

    Raises
    ------
    ValueError
        Spikes without ``sample_index``, ``channel_index`` or ``amplitude``; a spike outside
        ``traces``; a negative ``segment_index``.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.detect import SPIKE_DTYPE, spikes_to_peaks
    >>> spikes = np.zeros(2, SPIKE_DTYPE)
    >>> spikes["sample_index"], spikes["channel_index"] = [10, 25], [1, 0]
    >>> spikes["amplitude"], spikes["y"] = [9.5, 8.0], [20.0, 0.0]
    >>> x = np.zeros((2, 100), np.float32)
    >>> x[1, 10], x[0, 25] = -41.5, -30.0
    >>> peaks, locations = spikes_to_peaks(spikes, x)
    >>> peaks.tolist(), locations["y"].tolist()
    ([(10, 1, -41.5, 0), (25, 0, -30.0, 0)], [20.0, 0.0])
    >>> spikes_to_peaks(spikes)[0]["amplitude"].tolist()        # without traces: -score
    [-9.5, -8.0]
    """
    names = getattr(getattr(spikes, "dtype", None), "names", None) or ()
    missing = [k for k in ("sample_index", "channel_index", "amplitude") if k not in names]
    if missing:
        raise ValueError(f"spikes: expected a structured array with sample_index, "
                         f"channel_index and amplitude (SPIKE_DTYPE), missing {missing}")
    if int(segment_index) < 0:
        raise ValueError(f"segment_index: expected a segment index >= 0, got {segment_index}")
    t = np.asarray(spikes["sample_index"], dtype=np.int64)
    ch = np.asarray(spikes["channel_index"], dtype=np.int64)
    peaks = np.zeros(len(t), dtype=PEAK_DTYPE)
    peaks["sample_index"], peaks["channel_index"] = t, ch
    peaks["segment_index"] = int(segment_index)
    if traces is None:
        peaks["amplitude"] = -np.asarray(spikes["amplitude"], dtype=np.float64)
    else:
        if getattr(traces, "ndim", None) != 2:
            raise ValueError(f"traces: expected [channels, samples], got shape "
                             f"{getattr(traces, 'shape', None)}")
        c, n = traces.shape
        at = t - int(start)
        outside = (at < 0) | (at >= n) | (ch < 0) | (ch >= c)
        if outside.any():
            k = int(np.flatnonzero(outside)[0])
            raise ValueError(f"traces: spike {k} (sample {t[k]}, channel {ch[k]}) is outside "
                             f"the traces' samples {start}..{int(start) + n - 1} and "
                             f"channels 0..{c - 1}")
        if len(t):
            xp = array_module(traces)
            values = traces[xp.asarray(ch), xp.asarray(at)]
            peaks["amplitude"] = to_numpy(values).astype(np.float64)
    locations = np.full(len(t), np.nan, dtype=PEAK_LOCATION_DTYPE)
    for key in ("x", "y"):
        if key in names:
            locations[key] = spikes[key]
    return peaks, locations
