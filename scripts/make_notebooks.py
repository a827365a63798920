#!/usr/bin/env python3
"""Writes notebooks/*.ipynb from the cells below and executes them (nbclient) so that the
committed notebooks show their outputs and figures. The test suite executes them again.

    python scripts/make_notebooks.py [--no-execute] [NAME.ipynb ...]   (those named, else all)
"""

# ruff: noqa: E501  (the cells' lines are notebook code, not this module's)
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]

SETUP = '''from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import dspk
from dspk import plot

# the repository's root, wherever the notebook is started from
root = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "data" / "sample.nwb").exists())
gpu = dspk.gpu_available()
if gpu:                      # the same calls on CuPy arrays run on the GPU
    import cupy as xp
else:
    xp = np
print("dspk", dspk.__version__, "on the", "GPU" if gpu else "CPU")'''

QUICKSTART = [
    ("md", """# dspk quick start

Open the bundled recording, look at it, preprocess it (high-pass, median reference, local
whitening), detect spikes, and see what each step did. Runs on the CPU; with CuPy and a GPU
the same cells run there (`backend="auto"`)."""),
    ("code", SETUP),
    ("md", """`dspk info` describes a recording: its series, shape, sampling rate, µV scaling
and probe geometry (the same as `dspk info data/sample.nwb` in a shell)."""),
    ("code", '''from dspk.cli import main as dspk_cli

_ = dspk_cli(["info", str(root / "data" / "sample.nwb")])'''),
    ("code", '''rec = dspk.open_recording(root / "data" / "sample.nwb")   # finds the ElectricalSeries
x = rec.read(0, 60000)                # the first 2 s, [channels, samples] float32 in µV
print(rec)
print(x.shape, x.dtype)'''),
    ("md", """The pipeline of `dspk preprocess IN OUT --highpass 300 --reference median
--whiten local`. Whitening is fitted on a seeded sample of chunks spread over the recording;
`run` writes the whole recording chunk by chunk to HDF5 (under a temporary name, renamed when
complete) and `transform` applies the same steps to an array."""),
    ("code", '''import tempfile

pipe = dspk.Pipeline.from_options(highpass=300, reference="median", whiten="local",
                                  n_neighbors=16, backend="auto").fit(rec)
out = Path(tempfile.mkdtemp()) / "sample-preprocessed.h5"
pipe.run(rec, out, chunk_s=0.5, progress=False)
y = dspk.open_recording(out).read(0, 60000)      # the output is a recording too
print(out.name, {k: round(v, 3) for k, v in pipe.last_run.items() if isinstance(v, float)})'''),
    ("code", '''fig = plot.before_after(x, y, rec.fs, channels=range(12), start_s=0.5, duration_s=0.1,
                        units=("µV", "σ"), titles=("raw", "high-pass, median reference, whitened"))'''),
    ("md", """Whitening removes the noise shared between neighbouring channels: the covariance of
the filtered traces is broad, W is local (16 neighbours)."""),
    ("code", '''k = [o["step"] for o in pipe.options()].index("Whiten")
xf = dspk.fir_filter(x, dspk.highpass_taps(rec.fs, 300))
fig = plot.covariance_and_whitening(dspk.covariance(xf), pipe.states[k]["W"])'''),
    ("md", """Spike detection on the whitened traces: universal templates correlated per
channel, combined around every contact with Gaussian weights of several widths, local maxima
in time and space. Amplitudes are in noise standard deviations."""),
    ("code", '''spikes = dspk.detect_spikes(y, rec.geometry, rec.fs)
print(len(spikes), "spikes in 2 s;", spikes.dtype.names)
fig = plot.probe(rec.geometry, spikes, positions=rec.geometry, widths_um=(10, 20, 30, 40, 50))'''),
    ("code", '''fig = plot.waveforms(y, spikes, rec.geometry, rec.fs)'''),
    ("code", '''feats, channels, pca = dspk.spike_features(y, spikes, rec.geometry, rec.fs)
fig = plot.features(feats, labels=spikes["template_index"], label_name="template")'''),
    ("md", """The recording has ground truth: how many of the known spikes were found
(within 0.5 ms)?"""),
    ("code", '''import h5py

with h5py.File(root / "data" / "sample.nwb", "r") as f:
    truth = f["analysis/ground_truth/sample_index"][:]
truth = truth[(truth > 100) & (truth < 60000 - 100)]
found = np.abs(spikes["sample_index"][None, :] - truth[:, None]).min(axis=1) <= 15
print(f"{found.mean():.0%} of {len(truth)} known spikes found")
assert found.mean() >= 0.9, "fewer than 90% of the known spikes found"'''),
]

ENGINE = [
    ("md", """# The engine: `dspk.matmul`, `explain()`, the tuner, exactness

Every heavy operation in dspk is a matrix product computed by one engine: **exact** (in the
operands' own precision — never TF32, never a silent down-cast; integers bit-exactly) and
**tuned** (every candidate timed on first sight of a device, dtype, layout and size class;
the fastest correct one remembered on disk)."""),
    ("code", SETUP),
    ("code", '''rng = np.random.default_rng(0)
x = xp.asarray(rng.standard_normal((64, 30000), dtype=np.float32) + 5)  # [channels, samples]
c = dspk.matmul(x, x.T)          # channel covariance (uncentred): X·Xᵀ, float32
print(type(c).__module__, c.shape, c.dtype)
print(dspk.explain(x, x.T))'''),
    ("md", """`explain` says which candidate runs, why (timed now, or read from the tuner's cache),
and what the others measured. As a figure:"""),
    ("code", '''fig = plot.tuner_timings(dspk.explain(x, x.T))'''),
    ("md", """**Exactness.** The float32 result against a float64 reference: the error is that of
float32 accumulation (~1e-7 relative), not TF32's ~1e-3."""),
    ("code", '''def to_host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)

ref = to_host(x).astype(np.float64) @ to_host(x).astype(np.float64).T
err = np.linalg.norm(to_host(c) - ref) / np.linalg.norm(ref)
print(f"relative error vs float64: {err:.2e}")
assert err < 1e-5, "not float32 accuracy"'''),
    ("md", """Integers are multiplied bit-exactly: raw int16 traces give the int64 product (on
the GPU through INT8 tensor cores, int16 split in two int8 planes)."""),
    ("code", '''raw = xp.asarray(rng.integers(-2000, 2000, (32, 30000), dtype=np.int16))
g = dspk.int_matmul(raw, raw.T)
exact = to_host(raw).astype(np.int64) @ to_host(raw).astype(np.int64).T
print(g.dtype, "bit-exact:", bool((to_host(g) == exact).all()))
assert (to_host(g) == exact).all(), "the integer product is not exact"'''),
    ("md", """**Views instead of copies.** A `MatrixView` is shape `(batches, rows, cols)` with
element strides and an offset over a 1-D buffer: transposes and column ranges cost nothing,
and every view is bounds-checked before a kernel runs."""),
    ("code", '''from dspk.linalg import MatrixView

v = MatrixView.of(x).cols(1000, 2000)          # a 1000-sample window, no copy
w = xp.asarray(rng.standard_normal((8, 64), dtype=np.float32))
y = dspk.matmul(w, v)                           # a spatial filter on the window
close = np.allclose(to_host(y), to_host(w) @ to_host(x)[:, 1000:2000], rtol=1e-4, atol=1e-3)
print(y.shape, close)
assert close, "the product on a view differs from NumPy's on a copy"'''),
    ("md", """Bad input is refused, never converted: here float32 times float64."""),
    ("code", '''try:
    dspk.matmul(x, x.astype(np.float64).T)
except TypeError as e:
    print("refused:", e)'''),
    ("md", """The same engine measured on an H200 against CuPy and PyTorch (the covariance of
384 channels × 60000 samples; `python benchmarks/bench_linalg.py --backend gpu`):"""),
    ("code", '''fig = plot.benchmark_bars(root / "benchmarks" / "results" / "bench_linalg-gpu-h200-2026-12-02.json",
                          case="cov384")'''),
]

MATCH = [
    ("md", """# Template-bank matching on an image: `ncc` and `ncc_peaks`

Normalized cross-correlation (OpenCV's TM_CCOEFF_NORMED) of a bank of templates with an
image. The numerator Σ window·template is an exact integer product (im2col × the bank, on
INT8 tensor cores on the GPU) and the window sums come from exact integral images; only the
final ratio is float32. The image is scikit-image's *coins* (bundled as `data/coins.png`)."""),
    ("code", SETUP),
    ("code", '''import dspk.match

img = (plt.imread(root / "data" / "coins.png") * 255).round().astype(np.uint8)
if img.ndim == 3:
    img = img[..., 0]
corners = [(40, 40), (120, 200), (200, 300), (60, 280)]
bank = np.stack([img[r:r + 24, c:c + 24] for r, c in corners])   # 4 templates of 24x24
print(img.shape, img.dtype, "bank", bank.shape)'''),
    ("code", '''maps = dspk.match.ncc(xp.asarray(img), xp.asarray(bank))     # [4, H-23, W-23] float32
peaks = dspk.match.ncc_peaks(xp.asarray(img), xp.asarray(bank), threshold=0.8, min_distance=8)
print(maps.shape, maps.dtype, len(peaks), "peaks")
print(peaks[:6])'''),
    ("code", '''fig, axes = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
axes[0].imshow(img, cmap="gray")
for k, (r, c) in enumerate(corners):
    axes[0].add_patch(plt.Rectangle((c, r), 24, 24, fill=False, color=f"C{k}", lw=1.5))
for p in peaks:
    axes[0].plot(p["x"] + 12, p["y"] + 12, "x", color=f"C{p['template_index']}", ms=8)
axes[0].set_title("templates (squares), peaks >= 0.8 (x, colour = template)")
axes[0].set_xlabel("x (pixel)"); axes[0].set_ylabel("y (pixel)")
im = axes[1].imshow(np.asarray(maps[0].get() if gpu else maps[0]), cmap="RdBu_r", vmin=-1, vmax=1)
axes[1].set_title("NCC map of template 0")
axes[1].set_xlabel("x (pixel)"); axes[1].set_ylabel("y (pixel)")
_ = fig.colorbar(im, ax=axes[1], label="correlation coefficient")'''),
    ("md", """**The exact numerator.** At any position, the correlation's numerator is an integer:
Σ window·template − (Σ window)(Σ template)/K. dspk forms it in int64; here one position
checked against a direct NumPy computation in Python integers."""),
    ("code", '''from fractions import Fraction
import math

r, c = int(peaks[0]["y"]), int(peaks[0]["x"])
t = bank[int(peaks[0]["template_index"])].astype(np.int64)
w = img[r:r + 24, c:c + 24].astype(np.int64)
K = t.size
num = Fraction(int((w * t).sum())) - Fraction(int(w.sum()) * int(t.sum()), K)
var_w = Fraction(int((w * w).sum())) - Fraction(int(w.sum()) ** 2, K)
var_t = Fraction(int((t * t).sum())) - Fraction(int(t.sum()) ** 2, K)
exact = float(num) / math.sqrt(float(var_w) * float(var_t))
print(f"exact {exact:.7f}  dspk {float(peaks[0]['score']):.7f}")
assert abs(exact - float(peaks[0]["score"])) < 1e-6, "the score is not the exact one"'''),
    ("md", """`TemplateBank` prepares a bank once (its sums, its matrix for the engine, its packed
words for the fused GPU kernel) for many images; `ncc_direct` is the slow reference the tests
compare with."""),
    ("code", '''tb = dspk.match.TemplateBank(xp.asarray(bank))
same = np.array_equal(np.asarray(tb.ncc(xp.asarray(img)).get() if gpu else tb.ncc(img)),
                      np.asarray(maps.get() if gpu else maps))
ref = dspk.match.ncc_direct(img[:120, :160], bank)
worst = float(np.abs(np.asarray(dspk.match.ncc(img[:120, :160], bank)) - ref).max())
print("bank reused, same maps:", same, "| max |engine - direct| on a crop:", worst)
assert same and worst < 1e-5, "the prepared bank or the engine disagrees with the reference"'''),
]

DASK = [
    ("md", """# Many recordings with Dask

`dspk.dask.preprocess_many` fans recordings out over a `dask.distributed` cluster: each
recording is one job of the single-process pipeline, written atomically; a failing recording
is reported and does not stop the others. Here three small recordings on two local worker
processes (with dask-cuda and `backend="gpu"`: one worker per GPU)."""),
    ("code", SETUP),
    ("code", '''import tempfile

import h5py

work = Path(tempfile.mkdtemp())
rng = np.random.default_rng(0)
geom = np.stack([np.tile([0.0, 32.0], 8), np.repeat(np.arange(8) * 20.0, 2)], 1)
for i in range(3):
    noise = rng.standard_normal((60000, 16)) @ rng.standard_normal((16, 16)) * 10
    with h5py.File(work / f"session{i}.h5", "w") as f:
        d = f.create_dataset("traces", data=np.rint(noise).astype(np.int16))
        d.attrs["fs"] = 30000.0
        d.attrs["geometry"] = geom
(work / "broken.h5").write_bytes(b"not an HDF5 file")
print(sorted(p.name for p in work.iterdir()))'''),
    ("code", '''from dspk.dask import close_client, cluster_client, preprocess_many

client = cluster_client(workers=2)            # a LocalCluster of 2 worker processes
try:
    results = preprocess_many(str(work / "*.h5"), work / "out", client=client,
                              highpass=300.0, reference="median", whiten="global")
finally:
    close_client(client)
for path, res in sorted(results.items()):
    print(Path(path).name, "->", res if not isinstance(res, Exception) else f"FAILED: {res!r}"[:90])'''),
    ("md", """(The worker logs the broken file's error on stderr; the results map each path to its
output or its exception.) The outputs are those of the single-process pipeline, bit for
bit:"""),
    ("code", '''single = work / "single0.h5"
dspk.preprocess(str(work / "session0.h5"), single, highpass=300.0, reference="median",
                whiten="global", progress=False)
with h5py.File(results[str(work / "session0.h5")]) as a, h5py.File(single) as b:
    identical = np.array_equal(a["traces"][:], b["traces"][:])
print("identical:", identical)
assert identical, "the cluster's output differs from the single process's"'''),
    ("md", """One recording as a lazy dask array (blocks along time read through `dspk.io`) and the
pipeline as a graph with halos (`map_overlap`):"""),
    ("code", '''from dspk.dask import apply, fit, to_dask

rec = dspk.open_recording(work / "session1.h5")
arr = to_dask(rec, chunk=15000)
pipe = fit(dspk.Pipeline.from_options(highpass=300.0, whiten="global", backend="cpu"), rec)
y = apply(pipe, arr)
print(arr)
same = np.allclose(y.compute(scheduler="threads"), pipe.transform(rec.read()), atol=1e-4)
print("graph == transform:", same)
assert same, "the dask graph differs from Pipeline.transform"'''),
    ("md", """Measured overhead (`python benchmarks/bench_dask.py`): on a 2-core machine, and one
GPU worker against the single process on an H200."""),
    ("code", '''res = sorted((root / "benchmarks" / "results").glob("bench_dask-gpu-h200-*.json"))[-1]
fig = plot.benchmark_bars(res, value="xrt")'''),
]

SPIKEINTERFACE = [
    ("md", """# dspk with SpikeInterface and Kilosort4

dspk inside a SpikeInterface chain (a lazy preprocessor, its outputs read back, its peaks in
SpikeInterface's form), then the hand-off to Kilosort4: a folder it sorts without
preprocessing again. Runs on the CPU; the sort itself runs where a GPU and Kilosort4 are."""),
    ("code", SETUP),
    ("md", """## dspk inside a SpikeInterface chain

`dspk.spikeinterface` puts dspk's pipeline into a SpikeInterface chain and reads dspk's
outputs back as SpikeInterface recordings. `dspk_preprocess(recording, **options)` takes the
options of `dspk preprocess` (`highpass`, `reference`, `whiten`, `preset`, `backend`, ...),
fits the pipeline on the recording now and computes traces only when SpikeInterface asks for
them, chunk by chunk (`Pipeline.block`, with the filters' halo on each side). SpikeInterface's
own names are taken too: `freq_min`/`freq_max` (its `highpass_filter`/`bandpass_filter`),
`reference="global"` with `operator="median"|"average"` (`common_reference`), `mode`,
`radius_um`, `int_scale` and `dtype="int16"` (`whiten`)."""),
    ("code", '''import spikeinterface.core as si
from dspk.spikeinterface import dspk_detect_peaks, dspk_preprocess, read_dspk

# the bundled recording, as SpikeInterface would hand it over (any SpikeInterface recording
# works: read_spikeglx, read_openephys, read_nwb, ...)
raw = dspk.open_recording(root / "data" / "sample.nwb")
rec = si.NumpyRecording([raw.read(scaled=False).T], sampling_frequency=raw.fs)
rec.set_channel_gains(raw.gain_to_uv)
rec.set_channel_offsets(raw.offset_to_uv)
rec.set_dummy_probe_from_locations(raw.geometry)
pre = dspk_preprocess(rec, highpass=300, reference="median", whiten="local", n_neighbors=16)
print(pre)
print("steps:", [s["step"] for s in pre.pipeline.options()])
print("units:", pre.get_property("physical_unit")[0], "| µV gains:",
      "yes" if pre.has_scaleable_traces() else "none (whitened traces are not µV)")'''),
    ("md", """Whitened traces are in units of the noise's standard deviation, so the recording carries no
µV gains: SpikeInterface will not take them for µV. The traces served are those that
`dspk preprocess` writes for the same recording and options (up to float32 rounding), for
any chunk SpikeInterface asks for:"""),
    ("code", '''import tempfile

folder = Path(tempfile.mkdtemp())
out = dspk.Pipeline.from_options(highpass=300, reference="median", whiten="local",
                                 n_neighbors=16).run(dspk.open_recording(rec),
                                                     folder / "sample-dspk.h5", progress=False)
written = read_dspk(out)                   # the output as a SpikeInterface recording

whole = written.get_traces()               # [samples, channels] float32
chunk = pre.get_traces(start_frame=123_456, end_frame=129_000)
print("largest difference, one chunk:", float(np.abs(chunk - whole[123_456:129_000]).max()))
saved = pre.save(format="binary", folder=folder / "binary", n_jobs=2, chunk_duration="0.5s",
                 progress_bar=False)       # two worker processes, the same fitted W
print("largest difference, n_jobs=2:", float(np.abs(saved.get_traces() - whole).max()))
# `saved` is what a sorter gets: run_sorter("kilosort4", saved, ...) reads its binary in
# place, while the lazy `pre` would be computed and written again by the sorter's wrapper
assert saved.binary_compatible_with(time_axis=0, file_paths_length=1)
assert not pre.binary_compatible_with(time_axis=0, file_paths_length=1)'''),
    ("md", """An int16 copy, half the bytes: `dtype="int16"` stores the traces at 200 steps per noise SD
(Kilosort4's factor; SpikeInterface's `int_scale` sets another), and the recording's gains say
so — whitened traces have no µV gain, so SpikeInterface's `SortingAnalyzer` keeps them in
these units instead of taking them for µV. (Saving the float32 `pre` with
`save(dtype="int16")` would cast noise SDs to a few integer levels.) Here with SpikeInterface's
option names:"""),
    ("code", '''pre16 = dspk_preprocess(rec, freq_min=300, reference="global", operator="median",
                        mode="local", n_neighbors=16, dtype="int16")
assert pre16.pipeline.options() == pre.pipeline.options()     # the same steps as `pre`
saved16 = pre16.save(format="binary", folder=folder / "int16", progress_bar=False)
step = float(saved16.get_property("gain_to_physical_unit")[0])     # noise SDs per step
err = np.sqrt(np.mean((saved16.get_traces() * step - whole) ** 2)) / np.sqrt(np.mean(whole ** 2))
print(saved16.get_dtype(), f"1 step = {step} noise SD; relative RMS error {err:.1e};",
      "µV gains:", "yes" if saved16.has_scaleable_traces() else "none")
assert err < 2e-3'''),
    ("code", '''fig, ax = plt.subplots(figsize=(9, 3))
t = np.arange(120_000, 123_000) / rec.sampling_frequency
ax.plot(t, whole[120_000:123_000, 10], lw=0.8, label="dspk preprocess (read_dspk)")
ax.plot(t, pre.get_traces(start_frame=120_000, end_frame=123_000)[:, 10], lw=0.8, ls="--",
        label="dspk_preprocess in SpikeInterface")
ax.set_xlabel("time (s)"); ax.set_ylabel("noise SDs"); ax.legend(loc="upper right")
plt.show()'''),
    ("md", """`read_dspk` reads `/traces` by its own shape (`/spikes` and the fitted state follow it in the
file) with the channel ids, the positions as a probe, the shanks as groups and the units dspk
stored:"""),
    ("code", '''print(written)
print("channel ids:", written.channel_ids[:4], "...")
print("locations:", written.get_channel_locations()[:2].tolist(), "...")
print("groups:", np.unique(written.get_channel_groups()))
print("units:", written.get_property("physical_unit")[0])'''),
    ("md", """Peaks in SpikeInterface's form: `dspk_detect_peaks` runs dspk's detection and returns
SpikeInterface's peak dtype (the amplitude is the processed trace at the spike's trough) with
the locations apart, as `localize_peaks` gives them: `NumpySorting.from_peaks`,
`select_peaks` and the motion estimation take them. (`dspk detect OUT peaks/` writes the same
on the command line: `peaks.npy`, `peak_locations.npy`.)"""),
    ("code", '''peaks, locations = dspk_detect_peaks(written, highpass=None, reference="none", whiten="none")
print(len(peaks), "peaks;", peaks.dtype)
sorting = si.NumpySorting.from_peaks(peaks, written.sampling_frequency, written.channel_ids)
print(sorting)'''),
    ("md", """For a motion estimate, `dspk_motion_peaks` gives the spikes dspk's own drift correction
(`motion="rigid"|"nonrigid"`) registers, each placed between the contacts
(`dspk.motion.localize`), in `localize_peaks`' dtype: ready for SpikeInterface's
`estimate_motion(recording, peaks, peak_locations, ...)` (the detecting contact's position,
`dspk_detect_peaks`' locations, makes a coarser estimate)."""),
    ("code", '''from dspk.spikeinterface import dspk_motion_peaks

motion_peaks, motion_locations = dspk_motion_peaks(rec, whiten="global")
on_contacts = np.isin(motion_locations["y"], rec.get_channel_locations()[:, 1]).mean()
print(len(motion_peaks), "peaks;", motion_locations.dtype,
      f"| {on_contacts:.0%} at a contact's depth")'''),
    ("md", """## From a SpikeInterface recording to Kilosort4, preprocessed once

Kilosort4 high-pass filters and whitens the data again on every run, in every one of its
passes over the recording. dspk can do that work once and write a folder that Kilosort4
sorts as it is: `format="kilosort"` (`dspk preprocess IN OUT --format kilosort` in a shell).
Here the input is a SpikeInterface recording of the bundled NWB file; `dspk.open_recording`
takes it with its channel locations."""),
    ("code", '''import json
import tempfile
from pathlib import Path

import h5py
import numpy as np
import probeinterface
import spikeinterface.extractors as se

import dspk
from dspk import plot

si_rec = se.read_nwb(str(root / "data" / "sample.nwb"))
rec = dspk.open_recording(si_rec)            # the SpikeInterface recording, its locations too
pipe = dspk.Pipeline.from_options(preset="kilosort")   # Kilosort4's steps: high-pass, CAR, whitening
work = Path(tempfile.mkdtemp())
ks_in = pipe.run(rec, work / "ks_in", format="kilosort", progress=False)
print(ks_in, sorted(p.name for p in ks_in.iterdir()))'''),
    ("md", """The folder holds the traces as a flat int16 binary ([samples, channels], no header), the
probe three times (Kilosort's `chanMap.json` and `chanMap.mat`, probeinterface's
`probe.json`), Phy's `params.py` and `dspk.json`, which says what one int16 step is: whitened
traces are stored at 200 steps per noise SD, the factor Kilosort4 itself uses when it saves
whitened data."""),
    ("code", '''about = json.loads((ks_in / "dspk.json").read_text())
print({k: about[k] for k in ("dtype", "n_channels", "n_samples", "fs", "scale", "units")})
ks_settings = json.loads((ks_in / "kilosort_settings.json").read_text())   # Kilosort4's own
print(json.dumps(ks_settings))                 # as the file holds it
print((ks_in / "params.py").read_text())
traces = np.fromfile(ks_in / "traces.bin", dtype=about["dtype"]).reshape(-1, about["n_channels"])
white = traces.T * about["scale"]            # back to noise SDs, [channels, samples]
print(f"noise SD per channel: {np.median(white.std(axis=1)):.2f} (median)")
assert traces.shape == (rec.n_samples, rec.n_channels)
assert 0.8 < np.median(white.std(axis=1)) < 1.2          # whitened: unit noise
_ = plot.traces(white, rec.fs, start_s=1.0, duration_s=0.05, unit="noise SD",
                title="traces.bin, whitened (the first 16 channels)")'''),
    ("md", """The probe as Kilosort4 and SpikeInterface read it: the same positions as the recording's."""),
    ("code", '''ks_probe = json.loads((ks_in / "chanMap.json").read_text())
print({k: (v[:4] if isinstance(v, list) else v) for k, v in ks_probe.items()})
pi_probe = probeinterface.read_probeinterface(ks_in / "probe.json").probes[0]
assert np.array_equal(np.c_[ks_probe["xc"], ks_probe["yc"]], rec.geometry)
assert np.array_equal(pi_probe.contact_positions, rec.geometry)
_ = plot.probe(rec.geometry)
try:                                         # Kilosort4's own loader, where kilosort is installed
    from kilosort.io import load_probe
    print("kilosort.io.load_probe:", {k: v[:4] for k, v in load_probe(ks_in / "chanMap.json").items()
                                      if k != "n_chan"})
except ImportError:
    print("kilosort is not installed here (pip install kilosort): its loader is not shown")'''),
    ("md", """## The sort

SpikeInterface's Kilosort4 wrapper reads the binary in place. Kilosort4's preprocessing is
skipped (`skip_kilosort_preprocessing=True`), its common reference too (`do_CAR=False`: dspk
referenced the traces), and its `scale` setting turns the int16 steps back into noise SDs,
the units its thresholds are in; `kilosort_settings.json` holds these values. Kilosort4 alone
takes the same file: `run_kilosort(settings=ks_settings["settings"],
probe=load_probe(ks_in / ks_settings["probe"]), data_dir=ks_in,
data_dtype=ks_settings["data_dtype"], do_CAR=ks_settings["do_CAR"])`. Without a GPU (or
without Kilosort4) the cell shows the call instead of running it."""),
    ("code", '''import spikeinterface as si
from spikeinterface.sorters import installed_sorters, run_sorter

ks_rec = si.read_binary(ks_in / "traces.bin", sampling_frequency=about["fs"], time_axis=0,
                        num_channels=about["n_channels"], dtype=about["dtype"])
ks_rec.set_probegroup(probeinterface.read_probeinterface(ks_in / "probe.json"))
options = dict(skip_kilosort_preprocessing=ks_settings["skip_kilosort_preprocessing"],
               do_CAR=ks_settings["do_CAR"], scale=ks_settings["settings"].get("scale"),
               nblocks=0)                    # 8 s hold no drift to estimate
try:
    import torch
    gpu = torch.cuda.is_available()
except ImportError:
    gpu = False
if gpu and "kilosort4" in installed_sorters():
    sorting = run_sorter("kilosort4", ks_rec, folder=work / "ks_out", **options)
    with h5py.File(root / "data" / "sample.nwb", "r") as f:
        truth = f["analysis/ground_truth/sample_index"][:]
    found = np.sort(np.concatenate([sorting.get_unit_spike_train(u) for u in sorting.unit_ids]))
    recall = np.mean([np.any(np.abs(found - t) <= 15) for t in truth])
    print(f"{len(sorting.unit_ids)} units; {recall:.0%} of the ground-truth spikes found")
else:
    print("no GPU with Kilosort4 here; on a machine with one, the run_sorter call above runs "
          "with the options", ", ".join(sorted(options)))'''),
    ("md", """## The sort it feeds: true units found, three chains in front of Kilosort4

`benchmarks/bench_sorting.py` asks the question a lab asks before switching: on SpikeInterface's
drifting ground-truth recordings (NP1.0 geometry, written as int16 binaries with their probe),
how many true units does Kilosort4 find, with accuracy ≥ 0.8, when it sorts (1) the raw binary
with its own preprocessing and drift correction, (2) dspk's `--preset kilosort --motion
nonrigid --format kilosort` folder with its own preprocessing and drift correction off, and
(3) SpikeInterface's chain (high-pass, median reference, `correct_motion`, whitening) through
`run_sorter`? Scored by `spikeinterface.comparison.compare_sorter_to_ground_truth`. The results
are committed under `benchmarks/results/`; the cell below reads the largest runs there (every
seed) and shows each ground-truth unit's accuracy in each arm (units ordered by their
accuracy in Kilosort4 alone)."""),
    ("code", '''import matplotlib.pyplot as plt

runs = sorted((root / "benchmarks" / "results").glob("bench_sorting-*.json"))
docs = [json.loads(p.read_text()) for p in runs]
size = [d["recordings"]["channels"] * d["recordings"]["seconds"] for d in docs]
docs = [d for d, s in zip(docs, size) if s == max(size)]   # the largest runs, every seed
panels = []
for doc in docs:
    arms = [r for r in doc["arms"] if not r.get("variant")]   # each arm as a user runs it
    for r in arms:
        assert {"recording", "arm", "well_detected", "accuracy_median", "preprocess_s",
                "sort_s"} <= set(r)
        assert r["well_detected"] == sum(a >= 0.8 for a in r["accuracy"])   # the score's count
    for name in dict.fromkeys(r["recording"] for r in arms):
        panels.append((doc, name, {r["arm"]: r for r in arms if r["recording"] == name}))
fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.8), squeeze=False)
for ax, (doc, name, here) in zip(axes[0], panels):
    order = np.argsort(here.get("kilosort4", next(iter(here.values())))["accuracy"])
    for i, (arm, r) in enumerate(here.items()):
        ax.plot(np.arange(len(order)) + 0.2 * (i - 1), np.asarray(r["accuracy"])[order], "o",
                ms=4, label=f"{arm}: {r['well_detected']} well detected")
    ax.axhline(0.8, color="0.6", lw=0.8, ls="--")
    rec = doc["recordings"]
    ax.set(title=f"{name}: {rec['channels']} ch x {rec['seconds']:g} s, seed {rec['seed']}",
           xlabel="ground-truth unit (ordered by its accuracy in kilosort4 alone)",
           ylabel="accuracy", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7, loc="upper left")
plt.show()
for doc, name, here in panels:
    for arm, r in here.items():
        print(f"seed {doc['recordings']['seed']} {name:>9} {arm:<26} well detected "
              f"{r['well_detected']:>3}  false positive {r['false_positive']:>3}  "
              f"preprocess {r['preprocess_s']:7.1f} s  sort {r['sort_s']:7.1f} s")'''),
]

NOTEBOOKS = {"01_quickstart.ipynb": QUICKSTART, "02_engine.ipynb": ENGINE,
             "03_template_matching.ipynb": MATCH, "04_dask_batch.ipynb": DASK,
             "05_spikeinterface_kilosort.ipynb": SPIKEINTERFACE}


def build(cells: list) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src)
                             for kind, src in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def main(argv: list[str]) -> int:
    from nbclient import NotebookClient  # noqa: PLC0415

    out = ROOT / "notebooks"
    out.mkdir(exist_ok=True)
    only = [a for a in argv if a.endswith(".ipynb")]     # those named, else all
    for name, cells in NOTEBOOKS.items():
        if only and name not in only:
            continue
        nb = build(cells)
        if "--no-execute" not in argv:
            NotebookClient(nb, timeout=600, kernel_name="python3",
                           resources={"metadata": {"path": str(out)}}).execute()
        nbformat.write(nb, out / name)
        print("wrote", out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
