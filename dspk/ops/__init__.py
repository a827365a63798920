"""Array functions on [channels, samples] traces, every product through `dspk.linalg`:
covariance and whitening, spatial filters and references, PCA, distances."""

from .covariance import CovarianceAccumulator, covariance
from .distance import knn, pairwise_sqdist
from .pca import PCA
from .spatial import common_reference, neighbors, spatial_filter, whitening_matrix

__all__ = ["covariance", "CovarianceAccumulator", "whitening_matrix", "spatial_filter",
           "common_reference", "neighbors", "PCA", "pairwise_sqdist", "knn"]
