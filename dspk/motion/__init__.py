"""Motion (drift) estimation and correction, as array functions (no files but the `Motion`'s
own): the drift of a recording estimated from its spikes by DREDge's decentralised
registration (`estimate`: activity rasters, their pairwise cross-correlations as products on
dspk's engine, a robust least-squares solve), per shank, rigid or non-rigid; spike positions
for it (`localize`; a recording's pass in blocks, `SpikeSurvey`); and the traces corrected
by kriging interpolation, one matrix per time bin applied with `dspk.ops.spatial_filter`
(`correct`). NumPy in, NumPy out; CuPy in, CuPy out (CuPy spikes are registered on the
GPU, the solve included; a `Motion` is on the host).

The pipeline's ``Motion`` step (``dspk preprocess --motion rigid|nonrigid``) estimates the
drift on a pass over the recording and corrects it chunk by chunk.

Examples
--------
Spikes that move up 10 µm after 30 s; the estimate, then the traces corrected:

>>> import numpy as np
>>> from dspk.motion import correct, estimate
>>> rng = np.random.default_rng(1)
>>> geom = np.c_[np.zeros(32), 20.0 * np.arange(32)]
>>> t = np.sort(rng.uniform(0, 60, 12000))
>>> y = rng.choice(rng.uniform(60, 560, 25), t.size) + 10.0 * (t >= 30)
>>> m = estimate({"time_s": t, "y": y + rng.normal(0, 1.5, t.size)}, geom, 60.0, rigid=True)
>>> d = m.displacement[:, 0]
>>> round(float(d[15:].mean() - d[:15].mean()))
10
>>> x = rng.standard_normal((32, 3000)).astype(np.float32)
>>> correct(x, geom, m, t0=29.95, fs=30000.0).shape
(32, 3000)
"""

from .correction import BORDERS, Correction, correct, keep_white, kriging_matrix
from .estimation import MIN_SPIKES_PER_BIN, estimate, window_scale
from .localization import localize
from .spikes import SpikeSurvey, pass_margin
from .motion import Motion, MotionError, shank_labels, to_spikeinterface
from .registration import (activity_raster, pairwise_displacement, registration_weights,
                           solve_displacement, spatial_windows)

# the public names' home (tracebacks print "dspk.motion.MotionError")
MotionError.__module__ = "dspk.motion"

__all__ = ["Motion", "MotionError", "estimate", "correct", "Correction", "kriging_matrix",
           "keep_white", "localize", "shank_labels", "to_spikeinterface", "activity_raster",
           "spatial_windows", "pairwise_displacement", "registration_weights",
           "solve_displacement", "SpikeSurvey", "pass_margin", "BORDERS",
           "MIN_SPIKES_PER_BIN", "window_scale"]
