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

**SpikeInterface's option names.** The preprocessor takes SpikeInterface's keywords
beside dspk's (`SI_OPTIONS`): ``freq_min``/``freq_max`` (``highpass_filter``,
``bandpass_filter``), ``reference="global"|"average"|"median"`` and ``operator``
(``common_reference``), ``mode``, ``radius_um``, ``int_scale`` and an integer ``dtype``
(``whiten``).

**Units.** The preprocessor's traces are float32 by default, or int16 with ``dtype="int16"``
(``round(y × int_scale)``: SpikeInterface's ``whiten(int_scale=...)``; by default dspk's
scaling, 200 steps per noise SD when whitened as Kilosort4 stores whitened data, 10 steps
per µV otherwise). Unwhitened, they are µV: ``gain_to_uV`` is 1 (float32) or
1/``int_scale`` (int16), ``offset_to_uV`` 0. Whitened, they are in units of the noise's
standard deviation: the recording has no ``gain_to_uV`` / ``offset_to_uV``, so
SpikeInterface does not take them for µV (``create_sorting_analyzer`` of int16 traces
sets ``return_in_uV=False`` and keeps the stored units: its amplitudes are noise SDs ×
``int_scale``; SpikeInterface checks the gains of integer traces only, so for float32 pass
``return_in_uV=False`` yourself: the amplitudes are noise SDs either way, never scaled),
and it says its unit in
SpikeInterface's ``physical_unit`` property (`dspk.pipeline.record.UNITS_WHITENED`), with
``gain_to_physical_unit`` (1/``int_scale``, 1 for float32) and ``offset_to_physical_unit``.
Save an int16 copy with ``dspk_preprocess(rec, ..., dtype="int16").save(...)``: a float32
preprocessor saved with ``save(dtype="int16")`` is cast by SpikeInterface (whitened traces
to a few levels). `read_dspk` labels a dspk output the same way.

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
from dataclasses import dataclass, replace
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
from .detect import PEAK_DTYPE, PEAK_LOCATION_DTYPE
from .motion.spikes import SpikeSurvey
from .pipeline import Detect, Pipeline, PipelineError, registry
from .pipeline import Motion as MotionStep
from .pipeline.peaks import detect_peaks
from .pipeline.record import UNITS_UV, UNITS_WHITENED, describe

__all__ = ["DspkRecording", "dspk_preprocess", "DspkOutputRecording", "read_dspk",
           "dspk_detect_peaks", "dspk_motion_peaks", "SI_OPTIONS", "spikeinterface_options"]

#: steps after which SpikeInterface may take the traces for high-pass filtered
#: (its ``is_filtered`` annotation)
FILTER_STEPS = ("HighPass", "BandPass")

#: SpikeInterface's keywords that `DspkRecording` takes, and what each is of SpikeInterface's
#: (the function mirrored) and of dspk's (`spikeinterface_options` translates them)
SI_OPTIONS = {
    "freq_min": "highpass_filter(freq_min) / bandpass_filter(freq_min): highpass= / bandpass=",
    "freq_max": "bandpass_filter(freq_max): bandpass=(freq_min, freq_max)",
    "reference": "common_reference(reference='global'): reference= (its operator); dspk's "
                 "values 'median', 'mean', 'none' and SpikeInterface's 'average' taken too",
    "operator": "common_reference(operator='median'|'average'): reference='median'|'mean'",
    "mode": "whiten(mode='global'|'local'): whiten=",
    "radius_um": "whiten(radius_um): n_neighbors= the most channels within radius_um of a "
                 "channel (dspk takes each channel's n nearest)",
    "int_scale": "whiten(int_scale): the traces times int_scale (int16 steps per unit)",
    "dtype": "whiten(dtype='int16'): int16 traces (a float dtype is dspk's processing "
             "precision)",
}
#: SpikeInterface's ``common_reference`` operators (and dspk's) as dspk's ``reference``
_OPERATORS = {"median": "median", "average": "mean", "mean": "mean"}
_UNSET = object()
#: dspk's int16 scaling when ``dtype="int16"`` and no ``int_scale``: 200 steps per noise SD
#: whitened (Kilosort4's ``temp_wh.dat``; `dspk.pipeline.outputs.KILOSORT_STEPS_PER_SD`),
#: 10 steps per µV otherwise (0.1 µV: `dspk.pipeline.outputs.int16_scale`)
INT_SCALE_WHITENED, INT_SCALE_UV = 200.0, 10.0


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


# -- SpikeInterface's names --------------------------------------------------------------------
def _conflict(si: str, dspk: str, a: Any, b: Any) -> PipelineError:
    return PipelineError(f"{si}: SpikeInterface's name for dspk's {dspk}=; got {si}={a!r} and "
                         f"{dspk}={b!r}, which disagree (give one)")


def spikeinterface_options(recording: Any = None, **options: Any) -> dict:
    """`dspk.Pipeline.from_options` keywords from keywords that may be SpikeInterface's
    (`SI_OPTIONS`): ``freq_min``/``freq_max`` (``highpass_filter``, ``bandpass_filter``),
    ``reference``/``operator`` (``common_reference``: ``"average"`` is dspk's ``"mean"``,
    ``reference="global"`` its operator), ``mode`` and ``radius_um`` (``whiten``). dspk's
    own keywords pass unchanged; one option given both ways must agree.

    ``radius_um`` becomes ``n_neighbors``: the most channels within ``radius_um`` µm of any
    channel of ``recording`` (SpikeInterface whitens each channel against those within the
    radius; dspk against its n nearest: the same neighbourhoods inside a regular probe, more
    channels at its ends).

    Parameters
    ----------
    recording : spikeinterface BaseRecording, optional
        Its channel locations, for ``radius_um``.
    **options
        dspk's and SpikeInterface's keywords.

    Returns
    -------
    dict

    Raises
    ------
    dspk.pipeline.PipelineError
        A value SpikeInterface's function does not take or dspk has no twin of (named), an
        option given both ways with different values, ``radius_um`` without locations.

    Examples
    --------
    >>> from dspk.spikeinterface import spikeinterface_options
    >>> spikeinterface_options(freq_min=300.0, operator="average", mode="global")
    {'highpass': 300.0, 'bandpass': None, 'reference': 'mean', 'whiten': 'global'}
    >>> spikeinterface_options(freq_min=300, freq_max=6000, reference="average")
    {'highpass': None, 'bandpass': (300.0, 6000.0), 'reference': 'mean'}
    >>> spikeinterface_options(reference="local")                # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: reference='local': ...
    """
    o = dict(options)
    lo, hi = o.pop("freq_min", None), o.pop("freq_max", None)
    if lo is not None or hi is not None:
        for name in ("highpass", "bandpass"):
            if o.get(name) is not None:
                raise PipelineError(f"freq_min/freq_max: SpikeInterface's names for highpass= "
                                    f"and bandpass=; give {name}= or them, not both")
        if lo is None:
            raise PipelineError(f"freq_max: dspk filters with a high-pass or a band-pass; give "
                                f"freq_min too (freq_min=LO, freq_max=HI is bandpass=(LO, HI)), "
                                f"got freq_max={hi!r} alone")
        try:
            lo, hi = float(lo), None if hi is None else float(hi)
        except (TypeError, ValueError):
            raise PipelineError(f"freq_min/freq_max: expected Hz, got {lo!r}, {hi!r}") from None
        o["highpass"], o["bandpass"] = (lo, None) if hi is None else (None, (lo, hi))
    ref, op = o.pop("reference", _UNSET), o.pop("operator", _UNSET)
    if ref in ("single", "local"):
        raise PipelineError(f"reference={ref!r}: SpikeInterface's {ref} reference has no dspk "
                            f"twin; dspk's common reference is global: reference='global' "
                            f"with operator='median'|'average', or 'median', 'mean', 'none'")
    if op is not _UNSET:
        if op not in _OPERATORS:
            raise PipelineError(f"operator: expected 'median' or 'average' (SpikeInterface's "
                                f"common_reference), got {op!r}")
        mine = _OPERATORS[op]
        if ref not in (_UNSET, "global") and _OPERATORS.get(ref, ref) != mine:
            raise _conflict("operator", "reference", op, ref)
        o["reference"] = mine
    elif ref is not _UNSET:
        o["reference"] = "median" if ref == "global" else _OPERATORS.get(ref, ref)
    mode = o.pop("mode", _UNSET)
    if mode is not _UNSET:
        if mode not in ("global", "local"):
            raise PipelineError(f"mode: expected 'global' or 'local' (SpikeInterface's "
                                f"whiten(mode)), got {mode!r}")
        if "whiten" in o and o["whiten"] != mode:
            raise _conflict("mode", "whiten", mode, o["whiten"])
        o["whiten"] = mode
    radius = o.pop("radius_um", _UNSET)
    if radius is not _UNSET and radius is not None:
        if "n_neighbors" in o:
            raise _conflict("radius_um", "n_neighbors", radius, o["n_neighbors"])
        if isinstance(radius, bool) or not isinstance(radius, (int, float, np.number)) or \
                not np.isfinite(radius) or radius <= 0:
            raise PipelineError(f"radius_um: expected a positive distance in µm, got "
                                f"{radius!r}")
        try:
            g = np.asarray(recording.get_channel_locations(), np.float64)
        except (AttributeError, ValueError) as exc:
            raise PipelineError(f"radius_um: needs the recording's channel locations (a "
                                f"probe); give n_neighbors= instead ({exc})") from None
        d = np.sqrt(((g[:, None, :] - g[None, :, :]) ** 2).sum(axis=-1))
        o["n_neighbors"] = int((d <= float(radius)).sum(axis=1).max())
    return o


def _output_form(int_scale: Any, dtype: Any) -> tuple:
    """(served dtype, int_scale or None) of the ``dtype``/``int_scale`` keywords (an
    integer ``dtype`` is the served one; a float one is none of this)."""
    out = np.dtype(np.float32)
    if dtype is not None:
        try:
            out = np.dtype(dtype)
        except TypeError:
            raise PipelineError(f"dtype: expected 'int16' or a float dtype, got "
                                f"{dtype!r}") from None
        if out.kind in "iu" and out != np.int16:
            raise PipelineError(f"dtype: the integer traces served are int16 (got {out}); "
                                f"give dtype='int16' with int_scale")
        if out.kind == "f":
            out = np.dtype(np.float32)
    if int_scale is not None:
        if isinstance(int_scale, bool) or not isinstance(int_scale, (int, float, np.number)) \
                or not np.isfinite(int_scale) or int_scale <= 0:
            raise PipelineError(f"int_scale: expected a positive number of steps per unit "
                                f"(SpikeInterface's whiten(int_scale)), got {int_scale!r}")
        int_scale = float(int_scale)
    return out, int_scale


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
    int_scale : float, optional
        SpikeInterface's ``whiten(int_scale)``: the traces served are the pipeline's times
        ``int_scale`` (for int16: steps per unit; the gain is 1/``int_scale``). With
        ``dtype="int16"`` and no ``int_scale``: dspk's scaling, 200 steps per noise SD when
        whitened (`INT_SCALE_WHITENED`), 10 per µV otherwise (`INT_SCALE_UV`).
    dtype : "int16" or a float dtype, optional
        SpikeInterface's ``whiten(dtype)``: ``"int16"`` serves int16 traces (rounded,
        clipped to its range); a float dtype is the processing precision (float32 or
        float64; the traces served are float32).
    **options
        `dspk.Pipeline.from_options` keywords when no ``pipeline`` is given: ``highpass``,
        ``bandpass``, ``reference``, ``whiten``, ``n_neighbors``, ``preset``, ``backend``
        ("auto", "cpu", "gpu"), and the options of registered steps; or SpikeInterface's
        names of them (`SI_OPTIONS`, translated by `spikeinterface_options`):
        ``freq_min``, ``freq_max`` (``highpass_filter``, ``bandpass_filter``),
        ``reference="global"|"average"``, ``operator`` (``common_reference``), ``mode``,
        ``radius_um`` (``whiten``).

    Attributes
    ----------
    pipeline : dspk.Pipeline
        The fitted pipeline (do not change it: the workers of ``n_jobs`` rebuild it from
        the keyword arguments taken when this recording was made).
    int_scale : float or None
        The factor the traces served are multiplied by.

    Notes
    -----
    Units of the traces served: µV (unwhitened; ``gain_to_uV`` 1/``int_scale`` or 1) or
    noise SDs times ``int_scale`` (whitened; no ``gain_to_uV``: SpikeInterface's
    ``create_sorting_analyzer`` and its amplitudes keep these units — for float32 traces
    pass it ``return_in_uV=False``, as it checks the gains of integer traces only —
    and ``gain_to_physical_unit`` turns them into SDs).

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
    >>> si_names = DspkRecording(rec, mode="global", operator="average", freq_min=300.0)
    >>> si_names.pipeline.options() == DspkRecording(                # SpikeInterface's names
    ...     rec, whiten="global", reference="mean", highpass=300.0).pipeline.options()
    True
    >>> as_int = DspkRecording(rec, whiten="global", dtype="int16")   # 200 steps per noise SD
    >>> as_int.get_dtype(), as_int.int_scale, float(as_int.get_property("gain_to_physical_unit")[0])
    (dtype('int16'), 200.0, 0.005)
    >>> DspkRecording(rec, whiten="none", highpas=300)        # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: unknown pipeline option(s) ['highpas'] (options: [...])
    """

    def __init__(self, recording: Any, pipeline: Pipeline | dict | None = None,
                 int_scale: float | None = None, dtype: Any = None, **options: Any) -> None:
        recording = _si_recording(recording)
        out_dtype, int_scale = _output_form(int_scale, dtype)
        if dtype is not None and np.dtype(dtype).kind == "f":
            if pipeline is not None:
                raise PipelineError("dtype: the pipeline given has its own precision; with "
                                    "pipeline=, dtype= is 'int16' or nothing")
            options["dtype"] = dtype
        if pipeline is not None and options:
            raise PipelineError(f"pipeline: give a pipeline or options, not both (got "
                                f"pipeline= and {sorted(options)})")
        if pipeline is None:
            p = Pipeline.from_options(**spikeinterface_options(recording, **options))
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
        if out_dtype == np.int16 and int_scale is None:
            int_scale = INT_SCALE_WHITENED if p.whitens else INT_SCALE_UV
        BasePreprocessor.__init__(self, recording, dtype=out_dtype)
        self.pipeline, self.int_scale = p, int_scale
        self._label_units(p)
        for k, parent in enumerate(recording.segments):
            dspk_rec = first if k == 0 else SpikeInterfaceRecording(recording, segment=k)
            self.add_recording_segment(DspkRecordingSegment(parent, dspk_rec, p, int_scale,
                                                            out_dtype))
        if resolve_backend(p.backend) == "gpu":
            # a forked worker cannot use the parent's CUDA context: SpikeInterface's
            # process pools are started with "spawn" instead
            self._preferred_mp_context = "spawn"
        self._kwargs = dict(recording=recording, pipeline=_pipeline_spec(p),
                            int_scale=int_scale,
                            dtype=None if out_dtype == np.float32 else out_dtype.str)

    def _label_units(self, p: Pipeline) -> None:
        """µV (gain 1/int_scale or 1, offset 0) or, whitened, no µV gains and
        SpikeInterface's physical unit properties; ``is_filtered`` after a filter; the ADC
        shifts dropped once a PhaseShift step has corrected them."""
        c = self.get_num_channels()
        step = 1.0 if self.int_scale is None else 1.0 / self.int_scale
        gains, zeros = np.full(c, step), np.zeros(c)
        keys = self.get_property_keys()
        if p.whitens:
            for key in ("gain_to_uV", "offset_to_uV"):
                if key in keys:
                    self.delete_property(key)
        else:
            self.set_channel_gains(gains)
            self.set_channel_offsets(zeros)
        self.set_property("physical_unit", [UNITS_WHITENED if p.whitens else UNITS_UV] * c)
        self.set_property("gain_to_physical_unit", gains)
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
    int_scale : float, optional
        The traces times this.
    dtype : float32 or int16
        The traces served (int16: rounded and clipped to its range).
    """

    def __init__(self, parent_segment: Any, recording: SpikeInterfaceRecording,
                 pipeline: Pipeline, int_scale: float | None = None,
                 dtype: Any = np.float32) -> None:
        BasePreprocessorSegment.__init__(self, parent_segment)
        self.recording, self.pipeline = recording, pipeline
        self.int_scale, self.dtype = int_scale, np.dtype(dtype)

    def get_traces(self, start_frame: int | None, end_frame: int | None,
                   channel_indices: Any) -> np.ndarray:
        """Samples [start_frame, end_frame) of the channels ``channel_indices`` (all when
        None), [samples, channels] float32 (or int16), times ``int_scale``: every channel
        computed (the steps mix them), those asked for returned."""
        n = self.recording.n_samples
        start = 0 if start_frame is None else int(start_frame)
        end = n if end_frame is None else int(end_frame)
        if end <= start:
            width = self.recording.n_channels if channel_indices is None else \
                len(np.arange(self.recording.n_channels)[channel_indices])
            return np.zeros((0, width), dtype=self.dtype)
        y = to_numpy(self.pipeline.block(self.recording, start, end))
        if channel_indices is not None:
            y = y[channel_indices]
        y = y.astype(np.float32, copy=False)
        if self.int_scale is not None:
            y = y * np.float32(self.int_scale)
        if self.dtype == np.int16:
            info = np.iinfo(np.int16)
            y = np.clip(np.rint(y), info.min, info.max).astype(np.int16)
        return blocked_transpose(y)


def dspk_preprocess(recording: Any, pipeline: Pipeline | dict | None = None,
                    **options: Any) -> DspkRecording:
    """A SpikeInterface recording through a dspk pipeline (`DspkRecording`), for a
    SpikeInterface chain: ``pre = dspk_preprocess(rec, preset="kilosort")``, then
    ``saved = pre.save(format="binary", n_jobs=...)`` and ``run_sorter(..., saved, ...)``:
    the sorter gets the saved copy (given the lazy ``pre``, SpikeInterface's sorter
    wrappers would compute and write the whole chain again).

    Mirrors SpikeInterface's preprocessing functions ``highpass_filter``,
    ``bandpass_filter``, ``common_reference`` and ``whiten`` in one call, and takes their
    keywords (`SI_OPTIONS`) beside dspk's.

    Parameters
    ----------
    recording : spikeinterface BaseRecording
    pipeline : dspk.Pipeline or dict, optional
        See `DspkRecording`.
    **options
        `dspk.Pipeline.from_options` keywords or SpikeInterface's names of them, and
        ``int_scale``, ``dtype`` (see `DspkRecording`).

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
    scale as the gain), with the channel ids (SpikeInterface's own for a SpikeGLX or Open
    Ephys input: ``"imec0.ap#AP0"``), locations (a probeinterface probe of the stored
    positions and contact ids; contact shapes are probeinterface's default, dspk stores
    none), groups (the shanks), ADC sample shifts (``inter_sample_shift``, where stored: not
    after a ``PhaseShift`` step) and units the file stores
    (`dspk.pipeline.record.describe` reads them).

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
            self.set_probe(_probe(meta["geometry"], shanks, meta["contact_ids"]),
                           group_mode="by_shank" if shanks is not None else "by_probe")
        if shanks is not None:
            self.set_channel_groups(shanks)
        if meta["sample_shifts"] is not None:       # what SpikeInterface's phase_shift reads
            self.set_property("inter_sample_shift", meta["sample_shifts"])
        self.annotate(is_filtered=any(s in FILTER_STEPS for s in meta["steps"]))
        self.add_recording_segment(DspkOutputSegment(path, meta["n_samples"], c,
                                                     meta["fs"]))
        self._kwargs = {"file_path": str(Path(path).absolute())}


def _probe(geometry: np.ndarray, shanks: np.ndarray | None,
           contact_ids: np.ndarray | None = None) -> Any:
    """A probeinterface probe of the stored positions (µm), contact i on channel i, with
    the stored shanks and contact ids."""
    from probeinterface import Probe  # noqa: PLC0415 (a dependency of SpikeInterface)

    probe = Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=geometry,
                       shank_ids=None if shanks is None else [str(s) for s in shanks])
    if contact_ids is not None:
        probe.set_contact_ids([str(v) for v in contact_ids])
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
        p = Pipeline.from_options(**spikeinterface_options(recording,
                                                           **{**options, "detect": True}))
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


# -- peaks for a motion estimate ------------------------------------------------------------------
@dataclass
class _MotionPeaks(MotionStep):
    """The `dspk.pipeline.Motion` step's pass, kept: its fit returns the spikes it would
    estimate the drift from (``time_s``, ``x``, ``y``, ``amplitude``, ``channel_index``)
    instead of the drift."""

    fitted = ("time_s", "x", "y", "amplitude", "channel_index")

    def fit(self, blocks: Any, ctx: Any) -> dict:
        """The spikes of the pass (`dspk.motion.spikes.SpikeSurvey`, as `Motion.fit`)."""
        fs, g = ctx.fs, np.asarray(ctx.geometry, np.float64)
        shanks = getattr(ctx.recording, "shank_ids", None)
        inner = ctx.xp.concatenate(list(blocks.inner()), axis=1)
        survey = SpikeSurvey(inner, g, fs, self.threshold, shank_ids=shanks, dtype=ctx.dtype)
        del inner
        found = survey.add_all(blocks.stream, halo=self.fit_pass(fs)).spikes()
        found["x"] = g[np.asarray(found["channel_index"], np.int64), 0]   # the grid's x
        return found


def dspk_motion_peaks(recording: Any, threshold: float = 7.0, **options: Any) -> tuple:
    """The peaks and localised peak locations that dspk's drift correction (the
    `dspk.pipeline.Motion` step, ``motion="rigid"|"nonrigid"``) estimates the drift from,
    as SpikeInterface's ``detect_peaks`` and ``localize_peaks`` give them: ready for
    ``spikeinterface.sortingcomponents.motion.estimate_motion(recording, peaks,
    peak_locations, ...)``.

    The recording goes through the steps of ``options`` (dspk's defaults: 300 Hz high-pass,
    median reference, local whitening; SpikeInterface's names are taken, `SI_OPTIONS`),
    fitted on its first segment; one pass over it finds the spikes (`dspk.motion.spikes`:
    the detector of the Motion step) and places each between the channels by a grid of
    point sources (`dspk.motion.localize`) — the positions the Motion step registers, not
    the detecting contact's.

    Parameters
    ----------
    recording : spikeinterface BaseRecording
        With channel locations; one segment.
    threshold : float
        The pass's detection threshold in noise SDs (the Motion step's ``threshold``).
    **options
        `dspk.Pipeline.from_options` keywords or SpikeInterface's names of them (no
        ``detect`` or ``motion``: the pass is the Motion step's).

    Returns
    -------
    (peaks, peak_locations)
        `dspk.detect.PEAK_DTYPE` (``sample_index`` of the trough, ``channel_index`` of the
        detecting channel, ``amplitude`` the waveform's amplitude in noise SDs,
        ``segment_index`` 0), ordered by sample; and SpikeInterface's ``localize_peaks``
        dtype for ``center_of_mass``/``grid_convolution`` (``x``, ``y`` float64, µm; x is
        the detecting channel's).

    Raises
    ------
    TypeError
        A recording that is not SpikeInterface's, an unknown option.
    dspk.pipeline.PipelineError
        Several segments, no channel locations, ``detect``/``motion`` in ``options``, a
        recording shorter than two of the Motion step's time bins.

    Examples
    --------
    >>> import numpy as np
    >>> import spikeinterface.core as si
    >>> from dspk.spikeinterface import dspk_motion_peaks
    >>> rec, _ = si.generate_ground_truth_recording(durations=[6.0], num_channels=16,
    ...                                              num_units=5, seed=0)
    >>> peaks, locations = dspk_motion_peaks(rec, mode="global")
    >>> peaks.dtype.names, locations.dtype.names
    (('sample_index', 'channel_index', 'amplitude', 'segment_index'), ('x', 'y'))
    >>> bool(len(peaks) > 0 and (np.diff(peaks["sample_index"]) >= 0).all())
    True
    """
    recording = _si_recording(recording)
    if recording.get_num_segments() != 1:
        raise PipelineError(f"recording: expected one segment (SpikeInterface's motion "
                            f"estimate is per segment), got {recording.get_num_segments()}; "
                            f"select one with recording.select_segments([k])")
    for name in ("detect", "motion"):
        if name in options:
            raise PipelineError(f"{name}: dspk_motion_peaks runs the Motion step's own pass; "
                                f"leave {name}= out")
    p = Pipeline.from_options(**spikeinterface_options(recording, **options))
    p = Pipeline(list(p.steps) + [_MotionPeaks("rigid", threshold=float(threshold))],
                 backend=p.backend, dtype=p.dtype)
    rec = SpikeInterfaceRecording(recording, segment=0)
    p.fit(rec)
    found = p.states[-1]
    t = np.rint(np.asarray(found["time_s"]) * rec.fs).astype(np.int64)
    order = np.argsort(t, kind="stable")
    peaks = np.zeros(len(t), dtype=PEAK_DTYPE)
    peaks["sample_index"] = t[order]
    peaks["channel_index"] = np.asarray(found["channel_index"], np.int64)[order]
    peaks["amplitude"] = np.asarray(found["amplitude"])[order]
    peaks["segment_index"] = 0
    locations = np.zeros(len(t), dtype=PEAK_LOCATION_DTYPE)
    locations["x"] = np.asarray(found["x"])[order]
    locations["y"] = np.asarray(found["y"])[order]
    return peaks, locations
