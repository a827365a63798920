"""The version of dspk, in one place: the package, its metadata (pyproject.toml reads it here),
the tuner cache's stamp and the outputs' provenance all take it from this module, which imports
nothing (so no module needs the package root to be imported first)."""

__version__ = "0.8.5"
