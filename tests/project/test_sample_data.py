"""data/sample.nwb: the committed file is what scripts/make_sample_data.py generates, pynwb
and SpikeInterface read it as valid NWB with its geometry and ground truth, and dspk reads
it as the NWB recording it describes."""

import importlib.util
from pathlib import Path

import h5py
import numpy as np
import pytest

import dspk

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "sample.nwb"


def load_script():
    spec = importlib.util.spec_from_file_location("make_sample_data",
                                                  ROOT / "scripts" / "make_sample_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def plain(value):
    """An attribute as comparable bytes or values (variable-length strings as str)."""
    if isinstance(value, np.ndarray):
        return tuple(str(v) for v in value.tolist()) if value.dtype.kind == "O" else \
            value.tobytes()
    return value


def contents(path):
    """Every dataset's name, attributes and data, and every group's attributes, except what
    pynwb makes new on every write (the objects' ids) or takes from its own version (the
    schema it caches under /specifications, the root's nwb_version and .specloc): what the
    script generates, not the HDF5 library's file layout."""
    items = {}

    def visit(name, obj):
        if name.startswith("specifications"):
            return
        attrs = {k: plain(v) for k, v in obj.attrs.items()
                 if k not in ("object_id",) and not isinstance(v, h5py.Reference)}
        data = obj[()] if isinstance(obj, h5py.Dataset) else None
        if isinstance(data, np.ndarray) and data.dtype.kind == "O":    # references
            data = None
        items[name] = (attrs, data.tobytes() if isinstance(data, np.ndarray) else data)

    with h5py.File(path, "r") as f:
        f.visititems(visit)
        items["/"] = {k: v for k, v in f.attrs.items()
                      if k not in ("object_id", "nwb_version", ".specloc")}
    return items


def test_committed_sample_is_regenerated_exactly(tmp_path):
    mod = load_script()
    out = tmp_path / "again.nwb"
    mod.write(out, mod.generate())
    assert contents(out) == contents(SAMPLE)


def test_sample_is_valid_nwb_for_pynwb_and_spikeinterface():
    pynwb = pytest.importorskip("pynwb")
    with pynwb.NWBHDF5IO(str(SAMPLE), "r") as io:
        nwb = io.read()
        es = nwb.acquisition["ElectricalSeries"]
        assert es.data.shape == (240000, 32) and es.rate == 30000.0
        table = nwb.electrodes.to_dataframe()
        assert np.array_equal(table[["rel_x", "rel_y"]].to_numpy(), load_script().probe())
        assert len(nwb.units) == 8
    se = pytest.importorskip("spikeinterface.extractors")
    rec = se.read_nwb(str(SAMPLE))
    assert np.array_equal(rec.get_channel_locations(), load_script().probe())
    assert np.allclose(rec.get_channel_gains(), 0.195)
    sorting = se.read_nwb_sorting(str(SAMPLE), electrical_series_path="acquisition/"
                                  "ElectricalSeries")
    with h5py.File(SAMPLE, "r") as f:
        times = f["analysis/ground_truth/sample_index"][:]
    assert sorted(np.concatenate([sorting.get_unit_spike_train(u)
                                  for u in sorting.unit_ids]).tolist()) == times.tolist()


def test_sample_reads_as_nwb_with_ground_truth():
    rec = dspk.open_recording(SAMPLE)
    assert (rec.n_channels, rec.n_samples, rec.fs) == (32, 240000, 30000.0)
    assert rec.geometry.shape == (32, 2) and np.allclose(rec.gain_to_uv, 0.195)
    with h5py.File(SAMPLE, "r") as f:
        gt = f["analysis/ground_truth"]
        times, units = gt["sample_index"][:], gt["unit_index"][:]
        templates = f["units/templates_uv"][:]
    assert np.all(np.diff(times) >= 0) and len(times) > 100
    # the biggest unit's trough is visible on its peak channel at its spike times
    u = int(np.argmax(-templates.min(axis=(1, 2))))
    ch = int(np.argmin(templates[u].min(axis=1)))
    x = rec.read(channels=[ch])[0]
    troughs = x[times[units == u]] - np.median(x)
    assert np.median(troughs) < 0.5 * templates[u, ch].min()
