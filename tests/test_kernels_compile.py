"""Every CUDA source compiles with nvcc for Hopper (sm_90) and Ampere consumer cards (sm_86),
with its explicit instantiations, so a syntax error surfaces in CI without a GPU."""

import shutil
import subprocess

import pytest

from pathlib import Path

from dspk.kernels import CUDA_SOURCES

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (tuple(CUDA_SOURCES) + tuple(sorted((ROOT / "dspk" / "kernels").glob("*.cu")))
           + tuple(sorted((ROOT / "benchmarks").glob("*.cu"))))

NVCC = shutil.which("nvcc")


def test_sources_exist():
    names = {p.name for p in SOURCES}
    assert {"gather.cu", "skinny.cu", "intpack.cu", "ncc.cu"} <= names


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_90", "sm_86"])
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_compiles_with_nvcc(source, arch, tmp_path):
    cmd = [NVCC, "-std=c++17", "-DDSPK_COMPILE_CHECK", f"-arch={arch}", "-Werror",
           "all-warnings", "-c", str(source), "-o", str(tmp_path / "k.o")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
