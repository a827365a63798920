"""dspk and SpikeInterface, both ways: dspk's pipeline as a SpikeInterface preprocessor
(`DspkRecording`, `dspk_preprocess`), a dspk output as a SpikeInterface recording
(`read_dspk`), and dspk's detection as SpikeInterface's peaks (`dspk_detect_peaks`).

Needs spikeinterface (``pip install spikeinterface``): this module imports it, and nothing
else in dspk imports this module — ``import dspk`` never needs SpikeInterface.

**The preprocessor.** ``dspk_preprocess(recording, **options)`` builds the pipeline of the
options (`dspk.Pipeline.from_options`: ``highpass``, ``reference``, ``whiten``, a ``preset``,
``backend``, ...), fits it on the recording's first segment (`dspk.Pipeline.fit`: the fit
chunks of ``dspk preprocess``) and serves each ``get_traces(start, end)`` through
`dspk.Pipeline.block`: the parent's samples of [start − margin, end + margin) through the
steps, trimmed — the samples ``dspk preprocess`` writes for the same recording and options
(up to float32 rounding), on whatever chunks SpikeInterface asks for. Nothing is computed
until traces are asked for.

**Pickling and ``n_jobs``.** SpikeInterface moves a recording to its worker processes as
``to_dict()`` (its class and keyword arguments) and rebuilds it there. The keywords of a
`DspkRecording` hold the parent recording and the *fitted* pipeline — its steps, dtype,
backend, sampling rate and fitted arrays (JSON lists; float64 and float32 values survive
exactly) with the pipeline's `dspk.Pipeline.fingerprint` — so a worker rebuilds the same
pipeline without refitting and checks the fingerprint: every process applies the same W.
With the GPU backend, SpikeInterface is told to start workers with "spawn" (a forked child
cannot use the CUDA context of its parent).

**Units.** The preprocessor's traces are float32. Unwhitened, they are µV (``gain_to_uV``
1, ``offset_to_uV`` 0). Whitened, they are in units of the noise's standard deviation: the
recording has no ``gain_to_uV`` / ``offset_to_uV`` (SpikeInterface then does not take them
for µV) and says its unit in SpikeInterface's ``physical_unit`` property
(`dspk.pipeline.record.UNITS_WHITENED`), with ``gain_to_physical_unit`` and
``offset_to_physical_unit``. `read_dspk` labels a dspk output the same way.

Examples
--------
>>> import numpy as np
>>> import spikeinterface.core as si
>>> from dspk.spikeinterface import dspk_preprocess
>>> rec = si.generate_recording(num_channels=8, durations=[2.0], seed=0)
>>> pre = dspk_preprocess(rec, highpass=300.0, reference="median", whiten="global")
>>> pre.get_dtype(), pre.get_num_samples(), pre.has_scaleable_traces()
(dtype('float32'), 60000, False)
>>> str(pre.get_property("physical_unit")[0])
'whitened (noise SD)'
>>> whole = pre.get_traces()                                  # [samples, channels]
>>> part = pre.get_traces(start_frame=20000, end_frame=20100, channel_ids=["2", "5"])
>>> bool(np.allclose(part, whole[20000:20100, [2, 5]], atol=1e-4))
True
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

try:
    from spikeinterface.core import BaseRecording, BaseRecordingSegment
    from spikeinterface.preprocessing.basepreprocessor import (BasePreprocessor,
                                                               BasePreprocessorSegment)
except ImportError as exc:   # pragma: no cover - installed with the test extras
    raise ImportError("dspk.spikeinterface needs SpikeInterface: pip install spikeinterface"
                      ) from exc

from .backend import blocked_transpose, resolve_backend, to_numpy
from .io import RecordingError, SpikeInterfaceRecording, open_recording
from .pipeline import Detect, Pipeline, PipelineError, registry
from .pipeline.peaks import detect_peaks
from .pipeline.record import UNITS_UV, UNITS_WHITENED, describe

__all__ = ["DspkRecording", "dspk_preprocess", "DspkOutputRecording", "read_dspk",
           "dspk_detect_peaks"]

#: steps after which SpikeInterface may take the traces for high-pass filtered
#: (its ``is_filtered`` annotation)
FILTER_STEPS = ("HighPass", "BandPass")


# -- the fitted pipeline as keyword arguments -----------------------------------------------------
def _pipeline_spec(p: Pipeline) -> dict:
    """A fitted pipeline as JSON-able values: its steps, dtype, backend, rate, fitted arrays
    (each as dtype, shape and a flat list) and fingerprint."""
    states = []
    for step, st in zip(p.steps, p.states):
        arrays = {}
        for key in step.fitted:
            if key in st:
                a = np.asarray(to_numpy(st[key]))
                arrays[key] = {"dtype": a.dtype.str, "shape": list(a.shape),
                               "values": a.ravel().tolist()}
        states.append(arrays)
    return {"steps": p.options(), "dtype": str(p.dtype), "backend": p.backend,
            "fs": p.fs, "states": states, "fingerprint": p.fingerprint()}


def _pipeline_of(spec: dict) -> Pipeline:
    """The fitted pipeline of `_pipeline_spec`, checked against its fingerprint."""
    try:
        steps = []
        for options in spec["steps"]:
            options = dict(options)
            steps.append(registry.stage_class(options.pop("step"), "pipeline")(**options))
        states = [{key: np.asarray(a["values"], dtype=np.dtype(a["dtype"])).reshape(a["shape"])
                   for key, a in arrays.items()} for arrays in spec["states"]]
        p = Pipeline(steps, backend=spec["backend"], dtype=spec["dtype"], fs=spec["fs"],
                     states=states)
        fingerprint = spec["fingerprint"]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PipelineError(f"pipeline: expected a dspk.Pipeline or the dict a DspkRecording "
                            f"stores (to_dict()['kwargs']['pipeline']), got a dict that is "
                            f"neither ({type(exc).__name__}: {exc})") from exc
    if p.fingerprint() != fingerprint:
        raise PipelineError("pipeline: the fitted state does not match its fingerprint (an "
                            "edited or damaged dict)")
    return p


def _copy(p: Pipeline) -> Pipeline:
    """A pipeline with ``p``'s steps, dtype, backend, rate and fitted state, sharing nothing
    that fitting it would change."""
    return Pipeline(list(p.steps), backend=p.backend, dtype=p.dtype, fs=p.fs,
                    states=[dict(st) for st in p.states])


def _si_recording(recording: Any) -> BaseRecording:
    if not isinstance(recording, BaseRecording):
        raise TypeError(f"recording: expected a SpikeInterface recording (a "
                        f"spikeinterface.core.BaseRecording), got {type(recording).__name__}")
    return recording


# -- the preprocessor -----------------------------------------------------------------------------
class DspkRecording(BasePreprocessor):
    """A SpikeInterface recording through a dspk pipeline, lazily: `dspk.Pipeline.block` on
    the chunks SpikeInterface asks for (see the module's description).

    Parameters
    ----------
    recording : spikeinterface BaseRecording
        The parent (any number of segments; the pipeline is fitted on the first and applied
        to each, zero outside each segment as outside a recording).
    pipeline : dspk.Pipeline or dict, optional
        The pipeline to apply instead of ``options``: fitted (used as it is: its state is
        copied) or not (a copy is fitted on ``recording``); or the dict a `DspkRecording`
        stores in its keyword arguments (``to_dict()["kwargs"]["pipeline"]``). It must have
        no `dspk.pipeline.Detect` step (`dspk_detect_peaks` detects).
    **options
        `dspk.Pipeline.from_options` keywords when no ``pipeline`` is given: ``highpass``,
        ``bandpass``, ``reference``, ``whiten``, ``n_neighbors``, ``preset``, ``backend``
        ("auto", "cpu", "gpu"), ``dtype`` (the processing precision; the traces served are
        float32), and the options of registered steps.

    Attributes
    ----------
    pipeline : dspk.Pipeline
        The fitted pipeline (do not change it: the workers of ``n_jobs`` rebuild it from
        the keyword arguments taken when this recording was made).

    Raises
    ------
    TypeError
        A ``recording`` that is not a SpikeInterface recording; an unknown option (named).
    dspk.pipeline.PipelineError
        An option value a step does not take, both ``pipeline`` and ``options``, a pipeline
        that detects, fitted at another sampling rate, or a recording the steps cannot
        process (local whitening without channel locations, say).

    Examples
    --------
    >>> import pickle
    >>> import numpy as np
    >>> import spikeinterface.core as si
    >>> from dspk.spikeinterface import DspkRecording
    >>> rec = si.generate_recording(num_channels=4, durations=[1.0], seed=0)
    >>> pre = DspkRecording(rec, whiten="none", reference="mean", backend="cpu")
    >>> pre.get_channel_gains(), pre.get_annotation("is_filtered")     # µV, high-passed
    (array([1., 1., 1., 1.]), True)
    >>> again = pickle.loads(pickle.dumps(pre))                # as a worker rebuilds it
    >>> bool(np.array_equal(again.get_traces(end_frame=500), pre.get_traces(end_frame=500)))
    True
    >>> DspkRecording(rec, whiten="none", highpas=300)        # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: unknown pipeline option(s) ['highpas'] (options: [...])
    """

    def __init__(self, recording: Any, pipeline: Pipeline | dict | None = None,
                 **options: Any) -> None:
        recording = _si_recording(recording)
        if pipeline is not None and options:
            raise PipelineError(f"pipeline: give a pipeline or options, not both (got "
                                f"pipeline= and {sorted(options)})")
        if pipeline is None:
            p = Pipeline.from_options(**options)
        elif isinstance(pipeline, Pipeline):
            p = _copy(pipeline)
        elif isinstance(pipeline, dict):
            p = _pipeline_of(pipeline)
        else:
            raise TypeError(f"pipeline: expected a dspk.Pipeline or a dict, got "
                            f"{type(pipeline).__name__}")
        if p.sinks:
            raise PipelineError("detect: a DspkRecording serves traces; detect peaks with "
                                "dspk.spikeinterface.dspk_detect_peaks (or `dspk detect`)")
        if p.steps and getattr(p.steps[0], "front_end", False):
            raise PipelineError(f"{p.steps[0].describe()}: a DspkRecording serves its parent's "
                                f"samples at its rate; decimate before it "
                                f"(spikeinterface.preprocessing.decimate), or write the "
                                f"decimated output with dspk preprocess")
        fs = float(recording.get_sampling_frequency())
        if p.fs is not None and p.is_fitted and p.fs != fs:
            raise PipelineError(f"pipeline: fitted at {p.fs:g} Hz; the recording is {fs:g} "
                                f"Hz (fit it on this recording: pass an unfitted pipeline)")
        first = SpikeInterfaceRecording(recording, segment=0)
        if not p.is_fitted:
            p.fit(first)
        else:
            p.check(first)
            p.fs = fs
            if isinstance(pipeline, Pipeline):   # fitted elsewhere: it must fit this one
                try:
                    p.block(first, 0, min(first.n_samples, 2))
                except (ValueError, IndexError) as exc:
                    raise PipelineError(f"pipeline: its fitted state does not apply to this "
                                        f"recording of {first.n_channels} channels (fitted "
                                        f"on another probe?): {exc}") from exc
        BasePreprocessor.__init__(self, recording, dtype=np.float32)
        self.pipeline = p
        self._label_units(p)
        for k, parent in enumerate(recording.segments):
            dspk_rec = first if k == 0 else SpikeInterfaceRecording(recording, segment=k)
            self.add_recording_segment(DspkRecordingSegment(parent, dspk_rec, p))
        if resolve_backend(p.backend) == "gpu":
            # a forked worker cannot use the parent's CUDA context: SpikeInterface's
            # process pools are started with "spawn" instead
            self._preferred_mp_context = "spawn"
        self._kwargs = dict(recording=recording, pipeline=_pipeline_spec(p))

    def _label_units(self, p: Pipeline) -> None:
        """µV (gain 1, offset 0) or, whitened, no µV gains and SpikeInterface's physical
        unit properties; ``is_filtered`` after a filter; the ADC shifts dropped once a
        PhaseShift step has corrected them."""
        ones, zeros = np.ones(self.get_num_channels()), np.zeros(self.get_num_channels())
        keys = self.get_property_keys()
        if p.whitens:
            for key in ("gain_to_uV", "offset_to_uV"):
                if key in keys:
                    self.delete_property(key)
        else:
            self.set_channel_gains(ones)
            self.set_channel_offsets(zeros)
        self.set_property("physical_unit", [UNITS_WHITENED if p.whitens else UNITS_UV] *
                          self.get_num_channels())
        self.set_property("gain_to_physical_unit", ones)
        self.set_property("offset_to_physical_unit", zeros)
        names = [type(s).__name__ for s in p.steps]
        if any(n in FILTER_STEPS for n in names):
            self.annotate(is_filtered=True)
        if "PhaseShift" in names and "inter_sample_shift" in keys:
            self.delete_property("inter_sample_shift")


class DspkRecordingSegment(BasePreprocessorSegment):
    """A segment of a `DspkRecording`: ``get_traces`` through `dspk.Pipeline.block`.

    Parameters
    ----------
    parent_segment : spikeinterface BaseRecordingSegment
        The parent's segment (its times are this segment's).
    recording : dspk.io.SpikeInterfaceRecording
        The parent's segment as dspk reads it (µV, [channels, samples]).
    pipeline : dspk.Pipeline
        Fitted.
    """

    def __init__(self, parent_segment: Any, recording: SpikeInterfaceRecording,
                 pipeline: Pipeline) -> None:
        BasePreprocessorSegment.__init__(self, parent_segment)
        self.recording, self.pipeline = recording, pipeline

    def get_traces(self, start_frame: int | None, end_frame: int | None,
                   channel_indices: Any) -> np.ndarray:
        """Samples [start_frame, end_frame) of the channels ``channel_indices`` (all when
        None), float32 [samples, channels]: every channel computed (the steps mix them),
        those asked for returned."""
        n = self.recording.n_samples
        start = 0 if start_frame is None else int(start_frame)
        end = n if end_frame is None else int(end_frame)
        if end <= start:
            width = self.recording.n_channels if channel_indices is None else \
                len(np.arange(self.recording.n_channels)[channel_indices])
            return np.zeros((0, width), dtype=np.float32)
        y = to_numpy(self.pipeline.block(self.recording, start, end))
        if channel_indices is not None:
            y = y[channel_indices]
        return blocked_transpose(y.astype(np.float32, copy=False))


def dspk_preprocess(recording: Any, pipeline: Pipeline | dict | None = None,
                    **options: Any) -> DspkRecording:
    """A SpikeInterface recording through a dspk pipeline (`DspkRecording`), for a
    SpikeInterface chain: ``rec = dspk_preprocess(rec, preset="kilosort")`` then
    ``run_sorter(...)``, ``rec.save(format="binary", n_jobs=...)``.

    Parameters
    ----------
    recording : spikeinterface BaseRecording
    pipeline : dspk.Pipeline or dict, optional
        See `DspkRecording`.
    **options
        `dspk.Pipeline.from_options` keywords (see `DspkRecording`).

    Returns
    -------
    DspkRecording

    Examples
    --------
    >>> import spikeinterface.core as si
    >>> from dspk.spikeinterface import dspk_preprocess
    >>> rec = si.generate_recording(num_channels=8, durations=[1.0], seed=0)
    >>> pre = dspk_preprocess(rec, preset="kilosort")
    >>> [s["step"] for s in pre.pipeline.options()], pre.get_traces(end_frame=10).shape
    (['HighPass', 'Reference', 'Whiten'], (10, 8))
    """
    return DspkRecording(recording, pipeline=pipeline, **options)


# -- reading a dspk output ------------------------------------------------------------------------
class DspkOutputRecording(BaseRecording):
    """A dspk output file (``dspk preprocess``, `dspk.Pipeline.run`) as a SpikeInterface
    recording: ``/traces`` read by its own shape (not by the file's size: ``/spikes`` and the
    fitted state follow it in the file), in its stored dtype (float32, or int16 with its
    scale as the gain), with the channel ids, locations (a probeinterface probe of the
    stored positions; contact shapes are probeinterface's default, dspk stores none), groups
    (the shanks) and units the file stores (`dspk.pipeline.record.describe` reads them).

    µV outputs have ``gain_to_uV`` (the int16 scale, 1 for float32) and ``offset_to_uV`` 0;
    whitened ones have no µV gains, and ``physical_unit`` says "whitened (noise SD)" with
    the scale as ``gain_to_physical_unit``. Outputs written before dspk stored channel ids
    get 0..n−1 and their units from their steps.

    Parameters
    ----------
    file_path : path
        The output.

    Raises
    ------
    dspk.io.RecordingError
        A file that is not HDF5, or not a dspk output.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, dspk
    >>> from dspk.spikeinterface import DspkOutputRecording
    >>> tmp = tempfile.TemporaryDirectory()
    >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
    >>> rec = dspk.open_recording(x, fs=30000.0, geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)])
    >>> out = dspk.preprocess(rec, os.path.join(tmp.name, "o.h5"), progress=False,
    ...                       output_dtype=np.int16)
    >>> si_rec = DspkOutputRecording(out)
    >>> si_rec.get_num_samples(), si_rec.get_dtype(), si_rec.get_channel_ids().tolist()
    (9000, dtype('int16'), [0, 1, 2, 3])
    >>> si_rec.has_scaleable_traces(), float(si_rec.get_property("gain_to_physical_unit")[0])
    (False, 0.01)
    >>> tmp.cleanup()
    """

    def __init__(self, file_path: str | os.PathLike) -> None:
        path = os.fspath(file_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"file_path: {path}: no such file")
        try:
            meta = describe(path, fitted=False)
        except RecordingError as exc:      # said as this class's argument
            raise RecordingError(f"file_path: {exc}") from None
        BaseRecording.__init__(self, meta["fs"], list(meta["channel_ids"]), meta["dtype"])
        c = meta["n_channels"]
        gains, zeros = np.full(c, meta["scale"]), np.zeros(c)
        if meta["units"] == UNITS_UV:
            self.set_channel_gains(gains)
            self.set_channel_offsets(zeros)
        self.set_property("physical_unit", [meta["units"]] * c)
        self.set_property("gain_to_physical_unit", gains)
        self.set_property("offset_to_physical_unit", zeros)
        shanks = meta["shank_ids"]
        if meta["geometry"] is not None:
            self.set_probe(_probe(meta["geometry"], shanks),
                           group_mode="by_shank" if shanks is not None else "by_probe")
        if shanks is not None:
            self.set_channel_groups(shanks)
        self.annotate(is_filtered=any(s in FILTER_STEPS for s in meta["steps"]))
        self.add_recording_segment(DspkOutputSegment(path, meta["n_samples"], c,
                                                     meta["fs"]))
        self._kwargs = {"file_path": str(Path(path).absolute())}


def _probe(geometry: np.ndarray, shanks: np.ndarray | None) -> Any:
    """A probeinterface probe of the stored positions (µm), contact i on channel i."""
    from probeinterface import Probe  # noqa: PLC0415 (a dependency of SpikeInterface)

    probe = Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=geometry,
                       shank_ids=None if shanks is None else [str(s) for s in shanks])
    probe.set_device_channel_indices(np.arange(len(geometry)))
    return probe


class DspkOutputSegment(BaseRecordingSegment):
    """The one segment of a `DspkOutputRecording`: ``/traces`` read through
    `dspk.open_recording` (its contiguous samples memory-mapped, compressed ones through
    h5py), opened on first use in each process.

    Parameters
    ----------
    file_path : str
    n_samples, n_channels : int
    fs : float
    """

    def __init__(self, file_path: str, n_samples: int, n_channels: int, fs: float) -> None:
        BaseRecordingSegment.__init__(self, sampling_frequency=fs)
        self.file_path, self.n_samples, self.num_channels = file_path, n_samples, n_channels
        self._rec: Any = None
        self._opening = threading.Lock()     # SpikeInterface's thread pools: one handle

    def get_num_samples(self) -> int:
        """The samples of /traces."""
        return self.n_samples

    def get_traces(self, start_frame: int | None, end_frame: int | None,
                   channel_indices: Any) -> np.ndarray:
        """The stored samples, [samples, channels], unscaled."""
        with self._opening:
            if self._rec is None:
                self._rec = open_recording(self.file_path, dataset="/traces")
        start = 0 if start_frame is None else int(start_frame)
        end = self.n_samples if end_frame is None else int(end_frame)
        block = self._rec.read(start, max(start, end), channels=channel_indices, scaled=False)
        return blocked_transpose(np.asarray(block))


def read_dspk(file_path: str | os.PathLike) -> DspkOutputRecording:
    """A dspk output file as a SpikeInterface recording (`DspkOutputRecording`).

    Parameters
    ----------
    file_path : path
        An output of ``dspk preprocess`` / `dspk.Pipeline.run`.

    Returns
    -------
    DspkOutputRecording

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, dspk
    >>> from dspk.spikeinterface import read_dspk
    >>> tmp = tempfile.TemporaryDirectory()
    >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
    >>> rec = dspk.open_recording(x, fs=30000.0, geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)])
    >>> out = dspk.preprocess(rec, os.path.join(tmp.name, "o.h5"), whiten=None, progress=False)
    >>> si_rec = read_dspk(out)
    >>> si_rec.get_channel_gains().tolist(), si_rec.get_channel_locations()[1].tolist()
    ([1.0, 1.0, 1.0, 1.0], [0.0, 20.0])
    >>> tmp.cleanup()
    """
    return DspkOutputRecording(file_path)


# -- peaks ----------------------------------------------------------------------------------------
def dspk_detect_peaks(recording: Any, chunk_s: float = 1.0, pipeline: Pipeline | None = None,
                      **options: Any) -> tuple:
    """dspk's detection on a SpikeInterface recording, as SpikeInterface's peaks and peak
    locations (`dspk.detect.PEAK_DTYPE`, `dspk.detect.PEAK_LOCATION_DTYPE`), every segment
    (its ``segment_index``) with the pipeline fitted on the first:
    `dspk.pipeline.peaks.detect_peaks` on each.

    For a recording that is already preprocessed (a `DspkRecording`, `read_dspk`'s), turn
    the steps off: ``highpass=None, reference="none", whiten="none"``.

    Parameters
    ----------
    recording : spikeinterface BaseRecording
    chunk_s : float
        Chunk length in seconds (the peaks do not depend on it).
    pipeline : dspk.Pipeline, optional
        With a `dspk.pipeline.Detect` step, instead of ``options`` (fitted on the first
        segment when it is not fitted; it is not changed).
    **options
        `dspk.Pipeline.from_options` keywords (``detect=True`` is implied; the detection
        threshold is ``detect_threshold``).

    Returns
    -------
    (peaks, locations)
        By segment, then sample. The amplitude is the processed trace's value at the
        spike's trough (noise SDs when whitened, else µV), the location the detecting
        channel's position (µm).

    Examples
    --------
    >>> import numpy as np
    >>> import spikeinterface.core as si
    >>> from dspk.spikeinterface import dspk_detect_peaks
    >>> rec, _ = si.generate_ground_truth_recording(durations=[3.0], num_channels=16,
    ...                                              num_units=5, seed=0)
    >>> peaks, locations = dspk_detect_peaks(rec, whiten="global", detect_threshold=6.0)
    >>> peaks.dtype.names, locations.dtype.names
    (('sample_index', 'channel_index', 'amplitude', 'segment_index'), ('x', 'y'))
    >>> bool(len(peaks) > 0 and (np.diff(peaks["sample_index"]) >= 0).all())
    True
    """
    recording = _si_recording(recording)
    if pipeline is not None and options:
        raise PipelineError(f"pipeline: give a pipeline or options, not both (got pipeline= "
                            f"and {sorted(options)})")
    if pipeline is None:
        p = Pipeline.from_options(**{**options, "detect": True})
        # only the spikes are kept: no PCA of their waveforms fitted
        p.steps = [replace(s, features=0) if isinstance(s, Detect) else s for s in p.steps]
    elif isinstance(pipeline, Pipeline):
        p = _copy(pipeline)
    else:
        raise TypeError(f"pipeline: expected a dspk.Pipeline, got {type(pipeline).__name__}")
    peaks, locations = [], []
    for k in range(recording.get_num_segments()):
        rec = SpikeInterfaceRecording(recording, segment=k)
        pk, loc = detect_peaks(p, rec, chunk_s=chunk_s, segment_index=k)   # fits on k = 0
        peaks.append(pk)
        locations.append(loc)
    return np.concatenate(peaks), np.concatenate(locations)     # a recording has a segment
