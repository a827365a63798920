"""The runnable examples in the public docstrings run and give what they show.

Each module is the one where the documented objects are *defined* (doctest.testmod finds the
examples of a module's own functions and classes, not of those it imports);
tests/project/test_api_docs.py checks that every module defining a public object is listed here.
"""

import doctest
import importlib

import pytest

MODULES = ["dspk.argnames", "dspk.backend", "dspk.finite", "dspk.linalg.view", "dspk.linalg.matmul",
           "dspk.linalg.intmm",
           "dspk.linalg.engine",
           "dspk.match", "dspk.ops.covariance", "dspk.ops.pca", "dspk.ops.spatial",
           "dspk.ops.distance", "dspk.ops.fir", "dspk.ops.kaiser", "dspk.ops.delay",
           "dspk.ops.saturation", "dspk.ops.interpolation", "dspk.ops.artifacts",
           "dspk.ops.decimate", "dspk.ops.demux", "dspk.ops.butter",
           "dspk.detect.templates",
           "dspk.detect.spikes", "dspk.detect.features", "dspk.detect.peaks", "dspk.pipeline",
           "dspk.ops.bad_channels",
           "dspk.pipeline.steps", "dspk.pipeline.steps.adc", "dspk.pipeline.steps.decimate",
           "dspk.pipeline.steps.lfp", "dspk.pipeline.steps.artifacts",
           "dspk.pipeline.steps.filters",
           "dspk.pipeline.steps.channels", "dspk.pipeline.steps.reference",
           "dspk.pipeline.steps.whitening", "dspk.pipeline.steps.motion", "dspk.motion.spikes",
           "dspk.pipeline.pipeline", "dspk.pipeline.job", "dspk.pipeline.lock",
           "dspk.pipeline.checksum", "dspk.pipeline.flush", "dspk.linalg.eigh",
           "dspk.pipeline.stage", "dspk.pipeline.registry", "dspk.pipeline.sinks",
           "dspk.pipeline.prepared", "dspk.pipeline.output", "dspk.pipeline.stream",
           "dspk.cli", "dspk.io", "dspk.io.errors", "dspk.io.scaling", "dspk.io.recording",
           "dspk.io.hdf5", "dspk.io.layout", "dspk.io.spikeinterface_recording",
           "dspk.io.spikeglx", "dspk.io.cbin", "dspk.io.sync", "dspk.io.events",
           "dspk.io.adc", "dspk.io.openephys", "dspk.io.probe",
           "dspk.io.subset", "dspk.dask", "dspk.ops.destripe", "dspk.pipeline.peaks",
           "dspk.spikeinterface", "dspk.io.kilosort", "dspk.io.nwb", "dspk.pipeline.handoff",
           "dspk.pipeline.record", "dspk.pipeline.outputs", "dspk.pipeline.outputs.base",
           "dspk.pipeline.outputs.partial", "dspk.pipeline.outputs.raw",
           "dspk.pipeline.outputs.hdf5", "dspk.pipeline.outputs.kilosort",
           "dspk.pipeline.outputs.nwb", "dspk.pipeline.outputs.span",
           "dspk.pipeline.outputs.peaks", "dspk.pipeline.outputs.zarr",
           "dspk.motion", "dspk.motion.motion", "dspk.motion.registration",
           "dspk.motion.estimation", "dspk.motion.localization", "dspk.motion.correction"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
