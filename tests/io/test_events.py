"""The events a recording keeps, exported and carried by the outputs: `dspk events` (CatGT's
edges: bit, edge, sample, seconds) and `dspk info` on a SpikeGLX file's sync word; Open Ephys
TTL events (states/sample_numbers .npy) read into the same table, against Neo's reading of the
same folder where Neo is installed; the HDF5 output's ``/events`` and the Kilosort folder's
``events.csv`` equal to `sync_events`; a part of a recording (``--time``) numbered from its
start; bad inputs."""

import csv
import json
import os

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspk
from dspk import cli
from dspk.io import RecordingError, SubsetRecording, open_recording, sync_events
from dspk.io.events import (edge_counts, openephys_events, read_events_csv, read_events_hdf5,
                            recording_events, write_events_csv)

from tests.recordings import np1_meta, rand16, write_sglx

STREAM = "Neuropix-PXI-100.ProbeA-AP"


def sglx_file(tmp_path, n=6000, seed=0):
    """A 16-channel NP1.0 .ap.bin whose SY word toggles bits 0 and 6 (bit 6 every 1000)."""
    data = rand16(n, 17, seed=seed)
    sy = np.zeros(n, np.int64)
    sy |= ((np.arange(n) // 1000) % 2) << 6
    sy |= ((np.arange(n) // 700) % 2) & (np.arange(n) > 300)
    data[:, 16] = sy.astype(np.int16)
    return write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", data, np1_meta(range(16))), data


def oe_folder(tmp_path, states, samples, first=5000, n=3000, fs=30000.0, version="0.6.7"):
    rec_dir = tmp_path / "Record Node 101" / "experiment1" / "recording1"
    cont = rec_dir / "continuous" / STREAM
    cont.mkdir(parents=True)
    chans = [{"channel_name": f"CH{i + 1}", "bit_volts": 0.195, "units": "uV"}
             for i in range(4)]
    events = [{"folder_name": f"{STREAM}/TTL/", "channel_name": "TTL Input",
               "sample_rate": fs, "type": "int16", "num_channels": 1}]
    with open(rec_dir / "structure.oebin", "w") as f:
        json.dump({"GUI version": version,
                   "continuous": [{"folder_name": f"{STREAM}/", "sample_rate": fs,
                                   "num_channels": 4, "channels": chans,
                                   "stream_name": "ProbeA-AP"}],
                   "events": events, "spikes": []}, f)
    rand16(n, 4).tofile(cont / "continuous.dat")
    np.save(cont / "sample_numbers.npy", np.arange(first, first + n, dtype=np.int64))
    np.save(cont / "timestamps.npy", np.arange(first, first + n) / fs)
    ttl = rec_dir / "events" / STREAM / "TTL"
    ttl.mkdir(parents=True)
    np.save(ttl / "states.npy", np.asarray(states, np.int16))
    np.save(ttl / "sample_numbers.npy", np.asarray(samples, np.int64) + first)
    np.save(ttl / "timestamps.npy", (np.asarray(samples) + first) / fs)
    np.save(ttl / "full_words.npy", np.zeros(len(states), np.uint64))
    return rec_dir


def test_cli_events_and_info_on_a_spikeglx_sync_word(tmp_path, capsys):
    path, data = sglx_file(tmp_path)
    want = sync_events(path)
    assert set(want["bit"].tolist()) == {0, 6}
    out = tmp_path / "ev.csv"
    assert cli.main(["events", str(path), str(out)]) == 0
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["bit", "edge", "sample", "seconds"]
    assert [(int(b), e, int(s)) for b, e, s, _ in rows[1:]] == [
        (b, "rising" if p > 0 else "falling", s) for s, b, p in
        want[["sample", "bit", "polarity"]].tolist()]
    np.testing.assert_allclose([float(r[3]) for r in rows[1:]], want["sample"] / 30000.0,
                               rtol=1e-15)
    # bit 6 by hand: the sample where the SY word's bit 6 changes
    six = np.flatnonzero(np.diff((data[:, 16].view(np.uint16) >> 6) & 1)) + 1
    assert read_events_csv(out)["sample"][read_events_csv(out)["bit"] == 6].tolist() == \
        six.tolist() == [1000, 2000, 3000, 4000, 5000]
    # --bits and --time: a part, numbered from its start
    assert cli.main(["events", str(path), str(out), "--bits", "6", "--time", "0.05",
                     "0.15"]) == 0
    assert read_events_csv(out)[["sample", "bit"]].tolist() == \
        [(500, 6), (1500, 6), (2500, 6)]
    capsys.readouterr()
    assert cli.main(["info", str(path)]) == 0
    text = capsys.readouterr().out
    counts = edge_counts(want)
    assert f"bit 6: {counts[6][0]} rising, {counts[6][1]} falling edges" in text
    assert "bit 0:" in text
    # refused: a recording without events, bad --bits
    plain = tmp_path / "plain.bin"
    rand16(100, 2).tofile(plain)
    assert cli.main(["events", str(plain), str(out), "--n-channels", "2", "--fs",
                     "1000"]) == 2
    assert "keeps no events" in capsys.readouterr().err
    assert cli.main(["events", str(path), str(out), "--bits", "x"]) == 2
    assert "--bits" in capsys.readouterr().err


def test_openephys_ttl_events(tmp_path):
    states = [1, 3, -1, -3, 1, -1, 2]
    samples = [10, 15, 400, 410, 1000, 1200, 2000]
    folder = oe_folder(tmp_path, states, samples)
    with open_recording(folder) as rec:
        ev = recording_events(rec)
        assert ev[["sample", "bit", "polarity"]].tolist() == [
            (10, 0, 1), (15, 2, 1), (400, 0, -1), (410, 2, -1), (1000, 0, 1),
            (1200, 0, -1), (2000, 1, 1)]
        np.testing.assert_allclose(ev["time"], ev["sample"] / 30000.0)
        part = recording_events(SubsetRecording(rec, 300, 1500))
        assert part[["sample", "bit"]].tolist() == [(100, 0), (110, 2), (700, 0), (900, 0)]
        assert recording_events(rec, bits=2)["sample"].tolist() == [15, 410]
    neo = pytest.importorskip("neo.rawio")
    r = neo.OpenEphysBinaryRawIO(str(tmp_path))
    r.parse_header()
    # Neo's TTL "epochs": each line's rising edges (paired with a falling one), in seconds
    # on the stream's clock
    times, _, labels = r.get_event_timestamps(0, 0, 0)
    got = ev[ev["polarity"] > 0]
    paired = got[np.isin(got["bit"], [0, 2])]
    np.testing.assert_allclose(np.sort(r.rescale_event_timestamp(times, "float64", 0)),
                               np.sort((paired["sample"] + 5000) / 30000.0))


def test_outputs_carry_the_events(tmp_path):
    path, _ = sglx_file(tmp_path)
    want = sync_events(path)
    p = dspk.Pipeline.from_options(highpass=300.0, reference="median", whiten="none",
                                   backend="cpu")
    out = p.run(str(path), str(tmp_path / "o.h5"), progress=False, chunk_s=0.07)
    with h5py.File(out, "r") as f:
        got = read_events_hdf5(f)
        assert f["events"].attrs["fs"] == 30000.0
    np.testing.assert_array_equal(got[["sample", "bit", "polarity"]], want[["sample", "bit",
                                                                           "polarity"]])
    np.testing.assert_allclose(got["time"], want["sample"] / 30000.0)
    ks = dspk.Pipeline.from_options(highpass=300.0, reference="median", whiten="none",
                                    backend="cpu")
    folder = ks.run(str(path), str(tmp_path / "ks"), format="kilosort", progress=False)
    back = read_events_csv(os.path.join(folder, "events.csv"))
    np.testing.assert_array_equal(back[["sample", "bit", "polarity"]],
                                  want[["sample", "bit", "polarity"]])
    # NWB: each bit's high periods as the TimeIntervals table /intervals/events
    pynwb = pytest.importorskip("pynwb")
    nwb_out = ks.run(str(path), str(tmp_path / "o.nwb"), format="nwb", progress=False)
    with pynwb.NWBHDF5IO(str(nwb_out), "r") as io:
        ti = io.read().intervals["events"]
        start, stop, bit = ti["start_time"][:], ti["stop_time"][:], ti["bit"][:]
    six = want[want["bit"] == 6]
    np.testing.assert_allclose(start[bit == 6], six["time"][six["polarity"] > 0])
    np.testing.assert_allclose(stop[bit == 6][:2], six["time"][six["polarity"] < 0])
    assert stop[bit == 6][-1] == pytest.approx(6000 / 30000.0)       # high at the end
    # a recording without events: no /events
    rec = open_recording(rand16(3000, 4).astype(np.float32), fs=30000.0)
    out2 = dspk.Pipeline.from_options(highpass=300.0, whiten="none").run(
        rec, str(tmp_path / "o2.h5"), progress=False)
    with h5py.File(out2, "r") as f:
        assert "events" not in f


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="fs"):
        write_events_csv(tmp_path / "e.csv", np.zeros(0, dspk.io.sync.EVENT_DTYPE), fs=0)
    (tmp_path / "bad.csv").write_text("a,b\n")
    with pytest.raises(RecordingError, match="header"):
        read_events_csv(tmp_path / "bad.csv")
    folder = oe_folder(tmp_path, [1, 0], [10, 20])
    with open_recording(folder) as rec, pytest.raises(RecordingError, match="state 0"):
        openephys_events(rec)


def test_a_bin_jobs_events_come_from_its_own_reads(tmp_path, monkeypatch):
    """A .bin's sync edges are kept as the job reads its blocks (halos overlapping): the
    events hook reads no sync word again (the second pass read the whole file), and gives
    the edges of a pass of its own; a read of part of the file gives none."""
    from dspk.io.spikeglx import SpikeGLXRecording

    path, _ = sglx_file(tmp_path, n=9000)
    want = sync_events(path)
    calls = []
    real = SpikeGLXRecording.read_sync
    monkeypatch.setattr(SpikeGLXRecording, "read_sync",
                        lambda self, *a: calls.append(a) or real(self, *a))
    with open_recording(path) as rec:
        rec.read(0, 5000)
        assert rec.decoded_sync_edges() is None                 # samples 5000.. not read
        p = dspk.Pipeline.from_options(highpass=300.0, reference="mean", whiten="none",
                                       backend="cpu")
        out = p.run(rec, str(tmp_path / "o.h5"), progress=False, chunk_s=0.05)
        assert calls == []
        np.testing.assert_array_equal(sync_events(rec), want)
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(read_events_hdf5(f)[["sample", "bit", "polarity"]],
                                      want[["sample", "bit", "polarity"]])


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_ledger_joins_any_blocks_that_cover_the_words(data):
    """`SyncLedger` over blocks of any bounds — overlapping, touching, in any order, some
    read twice — gives the edges of one pass over the words, or None while a gap is left."""
    from dspk.io.sync import SyncLedger, sync_edges

    n = data.draw(st.integers(2, 120))
    words = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    w = np.array(words, np.uint16)[None, :] << 5
    cuts = sorted(data.draw(st.lists(st.integers(1, n - 1), max_size=6, unique=True)))
    bounds = list(zip([0, *cuts], [*cuts, n]))
    blocks = [(max(0, a - data.draw(st.integers(0, 3))), b) for a, b in bounds]
    if data.draw(st.booleans()):
        blocks.pop(data.draw(st.integers(0, len(blocks) - 1)))       # a gap, maybe
    ledger = SyncLedger()
    for a, b in data.draw(st.permutations(blocks + blocks[:1])):
        ledger.add(a, w[:, a:b])
    got = ledger.edges(n)
    covered = np.zeros(n, bool)
    for a, b in blocks:
        covered[a:b] = True
    if not covered.all():
        assert got is None
    else:
        keys = ["sample", "bit", "polarity"]                   # (``time``: NaN, no rate)
        np.testing.assert_array_equal(got[keys], sync_edges(w)[keys])


def test_the_ledger_stops_at_its_limit():
    from dspk.io.sync import SyncLedger

    ledger = SyncLedger(limit=2)
    w = np.zeros((1, 10), np.uint16)
    for a in (0, 3, 5):
        ledger.add(a, w[:, a:a + 5])
    assert ledger.edges(10) is None


def test_a_cbin_jobs_events_come_from_its_own_decode(tmp_path, monkeypatch):
    """A .cbin's sync edges are kept as the job decodes its chunks: the events hook decodes
    nothing again, and gives the edges of a fresh read."""
    from dspk.io.cbin import CbinReader, write_cbin

    path, data = sglx_file(tmp_path, n=9000)
    cbin = tmp_path / "c" / "run_g0_t0.imec0.ap.cbin"
    cbin.parent.mkdir()
    write_cbin(str(cbin), data, 30000.0, chunk_samples=2000)
    cbin.with_suffix(".meta").write_text(path.with_suffix(".meta").read_text())
    want = sync_events(path)
    decodes = []
    real = CbinReader._decode
    monkeypatch.setattr(CbinReader, "_decode",
                        lambda self, i, buf, *rest: decodes.append(i) or real(self, i, buf,
                                                                              *rest))
    with open_recording(cbin) as rec:
        assert rec.decoded_sync_edges() is None          # nothing decoded yet
        p = dspk.Pipeline.from_options(highpass=0, reference="mean", whiten="none",
                                       backend="cpu")
        out = p.run(rec, str(tmp_path / "o.h5"), progress=False, chunk_s=0.05)
        n_decodes = len(decodes)
        got = sync_events(rec)
        assert len(decodes) == n_decodes                  # no chunk decoded again
    np.testing.assert_array_equal(got, want)
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(read_events_hdf5(f)["sample"], want["sample"])
