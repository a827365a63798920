"""Stimulation (electrical, optogenetic) artefacts removed from [channels, samples] traces
around known trigger samples, as SpikeInterface's ``remove_artifacts`` does: the window
around each trigger set to zero, bridged by a linear or cubic interpolation through the
samples around it, or the artefact's average or median shape (per trigger label)
subtracted.

The interpolating modes' fill is a linear function of a few fit values (medians of 4-5
samples at fit points before and after the window), so it is computed as a small matrix of
weights (the interpolant of each unit fit value at the window's samples: SciPy's
``interp1d``, as the reference builds its interpolant) times the fit values: the same
numbers on NumPy and CuPy, with only the fit values and the fill crossing to and from the
host for CuPy input.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..argnames import arg
from ..finite import api, check_finite
from ._checks import traces

__all__ = ["remove_artifacts", "artifact_templates", "artifact_window", "artifact_reach",
           "ARTIFACT_MODES"]

#: the modes, SpikeInterface's
ARTIFACT_MODES = ("zeros", "linear", "cubic", "average", "median")


def artifact_window(ms_before: float | None, ms_after: float | None,
                    fs: float) -> tuple[int, int] | None:
    """The samples removed before and after each trigger: ``(int(ms_before·fs/1000),
    int(ms_after·fs/1000))`` (truncated, as SpikeInterface's ``remove_artifacts`` and
    ``ms_to_samples`` do); None when both are None (a single sample, the trigger's).

    Parameters
    ----------
    ms_before, ms_after : float or None
        Milliseconds, >= 0 (both None, or neither).
    fs : float
        The sampling rate in Hz.

    Returns
    -------
    tuple of int or None

    Raises
    ------
    ValueError
        A negative or non-finite time, one None and not the other, a bad ``fs``.

    Examples
    --------
    >>> from dspk.ops import artifact_window
    >>> artifact_window(0.5, 3.0, 30000.0)
    (15, 90)
    >>> artifact_window(None, None, 30000.0) is None
    True
    """
    rate = _positive("fs", fs)
    if ms_before is None or ms_after is None:
        if ms_before is not None or ms_after is not None:
            raise ValueError(f"ms_before, ms_after: both None (remove the trigger's sample "
                             f"alone) or both times in ms, got {ms_before!r}, {ms_after!r}")
        return None
    before, after = (_non_negative(name, v) for name, v in
                     (("ms_before", ms_before), ("ms_after", ms_after)))
    return int(before * rate / 1000.0), int(after * rate / 1000.0)


def _positive(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a positive number, got {value!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}")
    return v


def _non_negative(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a time in ms, got {value!r}") from None
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{name}: expected a finite time >= 0 ms, got {value!r}")
    return v


def _fit_interval(spacing_ms: Any, fs: float) -> int:
    v = _positive("fit_sample_spacing", spacing_ms)
    interval = int(v * fs / 1000.0)
    if interval < 1:
        raise ValueError(f"fit_sample_spacing: {v!r} ms is less than one sample at "
                         f"{fs:g} Hz; pass {arg('fit_sample_spacing')}{1000.0 / fs:.3g} or more")
    return interval


def artifact_reach(ms_before: float | None, ms_after: float | None, mode: str, fs: float,
                   fit_sample_spacing: float = 1.0) -> int:
    """Samples of context a block needs on each side for `remove_artifacts` of its inner
    samples to equal the one-shot result (streaming): the window plus the fit points and
    their medians for ``linear`` and ``cubic``; none for the other modes (their output at a
    sample depends on that sample and the triggers alone).

    Parameters
    ----------
    ms_before, ms_after, mode, fs, fit_sample_spacing :
        As for `remove_artifacts`.

    Returns
    -------
    int

    Examples
    --------
    >>> from dspk.ops import artifact_reach
    >>> artifact_reach(0.5, 3.0, "linear", 30000.0), artifact_reach(0.5, 3.0, "zeros", 3e4)
    (168, 0)
    """
    _check_mode(mode)
    pad = artifact_window(ms_before, ms_after, fs)
    if mode not in ("linear", "cubic"):
        return 0
    before, after = (0, 0) if pad is None else pad
    # a sample of the window is at most before + after from the window's ends, from which
    # the fit points reach 2 intervals, their median windows 2 (3 at the nearest) more
    return before + after + 2 * _fit_interval(fit_sample_spacing, fs) + 3


def _check_mode(mode: str) -> None:
    if mode not in ARTIFACT_MODES:
        raise ValueError(f"mode: expected one of {', '.join(map(repr, ARTIFACT_MODES))}, got "
                         f"{mode!r}")


def _check_samples(samples: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    s = samples.get() if hasattr(samples, "get") else samples
    s = np.asarray(s)
    if s.ndim != 1 or (s.size and s.dtype.kind not in "iu"):
        if s.ndim == 1 and s.dtype.kind == "f" and np.all(s == np.round(s)):
            s = s.astype(np.int64)
        else:
            raise ValueError(f"samples: expected a 1-D array of trigger sample indices "
                             f"(integers), got {s.dtype} of shape {s.shape}")
    s = s.astype(np.int64)
    if labels is None:
        lab = np.zeros(s.size, dtype=np.int64)
    else:
        lab = np.asarray(labels.get() if hasattr(labels, "get") else labels)
        if lab.shape != s.shape:
            raise ValueError(f"labels: expected one label per trigger ({s.size}), got shape "
                             f"{lab.shape}")
    return s, lab


def artifact_templates(x: Any, samples: Any, ms_before: float, ms_after: float, *, fs: float,
                       labels: Any = None, operator: str = "average",
                       start: int = 0) -> tuple[np.ndarray, Any]:
    """The artefact's shape per trigger label: the mean (``"average"``) or median of the
    windows ``x[:, t − before : t + after]`` of its triggers (`artifact_window`), as
    SpikeInterface's ``remove_artifacts`` estimates them (``estimate_templates``): a
    window that reaches past x's ends is zero there.

    Parameters
    ----------
    x : array
        [channels, samples], float32 or float64 (NumPy or CuPy).
    samples : array-like of int
        Trigger samples (in x's samples, or offset by ``start``); triggers outside x are
        left out.
    ms_before, ms_after : float
        The window in ms (not None).
    fs : float
        Sampling rate in Hz.
    labels : array-like, optional
        One label per trigger (default: one label, 0).
    operator : {"average", "median"}
    start : int
        The sample (in the triggers' numbering) of x[:, 0].

    Returns
    -------
    labels : numpy.ndarray
        The distinct labels of the triggers inside x, sorted.
    templates : array
        [labels, channels, before + after] in x's dtype and array type.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import artifact_templates
    >>> x = np.zeros((1, 100), np.float32)
    >>> x[0, [20, 60]] = [1.0, 3.0]
    >>> lab, tpl = artifact_templates(x, [20, 60], 0.1, 0.2, fs=10000.0)   # 1 + 2 samples
    >>> lab, tpl
    (array([0]), array([[[0., 2., 0.]]], dtype=float32))
    """
    xp = traces(x)
    if operator not in ("average", "median"):
        raise ValueError(f"operator: expected 'average' or 'median', got {operator!r}")
    pad = artifact_window(ms_before, ms_after, fs)
    if pad is None:
        raise ValueError("ms_before, ms_after: the average and median modes need a window "
                         "in ms, not None")
    before, after = pad
    s, lab = _check_samples(samples, labels)
    rel = s - int(start)
    n = x.shape[1]
    keep = (rel >= 0) & (rel < n)
    rel, lab = rel[keep], lab[keep]
    names = np.unique(lab)
    length = before + after
    out = xp.zeros((len(names), x.shape[0], length), dtype=x.dtype)
    for k, name in enumerate(names):
        ts = rel[lab == name]
        windows = xp.zeros((len(ts), x.shape[0], length), dtype=x.dtype)
        for j, t in enumerate(ts.tolist()):
            a, b = max(0, t - before), min(n, t + after)
            windows[j, :, a - (t - before):b - (t - before)] = x[:, a:b]
        if len(ts) == 0:
            continue
        if operator == "average":
            out[k] = windows.astype(np.float64).mean(axis=0).astype(x.dtype)
        else:
            out[k] = xp.median(windows, axis=0)
    return names, out


@api
def remove_artifacts(x: Any, samples: Any, ms_before: float | None = 0.5,
                     ms_after: float | None = 3.0, mode: str = "zeros", *, fs: float,
                     labels: Any = None, fit_sample_spacing: float = 1.0,
                     templates: Any = None, start: int = 0) -> Any:
    """Remove stimulation artefacts around trigger samples: SpikeInterface's
    ``remove_artifacts(recording, list_triggers=[samples], ms_before, ms_after, mode,
    fit_sample_spacing, list_labels=[labels])`` (spikeinterface.preprocessing, version
    0.105), on an array.

    The window of trigger t is its samples ``t − before .. t + after`` (`artifact_window`;
    ``before = int(ms_before·fs/1000)``), or the trigger's sample alone when both times are
    None. Each mode, as the reference computes it:

    - ``"zeros"``: the window (inclusive of ``t + after``) set to 0; for traces centred on
      zero (high-passed).
    - ``"linear"`` / ``"cubic"``: the window replaced by the linear interpolation / cubic
      spline (not-a-knot, SciPy's ``interp1d``) through fit values at the fit points
      ``t − before − 1 − {2I, I, 0}`` and ``t + after + 1 + {0, I, 2I}`` (I =
      ``int(fit_sample_spacing·fs/1000)`` samples), each the median of the 5 samples around
      it (of 4 toward the window for the nearest two), extrapolated past them; where x ends
      too close for enough fit points (2 linear, 5 cubic), the sample nearest the window on
      the side with more points fills it. Triggers are processed in the order given, each
      on the traces the earlier ones left (as the reference).
    - ``"average"`` / ``"median"``: the mean / median artefact of the triggers of each
      label (`artifact_templates`, on x itself unless ``templates`` are given) subtracted
      over ``t − before .. t + after − 1`` (the reference's window for these modes: one
      sample shorter).

    Where this differs from the reference: a window that reaches x's first sample is zeroed
    through ``t + after`` in ``"zeros"`` mode, as everywhere else (the reference stops one
    sample short there, and at the start of each chunk it is given); the reference's
    ``time_jitter``, ``scale_amplitude``, ``sparsity`` are not offered; its
    ``artifacts`` are ``templates`` here; its templates are float32 whatever the traces
    (here float64, then x's dtype: float64 results differ from the reference's by ~1e-7 of
    the artefact's amplitude).

    Parameters
    ----------
    x : array
        [channels, samples], float32 or float64 (NumPy or CuPy). Not modified.
    samples : array-like of int
        Trigger samples in x's numbering (shifted by ``start``); a trigger whose window
        reaches into x counts even when it lies outside.
    ms_before, ms_after : float or None
        The window before and after each trigger in ms (default 0.5 and 3.0, the
        reference's); both None: the trigger's sample alone (not for "average"/"median").
    mode : {"zeros", "linear", "cubic", "average", "median"}
    fs : float
        The sampling rate in Hz (keyword).
    labels : array-like, optional
        One label per trigger: "average"/"median" estimate and subtract one artefact per
        label (default: all triggers share one).
    fit_sample_spacing : float
        The fit points' spacing in ms ("linear", "cubic"; the reference's default 1.0).
    templates : tuple (labels, array), optional
        "average"/"median": the artefacts to subtract, as `artifact_templates` returns them
        ([labels, channels, before + after]); default: estimated on x.
    start : int
        The sample (in the triggers' numbering) of x[:, 0]: for blocks of a longer
        recording, with `artifact_reach` samples of context on each side the inner samples
        equal the one-shot result (when triggers of the interpolating modes are further
        apart than that reach: closer ones chain, each fill reading the previous one's).

    Returns
    -------
    array
        A new array of x's shape, dtype and array type.

    Raises
    ------
    ValueError
        An unknown mode, a bad window, spacing or ``fs``, samples that are not integers,
        labels of another length, templates of another shape or missing a label.
    TypeError
        x not a float32/float64 NumPy or CuPy array.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.ops import remove_artifacts
    >>> x = np.ones((1, 12), np.float32)
    >>> x[0, 5:7] = 100.0                                  # a 2-sample artefact at 5
    >>> remove_artifacts(x, [5], 0.0, 1.0, "zeros", fs=1000.0)
    array([[1., 1., 1., 1., 1., 0., 0., 1., 1., 1., 1., 1.]], dtype=float32)
    >>> y = np.full((1, 60), 2.0)                           # a baseline, broken at 20..28
    >>> y[0, 20:29] = -50.0
    >>> remove_artifacts(y, [24], 4.0, 4.0, "linear", fs=1000.0, fit_sample_spacing=3.0)[0, 18:31]
    array([2., 2., 2., 2., 2., 2., 2., 2., 2., 2., 2., 2., 2.])
    """
    xp = traces(x)
    check_finite(x, "x")
    _check_mode(mode)
    rate = _positive("fs", fs)
    pad = artifact_window(ms_before, ms_after, rate)
    s, lab = _check_samples(samples, labels)
    n = x.shape[1]
    rel = s - int(start)
    before, after = (0, 0) if pad is None else pad
    # the triggers whose windows reach into x (the reference's selection)
    keep = (rel >= -after) & (rel < n + before)
    rel, lab = rel[keep], lab[keep]
    out = x.copy()
    if mode == "zeros":
        for t in rel.tolist():
            out[:, max(0, t - before):max(0, min(n, t + after + 1))] = 0
        return out
    if mode in ("linear", "cubic"):
        interval = _fit_interval(fit_sample_spacing, rate)
        for t in rel.tolist():
            _interpolate(xp, out, t, before, after, interval, mode)
        return out
    if pad is None:
        raise ValueError(f"ms_before, ms_after: mode {mode!r} needs a window in ms, not None")
    if templates is None:
        names, tpl = artifact_templates(x, s, ms_before, ms_after, fs=rate, labels=labels,
                                        operator=mode, start=start)
    else:
        names, tpl = _check_templates(templates, x, before + after)
    index = {_key(v): k for k, v in enumerate(np.asarray(names).tolist())}
    for t, name in zip(rel.tolist(), lab.tolist()):
        k = index.get(_key(name))
        if k is None:
            raise ValueError(f"templates: no artefact for label {name!r} (labels: "
                             f"{list(index)})")
        a, b = max(0, t - before), min(n, t + after)
        if b > a:
            out[:, a:b] -= tpl[k][:, a - (t - before):b - (t - before)]
    return out


def _key(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


def _check_templates(templates: Any, x: Any, length: int) -> tuple:
    try:
        names, tpl = templates
    except (TypeError, ValueError):
        raise ValueError("templates: expected (labels, [labels, channels, samples] array) "
                         "as artifact_templates returns") from None
    xp = traces(x)
    tpl = xp.asarray(tpl, dtype=x.dtype)
    names = np.asarray(names)
    if tpl.shape != (len(names), x.shape[0], length):
        raise ValueError(f"templates: expected shape ({len(names)}, {x.shape[0]}, {length}) "
                         f"(labels, channels, window), got {tpl.shape}")
    return names, tpl


def _fit_weights(points: np.ndarray, gap: np.ndarray, kind: str) -> np.ndarray:
    """[gap, points]: the interpolant (SciPy's interp1d of ``kind``, extrapolating) of each
    unit value at ``points``, evaluated at ``gap``; fill = weights @ values."""
    from scipy.interpolate import interp1d  # noqa: PLC0415 (slow import: when used)

    f = interp1d(points.astype(np.float64), np.eye(len(points)), kind=kind, axis=0,
                 bounds_error=False, fill_value="extrapolate")
    return np.asarray(f(gap.astype(np.float64)), dtype=np.float64)


def _interpolate(xp: Any, out: Any, t: int, before: int, after: int, interval: int,
                 mode: str) -> None:
    """One trigger of the interpolating modes, in place (the reference's steps)."""
    n = out.shape[1]
    pre_end, post_start = t - before - 1, t + after + 1
    offsets = np.arange(0, 2 * interval + 1, interval)
    pre = pre_end - offsets[::-1]
    post = post_start + offsets
    gap = np.arange(pre_end + 1, post_start)
    gap = gap[(gap >= 0) & (gap < n)]
    if gap.size == 0:
        return
    pre = pre[pre >= 0]
    post = post[post < n]
    points = np.concatenate([pre, post])
    need = 5 if mode == "cubic" else 2
    if len(points) >= need:
        # each fit value: the median of the samples around its point (4 toward the window
        # for the nearest points, 5 for the others), the indices inside x
        wins = []
        for p in pre.tolist():
            lo, hi = (p - 3, p + 1) if p == pre[-1] else (p - 2, p + 3)
            wins.append((max(lo, 0), hi))
        for q in post.tolist():
            lo, hi = (q, q + 4) if q == post[0] else (q - 2, q + 3)
            wins.append((lo, min(hi, n)))
        values = xp.stack([xp.median(out[:, a:b], axis=1) for a, b in wins])   # [k, C]
        w = _fit_weights(points, gap, mode)
        host = values.get() if xp is not np else values
        fill = w @ host.astype(np.float64)                                   # [gap, C]
        out[:, int(gap[0]):int(gap[-1]) + 1] = xp.asarray(fill.T.astype(out.dtype))
        return
    if len(pre) > len(post) or (len(pre) == len(post) and len(points) > 0):
        src = int(pre[-1])
    elif len(post) > len(pre):
        src = int(post[0])
    else:
        out[:, int(gap[0]):int(gap[-1]) + 1] = 0
        return
    out[:, int(gap[0]):int(gap[-1]) + 1] = out[:, src:src + 1]
