"""Array functions on [channels, samples] traces, every product through `dspk.linalg`:
covariance and whitening, spatial filters and references, PCA, distances, FIR filters, the
Neuropixels steps (ADC phase shift, saturation blanking, bad-channel interpolation,
demultiplexed reference), stimulation artefacts, decimation."""

from .artifacts import (ARTIFACT_MODES, artifact_reach, artifact_templates, artifact_window,
                        remove_artifacts)
from .bad_channels import BadChannels, detect_bad_channels
from .covariance import CovarianceAccumulator, covariance
from .decimate import decimate, decimate_taps
from .butter import butter_zero_phase, butter_zero_phase_taps
from .demux import adc_groups, demux_reference
from .delay import fractional_delay_taps, phase_shift
from .destripe import agc_window, highpass_spatial_filter, highpass_spatial_matrix
from .distance import knn, pairwise_sqdist
from .fir import bandpass_taps, fir_bank, fir_filter, highpass_taps, zero_phase_taps
from .interpolation import interpolation_matrix
from .pca import PCA
from .saturation import blank_saturation
from .spatial import (bipolar_matrix, common_reference, laplacian_matrix, neighbors,
                      spatial_filter, SpatialFilter, whitening_matrix)

__all__ = ["covariance", "CovarianceAccumulator", "whitening_matrix", "spatial_filter",
           "detect_bad_channels", "BadChannels",
           "SpatialFilter", "common_reference", "neighbors", "PCA", "pairwise_sqdist", "knn",
           "highpass_taps",
           "bandpass_taps", "zero_phase_taps", "fir_filter", "fir_bank", "bipolar_matrix",
           "laplacian_matrix", "phase_shift", "fractional_delay_taps", "blank_saturation",
           "interpolation_matrix",
           "highpass_spatial_filter", "highpass_spatial_matrix", "agc_window",
           "remove_artifacts", "artifact_templates", "artifact_window", "artifact_reach",
           "ARTIFACT_MODES", "decimate", "decimate_taps", "butter_zero_phase",
           "butter_zero_phase_taps", "adc_groups", "demux_reference"]
