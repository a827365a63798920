"""The pipeline's Neuropixels steps (issue 33): `PhaseShift` takes the recording's ADC sample
shifts (a SpikeGLX .meta) and gives, chunk by chunk, what `dspk.ops.phase_shift` gives on the
whole recording; it passes the traces through where the recording has no shifts (said in the
log); `Saturation` blanks samples at or beyond its level; both from the command line."""

import logging
from pathlib import Path

import h5py
import numpy as np
import pytest

import dspk
from dspk import cli
from dspk.ops import blank_saturation, phase_shift
from dspk.ops import common_reference
from dspk.pipeline import (Context, FitBlocks, PhaseShift, Pipeline, PipelineError, Reference,
                           Saturation)

from tests.recordings import np1_meta, np2_meta, rand16, write_sglx
from tests.geometry import np1_geometry


def np1_recording(tmp_path, n=6000, seed=0):
    """A SpikeGLX NP1.0 AP file of 384 channels (smooth enough for a delay to matter)."""
    rng = np.random.default_rng(seed)
    data = np.cumsum(rng.integers(-40, 41, (n, 385)), axis=0).clip(-3000, 3000)
    data[:, 384] = 0
    return write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", data.astype(np.int16), np1_meta())


def test_phase_shift_step_equals_the_op_on_the_whole_recording(tmp_path):
    path = np1_recording(tmp_path)
    rec = dspk.open_recording(path)
    shifts = rec.sample_shifts
    assert shifts is not None and len(np.unique(shifts)) == 12       # k/13, k < 12
    p = Pipeline([PhaseShift()], backend="cpu").fit(rec)
    np.testing.assert_array_equal(p.states[0]["shifts"], shifts)
    out = p.run(rec, tmp_path / "out.h5", chunk_s=0.05, progress=False)   # 4 chunks of 1500
    x = rec.read(0, rec.n_samples).astype(np.float64)                  # µV, [C, N]
    want = phase_shift(x, shifts)                                        # float64, one call
    with h5py.File(out, "r") as f:
        got = f["traces"][:].T
    # float32 chunks with the filters' reach as halo: the one-shot result to float32 rounding
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * float(np.abs(want).max()))
    assert float(np.abs(got - x).max()) > 1.0                            # it did delay
    rec.close()


def test_phase_shift_step_passes_through_without_shifts(caplog):
    x = np.random.default_rng(1).standard_normal((3, 4000)).astype(np.float32)
    rec = dspk.open_recording(x, fs=30000.0)
    with caplog.at_level(logging.INFO, logger="dspk.pipeline"):
        p = Pipeline([PhaseShift()]).fit(rec)
    assert "does not give its ADC sample shifts" in caplog.text
    assert p.states[0]["shifts"].size == 0
    np.testing.assert_array_equal(p.transform(x), x)


def test_phase_shift_fit_reads_nothing(monkeypatch):
    """A pipeline whose only fitted step is PhaseShift reads no fit chunk."""
    x = np.zeros((2, 30000), np.float32)
    rec = dspk.open_recording(x, fs=30000.0)
    monkeypatch.setattr(type(rec), "read", lambda *a, **k: pytest.fail("read to fit"))
    Pipeline([PhaseShift()]).fit(rec)


def test_phase_shift_refuses_shifts_it_cannot_apply():
    step = PhaseShift()

    class Rec:
        sample_shifts = np.array([0.0, 0.5, 2.5])

    ctx = Context(fs=3e4, n_channels=3, xp=np, dtype=np.dtype(np.float32), recording=Rec())
    with pytest.raises(PipelineError, match=r"phase_shift=: the recording's sample shifts "
                                            r"must be 3 finite values within ±1 sample"):
        step.fit(FitBlocks([], 0), ctx)
    Rec.sample_shifts = np.array([0.0, 0.5])
    with pytest.raises(PipelineError, match="got shape \\(2,\\)"):
        step.fit(FitBlocks([], 0), ctx)


def test_saturation_step_blanks_both_sides_to_zero():
    x = np.random.default_rng(2).normal(0, 200, (4, 5000)).astype(np.float32)
    x[1, 100:110] = 1000.0
    x[2, 200:205] = -1000.0
    y = Pipeline([Saturation(500.0)]).transform(x, fs=30000.0)
    np.testing.assert_array_equal(y, blank_saturation(x, 500.0, direction="both", fill=0.0))
    assert (y[1, 100:110] == 0).all() and (y[2, 200:205] == 0).all()
    assert np.abs(y).max() < 500.0


@pytest.mark.parametrize("level", [0.0, -5.0, float("nan"), float("inf")])
def test_saturation_level_must_be_positive(level):
    with pytest.raises(PipelineError, match="saturation=: expected a positive level in µV"):
        Saturation(level)


def test_command_line_phase_shift_and_saturation(tmp_path, capsys):
    path = np1_recording(tmp_path, n=3000)
    out = tmp_path / "cli.h5"
    assert cli.main(["preprocess", str(path), str(out), "--phase-shift", "auto",
                     "--saturation", "800", "--whiten", "none", "--backend", "cpu"]) == 0
    rec = dspk.open_recording(path)
    p = Pipeline.from_options(phase_shift="auto", saturation=800.0, whiten="none",
                              backend="cpu").fit(rec)
    assert [type(s).__name__ for s in p.steps] == ["Saturation", "PhaseShift", "HighPass",
                                                    "Reference"]
    want = p.transform(rec.read(0, rec.n_samples).astype(np.float32))
    with h5py.File(out, "r") as f:
        got = f["traces"][:].T
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)
    rec.close()
    capsys.readouterr()
    assert cli.main(["preprocess", str(path), str(tmp_path / "bad.h5"), "--saturation",
                     "-5"]) == 2
    assert "--saturation: expected a positive level in µV" in capsys.readouterr().err


@pytest.mark.gpu
def test_phase_shift_and_saturation_steps_on_the_gpu_match_the_cpu(tmp_path):
    path = np1_recording(tmp_path, n=4000)
    rec = dspk.open_recording(path)
    outs = {}
    for backend in ("cpu", "gpu"):
        p = Pipeline.from_options(phase_shift="auto", saturation=800.0, whiten="none",
                                  backend=backend)
        out = p.fit(rec).run(rec, tmp_path / f"{backend}.h5", chunk_s=0.05, progress=False)
        with h5py.File(out, "r") as f:
            outs[backend] = f["traces"][:]
    rec.close()
    scale = float(np.abs(outs["cpu"]).max())
    np.testing.assert_allclose(outs["gpu"], outs["cpu"], rtol=0, atol=2e-5 * scale)


@pytest.mark.gpu
def test_the_ibl_preset_on_the_gpu_fits_and_runs_as_on_the_cpu(tmp_path):
    """IBL's order with local whitening (phase shift, high-pass, detected bad channels
    interpolated, destriping with its AGC, whitening) on the GPU: the same channels found bad,
    the destriping's RMS (summed on the device) and the whitening as the CPU's, and the same
    traces to float32 rounding through the chain."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(3)
    t = np.arange(60000)
    data = lfilter([1.0], [1.0, -0.9], rng.normal(0, 4, (60000, 385)), axis=0) \
        + 60.0 * np.sin(t / 40.0)[:, None] + rng.normal(0, 6, (60000, 1))   # a common stripe
    data[:, 50] = 0                                                          # dead
    data[:, 200] += rng.normal(0, 40, 60000)                                 # noisy
    data[:, 384] = 0
    meta = np1_meta()                       # every channel at gain 500 (2.34 µV a count)
    meta["~imroTbl"] = "(0,384)" + "".join(f"({c} 0 0 500 250 1)" for c in range(384))
    path = write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin",
                      np.round(data).clip(-32768, 32767).astype(np.int16), meta)
    rec = dspk.open_recording(path)
    outs, states = {}, {}
    for backend in ("cpu", "gpu"):
        p = Pipeline.from_options(preset="ibl", whiten="local", backend=backend)
        p.fit(rec)
        states[backend] = {type(s).__name__: st for s, st in zip(p.steps, p.states)}
        out = p.run(rec, tmp_path / f"{backend}.h5", chunk_s=0.5, progress=False)
        with h5py.File(out, "r") as f:
            outs[backend] = f["traces"][:]
    rec.close()
    cpu, gpu = states["cpu"], states["gpu"]
    np.testing.assert_array_equal(gpu["BadChannels"]["labels"], cpu["BadChannels"]["labels"])
    assert cpu["BadChannels"]["labels"][[50, 200]].all()
    np.testing.assert_allclose(gpu["SpatialHighpass"]["rms"], cpu["SpatialHighpass"]["rms"],
                               rtol=1e-6)
    np.testing.assert_allclose(gpu["Whiten"]["W"], cpu["Whiten"]["W"], rtol=0,
                               atol=1e-4 * float(np.abs(cpu["Whiten"]["W"]).max()))
    scale = float(np.abs(outs["cpu"]).max())
    np.testing.assert_allclose(outs["gpu"], outs["cpu"], rtol=0, atol=1e-3 * scale)


def np2_four_shanks(tmp_path, n=3000):
    return write_sglx(tmp_path, "np2_g0_t0.imec0.ap.bin", rand16(n, 385, seed=4),
                      np2_meta(24, 384, True))


def test_spikeglx_shank_ids(tmp_path):
    rec = dspk.open_recording(np2_four_shanks(tmp_path))
    np.testing.assert_array_equal(rec.shank_ids, np.arange(384) // 96)
    rec.close()
    one = dspk.open_recording(np1_recording(tmp_path, n=1000))
    np.testing.assert_array_equal(one.shank_ids, np.zeros(384))
    one.close()


def test_reference_per_shank_equals_common_reference_with_groups(tmp_path):
    rec = dspk.open_recording(np2_four_shanks(tmp_path))
    p = Pipeline([Reference("median", groups="shank")], backend="cpu").fit(rec)
    np.testing.assert_array_equal(p.states[0]["shanks"], np.arange(384) // 96)
    out = p.run(rec, tmp_path / "ref.h5", chunk_s=0.03, progress=False)
    x = rec.read()
    want = common_reference(x, "median", groups=[np.arange(s * 96, (s + 1) * 96)
                                                 for s in range(4)])
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(f["traces"][:].T, want)
    assert not np.array_equal(want, common_reference(x, "median"))
    again = Pipeline.from_options(reference_groups="shank", whiten="none", highpass=0,
                                  backend="cpu")
    assert again.steps == [Reference("median", "shank")]
    rec.close()


def test_reference_per_shank_needs_shanks(tmp_path, capsys):
    x = np.random.default_rng(3).standard_normal((4, 3000)).astype(np.float32)
    rec = dspk.open_recording(x, fs=30000.0)
    with pytest.raises(PipelineError, match=r"reference_groups='shank' needs the recording's "
                                            r"shank_ids \(the channels' shanks\)"):
        Pipeline([Reference("median", "shank")]).fit(rec)
    with pytest.raises(PipelineError,
                       match="reference_groups=: expected 'none', 'shank' or 'adc'"):
        Reference("median", "probe")
    path = tmp_path / "flat.bin"
    (x.T * 100).astype(np.int16).tofile(path)
    assert cli.main(["preprocess", str(path), str(tmp_path / "o.h5"), "--n-channels", "4",
                     "--fs", "30000", "--whiten", "none", "--reference-groups", "shank"]) == 2
    err = capsys.readouterr().err
    assert "(the channels' shanks)" in err and "--reference-groups none" in err


def test_whitening_per_shank_is_block_diagonal_of_each_shanks_own(tmp_path):
    """whiten_groups='shank': W is block-diagonal, each block the whitening matrix of that
    shank's covariance alone (global and local)."""
    from dspk.ops import CovarianceAccumulator, whitening_matrix
    from dspk.pipeline import Whiten

    rec = dspk.open_recording(np2_four_shanks(tmp_path, n=6000))
    x = rec.read().astype(np.float64)
    shanks = rec.shank_ids
    for mode in ("global", "local"):
        step = Whiten(mode, n_neighbors=8, groups="shank")
        p = Pipeline([step], dtype=np.float64, backend="cpu")
        p.fit(rec, n_chunks=1, chunk_s=0.2)             # one chunk: the whole recording
        w = p.states[0]["W"]
        for s in range(4):
            g = np.flatnonzero(shanks == s)
            assert not w[np.ix_(g, np.flatnonzero(shanks != s))].any()
            acc = CovarianceAccumulator()
            acc.add(x[g])
            kw = {} if mode == "global" else dict(geometry_um=rec.geometry[g], n_neighbors=8)
            want = whitening_matrix(acc.result().astype(np.float64), **kw)
            np.testing.assert_allclose(w[np.ix_(g, g)], want, rtol=1e-7, atol=1e-12)
        assert step.describe() == f"whiten={mode!r}, whiten_groups='shank'"
    rec.close()


def test_whitening_per_shank_needs_shanks():
    from dspk.pipeline import Whiten

    x = np.random.default_rng(3).standard_normal((4, 30000)).astype(np.float32)
    rec = dspk.open_recording(x, fs=30000.0)
    with pytest.raises(PipelineError, match=r"whiten='global', whiten_groups='shank' needs "
                                            r"the recording's shank_ids"):
        Pipeline([Whiten("global", groups="shank")]).fit(rec)
    with pytest.raises(PipelineError, match="whiten_groups=: expected 'shank' or 'none'"):
        Whiten("global", groups="x")


def test_bad_channels_step_detects_and_interpolates():
    """On the fit chunks the step finds what the op finds on the whole traces (the injected
    dead, noisy and outside channels), and applies SpikeInterface's kriging of them."""
    from dspk.ops import detect_bad_channels, interpolation_matrix, spatial_filter
    from dspk.pipeline import BadChannels

    from tests.ops.test_bad_channels import np1_recording as np1_bad

    x, geom, expected, unsure = np1_bad(0, seconds=2.0)
    rec = dspk.open_recording(x, fs=30000.0, geometry=geom)
    p = Pipeline([BadChannels("detect")], backend="cpu").fit(rec, n_chunks=4, chunk_s=0.3)
    labels = p.states[0]["labels"]
    names = ("good", "dead", "noise", "out")
    for c, want in expected.items():
        if c not in unsure:
            assert names[labels[c]] == want, (c, want, names[labels[c]])
    want = spatial_filter(interpolation_matrix(geom, labels != 0).astype(np.float32), x)
    np.testing.assert_allclose(p.transform(x), want, rtol=0, atol=1e-3)
    whole = detect_bad_channels(x, geom, 30000.0, num_random_chunks=None)
    sure = [c for c in expected if c not in unsure]
    assert [names.index(str(v)) for v in whole.labels[sure]] == labels[sure].tolist()


def test_bad_channels_given_and_refused():
    from dspk.pipeline import BadChannels

    rng = np.random.default_rng(5)
    geom = np1_geometry(384)
    x = rng.standard_normal((384, 6000)).astype(np.float32)
    rec = dspk.open_recording(x, fs=30000.0, geometry=geom)
    p = Pipeline([BadChannels("5,7-8")]).fit(rec)
    assert np.flatnonzero(p.states[0]["labels"]).tolist() == [5, 7, 8]
    with pytest.raises(PipelineError, match=r"bad_channels=: channel 400 is not one of the "
                                            r"recording's 0..383"):
        Pipeline([BadChannels("400")]).fit(rec)
    with pytest.raises(PipelineError, match="every channel is bad"):
        Pipeline([BadChannels("0-383")]).fit(rec)
    with pytest.raises(dspk.io.RecordingError, match="channels=: expected indices"):
        BadChannels("3-1")
    nogeom = dspk.open_recording(x, fs=30000.0)
    with pytest.raises(PipelineError, match="bad_channels='2' needs the recording's geometry"):
        Pipeline([BadChannels("2")]).fit(nogeom)


def test_command_line_bad_channels(tmp_path, capsys):
    rng = np.random.default_rng(6)
    geom = np1_geometry(384)
    x = rng.standard_normal((384, 6000)).astype(np.float32)
    path = tmp_path / "flat.bin"
    (x.T * 10).astype(np.int16).tofile(path)
    probe = tmp_path / "probe.csv"
    np.savetxt(probe, geom, delimiter=",", header="x,y", comments="")
    out = tmp_path / "o.h5"
    assert cli.main(["preprocess", str(path), str(out), "--n-channels", "384", "--fs", "30000",
                     "--probe", str(probe), "--whiten", "none", "--reference", "none",
                     "--bad-channels", "40,200", "--backend", "cpu"]) == 0
    with h5py.File(out, "r") as f:
        names = []
        f.visit(names.append)
        assert any(n.endswith("BadChannels/labels") for n in names), names
    assert cli.main(["info", str(out)]) == 0
    assert "bad channels (interpolated): given [40, 200]" in capsys.readouterr().out


@pytest.mark.parametrize("agc", [True, False])
def test_spatial_highpass_step_in_chunks_equals_the_op(tmp_path, agc):
    """Chunked with its margin (the AGC window's half length), the step gives the op's
    result on the whole recording with the fitted RMS; per shank on a 4-shank probe."""
    from dspk.ops import highpass_spatial_filter
    from dspk.pipeline import SpatialHighpass

    rec = dspk.open_recording(np2_four_shanks(tmp_path, n=9000))
    step = SpatialHighpass(apply_agc=agc)
    p = Pipeline([step], backend="cpu").fit(rec, n_chunks=2, chunk_s=0.1)
    st = p.states[0]
    np.testing.assert_array_equal(st["shanks"], np.arange(384) // 96)
    assert step.margin(30000.0) == (1500 if agc else 0)
    out = p.run(rec, tmp_path / "d.h5", chunk_s=0.1, progress=False)   # 3 chunks
    x = rec.read()
    want = highpass_spatial_filter(x, rec.geometry, 30000.0, apply_agc=agc,
                                   rms_values=st["rms"], groups=rec.shank_ids)
    with h5py.File(out, "r") as f:
        got = f["traces"][:].T
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * float(np.abs(want).max()))
    rec.close()


def test_command_line_spatial_highpass(tmp_path):
    path = np2_four_shanks(tmp_path, n=6000)
    out = tmp_path / "cli.h5"
    assert cli.main(["preprocess", str(path), str(out), "--spatial-highpass", "--whiten",
                     "none", "--backend", "cpu"]) == 0
    with h5py.File(out, "r") as f:
        names = []
        f.visit(names.append)
        assert any("SpatialHighpass/rms" in n for n in names), names


def test_spatial_highpass_refuses_a_flat_geometry_before_any_work(tmp_path, capsys):
    x = np.random.default_rng(0).normal(size=(3000, 64)).astype(np.float32)
    flat = np.c_[20.0 * np.arange(64), np.zeros(64)]           # all channels at y = 0
    rec = dspk.open_recording(x, fs=30000.0, geometry=flat)
    p = Pipeline.from_options(spatial_highpass=True, reference="none", whiten="none",
                              backend="cpu")
    with pytest.raises(PipelineError, match=r"spatial_highpass=True: geometry: the 64 channels "
                                            r"of group 0 all have y = 0 µm"):
        p.fit(rec)
    out = tmp_path / "flat.h5"
    np.save(tmp_path / "flat.npy", flat)
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("traces", data=x).attrs["fs"] = 30000.0
    assert cli.main(["preprocess", str(path), str(out), "--spatial-highpass", "--probe",
                     str(tmp_path / "flat.npy"), "--whiten", "none", "--reference", "none",
                     "--backend", "cpu"]) != 0
    assert "all have y = 0" in capsys.readouterr().err
    assert not out.exists() and not Path(str(out) + ".partial").exists()


def test_presets():
    ibl = Pipeline.from_options(preset="ibl")
    assert [type(s).__name__ for s in ibl.steps] == ["PhaseShift", "HighPass", "BadChannels",
                                                     "SpatialHighpass"]
    ks = Pipeline.from_options(preset="kilosort", detect=True)
    assert [s.describe() for s in ks.steps][:3] == ["highpass=300", "reference='median'",
                                                    "whiten='local'"]
    assert ks.steps[2].n_neighbors == 32
    mine = Pipeline.from_options(preset="ibl", reference="median", bad_channels="none")
    assert [type(s).__name__ for s in mine.steps] == ["PhaseShift", "HighPass",
                                                      "SpatialHighpass", "Reference"]
    with pytest.raises(PipelineError,
                       match="preset=: expected one of ibl, ibl-lfp, kilosort, got 'ks'"):
        Pipeline.from_options(preset="ks")


def test_command_line_preset_gives_way_to_options_given(tmp_path, capsys):
    path = np2_four_shanks(tmp_path, n=6000)
    out = tmp_path / "ibl.h5"
    assert cli.main(["preprocess", str(path), str(out), "--preset", "ibl", "--bad-channels",
                     "none", "--reference", "median", "--backend", "cpu", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "steps: PhaseShift -> HighPass -> SpatialHighpass -> Reference" in printed
    with pytest.raises(SystemExit):          # argparse's own refusal of a value not offered
        cli.main(["preprocess", str(path), str(tmp_path / "x.h5"), "--preset", "x"])
    assert "invalid choice: 'x'" in capsys.readouterr().err
