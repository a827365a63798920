"""Every CUDA source compiles with nvcc for Hopper (sm_90) and Ampere consumer cards (sm_86)
with every template instance dspk declares for it on those architectures' reference cards
(`dspk.kernels.build`), warnings as errors, so a syntax error or an instance that does not
compile surfaces in CI without a GPU. The sources are compiled as NVRTC gets them (headers
pasted, away from the kernel folder), the way the prebuilt fatbins are built; and what the
compile gives (each instance's mangled name, each architecture's cubin) is what the
committed table of the source says (the cubins bit for bit when CI's nvcc is the one that
built the fatbins; the code: warnings as errors change only the note that records the
options): the prebuilt fatbins are rebuilt for two of their architectures (sm_86 only for the small
sources, and for a large one whose fatbin is stale: see `LARGE_SOURCE_INSTANCES`)."""

import shutil
import subprocess
from pathlib import Path

import pytest

from dspk.kernels import CUDA_SOURCES, KERNEL_DIR, build, elf, fatbins, source

pytestmark = [pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
BENCH_SOURCES = tuple(sorted((ROOT / "benchmarks").glob("*.cu")))
NVCC = shutil.which("nvcc")
#: the architectures compiled here (two cores: one each)
ARCHS = ("sm_86", "sm_90")
WERROR = ("-Werror", "all-warnings")
#: a source with more instances than this compiles for sm_86 only when its prebuilt fatbin is
#: stale (the source changed since `python -m dspk.kernels.build` compiled it for all six
#: architectures): wx_tile.cu, skinny.cu and ncc.cu (47-128 instances) took 37-51 s each for
#: two architectures, a third of the CPU time of the whole suite on CI's two cores
LARGE_SOURCE_INSTANCES = 40


def archs_for(name: str, by_arch: dict) -> tuple[str, ...]:
    """sm_90 always; sm_86 too for a small source, or one whose prebuilt fatbin is stale."""
    table = fatbins.read_table(name)
    text = source(name) if table else ""
    large = max(len(v) for v in by_arch.values()) > LARGE_SOURCE_INSTANCES
    if large and fatbins.stale(table, text) is None:
        return ("sm_90",)
    return ARCHS


def test_sources_exist_and_every_one_is_declared():
    names = {p.name for p in CUDA_SOURCES}
    assert {"gather.cu", "skinny.cu", "intpack.cu", "ncc.cu"} <= names
    assert set(build.declare_all()) == names, "a source of dspk/kernels without its instances"


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", [p.name for p in CUDA_SOURCES])
def test_compiles_with_nvcc_with_every_instance_as_its_table_says(name, tmp_path):
    build.declare_all()
    by_arch = build.instances_by_arch(name, ARCHS, ptx=None)
    assert all(by_arch.values()), f"{name}: no instances declared"
    table = fatbins.read_table(name)
    assert table is not None, f"{name}: no prebuilt table (python -m dspk.kernels.build)"
    for arch in ARCHS:
        assert set(table["archs"][arch]) == set(by_arch[arch]), arch
    archs = archs_for(name, by_arch)
    by_arch = {a: by_arch[a] for a in archs}
    names, _, cubins, _ = build.compile_file(name, tmp_path, by_arch, NVCC, ptx=None,
                                             threads=len(archs), extra=WERROR)
    assert {e: table["names"].get(e) for e in names} == names
    if table["nvcc"] == ".".join(map(str, build.nvcc_version(NVCC))):
        for arch in archs:
            assert elf.code_hash(cubins[arch].read_bytes()) == \
                table["images"][arch]["code_sha256"], f"{name}: the {arch} code differs"


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("path", BENCH_SOURCES, ids=lambda p: p.name)
def test_benchmark_sources_compile_with_nvcc(path, tmp_path):
    runs = [subprocess.Popen([NVCC, *fatbins.NVCC_OPTIONS, f"-arch={arch}", *WERROR, "-c",
                              str(path), "-o", str(tmp_path / f"{arch}.o")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for arch in ARCHS]
    errors = [run.communicate()[1][-4000:] for run in runs if run.wait()]
    assert not errors, errors


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_a_small_source_builds_to_the_committed_fatbin(tmp_path):
    """The whole build (every architecture, the PTX, the table) of the smallest source gives
    the committed table: the same names and instances, and with the same nvcc the same
    cubins and fatbin bit for bit."""
    build.declare_all()
    got = build.build_file("gather.cu", tmp_path, NVCC, threads=2)
    table = fatbins.read_table("gather.cu")
    for key in ("source_sha256", "nvcc_options", "archs", "names", "devices"):
        assert got[key] == table[key], key
    if got["nvcc"] == table["nvcc"]:
        assert got["images"] == table["images"]
        assert got["fatbin_sha256"] == table["fatbin_sha256"]
    assert not build.problems("gather.cu", tmp_path)


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
