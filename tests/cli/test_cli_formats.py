"""The command line end to end on vendor formats with spike detection: a SpikeGLX
.ap.bin + .meta and an Open Ephys folder, opened with no options (the Open Ephys one given a
probe file), preprocessed with the default local whitening and --detect."""

import h5py
import numpy as np
import pytest

from dspk.cli import main
from dspk.detect import default_templates

from tests.recordings import np1_meta, np1_xy, oe_stream, write_oe, write_sglx

pytestmark = pytest.mark.slow

FS = 30000


def _raw_with_spikes(n, c, seed=0):
    """[n, c] int16: noise of ~15 bits SD, spatially smooth, and spikes of -250 bits on a few
    neighbouring channels at known times."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c)) * 15.0
    wave = default_templates()[2]
    wave = wave / -wave.min()
    times = np.arange(600, n - 600, 450)
    chans = rng.integers(2, c - 2, len(times))
    for t, ch in zip(times, chans):
        for d, a in ((-2, 0.4), (-1, 0.8), (0, 1.0), (1, 0.8), (2, 0.4)):
            x[t - 20:t + 41, ch + d] += 250.0 * a * wave
    return np.rint(x).astype(np.int16), times


def _found(out, times):
    with h5py.File(out, "r") as f:
        traces_shape = f["traces"].shape
        spikes = f["spikes"][:]
    t = np.sort(spikes["sample_index"])
    hit = np.array([np.any(np.abs(t - s) <= 12) for s in times])
    return traces_shape, hit.mean(), len(spikes)


def test_spikeglx_bin_and_meta_preprocess_with_detect(tmp_path, capsys):
    raw, times = _raw_with_spikes(30000, 384)
    sync = np.zeros((len(raw), 1), np.int16)
    path = write_sglx(tmp_path, "run_g0_t0.imec0.ap.bin", np.hstack([raw, sync]), np1_meta())
    out = tmp_path / "out.h5"
    assert main(["preprocess", str(path), str(out), "--detect", "--quiet"]) == 0
    shape, recall, n = _found(out, times)
    assert shape == (30000, 384)                       # the sync word is not a channel
    assert recall >= 0.9, (recall, n)
    assert main(["info", str(out)]) == 0
    assert "spikes" in capsys.readouterr().out


def test_open_ephys_folder_with_a_probe_file_preprocess_with_detect(tmp_path):
    raw, times = _raw_with_spikes(36000, 64, seed=1)
    write_oe(tmp_path, [oe_stream("Neuropix-PXI-100.ProbeA-AP", 64)], [raw])
    probe = tmp_path / "probe.csv"
    xy = np.array([np1_xy(c % 2, c // 2) for c in range(64)])
    np.savetxt(probe, xy, delimiter=",", header="x,y", comments="")
    out = tmp_path / "out.h5"
    assert main(["preprocess", str(tmp_path), str(out), "--probe", str(probe), "--detect",
                 "--quiet"]) == 0
    shape, recall, n = _found(out, times)
    assert shape == (36000, 64)
    assert recall >= 0.9, (recall, n)
