"""Sphinx configuration: the API reference built from dspk's numpy-style docstrings.

Build with ``make docs`` (or ``sphinx-build -W --keep-going -b html docs docs/_build/html``);
warnings are errors. CuPy is mocked, so the reference builds on machines without a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dspk  # noqa: E402

project = "dspk"
author = "dspk developers"
copyright = "dspk developers"
release = version = dspk.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

# dspk imports CuPy lazily, but a documented signature or a GPU-only module may name it: the
# reference must build where CuPy (and CUDA) are not installed
autodoc_mock_imports = ["cupy", "cupyx", "dask_cuda"]
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "none"          # the numpy-style docstrings carry the types
autosummary_generate = False

napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

# `name` in a docstring is a cross-reference when it resolves, plain code otherwise
default_role = "py:obj"
nitpicky = False

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = f"dspk {release}"
