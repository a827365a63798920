"""The spikes a drift estimate is made from: one pass over a recording, each block searched
for spikes and each spike placed between the channels (what `dspk.pipeline.Motion` fits on,
and what `dspk.motion.estimate` takes).

The detector is `dspk.detect_spikes` with one template of the default bank and two spatial
widths (`MOTION_TEMPLATE`, `MOTION_WIDTHS_UM`), on traces whose channels are first scaled to
unit robust noise (so that un-whitened traces are searched in the same units as whitened
ones), with each template's noise measured once on a sample of the recording
(`SpikeSurvey`). A block carries `pass_margin` samples of context on each side; a spike
belongs to the block whose interior holds its trough, so that the spikes of a pass in
blocks are those of the whole recording, none missed or doubled at a block's edge.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from ..backend import array_module, to_numpy
from ..detect import (NOISE_SAMPLES, default_templates, detect_spikes, detection_lag,
                      detection_margin, template_noise)
from .localization import localize

__all__ = ["SpikeSurvey", "pass_margin", "MOTION_TEMPLATE", "MOTION_WIDTHS_UM"]

#: the detector of the pass: one template of the default bank (its middle width) and two
#: spatial widths (µm). Measured on SpikeInterface's drifting ground truth (128 channels x
#: 120 s, 2 cores): the pass 4.5x faster than with the default detector (6 templates,
#: 5 widths), the same spikes within 0.2 % and the same drift error (0.33 against 0.35 µm
#: RMS): the estimate needs the spikes' times and places, not their shapes
MOTION_TEMPLATE, MOTION_WIDTHS_UM = 2, (15.0, 35.0)
#: the robust noise SD of a channel: median |x| / this (the Gaussian's 0.6745, rounded as the
#: step has always used it: changing it would change the spikes found at the threshold)
_MAD_TO_SD = 0.6745


def pass_margin(fs: float) -> int:
    """Samples of context each block of the pass needs on each side (`detection_margin`).

    Parameters
    ----------
    fs : float

    Examples
    --------
    >>> from dspk.motion.spikes import pass_margin
    >>> pass_margin(30000.0)
    51
    """
    return detection_margin(fs)


class SpikeSurvey:
    """The pass's detector, its units measured on a sample of the recording, and the spikes
    found so far (`add` each block of the pass, then `spikes`).

    Parameters
    ----------
    sample : array-like
        [channels, samples] of the traces the pass will search (e.g. a pipeline's fit
        chunks, concatenated), NumPy or CuPy: each channel's robust noise and each
        template's noise are measured on it.
    geometry : array-like
        [channels, 2] µm.
    fs : float
    threshold : float
        Detection threshold, in noise SDs of each template's output.
    shank_ids : array-like, optional
        One shank per channel (spikes are combined within a shank only).
    dtype : numpy dtype, optional
        The dtype of the blocks the pass will give (default: the sample's).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.motion.spikes import SpikeSurvey
    >>> rng = np.random.default_rng(0)
    >>> g = np.c_[np.zeros(16), 20.0 * np.arange(16)]
    >>> x = rng.standard_normal((16, 60000)).astype(np.float32)
    >>> x[6:9, 30000:30030] -= 40.0 * np.hanning(30)      # one spike on channels 6-8
    >>> survey = SpikeSurvey(x[:, :20000], g, 30000.0, threshold=7.0)
    >>> survey.add(x, 0, 60000, halo=0)                   # the whole recording in one block
    >>> found = survey.spikes()                          # at 1.0 s, 140 µm (channel 7)
    >>> found["time_s"].round(3), found["y"].round(1), found["channel_index"]
    (array([1.001]), array([140.]), array([7]))
    """

    def __init__(self, sample: Any, geometry: Any, fs: float, threshold: float,
                 shank_ids: Any = None, dtype: Any = None):
        self.geometry = np.asarray(geometry, np.float64)
        self.fs, self.threshold, self.shank_ids = float(fs), float(threshold), shank_ids
        xp = array_module(sample)
        step = max(1, sample.shape[1] // NOISE_SAMPLES)
        sd = np.median(np.abs(to_numpy(sample[:, ::step])), axis=1).astype(np.float64) / \
            _MAD_TO_SD
        scale = np.where(sd > 0, 1.0 / np.where(sd > 0, sd, 1.0), 0.0)
        # each channel to unit robust noise (whitened traces: ~1 already), then the noise of
        # the template's output in those units (the threshold's unit)
        self.scale = xp.asarray(scale.astype(dtype or sample.dtype))[:, None]
        self.templates = default_templates(fs)[MOTION_TEMPLATE:MOTION_TEMPLATE + 1]
        self.noise = template_noise(sample * self.scale, fs, self.templates)
        self.lag = detection_lag(fs)
        self._found: dict[str, list] = {"time_s": [], "y": [], "amplitude": [],
                                        "channel_index": []}

    def add(self, block: Any, s0: int, s1: int, halo: int) -> None:
        """Search one block of the pass, which holds the recording's samples ``s0 - halo``
        to ``s1 + halo`` (padded beyond its ends; ``halo`` ≥ `pass_margin`), and keep the
        spikes whose trough lies in ``[s0, s1)``.

        Parameters
        ----------
        block : array-like
            [channels, samples], NumPy or CuPy, of the traces the survey was made for.
        s0, s1 : int
            The block's interior in the recording's samples.
        halo : int
            Samples of context on each side of the interior.
        """
        x = block * self.scale
        spikes = detect_spikes(x, self.geometry, self.fs, templates=self.templates,
                               threshold=self.threshold, widths_um=MOTION_WIDTHS_UM,
                               noise=self.noise, shank_ids=self.shank_ids)
        at = spikes["sample_index"] + self.lag - halo
        spikes = spikes[(at >= 0) & (at < s1 - s0)]
        if len(spikes) == 0:
            return
        _, y, _ = localize(x, spikes, self.geometry, self.fs)
        self._found["time_s"].append((spikes["sample_index"] + (s0 - halo)) / self.fs)
        self._found["y"].append(y)
        self._found["amplitude"].append(spikes["amplitude"].astype(np.float64))
        self._found["channel_index"].append(spikes["channel_index"])

    def add_all(self, blocks: Iterable[tuple[int, int, Any]], halo: int) -> "SpikeSurvey":
        """`add` every ``(s0, s1, block)`` of a pass whose blocks carry ``halo`` samples of
        context before their interior; returns the survey."""
        for s0, s1, block in blocks:
            self.add(block, s0, s1, halo)
        return self

    def spikes(self) -> dict:
        """The spikes found: ``time_s``, ``y`` (µm), ``amplitude``, ``channel_index`` (NumPy,
        in the order of the blocks added), as `dspk.motion.estimate` takes them."""
        empty = {"time_s": np.zeros(0), "y": np.zeros(0), "amplitude": np.zeros(0),
                 "channel_index": np.zeros(0, np.int64)}
        return {k: np.concatenate(v) if v else empty[k] for k, v in self._found.items()}
