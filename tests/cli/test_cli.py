import json

import numpy as np
import pytest

import dspk
from dspk import cli
from dspk.linalg.tuner import cache_path


def test_info(capsys):
    assert cli.main(["info", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "backend: cpu" in out and "tuner: DSPK_TUNE=" in out


def test_bad_backend_is_a_clear_error(capsys):
    assert cli.main(["info", "--backend", "tpu"]) == 2
    assert "backend must be one of" in capsys.readouterr().err


def test_tune_cache_show_and_clear(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
    assert cli.main(["tune-cache", "show"]) == 0
    assert "no tuned choices" in capsys.readouterr().out
    cache_path().write_text(json.dumps({"format": "dspk-tuner", "schema": 1, "entries": {
        "k": {"ranking": ["numpy"], "timings_ms": {"numpy": 0.5}}}}))
    assert cli.main(["tune-cache", "show"]) == 0
    assert "-> numpy" in capsys.readouterr().out
    assert cli.main(["tune-cache", "clear"]) == 0
    assert not cache_path().exists()


def test_info_of_a_recording(capsys, tmp_path):
    from pathlib import Path

    import numpy as np

    sample = Path(__file__).resolve().parents[2] / "data" / "sample.nwb"
    assert cli.main(["info", str(sample)]) == 0
    out = capsys.readouterr().out
    assert "ElectricalSeries /acquisition/ElectricalSeries" in out
    assert "32 channels x 240000 samples int16, 30000 Hz" in out and "µV = raw x 0.195" in out
    np.zeros((100, 3), np.int16).tofile(tmp_path / "r.bin")
    assert cli.main(["info", str(tmp_path / "r.bin"), "--n-channels", "3", "--fs", "1000"]) == 0
    assert "3 channels x 100 samples" in capsys.readouterr().out
    assert cli.main(["info", str(tmp_path / "missing.h5")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_preprocess_command(capsys, tmp_path):
    from pathlib import Path

    import h5py

    sample = Path(__file__).resolve().parents[2] / "data" / "sample.nwb"
    out = tmp_path / "o.h5"
    args = ["preprocess", str(sample), str(out), "--whiten", "global", "--reference", "mean",
            "--chunk", "0.5", "--quiet", "--backend", "cpu"]
    assert cli.main(args) == 0
    assert "x real time" in capsys.readouterr().out
    with h5py.File(out, "r") as f:
        assert f["traces"].shape == (240000, 32)
    assert cli.main(args) == 2
    assert "exists; pass overwrite" in capsys.readouterr().err
    assert cli.main(args + ["--overwrite", "--bandpass", "300", "6000", "--int16"]) == 0
    with h5py.File(out, "r") as f:
        assert f["traces"].dtype == "int16"


def test_tune_command_fills_the_cache(capsys, tmp_path, monkeypatch):
    from pathlib import Path

    from dspk.linalg.matmul import tuner

    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
    tuner.forget()     # choices made by earlier tests in this process would not be re-tuned
    sample = Path(__file__).resolve().parents[2] / "data" / "sample.nwb"
    assert cli.main(["tune", str(sample), "--whiten", "global", "--backend", "cpu"]) == 0
    assert "tuned for 32 channels, chunks of 30000 samples" in capsys.readouterr().out
    entries = json.loads(cache_path().read_text())["entries"]
    assert any("fir" in key for key in entries)


def test_preprocess_with_detection(capsys, tmp_path):
    from pathlib import Path

    import h5py

    sample = Path(__file__).resolve().parents[2] / "data" / "sample.nwb"
    out = tmp_path / "d.h5"
    assert cli.main(["preprocess", str(sample), str(out), "--whiten", "global", "--detect",
                     "--quiet", "--backend", "cpu"]) == 0
    with h5py.File(out, "r") as f, h5py.File(sample, "r") as s:
        found = f["spikes"]["sample_index"]
        truth = s["analysis/ground_truth/sample_index"][:]
    hit = [abs(found - t).min() <= 12 for t in truth]
    assert sum(hit) / len(truth) >= 0.9


# -- flat binaries, probes, checks, messages ----------------------------------------------------
def _flat_binary(tmp_path, channels=32, seconds=2.0, seed=2):
    """A ground-truth recording as a flat int16 binary (0.1 µV per bit) and a probe CSV."""
    import numpy as np

    from tests.groundtruth import make, probe

    d = make(seconds=seconds, geometry=probe(channels), seed=seed)
    raw = np.rint(d["x"].T / 0.1).astype(np.int16)           # [samples, channels]
    raw.tofile(tmp_path / "raw.bin")
    with open(tmp_path / "probe.csv", "w") as f:
        f.write("x,y\n" + "".join(f"{x:g},{y:g}\n" for x, y in d["geometry"]))
    return d, raw


def test_flat_binary_with_a_probe_end_to_end(capsys, tmp_path):
    """The README's flat-binary command with --probe, --gain-to-uv and --detect: local
    whitening and detection get the probe's geometry; a uint16 copy behind a header, described
    by --dtype and --header-bytes, gives the same traces (up to float32 rounding of the µV)."""
    import h5py
    import numpy as np

    from tests.groundtruth import match

    d, raw = _flat_binary(tmp_path)
    base = ["--n-channels", "32", "--fs", "30000", "--gain-to-uv", "0.1", "--probe",
            str(tmp_path / "probe.csv"), "--neighbors", "8", "--quiet", "--backend", "cpu"]
    out = tmp_path / "out.h5"
    assert cli.main(["preprocess", str(tmp_path / "raw.bin"), str(out), "--detect"] + base) == 0
    assert "HighPass -> Reference -> Whiten -> Detect" in capsys.readouterr().out
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(f["geometry"][:], d["geometry"])
        found = np.sort(f["spikes"]["sample_index"])
        assert len(f["features"]) == len(found)
    strong = d["times"][d["snr"][d["units"]] >= 8]
    hit, _ = match(found, strong, 12)
    assert hit.mean() >= 0.9, hit.mean()
    with open(tmp_path / "raw-u16.dat", "wb") as f:      # uint16, centred on 32768, 64-byte header
        f.write(b"H" * 64)
        (raw.astype(np.int32) + 32768).astype(np.uint16).tofile(f)
    out16 = tmp_path / "out16.h5"
    assert cli.main(["preprocess", str(tmp_path / "raw-u16.dat"), str(out16), "--dtype",
                     "uint16", "--header-bytes", "64"] + base) == 0
    with h5py.File(out, "r") as f, h5py.File(out16, "r") as g:    # (r + 32768)·0.1 − 3276.8
        np.testing.assert_allclose(g["traces"][:], f["traces"][:], rtol=0, atol=1e-3)
    assert cli.main(["info", str(tmp_path / "raw-u16.dat"), "--n-channels", "32", "--fs",
                     "30000", "--dtype", "uint16", "--header-bytes", "64", "--gain-to-uv", "0.1",
                     "--probe", str(tmp_path / "probe.csv")]) == 0
    info = capsys.readouterr().out
    assert "32 channels x 60000 samples uint16" in info and "µV = raw x 0.1 + -3276.8" in info
    assert "geometry: x 0..32 µm, y 0..300 µm" in info


def test_missing_geometry_is_a_clear_error_before_any_work(capsys, tmp_path, monkeypatch):
    """Local whitening (the default) or --detect on a flat binary without --probe: one line
    saying what to pass, nothing fitted, no output or partial file."""
    from dspk.pipeline import Pipeline

    _flat_binary(tmp_path, channels=8, seconds=0.5)
    monkeypatch.setattr(Pipeline, "fit", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("fitted")))
    args = ["preprocess", str(tmp_path / "raw.bin"), str(tmp_path / "o.h5"), "--n-channels",
            "8", "--fs", "30000", "--quiet", "--backend", "cpu"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("dspk: error: whiten='local' needs the recording's geometry")
    assert "--probe FILE" in err and "--whiten global" in err and err.count("\n") == 1
    assert cli.main(args + ["--whiten", "global", "--detect"]) == 2
    assert "detect=True needs the recording's geometry" in capsys.readouterr().err
    assert cli.main(["tune", str(tmp_path / "raw.bin"), "--n-channels", "8", "--fs", "30000",
                     "--backend", "cpu"]) == 2
    assert "--probe FILE" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probe.csv", "raw.bin"]


def test_output_checks_name_the_path(capsys, tmp_path, monkeypatch):
    from dspk.pipeline import Pipeline

    _flat_binary(tmp_path, channels=8, seconds=0.5)
    monkeypatch.setattr(Pipeline, "fit", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("fitted")))
    raw = tmp_path / "raw.bin"
    base = ["--n-channels", "8", "--fs", "30000", "--whiten", "global", "--quiet"]
    (tmp_path / "link.bin").symlink_to(raw)
    assert cli.main(["preprocess", str(raw), str(tmp_path / "link.bin"), "--overwrite"] +
                    base) == 2
    assert f"{tmp_path / 'link.bin'}: is the input" in capsys.readouterr().err
    missing = tmp_path / "no" / "o.h5"
    assert cli.main(["preprocess", str(raw), str(missing)] + base) == 2
    assert f"{missing}: its folder {missing.parent} does not exist" in capsys.readouterr().err
    (tmp_path / "o.h5").write_bytes(b"x")
    assert cli.main(["preprocess", str(raw), str(tmp_path / "o.h5")] + base) == 2
    assert f"{tmp_path / 'o.h5'}: exists; pass overwrite=True (--overwrite)" in \
        capsys.readouterr().err
    assert (tmp_path / "o.h5").read_bytes() == b"x" and not missing.parent.exists()


def test_zero_sample_inputs_say_samples(capsys, tmp_path):
    import h5py
    import numpy as np

    (tmp_path / "z.bin").write_bytes(b"")
    with h5py.File(tmp_path / "z.h5", "w") as f:
        f.create_dataset("x", shape=(0, 16), dtype=np.int16).attrs["fs"] = 30000.0
    for args in (["info", str(tmp_path / "z.bin"), "--n-channels", "16", "--fs", "30000"],
                 ["info", str(tmp_path / "z.h5")],
                 ["preprocess", str(tmp_path / "z.h5"), str(tmp_path / "o.h5")]):
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert "0 sample(s)" in err and "channels" not in err, err


def test_info_of_an_output_lists_spikes_and_features_in_noise_sds(capsys, tmp_path):
    _flat_binary(tmp_path, channels=16, seconds=1.0)
    out = tmp_path / "o.h5"
    assert cli.main(["preprocess", str(tmp_path / "raw.bin"), str(out), "--n-channels", "16",
                     "--fs", "30000", "--gain-to-uv", "0.1", "--probe",
                     str(tmp_path / "probe.csv"), "--detect", "--int16", "--quiet",
                     "--backend", "cpu"]) == 0
    capsys.readouterr()
    import h5py

    with h5py.File(out, "r") as f:
        n = len(f["spikes"])
    assert n > 0
    assert cli.main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert f"dataset /spikes: {n} rows (sample_index, channel_index, amplitude" in info
    assert f"dataset /features [{n} x 10 x 3] float32" in info
    assert "dataset /traces [30000 x 16] int16" in info
    assert "written by dspk: HighPass -> Reference -> Whiten -> Detect" in info
    assert "noise SDs = raw x 0.01 + 0" in info and "µV" not in info.split("noise SDs")[1][:40]
    assert cli.main(["info", str(tmp_path / "raw.bin"), "--n-channels", "16", "--fs",
                     "30000", "--gain-to-uv", "0.1"]) == 0
    info = capsys.readouterr().out
    assert "µV = raw x 0.1 + 0" in info and "noise SDs" not in info


def test_help_shows_the_description_and_the_defaults(capsys):
    import pytest

    for argv in (["--help"], ["preprocess", "--help"], ["info", "--help"]):
        with pytest.raises(SystemExit) as done:
            cli.main(argv)
        assert done.value.code == 0
        text = capsys.readouterr().out
        if argv == ["--help"]:
            assert cli.__doc__.splitlines()[0] in text and "--probe FILE" in text
        elif argv[0] == "preprocess":
            for default in ("(default: 300.0)", "(default: median)", "(default: local)",
                            "(default: 32)", "(default: 1.0)", "(default: 7.0)",
                            "(default: none)", "(default: 0)"):
                assert default in text, default
            assert "(default: None)" not in text and "(default: False)" not in text
            assert "--probe FILE" in text and "--gain-to-uv" in text and "--dtype" in text


@pytest.mark.slow
def test_python_m_dspk_runs_the_readme_command(tmp_path):
    """`python -m dspk` in a fresh process: the README's flat-binary command (a smaller probe),
    one 'dspk:' per message, and --version."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    _flat_binary(tmp_path, channels=16, seconds=1.0)
    env = dict(os.environ, PYTHONPATH=str(root), DSPK_BACKEND="auto")
    run = subprocess.run([sys.executable, "-m", "dspk", "preprocess", "raw.bin", "out.h5",
                          "--n-channels", "16", "--fs", "30000", "--gain-to-uv", "0.1",
                          "--probe", "probe.csv", "--quiet"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "out.h5: written in" in run.stdout and (tmp_path / "out.h5").exists()
    assert "dspk: dspk:" not in run.stderr and "dspk.pipeline: fitted local whitening" in \
        run.stderr
    again = subprocess.run([sys.executable, "-m", "dspk", "preprocess", "raw.bin", "out.h5",
                            "--n-channels", "16", "--fs", "30000"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.returncode == 2
    assert again.stderr.count("dspk:") == 1 and again.stderr.startswith("dspk: error: ")
    version = subprocess.run([sys.executable, "-m", "dspk", "--version"], env=env,
                             capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("dspk ")


def test_preprocess_many_passes_the_input_options(tmp_path, monkeypatch):
    """--probe (read once, before a cluster starts), --gain-to-uv, --dtype, --header-bytes,
    --n-channels and --fs reach preprocess_many as open_recording keywords."""
    import numpy as np

    import dspk.dask as dd

    d, _ = _flat_binary(tmp_path, channels=8, seconds=0.5)
    seen = {}
    monkeypatch.setattr(dd, "cluster_client", lambda *a, **k: "client")
    monkeypatch.setattr(dd, "close_client", lambda client: None)

    def fake(pattern, outdir, client=None, **options):
        seen.update(options)
        return {str(tmp_path / "raw.bin"): str(tmp_path / "out" / "raw.h5")}

    monkeypatch.setattr(dd, "preprocess_many", fake)
    assert cli.main(["preprocess-many", str(tmp_path / "*.bin"), str(tmp_path / "out"),
                     "--n-channels", "8", "--fs", "30000", "--dtype", "uint16",
                     "--header-bytes", "16", "--gain-to-uv", "0.195", "--probe",
                     str(tmp_path / "probe.csv")]) == 0
    assert (seen["n_channels"], seen["fs"], seen["dtype"], seen["header_bytes"],
            seen["gain_to_uv"]) == (8, 30000.0, "uint16", 16, 0.195)
    np.testing.assert_array_equal(seen["geometry"], d["geometry"])
    seen.clear()
    assert cli.main(["preprocess-many", str(tmp_path / "*.bin"), str(tmp_path / "out")]) == 0
    assert not {"geometry", "dtype", "header_bytes", "gain_to_uv"} & set(seen)


def test_a_negative_gain_needs_its_switch(tmp_path, capsys):
    """A negative --gain-to-uv is refused, naming --allow-negative-gain; with the switch the
    job runs and the output is the input's negative."""
    raw = tmp_path / "raw.bin"
    x = np.arange(4 * 3000, dtype=np.int16).reshape(3000, 4) % 97
    x.tofile(raw)
    args = ["preprocess", str(raw), str(tmp_path / "out.h5"), "--n-channels", "4", "--fs",
            "30000", "--gain-to-uv", "-2", "--highpass", "0", "--reference", "none",
            "--whiten", "none", "--quiet"]
    assert cli.main(args) != 0
    assert "--allow-negative-gain" in capsys.readouterr().err
    assert not (tmp_path / "out.h5").exists()
    assert cli.main(args + ["--allow-negative-gain"]) == 0
    with dspk.open_recording(tmp_path / "out.h5") as out:
        np.testing.assert_allclose(out.read(0, 3000), -2.0 * x.T, atol=1e-5)
