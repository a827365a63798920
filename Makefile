# Quick start: `make demo` then `make test`. Both work on a fresh machine with only Python.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-quick test-blas-threads test-kilosort test-sorting kilosort-wheels docs venv gpu-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The main job on the bundled data: preprocess data/sample.nwb into out/ and print a summary
# (the GPU when CuPy sees one, the CPU otherwise).
demo: $(STAMP)
	DSPK_BACKEND=$${DSPK_BACKEND:-auto} $(PY) scripts/demo.py

# The suite in one worker per core, at most 4 (pytest-xdist; `make test TEST_JOBS=0` runs it
# in this process): its longest tests compile CUDA sources with nvcc or start processes, and
# one process leaves CI's second core idle while they wait. Each worker has its own tuner
# cache (tests/conftest.py), so no test sees another's choices.
TEST_JOBS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0))))")
test: $(STAMP)
	$(PY) -m pytest -q -m "not sorting" -n $(TEST_JOBS)

# The tests whose results could depend on the BLAS thread count (marked blas_threads: the
# engine's thread-count checks, jobs compared with Dask workers' bits) again with BLAS on 1
# and on 2 threads: results promised bit-identical must not depend on it (CI runs this after
# `make test`, which leaves the count unset).
test-blas-threads: $(STAMP)
	for n in 1 2; do \
	  echo "== OPENBLAS_NUM_THREADS=$$n OMP_NUM_THREADS=$$n MKL_NUM_THREADS=$$n"; \
	  OPENBLAS_NUM_THREADS=$$n OMP_NUM_THREADS=$$n MKL_NUM_THREADS=$$n $(PY) -m pytest -q -p no:cacheprovider -m blas_threads -n $(TEST_JOBS) || exit 1; \
	done

# Kilosort4's own loaders on dspk's Kilosort folder, and SpikeInterface's DREDGE motion
# estimate from dspk's peaks (tests/pipeline/test_kilosort_output.py,
# tests/spikeinterface/test_spikeinterface_users.py, tests/pipeline/test_metadata_roundtrip.py
# skip them where kilosort or torch is absent): kilosort needs torch, and PyPI's torch is the
# CUDA build (~2.5 GB), so the CPU build comes from PyTorch's index (kilosort.io needs torch
# and faiss-cpu beside what the test extras install). `kilosort-wheels` only downloads (CI runs
# it in the background during `make test`); `test-kilosort` installs from those wheels and
# runs those tests.
KS_WHEELS ?= .ci-wheels
kilosort-wheels:
	$(PYTHON) -m pip download --quiet --dest $(KS_WHEELS) torch --index-url https://download.pytorch.org/whl/cpu
	$(PYTHON) -m pip download --quiet --dest $(KS_WHEELS) --no-deps kilosort faiss-cpu

test-kilosort: $(STAMP)
	$(PY) -m pip install --quiet --no-index --find-links $(KS_WHEELS) torch
	$(PY) -m pip install --quiet --no-index --no-deps --find-links $(KS_WHEELS) kilosort faiss-cpu
	$(PY) -c "import kilosort.io"    # fails here rather than letting the test skip
	$(PY) -m pytest -q -p no:cacheprovider tests/pipeline/test_kilosort_output.py \
	  tests/spikeinterface/test_spikeinterface_users.py tests/pipeline/test_metadata_roundtrip.py \
	  -k "kilosort4 or motion_from_dspks_peaks" -rs

# The sorting outcome on the CPU (issue 42): Kilosort4 on dspk's output of a 64-channel,
# 2-minute drifting ground truth against Kilosort4 alone (tests/project/test_sorting_outcome.py,
# about 20 minutes on 2 cores: left out of `make test` and CI). Installs Kilosort4, faiss-cpu
# and torch's CPU build from the wheels `kilosort-wheels` downloads.
test-sorting: $(STAMP) kilosort-wheels
	$(PY) -m pip install --quiet --no-index --find-links $(KS_WHEELS) torch
	$(PY) -m pip install --quiet --no-index --no-deps --find-links $(KS_WHEELS) kilosort faiss-cpu
	$(PY) -m pytest -q -p no:cacheprovider tests/project/test_sorting_outcome.py -m sorting -rs

# The suite without the tests marked slow (notebooks, the docs build, a wheel, Dask clusters,
# jobs stopped by signals): what a developer runs between changes. CI runs them all.
test-quick: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not sorting" -n $(TEST_JOBS)

# The API reference from the docstrings (Sphinx), warnings as errors: docs/_build/html/index.html
docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

gpu-check:
	scripts/gpu-check $${OUT:-gpu-results}

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info out docs/_build
