"""`RemoveArtifacts`: stimulation (electrical, optogenetic) artefacts removed around trigger
samples (`dspk.ops.remove_artifacts`, SpikeInterface's ``remove_artifacts``), the triggers
read from a CSV file or decoded from the recording's sync channel (`dspk.io.sync_events`)."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...argnames import arg
from ...io import sync_events
from ...ops import ARTIFACT_MODES, artifact_reach, artifact_window, remove_artifacts
from ..errors import PipelineError
from ..registry import Option, register
from ..stage import Context, FitBlocks, Step
from .common import _not_fitted, log

__all__ = ["RemoveArtifacts", "read_triggers", "DEFAULT_ARTIFACT_WINDOW_MS"]

#: SpikeInterface's default window: 0.5 ms before and 3 ms after each trigger
DEFAULT_ARTIFACT_WINDOW_MS = (0.5, 3.0)


def read_triggers(path: str, fs: float) -> tuple[np.ndarray, np.ndarray]:
    """Trigger samples (and labels) from a CSV file: a header row naming a ``sample`` column
    (sample numbers of the recording file) or a ``time`` column (seconds from its first
    sample, rounded to the nearest sample), and optionally a ``label`` column (integers, or
    any text: numbered in sorted order); a file of one column without a header is samples.

    Parameters
    ----------
    path : str
    fs : float
        The recording's sampling rate (for times).

    Returns
    -------
    samples : numpy.ndarray
        int64, in the file's order.
    labels : numpy.ndarray
        int64 (0 without a label column).

    Raises
    ------
    PipelineError
        No such file, no ``sample``/``time`` column, a value that is not a number or a
        whole sample.

    Examples
    --------
    >>> import os, tempfile
    >>> from dspk.pipeline.steps.artifacts import read_triggers
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "stim.csv")
    >>> _ = open(path, "w").write("time,label\\n0.5,laser\\n1.25,puff\\n2.0,laser\\n")
    >>> read_triggers(path, 30000.0)
    (array([15000, 37500, 60000]), array([0, 1, 0]))
    >>> tmp.cleanup()
    """
    where = arg("artifacts", path)
    if not os.path.isfile(path):
        raise PipelineError(f"{where}: no such file (a CSV of trigger samples or times, or "
                            f"sync:BIT for the sync channel's bit)")
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.reader(f) if r and any(c.strip() for c in r)]
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    head = [c.strip().lower() for c in rows[0]]
    if len(head) == 1 and _number(head[0]) is not None:
        head, body = ["sample"], rows              # one column of samples, no header
    else:
        body = rows[1:]
    col = "sample" if "sample" in head else "time" if "time" in head else None
    if col is None:
        raise PipelineError(f"{where}: expected a 'sample' or 'time' column in its header, "
                            f"got {rows[0]}")
    i = head.index(col)
    values = []
    for k, r in enumerate(body):
        v = _number(r[i] if i < len(r) else "")
        if v is None:
            raise PipelineError(f"{where}: row {k + 2}: {col} {r[i] if i < len(r) else ''!r}"
                                f" is not a number")
        values.append(v)
    v = np.asarray(values, dtype=np.float64)
    if col == "time":
        samples = np.round(v * fs).astype(np.int64)
    else:
        if np.any(v != np.round(v)):
            raise PipelineError(f"{where}: samples must be whole numbers")
        samples = v.astype(np.int64)
    if "label" not in head:
        return samples, np.zeros(len(samples), np.int64)
    j = head.index("label")
    raw = [r[j].strip() if j < len(r) else "" for r in body]
    try:
        labels = np.asarray([int(t) for t in raw], dtype=np.int64)
    except ValueError:
        names = sorted(set(raw))
        labels = np.asarray([names.index(t) for t in raw], dtype=np.int64)
    return samples, labels


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


@dataclass
class RemoveArtifacts(Step):
    """Stimulation artefacts removed around trigger samples (`dspk.ops.remove_artifacts`:
    SpikeInterface's ``remove_artifacts`` with its modes ``zeros``, ``linear``, ``cubic``,
    ``average``, ``median``).

    The triggers come from ``source``: a CSV file (`read_triggers`: samples or times of the
    recording file, optional labels) or ``"sync:BIT"``, the rising edges of that bit of the
    recording's sync channel (`dspk.io.sync_events`: a SpikeGLX imec SY word, bit 6 its sync
    input; NI-DAQ digital words as 16·word + bit). They are the step's fitted state
    (``"samples"``, ``"labels"``, sorted by sample), read when the pipeline is fitted; for
    ``average`` and ``median`` also each label's artefact (``"template_labels"``,
    ``"templates"`` [labels, channels, window]), estimated on a pass over the whole recording
    through the steps before this one (SpikeInterface estimates it over every trigger too).

    The step runs before the phase shift and the filters (after the saturation blanking), so
    that the artefact is removed before a filter spreads it beyond its window; ``zeros``
    assumes traces centred on zero (SpikeInterface's advice: high-passed, as Neuropixels 1.0
    AP streams are in hardware), ``linear``/``cubic`` bridge the window on any traces. Chunks
    get ``artifact_reach`` samples of context, so the output does not depend on the chunk
    size, except where two triggers' windows and fit points overlap under the interpolating
    modes (each fill then reads the previous one's, as SpikeInterface's; the fit warns).

    Parameters
    ----------
    source : str
        ``"PATH.csv"`` or ``"sync:BIT"``.
    ms_before, ms_after : float
        The window around each trigger in ms (default 0.5 and 3.0).
    mode : {"zeros", "linear", "cubic", "average", "median"}
    fit_sample_spacing : float
        The fit points' spacing in ms (``linear``, ``cubic``).

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, dspk
    >>> from dspk.pipeline import Pipeline, RemoveArtifacts
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "stim.csv")
    >>> _ = open(path, "w").write("sample\\n100\\n200\\n")
    >>> x = np.ones((2, 400), np.float32)
    >>> x[:, 100:104] = x[:, 200:204] = 500.0               # two 4-sample artefacts
    >>> rec = dspk.open_recording(x, fs=1000.0)
    >>> p = Pipeline([RemoveArtifacts(path, 0.0, 3.0, "linear")]).fit(rec)
    >>> p.states[0]["samples"], float(p.transform(x).max())
    (array([100, 200]), 1.0)
    >>> tmp.cleanup()
    """
    source: str = ""
    ms_before: float = DEFAULT_ARTIFACT_WINDOW_MS[0]
    ms_after: float = DEFAULT_ARTIFACT_WINDOW_MS[1]
    mode: str = "zeros"
    fit_sample_spacing: float = 1.0

    @property
    def reads_blocks(self) -> bool:                   # type: ignore[override]
        """Only ``average``/``median`` read the recording (their pass); the triggers come
        from a file or the sync words."""
        return self._templated

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise PipelineError(f"{arg('artifacts')}: expected a CSV file of triggers or "
                                f"sync:BIT, got {self.source!r}")
        if self.mode not in ARTIFACT_MODES:
            raise PipelineError(f"{arg('artifact_mode')}: expected one of "
                                f"{', '.join(ARTIFACT_MODES)}, got {self.mode!r}")
        try:
            artifact_window(self.ms_before, self.ms_after, 1000.0)
            artifact_reach(self.ms_before, self.ms_after, self.mode, 1e6,
                           self.fit_sample_spacing)
        except (TypeError, ValueError) as e:
            raise PipelineError(f"{arg('artifact_window')}: {e}") from None
        self._sync_bit()

    def _sync_bit(self) -> int | None:
        """The bit of ``sync:BIT`` (None for a file)."""
        if not self.source.lower().startswith("sync:"):
            return None
        text = self.source[5:].strip()
        if not text.isdigit():
            raise PipelineError(f"{arg('artifacts')}: expected sync:BIT with a bit number "
                                f"(sync:6, the imec sync input), got {self.source!r}")
        return int(text)

    @property
    def fitted(self) -> tuple[str, ...]:        # type: ignore[override]
        """The triggers, and each label's artefact for ``average``/``median``."""
        base = ("samples", "labels")
        return base + (("template_labels", "templates") if self._templated else ())

    @property
    def _templated(self) -> bool:
        return self.mode in ("average", "median")

    def describe(self) -> str:
        """``artifacts='<source>'`` with its window and mode."""
        return (f"artifacts={self.source!r}, artifact_window=({self.ms_before:g}, "
                f"{self.ms_after:g}), artifact_mode={self.mode!r}")

    def margin(self, fs: float) -> int:
        """The interpolating modes' reach (`dspk.ops.artifact_reach`); none for the others."""
        return artifact_reach(self.ms_before, self.ms_after, self.mode, fs,
                              self.fit_sample_spacing)

    def fit_pass(self, fs: float) -> int | None:
        """``average``/``median``: a pass over the recording with the window's context."""
        if not self._templated:
            return None
        before, after = artifact_window(self.ms_before, self.ms_after, fs)
        return max(before, after, 1)

    def check(self, recording: Any) -> None:
        """Refuse, before any work, a missing trigger file or a sync bit the recording does
        not have.

        Parameters
        ----------
        recording : Recording

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import RemoveArtifacts
        >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=3e4)
        >>> RemoveArtifacts("nowhere.csv").check(rec)            # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dspk.pipeline.PipelineError: artifacts='nowhere.csv': no such file ...
        """
        bit = self._sync_bit()
        if bit is None:
            if not os.path.isfile(self.source):
                read_triggers(self.source, recording.fs)      # raises, naming the file
            return
        words = int(getattr(recording, "n_sync_words", 0) or 0)
        if words == 0:
            raise PipelineError(f"{self.describe()} needs the recording's sync channel, and "
                                f"{getattr(recording, 'source', '') or 'the recording'} has "
                                f"none (a SpikeGLX .bin or .cbin keeps one); pass a CSV of "
                                f"triggers instead")
        if bit >= 16 * words:
            raise PipelineError(f"{arg('artifacts', self.source)}: the recording has "
                                f"{words} sync word(s), bits 0..{16 * words - 1}")

    def _triggers(self, ctx: Context) -> tuple[np.ndarray, np.ndarray]:
        rec = ctx.recording
        bit = self._sync_bit()
        if bit is None:
            samples, labels = read_triggers(self.source, ctx.fs)
            # a part of a file (--time): its samples are numbered from the part's start
            samples = samples - int(getattr(rec, "start", 0) or 0)
            return samples, labels
        if rec is None or getattr(rec, "n_sync_words", 0) == 0:
            raise PipelineError(f"{self.describe()} needs the recording's sync channel (a "
                                f"SpikeGLX .bin or .cbin keeps one); pass a CSV of triggers "
                                f"instead")
        ev = sync_events(rec, bits=bit)
        samples = ev["sample"][ev["polarity"] > 0]
        return samples.astype(np.int64), np.zeros(len(samples), np.int64)

    def fit(self, blocks: FitBlocks, ctx: Context) -> dict:
        """The triggers (sorted by sample) and, for ``average``/``median``, each label's
        artefact from the pass (`FitBlocks.stream`)."""
        samples, labels = self._triggers(ctx)
        order = np.argsort(samples, kind="stable")
        samples, labels = samples[order], labels[order]
        n = getattr(ctx.recording, "n_samples", None)
        log.info("artifacts: %d trigger(s) from %s%s", len(samples), self.source,
                 "" if n is None else f", {int(((samples >= 0) & (samples < n)).sum())} "
                 f"inside the recording")
        reach = self.margin(ctx.fs)
        if reach and len(samples) > 1:
            close = int((np.diff(samples) <= reach).sum())
            if close:
                log.warning("artifacts: %d trigger(s) within %d samples of the previous one: "
                            "their %s fills chain (each reads the one before), and near them "
                            "the output may depend on the chunk size", close, reach, self.mode)
        state = {"samples": samples, "labels": labels}
        if self._templated:
            state.update(self._templates(blocks, ctx, samples, labels))
        return state

    def _templates(self, blocks: FitBlocks, ctx: Context, samples: np.ndarray,
                   labels: np.ndarray) -> dict:
        """Each label's mean or median window over its triggers inside the recording, the
        windows read from the pass (zeros outside the recording, as SpikeInterface pads)."""
        before, after = artifact_window(self.ms_before, self.ms_after, ctx.fs)
        halo = self.fit_pass(ctx.fs)
        n_total = getattr(ctx.recording, "n_samples", None)
        inside = (samples >= 0) if n_total is None else (samples >= 0) & (samples < n_total)
        names = np.unique(labels[inside])
        index = {int(v): k for k, v in enumerate(names)}
        length = before + after
        sums = np.zeros((len(names), ctx.n_channels, length))
        counts = np.zeros(len(names), np.int64)
        windows: list[list[np.ndarray]] = [[] for _ in names]
        for s0, s1, block in blocks.stream:
            lo, hi = np.searchsorted(samples, [s0, s1])
            if hi <= lo:
                continue
            host = block.get() if hasattr(block, "get") else np.asarray(block)
            for t, lab in zip(samples[lo:hi].tolist(), labels[lo:hi].tolist()):
                a = t - before - (s0 - halo)
                w = host[:, a:a + length].astype(np.float64)
                k = index[int(lab)]
                if self.mode == "average":
                    sums[k] += w
                    counts[k] += 1
                else:
                    windows[k].append(w.astype(np.float32))
        if self.mode == "average":
            tpl = sums / np.maximum(counts, 1)[:, None, None]
        else:
            tpl = np.stack([np.median(np.stack(w), axis=0) if w else
                            np.zeros((ctx.n_channels, length)) for w in windows]) \
                if len(names) else np.zeros((0, ctx.n_channels, length))
        return {"template_labels": names.astype(np.int64), "templates": tpl.astype(np.float32)}

    def prepare(self, ctx: Context, state: dict) -> dict:
        """The triggers, and the artefacts on the run's device in its dtype."""
        if not self.is_fitted(state):
            raise _not_fitted(self.describe())
        out = {"samples": np.asarray(state["samples"], np.int64),
               "labels": np.asarray(state["labels"], np.int64), "templates": None}
        if self._templated:
            out["templates"] = (np.asarray(state["template_labels"], np.int64),
                                ctx.xp.asarray(np.asarray(state["templates"]), dtype=ctx.dtype))
        return out

    def apply(self, x: Any, ctx: Context, prepared: dict) -> Any:
        """`apply_at` of a block at the recording's first sample."""
        return self.apply_at(x, ctx, prepared, 0)

    def apply_at(self, x: Any, ctx: Context, prepared: dict, start: int) -> Any:
        """The block x (whose first sample is the recording's sample ``start``) with the
        artefacts of the triggers that reach it removed; the part of x outside the recording
        (zeros a pipeline pads with) takes no part in the fits."""
        samples = prepared["samples"]
        n_total = getattr(ctx.recording, "n_samples", None)
        lo = max(0, -int(start))
        hi = x.shape[1] if n_total is None else min(x.shape[1], int(n_total) - int(start))
        if hi <= lo or samples.size == 0:
            return x
        before, after = artifact_window(self.ms_before, self.ms_after, ctx.fs)
        a, b = np.searchsorted(samples, [start + lo - after, start + hi + before])
        if b <= a:
            return x
        x[:, lo:hi] = remove_artifacts(
            x[:, lo:hi], samples[a:b], self.ms_before, self.ms_after, self.mode, fs=ctx.fs,
            labels=prepared["labels"][a:b], fit_sample_spacing=self.fit_sample_spacing,
            templates=prepared["templates"], start=int(start) + lo)
        return x


def _make(artifacts: str | None, artifact_window: Any, artifact_mode: str) -> Any:
    if artifacts in (None, ""):
        return None
    before, after = DEFAULT_ARTIFACT_WINDOW_MS if artifact_window is None else artifact_window
    return RemoveArtifacts(str(artifacts), float(before), float(after), artifact_mode or "zeros")


register(RemoveArtifacts, (
    Option("artifacts", "--artifacts", None, "remove stimulation artefacts around triggers: "
           "a CSV of their samples or times (header sample or time, optional label), or "
           "sync:BIT for the rising edges of that sync-channel bit",
           metavar="FILE.csv|sync:BIT"),
    Option("artifact_window", "--artifact-window", DEFAULT_ARTIFACT_WINDOW_MS,
           "ms removed before and after each trigger", type=float, nargs=2,
           metavar=("BEFORE", "AFTER")),
    Option("artifact_mode", "--artifact-mode", "zeros", "what replaces the window: zeros, "
           "linear or cubic interpolation, or the average or median artefact subtracted (as "
           "SpikeInterface's remove_artifacts)", choices=ARTIFACT_MODES)),
    make=_make, before="PhaseShift")
