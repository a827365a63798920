"""dspk.io: HDF5 datasets (both layouts, attributes, gzip in parallel), NWB ElectricalSeries
written with h5py alone, flat binaries, arrays; every bad input of the reading part of the
pipeline issue."""

import os

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspk.io import (BinaryRecording, RecordingError, open_recording, to_channels_first)
from dspk.io.hdf5 import HDF5Recording, _read_gzip

FS = 30000.0


def raw(n=3000, c=6, dtype=np.int16, seed=0):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, int(info.max) + 1, (n, c),
                                                dtype=dtype)


def write_nwb(path, series, electrodes_xy=None):
    """A minimal NWB 2.x layout: ElectricalSeries groups with data, rate or timestamps,
    conversion/offset, channel_conversion and an electrodes region of the electrodes table."""
    with h5py.File(path, "w") as f:
        f.attrs["neurodata_type"] = "NWBFile"
        table = f.create_group("general/extracellular_ephys/electrodes")
        table.attrs["neurodata_type"] = "DynamicTable"
        if electrodes_xy is not None:
            table["rel_x"] = electrodes_xy[:, 0]
            table["rel_y"] = electrodes_xy[:, 1]
        for where, spec in series.items():
            g = f.create_group(where)
            g.attrs["neurodata_type"] = "ElectricalSeries"
            d = g.create_dataset("data", data=spec["data"])
            d.attrs["conversion"] = spec.get("conversion", 1.0)
            d.attrs["offset"] = spec.get("offset", 0.0)
            if "timestamps" in spec:
                g["timestamps"] = spec["timestamps"]
            else:
                st_ = g.create_dataset("starting_time", data=0.0)
                st_.attrs["rate"] = spec.get("rate", FS)
            if "channel_conversion" in spec:
                g["channel_conversion"] = spec["channel_conversion"]
            e = g.create_dataset("electrodes", data=spec.get("rows",
                                                             np.arange(spec["data"].shape[1])))
            e.attrs["table"] = table.ref


# -- HDF5 datasets -----------------------------------------------------------------------------
@pytest.mark.parametrize("channels_first", [False, True])
def test_hdf5_dataset_both_layouts_and_attributes(tmp_path, channels_first):
    x = raw()
    path = tmp_path / "rec.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("ephys/traces", data=x.T if channels_first else x)
        d.attrs["sampling_rate"] = FS
        d.attrs["gain_to_uv"] = np.linspace(0.1, 0.6, 6)
        d.attrs["offset_to_uv"] = 2.0
        d.attrs["geometry"] = np.stack([np.zeros(6), 20.0 * np.arange(6)], 1)
    rec = open_recording(path)
    assert (rec.n_channels, rec.n_samples, rec.fs, rec.dtype) == (6, 3000, FS, np.int16)
    assert rec.geometry.shape == (6, 2) and rec.geometry[5, 1] == 100.0
    np.testing.assert_array_equal(rec.read(100, 900, scaled=False), x[100:900].T)
    got = rec.read(100, 900, channels=[4, 1])
    want = (x[100:900, [4, 1]].T.astype(np.float32) *
            np.float32(np.linspace(0.1, 0.6, 6)[[4, 1]])[:, None] + np.float32(2.0))
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float32 and got.flags.c_contiguous
    rec.close()


def test_arguments_override_attributes_and_uint16_is_centred(tmp_path):
    x = raw(dtype=np.uint16)
    path = tmp_path / "u16.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x).attrs["fs"] = 1000.0
    rec = open_recording(path, fs=FS, gain_to_uv=0.5)
    assert rec.fs == FS
    got = rec.read(0, 50, channels=slice(0, 2))
    want = (x[:50, :2].T.astype(np.float64) - 32768) * 0.5       # offset-corrected, not wrapped
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert rec.read(0, 50, scaled=False).dtype == np.uint16


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 700), c=st.integers(1, 9), chunk=st.tuples(st.integers(1, 128),
                                                                    st.integers(1, 9)),
       shuffle=st.booleans(), start=st.integers(0, 699), length=st.integers(0, 700),
       dtype=st.sampled_from([np.int16, np.uint16, np.float32, np.int32]))
def test_parallel_gzip_equals_h5py(tmp_path_factory, n, c, chunk, shuffle, start, length,
                                   dtype):
    """Chunks inflated in the thread pool (edge chunks, partial overlaps, shuffle, every
    dtype) give h5py's bytes."""
    rng = np.random.default_rng(n * 31 + c)
    x = (rng.standard_normal((n, c)) * 1000).astype(dtype)
    path = tmp_path_factory.mktemp("gz") / "x.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", data=x, chunks=(min(chunk[0], n), min(chunk[1], c)),
                             compression="gzip", shuffle=shuffle)
    start = min(start, n - 1)
    stop = min(n, start + length)
    with h5py.File(path, "r") as f:
        d = f["x"]
        plan = {"shuffle": shuffle, "chunks": d.chunks}
        got = _read_gzip(d, (slice(start, stop), slice(None)), plan, 4)
        np.testing.assert_array_equal(got, d[start:stop])


@settings(max_examples=15, deadline=None)
@given(chunk=st.integers(7, 300), reads=st.lists(st.tuples(st.integers(0, 1999),
                                                           st.integers(0, 900)),
                                                 min_size=1, max_size=8),
       keep=st.integers(1, 3))
def test_gzip_reader_keeps_chunks_across_reads(tmp_path_factory, chunk, reads, keep):
    """Consecutive, overlapping and repeated reads through one GzipReader (inflated chunks
    kept between reads, evicted by age) give h5py's bytes."""
    from dspk.io.hdf5 import GzipReader

    x = (np.random.default_rng(chunk).standard_normal((2000, 5)) * 900).astype(np.int16)
    path = tmp_path_factory.mktemp("gzr") / "x.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(chunk, 3), compression="gzip", shuffle=True)
    with h5py.File(path, "r") as f:
        d = f["x"]
        reader = GzipReader(d, {"shuffle": True, "chunks": d.chunks}, 3, keep_rows=keep)
        try:
            for start, length in reads:
                stop = min(2000, start + length)
                np.testing.assert_array_equal(reader.read((slice(start, stop), slice(None))),
                                              x[start:stop])
            assert len(reader._chunks) <= reader.capacity
        finally:
            reader.close()


def test_gzip_reader_reads_files_with_a_userblock(tmp_path):
    """The chunk offsets HDF5 reports are file offsets: a file with a user block (512 bytes
    before the HDF5 data) reads the same, and the direct reads are kept."""
    from dspk.io.hdf5 import GzipReader

    x = raw(n=5000, c=12)
    with h5py.File(tmp_path / "u.h5", "w", userblock_size=512) as f:
        f.create_dataset("x", data=x, chunks=(700, 12), compression="gzip", shuffle=True)
    with h5py.File(tmp_path / "u.h5", "r") as f:
        d = f["x"]
        reader = GzipReader(d, {"shuffle": True, "chunks": d.chunks}, 2)
        try:
            np.testing.assert_array_equal(reader.read((slice(100, 4900), slice(None))),
                                          x[100:4900])
            assert reader._fd is not None
        finally:
            reader.close()


def test_gzip_recording_reads_like_uncompressed(tmp_path):
    x = raw(n=5000, c=12)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(1000, 12), compression="gzip", shuffle=True)
        f.create_dataset("unstored", shape=x.shape, dtype=x.dtype, chunks=(1000, 12),
                         compression="gzip")      # never written: fill values
    rec = HDF5Recording(tmp_path / "a.h5", "x", fs=FS)
    assert rec._gzip is not None
    np.testing.assert_array_equal(rec.read(123, 4567, scaled=False), x[123:4567].T)
    empty = HDF5Recording(tmp_path / "a.h5", "unstored", fs=FS)
    np.testing.assert_array_equal(empty.read(0, 2000, scaled=False), 0)


def test_lzf_goes_through_h5py(tmp_path):
    x = raw()
    with h5py.File(tmp_path / "l.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(500, 6), compression="lzf")
    rec = open_recording(tmp_path / "l.h5", fs=FS)
    assert rec._gzip is None
    np.testing.assert_array_equal(rec.read(10, 2990, scaled=False), x[10:2990].T)


# -- NWB ---------------------------------------------------------------------------------------
def test_nwb_series_scaling_rate_and_geometry(tmp_path):
    x = raw(c=4)
    xy = np.array([[0, 0], [16, 0], [0, 20], [16, 20], [0, 40]], dtype=float)
    write_nwb(tmp_path / "r.nwb", {"acquisition/ElectricalSeries": dict(
        data=x, conversion=2e-6, offset=1e-5, channel_conversion=np.array([1, 2, 3, 4.0]),
        rows=np.array([4, 0, 1, 2]))}, electrodes_xy=xy)
    rec = open_recording(tmp_path / "r.nwb")
    assert rec.fs == FS and rec.n_channels == 4
    np.testing.assert_array_equal(rec.geometry, xy[[4, 0, 1, 2]])
    np.testing.assert_allclose(rec.gain_to_uv, [2, 4, 6, 8])
    np.testing.assert_allclose(rec.offset_to_uv, 10.0)
    got = rec.read(0, 100)
    want = x[:100].T * np.array([2, 4, 6, 8.0])[:, None] + 10.0
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_nwb_rate_from_timestamps(tmp_path):
    x = raw(n=500, c=3)
    write_nwb(tmp_path / "t.nwb", {"processing/ecephys/LFP": dict(
        data=x, timestamps=10.0 + np.arange(500) / 2500.0)})
    rec = open_recording(tmp_path / "t.nwb")
    assert abs(rec.fs - 2500.0) < 1e-6 and rec.source.endswith("/processing/ecephys/LFP/data")


def test_nwb_several_series_must_be_chosen(tmp_path):
    write_nwb(tmp_path / "two.nwb", {"acquisition/ap": dict(data=raw(c=3)),
                                     "acquisition/lf": dict(data=raw(n=300, c=3), rate=2500.0)})
    with pytest.raises(RecordingError, match="2 ElectricalSeries; choose one with dataset=: "
                                             "/acquisition/ap, /acquisition/lf"):
        open_recording(tmp_path / "two.nwb")
    assert open_recording(tmp_path / "two.nwb", dataset="/acquisition/lf").fs == 2500.0


# -- flat binaries and arrays --------------------------------------------------------------------
def test_flat_binary_memory_mapped(tmp_path):
    x = raw(n=4000, c=5)
    path = tmp_path / "rec.bin"
    x.tofile(path)
    rec = open_recording(path, n_channels=5, fs=FS, gain_to_uv=0.195)
    assert isinstance(rec, BinaryRecording) and rec.n_samples == 4000
    np.testing.assert_array_equal(rec.read(7, 3999, scaled=False), x[7:3999].T)
    with pytest.raises(RecordingError, match="not a whole number of 3-channel int16 frames"):
        open_recording(path, n_channels=3, fs=FS)


def test_array_recording_and_one_channel():
    x = raw(c=1)
    rec = open_recording(x, fs=FS)
    assert rec.n_channels == 1
    np.testing.assert_array_equal(rec.read(5, 10, scaled=False), x[5:10].T)
    rec2 = open_recording(np.ascontiguousarray(x.T), fs=FS, layout="channels_samples")
    np.testing.assert_array_equal(rec2.read(scaled=False), x.T)


def test_blocked_transpose_equals_numpy():
    x = raw(n=10_000, c=37)
    np.testing.assert_array_equal(to_channels_first(x), x.T)
    np.testing.assert_array_equal(to_channels_first(x[::3]), x[::3].T)


# -- bad input -----------------------------------------------------------------------------------
def test_missing_path_and_not_hdf5(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        open_recording(tmp_path / "nope.h5")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(RecordingError, match="not an HDF5 file"):
        open_recording(tmp_path / "notes.txt")


def test_truncated_hdf5(tmp_path):
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=raw(n=20000))
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.truncate(size // 3)
    with pytest.raises(RecordingError, match="truncated or damaged"):
        open_recording(path, fs=FS).read()


def test_missing_dataset_lists_the_datasets(tmp_path):
    with h5py.File(tmp_path / "m.h5", "w") as f:
        f["a/x"] = raw()
        f["b/y"] = raw(n=100)
        f["scalar"] = 1.0
    with pytest.raises(RecordingError, match=r"no object /c; datasets found: /a/x, /b/y"):
        open_recording(tmp_path / "m.h5", dataset="/c/z", fs=FS)
    with pytest.raises(RecordingError, match="2 2-D datasets; choose one"):
        open_recording(tmp_path / "m.h5", fs=FS)


def test_layout_that_cannot_be_told(tmp_path):
    with h5py.File(tmp_path / "sq.h5", "w") as f:
        f["x"] = raw(n=500, c=400)
    with pytest.raises(RecordingError, match="cannot tell samples from channels"):
        open_recording(tmp_path / "sq.h5", fs=FS)
    rec = open_recording(tmp_path / "sq.h5", fs=FS, layout="channels_samples")
    assert (rec.n_channels, rec.n_samples) == (500, 400)


def test_absurd_dimensions_are_refused_before_reading(tmp_path):
    with h5py.File(tmp_path / "big.h5", "w") as f:
        f.create_dataset("x", shape=(2**40, 100_000), dtype=np.int16, chunks=(1024, 64))
    with pytest.raises(RecordingError, match="100000 channels is outside"):
        open_recording(tmp_path / "big.h5", fs=FS)
    with h5py.File(tmp_path / "big2.h5", "w") as f:
        f.create_dataset("x", shape=(2**40, 384), dtype=np.int16, chunks=(1024, 64))
    rec = open_recording(tmp_path / "big2.h5", fs=FS)
    with pytest.raises(RecordingError, match="exceeds MAX_READ_BYTES"):
        rec.read()


def test_external_links_are_refused_unless_allowed(tmp_path):
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("secret", data=raw(), chunks=(500, 6))
    with h5py.File(tmp_path / "main.h5", "w") as f:
        f["x"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "/secret")
    with pytest.raises(RecordingError, match="external link .* refused"):
        open_recording(tmp_path / "main.h5", dataset="x", fs=FS)
    rec = open_recording(tmp_path / "main.h5", dataset="x", fs=FS, allow_external_links=True)
    assert rec.n_channels == 6
    np.testing.assert_array_equal(rec.read(0, 700, scaled=False), raw()[:700].T)


@pytest.mark.parametrize("n", [0, 1])
def test_zero_or_one_sample(tmp_path, n):
    with pytest.raises(RecordingError, match="a recording needs at least 2"):
        open_recording(np.zeros((n, 4), np.int16), fs=FS, layout="samples_channels")


def test_non_finite_float_data_names_channel_and_sample(tmp_path):
    x = np.random.default_rng(1).standard_normal((1000, 4)).astype(np.float32)
    x[777, 2] = np.nan
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["x"] = x
    rec = open_recording(tmp_path / "f.h5", fs=FS)
    rec.read(0, 700)
    with pytest.raises(RecordingError, match="non-finite sample .nan. at channel 2, sample 777"):
        rec.read(500, 1000)


def test_bad_read_arguments_and_metadata():
    rec = open_recording(raw(), fs=FS)
    with pytest.raises(RecordingError, match="start <= stop"):
        rec.read(10, 5)
    with pytest.raises(RecordingError, match=r"channels: indices must be in \[0, 6\)"):
        rec.read(0, 5, channels=[6])
    with pytest.raises(RecordingError, match="fs: expected a positive"):
        open_recording(raw(), fs=-1)
    with pytest.raises(RecordingError, match="geometry: expected \\[6, 2\\]"):
        open_recording(raw(), fs=FS, geometry=np.zeros((5, 2)))
    with pytest.raises(RecordingError, match="gain_to_uv: expected one value or 6"):
        open_recording(raw(), fs=FS, gain_to_uv=[1, 2])
    with pytest.raises(RecordingError, match="fs: an array recording needs"):
        open_recording(raw())


def test_spikeinterface_recording():
    si = pytest.importorskip("spikeinterface.core")
    x = raw(n=2000, c=4)
    r = si.NumpyRecording([x], sampling_frequency=FS)
    r.set_channel_gains(0.195)
    r.set_channel_offsets(3.0)
    r.set_dummy_probe_from_locations(np.stack([np.zeros(4), 20.0 * np.arange(4)], 1))
    rec = open_recording(r)
    assert (rec.n_channels, rec.n_samples, rec.fs) == (4, 2000, FS)
    np.testing.assert_allclose(rec.gain_to_uv, 0.195)
    np.testing.assert_array_equal(rec.geometry[:, 1], 20.0 * np.arange(4))
    np.testing.assert_array_equal(rec.read(10, 500, channels=[3, 0], scaled=False),
                                  x[10:500, [3, 0]].T)
    np.testing.assert_allclose(rec.read(0, 5), x[:5].T * 0.195 + 3.0, rtol=1e-6)


def test_chunk_cache_is_sized_for_the_chunks(tmp_path):
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("x", shape=(100_000, 384), dtype=np.int16, chunks=(30000, 64),
                         compression="gzip")
    rec = open_recording(tmp_path / "c.h5", fs=FS)
    _, nbytes, _ = rec._dset.id.get_access_plist().get_chunk_cache()
    assert nbytes >= 2 * 6 * 30000 * 64 * 2       # two rows of 6 chunks of 3.84 MB
    np.testing.assert_array_equal(rec.read(0, 10, scaled=False), 0)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 300), cols=st.integers(1, 40),
       dtype=st.sampled_from([np.int16, np.float32, np.float64]), axis=st.integers(0, 1),
       cuts=st.lists(st.integers(0, 300), max_size=5))
def test_raw_writer_equals_h5py(tmp_path_factory, rows, cols, dtype, axis, cuts):
    """Blocks written with os.pwrite into a contiguous dataset read back through h5py as
    written, along either axis, in any order of blocks."""
    from dspk.io.rawio import RawDatasetWriter, create_contiguous, raw_offset

    x = (np.random.default_rng(rows * cols).standard_normal((rows, cols)) * 999).astype(dtype)
    path = tmp_path_factory.mktemp("raw") / "o.h5"
    length = x.shape[axis]
    edges = sorted({0, length, *(min(c, length) for c in cuts)})
    with h5py.File(path, "w") as f:
        d = create_contiguous(f, "traces", x.shape, dtype)
        assert raw_offset(d) is not None
        w = RawDatasetWriter(str(path), d)
        for a, b in reversed(list(zip(edges[:-1], edges[1:]))):
            w.write(a, x[a:b] if axis == 0 else x[:, a:b], axis=axis)
        w.close()
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["traces"][:], x)


def test_raw_writer_refuses_what_it_cannot_write(tmp_path):
    from dspk.io.rawio import RawDatasetWriter, create_contiguous, raw_offset

    with h5py.File(tmp_path / "o.h5", "w") as f:
        gz = f.create_dataset("gz", shape=(100, 4), dtype=np.int16, chunks=(10, 4),
                              compression="gzip")
        assert raw_offset(gz) is None
        with pytest.raises(ValueError, match="not a contiguous"):
            RawDatasetWriter(str(tmp_path / "o.h5"), gz)
        d = create_contiguous(f, "c", (100, 4), np.int16)
        w = RawDatasetWriter(str(tmp_path / "o.h5"), d)
        with pytest.raises(ValueError, match="expected int16"):
            w.write(0, np.zeros((10, 4), np.float32), axis=0)
        with pytest.raises(ValueError, match="outside"):
            w.write(95, np.zeros((10, 4), np.int16), axis=0)
        w.close()


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 300), cols=st.integers(1, 7), step=st.integers(1, 64),
       dtype=st.sampled_from([np.int16, np.float32, np.uint8]),
       contiguous=st.booleans(), userblock=st.booleans(), data=st.data())
def test_raw_reader_equals_h5py(tmp_path_factory, rows, cols, step, dtype, contiguous,
                                userblock, data):
    """Rows read with os.preadv, contiguous or chunked (chunks spanning the columns), from
    a file with or without a user block, equal h5py's, into a given buffer too."""
    from dspk.io.rawio import RawDatasetReader

    x = (np.random.default_rng(rows * cols).standard_normal((rows, cols)) * 99).astype(dtype)
    path = tmp_path_factory.mktemp("rawr") / "x.h5"
    with h5py.File(path, "w", userblock_size=512 if userblock else 0) as f:
        f.create_dataset("x", data=x, chunks=None if contiguous else (min(step, rows), cols))
    a = data.draw(st.integers(0, rows))
    b = data.draw(st.integers(a, rows))
    with h5py.File(path, "r") as f:
        reader = RawDatasetReader.open(f["x"])
        assert reader is not None
        np.testing.assert_array_equal(reader.read(a, b), x[a:b])
        out = np.full((b - a, cols), 7, dtype)
        assert reader.read(a, b, out) is out
        np.testing.assert_array_equal(out, x[a:b])
        reader.close()


def test_raw_reader_declines_what_it_cannot_read(tmp_path):
    """Filters, chunks cutting the columns, another byte order, 1-D: no reader (h5py reads
    them); rows of a chunk never written: None (h5py fills them); a recording reads the same
    samples either way."""
    from dspk.io.rawio import RawDatasetReader

    x = raw(c=6)
    path = tmp_path / "r.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("gz", data=x, chunks=(100, 6), compression="gzip")
        f.create_dataset("cut", data=x, chunks=(100, 3))
        f.create_dataset("be", data=x.astype(">i2"))
        f.create_dataset("one", data=x[:, 0])
        part = f.create_dataset("part", shape=(3000, 6), dtype=np.int16, chunks=(1000, 6))
        part[:1000] = x[:1000]
        f.create_dataset("ok", data=x)
    with h5py.File(path, "r") as f:
        for name in ("gz", "cut", "be", "one"):
            assert RawDatasetReader.open(f[name]) is None, name
        reader = RawDatasetReader.open(f["part"])
        np.testing.assert_array_equal(reader.read(0, 1000), x[:1000])
        assert reader.read(500, 1500) is None
        with pytest.raises(ValueError, match="outside"):
            reader.read(10, 3001)
        with pytest.raises(ValueError, match="out: expected a C-contiguous int16"):
            reader.read(0, 10, np.zeros((10, 6), np.float32))
        reader.close()
    for name in ("part", "ok", "cut"):
        with open_recording(path, dataset=name, fs=FS) as rec:
            want = np.zeros((3000, 6), np.int16) if name == "part" else x
            if name == "part":
                want[:1000] = x[:1000]
            assert (rec._raw is not None) == (name in ("part", "ok"))
            np.testing.assert_array_equal(rec.read_native(200, 2500), want[200:2500])


@pytest.mark.parametrize("kind", ["nwb", "hdf5_gzip", "binary", "array"])
def test_every_recording_closes_and_reopens_from_its_spec(tmp_path, kind):
    """close() and ``with`` for every source; spec() pickles without a file handle and opens
    (as a worker would) the same samples and metadata, whatever overrides the first opening
    had; a closed recording refuses to read."""
    import pickle

    x = raw(c=6)
    geom = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    if kind == "nwb":
        path = tmp_path / "r.nwb"
        write_nwb(path, {"acquisition/ElectricalSeries": dict(data=x, rate=FS,
                                                              conversion=2.5e-6)})
        rec = open_recording(path, geometry=geom)
    elif kind == "hdf5_gzip":
        path = tmp_path / "r.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=x, chunks=(500, 6), compression="gzip")
        rec = open_recording(path, fs=FS, gain_to_uv=0.25, geometry=geom)
    elif kind == "binary":
        path = tmp_path / "r.bin"
        x.tofile(path)
        rec = open_recording(path, n_channels=6, fs=FS, gain_to_uv=0.5, geometry=geom)
    else:
        rec = open_recording(x, fs=FS, geometry=geom)
    spec = pickle.loads(pickle.dumps(rec.spec()))
    with spec.open() as again:
        assert type(again) is type(rec) and again.source == rec.source
        assert (again.fs, again.n_channels, again.n_samples) == (rec.fs, rec.n_channels,
                                                                 rec.n_samples)
        np.testing.assert_array_equal(again.geometry, rec.geometry)
        np.testing.assert_array_equal(again.read(100, 900), rec.read(100, 900))
    with rec:
        rec.read(0, 10)
    assert rec.closed
    with pytest.raises(RecordingError, match="closed"):
        rec.read(0, 10)
    rec.close()                                  # twice: harmless


def test_reopen_of_an_in_memory_recording_is_its_own():
    """Closing what reopen gave leaves the original open (and readable)."""
    rec = open_recording(np.arange(40, dtype=np.int16).reshape(20, 2), fs=1000.0)
    with rec.reopen() as again:
        assert again is not rec
        np.testing.assert_array_equal(again.read(0, 5), rec.read(0, 5))
    assert again.closed and not rec.closed
    rec.read(0, 5)
