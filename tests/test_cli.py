import json

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

    sample = Path(__file__).resolve().parents[1] / "data" / "sample.nwb"
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

    sample = Path(__file__).resolve().parents[1] / "data" / "sample.nwb"
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
    sample = Path(__file__).resolve().parents[1] / "data" / "sample.nwb"
    assert cli.main(["tune", str(sample), "--whiten", "global", "--backend", "cpu"]) == 0
    assert "tuned for 32 channels, chunks of 30000 samples" in capsys.readouterr().out
    entries = json.loads(cache_path().read_text())["entries"]
    assert any("fir" in key for key in entries)


def test_preprocess_with_detection(capsys, tmp_path):
    from pathlib import Path

    import h5py

    sample = Path(__file__).resolve().parents[1] / "data" / "sample.nwb"
    out = tmp_path / "d.h5"
    assert cli.main(["preprocess", str(sample), str(out), "--whiten", "global", "--detect",
                     "--quiet", "--backend", "cpu"]) == 0
    with h5py.File(out, "r") as f, h5py.File(sample, "r") as s:
        found = f["spikes"]["sample_index"]
        truth = s["analysis/ground_truth/sample_index"][:]
    hit = [abs(found - t).min() <= 12 for t in truth]
    assert sum(hit) / len(truth) >= 0.9
