"""Every CUDA source compiles with nvcc for Hopper (sm_90) and Ampere consumer cards (sm_86),
with its explicit instantiations, so a syntax error surfaces in CI without a GPU."""

import shutil
import subprocess

import pytest

from pathlib import Path

from dspk.kernels import CUDA_SOURCES

pytestmark = [pytest.mark.slow]
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


def test_headers_are_pasted_into_the_text_nvrtc_compiles():
    """NVRTC gets no include path: `_source` replaces each include of a header of the kernel
    folder by its text (so CuPy's compile cache, keyed on the text, also sees a changed
    header); a source with no include is passed as it is."""
    from dspk.kernels import KERNEL_DIR, _source

    header = (KERNEL_DIR / "cp_async.cuh").read_text()
    for name in ("skinny.cu", "spatial.cu"):
        raw = (KERNEL_DIR / name).read_text()
        assert '#include "cp_async.cuh"' in raw
        text = _source(name)
        assert "#include \"cp_async.cuh\"" not in text and header in text
    assert _source("gather.cu") == (KERNEL_DIR / "gather.cu").read_text()


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ["skinny.cu", "spatial.cu"])
def test_pasted_text_compiles_away_from_the_kernel_folder(name, tmp_path):
    from dspk.kernels import _source

    src = tmp_path / name
    src.write_text(_source(name))
    cmd = [NVCC, "-std=c++17", "-DDSPK_COMPILE_CHECK", "-arch=sm_90", "-Werror",
           "all-warnings", "-c", str(src), "-o", str(tmp_path / "k.o")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
