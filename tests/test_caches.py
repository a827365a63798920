"""Every cache dspk keeps is an engine's or the process's registered store (`dspk.caches`):
`Engine.forget` empties all of them, and what is computed after it has the same bits."""

from __future__ import annotations

import ast
import doctest
from pathlib import Path

import numpy as np
import pytest

import dspk
from dspk import caches
from dspk.linalg import Engine
from dspk.match import ncc, ncc_peaks

ROOT = Path(__file__).resolve().parents[1]


def _workload(xp, rng_seed: int = 0) -> dict:
    """Every cached path of the operations: products (float, integer, X·Xᵀ, blocked and
    batched), the one-shot ops with prepared operands (spatial filters, template banks), the
    tuned choices of the ops (FIR, median reference, NCC), the BLAS thread pool."""
    rng = np.random.default_rng(rng_seed)
    x = xp.asarray(rng.standard_normal((64, 9000)).astype(np.float32))
    w = xp.asarray(rng.standard_normal((64, 64)).astype(np.float32))
    geom = np.c_[np.tile([0.0, 32.0], 32), 20.0 * np.arange(64)]
    local = dspk.whitening_matrix(np.cov(rng.standard_normal((64, 3000))), geometry_um=geom,
                                  n_neighbors=8).astype(np.float32)
    local = xp.asarray(local)
    xi = xp.asarray(rng.integers(-3000, 3000, (24, 5001), dtype=np.int16))
    img = xp.asarray(rng.integers(0, 256, (60, 70), dtype=np.uint8))
    tpl = img[None, 10:18, 20:30].copy()
    out = {
        "gram": dspk.matmul(x, x.T),
        "wx": dspk.matmul(w, x),
        "batched": dspk.matmul(x.reshape(4, 16, 9000), x.reshape(4, 16, 9000).transpose(0, 2, 1)),
        "int": dspk.int_matmul(xi, xi.T),
        "int_gram": dspk.linalg.int_gram(xi)[0],
        "cov": dspk.covariance(x),
        "int_cov": dspk.covariance(xi),
        "pca": dspk.PCA(3).fit(x[:, :200].T).transform(x[:, :200].T),
        "sqdist": dspk.pairwise_sqdist(x[:20, :16], x[20:50, :16]),
        "fir": dspk.fir_filter(x[:8], dspk.highpass_taps(30000.0, 300.0)),
        "car": dspk.common_reference(x[:, :3000], "median"),
        "ncc": ncc(img, tpl),
        "peaks": ncc_peaks(img, tpl, 0.9),
    }
    for i in range(3):            # prepared (CPU: at once; GPU: on a second sighting)
        out[f"local{i}"] = dspk.spatial_filter(local, x)
    return out


def _same_bits(a: dict, b: dict, gpu: bool) -> None:
    for key in a:
        got, ref = dspk.backend.to_numpy(b[key]), dspk.backend.to_numpy(a[key])
        assert got.dtype == ref.dtype and got.shape == ref.shape, key
        if gpu and key.startswith("local"):
            # on the GPU a W is prepared once its hashes (on a side stream, not waited for)
            # have landed: the call that first runs the sparse kernel may differ
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
            continue
        assert got.tobytes() == ref.tobytes(), f"{key}: other bits after forget"


def _forget_empties_everything(xp, tmp_path, expect: tuple) -> None:
    with Engine(cache_dir=tmp_path) as engine:
        before = _workload(xp)
        held = engine.cache_sizes()
        assert all(held.get(name) for name in expect), {k: held.get(k) for k in expect}
        engine.forget()
        left = {k: n for k, n in engine.cache_sizes().items() if n}
        assert not left, f"forget left {left}"
        after = _workload(xp)
    _same_bits(before, after, xp is not np)


def test_forget_empties_every_cache_and_the_bits_stay(tmp_path):
    _forget_empties_everything(np, tmp_path, (
        "plans:matmul", "tuner", "prepared:spatial_filter_cpu", "prepared:ncc_banks",
        "shared:cpu_gemm_batch_plans", "shared:blas_threads", "shared:whitening_neighbourhoods"))
    assert {"cpu_gemm_batch_plans", "blas_threads"} <= set(caches.shared_sizes())


@pytest.mark.gpu
def test_forget_empties_every_gpu_cache_and_the_bits_stay(tmp_path):
    import cupy as cp

    _forget_empties_everything(cp, tmp_path, (
        "plans:matmul", "plans:int_gram", "tuner", "prepared:ncc_one_shot_banks",
        "prepared:pca_launches", "prepared:covariance_launches", "shared:cuda_kernels",
        "shared:cuda_sources", "shared:tuner_gpu_stamps", "shared:whitening_neighbourhoods"))
    made = set(caches.shared_sizes())
    assert {"cuda_kernels", "cuda_sources", "cublaslt", "fingerprint_hashers"} <= made, made


def test_a_store_stays_the_same_object_across_forget(tmp_path):
    """Callers may keep a store: forget clears it in place."""
    engine = Engine(cache_dir=tmp_path)
    mine = engine.prepared("test_store", dict)
    mine["k"] = 1
    process = caches.shared("test_shared_store", dict)
    process["k"] = 1
    engine.forget()
    assert engine.prepared("test_store", dict) is mine and not mine
    assert caches.shared("test_shared_store", dict) is process and not process


def test_process_stores_are_cleared_by_any_engine(tmp_path):
    store = caches.shared("test_any_engine", dict)
    store["k"] = 1
    Engine(cache_dir=tmp_path).forget()
    assert not store


def test_caches_doctests():
    result = doctest.testmod(caches, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


#: module-level names of the engine layer allowed to hold mutable state that is not a cache:
#: facts of the machine resolved once, a lock's count, a log-once flag, declarations
ALLOWED = {
    ("dspk/backend.py", "_fallback_logged"),        # log once per process
    ("dspk/linalg/matmul.py", "_cupy_ndarray"),     # CuPy's ndarray type, once imported
    ("dspk/linalg/tuner_cache.py", "_lock_depth"),  # the cache file lock's re-entry count
    ("dspk/kernels/__init__.py", "_DECLARED"),      # declarations made at import, not a cache
}
#: lru_caches of facts of the machine (constant while the process runs)
FACTS = {("dspk/backend.py", "_cupy"), ("dspk/backend.py", "gpu_unavailable_reason"),
         ("dspk/backend.py", "device_name"), ("dspk/backend.py", "device_properties"),
         ("dspk/linalg/candidates_gpu.py", "_fp64_ratio"),
         ("dspk/linalg/candidates_gpu.py", "_smem_optin")}


def _engine_layer() -> list[Path]:
    files = [*(ROOT / "dspk" / "linalg").glob("*.py"), *(ROOT / "dspk" / "ops").glob("*.py"),
             ROOT / "dspk" / "kernels" / "__init__.py"]
    files += [ROOT / "dspk" / n for n in ("match.py", "detect/_gpu.py", "backend.py",
                                          "plot.py")]
    return sorted(files)


def _empty_container(node: ast.AST) -> bool:
    if isinstance(node, (ast.Dict, ast.List, ast.Set)):
        return not (getattr(node, "keys", None) or getattr(node, "elts", None))
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        name = getattr(node.func, "id", getattr(node.func, "attr", ""))
        return name in ("dict", "list", "set", "OrderedDict", "defaultdict", "local")
    return False


def test_no_module_level_cache_outside_the_registry():
    """The engine layer keeps no cache of its own at module or class level: no empty container
    to fill, no lru_cache but the machine's facts, no ``global`` but the allowed state."""
    found = []
    for path in _engine_layer():
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        class_level = [n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body]
        for node in tree.body + class_level:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                    and _empty_container(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [f"{rel}: {t.id} = empty container" for t in targets
                          if isinstance(t, ast.Name) and (rel, t.id) not in ALLOWED]
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    name = getattr(dec, "id", None) or getattr(getattr(dec, "func", None),
                                                               "id", None)
                    if name in ("lru_cache", "cache") and (rel, node.name) not in FACTS:
                        found.append(f"{rel}: {node.name} is an lru_cache")
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found += [f"{rel}: global {n}" for n in node.names if (rel, n) not in ALLOWED]
    assert not found, found
