"""What a pip-installed dspk holds: a wheel built from the tree ships every CUDA source and
every module, and its metadata names the command and the dependencies."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy of the tracked sources, so the test neither reads nor leaves build/
    # and *.egg-info in the working tree.
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "pyproject.toml", "README.md", "dspk"], cwd=ROOT,
                           capture_output=True, text=True)
    names = files.stdout.split() if files.returncode == 0 else []
    if not names:   # not a git checkout (an sdist): every file of the package
        names = ["pyproject.toml", "README.md"] + [
            str(p.relative_to(ROOT)) for p in (ROOT / "dspk").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts]
    for name in names:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "--quiet", "-w", str(out), str(src)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    (whl,) = out.glob("dspk-*.whl")
    return whl


def test_the_wheel_ships_every_cuda_source(wheel):
    in_tree = {p.relative_to(ROOT).as_posix() for p in (ROOT / "dspk").rglob("*.cu")}
    assert in_tree, "no CUDA sources found in the tree"
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if n.endswith(".cu")}
    assert shipped == in_tree


def test_the_wheel_ships_every_module_and_the_command(wheel):
    in_tree = {p.relative_to(ROOT).as_posix() for p in (ROOT / "dspk").rglob("*.py")}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        metadata, entry_points = z.read(meta).decode(), z.read(entry).decode()
    assert in_tree <= names, sorted(in_tree - names)
    assert "dspk = dspk.cli:main" in entry_points
    assert "Requires-Dist: threadpoolctl" in metadata


def test_every_kernel_source_lives_in_the_one_kernels_package():
    from dspk.kernels import CUDA_SOURCES, KERNEL_DIR

    everywhere = sorted(p for p in (ROOT / "dspk").rglob("*.cu"))
    assert everywhere == sorted(CUDA_SOURCES)
    assert all(p.parent == KERNEL_DIR for p in everywhere)


def test_python_dash_m_dspk_runs_the_command():
    res = subprocess.run([sys.executable, "-m", "dspk", "--version"], capture_output=True,
                         text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    from dspk import __version__

    assert res.stdout.strip() == f"dspk {__version__}"
