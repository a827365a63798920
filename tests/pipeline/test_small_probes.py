"""Issue 45, item 8: the IBL chain on probes of fewer than 60 channels, and ``.prb`` files as
current probeinterface writes them under NumPy 2.

The spatial high-pass pads each group by reflection with ``n_channel_pad`` channels (60 by
default); IBL's ``kfilt`` caps the padding at the channel count (``ntr_pad = min(ntr_pad,
nx)``), SpikeInterface's ``highpass_spatial_filter`` asserts ``n_channel_pad <= channels``
(and so refuses its own default on 32 channels). dspk caps as IBL does: its result on a
32-channel array equals ibldsp's ``kfilt`` with its default padding and SpikeInterface's filter
with ``n_channel_pad=32``.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from dspk.cli import main
from dspk.io import open_recording, read_probe
from dspk.ops import highpass_spatial_filter, highpass_spatial_matrix

from tests.ops.test_destripe import FS, np1_geometry, rms_of, si_highpass_spatial, striped

SAMPLE = "data/sample.nwb"


@pytest.mark.parametrize("n_channels", [32, 16, 8, 5])
@pytest.mark.parametrize("apply_agc", [False, True])
def test_fewer_than_60_channels_against_spikeinterface(n_channels, apply_agc):
    geom = np1_geometry(n_channels)
    x = striped(n_channels, 6000, seed=n_channels)
    rms = rms_of(x)
    y = highpass_spatial_filter(x, geom, FS, rms_values=rms, apply_agc=apply_agc)
    ref = si_highpass_spatial(x, geom, rms_values=rms, apply_agc=apply_agc,
                              n_channel_pad=n_channels)
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-6 * np.abs(ref).max())


@pytest.mark.parametrize("n_channels", [32, 12])
def test_fewer_than_60_channels_against_ibl_kfilt(n_channels):
    voltage = pytest.importorskip("ibldsp.voltage", reason="the comparison runs against ibldsp")
    geom = np1_geometry(n_channels)
    x = striped(n_channels, 3000, seed=1)
    ref = voltage.kfilt(x.copy(), ntr_pad=60, ntr_tap=0, lagc=0,
                        butter_kwargs={"N": 3, "Wn": 0.01, "btype": "highpass"})
    y = highpass_spatial_filter(x, geom, FS, apply_agc=False)     # default n_channel_pad=60
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-9 * np.abs(ref).max())


def test_cap_is_per_group():
    """Two shanks of 40 and 24 channels with the default padding: each group capped at its
    own size, as each filtered alone."""
    geom = np1_geometry(64)
    groups = np.r_[np.zeros(40, int), np.ones(24, int)]
    w = highpass_spatial_matrix(geom, groups=groups)
    np.testing.assert_array_equal(w[:40, :40], highpass_spatial_matrix(geom[:40]))
    np.testing.assert_array_equal(w[40:, 40:], highpass_spatial_matrix(geom[40:],
                                                                       n_channel_pad=24))
    assert not w[:40, 40:].any() and not w[40:, :40].any()


@pytest.mark.slow
def test_preset_ibl_on_the_32_channel_sample(tmp_path, monkeypatch):
    """``dspk preprocess data/sample.nwb --preset ibl`` (32 channels) completes, and its output
    is the library's chain on the same recording."""
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "ibl.h5"
    assert main(["preprocess", SAMPLE, str(out), "--preset", "ibl"]) == 0
    with h5py.File(out, "r") as f:
        y = f["traces"][:]
    rec = open_recording(SAMPLE)
    assert y.shape[0] * y.shape[1] == rec.n_channels * rec.n_samples
    assert np.isfinite(y).all() and np.abs(y).max() > 0


def test_prb_written_by_probeinterface_under_numpy2(tmp_path):
    pi = pytest.importorskip("probeinterface")
    probe = pi.generate_linear_probe(num_elec=8, ypitch=20)
    probe.set_device_channel_indices(np.arange(8)[::-1])
    group = pi.ProbeGroup()
    group.add_probe(probe)
    path = tmp_path / "linear.prb"
    pi.write_prb(str(path), group)
    text = path.read_text()
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
        assert "np.int64(" in text and "np.float64(" in text      # what issue 45 met
    g = read_probe(str(path))
    want = probe.contact_positions[np.argsort(probe.device_channel_indices)]
    np.testing.assert_array_equal(g, want)
    rec = open_recording(np.zeros((3000, 8), np.int16), fs=FS, geometry=str(path))
    np.testing.assert_array_equal(rec.geometry, want)
    # and what probeinterface reads back agrees
    back = pi.read_prb(str(path)).probes[0]
    np.testing.assert_array_equal(back.contact_positions, probe.contact_positions)


def test_prb_numpy_scalars_of_every_kind(tmp_path):
    path = tmp_path / "p.prb"
    path.write_text("total_nb_channels = np.int32(2)\n"
                    "channel_groups = {np.int64(0): {'channels': [np.int64(0), numpy.uint16(1)],"
                    " 'geometry': {0: (np.float32(1.5), np.float64(-2.0)), 1: (0, 20)}}}\n")
    np.testing.assert_array_equal(read_probe(str(path)), [[1.5, -2.0], [0.0, 20.0]])
