"""Misuse of the Python API, table-driven (issue 45: inputs that make no physical sense are
refused with a clear message naming the argument, before any work).

Each row of `CASES` is (id, call, expected exception type, a fragment of the message that
names the argument): ``call(tmp_path)`` must raise that type with that fragment (checked
with ``in``, not as a regular expression). Add rows here for new refusals; the count is
what the issue's bar (>= 150 misuse cases over the whole work) counts.

`CLI_CASES` are the command line's (the files a job reads given as OUT, a lock held, a
tampered resume, a bad ``--gpu-memory``): (id, prepare(tmp_path) -> argv, exit status, a
fragment of what the command says — its error, or the log line of a resume that redid its
work — and the files that must come out unchanged).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

import dspk
from dspk import cli
from dspk.pipeline import PipelineError
from dspk.pipeline.lock import OutputLock
from dspk.detect import detect_spikes, learn_templates, spike_features, template_noise
from dspk.io import RecordingError, open_recording, read_probe
from dspk.ops import (PCA, CovarianceAccumulator, SpatialFilter, bandpass_taps, blank_saturation,
                      common_reference, covariance, fir_bank, fir_filter,
                      highpass_spatial_filter, highpass_spatial_matrix, highpass_taps, knn,
                      pairwise_sqdist, phase_shift, spatial_filter, whitening_matrix)

FS = 30000.0


def traces(c: int = 8, n: int = 3000, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((c, n)).astype(dtype)


def geom(c: int = 8) -> np.ndarray:
    return np.c_[np.zeros(c), 20.0 * np.arange(c)]


def h5(tmp_path, shape, dtype=np.int16, **attrs) -> str:
    import h5py

    path = os.path.join(tmp_path, f"rec-{'x'.join(map(str, shape))}.h5")
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", data=np.zeros(shape, dtype))
        for k, v in attrs.items():
            d.attrs[k] = v
    return path


def oebin(tmp_path, num_channels, channels=None) -> str:
    """A minimal Open Ephys binary recording of one stream whose oebin says
    ``num_channels``."""
    root = os.path.join(tmp_path, "Record Node 101", "experiment1", "recording1")
    cont = os.path.join(root, "continuous", "Acq-100.ProbeA")
    os.makedirs(cont, exist_ok=True)
    chans = channels if channels is not None else \
        [{"channel_name": f"CH{i + 1}", "bit_volts": 0.195, "units": "uV"} for i in range(2)]
    with open(os.path.join(root, "structure.oebin"), "w") as f:
        json.dump({"GUI version": "0.6.0", "continuous": [{
            "folder_name": "Acq-100.ProbeA/", "sample_rate": 30000.0,
            "source_processor_name": "Acq", "stream_name": "ProbeA",
            "num_channels": num_channels, "channels": chans}], "events": [], "spikes": []}, f)
    np.zeros((100, 2), np.int16).tofile(os.path.join(cont, "continuous.dat"))
    np.save(os.path.join(cont, "sample_numbers.npy"), np.arange(100, dtype=np.int64))
    np.save(os.path.join(cont, "timestamps.npy"), np.arange(100) / 30000.0)
    return os.path.join(root, "structure.oebin")


def prb(tmp_path, text: str) -> str:
    path = os.path.join(tmp_path, "p.prb")
    with open(path, "w") as f:
        f.write(text)
    return path


def side(tmp_path, name="side.json", text="{}") -> str:
    path = os.path.join(tmp_path, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


#: a probeinterface file of 4 contacts (the positions do not matter to the refusals)
PROBE_JSON = json.dumps({"specification": "probeinterface", "probes": [{
    "ndim": 2, "si_units": "um", "contact_positions": [[0, 20 * i] for i in range(4)]}]})


def many(tmp_path, **options):
    """`dspk.dask.preprocess_many` of one flat binary into ``tmp_path`` itself (its outputs
    ``raw.h5``, ``raw/``, ...): refused before a cluster starts, or this fails (no client)."""
    from dspk.dask import preprocess_many

    path = os.path.join(tmp_path, "raw.bin")
    I16.tofile(path)

    def no_cluster():       # (pytest's failure is no Exception: nothing reports it as one)
        pytest.fail("a cluster was started for a refused call")

    return preprocess_many([path], tmp_path, client=no_cluster, fs=FS, n_channels=4,
                           whiten="global", backend="cpu", **options)


def run(tmp_path, out="o.h5", lock_dir=False, artifacts=None, **options):
    """A small job into ``tmp_path/out`` (a folder where its lock goes, with ``lock_dir``)."""
    if lock_dir:
        os.mkdir(os.path.join(tmp_path, out + ".lock"))
    rec = open_recording(traces(4, 6000).T.copy(), fs=FS)
    extra = {} if artifacts is None else {"artifacts": artifacts}
    p = dspk.Pipeline.from_options(whiten="global", backend="cpu", **extra)
    return p.run(rec, os.path.join(tmp_path, out), progress=False, **options)


def run_locked(tmp_path):
    with OutputLock(os.path.join(tmp_path, "o.h5.lock")):
        return run(tmp_path)


I16 = np.zeros((3000, 4), np.int16)
X = traces()
T3 = np.zeros((2, 4, 3000), np.float32)
ONE_D = np.zeros(3000, np.float32)
NO_CH = np.zeros((0, 3000), np.float32)
SAMPLES_FIRST = traces(3000, 8)               # [samples, channels] by mistake
CLIPS = np.random.default_rng(1).standard_normal((100, 20)).astype(np.float32)
V = ValueError
T = TypeError
R = RecordingError

# (id, call(tmp_path), exception type, message fragment naming the argument)
CASES = [
    # -- open_recording: arrays ----------------------------------------------------------------
    ("array-1d", lambda t: open_recording(ONE_D, fs=FS), R, "array: expected a 2-D array"),
    ("array-3d", lambda t: open_recording(T3, fs=FS), R, "array: expected a 2-D array"),
    ("array-0-channels", lambda t: open_recording(NO_CH, fs=FS), R, "0 channels"),
    ("array-0-channels-sf", lambda t: open_recording(NO_CH.T, fs=FS), R, "0 channels"),
    ("array-empty-layout-given", lambda t: open_recording(NO_CH, fs=FS,
                                                          layout="channels_samples"),
     R, "0 channels"),
    ("array-one-sample", lambda t: open_recording(np.zeros((1, 384), np.int16), fs=FS), R,
     "1 sample of 384 channels"),
    ("array-one-sample-layout", lambda t: open_recording(np.zeros((1, 384), np.int16), fs=FS,
                                                         layout="samples_channels"),
     R, "1 sample(s); a recording needs at least 2"),
    ("array-square", lambda t: open_recording(np.zeros((300, 200), np.int16), fs=FS), R,
     "layout: cannot tell samples from channels"),
    ("array-bad-layout", lambda t: open_recording(I16, fs=FS, layout="rows"), R,
     "layout: expected one of"),
    ("array-no-fs", lambda t: open_recording(I16), R, "fs:"),
    ("array-fs-0", lambda t: open_recording(I16, fs=0.0), R, "fs: expected a positive"),
    ("array-fs-neg", lambda t: open_recording(I16, fs=-3e4), R, "fs: expected a positive"),
    ("array-fs-nan", lambda t: open_recording(I16, fs=float("nan")), R, "fs: expected a positive"),
    ("array-fs-inf", lambda t: open_recording(I16, fs=float("inf")), R, "fs: expected a positive"),
    ("array-complex", lambda t: open_recording(I16.astype(np.complex64), fs=FS), R,
     "unsupported sample type"),
    ("not-a-source", lambda t: open_recording(12345), T, "source: expected a path or an array"),
    ("missing-file", lambda t: open_recording(os.path.join(t, "nope.bin")), FileNotFoundError,
     "no such file"),
    # -- open_recording: gains -----------------------------------------------------------------
    ("gain-0", lambda t: open_recording(I16, fs=FS, gain_to_uv=0), R,
     "gain_to_uv: 0 µV per unit at channel 0"),
    ("gain-0-one-channel", lambda t: open_recording(I16, fs=FS, gain_to_uv=[1, 1, 0, 1]), R,
     "gain_to_uv: 0 µV per unit at channel 2"),
    ("gain-neg", lambda t: open_recording(I16, fs=FS, gain_to_uv=-0.195), R,
     "allow_negative_gain=True"),
    ("gain-neg-one-channel", lambda t: open_recording(I16, fs=FS, gain_to_uv=[1, -1, 1, 1]),
     R, "gain_to_uv: negative (-1 µV per unit) at channel 1"),
    ("gain-nan", lambda t: open_recording(I16, fs=FS, gain_to_uv=float("nan")), R,
     "gain_to_uv: values must be finite"),
    ("gain-inf", lambda t: open_recording(I16, fs=FS, gain_to_uv=float("inf")), R,
     "gain_to_uv: values must be finite"),
    ("gain-wrong-length", lambda t: open_recording(I16, fs=FS, gain_to_uv=[1.0, 2.0]), R,
     "gain_to_uv: expected one value or 4"),
    ("gain-text", lambda t: open_recording(I16, fs=FS, gain_to_uv="big"), ValueError, ""),
    ("offset-nan", lambda t: open_recording(I16, fs=FS, offset_to_uv=float("nan")), R,
     "offset_to_uv: values must be finite"),
    ("gain-0-hdf5-attr", lambda t: open_recording(h5(t, (3000, 4), fs=FS, gain_to_uv=0.0)), R,
     "gain_to_uv: 0 µV per unit"),
    ("gain-neg-hdf5-attr", lambda t: open_recording(h5(t, (3000, 4), fs=FS,
                                                       gain_to_uv=-2.0)),
     R, "gain_to_uv: negative"),
    ("geometry-shape", lambda t: open_recording(I16, fs=FS, geometry=np.zeros((3, 2))), R,
     "geometry: expected [4, 2]"),
    ("geometry-nan", lambda t: open_recording(I16, fs=FS, geometry=np.full((4, 2), np.nan)), R,
     "geometry: positions must be finite"),
    # -- HDF5 ----------------------------------------------------------------------------------
    ("hdf5-0-channels", lambda t: open_recording(h5(t, (3000, 0), fs=FS)), R, "0 channels"),
    ("hdf5-0-channels-cs", lambda t: open_recording(h5(t, (0, 3000), fs=FS)), R, "0 channels"),
    ("hdf5-1-sample", lambda t: open_recording(h5(t, (1, 32), fs=FS)), R,
     "1 sample of 32 channels"),
    ("hdf5-1-sample-layout", lambda t: open_recording(h5(t, (1, 32), fs=FS),
                                                      layout="samples_channels"),
     R, "1 sample(s)"),
    ("hdf5-no-fs", lambda t: open_recording(h5(t, (3000, 4))), R, "fs:"),
    ("hdf5-missing-dataset", lambda t: open_recording(h5(t, (3000, 4), fs=FS),
                                                      dataset="/nope"),
     R, "nope"),
    # -- Open Ephys ----------------------------------------------------------------------------
    ("oebin-0-channels", lambda t: open_recording(oebin(t, 0, [])), R, "num_channels"),
    ("oebin-negative-channels", lambda t: open_recording(oebin(t, -2, [])), R, "num_channels"),
    ("oebin-text-channels", lambda t: open_recording(oebin(t, "two")), R, "num_channels"),
    ("oebin-channels-mismatch", lambda t: open_recording(oebin(t, 3)), R,
     "describes 2 channels but num_channels=3"),
    # -- probe files ---------------------------------------------------------------------------
    ("prb-code", lambda t: read_probe(prb(t, "import os\n")), R, "refused"),
    ("prb-call", lambda t: read_probe(prb(t, "channel_groups = {0: os.system('x')}\n")), R,
     "refused"),
    ("prb-numpy-call-not-scalar", lambda t: read_probe(prb(t, "a = np.zeros(3)\n")), R,
     "refused"),
    ("prb-numpy-scalar-of-name", lambda t: read_probe(prb(t, "a = np.int64(b)\n")), R,
     "refused"),
    ("prb-numpy-int-of-float", lambda t: read_probe(prb(t, "a = np.int64(2.5)\n")), R,
     "refused"),
    ("prb-other-module", lambda t: read_probe(prb(t, "a = os.int64(2)\n")), R, "refused"),
    # -- ops: layout ---------------------------------------------------------------------------
    *[(f"{name}-1d", (lambda f: lambda t: f(ONE_D))(f), V, "x: expected a 2-D [channels, "
       "samples] array, got shape (3000,) (one channel: x[None, :])")
      for name, f in [("covariance", covariance), ("common_reference", common_reference),
                      ("fir_filter", lambda x: fir_filter(x, [1.0, 2.0])),
                      ("fir_bank", lambda x: fir_bank(x, np.ones((1, 3)))),
                      ("phase_shift", lambda x: phase_shift(x, [0.0])),
                      ("blank_saturation", lambda x: blank_saturation(x, 1.0, fill=0.0)),
                      ("highpass_spatial_filter", lambda x: highpass_spatial_filter(x, geom(),
                                                                                    FS)),
                      ("spatial_filter", lambda x: spatial_filter(np.eye(8, dtype=np.float32),
                                                                  x)),
                      ("CovarianceAccumulator", lambda x: CovarianceAccumulator().add(x))]],
    *[(f"{name}-3d", (lambda f: lambda t: f(T3))(f), V, "x: expected a 2-D [channels, samples]")
      for name, f in [("covariance", covariance), ("common_reference", common_reference),
                      ("fir_filter", lambda x: fir_filter(x, [1.0, 2.0])),
                      ("phase_shift", lambda x: phase_shift(x, [0.0, 0.0]))]],
    *[(f"{name}-0-channels", (lambda f: lambda t: f(NO_CH))(f), V, "x: empty, no channel")
      for name, f in [("covariance", covariance), ("common_reference", common_reference),
                      ("fir_filter", lambda x: fir_filter(x, [1.0, 2.0])),
                      ("fir_bank", lambda x: fir_bank(x, np.ones((1, 3)))),
                      ("blank_saturation", lambda x: blank_saturation(x, 1.0, fill=0.0)),
                      ("CovarianceAccumulator", lambda x: CovarianceAccumulator().add(x))]],
    *[(f"{name}-list", (lambda f: lambda t: f([[1.0, 2.0], [3.0, 4.0]]))(f), T,
       "x: expected a NumPy or CuPy array")
      for name, f in [("covariance", covariance), ("common_reference", common_reference),
                      ("fir_filter", lambda x: fir_filter(x, [1.0])),
                      ("blank_saturation", lambda x: blank_saturation(x, 1.0, fill=0.0))]],
    *[(f"{name}-int32", (lambda f: lambda t: f(X.astype(np.int32)))(f), T,
       "x: unsupported dtype int32")
      for name, f in [("covariance", covariance), ("common_reference", common_reference),
                      ("fir_filter", lambda x: fir_filter(x, [1.0]))]],
    ("fir_filter-transposed", lambda t: fir_filter(SAMPLES_FIRST, highpass_taps(FS)), V,
     "use x.T"),
    ("fir_bank-transposed", lambda t: fir_bank(SAMPLES_FIRST, np.ones((2, 101))), V,
     "use x.T"),
    ("covariance-transposed", lambda t: covariance(SAMPLES_FIRST), V, "use x.T"),
    ("fir_filter-taps-longer", lambda t: fir_filter(traces(8, 100), highpass_taps(FS)), V,
     "taps: 263 taps are longer than the data (100 samples): the filter needs at least 263"),
    ("fir_filter-taps-2d", lambda t: fir_filter(X, np.ones((2, 3))), V, "taps: expected a"),
    ("fir_filter-taps-empty", lambda t: fir_filter(X, []), V, "taps: expected a non-empty"),
    ("fir_bank-bank-1d", lambda t: fir_bank(X, np.ones(5)), V, "bank: expected [filters, taps]"),
    # -- ops: cut-offs and filter lengths ------------------------------------------------------
    ("highpass-0.01Hz", lambda t: highpass_taps(FS, 0.01), V,
     "cutoff: a high-pass at 0.01 Hz"),
    ("highpass-0.01Hz-says-what-fits", lambda t: highpass_taps(FS, 0.01), V,
     "use a cut-off of at least"),
    ("highpass-narrow-transition", lambda t: highpass_taps(FS, 300.0, transition=0.001), V,
     "a wider transition= (at least"),
    ("bandpass-0.01Hz", lambda t: bandpass_taps(FS, 0.01, 100.0), V,
     "cutoff: a band-pass at 0.01 Hz"),
    ("bandpass-transition-neg", lambda t: bandpass_taps(FS, 300.0, 6000.0, transition=-1.0), V,
     "transition: expected 0 < transition"),
    ("highpass-cutoff-0", lambda t: highpass_taps(FS, 0.0), V, "cutoff 0.0 Hz"),
    ("highpass-cutoff-neg", lambda t: highpass_taps(FS, -300.0), V, "cutoff -300.0 Hz"),
    ("highpass-cutoff-nyquist", lambda t: highpass_taps(FS, 15000.0), V, "cutoff 15000.0 Hz"),
    ("highpass-cutoff-nan", lambda t: highpass_taps(FS, float("nan")), V, "cutoff nan Hz"),
    ("highpass-fs-0", lambda t: highpass_taps(0.0, 300.0), V, "fs: expected a positive"),
    ("highpass-fs-neg", lambda t: highpass_taps(-FS, 300.0), V, "fs: expected a positive"),
    ("highpass-transition-0", lambda t: highpass_taps(FS, 300.0, transition=0.0), V,
     "transition: expected 0 < transition"),
    ("highpass-transition-wide", lambda t: highpass_taps(FS, 300.0, transition=700.0), V,
     "transition: expected 0 < transition"),
    ("bandpass-inverted", lambda t: bandpass_taps(FS, 6000.0, 300.0), V, "must be below high"),
    ("bandpass-above-nyquist", lambda t: bandpass_taps(FS, 300.0, 20000.0), V,
     "cutoff 20000.0 Hz"),
    # -- ops: other arguments ------------------------------------------------------------------
    ("covariance-ddof-n", lambda t: covariance(traces(2, 1), ddof=1), V, "the divisor would be"),
    ("whitening-cov-not-square", lambda t: whitening_matrix(np.zeros((3, 4))), V,
     "cov: expected a square"),
    ("whitening-cov-empty", lambda t: whitening_matrix(np.zeros((0, 0))), V,
     "cov: expected a square"),
    ("whitening-cov-list", lambda t: whitening_matrix([[1.0]]), T, "cov: expected a NumPy"),
    ("spatial_filter-w-1d", lambda t: spatial_filter(np.ones(8, np.float32), X), V,
     "w: expected a 2-D"),
    ("spatial_filter-w-columns", lambda t: spatial_filter(np.eye(4, dtype=np.float32), X), V,
     "w: has 4 columns but x has 8 channels"),
    ("SpatialFilter-w-empty", lambda t: SpatialFilter(np.zeros((0, 8), np.float32)), V,
     "w: expected a non-empty"),
    ("common_reference-operator", lambda t: common_reference(X, "mode"), V,
     "operator: expected 'median' or 'mean'"),
    ("blank_saturation-threshold-nan", lambda t: blank_saturation(X, float("nan")), V,
     "threshold: expected a finite"),
    ("blank_saturation-direction", lambda t: blank_saturation(X, 1.0, direction="up"), V,
     "direction: expected"),
    ("blank_saturation-fill-inf", lambda t: blank_saturation(X, 1.0, fill=float("inf")), V,
     "fill: expected a finite"),
    ("phase_shift-shifts-length", lambda t: phase_shift(X, [0.0, 0.1]), V, "shifts"),
    ("phase_shift-edges", lambda t: phase_shift(X, np.zeros(8), edges="wrap"), V,
     "edges: expected"),
    ("PCA-0-components", lambda t: PCA(0), V, "n_components: expected >= 1"),
    ("PCA-too-many", lambda t: PCA(30).fit(CLIPS), V, "n_components: 30 components need"),
    ("PCA-1d", lambda t: PCA(2).fit(np.zeros(20, np.float32)), V, "clips: expected [n, taps]"),
    ("PCA-int", lambda t: PCA(2).fit(CLIPS.astype(np.int16)), T, "clips: unsupported dtype"),
    ("PCA-transform-before-fit", lambda t: PCA(2).transform(CLIPS), RuntimeError, "before fit"),
    ("PCA-transform-taps", lambda t: PCA(2).fit(CLIPS).transform(CLIPS[:, :10]), V,
     "clips: 10 taps, but the PCA was fitted on 20"),
    ("pairwise-dims", lambda t: pairwise_sqdist(CLIPS, CLIPS[:, :3]), V,
     "a has 20 dimensions but b has 3"),
    ("pairwise-dtypes", lambda t: pairwise_sqdist(CLIPS, CLIPS.astype(np.float64)), T,
     "convert one explicitly"),
    ("knn-k-0", lambda t: knn(CLIPS, CLIPS, 0), V, "k: expected 1 <= k"),
    ("knn-k-too-many", lambda t: knn(CLIPS, CLIPS, 101), V, "k: expected 1 <= k <= 100"),
    # -- destriping on small probes --------------------------------------------------------------
    ("spatial-highpass-4-channels", lambda t: highpass_spatial_matrix(geom(4)), V,
     "geometry: a group of 4 channels is too small for the spatial high-pass"),
    ("spatial-highpass-4-channels-says-what", lambda t: highpass_spatial_matrix(geom(4)), V,
     "use a common reference instead"),
    ("spatial-highpass-groups-of-2", lambda t: highpass_spatial_matrix(
        geom(8), groups=np.arange(8) // 2), V, "a group of 2 channels is too small"),
    ("spatial-highpass-pad-0", lambda t: highpass_spatial_matrix(geom(8), n_channel_pad=0), V,
     "pass a larger n_channel_pad="),
    ("spatial-highpass-pad-neg", lambda t: highpass_spatial_matrix(geom(8), n_channel_pad=-1),
     V, "n_channel_pad: expected 0 <= n_channel_pad"),
    ("spatial-highpass-pad-float", lambda t: highpass_spatial_matrix(geom(8),
                                                                     n_channel_pad=2.5),
     T, "n_channel_pad: expected an integer"),
    ("spatial-highpass-taper-too-many", lambda t: highpass_spatial_matrix(
        geom(8), n_channel_taper=9), V, "n_channel_taper: expected 0 <= n_channel_taper <= 8"),
    ("spatial-highpass-geometry-count", lambda t: highpass_spatial_filter(X, geom(7), FS), V,
     "geometry: 7 positions for the 8 channels of x"),
    # -- detection -----------------------------------------------------------------------------
    ("detect-1d", lambda t: detect_spikes(ONE_D, geom(), FS), V, "x: expected whitened float"),
    ("detect-int", lambda t: detect_spikes(X.astype(np.int16), geom(), FS), V,
     "x: expected whitened float"),
    ("detect-no-geometry", lambda t: detect_spikes(X, None, FS), V, "geometry: detection needs"),
    ("detect-geometry-shape", lambda t: detect_spikes(X, geom(7), FS), V,
     "geometry: expected [8, 2]"),
    ("detect-threshold-0", lambda t: detect_spikes(X, geom(), FS, threshold=0.0), V,
     "threshold: expected a positive"),
    ("detect-neighbours-0", lambda t: detect_spikes(X, geom(), FS, n_neighbors=0), V,
     "n_neighbors: expected at least 1"),
    ("detect-widths-neg", lambda t: detect_spikes(X, geom(), FS, widths_um=(10.0, -5.0)), V,
     "widths_um: expected one or more positive"),
    ("detect-templates-even", lambda t: detect_spikes(X, geom(), FS,
                                                      templates=np.ones((2, 4))),
     V, "templates: expected [k, taps] with an odd number"),
    ("detect-templates-zero", lambda t: detect_spikes(X, geom(), FS,
                                                      templates=np.zeros((2, 5))),
     V, "templates: a template is all zeros"),
    ("template_noise-1d", lambda t: template_noise(ONE_D, FS), V, "x: expected whitened float"),
    ("learn_templates-1d", lambda t: learn_templates(ONE_D, FS), V,
     "x: expected [channels, samples]"),
    ("spike_features-1d", lambda t: spike_features(ONE_D, np.zeros(0, dspk.detect.SPIKE_DTYPE),
                                                   geom(), FS), V,
     "x: expected [channels, samples]"),
    ("spike_features-geometry", lambda t: spike_features(X, np.zeros(0, dspk.detect.SPIKE_DTYPE),
                                                         geom(3), FS), V,
     "geometry: expected [8, 2]"),
    # -- jobs: the files they read, their lock, device memory (issue 45, items 1, 2, 6) --------
    ("run-inputs-not-paths", lambda t: run(t, inputs={"sidecar": [3]}), V,
     "inputs: expected paths"),
    ("run-inputs-mapping-of-junk", lambda t: run(t, inputs={"sidecar": 3}), V,
     "inputs: expected paths by option"),
    ("run-sidecar-as-out", lambda t: run(t, "side.json", inputs={"sidecar": side(t)},
                                         overwrite=True), V, "sidecar: "),
    ("run-input-list-as-out", lambda t: run(t, "side.json", inputs=[side(t)], overwrite=True),
     V, "inputs: "),
    ("run-sidecar-as-progress", lambda t: run(t, inputs={"meta": side(t, "o.h5.progress.json")}),
     V, "meta: "),
    ("run-sidecar-as-lock", lambda t: run(t, inputs={"meta": side(t, "o.h5.lock")}), V,
     "o.h5.lock beside OUT"),
    ("run-step-file-as-out", lambda t: run(t, "stim.csv", overwrite=True,
                                           artifacts=side(t, "stim.csv", "3000\n")),
     V, "RemoveArtifacts.source: "),
    ("run-lock-held", lambda t: run_locked(t), V, "another job is writing it (pid"),
    ("run-lock-is-a-folder", lambda t: run(t, lock_dir=True), V, "is not a regular file"),
    ("run-gpu-memory-0", lambda t: run(t, gpu_memory=0), V, "gpu_memory: expected a positive"),
    ("run-gpu-memory-negative", lambda t: run(t, gpu_memory=-1), V,
     "gpu_memory: expected a positive"),
    ("run-gpu-memory-float", lambda t: run(t, gpu_memory=8e8), V,
     "gpu_memory: expected a positive number of bytes"),
    ("run-gpu-memory-str", lambda t: run(t, gpu_memory="800M"), V,
     "gpu_memory: expected a positive number of bytes"),
    ("run-gpu-memory-bool", lambda t: run(t, gpu_memory=True), V,
     "gpu_memory: expected a positive number of bytes"),
    # -- preprocess_many: the files its jobs read are never an output (before any cluster) ----
    ("many-geometry-file-as-progress-record",
     lambda t: many(t, geometry=side(t, "raw.h5.progress.json", PROBE_JSON)), PipelineError,
     "geometry: "),
    ("many-inputs-as-out",
     lambda t: many(t, inputs={"sidecar": side(t, "raw.h5")}), PipelineError, "sidecar: "),
    ("many-inputs-inside-kilosort-out",
     lambda t: many(t, format="kilosort", overwrite=True,
                    inputs={"--probe": side(t, "raw/probe.json", PROBE_JSON)}),
     PipelineError, "--probe: "),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_misuse_is_refused_clearly(case, tmp_path):
    name, call, exc, fragment = case
    with pytest.raises(exc) as info:
        call(str(tmp_path))
    assert fragment in str(info.value), str(info.value)


def test_cases_have_unique_ids():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


def test_negative_gain_allowed_when_said():
    rec = open_recording(I16 + 10, fs=FS, gain_to_uv=-0.5, allow_negative_gain=True)
    np.testing.assert_array_equal(rec.read(0, 3, scaled=True), np.full((4, 3), -5.0,
                                                                        np.float32))


# -- the command line ----------------------------------------------------------------------------
RAW_C, RAW_N = 8, 12000


def raw(t) -> str:
    path = os.path.join(t, "raw.bin")
    if not os.path.exists(path):
        (np.random.default_rng(0).standard_normal((RAW_N, RAW_C)) * 30).astype(
            np.int16).tofile(path)
    return path


def probe(t, name="probe.csv", kind="csv") -> str:
    path = os.path.join(t, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pos = [[0.0, 20.0 * i] for i in range(RAW_C)]
    with open(path, "w") as f:
        if kind == "json":
            json.dump({"specification": "probeinterface", "probes": [{
                "ndim": 2, "si_units": "um", "contact_positions": pos}]}, f)
        elif kind == "prb":
            f.write("channel_groups = {0: {'channels': %r, 'geometry': {%s}}}\n" % (
                list(range(RAW_C)), ", ".join(f"{i}: ({x}, {y})" for i, (x, y) in
                                              enumerate(pos))))
        else:
            f.write("".join(f"{x},{y}\n" for x, y in pos))
    return path


BIN = ["--fs", "30000", "--n-channels", str(RAW_C), "--backend", "cpu"]


def pre(t, out, *extra) -> list:
    return ["preprocess", raw(t), os.path.join(t, out), *BIN, "--quiet", *extra]


def many_cli(t, outdir, *extra) -> list:
    """``dspk preprocess-many`` of raw.bin into ``t/outdir`` (one local worker, were a
    cluster to start: `NO_CLUSTER` makes that fail the test)."""
    NO_CLUSTER.append(True)
    return ["preprocess-many", raw(t), os.path.join(t, outdir), *BIN, "--workers", "1",
            "--whiten", "global", *extra]


NO_CLUSTER: list = []


def partial(t, edit=None) -> list:
    """A job stopped after two chunks (its partial kept), then ``edit(t)`` done to it; the
    argv that resumes it."""
    rec = open_recording(raw(t), fs=30000.0, n_channels=RAW_C)

    def stop(done):
        if done >= 6000:
            raise KeyboardInterrupt

    try:
        dspk.Pipeline.from_options(whiten="global", backend="cpu").run(
            rec, os.path.join(t, "o.h5"), chunk_s=0.1, progress=False, on_chunk=stop)
    except KeyboardInterrupt:
        pass
    rec.close()
    if edit is not None:
        edit(t)
    return pre(t, "o.h5", "--whiten", "global", "--chunk", "0.1", "--resume")


def edit_record(t) -> None:
    path = os.path.join(t, "o.h5.progress.json")
    record = json.loads(Path(path).read_text())
    record["done"] = RAW_N
    Path(path).write_text(json.dumps(record))


def damage_partial(t) -> None:
    import h5py
    from dspk.io.rawio import raw_offset
    path = os.path.join(t, "o.h5.partial")
    with h5py.File(path, "r") as f:
        at = raw_offset(f["traces"]) + 4000 * RAW_C * 4
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"\0" * 16)


def truncate_partial(t) -> None:
    path = os.path.join(t, "o.h5.partial")
    os.truncate(path, os.path.getsize(path) // 3)


def lock_held(t) -> list:
    """The argv of a job on o.h5 while this process holds its lock (released by the test)."""
    LOCKS.append(OutputLock(os.path.join(t, "o.h5.lock")).acquire())
    return pre(t, "o.h5", "--whiten", "global")


LOCKS: list = []

# (id, argv(tmp_path), exit status, fragment of stderr or the log, files kept unchanged)
CLI_CASES = [
    ("cli-probe-csv-as-out", lambda t: pre(t, "probe.csv", "--probe", probe(t), "--overwrite"),
     2, "--probe: ", ["probe.csv"]),
    ("cli-probe-json-as-out",
     lambda t: pre(t, "p.json", "--probe", probe(t, "p.json", "json"), "--overwrite"),
     2, "--probe: ", ["p.json"]),
    ("cli-probe-prb-as-out",
     lambda t: pre(t, "p.prb", "--probe", probe(t, "p.prb", "prb"), "--overwrite"),
     2, "--probe: ", ["p.prb"]),
    ("cli-probe-as-out-without-overwrite", lambda t: pre(t, "probe.csv", "--probe", probe(t)),
     2, "never written", ["probe.csv"]),
    ("cli-probe-as-progress-record",
     lambda t: pre(t, "o.h5", "--probe", probe(t, "o.h5.progress.json", "json")),
     2, "o.h5.progress.json beside OUT", ["o.h5.progress.json"]),
    ("cli-probe-inside-kilosort-out",
     lambda t: pre(t, "ks", "--format", "kilosort", "--probe", probe(t, "ks/probe.csv"),
                   "--overwrite"), 2, "--probe: ", ["ks/probe.csv"]),
    ("cli-probe-inside-detect-outdir",
     lambda t: ["detect", raw(t), os.path.join(t, "pk"), *BIN, "--probe",
                probe(t, "pk/probe.csv"), "--overwrite"], 2, "--probe: ", ["pk/probe.csv"]),
    ("cli-artifacts-file-as-out",
     lambda t: pre(t, "stim.csv", "--artifacts", side(t, "stim.csv", "3000\n"),
                   "--overwrite"), 2, "--artifacts: ", ["stim.csv"]),
    ("cli-input-as-out", lambda t: pre(t, "raw.bin", "--overwrite", "--whiten", "global"),
     2, "is the input", ["raw.bin"]),
    ("cli-lock-held", lock_held, 2, f"another job is writing it (pid {os.getpid()}", []),
    ("cli-lock-is-a-folder",
     lambda t: (os.mkdir(os.path.join(t, "o.h5.lock")), pre(t, "o.h5", "--whiten", "global"))[1],
     2,
     "o.h5.lock: is not a regular file", []),
    ("cli-resume-record-edited", lambda t: partial(t, edit_record), 0,
     "checksum does not match", []),
    ("cli-resume-partial-damaged", lambda t: partial(t, damage_partial), 0,
     "samples 3000 to 6000 do not match their checksum", []),
    ("cli-resume-partial-truncated", lambda t: partial(t, truncate_partial), 0,
     "starting over", []),
    ("cli-resume-other-options",
     lambda t: partial(t) + ["--highpass", "500"], 0,
     "other parameters (the steps' options or fitted state differ)", []),
    ("cli-resume-other-chunk", lambda t: partial(t) + ["--chunk", "0.2"], 0,
     "other parameters (chunk differ)", []),
    ("cli-resume-record-gone",
     lambda t: partial(t, lambda t: os.remove(os.path.join(t, "o.h5.progress.json"))), 0,
     "no progress record next to it; starting over", []),
    ("cli-gpu-memory-zero", lambda t: pre(t, "o.h5", "--gpu-memory", "0"), 2,
     "--gpu-memory: expected a positive number of bytes", []),
    ("cli-gpu-memory-negative", lambda t: pre(t, "o.h5", "--gpu-memory=-1G"), 2,
     "--gpu-memory: expected a positive number of bytes", []),
    ("cli-gpu-memory-word", lambda t: pre(t, "o.h5", "--gpu-memory", "lots"), 2,
     "--gpu-memory: expected a positive number of bytes", []),
    ("cli-gpu-memory-unit", lambda t: pre(t, "o.h5", "--gpu-memory", "8XB"), 2,
     "--gpu-memory: expected a positive number of bytes", []),
    ("cli-gpu-memory-nan", lambda t: pre(t, "o.h5", "--gpu-memory", "nan"), 2,
     "--gpu-memory: expected a positive number of bytes", []),
    ("cli-gpu-memory-inf", lambda t: pre(t, "o.h5", "--gpu-memory", "inf"), 2,
     "--gpu-memory: expected a positive number of bytes", []),
    ("cli-gpu-memory-fraction", lambda t: pre(t, "o.h5", "--gpu-memory", "0.5"), 2,
     "--gpu-memory: expected a positive number of bytes", []),
    # preprocess-many: the files named by options are protected as preprocess's are (refused
    # for every recording before a cluster starts: `many_cli` fails the test if one starts)
    ("cli-many-probe-as-progress-record",
     lambda t: many_cli(t, "out", "--probe", probe(t, "out/raw.h5.progress.json", "json")),
     2, "--probe: ", ["out/raw.h5.progress.json"]),
    ("cli-many-probe-as-progress-record-overwrite",
     lambda t: many_cli(t, "out", "--probe", probe(t, "out/raw.h5.progress.json", "json"),
                        "--overwrite"), 2, "raw.h5.progress.json beside OUT",
     ["out/raw.h5.progress.json"]),
    ("cli-many-probe-inside-kilosort-out",
     lambda t: many_cli(t, "ks", "--format", "kilosort", "--probe", probe(t, "ks/raw/p.csv"),
                        "--overwrite"), 2, "--probe: ", ["ks/raw/p.csv"]),
    ("cli-many-probe-json-inside-kilosort-out",
     lambda t: many_cli(t, "ks", "--format", "kilosort", "--probe",
                        probe(t, "ks/raw/chanMap.json", "json"), "--overwrite"), 2, "--probe: ",
     ["ks/raw/chanMap.json"]),
    ("cli-many-artifacts-as-progress-record",
     lambda t: many_cli(t, "out", "--artifacts", side(t, "out/raw.h5.progress.json", "3000\n")),
     2, "--artifacts: ", ["out/raw.h5.progress.json"]),
    ("cli-many-artifacts-inside-kilosort-out",
     lambda t: many_cli(t, "ks", "--format", "kilosort", "--artifacts",
                        side(t, "ks/raw/stim.csv", "3000\n"), "--overwrite"), 2, "--artifacts: ",
     ["ks/raw/stim.csv"]),
    # --subject: NWB's alone, KEY=VALUE (preprocess's in tests/pipeline/test_metadata_roundtrip)
    ("cli-many-subject-without-nwb", lambda t: many_cli(t, "out", "--subject", "age=P1D"), 2,
     "--subject: only --format nwb stores the subject", []),
    ("cli-many-subject-without-key", lambda t: many_cli(t, "out", "--format", "nwb",
                                                        "--subject", "P1D"), 2,
     "--subject: expected KEY=VALUE", []),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_misuse_is_refused_or_redone_clearly(case, tmp_path, capsys, caplog, monkeypatch):
    name, argv, status, fragment, kept = case
    t = str(tmp_path)
    args = argv(t)
    before = {k: Path(t, k).read_bytes() for k in kept}
    if NO_CLUSTER:                         # a refused preprocess-many starts no cluster
        from dspk import dask as dspk_dask

        def no_cluster(*a, **kw):   # (no Exception: the command cannot print it as its error)
            pytest.fail("a cluster was started for a refused call")

        monkeypatch.setattr(dspk_dask, "cluster_client", no_cluster)
    try:
        with caplog.at_level(logging.INFO, "dspk"):
            try:
                rc = cli.main(args)
            except SystemExit as exc:      # argparse's own refusals
                rc = exc.code
    finally:
        NO_CLUSTER.clear()
        while LOCKS:
            LOCKS.pop().release()
    said = capsys.readouterr().err + caplog.text
    assert rc == status, said
    assert fragment in said, said
    assert "Traceback" not in said
    for k, data in before.items():
        assert Path(t, k).read_bytes() == data, k
    if status == 0 and "--resume" in args:      # redone: the bytes of a job that never stopped
        import h5py
        ref = open_recording(raw(t), fs=30000.0, n_channels=RAW_C)
        extra = ({"highpass": 500.0} if "500" in args else {})
        chunk = 0.2 if "0.2" in args else 0.1
        whole = dspk.Pipeline.from_options(whiten="global", backend="cpu", **extra).run(
            ref, os.path.join(t, "whole.h5"), chunk_s=chunk, progress=False)
        ref.close()
        with h5py.File(os.path.join(t, "o.h5"), "r") as a, h5py.File(whole, "r") as b:
            np.testing.assert_array_equal(a["traces"][:], b["traces"][:])


def test_cli_cases_have_unique_ids_and_the_bar_is_reached():
    ids = [c[0] for c in CLI_CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) + len(CLI_CASES) >= 150
