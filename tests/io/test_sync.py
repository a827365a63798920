"""The sync channel decoded to edges: `dspk.io.sync_edges` against IBL's definition
(ibl-neuropixel's ``split_sync`` bits, ``ibldsp.utils.fronts``) on random words, streamed in
blocks as in one call; `sync_events` of SpikeGLX .bin and .cbin files against ibl-neuropixel's
reader of the same file; NI-DAQ's several words; bad inputs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dspk.io import RecordingError, SubsetRecording, open_recording, sync_edges, sync_events

from tests.io.test_cbin import compress
from tests.recordings import np1_meta, rand16, write_sglx

ibldsp_utils = pytest.importorskip("ibldsp.utils")
spikeglx = pytest.importorskip("spikeglx")


def ibl_edges(words):
    """IBL's edges of int16 words: (sample, bit, polarity) sorted as dspk sorts them."""
    bits = spikeglx.split_sync(np.asarray(words, dtype=np.int16))      # [samples, 16]
    ind, sign = ibldsp_utils.fronts(bits.astype(np.int16), axis=0)
    samples, bit = ind
    order = np.lexsort((bit, samples))
    return samples[order], bit[order], sign[order]


def pulses(n, seed):
    """Words with a few bits toggling at random times, bit 15 (the sign) among them."""
    rng = np.random.default_rng(seed)
    w = np.zeros(n, np.int64)
    for b in (0, 3, 6, 15):
        level = np.cumsum(rng.random(n) < 0.01) % 2
        w |= level << b
    return w.astype(np.uint16).view(np.int16)


@settings(max_examples=40, deadline=None)
@given(words=hnp.arrays(np.int16, st.integers(1, 300),
                        elements=st.sampled_from([0, 1, 64, 65, -32768, -32703, 7, 2])))
def test_edges_are_ibls_fronts(words):
    ev = sync_edges(words)
    s, b, p = ibl_edges(words)
    np.testing.assert_array_equal(ev["sample"], s)
    np.testing.assert_array_equal(ev["bit"], b)
    np.testing.assert_array_equal(ev["polarity"], p)
    assert np.isnan(ev["time"]).all()


@pytest.mark.parametrize("block", [1, 7, 1000, 5000])
def test_blocks_with_the_previous_word_give_one_calls_edges(block):
    words = pulses(5000, seed=1)
    whole = sync_edges(words, fs=1000.0)
    parts, prev = [], None
    for a in range(0, len(words), block):
        parts.append(sync_edges(words[a:a + block], start=a, previous=prev, fs=1000.0))
        prev = words[min(a + block, len(words)) - 1]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    np.testing.assert_allclose(whole["time"], whole["sample"] / 1000.0)
    # one bit, and an edge at the first sample only with the word before it
    six = sync_edges(words, bits=6)
    assert set(six["bit"].tolist()) == {6}
    first = sync_edges(np.array([64, 64], np.int16), previous=0)
    assert first[["sample", "bit", "polarity"]].tolist() == [(0, 6, 1)]
    assert sync_edges(np.array([64, 64], np.int16)).size == 0


@pytest.mark.parametrize("compressed", [False, True])
def test_spikeglx_sync_events_agree_with_ibl(tmp_path, compressed):
    data = rand16(40000, 385, seed=5)
    data[:, 384] = pulses(40000, seed=2)
    path = write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", data, np1_meta())
    if compressed:
        cbin = compress(tmp_path / "run_g0_t0.imec0.ap.cbin", data, chunk_duration=0.3)
        path.unlink()
        path = cbin
    sr = spikeglx.Reader(path)
    try:
        bits = sr.read_sync_digital(slice(0, 40000))
    finally:
        sr.close()
    ind, sign = ibldsp_utils.fronts(bits.astype(np.int16), axis=0)
    order = np.lexsort((ind[1], ind[0]))
    with open_recording(path) as rec:
        assert rec.n_sync_words == 1
        np.testing.assert_array_equal(rec.read_sync(100, 200)[0],
                                      data[100:200, 384].view(np.uint16))
        ev = sync_events(rec, chunk=3333)
        np.testing.assert_array_equal(ev["sample"], ind[0][order])
        np.testing.assert_array_equal(ev["bit"], ind[1][order])
        np.testing.assert_array_equal(ev["polarity"], sign[order])
        np.testing.assert_allclose(ev["time"], ev["sample"] / 30000.0)
        # a part of the recording: its own sample numbers
        part = SubsetRecording(rec, start=10000, stop=30000)
        sub = sync_events(part, bits=6)
        want = ev[(ev["bit"] == 6) & (ev["sample"] > 10000) & (ev["sample"] < 30000)]
        np.testing.assert_array_equal(sub["sample"] + 10000, want["sample"])
    assert sync_events(path, bits=[0, 3]).size == np.isin(ev["bit"], [0, 3]).sum()   # a path


def test_nidq_words_are_numbered_16_per_word(tmp_path):
    meta = {"typeThis": "nidq", "niSampRate": "25000", "nSavedChans": "4",
            "snsMnMaXaDw": "0,1,1,2", "acqMnMaXaDw": "0,1,1,2", "snsSaveChanSubset": "all",
            "niAiRangeMax": "5", "niAiRangeMin": "-5", "niMaxInt": "32768", "niMAGain": "2"}
    data = np.zeros((100, 4), np.int16)
    data[10:, 2] = 1                                   # word 0, bit 0
    data[20:30, 3] = 1 << 4                            # word 1, bit 4: numbered 20
    path = write_sglx(tmp_path, "run_g0_t0.nidq.bin", data, meta)
    ev = sync_events(path)
    assert ev[["sample", "bit", "polarity"]].tolist() == [(10, 0, 1), (20, 20, 1), (30, 20, -1)]
    np.testing.assert_allclose(ev["time"], [10 / 25000, 20 / 25000, 30 / 25000])


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="words"):
        sync_edges(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="words"):
        sync_edges(np.zeros(5, np.int32))
    with pytest.raises(ValueError, match="bits"):
        sync_edges(np.zeros(5, np.int16), bits=16)
    with pytest.raises(ValueError, match="previous"):
        sync_edges(np.zeros((2, 5), np.int16), previous=0)
    rec = open_recording(np.zeros((1000, 4), np.int16), fs=1000.0)
    with pytest.raises(RecordingError, match="no sync channel"):
        sync_events(rec)
    data = rand16(100, 385)
    path = write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", data, np1_meta())
    with open_recording(path) as sg:
        with pytest.raises(RecordingError, match="start <= stop"):
            sync_events(sg, start=50, stop=10)
        with pytest.raises(RecordingError, match="read_sync"):
            sg.read_sync(0, 101)
        with pytest.raises(ValueError, match="chunk"):
            sync_events(sg, chunk=0)
