"""A step written outside the package (tests/zscore_step.py) is one class and one register
call: `Pipeline.from_options`, the command line and `dspk.dask` all offer it, the job fits it
with the others in one pass, writes its fitted state, resumes it and loads it back."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

import dspk
from dspk import cli
from dspk.pipeline import Pipeline, PipelineError, Reference, Whiten, registry

from tests.zscore_step import OPTION, ZScore, register_zscore, unregister_zscore

FS = 30000.0


@pytest.fixture
def zscore():
    register_zscore()
    yield ZScore
    unregister_zscore()


def _recording(n=60000, c=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c)) * np.linspace(5, 40, c) + np.arange(c) * 100.0
    geom = np.c_[np.tile([0.0, 32.0], c // 2), np.repeat(np.arange(c // 2) * 20.0, 2)]
    return dspk.open_recording(np.rint(x).astype(np.int16), fs=FS, geometry=geom)


def test_a_registered_step_is_an_option_of_every_entry_point(zscore):
    p = Pipeline.from_options(zscore=True, whiten="global")
    assert [type(s).__name__ for s in p.steps] == ["HighPass", "Reference", "ZScore", "Whiten"]
    assert "ZScore" not in [type(s).__name__ for s in Pipeline.from_options().steps]
    assert OPTION in registry.options() and registry.stage_class("ZScore") is ZScore
    sub = cli.parser().parse_args(["preprocess", "in.h5", "out.h5", "--zscore"])
    assert sub.zscore is True
    assert cli.spelling()["zscore"] == "--zscore"
    from dspk.dask import pipeline_keys

    assert "zscore" in pipeline_keys()


def test_without_registration_it_is_unknown(tmp_path, zscore):
    p = Pipeline.from_options(zscore=True, whiten=None).fit(_recording())
    p.save(tmp_path / "p.npz")
    unregister_zscore()
    try:
        with pytest.raises(TypeError, match="unknown pipeline option"):
            Pipeline.from_options(zscore=True)
        with pytest.raises(PipelineError, match="unknown step 'ZScore'"):
            Pipeline.load(tmp_path / "p.npz")
    finally:
        register_zscore()


def test_the_registry_refuses_clashes(zscore):
    with pytest.raises(PipelineError, match="a stage named ZScore is registered"):
        registry.register(ZScore)

    class Other(ZScore):
        pass

    with pytest.raises(PipelineError, match="option zscore .* is taken"):
        registry.register(Other, (OPTION,), make=lambda zscore: None)
    with pytest.raises(PipelineError, match="before='Nothing': no such stage"):
        registry.register(Other, before="Nothing")
    with pytest.raises(PipelineError, match="options but no make"):
        registry.register(Other, (OPTION,))
    with pytest.raises(PipelineError, match="not a Step or Sink"):
        registry.register(int)


def test_it_is_fitted_with_the_others_and_matches_numpy(zscore):
    rec = _recording(n=30000)           # shorter than the fit chunks: all of it is fitted on
    p = Pipeline.from_options(highpass=None, reference="none", whiten=None, zscore=True,
                              dtype=np.float64).fit(rec)
    x = rec.read().astype(np.float64)
    center = np.median(x, axis=1)
    scale = np.median(np.abs(x - center[:, None]), axis=1) / 0.6744897501960817
    np.testing.assert_allclose(p.states[0]["center"], center, rtol=1e-12)
    np.testing.assert_allclose(p.states[0]["scale"], scale, rtol=1e-12)
    np.testing.assert_allclose(p.transform(x), (x - center[:, None]) / scale[:, None],
                               rtol=1e-12, atol=1e-12)
    # after a high-pass and a reference: fitted on what those steps left, then whitened
    q = Pipeline.from_options(zscore=True, whiten="global").fit(rec)
    assert q.is_fitted and set(q.states[2]) == {"center", "scale"}
    y = Pipeline([q.steps[0], q.steps[1]]).transform(rec.read(), fs=FS)
    np.testing.assert_allclose(q.states[2]["center"], np.median(y, axis=1), atol=0.05)


def test_the_job_writes_its_state_and_resumes_it(tmp_path, zscore):
    rec = _recording()
    p = Pipeline.from_options(zscore=True, whiten="global", backend="cpu")
    out = p.run(rec, tmp_path / "o.h5", chunk_s=0.25, progress=False)
    with h5py.File(out, "r") as f:
        assert [s["step"] for s in json.loads(f.attrs["pipeline"])] == \
            ["HighPass", "Reference", "ZScore", "Whiten"]
        np.testing.assert_array_equal(f["fitted/step2_ZScore/center"][:], p.states[2]["center"])
        y = f["traces"][:].T
    np.testing.assert_allclose(y, p.transform(rec.read()), atol=2e-5 * np.abs(y).max())
    # a fresh pipeline resumes a partial job with the state stored there (no refit)
    from dspk.pipeline.output import PartialOutput

    stop = {"after": 0}

    def interrupt(done):
        stop["after"] += 1
        if stop["after"] == 2:
            raise KeyboardInterrupt

    q = Pipeline.from_options(zscore=True, whiten="global", backend="cpu")
    with pytest.raises(KeyboardInterrupt):
        q.fit(rec).run(rec, tmp_path / "r.h5", chunk_s=0.25, progress=False, on_chunk=interrupt)
    assert PartialOutput(tmp_path / "r.h5").partial.exists()
    fresh = Pipeline.from_options(zscore=True, whiten="global", backend="cpu")
    fresh.fit = None            # a refit would fail: the stored state must be used
    done = fresh.run(rec, tmp_path / "r.h5", chunk_s=0.25, progress=False, resume=True)
    np.testing.assert_array_equal(h5py.File(done, "r")["traces"][:], y.T)
    p.save(tmp_path / "p.npz")
    back = Pipeline.load(tmp_path / "p.npz")
    assert back.steps == p.steps and back.fingerprint() == p.fingerprint()


def test_the_command_line_offers_it(tmp_path, zscore, capsys):
    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        d = f.create_dataset("traces", data=_recording().read(scaled=False).T)
        d.attrs["fs"] = FS
    assert cli.main(["preprocess", str(src), str(tmp_path / "o.h5"), "--zscore", "--whiten",
                     "global", "--quiet"]) == 0
    assert "steps: HighPass -> Reference -> ZScore -> Whiten" in capsys.readouterr().out
    with h5py.File(tmp_path / "o.h5", "r") as f:
        assert "fitted/step2_ZScore/scale" in f


@pytest.mark.blas_threads
@pytest.mark.slow
def test_dask_workers_run_it(tmp_path, zscore):
    """preprocess_many sends the pipeline to worker processes, where the step's class is
    imported from its module: the output is the single-process one, bit for bit."""
    from distributed import Client, LocalCluster

    import dspk.dask as dd

    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        d = f.create_dataset("traces", data=_recording().read(scaled=False).T)
        d.attrs["fs"] = FS
    ref = Pipeline.from_options(zscore=True, whiten="global", backend="cpu").run(
        str(src), tmp_path / "one.h5", chunk_s=0.5, progress=False)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        res = dd.preprocess_many([str(src)], tmp_path / "out", client=c, zscore=True,
                                 whiten="global", backend="cpu", chunk_s=0.5)
    with h5py.File(res[str(src)], "r") as f, h5py.File(ref, "r") as g:
        np.testing.assert_array_equal(f["traces"][:], g["traces"][:])
        assert "fitted/step2_ZScore/center" in f


def test_steps_and_sinks_keep_their_order():
    from dspk.pipeline import Detect

    with pytest.raises(PipelineError, match="Detect must be the last step"):
        Pipeline([Detect(), Reference()])
    with pytest.raises(PipelineError, match="steps:"):
        Pipeline([Whiten(), "highpass"])
