"""dspk and SpikeInterface both ways (`dspk.spikeinterface`): the preprocessor in a
SpikeInterface chain gives the traces of `dspk preprocess` with n_jobs=1 and 2 (the fitted
state travels to the workers), `read_dspk` round-trips ids, locations, groups and gains, and
dspk's peaks are accepted by SpikeInterface's peak tools."""

from __future__ import annotations

import json
import pickle

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspk
from dspk.detect import PEAK_DTYPE, PEAK_LOCATION_DTYPE, spikes_to_peaks
from dspk.io import RecordingError
from dspk.pipeline import Pipeline, PipelineError

si = pytest.importorskip("spikeinterface.core",
                         reason="spikeinterface is not installed (pip install spikeinterface)")
dsi = pytest.importorskip("dspk.spikeinterface")

FS = 30000.0
N = 45000                  # 1.5 s
C = 16


def probe_two_shanks():
    """16 contacts on two shanks of two columns, in device order."""
    from probeinterface import generate_multi_shank

    probe = generate_multi_shank(num_shank=2, num_columns=2, num_contact_per_column=4)
    probe.set_device_channel_indices(np.arange(probe.get_contact_count()))
    return probe


def spiky_int16(seed=0, n=N):
    """int16 noise (SD 50 raw) with spikes on neighbouring channels, [samples, channels]."""
    from dspk.detect import default_templates

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((C, n)) * 50.0
    w = default_templates()[2] / -default_templates()[2].min()
    for t in rng.integers(100, n - 100, 120):
        ch = int(rng.integers(1, C - 1))
        x[ch - 1:ch + 2, t - 20:t + 41] += np.array([[300.0], [600.0], [300.0]]) * w
    return np.round(x.T).astype(np.int16)


@pytest.fixture(scope="module")
def si_rec():
    """A SpikeInterface recording: int16, µV gains, string channel ids, two shanks."""
    rec = si.NumpyRecording([spiky_int16()], sampling_frequency=FS,
                            channel_ids=[f"A{k}" for k in range(C)])
    rec.set_channel_gains(0.195)
    rec.set_channel_offsets(0.0)
    rec.set_probe(probe_two_shanks(), group_mode="by_shank")
    return rec


def dspk_output(rec, path, **options):
    """`dspk preprocess` of a SpikeInterface recording into path; its /traces."""
    out = dspk.preprocess(dspk.open_recording(rec), str(path), progress=False, **options)
    with h5py.File(out, "r") as f:
        return out, f["traces"][()]


def close(y, ref, scale=None):
    """Equal up to float32 rounding (the FFT filters: the chunks differ), relative to the
    traces' largest value (``scale``: of the whole recording, for a part of it)."""
    scale = float(np.abs(ref).max()) if scale is None else scale
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-6 * scale)


# -- the preprocessor -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The extractor is not serializable to file")  # in memory
def test_a_chain_gives_the_traces_of_dspk_preprocess_with_one_and_two_jobs(si_rec, tmp_path):
    _, ref = dspk_output(si_rec, tmp_path / "out.h5", whiten="local")
    pre = dsi.dspk_preprocess(si_rec, whiten="local")
    close(pre.get_traces(), ref)
    one = pre.save(format="binary", folder=tmp_path / "one", n_jobs=1,
                   chunk_duration="0.37s", progress_bar=False)
    close(one.get_traces(), ref)
    # "spawn": each worker rebuilds the recording from its pickled keywords (fork would
    # inherit the parent's objects and prove nothing)
    two = pre.save(format="binary", folder=tmp_path / "two", n_jobs=2,
                   chunk_duration="0.37s", mp_context="spawn", progress_bar=False)
    close(two.get_traces(), ref)


@pytest.fixture(scope="module")
def white(si_rec):
    """The recording globally whitened by dspk, and all its traces."""
    pre = dsi.dspk_preprocess(si_rec, whiten="global", backend="cpu")
    return pre, pre.get_traces()


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_any_chunk_and_channels_are_those_of_the_whole(si_rec, white, data):
    pre, whole = white
    a = data.draw(st.integers(0, N - 1), label="start")
    b = data.draw(st.integers(a + 1, min(N, a + 4000)), label="end")
    chans = data.draw(st.lists(st.integers(0, C - 1), min_size=1, max_size=C, unique=True),
                      label="channels")
    ids = si_rec.channel_ids[chans]
    y = pre.get_traces(start_frame=a, end_frame=b, channel_ids=ids)
    assert y.dtype == np.float32 and y.shape == (b - a, len(chans)) and y.flags.c_contiguous
    close(y, whole[a:b][:, chans], scale=float(np.abs(whole).max()))


def test_an_empty_range_gives_no_samples(white):
    pre = white[0]
    assert pre.get_traces(start_frame=100, end_frame=100).shape == (0, C)
    assert pre.get_traces(start_frame=5, end_frame=5, channel_ids=["A1", "A2"]).shape == (0, 2)


def test_the_fitted_state_travels_and_is_not_refitted(si_rec, white, monkeypatch):
    pre = white[0]

    def refit(*args, **kwargs):
        raise AssertionError("refitted")

    monkeypatch.setattr(Pipeline, "fit", refit)
    again = pickle.loads(pickle.dumps(pre))
    assert np.array_equal(again.pipeline.states[-1]["W"], pre.pipeline.states[-1]["W"])
    assert again.pipeline.fingerprint() == pre.pipeline.fingerprint()
    assert np.array_equal(again.get_traces(start_frame=0, end_frame=3000),
                          pre.get_traces(start_frame=0, end_frame=3000))
    # the JSON form SpikeInterface writes (dump_to_json) gives the same pipeline
    spec = json.loads(json.dumps(pre.to_dict()["kwargs"]["pipeline"]))
    assert dsi.DspkRecording(si_rec, pipeline=spec).pipeline.fingerprint() == \
        pre.pipeline.fingerprint()


def test_an_edited_fitted_state_is_refused(si_rec, white):
    spec = json.loads(json.dumps(white[0].to_dict()["kwargs"]["pipeline"]))
    spec["states"][-1]["W"]["values"][0] += 1e-9
    with pytest.raises(PipelineError, match="fingerprint"):
        dsi.DspkRecording(si_rec, pipeline=spec)
    with pytest.raises(PipelineError, match="pipeline: expected a dspk.Pipeline or the dict"):
        dsi.DspkRecording(si_rec, pipeline={"steps": 3})


def test_a_fitted_pipeline_is_used_as_it_is_and_an_unfitted_one_is_not_changed(si_rec):
    p = Pipeline.from_options(whiten="global", backend="cpu")
    pre = dsi.DspkRecording(si_rec, pipeline=p)
    assert not p.is_fitted and pre.pipeline.is_fitted         # a copy was fitted
    again = dsi.DspkRecording(si_rec, pipeline=pre.pipeline)
    assert again.pipeline.fingerprint() == pre.pipeline.fingerprint()
    eight = si.NumpyRecording([spiky_int16()[:, :8]], sampling_frequency=FS)
    eight.set_dummy_probe_from_locations(si_rec.get_channel_locations()[:8])
    with pytest.raises(PipelineError, match="does not apply to this recording of 8 channels"):
        dsi.DspkRecording(eight, pipeline=pre.pipeline)
    other = pre.pipeline
    other.fs = 20000.0
    with pytest.raises(PipelineError, match="fitted at 20000 Hz; the recording is 30000 Hz"):
        dsi.DspkRecording(si_rec, pipeline=other)


def test_units_whitened_is_not_uv_and_unwhitened_is(si_rec, white):
    pre = white[0]
    assert not pre.has_scaleable_traces()
    assert list(pre.get_property("physical_unit")) == ["whitened (noise SD)"] * C
    assert pre.get_property("gain_to_physical_unit").tolist() == [1.0] * C
    plain = dsi.dspk_preprocess(si_rec, whiten="none", reference="none", backend="cpu")
    assert plain.has_scaleable_traces() and plain.get_dtype() == np.float32
    assert plain.get_channel_gains().tolist() == [1.0] * C
    assert plain.get_channel_offsets().tolist() == [0.0] * C
    assert plain.get_annotation("is_filtered") is True
    # the µV of the parent's gains: the traces of the same high-pass on µV
    uv = si_rec.get_traces(return_in_uV=True).T.astype(np.float32)
    close(plain.get_traces(), Pipeline.from_options(whiten="none", reference="none")
          .transform(uv, FS).T)


def test_the_metadata_are_the_parents(si_rec, white):
    pre = white[0]
    assert list(pre.channel_ids) == list(si_rec.channel_ids)
    assert np.array_equal(pre.get_channel_locations(), si_rec.get_channel_locations())
    assert np.array_equal(pre.get_channel_groups(), si_rec.get_channel_groups())
    assert pre.get_num_segments() == 1 and pre.get_num_samples() == N


def test_the_phase_shift_step_drops_the_adc_shifts(si_rec):
    rec = si_rec.clone()
    rec.set_property("inter_sample_shift", np.arange(C) % 13 / 13.0)
    pre = dsi.dspk_preprocess(rec, phase_shift="auto", whiten="none", backend="cpu")
    assert "inter_sample_shift" not in pre.get_property_keys()
    assert "inter_sample_shift" in dsi.dspk_preprocess(rec, whiten="none").get_property_keys()


def test_every_segment_is_served_with_the_fit_of_the_first():
    traces = [spiky_int16(seed=s, n=n) for s, n in ((1, 30000), (2, 21000))]
    rec = si.NumpyRecording(traces, sampling_frequency=FS)
    rec.set_probe(probe_two_shanks())
    pre = dsi.dspk_preprocess(rec, whiten="global", backend="cpu")
    assert pre.get_num_segments() == 2 and pre.get_num_samples(segment_index=1) == 21000
    second = dspk.open_recording(traces[1], fs=FS, layout="samples_channels")
    expected = pre.pipeline.transform(second.read(), FS).T
    close(pre.get_traces(segment_index=1), expected)


def test_bad_inputs_are_refused_with_their_names(si_rec):
    with pytest.raises(TypeError, match="recording: expected a SpikeInterface recording"):
        dsi.dspk_preprocess(np.zeros((1000, 4), np.float32))
    with pytest.raises(TypeError, match=r"unknown pipeline option\(s\) \['whitening'\]"):
        dsi.dspk_preprocess(si_rec, whitening="local")
    with pytest.raises(PipelineError, match="not both"):
        dsi.dspk_preprocess(si_rec, pipeline=Pipeline.from_options(), whiten="none")
    with pytest.raises(TypeError, match="pipeline: expected a dspk.Pipeline or a dict"):
        dsi.dspk_preprocess(si_rec, pipeline="kilosort")
    with pytest.raises(PipelineError, match="detect: a DspkRecording serves traces"):
        dsi.dspk_preprocess(si_rec, detect=True)
    with pytest.raises(PipelineError, match="whiten='nope'|whiten"):
        dsi.dspk_preprocess(si_rec, whiten="nope")
    no_probe = si.NumpyRecording([np.zeros((3000, 4), np.float32)], sampling_frequency=FS)
    with pytest.raises(PipelineError, match="geometry"):
        dsi.dspk_preprocess(no_probe, whiten="local")


@pytest.mark.gpu
def test_the_gpu_backend_serves_the_cpu_traces_and_asks_for_spawned_workers(si_rec):
    cpu = dsi.dspk_preprocess(si_rec, whiten="local", backend="cpu")
    gpu = dsi.dspk_preprocess(si_rec, whiten="local", backend="gpu")
    assert gpu.get_preferred_mp_context() == "spawn"
    assert cpu.get_preferred_mp_context() is None
    y = gpu.get_traces(start_frame=1000, end_frame=9000)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_allclose(y, cpu.get_traces(start_frame=1000, end_frame=9000), rtol=0,
                               atol=1e-4 * float(np.abs(y).max()))


# -- a dspk recording of SpikeInterface's metadata ------------------------------------------------
def test_dspk_reads_the_channel_ids_and_groups_of_a_spikeinterface_recording(si_rec):
    rec = dspk.open_recording(si_rec)
    assert rec.channel_ids.tolist() == [f"A{k}" for k in range(C)]
    assert rec.shank_ids.tolist() == [0] * 8 + [1] * 8
    bad = si_rec.clone()
    bad.set_property("group", np.linspace(0, 1, C))
    with pytest.raises(RecordingError, match=r"group: .* one group \(an integer or a label\) "
                                             r"per channel"):
        dspk.open_recording(bad)
    named = si_rec.clone()         # an NWB file's electrode group names
    named.set_property("group", np.array(["shank1"] * 8 + ["shank0"] * 8))
    assert dspk.open_recording(named).shank_ids.tolist() == [1] * 8 + [0] * 8


# -- read_dspk ------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [dict(whiten="local", output_dtype=np.float32),
                                     dict(whiten="none", output_dtype=np.int16),
                                     dict(whiten="global", output_dtype=np.int16, detect=True,
                                          layout="channels_samples")],
                         ids=["whitened-float32", "uv-int16", "whitened-int16-spikes-cs"])
def test_read_dspk_round_trips_ids_locations_groups_and_gains(si_rec, tmp_path, options):
    out, stored = dspk_output(si_rec, tmp_path / "o.h5", **options)
    rec = dsi.read_dspk(out)
    assert rec.get_num_samples() == N                  # /traces' own shape, /spikes after it
    assert rec.get_dtype() == np.dtype(options["output_dtype"])
    assert list(rec.channel_ids) == list(si_rec.channel_ids)
    assert np.array_equal(rec.get_channel_locations(), si_rec.get_channel_locations())
    assert np.array_equal(rec.get_channel_groups(), si_rec.get_channel_groups())
    assert rec.get_probe().shank_ids.tolist() == ["0"] * 8 + ["1"] * 8
    scale = 1.0 if options["output_dtype"] == np.float32 else \
        (0.01 if options["whiten"] != "none" else 0.1)
    assert rec.get_property("gain_to_physical_unit").tolist() == [scale] * C
    if options["whiten"] == "none":
        assert rec.has_scaleable_traces()
        assert rec.get_channel_gains().tolist() == [scale] * C
        assert list(rec.get_property("physical_unit")) == ["uV"] * C
    else:
        assert not rec.has_scaleable_traces()
        assert list(rec.get_property("physical_unit")) == ["whitened (noise SD)"] * C
    samples = stored if options.get("layout") != "channels_samples" else stored.T
    assert np.array_equal(rec.get_traces(), samples)
    assert np.array_equal(rec.get_traces(start_frame=7, end_frame=300, channel_ids=["A3", "A0"]),
                          samples[7:300][:, [3, 0]])
    again = pickle.loads(pickle.dumps(rec))
    assert np.array_equal(again.get_traces(end_frame=50), samples[:50])
    assert rec.get_annotation("is_filtered") is True


def test_read_dspk_of_an_output_of_an_array_and_of_an_older_output(tmp_path):
    x = spiky_int16().astype(np.float32).T
    geom = np.c_[np.zeros(C), 20.0 * np.arange(C)]
    out = dspk.preprocess(dspk.open_recording(x, fs=FS, geometry=geom), str(tmp_path / "a.h5"),
                          progress=False)
    rec = dsi.read_dspk(out)
    assert rec.channel_ids.tolist() == list(range(C))
    assert rec.get_channel_groups().tolist() == [0] * C
    with h5py.File(out, "a") as f:          # what dspk wrote before ids and units
        del f["channel_ids"]
        del f["traces"].attrs["units"]
    old = dsi.read_dspk(out)
    assert old.channel_ids.tolist() == list(range(C))
    assert list(old.get_property("physical_unit")) == ["whitened (noise SD)"] * C


def test_read_dspk_refuses_what_is_not_a_dspk_output(tmp_path):
    with pytest.raises(FileNotFoundError, match="file_path"):
        dsi.read_dspk(tmp_path / "missing.h5")
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(RecordingError, match="is not an HDF5 file"):
        dsi.read_dspk(tmp_path / "text.h5")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("traces", data=np.zeros((100, 2), np.float32)).attrs["fs"] = FS
    with pytest.raises(RecordingError, match="is not a dspk output"):
        dsi.read_dspk(tmp_path / "other.h5")


# -- peaks ----------------------------------------------------------------------------------------
def test_the_peak_dtypes_are_spikeinterfaces():
    from spikeinterface.core.node_pipeline import base_peak_dtype

    assert PEAK_DTYPE == np.dtype(base_peak_dtype)
    assert PEAK_LOCATION_DTYPE.names == ("x", "y")


@pytest.fixture(scope="module")
def gt():
    rec, sorting = si.generate_ground_truth_recording(durations=[4.0], num_channels=16,
                                                      num_units=6, seed=0)
    return rec, sorting


def test_spikeinterfaces_tools_take_dspks_peaks(gt):
    from spikeinterface.sortingcomponents.motion import estimate_motion

    rec, _ = gt
    peaks, locations = dsi.dspk_detect_peaks(rec, whiten="global", detect_threshold=6.0)
    assert peaks.dtype == PEAK_DTYPE and locations.dtype == PEAK_LOCATION_DTYPE
    assert len(peaks) > 50 and (np.diff(peaks["sample_index"]) >= 0).all()
    sorting = si.NumpySorting.from_peaks(peaks, rec.sampling_frequency, rec.channel_ids)
    counts = sorting.count_num_spikes_per_unit()
    assert sum(counts.values()) == len(peaks)
    assert np.array_equal(locations["y"], rec.get_channel_locations()[peaks["channel_index"], 1])
    motion = estimate_motion(rec, peaks, locations, method="iterative_template", rigid=True,
                             bin_s=2.0, progress_bar=False)
    assert motion.displacement[0].shape[1] == 1
    pytest.importorskip("sklearn", reason="select_peaks needs scikit-learn")
    from spikeinterface.sortingcomponents.peak_selection import select_peaks

    chosen = select_peaks(peaks, method="uniform", n_peaks=20, seed=0)
    assert chosen.dtype == PEAK_DTYPE and 0 < len(chosen) <= 20


def test_dspk_detect_peaks_is_the_pipelines_detection_per_segment(gt):
    rec, _ = gt
    two = si.append_recordings([rec, rec.frame_slice(0, 60000)])
    peaks, locations = dsi.dspk_detect_peaks(two, whiten="global", detect_threshold=6.0,
                                             chunk_s=0.3)
    first = dspk.pipeline.detect_peaks(
        Pipeline.from_options(whiten="global", detect=True, detect_threshold=6.0),
        dspk.open_recording(rec))[0]
    seg0 = peaks[peaks["segment_index"] == 0]
    assert np.array_equal(seg0[["sample_index", "channel_index"]],
                          first[["sample_index", "channel_index"]])
    seg1 = peaks[peaks["segment_index"] == 1]
    assert len(seg1) > 0 and seg1["sample_index"].max() < 60000
    assert len(locations) == len(peaks)
    with pytest.raises(TypeError, match="recording: expected a SpikeInterface recording"):
        dsi.dspk_detect_peaks("rec.h5")
    with pytest.raises(PipelineError, match="not both"):
        dsi.dspk_detect_peaks(rec, pipeline=Pipeline.from_options(detect=True), whiten="none")


def test_peaks_of_an_output_read_back_by_spikeinterface(si_rec, tmp_path):
    out, stored = dspk_output(si_rec, tmp_path / "o.h5", whiten="local", detect=True)
    with h5py.File(out, "r") as f:
        spikes = f["spikes"][()]
    peaks, locations = spikes_to_peaks(spikes, stored.T)
    rec = dsi.read_dspk(out)
    traces = rec.get_traces()
    assert np.array_equal(peaks["amplitude"],
                          traces[peaks["sample_index"], peaks["channel_index"]].astype(float))
    assert (peaks["amplitude"] < 0).mean() > 0.9                 # troughs
    assert np.array_equal(locations["y"], spikes["y"].astype(np.float64))
    sorting = si.NumpySorting.from_peaks(peaks, FS, rec.channel_ids)
    assert sorting.get_num_units() == C
