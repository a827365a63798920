"""The preprocessing steps: each one class (a dataclass of its options, implementing the
`dspk.pipeline.Step` contract) and one `dspk.pipeline.registry.register` call that gives it
its options on the command line, in `Pipeline.from_options` and in `dspk.dask`.

- `Decimate`: the recording decimated before the other steps, which then run at its new
  rate (`dspk.ops.decimate`; the LFP band of a wideband stream);
- `Saturation`: samples at or beyond a level (saturated ADCs) set to zero
  (`dspk.ops.blank_saturation`);
- `RemoveArtifacts`: stimulation artefacts removed around triggers from a CSV or the sync
  channel (`dspk.ops.remove_artifacts`, SpikeInterface's ``remove_artifacts``);
- `PhaseShift`: the ADC sample-shift correction of Neuropixels recordings
  (`dspk.ops.phase_shift`, the shifts the recording gives);
- `HighPass` / `BandPass`: linear-phase FIR filters (`dspk.fir_filter`);
- `ButterBandPass`: a Butterworth band-pass run forward and backward (IBL's LFP filter) as its
  zero-phase FIR (`dspk.ops.butter`);
- `BadChannels`: bad channels detected on the fit chunks (`dspk.ops.detect_bad_channels`)
  or given, replaced by their good neighbours' kriging (`dspk.ops.interpolation_matrix`);
- `SpatialHighpass`: destriping, SpikeInterface's ``highpass_spatial_filter`` / IBL's
  ``kfilt`` (`dspk.ops.highpass_spatial_filter`);
- `Reference`: median or mean across channels (`dspk.common_reference`);
- `Whiten`: ZCA whitening fitted on the recording (`dspk.whitening_matrix`, global or local);
- `Motion`: drift estimated on a pass over the recording (`dspk.motion.estimate`) and
  corrected by kriging (`dspk.motion.correct`).

One module per family, in the order the steps run (the order they are registered in, which
is the order of a pipeline made from options): `dspk.pipeline.steps.decimate` (`Decimate`,
a front end: first or not at all), `dspk.pipeline.steps.adc` (`Saturation`,
`PhaseShift`; `.artifacts`' `RemoveArtifacts` placed between them), `.filters` (`HighPass`,
`BandPass`), `.channels` (`BadChannels`), `.lfp` (`ButterBandPass`: after the bad channels,
which are detected on the unfiltered LFP band as IBL detects them),
`.reference` (`SpatialHighpass`, `Reference`), `.whitening` (`Whiten`) and `.motion`
(`Motion`); `.common` holds what they share. Every step and constant is importable from
``dspk.pipeline.steps``.

Examples
--------
>>> import numpy as np
>>> from dspk.pipeline import HighPass, Reference
>>> steps = [HighPass(300.0), Reference("median")]
>>> [s.margin(30000.0) for s in steps], [s.is_fitted({}) for s in steps]
([131, 0], [True, True])
"""

# imported in the steps' order: each module registers its steps (`register`) when imported
from .adc import PhaseShift, Saturation
from .decimate import Decimate
from .artifacts import RemoveArtifacts
from .filters import BandPass, HighPass
from .channels import BadChannels
from .lfp import ButterBandPass
from .reference import Reference, SpatialHighpass
from .whitening import Whiten
from .motion import Motion

# the constants, importable from here as they were before the steps had a module per family
from .adc import MAX_SAMPLE_SHIFT  # noqa: F401
from .channels import BAD_CHANNEL_LABELS  # noqa: F401
from .common import GROUPS  # noqa: F401
from ...motion.spikes import MOTION_TEMPLATE, MOTION_WIDTHS_UM  # noqa: F401
from .motion import MOTION_MODES, MOTION_P, MOTION_SIGMA_UM  # noqa: F401

__all__ = ["Decimate", "ButterBandPass", "Saturation", "RemoveArtifacts", "PhaseShift",
           "HighPass", "BandPass", "BadChannels", "SpatialHighpass", "Reference", "Whiten",
           "Motion"]
