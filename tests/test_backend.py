import logging
import subprocess
import sys

import numpy as np
import pytest

import dspk
from dspk import backend


def test_import_is_light():
    # `import dspk` must not import CuPy (nor compile anything).
    code = "import sys, dspk; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_array_module_numpy():
    assert backend.array_module(np.zeros(3), None) is np


def test_array_module_rejects_non_arrays_mixed_with_cupy_by_type(monkeypatch):
    class ndarray:  # a fake CuPy array type, so the check runs without CuPy
        __module__ = "cupy._core.core"

        class device:
            id = 0

    fake = ndarray()
    assert backend.is_cupy_array(fake)
    with pytest.raises(TypeError, match="mixed"):
        backend.array_module(np.zeros(2), fake)


def test_resolve_backend_cpu_always_works():
    assert dspk.resolve_backend("cpu") == "cpu"


def test_resolve_backend_gpu_without_gpu_is_clear_error(monkeypatch):
    monkeypatch.setattr(backend, "gpu_unavailable_reason", lambda: "no CUDA device found")
    with pytest.raises(dspk.BackendError, match="no GPU can be used: no CUDA device found"):
        backend.resolve_backend("gpu")


def test_resolve_backend_auto_falls_back_and_logs_once(monkeypatch, caplog):
    monkeypatch.setattr(backend, "gpu_unavailable_reason", lambda: "CuPy is not installed")
    monkeypatch.setattr(backend, "_fallback_logged", False)
    with caplog.at_level(logging.INFO, logger="dspk"):
        assert backend.resolve_backend("auto") == "cpu"
        assert backend.resolve_backend("auto") == "cpu"
    assert sum("using the CPU backend" in r.message for r in caplog.records) == 1


def test_resolve_backend_reads_environment(monkeypatch):
    monkeypatch.setenv("DSPK_BACKEND", "cpu")
    assert backend.resolve_backend() == "cpu"
    monkeypatch.setenv("DSPK_BACKEND", "fast")
    with pytest.raises(ValueError, match="DSPK_BACKEND must be one of"):
        backend.resolve_backend()


def test_gpu_discovery_never_raises():
    assert isinstance(backend.gpu_available(), bool)


def test_timer_on_the_cpu():
    with backend.Timer(np) as t:
        sum(range(1000))
    assert 0 < t.seconds < 1
