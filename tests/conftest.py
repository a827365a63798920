"""Shared fixtures: a private tuner cache per test session, the `gpu` marker, array modules."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dspk.backend import gpu_available


@pytest.fixture(scope="session", autouse=True)
def _private_tuner_cache(tmp_path_factory):
    # Tests never read or write the user's ~/.cache/dspk.
    old = os.environ.get("DSPK_CACHE_DIR")
    os.environ["DSPK_CACHE_DIR"] = str(tmp_path_factory.mktemp("dspk-cache"))
    yield
    if old is None:
        os.environ.pop("DSPK_CACHE_DIR", None)
    else:
        os.environ["DSPK_CACHE_DIR"] = old


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def xp_params():
    """[numpy] plus cupy (marked gpu) for tests that run on both backends."""
    return [pytest.param("numpy", id="cpu"), pytest.param("cupy", id="gpu", marks=pytest.mark.gpu)]


@pytest.fixture(params=xp_params())
def xp(request):
    if request.param == "numpy":
        return np
    import cupy

    return cupy
