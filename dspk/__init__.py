"""dspk: the signal processing in front of spike sorting, on the GPU (CuPy) and the CPU (NumPy).

Every heavy operation lowers to one exact, tuned matrix-product engine, `dspk.linalg`.
Importing dspk is cheap: CuPy is imported, and CUDA kernels compiled, only when first used.
The submodules are attributes, as SciPy's are: ``dspk.match``, ``dspk.motion``,
``dspk.detect``, ``dspk.ops``, ``dspk.pipeline`` and ``dspk.io``, and, imported on first use
(PEP 562: `SUBMODULES`), ``dspk.spikeinterface`` (which imports SpikeInterface),
``dspk.dask``, ``dspk.plot`` (matplotlib) and the others.

Examples
--------
>>> import dspk
>>> dspk.match.ncc.__module__, dspk.motion.localize.__module__
('dspk.match', 'dspk.motion.localization')
"""

from ._version import __version__
from . import backend, io, linalg, motion  # noqa: E402
from .backend import BackendError, gpu_available, resolve_backend  # noqa: E402
from .io import open_recording  # noqa: E402
from .linalg import MatrixView, explain, int_matmul, matmul  # noqa: E402
from .detect import detect_spikes, learn_templates, spike_features  # noqa: E402
from .pipeline import Pipeline, preprocess  # noqa: E402
from .ops import detect_bad_channels  # noqa: E402
from .ops import (PCA, CovarianceAccumulator, bandpass_taps, blank_saturation,  # noqa: E402
                  common_reference, covariance, fir_bank, fir_filter, highpass_taps,
                  interpolation_matrix, knn, pairwise_sqdist, phase_shift, spatial_filter,
                  SpatialFilter, whitening_matrix, zero_phase_taps)
from .ops import highpass_spatial_filter, highpass_spatial_matrix  # noqa: E402

__all__ = ["__version__", "backend", "io", "open_recording", "linalg", "motion", "matmul",
           "int_matmul",
           "explain", "MatrixView",
           "detect_bad_channels",
           "BackendError", "gpu_available", "resolve_backend", "covariance",
           "CovarianceAccumulator", "whitening_matrix", "spatial_filter", "SpatialFilter",
           "common_reference", "PCA", "pairwise_sqdist", "knn", "highpass_taps",
           "bandpass_taps", "zero_phase_taps",
           "fir_filter", "fir_bank", "phase_shift", "blank_saturation",
           "interpolation_matrix", "Pipeline", "preprocess", "detect_spikes",
           "learn_templates", "spike_features",
           "highpass_spatial_filter", "highpass_spatial_matrix"]

#: the submodules ``dspk.<name>`` imports on first use (PEP 562), without ``import dspk.<name>``
SUBMODULES = ("argnames", "backend", "caches", "cli", "dask", "detect", "finite", "io",
              "kernels", "linalg", "match", "motion", "ops", "pipeline", "plot",
              "spikeinterface", "warmup")


def __getattr__(name: str):
    """``dspk.match``, ``dspk.spikeinterface``, ...: a submodule imported when first used."""
    if name in SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(SUBMODULES))
