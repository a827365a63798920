"""dspk.plot: every figure rendered to PNG and checked for legibility (every data panel has
labelled axes with units, nothing drawn outside the canvas, text at least 7 points, at most a
notebook's width), on the bundled sample recording; bad input names the argument."""

import numpy as np
import pytest

import dspk

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from dspk import plot  # noqa: E402

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    import os

    os.environ.setdefault("DSPK_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    rec = dspk.open_recording(ROOT / "data" / "sample.nwb")
    x = rec.read(0, min(rec.n_samples, 60000))
    pipe = dspk.Pipeline.from_options(highpass=300, reference="median", whiten="local",
                                      n_neighbors=16).fit(rec)
    y = pipe.transform(x)
    k = [o["step"] for o in pipe.options()].index("Whiten")
    spikes = dspk.detect_spikes(y, rec.geometry, rec.fs)
    assert len(spikes) > 20
    return dict(rec=rec, x=x, y=y, W=pipe.states[k]["W"], spikes=spikes)


def _colorbar_axes(fig):
    return {id(a) for a in fig.axes if a.get_label() == "<colorbar>"}


def check_legible(fig, path, categorical_y=False):
    """Rendered to PNG; labels on every data panel; inside the canvas; readable sizes."""
    fig.savefig(path, dpi=100)
    assert path.stat().st_size > 5000
    w, h = fig.get_size_inches()
    assert w <= 10.0 + 1e-9 and h <= 6.5 + 1e-9, (w, h)
    cbars = _colorbar_axes(fig)
    for ax in fig.axes:
        if id(ax) in cbars:
            assert ax.get_ylabel() or ax.get_xlabel(), "a colour bar without a label"
            continue
        assert ax.get_xlabel(), f"panel {ax.get_title()!r}: no x label"
        assert ax.get_ylabel() or categorical_y, f"panel {ax.get_title()!r}: no y label"
        if categorical_y:
            assert all(t.get_text() for t in ax.get_yticklabels())
    renderer = fig.canvas.get_renderer()
    box = fig.get_tightbbox(renderer)
    pt = 1 / 72
    assert box.x0 >= -pt and box.y0 >= -pt and box.x1 <= w + pt and box.y1 <= h + pt, \
        f"something drawn outside the {w} x {h} in canvas: {box}"
    for t in fig.findobj(Text):
        if t.get_text() and t.get_visible():
            assert t.get_fontsize() >= 7, (t.get_text(), t.get_fontsize())
    plt.close(fig)


def test_traces_before_after(sample, tmp_path):
    fig = plot.before_after(sample["x"], sample["y"], sample["rec"].fs, channels=range(12),
                            start_s=0.5)
    assert [a.get_ylabel().split("(")[1].split()[-2] for a in fig.axes] == ["µV", "σ"]
    check_legible(fig, tmp_path / "before_after.png")
    check_legible(plot.traces(sample["y"], sample["rec"].fs, unit="σ"), tmp_path / "t.png")


def test_traces_draws_the_window_asked(sample):
    fs = sample["rec"].fs
    fig = plot.traces(sample["x"], fs, channels=[3, 1], start_s=0.25, duration_s=0.05)
    ax = fig.axes[0]
    t = ax.lines[0].get_xdata()
    assert t[0] == pytest.approx(0.25) and t[-1] == pytest.approx(0.3 - 1 / fs)
    assert [tl.get_text() for tl in ax.get_yticklabels()] == ["3", "1"]
    x1 = ax.lines[1].get_ydata()
    ref = sample["x"][1, int(0.25 * fs):int(0.3 * fs)]
    np.testing.assert_allclose(x1 - x1.mean(), ref - ref.mean(), rtol=1e-4, atol=1e-3)
    plt.close(fig)


def test_matrices(sample, tmp_path):
    xf = dspk.fir_filter(sample["x"], dspk.highpass_taps(sample["rec"].fs, 300))
    fig = plot.covariance_and_whitening(dspk.covariance(xf), sample["W"])
    check_legible(fig, tmp_path / "cov.png")
    img = fig.axes[1].images[0].get_array()
    np.testing.assert_allclose(img, sample["W"])


def test_probe_with_spikes_and_detection_positions(sample, tmp_path):
    g = sample["rec"].geometry
    fig = plot.probe(g, sample["spikes"], positions=g, widths_um=(10, 30, 50))
    check_legible(fig, tmp_path / "probe.png")
    fig = plot.probe(g)
    check_legible(fig, tmp_path / "probe-bare.png")


def test_waveforms_and_features(sample, tmp_path):
    rec, s = sample["rec"], sample["spikes"]
    fig = plot.waveforms(sample["y"], s, rec.geometry, rec.fs)
    busiest = int(np.bincount(s["channel_index"]).argmax())
    assert f"channel {busiest} " in fig.axes[0].get_title()
    check_legible(fig, tmp_path / "waveforms.png")
    feats, _, _ = dspk.spike_features(sample["y"], s, rec.geometry, rec.fs)
    fig = plot.features(feats, labels=s["template_index"], label_name="template")
    check_legible(fig, tmp_path / "features.png")


def test_motion_figure(sample, tmp_path):
    from dspk.motion import Motion

    geom = sample["rec"].geometry
    m = Motion([0.0, 0.5, 1.0, 1.5, 2.0], [geom[:, 1].mean()], [[0.0], [3.0], [-2.0], [1.0]],
               geometry=geom)
    spikes = sample["spikes"]
    fig = plot.motion(m, spikes, fs=sample["rec"].fs)
    assert [a.get_xlabel() for a in fig.axes] == ["time (s)", "time (s)"]
    assert len(fig.axes[0].collections) == 1 and len(fig.axes[0].lines) == 4   # rigid: 4 depths
    check_legible(fig, tmp_path / "motion.png")
    nonrigid = Motion([0.0, 1.0, 2.0], [100.0, 300.0], [[0.0, 1.0], [2.0, 4.0]])
    fig = plot.motion(nonrigid)
    assert len(fig.axes[1].lines) == 2
    check_legible(fig, tmp_path / "motion2.png")
    with pytest.raises(ValueError, match="shank: the motion has no spatial bin on shank 1"):
        plot.motion(nonrigid, shank=1)
    with pytest.raises(TypeError, match="m: expected a dspk.motion.Motion"):
        plot.motion(np.zeros(3))
    with pytest.raises(ValueError, match="pass fs"):
        plot.motion(m, {"sample_index": np.zeros(3), "y": np.zeros(3)})
    plt.close("all")


def test_tuner_and_benchmark_bars(tmp_path):
    x = np.random.default_rng(0).standard_normal((32, 4000)).astype(np.float32)
    dspk.matmul(x, x.T)
    fig = plot.tuner_timings(dspk.explain(x, x.T))
    check_legible(fig, tmp_path / "tuner.png", categorical_y=True)
    results = sorted((ROOT / "benchmarks" / "results").glob("bench_*.json"))
    assert results
    for path in results:
        d = plot.load_results(path)
        case = d["rows"][0]["case"]
        fig = plot.benchmark_bars(d, case=case)
        check_legible(fig, tmp_path / f"{path.stem}.png", categorical_y=True)


def test_many_bars_stay_within_the_canvas(tmp_path):
    """A case with as many rows as a GPU's tuner has candidates (~40) keeps the notebook's
    height, with labels of at least 7 points."""
    rows = [{"case": "c", "impl": f"candidate number {i}", "ms": 1.0 + i} for i in range(45)]
    check_legible(plot.benchmark_bars({"rows": rows}, case="c"), tmp_path / "many.png",
                  categorical_y=True)


def test_bad_input(sample, tmp_path):
    fs = sample["rec"].fs
    with pytest.raises(ValueError, match="x: expected \\[channels, samples\\]"):
        plot.traces(np.zeros(10), fs)
    with pytest.raises(ValueError, match="channels: expected indices"):
        plot.traces(sample["x"], fs, channels=[99])
    with pytest.raises(ValueError, match="fs: expected a positive"):
        plot.traces(sample["x"], 0.0)
    with pytest.raises(ValueError, match="start_s, duration_s"):
        plot.traces(sample["x"], fs, start_s=100.0)
    with pytest.raises(ValueError, match="raw, processed: expected the same shape"):
        plot.before_after(sample["x"], sample["y"][:3], fs)
    with pytest.raises(ValueError, match="axes: expected 2"):
        plot.before_after(sample["x"], sample["y"], fs, axes=[plt.gca()])
    with pytest.raises(ValueError, match="m: expected a non-empty 2-D"):
        plot.matrix(np.zeros(3))
    with pytest.raises(ValueError, match="geometry: expected \\[channels, 2\\]"):
        plot.probe(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="spikes: no spike"):
        plot.waveforms(sample["y"], sample["spikes"][:0], sample["rec"].geometry, fs)
    with pytest.raises(ValueError, match="channel: no spike on channel"):
        missing = sorted(set(range(32)) - set(sample["spikes"]["channel_index"].tolist()))
        plot.waveforms(sample["y"], sample["spikes"], sample["rec"].geometry, fs,
                       channel=missing[0] if missing else 10**6)
    with pytest.raises(ValueError, match="dims: expected components"):
        plot.features(np.zeros((5, 2)), dims=(0, 2))
    with pytest.raises(ValueError, match="labels: expected one label per spike"):
        plot.features(np.zeros((5, 2)), labels=np.zeros(4))
    with pytest.raises(ValueError, match="case: no row of case 'nope'"):
        plot.benchmark_bars({"rows": [{"case": "a", "impl": "x", "ms": 1.0}]}, case="nope")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a benchmark result"):
        plot.load_results(bad)
    plt.close("all")


@pytest.mark.gpu
def test_cupy_arrays_are_drawn_from_the_host(sample, tmp_path):
    cp = pytest.importorskip("cupy")
    if not dspk.gpu_available():
        pytest.skip("needs a CUDA GPU with CuPy")
    fig = plot.before_after(cp.asarray(sample["x"]), cp.asarray(sample["y"]),
                            sample["rec"].fs)
    np.testing.assert_allclose(fig.axes[1].lines[0].get_ydata()[:5] + 0,
                               plot.traces(sample["y"], sample["rec"].fs).axes[0]
                               .lines[0].get_ydata()[:5], rtol=1e-5)
    check_legible(fig, tmp_path / "gpu.png")
