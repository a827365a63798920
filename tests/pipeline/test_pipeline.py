"""dspk.pipeline on the CPU: the chunked job equals the one-shot transform, does not depend on
the chunk size, resumes a killed job to the same samples, never leaves an output that looks
complete, never touches its input; the steps equal the ops they wrap."""

import hashlib
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

import dspk

from tests.killable import run_killable_job
from dspk.pipeline import HighPass, Pipeline, PipelineError, Reference, Whiten

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "sample.nwb"
FS = 30000.0


def recording(n=45000, c=12, seed=0):
    """Correlated noise in µV with a slow drift, on a two-column geometry, as int16."""
    rng = np.random.default_rng(seed)
    geom = np.stack([np.tile([0.0, 32.0], c // 2), np.repeat(np.arange(c // 2) * 20.0, 2)], 1)
    d = np.sqrt(((geom[:, None] - geom[None]) ** 2).sum(-1))
    x = rng.standard_normal((n, c)) @ np.linalg.cholesky(np.exp(-d / 40.0)).T * 50
    x += 200 * np.sin(2 * np.pi * 2.0 * np.arange(n) / FS)[:, None]
    return dspk.open_recording(np.rint(x).astype(np.int16), fs=FS, gain_to_uv=1.0,
                               geometry=geom)


def traces(path):
    with h5py.File(path, "r") as f:
        return f["traces"][:]


def test_transform_is_the_ops_in_order():
    rec = recording()
    p = Pipeline([HighPass(300.0), Reference("median"), Whiten("local", 4)]).fit(rec)
    x = rec.read()
    want = dspk.common_reference(dspk.fir_filter(x, dspk.highpass_taps(FS)), "median")
    want = dspk.spatial_filter(p.states[2]["W"].astype(np.float32), want)
    np.testing.assert_allclose(p.transform(x), want, rtol=1e-5, atol=1e-4)


def test_run_equals_transform_and_saves_what_it_did(tmp_path):
    rec = recording()
    p = Pipeline.from_options(whiten="local", n_neighbors=6)
    out = p.run(rec, tmp_path / "out.h5", chunk_s=0.37, progress=False)
    y = traces(out)
    assert y.shape == (rec.n_samples, rec.n_channels) and y.dtype == np.float32
    ref = p.transform(rec.read())
    np.testing.assert_allclose(y.T, ref, rtol=0, atol=2e-5 * np.abs(ref).max())
    with h5py.File(out, "r") as f:
        assert f.attrs["fs"] == FS and f.attrs["dspk_version"] == dspk.__version__
        assert [s["step"] for s in json.loads(f.attrs["pipeline"])] == \
            ["HighPass", "Reference", "Whiten"]
        np.testing.assert_array_equal(f["fitted/step2_Whiten/W"][:], p.states[2]["W"])
        np.testing.assert_array_equal(f["geometry"][:], rec.geometry)
    assert not (tmp_path / "out.h5.partial").exists()


def test_output_does_not_depend_on_the_chunk_size(tmp_path):
    rec = recording(n=70000)
    p = Pipeline.from_options(whiten="global").fit(rec)
    outs = [traces(p.run(rec, tmp_path / f"c{c}.h5", chunk_s=c, progress=False))
            for c in (0.1, 1.0, 2.0)]
    scale = np.abs(outs[0]).max()
    for y in outs[1:]:
        assert np.abs(y - outs[0]).max() <= 1e-5 * scale


def test_int16_output_and_channels_first_layout(tmp_path):
    rec = recording()
    p = Pipeline.from_options(whiten=None)
    y16 = traces(p.run(rec, tmp_path / "i.h5", output_dtype=np.int16, output_scale=0.5,
                       layout="channels_samples", progress=False))
    ref = np.clip(np.rint(p.transform(rec.read()) / 0.5), -32768, 32767)
    # the chunked and one-shot float results differ by float32 rounding, which can move a
    # value across a rounding boundary: at most one step, rarely
    diff = np.abs(y16.astype(np.int64) - ref)
    assert y16.dtype == np.int16 and diff.max() <= 1 and diff.mean() < 1e-3


def run_job(tmp_path, out, kill_after=None, backend="cpu"):
    return run_killable_job(tmp_path, out, f"whiten='global', detect=True, backend={backend!r}",
                            kill_after)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_killed_job_resumes_to_the_same_samples(tmp_path, backend):
    digest = hashlib.sha256(SAMPLE.read_bytes()).hexdigest()
    whole = tmp_path / "whole.h5"
    assert run_job(tmp_path, whole, backend=backend) == 0
    out = tmp_path / "resumed.h5"
    for kill_after in (15000, 75000, 150000):     # killed three times, resumed each time
        assert run_job(tmp_path, out, kill_after, backend) == 137
        assert not out.exists() and (tmp_path / "resumed.h5.partial").exists()
        progress = json.loads((tmp_path / "resumed.h5.progress.json").read_text())
        assert progress["done"] == kill_after
    assert run_job(tmp_path, out, backend=backend) == 0
    assert out.exists() and not (tmp_path / "resumed.h5.partial").exists()
    np.testing.assert_array_equal(traces(out), traces(whole))
    with h5py.File(out, "r") as f, h5py.File(whole, "r") as g:
        assert len(g["spikes"]) > 100
        np.testing.assert_array_equal(f["spikes"][:], g["spikes"][:])   # none lost or doubled
        np.testing.assert_array_equal(f["features"][:], g["features"][:])
        assert len(f["features"]) == len(f["spikes"])
    assert hashlib.sha256(SAMPLE.read_bytes()).hexdigest() == digest   # input untouched


def test_existing_output_and_the_input_are_refused(tmp_path):
    rec = recording()
    p = Pipeline.from_options(whiten=None)
    out = tmp_path / "o.h5"
    out.write_bytes(b"keep me")
    with pytest.raises(PipelineError, match="exists; pass overwrite=True"):
        p.run(rec, out, progress=False)
    assert out.read_bytes() == b"keep me"
    p.run(rec, out, overwrite=True, progress=False)
    assert traces(out).shape == (rec.n_samples, rec.n_channels)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("x", data=np.zeros((3000, 4), np.int16)).attrs["fs"] = FS
    with pytest.raises(PipelineError, match="is the input"):
        p.run(dspk.open_recording(tmp_path / "in.h5"), tmp_path / "in.h5", overwrite=True,
              progress=False)


def test_bad_options():
    with pytest.raises(PipelineError, match="reference: expected"):
        Pipeline.from_options(reference="average")
    with pytest.raises(PipelineError, match="whiten: expected"):
        Pipeline.from_options(whiten="zca")
    with pytest.raises(PipelineError, match="needs the recording's geometry"):
        Pipeline.from_options(whiten="local").fit(
            dspk.open_recording(np.zeros((3000, 4), np.int16), fs=FS))
    with pytest.raises(PipelineError, match="not fitted"):
        Pipeline([Whiten("global")]).transform(np.zeros((4, 100), np.float32), fs=FS)
    with pytest.raises(PipelineError, match="steps:"):
        Pipeline(["highpass"])


def test_save_and_load(tmp_path):
    rec = recording()
    p = Pipeline.from_options(whiten="local", n_neighbors=4).fit(rec)
    p.save(tmp_path / "p.npz")
    q = Pipeline.load(tmp_path / "p.npz")
    x = rec.read(0, 9000)
    np.testing.assert_array_equal(q.transform(x), p.transform(x))
    assert q.fingerprint() == p.fingerprint()


def test_sample_whitened_noise_has_unit_variance(tmp_path):
    out = dspk.preprocess(str(SAMPLE), tmp_path / "s.h5", whiten="global", progress=False)
    y = traces(out)[3000:-3000]
    var = y.var(axis=0)
    assert np.all(np.abs(var - 1) < 0.1)


def test_preprocess_takes_the_pipeline_keywords_too(tmp_path):
    """n_neighbors and detect reach Pipeline.from_options: the output equals the pipeline's."""
    out = dspk.preprocess(str(SAMPLE), tmp_path / "a.h5", whiten="local", n_neighbors=8,
                          detect=True, chunk_s=0.5, progress=False)
    p = dspk.Pipeline.from_options(whiten="local", n_neighbors=8, detect=True)
    ref = p.fit(dspk.open_recording(SAMPLE)).run(dspk.open_recording(SAMPLE), tmp_path / "b.h5",
                                                 chunk_s=0.5, progress=False)
    np.testing.assert_array_equal(traces(out), traces(ref))
    with h5py.File(out) as f, h5py.File(ref) as g:
        np.testing.assert_array_equal(f["spikes"][:], g["spikes"][:])


def test_a_failed_write_leaves_no_complete_looking_output(tmp_path, monkeypatch):
    """A full disk (a write raises ENOSPC mid-job): the error reaches the caller, the output
    name does not exist, the partial file is left for --resume, the input is untouched."""
    import errno

    from dspk.pipeline.job import PartialOutput

    rec = recording()
    calls = {"n": 0}
    real = PartialOutput.record

    def full_disk(self, job, done, spikes):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, job, done, spikes)

    monkeypatch.setattr(PartialOutput, "record", full_disk)
    before = rec.read(scaled=False).copy()
    with pytest.raises(OSError, match="No space left"):
        Pipeline.from_options(whiten=None).run(rec, tmp_path / "o.h5", chunk_s=0.3,
                                               progress=False)
    assert not (tmp_path / "o.h5").exists() and (tmp_path / "o.h5.partial").exists()
    np.testing.assert_array_equal(rec.read(scaled=False), before)


def test_output_opens_as_a_recording(tmp_path):
    rec = recording()
    p = Pipeline.from_options(whiten="global")
    out = p.run(rec, tmp_path / "o.h5", output_dtype=np.int16, output_scale=0.01,
                progress=False)
    back = dspk.open_recording(out)
    assert (back.n_channels, back.n_samples, back.fs) == (rec.n_channels, rec.n_samples, FS)
    np.testing.assert_array_equal(back.geometry, rec.geometry)
    np.testing.assert_allclose(back.read(), traces(out).T.astype(np.float32) * 0.01,
                               rtol=1e-6)


@pytest.mark.slow
def test_detection_step_does_not_depend_on_the_chunk_size(tmp_path):
    """Spikes written by the Detect step: identical for chunks of 0.1, 1 and 2 s, and equal to
    detection on the one-shot traces; resumed jobs keep them too."""
    from tests.groundtruth import make

    d = make(seconds=3.0, geometry=None, seed=3)
    rec = dspk.open_recording(d["x"], fs=FS, layout="channels_samples", geometry=d["geometry"])
    p = Pipeline.from_options(highpass=300, reference=None, whiten="global", detect=True)
    p.fit(rec)
    runs, feats = [], []
    for c in (0.1, 1.0, 2.0):
        out = p.run(rec, tmp_path / f"d{c}.h5", chunk_s=c, progress=False)
        with h5py.File(out, "r") as f:
            runs.append(f["spikes"][:])
            feats.append((f["features"][:], f["feature_channels"][:]))
            assert f["fitted/step2_Detect/pca_components"].shape == (3, 61)
    assert len(runs[0]) > 50
    for r, (fe, ch) in zip(runs[1:], feats[1:]):
        np.testing.assert_array_equal(r["sample_index"], runs[0]["sample_index"])
        np.testing.assert_array_equal(r["channel_index"], runs[0]["channel_index"])
        np.testing.assert_allclose(r["amplitude"], runs[0]["amplitude"], rtol=1e-4)
        np.testing.assert_array_equal(ch, feats[0][1])
        np.testing.assert_allclose(fe, feats[0][0], rtol=1e-4,
                                   atol=1e-4 * np.abs(feats[0][0]).max())
    traces_1shot = p.transform(rec.read())
    whole = dspk.detect_spikes(traces_1shot, d["geometry"], FS)
    np.testing.assert_array_equal(runs[0]["sample_index"], whole["sample_index"])
    # the features: the fitted PCA on each spike's neighbour channels, as spike_features
    # computes them on the one-shot traces
    ref, chans, _ = dspk.spike_features(traces_1shot, whole, d["geometry"], FS,
                                        pca=p.steps[-1].pca(p.states[-1]))
    assert feats[0][0].shape == (len(whole), 10, 3)
    np.testing.assert_array_equal(feats[0][1], chans)
    np.testing.assert_allclose(feats[0][0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


# -- the GPU job ---------------------------------------------------------------------------------
def _sources(tmp_path, kind):
    """The same uint16 recording (gain and offset per channel) as an HDF5 dataset stored
    either way, gzip-compressed, a flat binary, and an array."""
    rec = recording(n=50000, c=20, seed=5)
    raw = (rec.read(scaled=False).T.astype(np.int32) + 32768).astype(np.uint16)
    gain = np.linspace(0.19, 0.21, 20)
    meta = dict(fs=FS, geometry=rec.geometry, gain_to_uv=gain)
    if kind == "array":
        return dspk.open_recording(raw, **meta)
    if kind == "binary":
        path = tmp_path / "r.bin"
        raw.tofile(path)
        return dspk.open_recording(path, n_channels=20, dtype=np.uint16, **meta)
    path = tmp_path / f"r-{kind}.h5"
    with h5py.File(path, "w") as f:
        if kind == "channels_first":
            f.create_dataset("x", data=raw.T.copy())
            return dspk.open_recording(path, layout="channels_samples", **meta)
        f.create_dataset("x", data=raw, chunks=(4096, 20) if kind == "gzip" else None,
                         compression="gzip" if kind == "gzip" else None, shuffle=kind == "gzip")
    return dspk.open_recording(path, **meta)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["contiguous", "gzip", "channels_first", "binary", "array"])
def test_gpu_raw_transfer_equals_scaled_read(tmp_path, monkeypatch, kind):
    """The GPU job moves raw samples and scales them on the device: the same bits as reading
    scaled µV on the host, for every source, both output types and layouts."""
    import dspk.pipeline.job as job

    rec = _sources(tmp_path, kind)
    p = Pipeline.from_options(whiten="local", n_neighbors=6, backend="gpu").fit(rec)
    for dtype, layout in ((np.float32, "samples_channels"), (np.int16, "channels_samples")):
        opts = dict(chunk_s=0.4, output_dtype=dtype, layout=layout, progress=False,
                    overwrite=True)
        fast = traces(p.run(rec, tmp_path / "fast.h5", **opts))
        monkeypatch.setattr(job, "raw_transfer", lambda rec, xp: False)
        slow = traces(p.run(rec, tmp_path / "slow.h5", **opts))
        monkeypatch.undo()
        np.testing.assert_array_equal(fast, slow)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["contiguous", "gzip", "channels_first", "binary", "array"])
def test_gpu_fit_reads_give_the_host_reads_bits(tmp_path, kind):
    """A fit's chunks and a fit pass read on the device (raw samples moved, scaled there):
    the host read's µV blocks, bit for bit, halos clipped at the ends; and the fitted states
    of a pipeline equal those fitted from host reads."""
    import cupy as cp

    from dspk.pipeline import stream

    rec = _sources(tmp_path, kind)
    n = rec.n_samples
    spans = [(0, 4000), (4000, 9000), (n - 3000, n), (1234, 1235)]
    got = list(stream.device_read_ahead(rec, spans, 70, cp))
    ref = list(stream.read_ahead(rec, spans, 70))
    assert len(got) == len(ref) == len(spans)
    for (a, x), (b, y) in zip(got, ref):
        assert a == b and isinstance(x, cp.ndarray) == stream.raw_transfer(rec, cp)
        np.testing.assert_array_equal(cp.asnumpy(x), np.asarray(y))
    opts = dict(whiten="local", n_neighbors=6, backend="gpu", bad_channels="detect")
    fast = Pipeline.from_options(**opts).fit(rec)
    import dspk.pipeline.prepared as prepared

    orig = prepared.device_read_ahead
    prepared.device_read_ahead = lambda rec, spans, m, xp: stream.read_ahead(rec, spans, m)
    try:
        slow = Pipeline.from_options(**opts).fit(rec)
    finally:
        prepared.device_read_ahead = orig
    for a, b in zip(fast.states, slow.states):
        assert sorted(a) == sorted(b)
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))


@pytest.mark.gpu
def test_gpu_job_equals_cpu_job_and_is_chunk_invariant(tmp_path):
    rec = _sources(tmp_path, "contiguous")
    cpu = Pipeline.from_options(whiten="local", n_neighbors=6, backend="cpu").fit(rec)
    gpu = Pipeline.from_options(whiten="local", n_neighbors=6, backend="gpu")
    gpu.states = [dict(st) for st in cpu.states]          # the same fitted W
    ref = traces(cpu.run(rec, tmp_path / "cpu.h5", progress=False))
    scale = np.abs(ref).max()
    for c in (0.1, 1.0, 2.0):
        y = traces(gpu.run(rec, tmp_path / f"gpu{c}.h5", chunk_s=c, progress=False))
        assert np.abs(y - ref).max() <= 2e-5 * scale, c
    y16 = traces(gpu.run(rec, tmp_path / "g16.h5", output_dtype=np.int16, output_scale=0.01,
                         progress=False))
    c16 = traces(cpu.run(rec, tmp_path / "c16.h5", output_dtype=np.int16, output_scale=0.01,
                         progress=False))
    diff = np.abs(y16.astype(np.int64) - c16)
    assert diff.max() <= 1 and diff.mean() < 1e-3


def test_last_run_splits_the_time(tmp_path):
    """The job reports its time split: decompression (gzip, summed over threads) inside the
    read; no transfers on the CPU."""
    x = recording(n=20000, c=8).read(scaled=False).T.copy()
    with h5py.File(tmp_path / "g.h5", "w") as f:
        d = f.create_dataset("x", data=x, chunks=(2048, 8), compression="gzip", shuffle=True)
        d.attrs["fs"] = FS
    p = Pipeline.from_options(whiten="global", backend="cpu")
    p.run(dspk.open_recording(tmp_path / "g.h5"), tmp_path / "o.h5", progress=False,
          chunk_s=0.2)
    t = p.last_run
    assert t["decompress_s"] > 0 and t["transfer_s"] == 0
    assert {"read_s", "compute_s", "write_s", "loop_s", "wall_s", "x_real_time"} <= set(t)
    # the timeline: every chunk read, computed and written once, each in order after the last
    n_chunks = -(-20000 // 6000)
    for what in ("read", "compute", "write"):
        ev = [e for e in t["events"] if e[0] == what]
        assert sorted(e[1] for e in ev) == list(range(n_chunks))
        assert all(0 <= e[2] <= e[3] <= t["loop_s"] + 1e-6 for e in ev)
    assert t["loop_s"] <= t["wall_s"]


def test_detection_runs_in_units_of_the_noise_fitted_on_the_fit_chunks(tmp_path):
    """Detect's fit measures each channel's template-output noise on the fit chunks; every
    chunk is then detected in those units (not its own), the state is saved with the output,
    and band-limited noise gives no flood of threshold crossings."""
    from dspk.detect import detect_spikes, template_noise
    from dspk.pipeline import Pipeline

    from tests.groundtruth import FS, make, match, probe

    geom = probe(32)
    d = make(seconds=6.0, geometry=geom, spectrum="band", noise_um=1e-3, seed=5)
    rec = dspk.open_recording(d["x"], fs=FS, geometry=geom, layout="channels_samples")
    pipe = Pipeline.from_options(highpass=None, reference="none", whiten="none", detect=True,
                                 backend="cpu").fit(rec)
    noise = pipe.states[-1]["noise"]
    assert noise.shape == (32, 6) and np.all(noise > 1.2)      # band-limited: noisier outputs
    np.testing.assert_allclose(noise, template_noise(d["x"], FS), rtol=0.1)
    out = pipe.run(rec, tmp_path / "out.h5", chunk_s=1.0, progress=False)
    with h5py.File(out, "r") as f:
        spikes = f["spikes"][:]
    whole = detect_spikes(d["x"], geom, FS, noise=noise)
    np.testing.assert_array_equal(spikes["sample_index"], whole["sample_index"])
    truth_hit, found_hit = match(spikes["sample_index"], d["times"], tolerance=12)
    assert found_hit.mean() >= 0.95
    strong = np.isin(d["units"], np.flatnonzero(d["snr"] >= 5))
    assert truth_hit[strong].mean() >= 0.9
