"""The notebooks run top to bottom (executed with nbclient in a fresh kernel, on the CPU here
and on the GPU where CuPy sees one) without an error output, their own checks hold, and they
draw their figures."""

import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")

pytestmark = [pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FIGURES = {"01_quickstart.ipynb": 5, "02_engine.ipynb": 2, "03_template_matching.ipynb": 1,
           "05_spikeinterface_kilosort.ipynb": 4,
           "04_dask_batch.ipynb": 1}
#: what each notebook shows a reader is checked by ``assert`` in its cells (recall against the
#: ground truth, exactness, the cluster's output identical to the single process's, ...): a
#: failed check is an error output, so the run below fails on it
CHECKS = {"01_quickstart.ipynb": 1, "02_engine.ipynb": 3, "03_template_matching.ipynb": 2,
          "05_spikeinterface_kilosort.ipynb": 6,
          "04_dask_batch.ipynb": 2}


def test_the_five_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == sorted(FIGURES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_asserts_what_it_shows(path):
    nb = nbformat.read(path, as_version=4)
    asserts = [line for c in nb.cells if c.cell_type == "code"
               for line in c.source.splitlines() if line.lstrip().startswith("assert ")]
    assert len(asserts) >= CHECKS[path.name], f"{path.name}: {len(asserts)} checks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # the kernel is this interpreter (the test environment), with the checkout importable
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT),
                                                                   os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    from jupyter_client.kernelspec import KernelSpec

    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.km = client.create_kernel_manager()
    client.km._kernel_spec = KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher",
                                              "-f", "{connection_file}"],
                                        display_name="test", language="python")
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors, f"{path.name}: {errors[0].ename}: {errors[0].evalue}"
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.outputs if o.output_type == "stream" and o.name == "stdout")
    assert "False" not in printed, f"{path.name}: a check printed False:\n{printed}"
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "data" in o and "image/png" in o.data]
    assert len(images) >= FIGURES[path.name], f"{path.name}: {len(images)} figures"
