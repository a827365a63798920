"""Bad-channel detection on [channels, samples] traces: each channel labelled good, dead, noise
or out (outside the brain) from its similarity to the probe's median trace and its
high-frequency power, as SpikeInterface's ``detect_bad_channels(method="coherence+psd")``
computes it (IBL's algorithm), with the features the labels come from."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..argnames import arg
from ..backend import array_module, is_cupy_array, to_numpy
from ..linalg import matmul
from ..finite import NonFiniteError, api
from ._checks import finite_number, positions, positive_number
from .spatial import median_by_sorting

__all__ = ["detect_bad_channels", "BadChannels", "LABELS", "FEATURES"]

#: the labels, in the order of their codes (0..3): a tie between chunks goes to the first
LABELS = ("good", "dead", "noise", "out")
#: the features computed per chunk and channel (see `detect_bad_channels`)
FEATURES = ("xcorr", "trend", "xcorr_neighbors", "psd_hf")

LOCATIONS = ("top", "bottom", "both")
DIRECTIONS = ("x", "y")


@dataclass(frozen=True)
class BadChannels:
    """What `detect_bad_channels` found: one label per channel, and the per-chunk labels and
    features it took the majority of.

    Parameters
    ----------
    labels : numpy.ndarray
        [channels] str: ``"good"``, ``"dead"``, ``"noise"`` or ``"out"``, in the channel order
        of the traces (not sorted by depth).
    chunk_labels : numpy.ndarray
        [chunks, channels] str, each chunk's labels; ``labels`` is their most frequent value
        per channel (a tie goes to the first in `LABELS`, as ``scipy.stats.mode``).
    features : dict of str to numpy.ndarray
        [chunks, channels] float64 for each name of `FEATURES`.
    chunk_starts : numpy.ndarray
        [chunks] int64, the first sample of each chunk (each ``chunk_samples`` long).
    chunk_samples : int
        The length of every chunk in samples.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import detect_bad_channels
    >>> rng = np.random.default_rng(0)
    >>> geom = np.c_[np.zeros(32), 20.0 * np.arange(32)]
    >>> x = rng.normal(0, 1, (1, 3000)) + rng.normal(0, 0.5, (32, 3000))
    >>> x[5] = 0.0
    >>> found = detect_bad_channels(x, geom, 30000.0, num_random_chunks=None)
    >>> found.bad.nonzero()[0], found.features["psd_hf"].shape, found.chunk_starts
    (array([5]), (1, 32), array([0]))
    >>> sorted(found.channel_features())
    ['psd_hf', 'trend', 'xcorr', 'xcorr_neighbors']
    """

    labels: np.ndarray
    chunk_labels: np.ndarray
    features: dict = field(repr=False)
    chunk_starts: np.ndarray
    chunk_samples: int

    @property
    def bad(self) -> np.ndarray:
        """[channels] bool: True where the label is not ``"good"``."""
        return self.labels != "good"

    def channel_features(self) -> dict:
        """Each feature's median over the chunks: a dict of [channels] float64 arrays.

        Returns
        -------
        dict of str to numpy.ndarray

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.ops import detect_bad_channels
        >>> x = np.random.default_rng(1).normal(0, 1, (16, 4000))
        >>> found = detect_bad_channels(x, np.c_[np.zeros(16), np.arange(16.0)], 30000.0,
        ...                             num_random_chunks=3, chunk_duration_s=0.05, seed=0)
        >>> found.channel_features()["psd_hf"].shape
        (16,)
        """
        return {k: np.median(v, axis=0) for k, v in self.features.items()}


def _count(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer ≥ {minimum}, got {value!r}; pass "
                         f"{arg(name)}<an integer ≥ {minimum}>")
    return int(value)


def _traces(x: Any) -> Any:
    if not (isinstance(x, np.ndarray) or is_cupy_array(x)):
        raise TypeError(f"x: expected a NumPy or CuPy [channels, samples] array, got "
                        f"{type(x).__name__}")
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"x: expected a non-empty 2-D [channels, samples] array, got shape "
                         f"{x.shape}")
    if x.dtype.kind not in "fiu":
        raise TypeError(f"x: expected real numbers (µV), got dtype {x.dtype}")
    return x


def _geometry(geometry: Any, n: int) -> np.ndarray:
    g = positions(geometry)
    if g.shape[0] != n:
        raise ValueError(f"geometry: {g.shape[0]} positions for the {n} channels of x "
                         f"(x is [channels, samples])")
    return g


def _choice(name: str, value: Any, allowed: tuple) -> str:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, allowed))}, got "
                         f"{value!r}")
    return value


def chunk_starts(n_samples: int, chunk_samples: int, num_chunks: int,
                 seed: int | None) -> np.ndarray:
    """The first sample of each random chunk, drawn as SpikeInterface's
    ``get_random_sample_slices(method="full_random")`` draws them for one segment: starts
    uniform in [0, n_samples − chunk_samples] (both ends included) from
    ``numpy.random.default_rng(seed)``, sorted; chunks may overlap."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(low=0, high=n_samples - chunk_samples, size=num_chunks,
                          endpoint=True)
    return np.sort(starts).astype(np.int64)


def depth_order(geometry: np.ndarray, direction: str) -> np.ndarray:
    """Channel indices from the tip up: by the ``direction`` coordinate, ties by the other
    (SpikeInterface's ``order_channels_by_depth(dimensions=("x", "y"))`` for "y")."""
    dim = DIRECTIONS.index(direction)
    return np.lexsort((geometry[:, 1 - dim], geometry[:, dim]))


def shrinking_median(v: np.ndarray, size: int) -> np.ndarray:
    """Running median over ``size // 2`` values on each side, the window cut (not padded) at
    the ends: the reference's ``shrinking_median_filter``. The full windows in one
    ``numpy.median`` over a sliding view (the same values, the same median: one call per
    channel was half of a GPU pipeline's fit), the cut ones at the ends one by one."""
    v = np.asarray(v)
    half = size // 2
    n = len(v)
    out = np.empty(n, dtype=np.result_type(v.dtype, np.float64))
    full = 2 * half + 1
    if n >= full:
        out[half:n - half] = np.median(np.lib.stride_tricks.sliding_window_view(v, full),
                                       axis=1)
        ends = [*range(half), *range(n - half, n)]
    else:
        ends = range(n)
    for i in ends:
        out[i] = np.median(v[max(0, i - half):i + half + 1])
    return out


def high_band_psd(raw: Any, fs: float, nperseg: int, nyquist_threshold: float) -> Any:
    """Each row's mean power spectral density above ``nyquist_threshold`` × fs/2: the mean of
    ``scipy.signal.welch(raw, fs, window="hann", nperseg=nperseg)`` over those frequencies
    (Hann window, half overlap, each segment's mean removed, one-sided density), which the
    reference compares to an absolute threshold. NumPy or CuPy rows (CuPy: on the device).

    Computed here from the high bins of each segment's real FFT because removing a segment's
    mean changes only the bins where the periodic Hann window's own transform is non-zero
    (0 and 1): above them the detrend is a no-op, and SciPy's per-segment detrend pass was
    most of the call's time. Where a high bin is below 2 (segments of 2 samples or fewer),
    SciPy's welch is called as is (on the host).
    """
    from scipy.signal import get_window   # deferred with SciPy's other packages

    xp = array_module(raw)
    freqs = np.fft.rfftfreq(nperseg, 1 / fs)
    high = np.flatnonzero(freqs > fs / 2 * nyquist_threshold)
    if high[0] < 2:
        from scipy.signal import welch   # deferred: SciPy's signal package is slow to import
        f, psd = welch(to_numpy(raw), fs=fs, axis=1, window="hann", nperseg=nperseg)
        return xp.asarray(psd[:, f > fs / 2 * nyquist_threshold].mean(axis=1))
    w = get_window("hann", nperseg)
    step = nperseg - nperseg // 2                # welch's default overlap: nperseg // 2
    raw = xp.ascontiguousarray(raw)
    n_seg = (raw.shape[1] - nperseg) // step + 1
    # [channels, segments, nperseg], a strided view (sliding_window_view(...)[:, ::step])
    segments = xp.lib.stride_tricks.as_strided(
        raw, shape=(raw.shape[0], n_seg, nperseg),
        strides=(raw.strides[0], step * raw.strides[1], raw.strides[1]))
    if xp is np:
        from scipy.fft import rfft       # deferred with SciPy's other packages
    else:
        rfft = xp.fft.rfft
    spectrum = rfft(segments * xp.asarray(w), axis=2)[:, :, high[0]:]
    power = spectrum.real ** 2 + spectrum.imag ** 2
    # one-sided density: doubled except at the Nyquist bin of an even segment
    double = np.where(high == nperseg // 2 if nperseg % 2 == 0 else False, 1.0, 2.0)
    psd = power.mean(axis=1) * xp.asarray(double) / (fs * np.sum(w * w))
    return psd.mean(axis=1)


def chunk_features(raw: Any, fs: float, nperseg: int, nyquist_threshold: float) -> dict:
    """The features of one chunk, [channels, samples] float64 ordered by depth (the trend is
    added by the caller, which knows ``n_neighbors``); NumPy or CuPy, the features on the
    chunk's device."""
    xp = array_module(raw)
    raw = raw - raw.mean(axis=1, keepdims=True)
    # The PSD is Welch's estimate as in the reference: psd_hf is compared to an absolute
    # threshold, and a different estimator (an FIR band-pass's power) would move channels
    # across it.
    psd_hf = high_band_psd(raw, fs, nperseg, nyquist_threshold)
    # the median trace across channels, numpy.median's exactly (on the host by sorting each
    # sample's channel values: 1.5x faster than its partition here)
    ref = median_by_sorting(raw) if xp is np else xp.median(raw, axis=0)
    ref -= ref.mean()
    # similarity: each channel's projection on the median trace, a [C, L]·[L, 1] product
    xcorr = matmul(raw, ref[:, None])[:, 0] / xp.sum(ref * ref)
    return {"xcorr": xcorr, "psd_hf": psd_hf}


def chunk_codes(feats: dict, *, psd_hf_threshold: float, dead: float, noisy: float,
                outside: float, location: str) -> np.ndarray:
    """Label codes (indices into LABELS) of one chunk's channels, ordered by depth; later
    rules overwrite earlier ones (out > noise > dead), as in the reference."""
    xn, trend = feats["xcorr_neighbors"], feats["trend"]
    n = len(xn)
    codes = np.zeros(n, dtype=np.int64)
    codes[xn < dead] = 1
    codes[(feats["psd_hf"] > psd_hf_threshold) | (xn > noisy)] = 2
    below = np.flatnonzero(trend < outside + 1)
    if below.size:
        blocks = np.split(below, np.flatnonzero(np.diff(below) > 1) + 1)
        if location in ("top", "both") and blocks[-1][-1] == n - 1:
            codes[blocks[-1]] = 3
        if location in ("bottom", "both") and blocks[0][0] == 0:
            codes[blocks[0]] = 3
    return codes


@api
def detect_bad_channels(x: Any, geometry: Any, fs: float, *, psd_hf_threshold: float = 0.02,
                        dead_channel_threshold: float = -0.5,
                        noisy_channel_threshold: float = 1.0,
                        outside_channel_threshold: float = -0.75,
                        outside_channels_location: str = "top", n_neighbors: int = 11,
                        nyquist_threshold: float = 0.8, direction: str = "y",
                        welch_window_ms: float = 10.0, chunk_duration_s: float = 0.3,
                        num_random_chunks: int | None = 100,
                        seed: int | None = None) -> BadChannels:
    """Label each channel good, dead, noisy or outside the brain: SpikeInterface's
    ``detect_bad_channels(recording, method="coherence+psd")`` (spikeinterface.preprocessing,
    version 0.105), which is the International Brain Laboratory's ``detect_bad_channels``
    (ibl-neuropixel, ``ibldsp.voltage``; IBL et al. 2022, "Spike sorting pipeline for the
    International Brain Laboratory"), on an array.

    The channels are ordered by depth (``geometry``'s ``direction`` coordinate, ties by the
    other). In each chunk, after removing each channel's mean:

    - ``xcorr``: each channel's projection on the median trace across channels (itself made
      zero-mean), divided by that trace's energy: near 1 on channels that share the probe's
      signal, near 0 on flat or unrelated ones;
    - ``trend``: the running median of ``xcorr`` along depth over ``n_neighbors`` channels
      (the window shrinks at the ends); ``xcorr_neighbors = xcorr − trend``;
    - ``psd_hf``: the mean Welch PSD (µV²/Hz; Hann window of ``welch_window_ms``, half
      overlap) above ``nyquist_threshold`` × fs/2.

    A channel is dead where ``xcorr_neighbors < dead_channel_threshold``; noisy where
    ``psd_hf > psd_hf_threshold`` or ``xcorr_neighbors > noisy_channel_threshold`` (over
    dead); outside the brain (over both) in the run of channels with
    ``trend < outside_channel_threshold + 1`` that reaches the top (``"top"``: the last
    channel by depth), the bottom, or either (``outside_channels_location``). The label of a
    channel is its most frequent label over the chunks (a tie goes to good, then dead, then
    noise). IBL's ``xcor_hf`` and ``xcor_lf`` are this ``xcorr_neighbors`` and
    ``trend − 1``; IBL computes them on the raw and the high-passed traces, SpikeInterface
    0.105 (and dspk) both on the traces given.

    Chunks: as the reference, ``num_random_chunks`` chunks of ``int(chunk_duration_s * fs)``
    samples at random starts drawn with ``numpy.random.default_rng(seed)`` exactly as its
    ``get_random_sample_slices`` draws them for one segment, so the same ``seed`` assesses
    the same chunks. ``num_random_chunks=None`` takes x as given: one chunk, all of x.

    What differs from the reference: x is assessed as given, in µV, and should be
    high-passed already (the reference high-passes a recording not marked filtered with a
    5th-order Butterworth at 300 Hz; here use e.g.
    ``fir_filter(x, highpass_taps(fs))``); the features are computed in float64 (the
    reference's in float32 when its traces are float32: the labels differ only for a
    feature within rounding of a threshold); ``direction="x"`` orders by x (the reference
    checks ``direction`` but always orders by y); a chunk longer than x is an error (the
    reference shortens it with a warning). There is no ``channel_filters``: select labels
    from the result.

    CuPy traces are assessed on the device (the features in float64 there; only they come
    to the host), and the result is the same host-side `BadChannels`.

    Parameters
    ----------
    x : numpy.ndarray or cupy.ndarray
        [channels, samples] traces in µV, high-passed, finite in the chunks assessed; any
        real dtype (computed in float64).
    geometry : array-like or probeinterface Probe
        [channels, 2] contact positions in µm (x, y), in the channel order of x.
    fs : float
        Sampling rate in Hz (> 0).
    psd_hf_threshold : float
        µV²/Hz above which the mean high-frequency PSD makes a channel noisy (default 0.02,
        IBL's for AP band data; IBL suggests 1.4 for LFP).
    dead_channel_threshold : float
        ``xcorr_neighbors`` below which a channel is dead (default −0.5).
    noisy_channel_threshold : float
        ``xcorr_neighbors`` above which a channel is noisy (default 1).
    outside_channel_threshold : float
        The run of channels at the end of the probe with ``trend`` below this + 1 is outside
        the brain (default −0.75).
    outside_channels_location : {"top", "bottom", "both"}
        Which end of the probe may be outside the brain (default ``"top"``: the highest
        channels).
    n_neighbors : int
        Channels in the running median along depth (≥ 1, at most the number of channels;
        odd as the reference's documentation asks: an even one spans ``n_neighbors + 1``).
    nyquist_threshold : float
        Where the high-frequency band begins, as a fraction of fs/2, in (0, 1) (default 0.8).
    direction : {"y", "x"}
        The depth coordinate of ``geometry``.
    welch_window_ms : float
        The Welch segment in ms (default 10; ``int(welch_window_ms * fs / 1000)`` samples).
    chunk_duration_s : float
        The length of each chunk in s (default 0.3).
    num_random_chunks : int or None
        How many random chunks (default 100, as the reference); None: x as one chunk.
    seed : int or None
        The seed of the chunk starts (None: different chunks each call, as the reference).

    Returns
    -------
    BadChannels
        ``labels`` ([channels] str), ``bad`` (the mask of labels other than good),
        ``features`` ([chunks, channels] per name of `FEATURES`; ``channel_features()`` their
        median per channel), ``chunk_labels``, ``chunk_starts``, ``chunk_samples``.

    Raises
    ------
    ValueError
        x not [channels, samples] or not finite in a chunk, geometry not [channels, 2] of
        x's channels, fs or a duration not positive, fewer samples than a chunk, fewer
        channels than ``n_neighbors``, ``nyquist_threshold`` outside (0, 1), a Welch
        segment with no frequency above it, an unknown ``direction`` or
        ``outside_channels_location``.

    Warns
    -----
    UserWarning
        More than a third of the channels bad (as the reference: the median trace may then
        no longer be the probe's signal, and good channels may be labelled dead).

    Examples
    --------
    A probe whose channels share a signal, channel 3 flat, channel 9 with broadband noise,
    the top eight channels outside the brain (a run at least ``n_neighbors // 2 + 1`` long
    drags the running median below the threshold):

    >>> import numpy as np
    >>> from dspk.ops import detect_bad_channels
    >>> rng = np.random.default_rng(0)
    >>> n_ch, fs = 48, 30000.0
    >>> geom = np.c_[np.zeros(n_ch), 20.0 * np.arange(n_ch)]
    >>> x = rng.normal(0, 10, (1, 6000)) + rng.normal(0, 1, (n_ch, 6000))
    >>> x[3] = 0.0
    >>> x[9] += rng.normal(0, 30, 6000)               # 0.06 µV²/Hz at high frequencies
    >>> x[-8:] = rng.normal(0, 1, (8, 6000))
    >>> found = detect_bad_channels(x, geom, fs, num_random_chunks=10, chunk_duration_s=0.1,
    ...                             seed=0)
    >>> int(found.bad.sum()), found.labels[[3, 9]]
    (10, array(['dead', 'noise'], dtype='<U5'))
    >>> np.flatnonzero(found.labels == "out")
    array([40, 41, 42, 43, 44, 45, 46, 47])
    >>> found.features["xcorr"].shape             # [chunks, channels]
    (10, 48)
    """
    _traces(x)
    n_channels, n_samples = x.shape
    g = _geometry(geometry, n_channels)
    fs = positive_number("fs", fs)
    psd_hf_threshold = finite_number("psd_hf_threshold", psd_hf_threshold)
    dead = finite_number("dead_channel_threshold", dead_channel_threshold)
    noisy = finite_number("noisy_channel_threshold", noisy_channel_threshold)
    outside = finite_number("outside_channel_threshold", outside_channel_threshold)
    location = _choice("outside_channels_location", outside_channels_location, LOCATIONS)
    direction = _choice("direction", direction, DIRECTIONS)
    n_neighbors = _count("n_neighbors", n_neighbors)
    if n_channels < n_neighbors:
        raise ValueError(f"n_neighbors: {n_neighbors} neighbours for the running median, but x "
                         f"has {n_channels} channels; pass {arg('n_neighbors')}<at most "
                         f"{n_channels}>")
    nyq = finite_number("nyquist_threshold", nyquist_threshold)
    if not 0 < nyq < 1:
        raise ValueError(f"nyquist_threshold: expected a fraction of fs/2 in (0, 1), got "
                         f"{nyquist_threshold!r}")
    window_ms = positive_number("welch_window_ms", welch_window_ms)
    if num_random_chunks is None:
        chunk = n_samples
        starts = np.zeros(1, dtype=np.int64)
    else:
        num = _count("num_random_chunks", num_random_chunks)
        duration = positive_number("chunk_duration_s", chunk_duration_s)
        chunk = int(duration * fs)
        if chunk < 1:
            raise ValueError(f"chunk_duration_s: {duration} s is less than one sample at "
                             f"fs={fs}; pass a longer {arg('chunk_duration_s')}")
        if chunk > n_samples:
            raise ValueError(f"x: {n_samples} samples, fewer than one chunk of "
                             f"{arg('chunk_duration_s', duration)} ({chunk} samples at "
                             f"{fs} Hz); pass a shorter {arg('chunk_duration_s')} or "
                             f"{arg('num_random_chunks', None)} to assess x as given")
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed: expected an integer or None, got {seed!r}")
        starts = chunk_starts(n_samples, chunk, num, seed)
    # scipy.signal.welch shortens a segment longer than the chunk to the chunk
    nperseg = min(int(window_ms * fs / 1000), chunk)
    n_high = int(np.count_nonzero(np.fft.rfftfreq(nperseg, 1 / fs) > fs / 2 * nyq)) \
        if nperseg >= 1 else 0
    if n_high == 0:
        raise ValueError(f"welch_window_ms: a Welch segment of {nperseg} samples has no "
                         f"frequency above {arg('nyquist_threshold', nyquist_threshold)} of "
                         f"fs/2; pass a longer {arg('welch_window_ms')}")

    xp = array_module(x)
    for s in starts:                 # every chunk checked before any is assessed
        c = x[:, s:s + chunk]
        if not bool(xp.isfinite(c).all()):
            ch, t = np.argwhere(~np.isfinite(to_numpy(c)))[0]
            raise NonFiniteError(f"x: not finite (NaN or inf) at channel {int(ch)}, "
                                 f"sample {int(s + t)}, in a chunk to assess")

    order = depth_order(g, direction)
    feats = {k: np.empty((len(starts), n_channels)) for k in FEATURES}
    codes = np.empty((len(starts), n_channels), dtype=np.int64)
    # CuPy: the features computed on the device, only they come to the host (the chunks
    # copied over and assessed by the CPU took most of a GPU pipeline's fit)
    order_x = xp.asarray(order)
    for i, s in enumerate(starts):
        c = x[:, s:s + chunk][order_x].astype(np.float64)
        f = {k: to_numpy(v) for k, v in chunk_features(c, fs, nperseg, nyq).items()}
        f["trend"] = shrinking_median(f["xcorr"], n_neighbors)
        f["xcorr_neighbors"] = f["xcorr"] - f["trend"]
        code = chunk_codes(f, psd_hf_threshold=psd_hf_threshold, dead=dead, noisy=noisy,
                           outside=outside, location=location)
        codes[i, order] = code                  # back to x's channel order
        for k in FEATURES:
            feats[k][i, order] = f[k]
    # the most frequent code per channel; argmax takes the smallest on a tie
    counts = np.stack([(codes == k).sum(axis=0) for k in range(len(LABELS))])
    names = np.array(LABELS)
    labels = names[counts.argmax(axis=0)]
    if np.count_nonzero(labels != "good") > n_channels / 3:
        warnings.warn(f"{np.count_nonzero(labels != 'good')} of {n_channels} channels are "
                      f"labelled bad: with this many dead or noisy channels the median trace "
                      f"may not be the probe's signal, and good channels may be labelled dead",
                      UserWarning, stacklevel=2)
    return BadChannels(labels=labels, chunk_labels=names[codes], features=feats,
                       chunk_starts=starts, chunk_samples=chunk)
