"""What is measured of each detected spike: its waveform on the channels nearest its own
(`spike_clips`) and the projections of those waveforms on temporal principal components
(`spike_features`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import to_numpy
from ..finite import api, check_finite
from ..ops import PCA
from .spikes import _neighbourhoods
from .templates import _clips


@api
def spike_clips(x: Any, spikes: np.ndarray, geometry: np.ndarray, fs: float,
                n_neighbors: int = 10) -> tuple:
    """(clips float32 [n_spikes, n_neighbors, taps] on the host, channels [n_spikes,
    n_neighbors]): each spike's waveform (2 ms, trough at 2/3 ms, zero outside x) on the
    channels nearest its channel, gathered where x is (only the clips are transferred).

    Parameters
    ----------
    x : array
        [channels, samples] traces (NumPy or CuPy).
    spikes : numpy.ndarray
        With fields ``sample_index`` (the trough) and ``channel_index`` (`detect_spikes`).
    geometry : numpy.ndarray
        [channels, 2] float64 contact positions in µm (a NumPy array: its bytes key a cache).
    fs : float
        Sampling rate in Hz (the clip is round(2 ms · fs) taps, made odd).
    n_neighbors : int
        Channels per clip: the spike's channel, then the nearest others (at most all).

    Returns
    -------
    (clips, channels)
        float32 [n_spikes, n_neighbors, taps] and the channels of each clip's rows, int64
        [n_spikes, n_neighbors].

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.detect import spike_clips
    >>> geom = np.c_[np.zeros(8), 20.0 * np.arange(8)]
    >>> x = np.zeros((8, 3000), dtype=np.float32)
    >>> x[3, 500] = -5.0
    >>> spikes = np.array([(500, 3)], dtype=[("sample_index", "i8"), ("channel_index", "i8")])
    >>> clips, channels = spike_clips(x, spikes, geom, 30000.0, n_neighbors=3)
    >>> clips.shape, channels.tolist()
    ((1, 3, 61), [[3, 2, 4]])
    >>> int(clips[0, 0].argmin()), float(clips[0, 0].min())    # the trough at tap 20
    (20, -5.0)
    """
    geometry = np.asarray(to_numpy(geometry), dtype=np.float64)
    check_finite(x, "x")
    nbr = _neighbourhoods(geometry, n_neighbors, (), None)[0]   # no weights; cached per probe
    nn = nbr.shape[1]
    chans = nbr[np.asarray(spikes["channel_index"], dtype=np.int64)].reshape(-1, nn)
    clips = to_numpy(_clips(x, chans, np.asarray(spikes["sample_index"], dtype=np.int64),
                            fs))
    return clips, chans


@api
def spike_features(x: Any, spikes: np.ndarray, geometry: Any, fs: float,
                   pca: PCA | None = None, n_components: int = 3,
                   n_neighbors: int = 10) -> tuple:
    """PCA features of every spike on its neighbouring channels.

    The waveform of each spike (2 ms, trough at 2/3 ms) on the ``n_neighbors`` channels
    nearest its channel is projected on temporal principal components (`dspk.PCA`, fitted on
    these waveforms unless ``pca`` is given): [n_spikes, n_neighbors, n_components].

    Parameters
    ----------
    x : array
        [channels, samples] traces, those the spikes were detected in (NumPy or CuPy).
    spikes : numpy.ndarray
        `detect_spikes`' result (``sample_index`` and ``channel_index`` are used).
    geometry : array
        [channels, 2] contact positions in µm.
    fs : float
        Sampling rate in Hz.
    pca : dspk.PCA, optional
        A fitted PCA to project on (its taps must match the clips'); default: one fitted here.
    n_components : int
        Components of the PCA fitted here (ignored with ``pca``).
    n_neighbors : int
        Channels per spike (see `spike_clips`).

    Returns
    -------
    (features, channels, pca)
        features float32 [n_spikes, n_neighbors, n_components]; the neighbour channels of each
        spike [n_spikes, n_neighbors]; the PCA used.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.detect import default_templates, detect_spikes, spike_features
    >>> geom = np.c_[np.zeros(8), 20.0 * np.arange(8)]
    >>> x = np.random.default_rng(0).standard_normal((8, 3000)).astype(np.float32)
    >>> w = default_templates()[2]
    >>> for t in (500, 1500, 2500):
    ...     x[2:5, t - 20:t + 41] += np.array([[6.0], [12.0], [6.0]]) * w / -w.min()
    >>> spikes = detect_spikes(x, geom, 30000.0)
    >>> feats, channels, pca = spike_features(x, spikes, geom, 30000.0, n_components=2,
    ...                                       n_neighbors=3)
    >>> feats.shape, feats.dtype, channels.tolist()
    ((3, 3, 2), dtype('float32'), [[3, 2, 4], [3, 2, 4], [3, 2, 4]])
    >>> again, _, _ = spike_features(x, spikes, geom, 30000.0, pca=pca, n_neighbors=3)
    >>> bool(np.array_equal(again, feats))                   # the same PCA, given
    True
    """
    g = np.asarray(to_numpy(geometry), dtype=np.float64)
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"x: expected [channels, samples], got shape "
                         f"{getattr(x, 'shape', None)}")
    if g.shape != (x.shape[0], 2):
        raise ValueError(f"geometry: expected [{x.shape[0]}, 2] positions in µm, got shape "
                         f"{g.shape}")
    check_finite(x, "x")
    clips, chans = spike_clips(x, spikes, g, fs, n_neighbors)
    nn = chans.shape[1]
    if pca is None:
        if len(spikes) * nn <= n_components:
            raise ValueError(f"spikes: {len(spikes)} spikes are too few for {n_components} "
                             f"components")
        pca = PCA(n_components).fit(clips)
    feats = pca.transform(clips)
    return np.asarray(feats, dtype=np.float32), chans, pca
