"""Detection alone: a recording through a pipeline's steps chunk by chunk, and its `Detect`
sink's spikes kept — as SpikeInterface's peaks (`detect_peaks`) — with no traces written: a
`dspk.pipeline.Job` into a `dspk.pipeline.outputs.PeaksOutput` kept in memory (``dspk
detect`` writes one into its folder). `dspk.spikeinterface.dspk_detect_peaks` runs it.

The halos and the fit are those of `Pipeline.run`, so the peaks are the ``/spikes`` that
``dspk preprocess --detect`` writes for the same recording and options (the same spikes for
any chunk length; on the GPU, where a job writing traces moves and scales the raw samples
on the device and detection alone reads them on the host, a score within float rounding of
the threshold may go either way), with the signed value of the processed trace at each
spike's trough on its channel as the amplitude (`dspk.detect.spikes_to_peaks`).

Examples
--------
>>> import numpy as np, dspk
>>> from dspk.detect import default_templates
>>> from dspk.pipeline.peaks import detect_peaks
>>> x = np.random.default_rng(0).standard_normal((8, 30000)).astype(np.float32)
>>> w = default_templates()[2] / -default_templates()[2].min()
>>> for t in (5000, 15000, 25000):                      # three spikes, largest on channel 3
...     x[2:5, t - 20:t + 41] += np.array([[10.0], [20.0], [10.0]]) * w
>>> rec = dspk.open_recording(x, fs=30000.0, geometry=np.c_[np.zeros(8), 20.0 * np.arange(8)])
>>> p = dspk.Pipeline.from_options(highpass=None, reference="none", whiten="none",
...                                detect=True)
>>> peaks, locations = detect_peaks(p, rec, chunk_s=0.25)
>>> peaks[["sample_index", "channel_index"]].tolist(), locations["y"].tolist()
([(5000, 3), (15000, 3), (25000, 3)], [60.0, 60.0, 60.0])
>>> bool((peaks["amplitude"] < -15).all())             # the trace at the trough
True
"""

from __future__ import annotations

from typing import Any

from ..io import Recording
from .outputs import PeaksOutput

__all__ = ["detect_peaks"]


def detect_peaks(pipeline: Any, recording: Recording | str, chunk_s: float = 1.0,
                 segment_index: int = 0) -> tuple:
    """The peaks of a recording: its chunks through the pipeline's steps and its `Detect`
    sink, as SpikeInterface's peaks and peak locations; nothing is written.

    An unfitted pipeline is fitted on the recording first (`Pipeline.fit`: the fit of
    `Pipeline.run`); a fitted one is checked against it (`Pipeline.check`).

    Parameters
    ----------
    pipeline : Pipeline
        Ending with a `Detect` sink (``detect=True``).
    recording : Recording or path
        Opened with `dspk.open_recording` when a path (and closed before returning).
    chunk_s : float
        Chunk length in seconds (the peaks do not depend on it).
    segment_index : int
        The ``segment_index`` of every peak (SpikeInterface's segment of this recording).

    Returns
    -------
    (peaks, locations)
        `dspk.detect.PEAK_DTYPE` and `dspk.detect.PEAK_LOCATION_DTYPE`, row for row, by
        sample; the amplitude is the processed trace's value at the spike's trough on its
        channel, the location the channel's position (µm).

    Raises
    ------
    PipelineError
        A pipeline without `Detect`, a chunk length that is not positive, a recording the
        stages cannot process (before any work).

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.peaks import detect_peaks
    >>> rec = dspk.open_recording(np.zeros((3000, 4), np.float32), fs=30000.0)
    >>> detect_peaks(dspk.Pipeline.from_options(whiten="global"), rec)
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: pipeline: has no Detect step (detect=True) to find peaks with
    """
    found = PeaksOutput(segment_index=segment_index)
    pipeline.run(recording, found, chunk_s=chunk_s, progress=False)
    return found.peaks, found.locations
