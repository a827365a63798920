"""A part of a recording (`dspk.io.SubsetRecording`, ``--time``/``--channels``): the parent's
samples, gains, geometry and shifts of those channels and that range, in workers too; the
command line runs on it; bad ranges and channel lists are refused naming the option."""

import pickle

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspk
from dspk import cli
from dspk.io import RecordingError, SubsetRecording, open_recording
from dspk.io.subset import parse_channels

from tests.recordings import np1_meta, write_sglx


def binary(tmp_path, n=3000, c=6):
    data = np.random.default_rng(0).integers(-500, 500, (n, c), dtype=np.int16)
    path = tmp_path / "rec.bin"
    data.tofile(path)
    geom = np.c_[np.zeros(c), 20.0 * np.arange(c)]
    rec = open_recording(path, n_channels=c, fs=30000.0, gain_to_uv=np.arange(1.0, c + 1),
                         geometry=geom)
    return rec, data


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_subset_reads_the_parents_samples(tmp_path_factory, data):
    rec, raw = binary(tmp_path_factory.mktemp("sub"))
    start = data.draw(st.integers(0, 2990))
    stop = data.draw(st.integers(start + 2, 3000))
    chans = data.draw(st.permutations(range(6)).map(lambda p: p[:3]))
    sub = SubsetRecording(rec, start, stop, chans)
    assert (sub.n_channels, sub.n_samples) == (3, stop - start)
    np.testing.assert_array_equal(sub.read(scaled=False), raw[start:stop, chans].T)
    np.testing.assert_array_equal(sub.gain_to_uv, rec.gain_to_uv[chans])
    np.testing.assert_array_equal(sub.geometry, rec.geometry[chans])
    a = data.draw(st.integers(0, sub.n_samples - 1))
    np.testing.assert_array_equal(sub.read(a, sub.n_samples), rec.read(start + a, stop,
                                                                           channels=chans))
    native = sub.read_native(0, sub.n_samples)
    np.testing.assert_array_equal(native, raw[start:stop, chans])
    again = pickle.loads(pickle.dumps(sub.spec())).open()           # as in a worker
    np.testing.assert_array_equal(again.read(scaled=False), sub.read(scaled=False))
    again.close()
    rec.close()


def test_subset_of_every_channel_reads_natively_and_closes_what_it_owns(tmp_path):
    rec, raw = binary(tmp_path)
    sub = SubsetRecording(rec, 100, 200, own=True)
    out = np.empty((100, 6), np.int16)
    assert sub.read_native(0, 100, out) is not None
    np.testing.assert_array_equal(out, raw[100:200])
    assert sub.files() == rec.files()
    sub.close()
    assert rec.closed


def test_subset_keeps_sample_shifts(tmp_path):
    data = np.zeros((1000, 385), np.int16)
    rec = open_recording(write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", data, np1_meta()))
    sub = SubsetRecording(rec, 0, 500, [5, 0, 13])
    np.testing.assert_array_equal(sub.sample_shifts, rec.sample_shifts[[5, 0, 13]])
    rec.close()


@pytest.mark.parametrize("start, stop, chans, match", [
    (10, 10, None, "time=: the range covers samples 10:10"),
    (0, 3001, None, "outside the recording's 0:3000"),
    (0, 100, [0, 6], r"channels=: expected channel indices in 0..5"),
    (0, 100, [], r"channels=: expected channel indices"),
    (0, 100, [1, 1], "channels=: a channel is named twice"),
])
def test_bad_subsets_are_refused(tmp_path, start, stop, chans, match):
    rec, _ = binary(tmp_path)
    with pytest.raises(RecordingError, match=match):
        SubsetRecording(rec, start, stop, chans)
    rec.close()


def test_parse_channels():
    assert parse_channels("0-2,5, 7 - 8").tolist() == [0, 1, 2, 5, 7, 8]
    for bad in ("", "a", "3-1", "1,,2", "-1"):
        with pytest.raises(RecordingError, match="channels=: expected indices and ranges"):
            parse_channels(bad)


def test_command_line_time_and_channels(tmp_path, capsys):
    rec, raw = binary(tmp_path, n=9000)
    out = tmp_path / "part.h5"
    args = ["preprocess", str(tmp_path / "rec.bin"), str(out), "--n-channels", "6", "--fs",
            "30000", "--whiten", "none", "--reference", "none", "--backend", "cpu"]
    assert cli.main(args + ["--time", "0.05", "0.2", "--channels", "4,0-2"]) == 0
    sub = SubsetRecording(open_recording(tmp_path / "rec.bin", n_channels=6, fs=30000.0),
                          1500, 6000, [4, 0, 1, 2], own=True)
    want = dspk.Pipeline.from_options(whiten="none", reference="none",
                                      backend="cpu").transform(sub.read(), fs=30000.0)
    sub.close()
    with h5py.File(out, "r") as f:
        got = f["traces"][:].T
    assert got.shape == (4, 4500)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)
    capsys.readouterr()
    assert cli.main(args[:2] + [str(tmp_path / "b.h5")] + args[3:] +
                    ["--time", "0.2", "0.1"]) == 2
    assert "--time: expected 0 <= START < END seconds" in capsys.readouterr().err
    assert cli.main(args[:2] + [str(tmp_path / "c.h5")] + args[3:] +
                    ["--channels", "0,9"]) == 2
    assert "--channels: expected channel indices in 0..5" in capsys.readouterr().err
    rec.close()
