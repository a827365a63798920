"""The tree passes ruff with the project's settings (pyproject.toml's [tool.ruff]: pycodestyle
errors and warnings, pyflakes, 100 columns): the package, its tests, scripts and benchmarks."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_tree_passes_ruff():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                          "--output-format", "concise", "dspk", "tests", "scripts", "benchmarks"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
