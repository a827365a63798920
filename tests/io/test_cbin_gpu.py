"""The GPU job on a SpikeGLX `.cbin` (issue 47 item 1): the device sums the chunks'
differences (`Staging`), and its output is the bytes of the same GPU job's on the `.bin`.
The `.cbin` is written by `dspk.io.cbin.write_cbin` (tested against mtscomp's own
decompression in test_cbin.py), so these run where mtscomp is not installed — the GPU
machine."""

import h5py
import numpy as np
import pytest

import dspk
from dspk.io import SpikeGLXRecording, open_recording
from dspk.io.cbin import write_cbin

from tests.recordings import np1_meta, rand16, write_sglx


@pytest.fixture
def pair(tmp_path):
    """A NP1.0 AP .bin (384 + SY) and its .cbin (chunks of 0.25 s) beside a copy of its
    .meta in another folder."""
    data = rand16(31000, 385, seed=4)
    data[:, 384] = (np.arange(31000) // 700 % 2) * 64
    plain, comp = tmp_path / "bin", tmp_path / "cbin"
    plain.mkdir()
    comp.mkdir()
    binpath = write_sglx(plain, "run_g0_t0.imec0.ap.bin", data, np1_meta())
    cbin = comp / "run_g0_t0.imec0.ap.cbin"
    write_cbin(str(cbin), data, 30000.0, chunk_samples=7500)
    (comp / "run_g0_t0.imec0.ap.meta").write_bytes(binpath.with_suffix(".meta").read_bytes())
    return binpath, cbin, data


def test_the_pair_reads_alike(pair):
    binpath, cbin, data = pair
    with open_recording(binpath) as a, open_recording(cbin) as b:
        assert isinstance(b, SpikeGLXRecording) and b.compressed
        np.testing.assert_array_equal(b.read(scaled=False), data[:, :384].T)
        np.testing.assert_array_equal(b.read(7000, 9100), a.read(7000, 9100))


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_s", [0.23, 0.5])    # chunks across the .cbin's, and longer
def test_a_gpu_job_on_the_cbin_equals_it_on_the_bin(pair, tmp_path, chunk_s):
    binpath, cbin, _ = pair
    outs = []
    for src, name in ((binpath, "a.h5"), (cbin, "b.h5")):
        with open_recording(src) as rec:
            p = dspk.Pipeline.from_options(highpass=300.0, reference="median",
                                           whiten="none", backend="gpu").fit(rec)
            p.run(rec, tmp_path / name, chunk_s=chunk_s, progress=False)
            outs.append(tmp_path / name)
    with h5py.File(outs[0]) as fa, h5py.File(outs[1]) as fb:
        np.testing.assert_array_equal(fa["traces"][:], fb["traces"][:])
