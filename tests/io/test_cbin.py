"""IBL's compressed recordings (mtscomp's .cbin + .ch, with the SpikeGLX .meta): dspk's
decoder against mtscomp's own decompression, bit for bit, on files mtscomp writes (its
options: chunk lengths, spatial differences, "C" order, dtypes), across chunk boundaries and
on random reads (hypothesis); the SpikeGLX recording of a .cbin against the same .bin
(samples, µV, metadata, a pipeline's output) and against ibl-neuropixel's reader; damaged,
truncated and mismatched files."""

import os
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dspk
from dspk.io import RecordingError, SpikeGLXRecording, open_recording
from dspk.io.cbin import CbinReader, decode_chunk, read_ch, write_cbin

from tests.recordings import np1_meta, rand16, write_sglx

mtscomp = pytest.importorskip("mtscomp")


def compress(path, data, rate=30000.0, **config):
    """``data`` [samples, channels] written raw, compressed by mtscomp (its own writer and
    integrity check), the raw file removed: the .cbin and .ch are left."""
    raw = path.with_suffix(".rawtmp")
    data.tofile(raw)
    mtscomp.compress(raw, path, path.with_suffix(".ch"), sample_rate=rate,
                     n_channels=data.shape[1], dtype=data.dtype, n_threads=1, quiet=True,
                     **config)
    raw.unlink()
    return path


def mtscomp_samples(path):
    """mtscomp's own decompression of a .cbin: [samples, channels]."""
    r = mtscomp.Reader(check_after_decompress=False, quiet=True)
    r.open(path, path.with_suffix(".ch"))
    try:
        return np.asarray(r[:])
    finally:
        r.close()


def noise(n, c, seed=0, dtype=np.int16, scale=300):
    """Correlated noise with spikes to full scale (the differences wrap in int16)."""
    rng = np.random.default_rng(seed)
    x = np.cumsum(rng.integers(-scale, scale + 1, (n, c)), axis=0) // 4
    x[rng.integers(0, n, 20), rng.integers(0, c, 20)] = np.iinfo(np.int16).max
    x[rng.integers(0, n, 20), rng.integers(0, c, 20)] = np.iinfo(np.int16).min
    return x.astype(dtype)


@pytest.mark.parametrize("config", [
    dict(),                                                     # mtscomp's defaults: 1 s, F
    dict(chunk_duration=0.013),                                 # many short chunks
    dict(do_spatial_diff=True),
    dict(chunk_order="C"),
    dict(do_time_diff=False),
    dict(do_spatial_diff=True, chunk_order="C", chunk_duration=0.1),
])
def test_decodes_what_mtscomp_decompresses(tmp_path, config):
    data = noise(7001, 13)
    path = compress(tmp_path / "x.cbin", data, rate=3000.0, **config)
    want = mtscomp_samples(path)
    np.testing.assert_array_equal(want, data)          # (mtscomp is lossless)
    with CbinReader(path, threads=2) as r:
        got = r.read(0, r.n_samples)
        assert got.dtype == np.int16 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want.T)
        assert (r.n_samples, r.n_channels, r.sample_rate) == (7001, 13, 3000.0)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint8])
def test_other_dtypes(tmp_path, dtype):
    data = (noise(2000, 5, seed=1, dtype=np.int64) % 200).astype(dtype)
    path = compress(tmp_path / "x.cbin", data, rate=1000.0, chunk_duration=0.3)
    with CbinReader(path) as r:
        np.testing.assert_array_equal(r.read(0, 2000), mtscomp_samples(path).T)


@pytest.fixture(scope="module")
def shared_cbin(tmp_path_factory):
    """A file of 37 chunks of uneven content (and a short last one), for random reads."""
    path = tmp_path_factory.mktemp("cbin") / "x.cbin"
    data = noise(3700 + 17, 9, seed=2)
    compress(path, data, rate=1000.0, chunk_duration=0.1)
    return path, mtscomp_samples(path)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), threads=st.integers(1, 3))
def test_random_reads_match_mtscomp(shared_cbin, data, threads):
    path, want = shared_cbin
    n, c = want.shape
    start = data.draw(st.integers(0, n), label="start")
    stop = data.draw(st.integers(start, min(n, start + 900)), label="stop")
    cols = data.draw(st.none() | st.lists(st.integers(0, c - 1), max_size=c, unique=True),
                     label="columns")
    with CbinReader(path, threads=threads) as r:
        for _ in range(2):                      # a second read: from the kept chunks
            got = r.read(start, stop, cols)
            ref = want[start:stop] if cols is None else want[start:stop][:, cols]
            np.testing.assert_array_equal(got, ref.T)


def summed(d):
    """What a GPU job does with `read_differences`' block: its cumulative sum in its dtype."""
    return np.cumsum(d, axis=1, dtype=d.dtype)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), threads=st.integers(1, 3))
def test_random_differenced_reads_sum_to_the_samples(shared_cbin, data, threads):
    """`read_differences`, summed along time in int16 (wrapping: the file's full-scale
    spikes make the differences wrap), is `read`'s block, in any range and channels; the
    decoded and the differenced chunks are kept apart (reads of both kinds interleaved)."""
    path, want = shared_cbin
    n, c = want.shape
    start = data.draw(st.integers(0, n), label="start")
    stop = data.draw(st.integers(start, min(n, start + 900)), label="stop")
    cols = data.draw(st.none() | st.lists(st.integers(0, c - 1), max_size=c, unique=True),
                     label="columns")
    ref = (want[start:stop] if cols is None else want[start:stop][:, cols]).T
    with CbinReader(path, threads=threads) as r:
        assert r.differences_supported
        for _ in range(2):
            d = r.read_differences(start, stop, cols)
            assert d.dtype == np.int16 and d.shape == ref.shape
            np.testing.assert_array_equal(summed(d), ref)
            np.testing.assert_array_equal(r.read(start, stop, cols), ref)


def test_differenced_reads_across_every_chunk_boundary_and_the_sync_edges(shared_cbin):
    path, want = shared_cbin
    with CbinReader(path, threads=2) as r, CbinReader(path, threads=2) as plain:
        for b in r.chunk_bounds[1:-1]:
            for a, z in ((b - 1, b + 1), (b - 50, b + 149), (b, b + 1), (b - 1, b)):
                z = min(z, r.n_samples)
                np.testing.assert_array_equal(summed(r.read_differences(a, z)), want[a:z].T)
        # a forward pass in steps that never align, the edges of row 8 kept as it goes
        r.keep_rows = plain.keep_rows = np.array([8])
        out = np.empty((2, 333), np.int16)
        for a in range(0, r.n_samples, 333):
            z = min(r.n_samples, a + 333)
            d = r.read_differences(a, z, columns=[8, 0], out=out[:, :z - a])
            assert d is not None
            np.testing.assert_array_equal(summed(d), want[a:z, [8, 0]].T)
            plain.read(a, z)
        fields = ["sample", "bit", "polarity"]
        got, ref = r.kept_edges()[fields].tolist(), plain.kept_edges()[fields].tolist()
        assert got == ref and len(ref) > 1000


def test_differenced_reads_refused_where_the_chunks_are_not(tmp_path):
    data = noise(500, 3)
    for config in (dict(chunk_order="C"), dict(do_time_diff=False),
                   dict(do_spatial_diff=True)):
        path = compress(tmp_path / "x.cbin", data, rate=1000.0, **config)
        with CbinReader(path) as r:
            assert not r.differences_supported
            with pytest.raises(RecordingError, match="read it with read()"):
                r.read_differences(0, 10)


def test_reads_across_every_chunk_boundary(shared_cbin):
    path, want = shared_cbin
    with CbinReader(path, threads=2) as r:
        for b in r.chunk_bounds[1:-1]:
            for a, z in ((b - 1, b + 1), (b - 50, b + 149), (b, b + 1), (b - 1, b)):
                z = min(z, r.n_samples)
                np.testing.assert_array_equal(r.read(a, z), want[a:z].T)
        # one read over every chunk, and a forward reader in steps that never align
        out = np.empty((9, r.n_samples), np.int16)
        np.testing.assert_array_equal(r.read(0, r.n_samples, out=out), want.T)
        for a in range(0, r.n_samples, 333):
            z = min(r.n_samples, a + 333)
            np.testing.assert_array_equal(r.read(a, z, columns=[8, 0]), want[a:z, [8, 0]].T)


def test_a_read_from_the_start_decodes_ahead(shared_cbin):
    # a job's run starts at sample 0 after its fit read chunks elsewhere: the chunks after
    # its first read are submitted with it, one per thread, not after its second read
    path, want = shared_cbin
    with CbinReader(path, threads=3) as r:
        np.testing.assert_array_equal(r.read(2000, 2100), want[2000:2100].T)   # the fit
        np.testing.assert_array_equal(r.read(0, 100), want[:100].T)
        assert {(1, False), (2, False), (3, False)} <= set(r._chunks)
        assert (4, False) not in r._chunks
        # a jump elsewhere is not forward: nothing decoded ahead of it
        r.read(3000, 3100)
        assert (31, False) not in r._chunks


def test_concurrent_readers_share_the_chunks(shared_cbin):
    path, want = shared_cbin
    errors = []
    with CbinReader(path, threads=2) as r:
        def work(seed):
            rng = np.random.default_rng(seed)
            try:
                for _ in range(30):
                    a = int(rng.integers(0, r.n_samples - 500))
                    np.testing.assert_array_equal(r.read(a, a + 500), want[a:a + 500].T)
            except Exception as exc:          # noqa: BLE001 (reported by the main thread)
                errors.append(exc)
        ts = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    assert not errors


def test_write_cbin_is_read_by_mtscomp(tmp_path):
    data = noise(2500, 4, seed=3)
    path = write_cbin(str(tmp_path / "w.cbin"), data, 1000.0, chunk_samples=700)
    np.testing.assert_array_equal(mtscomp_samples(tmp_path / "w.cbin"), data)
    assert read_ch(str(tmp_path / "w.ch"))["chunk_bounds"].tolist() == [0, 700, 1400, 2100, 2500]
    with CbinReader(path) as r:
        np.testing.assert_array_equal(r.read(0, 2500), data.T)


# -- the SpikeGLX recording of a .cbin ----------------------------------------------------------
@pytest.fixture
def sglx_pair(tmp_path):
    """A NP1.0 AP .bin (384 + SY) and the same file compressed by mtscomp beside its .meta
    in another folder: (bin path, cbin path, samples)."""
    data = rand16(31000, 385, seed=4)
    data[:, 384] = (np.arange(31000) // 700 % 2) * 64
    plain = tmp_path / "bin"
    comp = tmp_path / "cbin"
    plain.mkdir()
    comp.mkdir()
    meta = np1_meta()
    binpath = write_sglx(plain, "run_g0_t0.imec0.ap.bin", data, meta)
    cbin = comp / "run_g0_t0.imec0.ap.cbin"
    compress(cbin, data, chunk_duration=0.25)
    (comp / "run_g0_t0.imec0.ap.meta").write_bytes(binpath.with_suffix(".meta").read_bytes())
    return binpath, cbin, data


def test_spikeglx_cbin_reads_as_its_bin(sglx_pair):
    binpath, cbin, data = sglx_pair
    with open_recording(binpath) as a, open_recording(cbin) as b:
        assert isinstance(b, SpikeGLXRecording) and b.compressed and not b.samples_first
        for key in ("n_channels", "n_samples", "fs"):
            assert getattr(a, key) == getattr(b, key)
        for key in ("gain_to_uv", "offset_to_uv", "geometry", "sample_shifts", "shank_ids",
                    "saved_channels", "excluded_columns"):
            np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
        np.testing.assert_array_equal(b.read(scaled=False), data[:, :384].T)
        np.testing.assert_array_equal(b.read(7000, 9100), a.read(7000, 9100))   # µV, 3 chunks
        np.testing.assert_array_equal(b.read(100, 200, channels=[383, 5]),
                                      a.read(100, 200, channels=[383, 5]))
        native = b.read_native(7400, 8000)
        assert native.shape == (384, 600)
        np.testing.assert_array_equal(native, data[7400:8000, :384].T)
        out = np.empty((384, 600), np.int16)
        assert b.read_native(7400, 8000, out=out) is out
        assert b.decompress_s > 0
        assert [p.suffix for p in b.files()] == [".cbin", ".ch", ".meta"]
        with b.reopen() as again:
            np.testing.assert_array_equal(again.read(0, 10), a.read(0, 10))
    for other in (cbin.with_suffix(".meta"), cbin.with_suffix(".ch")):    # opened by either
        with open_recording(other) as c:
            assert c.compressed and c.n_samples == 31000


def test_spikeglx_cbin_pipeline_output_equals_the_bin(sglx_pair, tmp_path):
    binpath, cbin, _ = sglx_pair
    pipe = dspk.Pipeline.from_options(highpass=300.0, reference="median", whiten="none")
    outs = []
    for src, name in ((binpath, "a.h5"), (cbin, "b.h5")):
        with open_recording(src) as rec:
            p = dspk.Pipeline(pipe.steps).fit(rec)
            p.run(rec, tmp_path / name, chunk_s=0.23, progress=False)
            outs.append(tmp_path / name)
    import h5py
    with h5py.File(outs[0]) as fa, h5py.File(outs[1]) as fb:
        np.testing.assert_array_equal(fa["traces"][:], fb["traces"][:])


def test_a_gpu_job_stages_the_cbin_as_differences(sglx_pair, monkeypatch):
    """`Staging` (a GPU job's reads; run here with NumPy for the device and plain buffers for
    the pinned ones) reads a .cbin inflated only and sums it on the "device": the µV blocks
    of the .bin, to the bit, in every chunk of a forward pass and across the .cbin's
    chunks."""
    import types
    import dspk.pipeline.stream as stream
    monkeypatch.setattr(stream, "pinned_empty", lambda n, dtype: np.empty(n, dtype))

    class Device(np.ndarray):                  # CuPy's array, as far as Staging uses it
        def set(self, host):
            self[...] = host

    dev = types.SimpleNamespace(empty=lambda shape, dtype: np.empty(shape, dtype).view(Device),
                                cumsum=np.cumsum, asarray=np.asarray)
    binpath, cbin, _ = sglx_pair
    with open_recording(binpath) as a, open_recording(cbin) as b:
        assert b.differences_supported and not a.differences_supported
        sa, sb = stream.Staging(a, 6000 + 200, 3), stream.Staging(b, 6000 + 200, 3)
        assert sb.differences and not sa.differences
        for k, s0 in enumerate(range(0, 31000, 6000)):
            s1 = min(31000, s0 + 6000)
            ra, rb = sa.read(k, s0, s1, 100), sb.read(k, s0, s1, 100)
            (x0, xa), (x1, xb) = sa.to_device(ra, dev), sb.to_device(rb, dev)
            assert x0 == x1 and xa.dtype == np.float32
            np.testing.assert_array_equal(xa, xb)


def test_spikeglx_cbin_agrees_with_ibl_reader(sglx_pair):
    spikeglx = pytest.importorskip("spikeglx")            # ibl-neuropixel
    _, cbin, data = sglx_pair
    sr = spikeglx.Reader(cbin)
    try:
        ibl_v = sr.read(nsel=slice(5000, 6000), csel=slice(0, 384), sync=False)
    finally:
        sr.close()
    with open_recording(cbin) as rec:
        mine = rec.read(5000, 6000)
    # IBL's volts (float32) against dspk's µV (float32): the same gains
    np.testing.assert_allclose(mine, ibl_v.T * 1e6, rtol=1e-6, atol=1e-3)


def test_spikeglx_cbin_errors(sglx_pair, tmp_path):
    binpath, cbin, data = sglx_pair
    ch = cbin.with_suffix(".ch")
    meta = cbin.with_suffix(".meta")
    # the .meta missing: named
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "x.imec0.ap.cbin").write_bytes(cbin.read_bytes())
    (lone / "x.imec0.ap.ch").write_bytes(ch.read_bytes())
    with pytest.raises(RecordingError, match=r"x\.imec0\.ap\.meta: missing"):
        open_recording(lone / "x.imec0.ap.cbin")
    # the .ch missing: named
    (lone / "x.imec0.ap.meta").write_bytes(meta.read_bytes())
    (lone / "x.imec0.ap.ch").unlink()
    with pytest.raises(FileNotFoundError, match=r"x\.imec0\.ap\.ch"):
        open_recording(lone / "x.imec0.ap.cbin")
    # a .meta of another length (fileSizeBytes)
    text = meta.read_text()
    size = [ln for ln in text.splitlines() if ln.startswith("fileSizeBytes=")][0]
    meta.write_text(text.replace(size, "fileSizeBytes=770"))
    with pytest.raises(RecordingError, match="fileSizeBytes=770"):
        open_recording(cbin)
    meta.write_text(text.replace("nSavedChans=385", "nSavedChans=384")
                    .replace("snsApLfSy=384,0,1", "snsApLfSy=383,0,1"))
    with pytest.raises(RecordingError, match="nSavedChans"):
        open_recording(cbin)
    meta.write_text(text)
    # a truncated .cbin: refused when opened
    full = cbin.read_bytes()
    cbin.write_bytes(full[:-100])
    with pytest.raises(RecordingError, match="truncated"):
        open_recording(cbin)
    # a damaged chunk: the read that meets it names the chunk
    head = read_ch(str(ch))
    a = int(head["chunk_offsets"][2])
    bad = bytearray(full)
    bad[a + 10:a + 40] = bytes(30)
    cbin.write_bytes(bytes(bad))
    with open_recording(cbin) as rec:
        rec.read(0, 1000)                                     # chunk 0: fine
        with pytest.raises(RecordingError, match=r"chunk 2 \(samples 15000\.\.22499"):
            rec.read(16000, 17000)


def test_bad_headers(tmp_path):
    data = noise(100, 2)
    path = write_cbin(str(tmp_path / "x.cbin"), data, 1000.0, chunk_samples=40)
    ch = tmp_path / "x.ch"
    good = ch.read_text()
    import json
    head = json.loads(good)
    for key, value, message in [
        ("algorithm", "lz4", "algorithm"),
        ("chunk_order", "K", "chunk_order"),
        ("chunk_bounds", [0, 50, 40, 100], "chunk_bounds"),
        ("chunk_offsets", [0, 10], "chunk_offsets"),
    ]:
        ch.write_text(json.dumps(dict(head, **{key: value})))
        with pytest.raises(RecordingError, match=message):
            CbinReader(path)
    ch.write_text(json.dumps({k: v for k, v in head.items() if k != "n_channels"}))
    with pytest.raises(RecordingError, match="n_channels: missing"):
        CbinReader(path)
    ch.write_text("{not json")
    with pytest.raises(RecordingError, match="not an mtscomp header"):
        CbinReader(path)
    ch.write_text(good)
    with CbinReader(path) as r:
        with pytest.raises(RecordingError, match="start <= stop"):
            r.read(50, 10)
        with pytest.raises(RecordingError, match="columns"):
            r.read(0, 10, columns=[2])
        with pytest.raises(RecordingError, match="out: expected"):
            r.read(0, 10, out=np.empty((2, 9), np.int16))
    with pytest.raises(RecordingError, match="closed"):
        r.read(0, 10)
    with pytest.raises(ValueError, match="bytes inflated"):
        decode_chunk(b"x\x9c\x03\x00\x00\x00\x00\x01", 3, 2, np.int16)
    assert not os.path.exists(tmp_path / "x.bin")
