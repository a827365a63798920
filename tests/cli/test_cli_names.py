"""SpikeInterface's names on the command line: ``--freq-min``/``--freq-max`` (its
``highpass_filter(freq_min)`` and ``bandpass_filter(freq_min, freq_max)``) and
``--reference average`` (its ``common_reference(operator="average")``) build the pipeline
dspk's own options build; contradictions are refused naming the options."""

import json

import h5py
import numpy as np
import pytest

from dspk.cli import main

FS = 30000.0


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "in.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("traces", data=np.random.default_rng(0).integers(
            -100, 100, (6000, 4), dtype=np.int16))
        d.attrs["fs"] = FS
        d.attrs["geometry"] = np.c_[np.zeros(4), 20.0 * np.arange(4)]
    return path


def steps(source, tmp_path, *options):
    out = tmp_path / "out.h5"
    assert main(["preprocess", str(source), str(out), "--whiten", "none", "--quiet",
                 "--overwrite", *options]) == 0
    with h5py.File(out, "r") as f:
        return json.loads(f.attrs["pipeline"])


@pytest.mark.parametrize("si_names, dspk_names", [
    (["--freq-min", "250"], ["--highpass", "250"]),
    (["--freq-min", "300", "--freq-max", "6000"], ["--bandpass", "300", "6000"]),
    (["--reference", "average"], ["--reference", "mean"]),
    (["--preset", "kilosort", "--freq-min", "150"], ["--preset", "kilosort",
                                                      "--highpass", "150"]),
])
def test_spikeinterface_names_build_the_same_pipeline(source, tmp_path, si_names, dspk_names):
    assert steps(source, tmp_path, *si_names) == steps(source, tmp_path, *dspk_names)


def test_the_names_are_the_filters(source, tmp_path):
    assert steps(source, tmp_path, "--freq-min", "300", "--freq-max", "6000")[0] == \
        {"step": "BandPass", "cutoff_hz": 300.0, "high_hz": 6000.0}
    assert steps(source, tmp_path, "--reference", "average")[1]["operator"] == "mean"


@pytest.mark.parametrize("options, message", [
    (["--freq-max", "6000"], "--freq-max: dspk filters with a high-pass or a band-pass; give "
                             "--freq-min too"),
    (["--freq-min", "300", "--highpass", "250"], "--freq-min/--freq-max: SpikeInterface's "
                                                 "names for --highpass and --bandpass; give "
                                                 "--highpass or them, not both"),
    (["--freq-min", "300", "--bandpass", "300", "6000"], "give --bandpass or them"),
])
def test_contradictions_are_refused_before_any_work(source, tmp_path, capsys, options,
                                                    message):
    out = tmp_path / "out.h5"
    assert main(["preprocess", str(source), str(out), "--quiet", *options]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_help_names_them(capsys):
    with pytest.raises(SystemExit):
        main(["preprocess", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "SpikeInterface's freq_min: --highpass HZ" in text
    assert "average is mean, as SpikeInterface names it" in text
