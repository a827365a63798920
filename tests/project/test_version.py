"""The version the package reports is the one its metadata and the changelog name."""

import re
from importlib import metadata
from pathlib import Path

import dspk
from dspk.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_one_number_everywhere(capsys):
    assert re.fullmatch(r"\d+\.\d+\.\d+", dspk.__version__)
    assert metadata.version("dspk") == dspk.__version__
    top = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M).group(1)
    assert top == dspk.__version__
    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    assert capsys.readouterr().out.strip() == f"dspk {dspk.__version__}"
