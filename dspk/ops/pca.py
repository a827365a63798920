"""PCA of spike waveforms (clips), fitted through the product engine."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import array_module, is_cupy_array
from ..linalg import matmul
from ..linalg.host_checks import to_host
from ..linalg.threads import single_threaded_blas
from ._pca_gpu import center_project, fits
from ..finite import api, check_finite
from ._checks import FLOATS

__all__ = ["PCA"]

#: CuPy clips of at most this many values are fitted on the host (`PCA.fit`): 2**24 float32
#: values are 64 MB to copy and a [taps, taps] product of milliseconds on the host
HOST_FIT_ELEMENTS = 1 << 24


def _clips(x: Any, name: str) -> tuple:
    if not (isinstance(x, np.ndarray) or is_cupy_array(x)):
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got {type(x).__name__}")
    if x.ndim not in (2, 3):
        raise ValueError(f"{name}: expected [n, taps] or [n, channels, taps] clips, got shape "
                         f"{x.shape}")
    if x.dtype not in FLOATS:
        raise TypeError(f"{name}: unsupported dtype {x.dtype}; expected float32 or float64")
    # a NaN would spread over the covariance (every component) or a whole row of features
    check_finite(x, name, ("clip", "tap") if x.ndim == 2 else ("clip", "channel", "tap"))
    return array_module(x), x.reshape(-1, x.shape[-1])


class PCA:
    """Principal components of waveform clips.

    ``fit(clips)`` centres the clips (each tap's mean), forms their covariance with one product
    through `dspk.linalg.matmul`, and takes the eigenvectors of the largest eigenvalues (float64
    eigendecomposition). Sign convention: each component's largest-magnitude entry is positive,
    so results are reproducible. ``transform(clips)`` = (X − μ)·Wᵀ as one product (on the GPU,
    for up to a few hundred taps, one pass that centres and projects without writing the
    centred clips: dspk/kernels/projection.cu). Clips are [n, taps]; [n, channels, taps] clips
    share components across channels and give [n, channels, k] features.

    Parameters
    ----------
    n_components : int
        Components kept (>= 1; at most the taps and the clips of the fit).

    Attributes
    ----------
    mean_ : array
        [taps], the clips' mean (in their dtype).
    components_ : array
        [n_components, taps], unit-norm rows, largest eigenvalue first.
    explained_variance_ : array
        [n_components] float64 eigenvalues of the covariance (divisor n − 1).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> clips = rng.standard_normal((500, 2)) @ np.array([[3.0, 0, 0], [0, 1.0, 0]])
    >>> p = PCA(2).fit(clips)
    >>> np.round(np.abs(p.components_), 2)
    array([[1., 0., 0.],
           [0., 1., 0.]])
    >>> p.transform(clips).shape
    (500, 2)
    """

    def __init__(self, n_components: int):
        if int(n_components) < 1:
            raise ValueError(f"n_components: expected >= 1, got {n_components}")
        self.n_components = int(n_components)
        self.mean_: Any = None
        self.components_: Any = None
        self.explained_variance_: Any = None

    @api
    def fit(self, clips: Any) -> "PCA":
        """Fit the components on float32/float64 clips [n, taps] or [n, channels, taps];
        returns the PCA."""
        xp, x = _clips(clips, "clips")
        n, taps = x.shape
        k = self.n_components
        if k > taps or k > n:
            raise ValueError(f"n_components: {k} components need at least {k} taps and {k} "
                             f"clips; got {taps} taps, {n} clips")
        if xp is not np and x.size <= HOST_FIT_ELEMENTS:
            # CuPy clips of a usual size fitted on the host (the components go back to the
            # device): the mean, its cast and the centring are CuPy kernels that NVRTC
            # compiles in a fresh process's first fit (0.6 s of a 0.75 s first call on an
            # H100, for a fit that takes 1.2 ms warm); 20 000 clips of 61 taps are 5 MB to
            # copy and a 0.07 GFLOP product on the host
            x = to_host(x)
        mean = x.mean(axis=0, dtype=np.float64)
        xc = x - mean.astype(x.dtype)[None]
        # the [taps, taps] covariance's eigendecomposition on the host for CuPy input too:
        # LAPACK takes well under a millisecond for it, where cuSOLVER's and the CuPy kernels
        # around it (argsort, take, sign, where...) cost 1.9 s of NVRTC compiles in a first
        # call on a fresh machine (measured on an H100)
        cov = to_host(matmul(xc.T, xc)).astype(np.float64) / max(n - 1, 1)
        with single_threaded_blas():   # the same components whatever the thread count
            d, e = np.linalg.eigh(cov)
        order = np.argsort(d)[::-1][:k]
        comps = e[:, order].T                                  # [k, taps]
        big = np.argmax(np.abs(comps), axis=1)
        signs = np.sign(comps[np.arange(k), big])
        comps = comps * np.where(signs == 0, 1, signs)[:, None]
        self.mean_ = xp.asarray(mean.astype(x.dtype))
        self.components_ = xp.asarray(comps.astype(x.dtype))
        self.explained_variance_ = xp.asarray(d[order])
        return self

    @api
    def transform(self, clips: Any) -> Any:
        """Features ``(clips − mean_)·components_ᵀ``: [n, n_components], or
        [n, channels, n_components] for [n, channels, taps] clips, in the fitted dtype."""
        if self.components_ is None:
            raise RuntimeError("PCA.transform before fit")
        xp, x = _clips(clips, "clips")
        if x.shape[1] != self.components_.shape[1]:
            raise ValueError(f"clips: {x.shape[1]} taps, but the PCA was fitted on "
                             f"{self.components_.shape[1]}")
        x = x.astype(self.components_.dtype, copy=False)
        if xp is not np:
            if fits(x.shape[1], self.n_components, x.itemsize):
                feats = center_project(x, self.mean_, self.components_)
                return feats.reshape(clips.shape[:-1] + (self.n_components,))
        feats = matmul(x - self.mean_[None], self.components_.T)
        return feats.reshape(clips.shape[:-1] + (self.n_components,))

    @api
    def fit_transform(self, clips: Any) -> Any:
        """``fit(clips).transform(clips)`` (the clips checked once)."""
        _clips(clips, "clips")
        return self.fit(clips).transform(clips)
