"""Every CUDA source compiles with nvcc for Hopper (sm_90) and Ampere consumer cards (sm_86)
with every template instance dspk declares for it (dspk.kernels.declare_instances, as on an
H100 and on an sm_86 card), so a syntax error or an instance that does not compile surfaces in
CI without a GPU."""

import shutil
import subprocess
from pathlib import Path

import pytest

import dspk  # noqa: F401 (imports the modules that declare the instances)
import dspk.match  # noqa: F401
from dspk.kernels import CUDA_SOURCES, KERNEL_DIR, declared_files, declared_instances, source

pytestmark = [pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
SOURCES = tuple(CUDA_SOURCES) + tuple(sorted((ROOT / "benchmarks").glob("*.cu")))
NVCC = shutil.which("nvcc")
#: device properties the instance lists depend on, for the two architectures compiled
H100 = {"name": "H100 (test)", "major": 9, "minor": 0, "multiProcessorCount": 132,
        "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472,
        "sharedMemPerBlock": 49152, "l2CacheSize": 52428800}
SM86 = {"name": "RTX A6000 (test)", "major": 8, "minor": 6, "multiProcessorCount": 84,
        "sharedMemPerBlockOptin": 101376, "sharedMemPerMultiprocessor": 102400,
        "sharedMemPerBlock": 49152, "l2CacheSize": 6291456}
#: each architecture with the properties of a card of it
ARCHS = {"sm_90": H100, "sm_86": SM86}


def instantiation_unit(path: Path, expressions: list[str]) -> str:
    """A translation unit that includes ``path`` and takes the address of each kernel
    instance, so nvcc instantiates and compiles every one (as NVRTC's name expressions do)."""
    lines = [f'#include "{path}"']
    if expressions:
        lines += ["extern void* const dspk_instances[];",
                  "void* const dspk_instances[] = {",
                  *(f"    (void*)&{e}," for e in expressions), "};"]
    return "\n".join(lines) + "\n"


def _nvcc_command(unit: Path, out: Path, arch: str) -> list[str]:
    return [NVCC, "-std=c++17", f"-arch={arch}", "-Werror", "all-warnings", "-c", str(unit),
            "-o", str(out)]


def _compile_all(units: dict[str, Path], tmp: Path) -> dict[str, str]:
    """Compile each architecture's unit, the architectures at once (two cores); the errors
    of those that failed."""
    runs = {arch: subprocess.Popen(_nvcc_command(unit, tmp / f"{arch}.o", arch),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for arch, unit in units.items()}
    errors = {}
    for arch, run in runs.items():
        _, err = run.communicate()
        if run.returncode:
            errors[arch] = err[-4000:]
    return errors


def test_sources_exist_and_every_one_is_declared():
    names = {p.name for p in CUDA_SOURCES}
    assert {"gather.cu", "skinny.cu", "intpack.cu", "ncc.cu"} <= names
    assert set(declared_files()) == names, "a source of dspk/kernels without its instances"


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_compiles_with_nvcc_with_every_instance(path, tmp_path):
    units = {}
    for arch, props in ARCHS.items():
        instances = declared_instances(path.name, props) if path.parent == KERNEL_DIR else []
        assert path.parent != KERNEL_DIR or instances, f"{path.name}: no instances declared"
        units[arch] = tmp_path / f"{arch}_{path.name}"
        units[arch].write_text(instantiation_unit(path, instances))
    errors = _compile_all(units, tmp_path)
    assert not errors, errors


def test_headers_are_pasted_into_the_text_nvrtc_compiles():
    """NVRTC gets no include path: `source` replaces each include of a header of the kernel
    folder by its text, each header once (so CuPy's compile cache, keyed on the text, also
    sees a changed header); a source with no include is passed as it is."""
    common = (KERNEL_DIR / "common.cuh").read_text()
    launch = (KERNEL_DIR / "launch.cuh").read_text()
    for name in ("skinny.cu", "wx_tile.cu", "spatial.cu", "ncc.cu"):
        raw = (KERNEL_DIR / name).read_text()
        assert '#include "common.cuh"' in raw
        text = source(name)
        assert '#include "common.cuh"' not in text and text.count(common) == 1
    assert '#include "launch.cuh"' not in source("ncc.cu") and launch in source("ncc.cu")
    assert source("gather.cu") == (KERNEL_DIR / "gather.cu").read_text()


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ["skinny.cu", "wx_tile.cu", "spatial.cu", "ncc.cu"])
def test_pasted_text_compiles_away_from_the_kernel_folder(name, tmp_path):
    """The text NVRTC gets, with a few of its instances, compiles with no include path."""
    src = tmp_path / name
    src.write_text(source(name))
    unit = tmp_path / f"some_{name}"
    unit.write_text(instantiation_unit(src, declared_instances(name, H100)[:3]))
    res = subprocess.run(_nvcc_command(unit, tmp_path / "k.o", "sm_90"), capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr[-4000:]
