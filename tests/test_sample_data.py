"""data/sample.nwb: the committed file is what scripts/make_sample_data.py generates, and
dspk reads it as the NWB recording it describes."""

import importlib.util
from pathlib import Path

import h5py
import numpy as np

import dspk

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample.nwb"


def load_script():
    spec = importlib.util.spec_from_file_location("make_sample_data",
                                                  ROOT / "scripts" / "make_sample_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def contents(path):
    """Every object's name, attributes and data (bytes), not the HDF5 library's file layout."""
    items = {}

    def visit(name, obj):
        attrs = {k: (v.tobytes() if isinstance(v, np.ndarray) else v)
                 for k, v in obj.attrs.items() if k != "table"}
        data = obj[()] if isinstance(obj, h5py.Dataset) else None
        items[name] = (attrs, data.tobytes() if isinstance(data, np.ndarray) else data)

    with h5py.File(path, "r") as f:
        f.visititems(visit)
        items["/"] = dict(f.attrs)
    return items


def test_committed_sample_is_regenerated_exactly(tmp_path):
    mod = load_script()
    out = tmp_path / "again.nwb"
    mod.write(out, mod.generate())
    assert contents(out) == contents(SAMPLE)


def test_sample_reads_as_nwb_with_ground_truth():
    rec = dspk.open_recording(SAMPLE)
    assert (rec.n_channels, rec.n_samples, rec.fs) == (32, 240000, 30000.0)
    assert rec.geometry.shape == (32, 2) and np.allclose(rec.gain_to_uv, 0.195)
    with h5py.File(SAMPLE, "r") as f:
        gt = f["analysis/ground_truth"]
        times, units = gt["sample_index"][:], gt["unit_index"][:]
        templates = gt["templates_uv"][:]
    assert np.all(np.diff(times) >= 0) and len(times) > 100
    # the biggest unit's trough is visible on its peak channel at its spike times
    u = int(np.argmax(-templates.min(axis=(1, 2))))
    ch = int(np.argmin(templates[u].min(axis=1)))
    x = rec.read(channels=[ch])[0]
    troughs = x[times[units == u]] - np.median(x)
    assert np.median(troughs) < 0.5 * templates[u, ch].min()
