"""Figures of what dspk does to a recording (matplotlib; ``pip install 'dspk[plot]'``).

Every function returns a `matplotlib.figure.Figure`; those that draw one panel take ``ax``
(draw into an existing Axes, e.g. a panel of a larger figure), those that draw two take
``axes``. Arrays may be NumPy or CuPy (CuPy arrays are copied to the host: only what is drawn
is transferred). Traces are ``[channels, samples]`` as everywhere in dspk. The default sizes
(at most 10 x 6.5 inches, 10-point text) stay legible at a notebook's width.

>>> import numpy as np
>>> import matplotlib
>>> matplotlib.use("Agg")
>>> from dspk import plot
>>> x = np.random.default_rng(0).standard_normal((8, 3000)).astype(np.float32)
>>> fig = plot.traces(x, fs=30000.0)
>>> fig.axes[0].get_xlabel()
'time (s)'
"""

from __future__ import annotations

import json
import textwrap
from os import PathLike
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .backend import to_numpy
from .detect import spike_clips
from .motion import Motion

__all__ = ["traces", "before_after", "matrix", "covariance_and_whitening", "probe",
           "waveforms", "features", "motion", "tuner_timings", "benchmark_bars",
           "load_results"]

WIDTH_IN = 10.0        # a notebook's width at 100 dpi
TITLE_CHARS = 80       # a 10-point title's line over the bars (the labels take the rest)
HEIGHT_IN = 6.5        # what a notebook shows without scrolling


def _bar_layout(rows: int, per_row: float) -> tuple[float, float]:
    """(figure height, label font size) for ``rows`` horizontal bars: ``per_row`` inches
    each, but no taller than HEIGHT_IN (a GPU's tuner times ~40 candidates); the labels
    shrink with the rows, to 7 points at least."""
    height = min(HEIGHT_IN, 1.2 + per_row * rows)
    return height, max(7.0, min(8.0, 0.8 * 72 * (height - 1.2) / max(rows, 1)))


def _pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt  # noqa: PLC0415 (optional dependency)
    except ImportError as e:         # an optional extra: say how to get it
        raise ImportError("dspk.plot needs matplotlib: pip install 'dspk[plot]'") from e
    return plt


def _axes(ax: Any, figsize: tuple) -> tuple:
    """(figure, ax): a new figure of ``figsize`` unless ``ax`` is given."""
    if ax is not None:
        return ax.figure, ax
    fig, ax = _pyplot().subplots(figsize=figsize, layout="constrained")
    return fig, ax


def _two_axes(axes: Any, figsize: tuple, sharex: bool = False) -> tuple:
    if axes is not None:
        if len(axes) != 2:
            raise ValueError(f"axes: expected 2 Axes, got {len(axes)}")
        return axes[0].figure, tuple(axes)
    fig, axs = _pyplot().subplots(1, 2, figsize=figsize, layout="constrained", sharex=sharex)
    return fig, tuple(axs)


def _traces_2d(x: Any, name: str) -> np.ndarray:
    a = np.asarray(to_numpy(x))
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 2:
        raise ValueError(f"{name}: expected [channels, samples] traces, got shape {a.shape}")
    return a


def _channel_list(channels: Any, c: int) -> np.ndarray:
    if channels is None:
        return np.arange(min(c, 16))
    ch = np.atleast_1d(np.asarray(channels, dtype=np.int64))
    if ch.size == 0 or ch.min() < 0 or ch.max() >= c:
        raise ValueError(f"channels: expected indices in [0, {c}), got {ch.tolist()}")
    return ch


def _window(n: int, fs: float, start_s: float, duration_s: float | None) -> slice:
    if not fs > 0:
        raise ValueError(f"fs: expected a positive sampling rate, got {fs}")
    s0 = int(round(start_s * fs))
    s1 = n if duration_s is None else min(n, s0 + int(round(duration_s * fs)))
    if not 0 <= s0 < s1:
        raise ValueError(f"start_s, duration_s: the window [{start_s}, +{duration_s}) s is "
                         f"outside the {n / fs:.3g} s of traces")
    return slice(s0, s1)


def traces(x: Any, fs: float, channels: Any = None, start_s: float = 0.0,
           duration_s: float | None = 0.1, spacing: float | None = None, unit: str = "µV",
           title: str | None = None, color: str = "k", ax: Any = None) -> Any:
    """Traces of several channels, one above the other.

    Parameters
    ----------
    x : array
        ``[channels, samples]`` traces (NumPy or CuPy).
    fs : float
        Sampling rate in Hz (the time axis is in seconds).
    channels : sequence of int, optional
        Channels to draw, bottom to top (default: the first 16).
    start_s, duration_s : float
        The window drawn, in seconds from the first sample (``duration_s=None``: to the end;
        default 0.1 s, where spikes are visible).
    spacing : float, optional
        Vertical offset between channels in the traces' unit (default: 6 robust standard
        deviations, the median over the channels drawn).
    unit : str
        The traces' unit, for the labels (e.g. ``"µV"`` raw, ``"σ"`` whitened).
    title : str, optional
    color : str
    ax : matplotlib.axes.Axes, optional
        Draw here instead of in a new figure.

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import numpy as np
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from dspk import plot
    >>> x = 20 * np.random.default_rng(0).standard_normal((4, 3000)).astype(np.float32)
    >>> fig = plot.traces(x, fs=30000.0, unit="µV")
    >>> ax = fig.axes[0]
    >>> ax.get_xlabel(), [t.get_text() for t in ax.get_yticklabels()]
    ('time (s)', ['0', '1', '2', '3'])
    """
    a = _traces_2d(x, "x")
    ch = _channel_list(channels, a.shape[0])
    win = _window(a.shape[1], fs, start_s, duration_s)
    y = a[ch, win].astype(np.float64)
    if spacing is None:
        mad = np.median(np.abs(y - np.median(y, axis=1, keepdims=True)), axis=1) / 0.6745
        spacing = 6.0 * float(np.median(mad)) or 1.0
    t = (np.arange(win.start, win.stop)) / fs
    fig, ax = _axes(ax, (WIDTH_IN, min(6.5, 1.5 + 0.3 * len(ch))))
    offsets = np.arange(len(ch)) * spacing
    ax.plot(t, (y - np.median(y, axis=1, keepdims=True)).T + offsets, color=color, lw=0.6)
    ax.set_yticks(offsets, [str(int(c)) for c in ch])
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"channel (offset {spacing:.3g} {unit} apart)")
    ax.set_xlim(t[0], t[-1])
    ax.set_ylim(-spacing, offsets[-1] + spacing)
    if title:
        ax.set_title(title)
    return fig


def before_after(raw: Any, processed: Any, fs: float, channels: Any = None,
                 start_s: float = 0.0, duration_s: float | None = 0.1,
                 units: tuple = ("µV", "σ"),
                 titles: tuple = ("raw", "preprocessed"), axes: Any = None) -> Any:
    """The same channels and window before and after preprocessing, side by side.

    Each panel has its own vertical spacing (raw traces in µV with their drift, whitened ones
    in noise standard deviations).

    Parameters
    ----------
    raw, processed : array
        ``[channels, samples]`` traces of the same recording window (NumPy or CuPy).
    fs : float
        Sampling rate in Hz.
    channels, start_s, duration_s :
        As for `traces`.
    units, titles : tuple of 2 str
        Each panel's unit and title.
    axes : sequence of 2 matplotlib Axes, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import numpy as np
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from dspk import plot
    >>> x = np.random.default_rng(0).standard_normal((6, 3000)).astype(np.float32)
    >>> fig = plot.before_after(50 * x + 300, x, fs=30000.0)
    >>> [ax.get_title() for ax in fig.axes]
    ['raw', 'preprocessed']
    """
    a, b = _traces_2d(raw, "raw"), _traces_2d(processed, "processed")
    if a.shape != b.shape:
        raise ValueError(f"raw, processed: expected the same shape, got {a.shape} and "
                         f"{b.shape}")
    ch = _channel_list(channels, a.shape[0])
    fig, (ax0, ax1) = _two_axes(axes, (WIDTH_IN, min(6.5, 1.5 + 0.3 * len(ch))), sharex=True)
    for ax, v, unit, title in ((ax0, a, units[0], titles[0]), (ax1, b, units[1], titles[1])):
        traces(v, fs, channels=ch, start_s=start_s, duration_s=duration_s, unit=unit,
               title=title, ax=ax)
    return fig


def matrix(m: Any, title: str | None = None, label: str = "", symmetric: bool = True,
           cmap: str = "RdBu_r", ax: Any = None) -> Any:
    """A channel-by-channel matrix (covariance, whitening, spatial filter) as an image.

    Parameters
    ----------
    m : array
        ``[rows, cols]`` (NumPy or CuPy).
    title : str, optional
    label : str
        The colour bar's label: what a value is, with its unit.
    symmetric : bool
        Colour range centred on 0 (``-max|m|`` to ``max|m|``), for signed matrices.
    cmap : str
    ax : matplotlib.axes.Axes, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import numpy as np
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from dspk import plot
    >>> fig = plot.matrix(np.eye(8), title="identity", label="value")
    >>> fig.axes[0].get_xlabel(), fig.axes[1].get_ylabel()
    ('channel', 'value')
    """
    a = np.asarray(to_numpy(m), dtype=np.float64)
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"m: expected a non-empty 2-D matrix, got shape {a.shape}")
    fig, ax = _axes(ax, (6.0, 5.0))
    lim = float(np.abs(a).max()) or 1.0
    kw = dict(vmin=-lim, vmax=lim) if symmetric else {}
    im = ax.imshow(a, cmap=cmap, interpolation="nearest", **kw)
    ax.set_xlabel("channel")
    ax.set_ylabel("channel")
    if title:
        ax.set_title(title)
    fig.colorbar(im, ax=ax, label=label, shrink=0.85)
    return fig


def covariance_and_whitening(cov: Any, w: Any, unit: str = "µV²", axes: Any = None) -> Any:
    """The channel covariance and the whitening matrix fitted from it, side by side.

    Parameters
    ----------
    cov : array
        ``[channels, channels]`` covariance of the (filtered) traces.
    w : array
        ``[channels, channels]`` whitening matrix (e.g. ``Pipeline.states[k]["W"]``).
    unit : str
        The covariance's unit.
    axes : sequence of 2 matplotlib Axes, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import numpy as np
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import dspk
    >>> from dspk import plot
    >>> x = np.random.default_rng(0).standard_normal((8, 4000)).astype(np.float32)
    >>> c = dspk.covariance(x)
    >>> fig = plot.covariance_and_whitening(c, dspk.whitening_matrix(c))
    >>> [ax.get_title() for ax in fig.axes[:2]]
    ['channel covariance', 'whitening matrix W']
    """
    fig, (ax0, ax1) = _two_axes(axes, (WIDTH_IN, 4.2))
    matrix(cov, title="channel covariance", label=f"covariance ({unit})", ax=ax0)
    matrix(w, title="whitening matrix W", label="weight (σ per µV)", ax=ax1)
    return fig


def _geometry(geometry: Any) -> np.ndarray:
    g = np.asarray(to_numpy(geometry), dtype=np.float64)
    if g.ndim != 2 or g.shape[1] != 2 or len(g) == 0:
        raise ValueError(f"geometry: expected [channels, 2] positions in µm, got shape "
                         f"{g.shape}")
    return g


def probe(geometry: Any, spikes: Any = None, positions: Any = None,
          widths_um: Sequence[float] = (), jitter_um: float = 4.0, max_spikes: int = 20000,
          ax: Any = None) -> Any:
    """The probe's contacts, the detected spikes on it (amplitude as colour) and the
    detection positions.

    Parameters
    ----------
    geometry : array
        ``[channels, 2]`` contact positions in µm.
    spikes : numpy structured array, optional
        `dspk.detect_spikes`'s output (fields ``x``, ``y``, ``amplitude``). Spikes sit on
        their position, a contact: each is drawn ``jitter_um`` at random around it so that
        many stay visible.
    positions : array, optional
        ``[n, 2]`` detection positions in µm, drawn as crosses. `dspk.detect_spikes` detects
        at every contact (pass ``geometry``); Kilosort-style grids are other arrays.
    widths_um : sequence of float
        Gaussian spatial widths of the detector (its ``widths_um``), drawn as circles around
        the middle position to show the spatial scales combined.
    jitter_um : float
    max_spikes : int
        At most this many spikes drawn (the largest amplitudes last, on top).
    ax : matplotlib.axes.Axes, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import numpy as np
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from dspk import plot
    >>> g = np.stack([np.tile([0.0, 32.0], 8), np.repeat(np.arange(8) * 20.0, 2)], 1)
    >>> fig = plot.probe(g, positions=g, widths_um=(10, 30))
    >>> fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()
    ('x (µm)', 'y (µm)')
    """
    g = _geometry(geometry)
    span = np.ptp(g, axis=0) + 60.0
    height = float(np.clip(2.0 + 4.5 * span[1] / max(span), 3.5, 6.5))
    own = ax is None
    fig, ax = _axes(ax, (min(WIDTH_IN, max(4.5, height * span[0] / span[1] + 2.5)), height))
    ax.scatter(g[:, 0], g[:, 1], marker="s", s=30, facecolor="0.85", edgecolor="0.4",
               lw=0.5, label="contacts", zorder=1)
    if positions is not None:
        p = _geometry(positions)
        ax.scatter(p[:, 0], p[:, 1], marker="+", s=25, color="tab:blue", lw=0.8,
                   label="detection positions", zorder=2)
    for w in widths_um:
        c = g[len(g) // 2]
        ax.add_patch(_pyplot().Circle(c, float(w), fill=False, ls="--", lw=0.8,
                                      color="tab:blue", zorder=2))
    if widths_um:
        ax.plot([], [], ls="--", lw=0.8, color="tab:blue",
                label=f"spatial widths {', '.join(f'{w:g}' for w in widths_um)} µm")
    if spikes is not None and len(spikes):
        s = np.sort(np.asarray(spikes), order="amplitude")[-int(max_spikes):]
        rng = np.random.default_rng(0)
        xy = np.stack([s["x"], s["y"]], 1) + rng.uniform(-jitter_um, jitter_um, (len(s), 2))
        sc = ax.scatter(xy[:, 0], xy[:, 1], c=s["amplitude"], s=6, cmap="viridis", zorder=3,
                        label=f"{len(s)} spikes")
        fig.colorbar(sc, ax=ax, label="spike amplitude (noise SD)", shrink=0.85)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("x (µm)")
    ax.set_ylabel("y (µm)")
    if own:     # below the figure: a legend inside would hide the contacts at the tip
        fig.legend(loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    else:
        ax.legend(fontsize=8, framealpha=0.8)
    return fig


def waveforms(x: Any, spikes: Any, geometry: Any, fs: float, channel: int | None = None,
              n_neighbors: int = 6, max_spikes: int = 200, unit: str = "σ",
              ax: Any = None) -> Any:
    """Waveforms of the spikes of one channel, on that channel and its nearest neighbours.

    Each neighbour channel is a column placed at its position on the probe (x) and offset by
    its depth (y); every spike's 2-ms clip is drawn thin and their mean thick.

    Parameters
    ----------
    x : array
        ``[channels, samples]`` (whitened) traces the spikes were detected in.
    spikes : numpy structured array
        `dspk.detect_spikes`'s output.
    geometry : array
        ``[channels, 2]`` positions in µm.
    fs : float
        Sampling rate in Hz.
    channel : int, optional
        The peak channel whose spikes are drawn (default: the channel with most spikes).
    n_neighbors : int
        Channels drawn (the channel itself and the nearest).
    max_spikes : int
        At most this many clips drawn (the first ones in time); the mean uses them all.
    unit : str
        The traces' unit.
    ax : matplotlib.axes.Axes, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import numpy as np
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import dspk
    >>> from dspk import plot
    >>> g = np.stack([np.tile([0.0, 32.0], 8), np.repeat(np.arange(8) * 20.0, 2)], 1)
    >>> x = np.random.default_rng(0).standard_normal((16, 30000)).astype(np.float32)
    >>> x[5, 1000::3000] -= 15.0                  # 10 spikes on channel 5, weaker on 4
    >>> x[4, 1000::3000] -= 8.0
    >>> s = dspk.detect_spikes(x, g, 30000.0)
    >>> fig = plot.waveforms(x, s, g, 30000.0)
    >>> fig.axes[0].get_title()
    'spikes of channel 5 (... spikes)'
    """
    g = _geometry(geometry)
    s = np.asarray(spikes)
    if s.dtype.names is None or "channel_index" not in s.dtype.names:
        raise ValueError("spikes: expected dspk.detect_spikes's structured array")
    if len(s) == 0:
        raise ValueError("spikes: no spike to draw")
    if channel is None:
        channel = int(np.bincount(s["channel_index"]).argmax())
    mine = s[s["channel_index"] == channel]
    if len(mine) == 0:
        raise ValueError(f"channel: no spike on channel {channel}")
    clips, chans = spike_clips(x, mine, g, fs, n_neighbors=n_neighbors)
    nbr = chans[0]
    taps = clips.shape[2]
    t_ms = (np.arange(taps) - taps / 3.0) / fs * 1e3
    pos = g[nbr]
    dx = np.diff(np.unique(g[:, 0])).min() if len(np.unique(g[:, 0])) > 1 else 20.0
    dy = np.diff(np.unique(g[:, 1])).min() if len(np.unique(g[:, 1])) > 1 else 20.0
    xscale = 0.8 * dx / (t_ms[-1] - t_ms[0])              # a clip fills 80% of a column
    amp = float(np.abs(clips.mean(axis=0)).max()) or 1.0
    yscale = 1.2 * dy / amp
    fig, ax = _axes(ax, (6.5, 5.0))
    for j, c in enumerate(nbr):
        x0, y0 = pos[j]
        xs = x0 + (t_ms - t_ms[0]) * xscale - 0.4 * dx
        ax.plot(xs, y0 + clips[:max_spikes, j].T * yscale, color="0.6", lw=0.3, alpha=0.5)
        ax.plot(xs, y0 + clips[:, j].mean(axis=0) * yscale,
                color="tab:red" if c == channel else "k", lw=1.5)
        ax.text(x0 - 0.45 * dx, y0 + 0.25 * dy, str(int(c)), fontsize=8, color="0.3")
    # scale bars: 1 ms, and `amp` of the traces' unit
    bx, by = pos[:, 0].min() - 0.4 * dx, pos[:, 1].min() - 0.9 * dy
    ax.plot([bx, bx + xscale], [by, by], color="k", lw=2)
    ax.text(bx + xscale / 2, by - 0.1 * dy, "1 ms", ha="center", va="top", fontsize=8)
    bar = float(f"{amp / 2:.1g}")
    ax.plot([bx, bx], [by, by + bar * yscale], color="k", lw=2)
    ax.text(bx + 0.05 * dx, by + bar * yscale / 2, f"{bar:g} {unit}", ha="left",
            va="center", fontsize=8)
    ax.set_xlabel("x on the probe (µm); clips 2 ms wide, trough at 0.67 ms")
    ax.set_ylabel("y on the probe (µm)")
    ax.set_title(f"spikes of channel {channel} ({len(mine)} spikes)")
    return fig


def features(feats: Any, labels: Any = None, dims: tuple = (0, 1), channel: int = 0,
             label_name: str = "label", ax: Any = None) -> Any:
    """A scatter of two PCA features of the spikes.

    Parameters
    ----------
    feats : array
        ``[n_spikes, n_components]`` or `dspk.spike_features`'s
        ``[n_spikes, n_neighbors, n_components]`` (then ``channel`` picks the neighbour: 0 is
        each spike's own channel).
    labels : array, optional
        ``[n_spikes]`` integer labels (units, templates, shanks) as colours.
    dims : tuple of 2 int
        The components drawn.
    channel : int
        The neighbour of 3-D features.
    label_name : str
        The legend's title: what the labels are.
    ax : matplotlib.axes.Axes, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import numpy as np
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from dspk import plot
    >>> f = np.random.default_rng(0).standard_normal((100, 3))
    >>> fig = plot.features(f, labels=np.arange(100) % 2)
    >>> fig.axes[0].get_xlabel()
    'PC 1'
    """
    f = np.asarray(to_numpy(feats), dtype=np.float64)
    if f.ndim == 3:
        if not 0 <= channel < f.shape[1]:
            raise ValueError(f"channel: expected a neighbour in [0, {f.shape[1]}), got "
                             f"{channel}")
        f = f[:, channel]
    if f.ndim != 2 or len(f) == 0:
        raise ValueError(f"feats: expected [n_spikes, n_components] (or [n_spikes, "
                         f"n_neighbors, n_components]), got shape {np.shape(feats)}")
    i, j = dims
    if not (0 <= i < f.shape[1] and 0 <= j < f.shape[1]):
        raise ValueError(f"dims: expected components in [0, {f.shape[1]}), got {dims}")
    fig, ax = _axes(ax, (5.5, 4.5))
    if labels is None:
        ax.scatter(f[:, i], f[:, j], s=4, color="k", alpha=0.5)
    else:
        lab = np.asarray(to_numpy(labels))
        if lab.shape != (len(f),):
            raise ValueError(f"labels: expected one label per spike ({len(f)}), got shape "
                             f"{lab.shape}")
        for v in np.unique(lab):
            m = lab == v
            ax.scatter(f[m, i], f[m, j], s=4, alpha=0.6, label=str(v))
        ax.legend(title=label_name, fontsize=8, markerscale=3)
    ax.set_xlabel(f"PC {i + 1}")
    ax.set_ylabel(f"PC {j + 1}")
    ax.set_title(f"spike features ({len(f)} spikes)")
    return fig


def _spike_times_depths(spikes: Any, fs: float | None) -> tuple:
    """(times s, depths µm, amplitudes) of a structured array or mapping of spikes."""
    names = getattr(getattr(spikes, "dtype", None), "names", None) or \
        (list(spikes.keys()) if hasattr(spikes, "keys") else [])
    if "y" not in names:
        raise ValueError("spikes: expected each spike's depth 'y' (and 'time_s', or "
                         "'sample_index' with fs)")
    if "time_s" in names:
        t = np.asarray(to_numpy(spikes["time_s"]), np.float64)
    elif "sample_index" in names and fs is not None and fs > 0:
        t = np.asarray(to_numpy(spikes["sample_index"]), np.float64) / fs
    else:
        raise ValueError("spikes: their times are 'sample_index': pass fs (Hz), or give "
                         "'time_s'")
    y = np.asarray(to_numpy(spikes["y"]), np.float64)
    a = np.asarray(to_numpy(spikes["amplitude"]), np.float64) if "amplitude" in names \
        else np.ones_like(y)
    return t, y, np.abs(a)


def motion(m: Any, spikes: Any = None, fs: float | None = None, shank: int = 0,
           max_spikes: int = 100000, axes: Any = None) -> Any:
    """A drift estimate over the spike raster: left, the spikes (time against depth, the
    larger amplitudes darker) with the estimate drawn through them — each spatial bin's depth
    plus its displacement, so the lines follow the units' drift; right, the displacement of
    each spatial bin against time.

    Parameters
    ----------
    m : dspk.motion.Motion
        The estimate (`dspk.motion.estimate`, or a fitted ``Motion`` step's
        ``Motion.from_state(pipeline.states[k])``).
    spikes : numpy structured array or mapping, optional
        ``y`` (depth, µm), ``time_s`` or ``sample_index`` (with ``fs``), ``amplitude``
        (optional): the spikes the estimate was made from, or any detected on the recording.
    fs : float, optional
        Sampling rate of ``sample_index``.
    shank : int
        The shank drawn (0, 1, ...: the motion's ``bin_shanks``).
    max_spikes : int
        At most this many spikes drawn (a random subset, seeded).
    axes : sequence of 2 matplotlib Axes, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import numpy as np
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from dspk import plot
    >>> from dspk.motion import Motion
    >>> m = Motion([0.0, 2.0, 4.0, 6.0], [100.0, 300.0], [[0, 0], [3, 1], [6, 2]])
    >>> t = np.random.default_rng(0).uniform(0, 6, 500)
    >>> fig = plot.motion(m, {"time_s": t, "y": 200 + 2 * t})
    >>> [ax.get_ylabel() for ax in fig.axes]
    ['depth (µm)', 'displacement (µm)']
    """
    if not isinstance(m, Motion):
        raise TypeError(f"m: expected a dspk.motion.Motion, got {type(m).__name__}")
    bins = np.flatnonzero(m.bin_shanks == shank)
    if bins.size == 0:
        raise ValueError(f"shank: the motion has no spatial bin on shank {shank} (shanks "
                         f"{m.shanks.tolist()})")
    fig, (ax0, ax1) = _two_axes(axes, (WIDTH_IN, 5.0), sharex=True)
    if spikes is not None:
        t, y, a = _spike_times_depths(spikes, fs)
        if len(t) > max_spikes:
            keep = np.sort(np.random.default_rng(0).choice(len(t), int(max_spikes),
                                                           replace=False))
            t, y, a = t[keep], y[keep], a[keep]
        order = np.argsort(a)
        ax0.scatter(t[order], y[order], c=a[order], s=1.5, cmap="Greys", lw=0,
                    vmin=0, vmax=float(np.quantile(a, 0.95)) if len(a) else 1.0,
                    rasterized=True)
    tc = m.time_centres_s
    depths = m.depths_um[bins]
    if len(bins) == 1 and m.geometry is not None:      # rigid: a few depths of the shank
        on = m.geometry[m.channel_shanks == shank, 1]
        depths = np.linspace(on.min(), on.max(), 6)[1:-1]
    colors = _pyplot().cm.viridis(np.linspace(0, 0.9, max(len(bins), len(depths))))
    for k, d in enumerate(depths):
        shift = m.displacement_at(tc, d, shank)
        ax0.plot(tc, d + shift, color=colors[k], lw=1.2)
    for k, j in enumerate(bins):
        ax1.plot(tc, m.displacement[:, j], color=colors[k], lw=1.2,
                 label=f"{m.depths_um[j]:.0f} µm")
    ax0.set_xlabel("time (s)")
    ax0.set_ylabel("depth (µm)")
    ax0.set_title("spikes and the estimate through them", fontsize=10)
    ax1.set_xlabel("time (s)")
    ax1.set_ylabel("displacement (µm)")
    kind = "rigid" if len(bins) == 1 else f"{len(bins)} windows along depth"
    ax1.set_title(f"displacement ({kind})", fontsize=10)
    if 1 < len(bins) <= 12:
        ax1.legend(fontsize=8, title="window", title_fontsize=8, framealpha=0.8)
    ax0.set_xlim(m.time_edges_s[0], m.time_edges_s[-1])
    return fig


def tuner_timings(explanation: Any, ax: Any = None) -> Any:
    """The tuner's measured time of every candidate for one product, the chosen one marked.

    Parameters
    ----------
    explanation : dspk.linalg.Explanation
        ``dspk.explain(a, b)`` after the product has been tuned (a choice read from the cache
        keeps its measured timings; one made with ``DSPK_TUNE=off`` has none).
    ax : matplotlib.axes.Axes, optional

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        When the choice has no measured timings.

    Examples
    --------
    >>> import numpy as np
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import dspk
    >>> from dspk import plot
    >>> x = np.random.default_rng(0).standard_normal((16, 2000)).astype(np.float32)
    >>> c = dspk.matmul(x, x.T)                     # tuned on first sight
    >>> fig = plot.tuner_timings(dspk.explain(x, x.T))
    >>> fig.axes[0].get_xlabel()
    'median time per call (ms)'
    """
    choice = explanation.choice
    timings = dict(choice.timings_ms or {})
    if not timings:
        raise ValueError(f"explanation: the choice for {choice.key} has no measured timings "
                         f"({choice.source}); tune it (DSPK_TUNE=on) first")
    names = sorted(timings, key=timings.get, reverse=True)
    chosen = explanation.candidate
    height, size = _bar_layout(len(names), 0.35)
    fig, ax = _axes(ax, (WIDTH_IN * 0.8, height))
    colors = ["tab:orange" if n == chosen else "tab:gray" for n in names]
    ax.barh(names, [timings[n] for n in names], color=colors)
    ax.tick_params(axis="y", labelsize=size)
    for k, n in enumerate(names):
        ax.text(timings[n], k, f" {timings[n]:.3g}", va="center", fontsize=size)
    ax.set_xlabel("median time per call (ms)")
    ax.set_title(f"tuner: {explanation.shape[1]}x{explanation.shape[3]} · "
                 f"{explanation.shape[3]}x{explanation.shape[2]}, chosen {chosen} (orange)",
                 fontsize=10)
    ax.set_xlim(0, max(timings.values()) * 1.2)
    return fig


def load_results(path: str | PathLike) -> dict:
    """A benchmark's results (``benchmarks/results/*.json``, written by ``benchmarks/``).

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    dict
        With ``rows`` (one dict per measurement), ``env`` and ``notes``.

    Examples
    --------
    >>> import json, tempfile, pathlib
    >>> from dspk import plot
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "bench.json"
    >>> _ = p.write_text(json.dumps({"rows": [{"case": "a", "impl": "x", "ms": 1.0}]}))
    >>> plot.load_results(p)["rows"][0]["impl"]
    'x'
    """
    d = json.loads(Path(path).read_text())
    if not isinstance(d, dict) or not isinstance(d.get("rows"), list):
        raise ValueError(f"path: {path} is not a benchmark result (a JSON object with 'rows')")
    return d


_VALUE_KEYS = (("median_ms", "time (ms), median"), ("ms", "time (ms)"),
               ("xrt", "× real time (higher is faster)"), ("wall_s", "wall time (s)"))
_SERIES_KEYS = ("impl", "what")


def benchmark_bars(results: Any, case: str | None = None, value: str | None = None,
                   log: bool | None = None, ax: Any = None) -> Any:
    """The rows of one benchmark case as horizontal bars, dspk's rows highlighted.

    Parameters
    ----------
    results : dict or path
        `load_results`'s dict, or the path of a ``benchmarks/results/*.json`` file.
    case : str, optional
        Rows whose ``case`` is this (default: every row, each labelled ``case: impl``).
    value : str, optional
        The measurement drawn (default: the first of ``median_ms``, ``ms``, ``xrt``,
        ``wall_s`` that the rows have).
    log : bool, optional
        Logarithmic axis (default: when the values span more than 30×).
    ax : matplotlib.axes.Axes, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from dspk import plot
    >>> rows = [{"case": "cov", "impl": "dspk.matmul", "ms": 0.26},
    ...         {"case": "cov", "impl": "cupy.cov", "ms": 0.66}]
    >>> fig = plot.benchmark_bars({"rows": rows}, case="cov")
    >>> fig.axes[0].get_xlabel()
    'time (ms)'
    """
    d = load_results(results) if isinstance(results, (str, PathLike)) else results
    rows = [r for r in d["rows"] if case is None or r.get("case") == case]
    if not rows:
        cases = sorted({str(r.get("case")) for r in d["rows"]})
        raise ValueError(f"case: no row of case {case!r}; the cases are {cases}")
    if value is None:
        value = next((k for k, _ in _VALUE_KEYS if all(r.get(k) is not None for r in rows)),
                     None)
        if value is None:
            raise ValueError("value: the rows have none of "
                             f"{[k for k, _ in _VALUE_KEYS]}; name the key to draw")
    rows = [r for r in rows if isinstance(r.get(value), (int, float))]
    if not rows:
        raise ValueError(f"value: no row has a number under {value!r}")
    series = next((k for k in _SERIES_KEYS if all(k in r for r in rows)), None)

    def name(r: dict) -> str:
        what = str(r[series]) if series else ""
        return what if case is not None else f"{r.get('case')}: {what}"

    names = [name(r) for r in rows]
    vals = np.array([float(r[value]) for r in rows])
    height, size = _bar_layout(len(rows), 0.32)
    fig, ax = _axes(ax, (WIDTH_IN, height))
    colors = ["tab:orange" if n.split(": ")[-1].startswith("dspk") else "tab:gray"
              for n in names]
    ypos = np.arange(len(rows))[::-1]
    ax.barh(ypos, vals, color=colors)
    ax.set_yticks(ypos, [n if len(n) <= 60 else n[:57] + "..." for n in names], fontsize=size)
    for y, v in zip(ypos, vals):
        ax.text(v, y, f" {v:.3g}", va="center", fontsize=size)
    if log is None:
        log = vals.min() > 0 and vals.max() / vals.min() > 30
    if log:
        ax.set_xscale("log")
        ax.set_xlim(vals.min() / 1.5, vals.max() * 3)
    else:
        ax.set_xlim(0, vals.max() * 1.2)
    ax.set_xlabel(dict(_VALUE_KEYS).get(value, value))
    gpu = d.get("env", {}).get("gpu")
    # a case names its data and the card its model: together they outgrow the axes' width
    title = (case or "benchmark") + (f" ({gpu})" if gpu else "") + "; dspk in orange"
    ax.set_title(textwrap.fill(title, TITLE_CHARS), fontsize=10)
    return fig
