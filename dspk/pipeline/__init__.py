"""The streaming pipeline: a recording in, preprocessed traces (HDF5) out, chunk by chunk.

A `Pipeline` is a list of stages on [channels, samples] float arrays: steps — `Saturation`
(saturated samples blanked), `RemoveArtifacts` (stimulation artefacts around triggers),
`PhaseShift` (Neuropixels' ADC sample shifts), `HighPass` /
`BandPass` (linear-phase FIR), `Reference` (median or mean across channels), `Whiten` (global
or local ZCA, fitted on a seeded sample of chunks spread over the recording), `Motion` (drift
estimated on a pass over the recording, corrected by kriging), and any step of your own —
then sinks, which write beside the traces (`Detect`: spikes and their features).
A chunk is read with a halo of ``margin`` samples on each side (the stages' margins, summed),
processed, and its inner part written, so the output does not depend on the chunk size (up to
float32 rounding of the FFT filters). Outside the recording the signal is zero, as in the
one-shot ops: after every step the samples outside [0, n) are set to zero again, so a chunk at
an edge equals the same samples of `Pipeline.transform` on the whole recording.

Output: HDF5, ``/traces`` [samples, channels] (or [channels, samples]), float32 or int16 with a
scale; with `Detect` also ``/spikes`` (`dspk.detect.SPIKE_DTYPE`, sorted by time) and, row for
row, ``/features`` [spikes, neighbours, components] (PCA of each spike's waveform on its
neighbour channels, the PCA fitted on the fit chunks' spikes) and ``/feature_channels``
[spikes, neighbours]; written to ``OUT.partial`` and renamed when complete; ``resume=True``
continues a job that was killed from the last chunk it recorded as written (the progress is
kept next to the partial file and written only after the chunk's data is flushed), with the
fitted state stored in the partial file, giving the same bytes as a job that never stopped
(no HDF5 object times are stored: two runs of a job write the same file). The output is
checked (never a file of the input, never anything but a regular file, not an existing file
without ``overwrite``, a folder that exists) and so is what the stages need of the recording
(`Pipeline.check`) before anything is fitted or written. The input is opened read-only and
never written.

The package's modules: `dspk.pipeline.stage` (the contract of a stage: `Step`, `Sink`,
`Context`), `dspk.pipeline.registry` (stages and their options: the command line,
`Pipeline.from_options` and `dspk.dask` read it), `dspk.pipeline.steps` and
`dspk.pipeline.sinks` (the stages), `dspk.pipeline.pipeline` (`Pipeline`, `preprocess`),
`dspk.pipeline.prepared` (a pipeline prepared for a run; the fit pass),
`dspk.pipeline.job` (`Job`: one run, the one lifecycle of every output),
`dspk.pipeline.outputs` (the contract of an output, `Output`, its registry,
`register_output`, and the formats: HDF5, Kilosort folder, NWB, a span of a prepared file,
peaks), `dspk.pipeline.record` (what an output holds: fitted state, job record, metadata,
`describe`), `dspk.pipeline.stream` (reading ahead, writing behind) and
`dspk.pipeline.peaks` (detection alone: `detect_peaks`, SpikeInterface's peaks without a
trace output). Every name below is importable from ``dspk.pipeline``.

Examples
--------
>>> import numpy as np, dspk
>>> from dspk.pipeline import HighPass, Pipeline, Reference
>>> p = Pipeline([HighPass(300.0), Reference("median")])
>>> p.margin(30000.0), p.is_fitted                # FIR halo; nothing to fit
(131, True)
"""

from . import registry  # noqa: F401
from .errors import PipelineError
from .job import Job, JobInterrupted
from .lock import LockedError
from .outputs import Output, register_output
from .pipeline import FIT_CHUNK_S, FIT_CHUNKS, Pipeline, fit_spans, preprocess
from .peaks import detect_peaks
from .registry import Option, register
from .sinks import Detect
from .stage import NEEDS, Context, FitBlocks, Need, Sink, Stage, Step, Table, check_needs
from .steps import (BadChannels, BandPass, ButterBandPass, Decimate, HighPass, Motion,
                    PhaseShift, Reference, RemoveArtifacts, Saturation, SpatialHighpass,
                    Whiten)

#: the registered stage classes by name (the names stored in saved pipelines and outputs); a
#: snapshot at import: `dspk.pipeline.registry.stage_classes` gives the current ones
STEP_TYPES = registry.stage_classes()

__all__ = ["Pipeline", "Decimate", "ButterBandPass", "Saturation", "RemoveArtifacts",
           "PhaseShift", "HighPass", "BandPass", "BadChannels", "SpatialHighpass", "Reference",
           "Whiten", "Motion", "Detect", "preprocess", "PipelineError", "LockedError", "Job",
           "JobInterrupted", "Step", "Sink", "Stage", "Context", "FitBlocks", "Table", "Option",
           "register", "fit_spans", "FIT_CHUNKS", "FIT_CHUNK_S", "NEEDS", "Need", "check_needs",
           "detect_peaks", "Output", "register_output"]
