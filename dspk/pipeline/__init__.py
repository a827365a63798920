"""The streaming pipeline: a recording in, preprocessed traces (HDF5) out, chunk by chunk.

A `Pipeline` is a list of steps on [channels, samples] float arrays: `HighPass` / `BandPass`
(linear-phase FIR), `Reference` (median or mean across channels) and `Whiten` (global or local
ZCA, fitted on a seeded sample of chunks spread over the recording). A chunk is read with a
halo of ``margin`` samples on each side (the FIR steps' half lengths, summed), processed, and
its inner part written, so the output does not depend on the chunk size (up to float32
rounding of the FFT filters). Outside the recording the signal is zero, as in the one-shot
ops: after every step the samples outside [0, n) are set to zero again, so a chunk at an edge
equals the same samples of `Pipeline.transform` on the whole recording.

Output: HDF5, ``/traces`` [samples, channels] (or [channels, samples]), float32 or int16 with a
scale; with a `Detect` step also ``/spikes`` (`dspk.detect.SPIKE_DTYPE`, sorted by time) and,
row for row, ``/features`` [spikes, neighbours, components] (PCA of each spike's waveform on
its neighbour channels, the PCA fitted on the fit chunks' spikes) and ``/feature_channels``
[spikes, neighbours]; written to ``OUT.partial`` and renamed when complete; ``resume=True``
continues a job that was killed from the last chunk it recorded as written (the progress is
kept next to the partial file and written only after the chunk's data is flushed), with the
fitted state stored in the partial file, giving the same bytes as a job that never stopped
(no HDF5 object times are stored: two runs of a job write the same file). The output is
checked (not the input, not an existing file without ``overwrite``, a folder that exists) and
so is what the steps need of the recording (`Pipeline.check`) before anything is fitted or
written. The input is opened read-only and never written.

The package's modules: `dspk.pipeline.steps` (the steps: ``fit``, ``apply``, their halo),
`dspk.pipeline.pipeline` (`Pipeline`, `preprocess`) and `dspk.pipeline.job` (what a job
does with files: the partial output and its resume record, staging, the writer, the chunk
loop, progress), which `dspk.dask` uses too. Every name below is importable from
``dspk.pipeline``.

Examples
--------
>>> import numpy as np, dspk
>>> from dspk.pipeline import HighPass, Pipeline, Reference
>>> p = Pipeline([HighPass(300.0), Reference("median")])
>>> p.margin(30000.0), p.is_fitted                # FIR halo; nothing to fit
(131, True)
"""

from .errors import PipelineError
# importable from here as before the package split (Detect, the constants), besides __all__
from .pipeline import FIT_CHUNK_S, FIT_CHUNKS, Pipeline, fit_spans, preprocess  # noqa: F401
from .steps import (FITTED, STEP_TYPES, BandPass, Detect, HighPass, Reference,  # noqa: F401
                    Step, Whiten)

__all__ = ["Pipeline", "HighPass", "BandPass", "Reference", "Whiten", "preprocess",
           "PipelineError"]
