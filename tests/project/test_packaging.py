"""What a pip-installed dspk holds: a wheel built from the tree ships every CUDA source, its
prebuilt fatbin and table (rebuilt by the build hook when stale and nvcc is there, else left
out) and every module, and its metadata names the command and the dependencies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def copy_tree(dst: Path) -> Path:
    """The files a wheel is built from, copied to ``dst``: the tracked ones (so the test
    neither reads nor leaves build/ and *.egg-info in the working tree), or, out of a git
    checkout (an sdist), every file of the package."""
    files = subprocess.run(["git", "ls-files", "pyproject.toml", "setup.py", "README.md", "dspk"],
                           cwd=ROOT, capture_output=True, text=True)
    names = files.stdout.split() if files.returncode == 0 else []
    if not names:
        names = ["pyproject.toml", "setup.py", "README.md"] + [
            str(p.relative_to(ROOT)) for p in (ROOT / "dspk").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts]
    for name in names:
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dst / name)
    return dst


def build_wheel(src: Path, out: Path, **env: str) -> tuple[Path, str]:
    """The wheel built from ``src`` into ``out`` (with ``env`` added to the environment),
    and the build's output."""
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "-v", "-w", str(out), str(src)], capture_output=True, text=True,
                         env={**os.environ, **env})
    assert res.returncode == 0, res.stderr[-4000:]
    (whl,) = out.glob("dspk-*.whl")
    return whl, res.stdout + res.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = copy_tree(tmp_path_factory.mktemp("src"))
    return build_wheel(src, tmp_path_factory.mktemp("wheel"))[0]


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


def test_the_wheel_ships_the_prebuilt_kernels_of_every_source(wheel):
    """Each source's fatbin and table, as committed (they match the sources: CI checks
    that in tests/kernels/test_kernel_instances.py)."""
    from dspk.kernels import CUDA_SOURCES, fatbins

    prebuilt = "dspk/kernels/prebuilt/"
    with zipfile.ZipFile(wheel) as z:
        shipped = {n.removeprefix(prebuilt): z.read(n) for n in z.namelist()
                   if n.startswith(prebuilt)}
    want = {f"{p.stem}.{ext}" for p in CUDA_SOURCES for ext in ("fatbin", "json")}
    assert set(shipped) == want
    for name, data in shipped.items():
        assert data == (fatbins.PREBUILT_DIR / name).read_bytes(), name


NVCC = shutil.which("nvcc")


@pytest.mark.parametrize("nvcc", [True, False], ids=["nvcc", "DSPK_BUILD_KERNELS=0"])
def test_a_stale_fatbin_is_rebuilt_or_left_out_of_the_wheel(tmp_path, nvcc):
    """gather.cu changed after its fatbin was built: with nvcc the wheel's build hook
    (setup.py) builds it again, into the wheel; without, the wheel leaves it out and says
    so (NVRTC compiles those kernels at their first use)."""
    if nvcc and NVCC is None:
        pytest.skip("nvcc not installed")
    from dspk.kernels import fatbins

    src = copy_tree(tmp_path / "src")
    gather = src / "dspk" / "kernels" / "gather.cu"
    gather.write_text(gather.read_text() + "// changed after the build\n")
    whl, log = build_wheel(src, tmp_path / "wheel",
                           **({} if nvcc else {"DSPK_BUILD_KERNELS": "0"}))
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        table = json.loads(z.read("dspk/kernels/prebuilt/gather.json")) if nvcc else None
    assert "dspk/kernels/prebuilt/ncc.fatbin" in names          # the others as committed
    if nvcc:
        assert "building the prebuilt kernels of gather.cu" in log
        assert table["source_sha256"] == fatbins.text_hash(fatbins.paste_headers(
            gather.read_text()))
        assert "dspk/kernels/prebuilt/gather.fatbin" in names
    else:
        assert "no prebuilt kernels of gather.cu in the wheel" in log
        assert not {n for n in names if "prebuilt/gather." in n}


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
