"""The LFP band read with its own gains: a SpikeGLX NP1.0 .lf.bin (2.5 kHz, the IMRO table's LF
gains) as SpikeInterface's and ibl-neuropixel's readers read it, and decimated to its rate
from the AP band's by `dspk.ops.decimate` as SciPy decimates."""

import numpy as np
import pytest

import dspk
from dspk.ops import decimate

from tests.recordings import np1_meta, rand16, write_sglx


@pytest.fixture
def run_folder(tmp_path):
    folder = tmp_path / "run_g0" / "run_g0_imec0"
    folder.mkdir(parents=True)
    write_sglx(folder, "run_g0_t0.imec0.ap.bin", rand16(3000, 385, seed=1), np1_meta())
    lf = write_sglx(folder, "run_g0_t0.imec0.lf.bin", rand16(250, 385, seed=2),
                    np1_meta(band="lf"))
    return folder, lf


def test_lf_bin_agrees_with_spikeinterface_and_ibl(run_folder):
    folder, lf = run_folder
    with dspk.open_recording(lf) as rec:
        mine = rec.read()
        assert rec.fs == 2500.0 and rec.n_channels == 384
    se = pytest.importorskip("spikeinterface.extractors")
    si = se.read_spikeglx(folder, stream_id="imec0.lf")
    np.testing.assert_array_equal(mine, si.get_traces(return_in_uV=True).T.astype(np.float32))
    spikeglx = pytest.importorskip("spikeglx")
    sr = spikeglx.Reader(lf)
    try:
        volts = sr.read(nsel=slice(0, 250), csel=slice(0, 384), sync=False)
    finally:
        sr.close()
    np.testing.assert_allclose(mine, volts.T * 1e6, rtol=1e-6, atol=1e-2)


def test_ap_band_decimated_to_the_lf_rate():
    from scipy.signal import decimate as scipy_decimate
    x = np.random.default_rng(0).standard_normal((8, 30000)).astype(np.float32)
    y = decimate(x, 12)
    assert y.shape == (8, 2500)
    ref = scipy_decimate(x.astype(np.float64), 12, ftype="fir")
    assert np.abs(y - ref).max() <= 1e-6 * np.abs(ref).max()
