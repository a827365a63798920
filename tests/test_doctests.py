"""The runnable examples in the public docstrings run and give what they show."""

import doctest
import importlib

import pytest

MODULES = ["dspk.linalg.view", "dspk.linalg.matmul", "dspk.linalg.intmm", "dspk.match",
           "dspk.ops.covariance", "dspk.ops.pca", "dspk.ops.spatial", "dspk.pipeline",
           "dspk.io", "dspk.dask"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
