"""Each CUDA source's template instances are declared once and compiled together: every kernel
dspk requests is in its file's list (checked here on the CPU over the shapes each caller
derives its instance from), the first request compiles the whole list in one NVRTC call, and an
instance outside the list still compiles, on its own, with a warning."""

from __future__ import annotations

import ast
import contextlib
import doctest
import hashlib
import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import pytest

import dspk
import dspk.kernels as kernels
from dspk.kernels import build, fatbins
import dspk.match as match
from dspk.detect import _gpu as _detect_gpu
from dspk.caches import forget_shared, shared
from dspk.linalg import candidates_gpu as cg
from dspk.linalg import candidates_int as ci
from dspk.ops import _pca_gpu, _spatial_gpu, _traces_gpu
from dspk.ops import distance

ROOT = Path(__file__).resolve().parents[2]
H100 = {"major": 9, "minor": 0, "multiProcessorCount": 132, "sharedMemPerBlockOptin": 232448,
        "sharedMemPerMultiprocessor": 233472, "sharedMemPerBlock": 49152}
SM86 = {"major": 8, "minor": 6, "multiProcessorCount": 84, "sharedMemPerBlockOptin": 101376,
        "sharedMemPerMultiprocessor": 102400, "sharedMemPerBlock": 49152}
T4 = {"major": 7, "minor": 5, "multiProcessorCount": 40, "sharedMemPerBlockOptin": 65536,
      "sharedMemPerMultiprocessor": 65536, "sharedMemPerBlock": 49152}
DEVICES = {"h100": H100, "sm86": SM86, "t4": T4}
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _declared(filename: str, props: dict) -> set:
    return set(kernels.declared_instances(filename, props))


# -- every request names a declared file and a declared (or helper-built) instance ---------------
def _kernel_calls() -> list[tuple[str, int, ast.Call]]:
    calls = []
    for path in sorted((ROOT / "dspk").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "kernel":
                calls.append((str(path.relative_to(ROOT)), node.lineno, node))
    return calls


def test_every_kernel_request_names_a_declared_file_and_builds_no_name_of_its_own():
    """A request spells its file as a literal that is declared, and its instance either as a
    literal in the list or through a helper (no f-string at the call: the helpers are what
    the instance lists are made of)."""
    calls = _kernel_calls()
    assert len(calls) > 20
    bad = []
    for where, line, call in calls:
        file_arg, expr_arg = call.args[:2]
        if not (isinstance(file_arg, ast.Constant) and
                file_arg.value in kernels.declared_files()):
            bad.append(f"{where}:{line}: file {ast.unparse(file_arg)} is not declared")
        if isinstance(expr_arg, ast.JoinedStr):
            bad.append(f"{where}:{line}: the instance is an f-string at the call")
        elif isinstance(expr_arg, ast.Constant) and \
                expr_arg.value not in _declared(file_arg.value, H100):
            bad.append(f"{where}:{line}: {expr_arg.value} is not in the list")
    assert not bad, bad


def test_the_declarations_cover_every_source():
    assert set(kernels.declared_files()) == {p.name for p in kernels.CUDA_SOURCES}


# -- the callers' derivations over their shapes --------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_wx_tile_instances_cover_every_w_that_fits(device):
    props = DEVICES[device]
    optin = cg._optin(props)
    listed = _declared("wx_tile.cu", props)
    rng = np.random.default_rng(0)
    tiles = [c for c in cg.gpu_candidates() if isinstance(c, cg.WxTile)]
    assert tiles
    checked = 0
    for c in tiles:
        for dt in FLOATS:
            ks = [*range(1, 80), *rng.integers(80, 6000, 300).tolist()]
            for m in range(1, 65):
                for k in ks:
                    if c._fits_shape(m, k, dt, optin) is None:
                        assert c.expression(dt, m, k, optin) in listed, (c.name, m, k, dt)
                        checked += 1
    assert checked > 1000


@pytest.mark.parametrize("device", DEVICES)
def test_the_other_skinny_instances_cover_their_shapes(device):
    props = DEVICES[device]
    listed = _declared("skinny.cu", props)
    for c in cg.gpu_candidates():
        if isinstance(c, cg.WxDirect):
            for m in range(1, 65):
                for dt in FLOATS:
                    if c._fits_shape(m, 1, dt) is None:
                        assert c.expression(dt, cg._pow2_at_least(m, 4)) in listed
        elif isinstance(c, cg.WxVec):
            for m in range(1, 65):
                for dt in FLOATS:
                    if c._fits_shape(m, 1, dt) is None:
                        assert c.expression(dt, c._rows_per_slice(m)) in listed
        elif isinstance(c, cg.GramSmall):
            for dt, acc in c._dtypes():
                for m in range(1, 9):
                    for n in range(1, 9):
                        for sym in (False, m == n):
                            md = cg._pow2_at_least(max(m, n), 1)
                            assert c.expression(dt, acc, md, sym) in listed
        elif isinstance(c, cg.GramTiled):
            for dt, acc in c._dtypes():
                for sym in (False, True):
                    assert c.expression(dt, acc, sym) in listed
                    for s in range(1, 1000):          # any number of K chunks
                        assert cg.splitk_reduce_expression(acc, dt, cg._groups(s), sym) in listed
        elif isinstance(c, cg.CublasSplitK):
            for dt in FLOATS:
                for slots in (c.chunks, c.chunks + 1):
                    assert cg.splitk_reduce_expression(dt, dt, cg._groups(slots), False) in listed
        elif isinstance(c, cg.CublasSymBlocks):
            for dt in FLOATS:
                for s in range(1, 1000):
                    assert cg.symblock_reduce_expression(dt, cg._groups(s)) in listed


def test_integer_instances():
    listed = _declared("intpack.cu", H100)
    assert ci.COMBINE in listed
    for dt in ci.INT_DTYPES:
        assert set(ci._pack_expressions(dt)) <= listed
    grams = [c for c in ci._gpu_kernel_candidates() if isinstance(c, ci.Int16GramFused)]
    assert {c.expression() for c in grams} == _declared("gram16.cu", H100)
    assert not _declared("gram16.cu", T4)          # no int8 mma.sync before 8.0


@pytest.mark.parametrize("device", ["h100", "sm86"])
def test_ncc_instances_cover_every_bank(device, monkeypatch):
    props = DEVICES[device]
    monkeypatch.setattr(match, "device_properties", lambda device_id: props)
    listed = _declared("ncc.cu", props)
    assert set(match.PEAK_KERNELS) <= listed
    for n in range(1, 200, 3):
        for th, tw in ((3, 5), (8, 10), (16, 16), (19, 23), (40, 40)):
            for variant in match.MMA_VARIANTS:
                plan = match._mma_plan(n, th, tw, 0, variant)
                for center in (False, True):
                    assert match._mma_expression(center, plan, False) in listed
                    if variant == match.PEAK_VARIANT:
                        assert match._mma_expression(center, plan, True) in listed
            for center in (False, True):
                tg = match.DP4A_GROUPS[1] if n >= match.DP4A_GROUPS[1] else \
                    match.DP4A_GROUPS[0]
                assert {match._dp4a_expression(center, tg),
                        match._pack_expression(center)} <= listed


def test_ncc_has_no_tensor_core_instances_before_8_0():
    listed = _declared("ncc.cu", T4)
    assert not any(e.startswith("ncc_bank_mma") for e in listed)
    assert any(e.startswith("ncc_bank_dp4a") for e in listed)


def test_ops_and_detect_instances():
    listed = _declared("projection.cu", H100)
    for k in range(1, 120):
        for m in range(1, k + 1):
            for dt in FLOATS:
                if _pca_gpu.fits(k, m, dt.itemsize):
                    per_thread = _pca_gpu._geometry(k, m, dt.itemsize)[1]
                    assert _pca_gpu._expression(dt, per_thread) in listed
    listed = _declared("traces.cu", H100)
    for dt in FLOATS:
        assert _traces_gpu._fir_expression(dt) in listed
        for c in range(1, 32 * _traces_gpu._VPL[-1] + 1):
            vpl = next(v for v in _traces_gpu._VPL if 32 * v >= c)
            assert _traces_gpu._car_expression(dt, vpl) in listed
    assert not any("car_median" in e for e in _declared("traces.cu", T4))
    listed = _declared("spatial.cu", H100)
    assert {_spatial_gpu._expression(dt, v, p) for dt in FLOATS for v in _spatial_gpu.VPL
            for p in (False, True)} == listed
    listed = _declared("detect.cu", H100)
    for dt in FLOATS:
        for s in range(1, _detect_gpu.S_MAX + 1):
            assert _detect_gpu._score_expression(dt, s) in listed
    assert len(_declared("covariance.cu", H100)) == 6
    assert {distance._expression(n, dt) for dt in FLOATS
            for n in ("sqdist_finish", "sqdist_direct")} == _declared("distance.cu", H100)
    assert {kernels._gather_expression(dt) for dt in kernels.CTYPES} == \
        _declared("gather.cu", H100)


# -- one compile per file and device, the fallback ----------------------------------------------
class _FakeModule:
    compiled: list = []

    def __init__(self, code, options, name_expressions, fail=False):
        self.names = list(name_expressions)
        self.fail = fail
        _FakeModule.compiled.append(self.names)

    def compile(self):
        if self.fail:
            raise RuntimeError("nvrtc: an instance does not compile")

    def get_function(self, name):
        assert name in self.names
        return ("kernel", name, id(self))


class _FakeFatbin:
    """A RawModule loaded from a file: its kernels by mangled name."""

    loaded: list = []

    def __init__(self, path, fail_load=False, missing=()):
        self.path = path
        self.fail_load = fail_load
        self.missing = set(missing)

    @property
    def module(self):
        if self.fail_load:
            raise RuntimeError("CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid")
        _FakeFatbin.loaded.append(self.path)
        return self

    def get_function(self, mangled):
        if mangled in self.missing:
            raise RuntimeError("CUDA_ERROR_NOT_FOUND: named symbol not found")
        return ("prebuilt", mangled, id(self))


class _FakeCupy:
    """What dspk.kernels uses of CuPy: the current device, a device context, the driver's
    version, RawModule (from source, or from a file)."""

    def __init__(self, fail_whole: bool = False, driver: int = 13000, fail_load=False,
                 missing=()):
        fake = self

        class _Runtime:
            @staticmethod
            def getDevice():
                return 0

            @staticmethod
            def driverGetVersion():
                return driver

        class _Cuda:
            runtime = _Runtime
            Device = staticmethod(lambda d: contextlib.nullcontext())

        self.cuda = _Cuda

        def raw_module(code=None, options=(), name_expressions=None, path=None):
            if path is not None:
                assert code is None and name_expressions is None
                return _FakeFatbin(path, fail_load, missing)
            many = len(name_expressions) > 1
            return _FakeModule(code, options, name_expressions, fail=fake.fail and many)

        self.RawModule = raw_module
        self.fail = fail_whole


@pytest.fixture
def fake_cupy(monkeypatch):
    """``use(...)``: CuPy replaced by `_FakeCupy(...)` on an H100 (``props``), NVRTC for
    everything unless ``mode`` says otherwise (the tests of the prebuilt path give it their
    own fatbins, `prebuilt_dir`)."""
    def use(fail_whole: bool = False, mode: str = "nvrtc", props: dict = H100, **kw):
        forget_shared()
        _FakeModule.compiled = []
        _FakeFatbin.loaded = []
        monkeypatch.setenv("DSPK_KERNELS", mode)
        monkeypatch.setattr(kernels, "cupy_module", lambda: _FakeCupy(fail_whole, **kw))
        monkeypatch.setattr(kernels, "device_properties", lambda device_id: props)

    yield use
    forget_shared()


def test_the_first_request_compiles_every_instance_of_the_file_once(fake_cupy, caplog):
    fake_cupy()
    listed = sorted(_declared("traces.cu", H100))
    first = kernels.kernel("traces.cu", listed[0])
    again = kernels.kernel("traces.cu", listed[0])
    other = kernels.kernel("traces.cu", listed[-1])
    assert first is again and first[1] == listed[0] and other[1] == listed[-1]
    assert _FakeModule.compiled == [listed]                      # one NVRTC call, all of them
    assert kernels.loaded_from("traces.cu") == "NVRTC (DSPK_KERNELS=nvrtc)"
    with caplog.at_level(logging.WARNING, logger="dspk.kernels"):
        odd = kernels.kernel("traces.cu", "car_median<float, unsigned int, 3>")
    assert odd[1] == "car_median<float, unsigned int, 3>"
    assert _FakeModule.compiled[-1] == ["car_median<float, unsigned int, 3>"]
    assert "not among the instances declared" in caplog.text
    dspk.linalg.Engine().forget()                                 # the tables are cleared
    assert kernels.loaded_from("traces.cu") is None
    kernels.kernel("traces.cu", listed[0])
    assert _FakeModule.compiled[-1] == listed


def test_a_file_that_fails_as_a_whole_compiles_each_instance_on_its_own(fake_cupy, caplog):
    fake_cupy(fail_whole=True)
    listed = sorted(_declared("distance.cu", H100))
    with caplog.at_level(logging.WARNING, logger="dspk.kernels"):
        fn = kernels.kernel("distance.cu", listed[1])
    assert fn[1] == listed[1] and _FakeModule.compiled == [listed, [listed[1]]]
    assert "did not compile with its 4 instances" in caplog.text
    assert "not among" not in caplog.text


def test_an_undeclared_file_compiles_what_is_asked(fake_cupy, tmp_path, caplog):
    fake_cupy(mode="auto")
    src = tmp_path / "mine.cu"
    src.write_text("__global__ void spin() {}\n")
    with caplog.at_level(logging.WARNING, logger="dspk.kernels"):
        kernels.kernel(str(src), "spin")
    assert _FakeModule.compiled == [["spin"]] and not caplog.text and not _FakeFatbin.loaded


def test_precompile_compiles_each_file_once(fake_cupy):
    fake_cupy()
    got = kernels.precompile(["covariance.cu", "gram16.cu"])
    assert got == {"covariance.cu": 6, "gram16.cu": 4}
    assert kernels.precompile(["covariance.cu"]) == {"covariance.cu": 6}
    assert len(_FakeModule.compiled) == 2
    kernels.kernel("covariance.cu", sorted(_declared("covariance.cu", H100))[0])
    assert len(_FakeModule.compiled) == 2                       # nothing compiled again
    assert len(shared(kernels.KERNELS, dict)) == 10             # every instance loaded


# -- the prebuilt fatbins -----------------------------------------------------------------------
def _mangled(expression: str) -> str:
    """A stand-in for a mangled name, distinct per instance."""
    return "_Z" + "".join(c if c.isalnum() else "_" for c in expression)


def write_prebuilt(directory: Path, filename: str, archs: dict, text: str | None = None,
                   cuda=(13, 0)) -> dict:
    """A table (and a fatbin of its size) for ``filename`` in ``directory``: ``archs`` is
    architecture -> instances; ``text`` the source it claims (default: the current one)."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = filename.removesuffix(".cu")
    fatbin = directory / f"{stem}.fatbin"
    fatbin.write_bytes(b"\x50\xed\x55\xba" + bytes(60))
    table = {"version": fatbins.TABLE_VERSION, "file": filename,
             "source_sha256": fatbins.text_hash(kernels.source(filename) if text is None
                                                else text),
             "nvcc_options": list(fatbins.NVCC_OPTIONS), "cuda_version": list(cuda),
             "fatbin": fatbin.name, "fatbin_bytes": fatbin.stat().st_size,
             "archs": {a: sorted(e) for a, e in archs.items()},
             "names": {e: _mangled(e) for exprs in archs.values() for e in exprs}}
    (directory / f"{stem}.json").write_text(json.dumps(table))
    return table


@pytest.fixture
def prebuilt_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "PREBUILT_DIR", tmp_path / "prebuilt")
    return tmp_path / "prebuilt"


def test_a_usable_fatbin_gives_its_kernels_without_a_compile(fake_cupy, prebuilt_dir):
    listed = sorted(_declared("traces.cu", H100))
    write_prebuilt(prebuilt_dir, "traces.cu", {"sm_80": listed[:2], "sm_90": listed})
    fake_cupy(mode="auto")
    fn = kernels.kernel("traces.cu", listed[3])
    assert fn[:2] == ("prebuilt", _mangled(listed[3])) and not _FakeModule.compiled
    assert _FakeFatbin.loaded == [str(prebuilt_dir / "traces.fatbin")]
    assert kernels.precompile(["traces.cu"]) == {"traces.cu": len(listed)}
    assert not _FakeModule.compiled and len(_FakeFatbin.loaded) == 1
    assert kernels.loaded_from("traces.cu") == "prebuilt SASS sm_90 (traces.fatbin)"


def test_instances_the_image_lacks_are_compiled_together_by_nvrtc(fake_cupy, prebuilt_dir,
                                                                    caplog):
    listed = sorted(_declared("traces.cu", H100))
    write_prebuilt(prebuilt_dir, "traces.cu", {"sm_90": listed[:5]})
    fake_cupy(mode="auto")
    assert kernels.kernel("traces.cu", listed[1])[0] == "prebuilt"
    with caplog.at_level(logging.INFO, logger="dspk.kernels"):
        fn = kernels.kernel("traces.cu", listed[7])
        kernels.kernel("traces.cu", listed[9])
    assert fn[:2] == ("kernel", listed[7])
    assert _FakeModule.compiled == [listed[5:]]                  # the rest, in one call
    assert f"NVRTC compiled {len(listed) - 5} instances of traces.cu" in caplog.text
    assert kernels.loaded_from("traces.cu") == \
        f"prebuilt SASS sm_90 (traces.fatbin); NVRTC for {len(listed) - 5} instances"


@pytest.mark.parametrize("case, why", [
    ("stale", "the sources changed since the fatbin was built"),
    ("options", "built with other options"),
    ("old driver", "driver 12.8 is older than the CUDA 13.0"),
    ("no image", "no image for compute capability 9.0"),
    ("no table", "no prebuilt fatbin"),
    ("no fatbin", "traces.fatbin missing"),
])
def test_an_unusable_fatbin_leaves_every_instance_to_nvrtc(fake_cupy, prebuilt_dir, monkeypatch,
                                                           case, why):
    listed = sorted(_declared("traces.cu", H100))
    if case != "no table":
        table = write_prebuilt(prebuilt_dir, "traces.cu",
                               {"sm_100" if case == "no image" else "sm_90": listed},
                               text="an older text" if case == "stale" else None)
    if case == "options":
        table["nvcc_options"] = ["-std=c++17"]
        (prebuilt_dir / "traces.json").write_text(json.dumps(table))
    if case == "no fatbin":
        (prebuilt_dir / "traces.fatbin").unlink()
    fake_cupy(mode="auto", driver=12080 if case == "old driver" else 13000)
    assert kernels.kernel("traces.cu", listed[0])[:2] == ("kernel", listed[0])
    assert _FakeModule.compiled == [listed] and not _FakeFatbin.loaded
    assert kernels.loaded_from("traces.cu").startswith("NVRTC (")
    assert why in kernels.loaded_from("traces.cu")
    forget_shared()
    monkeypatch.setenv("DSPK_KERNELS", "prebuilt")
    with pytest.raises(RuntimeError, match="DSPK_KERNELS=prebuilt, but NVRTC"):
        kernels.kernel("traces.cu", listed[0])


@pytest.mark.parametrize("damage", ["{not json", '{"version": 1}', "[]"])
def test_a_damaged_table_leaves_every_instance_to_nvrtc(fake_cupy, prebuilt_dir, caplog,
                                                       damage):
    listed = sorted(_declared("traces.cu", H100))
    write_prebuilt(prebuilt_dir, "traces.cu", {"sm_90": listed})
    (prebuilt_dir / "traces.json").write_text(damage)
    fake_cupy(mode="auto")
    with caplog.at_level(logging.WARNING, logger="dspk.kernels"):
        assert kernels.kernel("traces.cu", listed[0])[:2] == ("kernel", listed[0])
    assert _FakeModule.compiled == [listed] and not _FakeFatbin.loaded
    assert "unreadable" in caplog.text
    assert kernels.loaded_from("traces.cu").startswith("NVRTC (unreadable prebuilt table: ")


def test_a_fatbin_the_driver_refuses_falls_back_to_nvrtc(fake_cupy, prebuilt_dir, caplog):
    listed = sorted(_declared("traces.cu", H100))
    write_prebuilt(prebuilt_dir, "traces.cu", {"sm_90": listed})
    fake_cupy(mode="auto", fail_load=True)
    with caplog.at_level(logging.WARNING, logger="dspk.kernels"):
        fn = kernels.kernel("traces.cu", listed[2])
    assert fn[:2] == ("kernel", listed[2]) and _FakeModule.compiled == [listed]
    assert "did not load" in caplog.text and "did not load" in kernels.loaded_from("traces.cu")


def test_an_instance_missing_from_the_image_is_compiled_on_its_own(fake_cupy, prebuilt_dir,
                                                                     caplog):
    listed = sorted(_declared("traces.cu", H100))
    write_prebuilt(prebuilt_dir, "traces.cu", {"sm_90": listed})
    fake_cupy(mode="auto", missing={_mangled(listed[4])})
    with caplog.at_level(logging.WARNING, logger="dspk.kernels"):
        fn = kernels.kernel("traces.cu", listed[4])
    assert fn[:2] == ("kernel", listed[4]) and _FakeModule.compiled == [[listed[4]]]
    assert "not loaded from prebuilt SASS sm_90" in caplog.text
    assert "not among" not in caplog.text
    assert kernels.kernel("traces.cu", listed[5])[0] == "prebuilt"


def test_dspk_kernels_prebuilt_refuses_what_the_image_lacks(fake_cupy, prebuilt_dir):
    listed = sorted(_declared("traces.cu", H100))
    write_prebuilt(prebuilt_dir, "traces.cu", {"sm_90": listed[:3]})
    fake_cupy(mode="prebuilt")
    assert kernels.kernel("traces.cu", listed[0])[0] == "prebuilt"
    with pytest.raises(RuntimeError, match="not in its prebuilt image"):
        kernels.kernel("traces.cu", listed[3])
    assert not _FakeModule.compiled


def test_dspk_kernels_nvrtc_ignores_a_usable_fatbin(fake_cupy, prebuilt_dir):
    listed = sorted(_declared("traces.cu", H100))
    write_prebuilt(prebuilt_dir, "traces.cu", {"sm_90": listed})
    fake_cupy(mode="nvrtc")
    assert kernels.kernel("traces.cu", listed[0])[0] == "kernel"
    assert not _FakeFatbin.loaded


def test_dspk_kernels_must_name_an_origin(fake_cupy, monkeypatch):
    fake_cupy(mode="nvrtc")
    monkeypatch.setenv("DSPK_KERNELS", "cubin")
    with pytest.raises(ValueError, match="DSPK_KERNELS='cubin': expected one of auto, "
                                         "prebuilt, nvrtc"):
        kernels.kernel("traces.cu", sorted(_declared("traces.cu", H100))[0])
    monkeypatch.setenv("DSPK_KERNELS", "")
    assert kernels.kernel_origin_mode() == "auto"


@pytest.mark.parametrize("cc, driver, arch", [
    ((8, 0), 13000, "sm_80"), ((8, 6), 13000, "sm_86"), ((8, 7), 13000, "sm_86"),
    ((8, 9), 13000, "sm_89"), ((9, 0), 13000, "sm_90"), ((10, 0), 13000, "sm_100"),
    ((10, 3), 13000, "sm_100"), ((12, 0), 13000, "sm_120"), ((12, 1), 13000, "sm_120"),
    ((13, 0), 13000, "compute_120"), ((11, 0), 13000, None), ((7, 5), 13000, None),
    ((9, 0), 12090, None), ((13, 0), 12090, None)])
def test_the_image_the_driver_runs(cc, driver, arch):
    table = {"archs": {a: [] for a in (*fatbins.SASS_ARCHS, fatbins.PTX_ARCH)},
             "cuda_version": [13, 0]}
    assert fatbins.image_for(table, cc, driver)[0] == arch
    table["cuda_version"] = [13, 2]                               # PTX needs driver 13.2
    if arch == "compute_120":
        assert fatbins.image_for(table, cc, 13000) == \
            (None, "PTX needs driver 13.2 or later (this one: 13.0)")


def test_the_examples_of_fatbins_run():
    """(tests/project/test_doctests.py lists the modules of the public API; this one is the
    loader's)"""
    result = doctest.testmod(fatbins)
    assert result.failed == 0 and result.attempted >= 4


# -- the committed fatbins match the sources (CI: rebuilt with python -m dspk.kernels.build) ------
REBUILD = "rebuild with `python -m dspk.kernels.build --stale` (nvcc 12.8 or later) and commit"


@pytest.mark.parametrize("filename", [p.name for p in kernels.CUDA_SOURCES])
def test_the_committed_fatbin_is_up_to_date(filename):
    """Built from the current text with the current options, every instance declared on
    each architecture's reference cards in its table with a name, the fatbin the one the
    table was built with."""
    assert not build.problems(filename), f"{filename}: {build.problems(filename)}; {REBUILD}"
    table = fatbins.read_table(filename)
    fatbin = fatbins.PREBUILT_DIR / table["fatbin"]
    assert hashlib.sha256(fatbin.read_bytes()).hexdigest() == table["fatbin_sha256"]
    assert set(table["archs"]) == {*fatbins.SASS_ARCHS, fatbins.PTX_ARCH}
    assert all(set(v) <= set(table["names"]) for v in table["archs"].values())
    assert len(set(table["names"].values())) == len(table["names"])   # one kernel each


def test_nothing_else_in_the_prebuilt_folder():
    shipped = {p.name for p in fatbins.PREBUILT_DIR.iterdir()}
    stems = {p.name.removesuffix(".cu") for p in kernels.CUDA_SOURCES}
    assert shipped == {f"{s}.{ext}" for s in stems for ext in ("fatbin", "json")}


def test_problems_are_found():
    """`build.problems` on tables that are wrong in each way it names."""
    import shutil

    filename = "traces.cu"
    good = fatbins.read_table(filename)
    cases = {
        "lacks": lambda t: t["archs"]["sm_90"].pop(),
        "no sm_89 image": lambda t: t["archs"].pop("sm_89"),
        "no mangled name": lambda t: t["names"].pop(t["archs"]["sm_80"][0]),
        "sources changed": lambda t: t.update(source_sha256="0" * 64),
        "format": lambda t: t.update(version=0),
    }
    for why, spoil in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            table = json.loads(json.dumps(good))
            spoil(table)
            (Path(tmp) / "traces.json").write_text(json.dumps(table))
            shutil.copy(fatbins.PREBUILT_DIR / good["fatbin"], tmp)
            found = build.problems(filename, Path(tmp))
            assert found and why in "; ".join(found), (why, found)


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="no such source"):
        kernels.declare_instances("nope.cu", lambda props: [])
    with pytest.raises(ValueError, match="declared twice"):
        kernels.declare_instances("skinny.cu", lambda props: [])


# -- dspk tune --compile ------------------------------------------------------------------------
def test_tune_compile_prepares_every_source_and_says_where_each_came_from(fake_cupy,
                                                                         prebuilt_dir,
                                                                         monkeypatch, capsys):
    from dspk import cli

    listed = sorted(_declared("traces.cu", H100))
    write_prebuilt(prebuilt_dir, "traces.cu", {"sm_90": listed})
    fake_cupy(mode="auto")
    monkeypatch.setattr(cli, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(cli, "cupy_module", kernels.cupy_module)
    monkeypatch.setattr(cli, "device_name", lambda device_id: "H100 (fake)")
    warmed = []

    def warm(report):                      # (the real warm-up runs on a GPU: tests/test_warmup)
        warmed.append(True)
        report("PCA: 0.01 s")
        return {"PCA": 0.01}

    monkeypatch.setattr(cli, "warm_gpu_calls", warm)
    assert cli.main(["tune", "--compile"]) == 0
    out = capsys.readouterr().out
    assert warmed and "  PCA: 0.01 s" in out and "GPU calls warmed up in" in out
    assert "kernels for H100 (fake) (DSPK_KERNELS=auto):" in out
    assert f"traces.cu: {len(listed)} instances in " in out
    assert "prebuilt SASS sm_90 (traces.fatbin)" in out
    assert "ncc.cu: 47 instances" in out and "NVRTC (no prebuilt fatbin)" in out
    assert "all kernels ready in" in out
    files = set(kernels.declared_files())
    assert len(_FakeModule.compiled) == len(files) - 1              # one NVRTC call each
    assert sum(map(len, _FakeModule.compiled)) == \
        sum(len(_declared(f, H100)) for f in files - {"traces.cu"})


def test_tune_compile_needs_a_gpu_and_tune_needs_something_to_do(monkeypatch, capsys):
    from dspk import cli

    monkeypatch.setattr(cli, "gpu_unavailable_reason", lambda: "no CUDA device found")
    assert cli.main(["tune", "--compile"]) == 2
    assert "--compile prepares the GPU's kernels, but there is no GPU: no CUDA device found" \
        in capsys.readouterr().err
    assert cli.main(["tune"]) == 2
    assert "give IN (a recording to tune for), or --compile" in capsys.readouterr().err


def test_tune_compile_fails_when_a_warm_up_call_fails(fake_cupy, prebuilt_dir, monkeypatch,
                                                     capsys):
    from dspk import cli

    fake_cupy(mode="auto")
    monkeypatch.setattr(cli, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(cli, "cupy_module", kernels.cupy_module)
    monkeypatch.setattr(cli, "device_name", lambda device_id: "H100 (fake)")

    def warm(report):
        report("ncc: failed: RuntimeError: boom")
        return {"PCA": 0.01, "ncc": "RuntimeError: boom"}

    monkeypatch.setattr(cli, "warm_gpu_calls", warm)
    assert cli.main(["tune", "--compile"]) == 2
    captured = capsys.readouterr()
    assert "ncc: failed: RuntimeError: boom" in captured.out
    assert "--compile: the warm-up of ncc failed" in captured.err
