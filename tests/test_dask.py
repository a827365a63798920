"""dspk.dask on the CPU: a recording as a dask array, the pipeline as a graph (the same samples
as the single-process job), the fit as tasks (the same W, bit for bit), many recordings on a
LocalCluster of worker processes (outputs identical to the single-process ones, a failing
recording reported without stopping the others, a worker killed mid-job retried and resumed
to the same file), and the bad inputs of the issue."""

import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import dspk
from dspk.pipeline import Pipeline

from tests.killable import KillAfter

pytest.importorskip("distributed")
dd = pytest.importorskip("dspk.dask")

# worker processes run BLAS on one thread (distributed's default) and are compared bit for bit
# with this process: CI runs these again with BLAS on 1 and on 2 threads here
pytestmark = [pytest.mark.blas_threads, pytest.mark.slow]

FS = 30000.0


def write_recording(path, n=36000, c=12, seed=0):
    rng = np.random.default_rng(seed)
    geom = np.stack([np.tile([0.0, 32.0], c // 2), np.repeat(np.arange(c // 2) * 20.0, 2)], 1)
    d = np.sqrt(((geom[:, None] - geom[None]) ** 2).sum(-1))
    x = rng.standard_normal((n, c)) @ np.linalg.cholesky(np.exp(-d / 40.0)).T * 50
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("traces", data=np.rint(x).astype(np.int16))
        ds.attrs["fs"] = FS
        ds.attrs["geometry"] = geom
    return path


def single_process(path, out, **options):
    """dspk.preprocess in a fresh process that shares the tuner's cache file (as a user's
    later run on the same machine would): the reference the cluster's outputs must equal."""
    code = ("import sys, dspk\n"
            f"dspk.preprocess({str(path)!r}, {str(out)!r}, progress=False, **{options!r})\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    return out


def traces(path):
    with h5py.File(path, "r") as f:
        return f["traces"][:]


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=":0")
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.mark.parametrize("chunk", [7000, 12345, 100, 35990])
def test_apply_equals_the_single_process_job(tmp_path, chunk):
    rec = dspk.open_recording(write_recording(tmp_path / "r.h5"))
    p = Pipeline.from_options(whiten="local", n_neighbors=4, backend="cpu").fit(rec)
    arr = dd.to_dask(rec, chunk=chunk)
    assert arr.shape == (rec.n_channels, rec.n_samples) and arr.dtype == np.float32
    np.testing.assert_array_equal(arr.compute(scheduler="sync"), rec.read())
    y = dd.apply(p, arr).compute(scheduler="threads")
    ref = p.transform(rec.read())
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-5 * np.abs(ref).max())
    m, rest = p.margin(FS), rec.n_samples % chunk
    if chunk > m and (rest == 0 or rest >= m):    # the job's chunks as blocks: the same bits
        job = traces(p.run(rec, tmp_path / "o.h5", chunk_s=chunk / FS, progress=False))
        np.testing.assert_array_equal(y, job.T)


def test_fit_as_tasks_gives_the_same_whitening(tmp_path, client):
    path = write_recording(tmp_path / "r.h5", n=90000)
    rec = dspk.open_recording(path)
    one = Pipeline.from_options(whiten="local", n_neighbors=6, backend="cpu").fit(rec)
    many = dd.fit(Pipeline.from_options(whiten="local", n_neighbors=6, backend="cpu"), rec,
                  client=client)
    np.testing.assert_array_equal(many.states[2]["W"], one.states[2]["W"])
    local = dd.fit(Pipeline.from_options(whiten="global", backend="cpu"), path)
    np.testing.assert_array_equal(
        local.states[2]["W"],
        Pipeline.from_options(whiten="global", backend="cpu").fit(rec).states[2]["W"])


def test_preprocess_many_equals_single_process_and_reports_failures(tmp_path, client):
    paths = [write_recording(tmp_path / f"r{i}.h5", c=8 + 4 * i, seed=i) for i in range(3)]
    bad = tmp_path / "broken.h5"
    bad.write_bytes(b"not an HDF5 file")
    res = dd.preprocess_many([*map(str, paths), str(bad)], tmp_path / "out", client=client,
                             whiten="global", backend="cpu", chunk_s=0.5)
    assert isinstance(res[str(bad)], Exception) and "not an HDF5 file" in str(res[str(bad)])
    for p in paths:             # different channel counts, each processed on its own
        single = single_process(p, tmp_path / f"{p.stem}-single.h5", whiten="global",
                                backend="cpu", chunk_s=0.5)
        assert res[str(p)] == str(tmp_path / "out" / f"{p.stem}.h5")
        np.testing.assert_array_equal(traces(res[str(p)]), traces(single))
    assert not list((tmp_path / "out").glob("*.partial"))


def test_a_killed_worker_is_retried_and_its_output_is_complete(tmp_path, monkeypatch):
    """The first worker to write 9000 samples dies (os._exit, as a kill); its job is retried
    on a fresh worker, resumes the partial file, and ends with the single-process bytes."""
    from distributed import Client, LocalCluster

    paths = [write_recording(tmp_path / f"k{i}.h5", n=36000, seed=10 + i) for i in range(2)]
    kill = KillAfter(9000, once_file=tmp_path / "killed-once")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        res = dd.preprocess_many([str(p) for p in paths], tmp_path / "out", client=c,
                                 whiten="global", backend="cpu", chunk_s=0.1, on_chunk=kill)
    assert (tmp_path / "killed-once").exists()          # a worker did die mid-job
    for p in paths:
        assert res[str(p)] == str(tmp_path / "out" / f"{p.stem}.h5")
        single = single_process(p, tmp_path / f"{p.stem}-single.h5", whiten="global",
                                backend="cpu", chunk_s=0.1)
        np.testing.assert_array_equal(traces(res[str(p)]), traces(single))


@pytest.mark.parametrize("fmt", ["kilosort", "nwb"])
def test_preprocess_many_writes_each_format(tmp_path, client, fmt):
    """format="kilosort": a folder per recording with the single-process job's binary;
    format="nwb": an .nwb file per recording; a refused combination before any work."""
    if fmt == "nwb":
        pytest.importorskip("pynwb")
    paths = [write_recording(tmp_path / f"k{i}.h5", c=8, seed=30 + i) for i in range(2)]
    subject = {"subject": {"species": "Mus musculus", "age": "P90D"}} if fmt == "nwb" else {}
    res = dd.preprocess_many([str(p) for p in paths], tmp_path / "out", client=client,
                             whiten="global", backend="cpu", chunk_s=0.5, format=fmt, **subject)
    for p in paths:
        got = Path(res[str(p)])
        if fmt == "kilosort":
            assert got == tmp_path / "out" / p.stem and (got / "traces.bin").is_file()
            single = tmp_path / f"{p.stem}-single"
            single_process(p, single, whiten="global", backend="cpu", chunk_s=0.5,
                           format="kilosort")
            assert (got / "traces.bin").read_bytes() == (single / "traces.bin").read_bytes()
        else:
            assert got == tmp_path / "out" / f"{p.stem}.nwb" and got.is_file()
            import pynwb
            with pynwb.NWBHDF5IO(str(got), "r") as io:
                s = io.read().subject
                assert (s.species, s.age) == ("Mus musculus", "P90D")
    with pytest.raises(dspk.pipeline.PipelineError, match="compression"):
        dd.preprocess_many([str(p) for p in paths], tmp_path / "o2", client=client,
                           format=fmt, compression="gzip")


def test_a_tuned_recording_is_fitted_once(tmp_path, monkeypatch):
    """preprocess_many tunes on the first recording of each kind: that fit is its job's (a
    motion pass reads the whole recording), so every recording is fitted once, and the
    outputs are the single-process job's bits."""
    from distributed import Client, LocalCluster

    paths = [write_recording(tmp_path / f"f{i}.h5", c=8, seed=40 + i) for i in range(2)]
    fits = []
    fit = Pipeline.fit

    def counted(self, rec, *a, **k):
        fits.append(str(getattr(rec, "path", rec)))
        return fit(self, rec, *a, **k)

    monkeypatch.setattr(Pipeline, "fit", counted)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        res = dd.preprocess_many([str(p) for p in paths], tmp_path / "out", client=c,
                                 whiten="global", backend="cpu", chunk_s=0.5)
    monkeypatch.undo()
    assert sorted(fits) == sorted(map(str, paths))
    for p in paths:
        single = single_process(p, tmp_path / f"{p.stem}-single.h5", whiten="global",
                                backend="cpu", chunk_s=0.5)
        np.testing.assert_array_equal(traces(res[str(p)]), traces(single))


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="matches no file"):
        dd.preprocess_many(str(tmp_path / "*.nwb"), tmp_path / "out")
    with pytest.raises(TypeError, match="unknown keyword"):
        dd.preprocess_many([str(tmp_path / "a.h5")], tmp_path / "out", hipass=300)
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match="cannot reach tcp://127.0.0.1:9"):
        dd.cluster_client("tcp://127.0.0.1:9", timeout=2)
    assert time.perf_counter() - t0 < 30
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises((FileExistsError, NotADirectoryError, PermissionError)):
        dd.preprocess_many([str(tmp_path / "a.h5")], blocker / "out")
    if os.geteuid() != 0:       # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(PermissionError, match="not writable"):
            dd.preprocess_many([str(tmp_path / "a.h5")], ro)
    rec = dspk.open_recording(write_recording(tmp_path / "r.h5"))
    with pytest.raises(dspk.pipeline.PipelineError, match="not fitted"):
        dd.apply(Pipeline.from_options(whiten="global"), dd.to_dask(rec))
    with pytest.raises(ValueError, match="chunk: expected a positive"):
        dd.to_dask(rec, chunk=0)
    assert Path(tmp_path / "out").exists() is False or not any((tmp_path / "out").iterdir())


def test_command_line(tmp_path):
    for i in range(2):
        write_recording(tmp_path / f"c{i}.h5", c=8, seed=20 + i)
    (tmp_path / "c9.h5").write_bytes(b"broken")
    from dspk.cli import main

    rc = main(["preprocess-many", str(tmp_path / "c*.h5"), str(tmp_path / "out"),
               "--workers", "2", "--whiten", "global", "--backend", "cpu", "--int16"])
    assert rc == 1                                  # one recording failed, the others done
    for i in range(2):
        assert traces(tmp_path / "out" / f"c{i}.h5").dtype == np.int16
    assert main(["preprocess-many", str(tmp_path / "none*.h5"), str(tmp_path / "o2"),
                 "--workers", "1"]) == 2
    rc = main(["preprocess-many", str(tmp_path / "c[01].h5"), str(tmp_path / "ks"),
               "--workers", "1", "--whiten", "global", "--backend", "cpu",
               "--format", "kilosort"])
    assert rc == 0
    assert sorted(os.listdir(tmp_path / "ks")) == ["c0", "c1"]
    assert (tmp_path / "ks" / "c0" / "traces.bin").stat().st_size == 36000 * 8 * 2   # int16


@pytest.mark.parametrize("layout", ["samples_channels", "channels_samples"])
def test_one_recording_split_across_workers_to_hdf5(tmp_path, client, layout):
    """apply's blocks written by the workers themselves (os.pwrite at each block's place):
    the single-process job's file, sample for sample, readable as a recording."""
    rec = dspk.open_recording(write_recording(tmp_path / "r.h5", n=60000))
    p = Pipeline.from_options(whiten="global", backend="cpu").fit(rec)
    out = dd.to_hdf5(dd.apply(p, dd.to_dask(rec, chunk=6000)), tmp_path / "o.h5",
                     layout=layout, client=client)
    job = traces(p.run(rec, tmp_path / "job.h5", chunk_s=0.2, layout=layout,
                       progress=False))
    got = traces(out)
    assert got.shape == job.shape and not (tmp_path / "o.h5.partial").exists()
    np.testing.assert_allclose(got, job, rtol=0, atol=2e-5 * np.abs(job).max())
    back = dspk.open_recording(out)
    assert (back.n_channels, back.n_samples, back.fs) == (rec.n_channels, rec.n_samples, FS)
    with pytest.raises(dspk.pipeline.PipelineError, match="exists"):
        dd.to_hdf5(dd.to_dask(rec), out)


def _worker_device():
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    return os.environ.get("CUDA_VISIBLE_DEVICES", ""), props["pciBusID"]


@pytest.mark.gpu
def test_gpu_workers_of_a_local_cuda_cluster(tmp_path):
    """dask-cuda's LocalCUDACluster: one worker per visible GPU, each bound to its own device
    (its first visible device differs from every other worker's), and outputs identical to
    the single-process GPU job's."""
    pytest.importorskip("dask_cuda")
    import cupy

    paths = [write_recording(tmp_path / f"g{i}.h5", n=60000, c=16, seed=20 + i)
             for i in range(3)]
    client = dd.cluster_client(gpu=True)
    try:
        devices = client.run(_worker_device)
        assert len(devices) == cupy.cuda.runtime.getDeviceCount()
        firsts = [v[0].split(",")[0] for v in devices.values()]
        assert len(set(firsts)) == len(firsts) and all(firsts)
        assert len({v[1] for v in devices.values()}) == len(devices)   # distinct PCI buses
        res = dd.preprocess_many([str(p) for p in paths], tmp_path / "out", client=client,
                                 whiten="global", highpass=300.0, reference="median",
                                 backend="gpu", chunk_s=0.5)
        # one recording split over the GPU workers (2 spans even on one GPU)
        p = Pipeline.from_options(whiten="global", highpass=300.0, reference="median",
                                  backend="gpu")
        split = dd.run_split(p, str(paths[0]), tmp_path / "split.h5", client=client, spans=2,
                             chunk_s=0.5)
    finally:
        dd.close_client(client)
    for p in paths:
        assert res[str(p)] == str(tmp_path / "out" / f"{p.stem}.h5"), res[str(p)]
        single = single_process(p, tmp_path / f"{p.stem}-single.h5", whiten="global",
                                highpass=300.0, reference="median", backend="gpu",
                                chunk_s=0.5)
        np.testing.assert_array_equal(traces(res[str(p)]), traces(single))
    np.testing.assert_array_equal(traces(split), traces(tmp_path / "g0-single.h5"))


@pytest.mark.parametrize("layout,dtype", [("samples_channels", np.float32),
                                          ("channels_samples", np.int16)])
def test_run_split_gives_the_single_process_bytes(tmp_path, client, layout, dtype):
    """One recording in spans of whole chunks over the workers (3 spans on 2 workers, the last
    chunk short): the traces Pipeline.run writes, bit for bit, and its metadata."""
    path = write_recording(tmp_path / "r.h5", n=36000 + 777, seed=5)
    rec = dspk.open_recording(path)
    p = Pipeline.from_options(whiten="global", backend="cpu").fit(rec)
    ref = p.run(rec, tmp_path / "one.h5", chunk_s=0.2, output_dtype=dtype, layout=layout,
                progress=False)
    out = dd.run_split(p, path, tmp_path / "split.h5", client=client, spans=3, chunk_s=0.2,
                       output_dtype=dtype, layout=layout)
    np.testing.assert_array_equal(traces(out), traces(ref))
    assert not (tmp_path / "split.h5.partial").exists()
    with h5py.File(out) as f, h5py.File(ref) as g:
        assert f["traces"].attrs["layout"] == layout and f.attrs["fs"] == g.attrs["fs"]
        np.testing.assert_array_equal(f["fitted/step2_Whiten/W"][:], g["fitted/step2_Whiten/W"][:])
    with pytest.raises(dspk.pipeline.PipelineError, match="exists"):
        dd.run_split(p, path, out, client=client)


def test_run_split_fits_first_and_a_failed_span_leaves_no_output(tmp_path, monkeypatch):
    path = write_recording(tmp_path / "r.h5", n=20000, seed=6)
    p = Pipeline.from_options(whiten="global", backend="cpu")
    out = dd.run_split(p, path, tmp_path / "a.h5", spans=2, chunk_s=0.25)  # local scheduler
    ref = Pipeline.from_options(whiten="global", backend="cpu").fit(dspk.open_recording(path))
    np.testing.assert_array_equal(p.states[2]["W"], ref.states[2]["W"])
    np.testing.assert_array_equal(
        traces(out), traces(ref.run(dspk.open_recording(path), tmp_path / "b.h5", chunk_s=0.25,
                                    progress=False)))

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Pipeline, "run_span", boom)
    with pytest.raises(OSError, match="disk full"):
        dd.run_split(p, path, tmp_path / "c.h5", spans=2, chunk_s=0.25)
    assert not (tmp_path / "c.h5").exists() and not (tmp_path / "c.h5.partial").exists()


def test_run_split_with_a_killed_worker_ends_with_the_single_process_bytes(tmp_path,
                                                                          monkeypatch):
    """A worker dies (os._exit) after writing part of its span; dask retries the span on a
    fresh worker, which writes the same bytes at the same place: the file is complete."""
    from distributed import Client, LocalCluster

    path = write_recording(tmp_path / "r.h5", n=36000, seed=8)
    p = Pipeline.from_options(whiten="global", backend="cpu").fit(dspk.open_recording(path))
    ref = p.run(dspk.open_recording(path), tmp_path / "one.h5", chunk_s=0.1, progress=False)
    kill = KillAfter(6000, once_file=tmp_path / "killed-once")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        out = dd.run_split(p, path, tmp_path / "split.h5", client=c, spans=2, chunk_s=0.1,
                           on_chunk=kill)
    assert (tmp_path / "killed-once").exists()
    np.testing.assert_array_equal(traces(out), traces(ref))


def test_to_hdf5_a_failed_block_leaves_no_output(tmp_path, monkeypatch):
    import dask
    import dask.array as da

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(dd, "_write_block", boom)
    y = da.ones((4, 1000), dtype=np.float32, chunks=(4, 250))
    with dask.config.set(scheduler="sync"), pytest.raises(OSError, match="disk full"):
        dd.to_hdf5(y, tmp_path / "o.h5", fs=FS)
    assert not (tmp_path / "o.h5").exists() and not (tmp_path / "o.h5.partial").exists()


def test_dask_uses_only_the_public_api_of_the_pipeline():
    """dspk.dask reaches into no private member of the pipeline, its job or a recording (the
    issue's list: _run_steps, _detector, _save_metadata, _job_record, _block, _xp,
    _set_whitening, and the recordings' private reopening)."""
    import ast

    tree = ast.parse(Path(dd.__file__).read_text())
    private = sorted({node.attr for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                      and not node.attr.startswith("__")
                      and not (isinstance(node.value, ast.Name) and node.value.id == "self")})
    imported = sorted({alias.name for node in ast.walk(tree)
                       if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0]
                       in ("pipeline", "io") for alias in node.names
                       if alias.name.startswith("_")})
    assert private == [] and imported == []
