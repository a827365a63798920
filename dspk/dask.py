"""The pipeline on Dask: recordings as lazy ``dask.array``s, a fitted `Pipeline` as a graph of
blocks with halos, and many recordings fanned out over a ``dask.distributed`` cluster.

Nothing here computes on its own: every block runs the single-process code path
(`Pipeline.apply` on a NumPy or CuPy block, `Pipeline.fit` in a task, `dspk.io` for reading,
a `dspk.pipeline.Job` — `Pipeline.run`, `Pipeline.run_span`, `Job.run` — for writing,
`dspk.pipeline.outputs` for the output files), so a result is the single-process result.
Workers open recordings for themselves from `dspk.io.Recording.spec`; only public API of the
pipeline is used here.
Needs the optional extra ``dask`` (``pip install dspk[dask]``); dask-cuda's
``LocalCUDACluster`` is used for GPU workers when installed (one worker per visible GPU).

Examples
--------
>>> import numpy as np, dspk
>>> from dspk.dask import to_dask, apply
>>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
>>> rec = dspk.open_recording(x, fs=30000.0, layout="channels_samples")
>>> p = dspk.Pipeline.from_options(highpass=300, reference="mean", whiten=None, backend="cpu")
>>> y = apply(p, to_dask(rec, chunk=2000)).compute(scheduler="sync")
>>> bool(np.allclose(y, p.transform(x, fs=30000.0), atol=1e-4))
True
"""

from __future__ import annotations

import copy
import glob
import logging
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

try:
    import dask
    import dask.array as da
    from dask.array.utils import meta_from_array
except ImportError as exc:   # pragma: no cover - the extra is installed in the tests
    raise ImportError("dspk.dask needs dask: pip install 'dspk[dask]'") from exc

from .backend import resolve_backend
from .io import Recording, RecordingSpec, open_recording
from .io.rawio import RawDatasetWriter, create_contiguous, new_file, raw_offset
from .pipeline import Job, Pipeline, PipelineError, registry
from .pipeline.job import opened
from .pipeline.outputs import (LAYOUTS, HDF5Output, chunk_samples, formats, output_class,
                               read_files, write_traces)

__all__ = ["to_dask", "apply", "fit", "to_hdf5", "run_split", "preprocess_many", "cluster_client",
           "close_client"]

log = logging.getLogger("dspk.dask")

#: default block length of `to_dask`, in seconds of recording
CHUNK_S = 1.0
#: seconds to wait for a scheduler given by address before giving up
CONNECT_TIMEOUT_S = 10.0


class _Reopened:
    """A recording as a task carries it: its `Recording.spec` (a worker opens its own handle
    on first use, and keeps it for the tasks that carry this object; an in-memory recording
    travels whole)."""

    def __init__(self, recording: Recording) -> None:
        self.spec: RecordingSpec = recording.spec()
        self._open: Recording | None = None

    def __getstate__(self) -> dict:
        return {"spec": self.spec}             # never the handle

    def __setstate__(self, state: dict) -> None:
        self.spec, self._open = state["spec"], None

    def get(self) -> Recording:
        if self._open is None:
            self._open = self.spec.open()
        return self._open


def _read(source: _Reopened, start: int, stop: int) -> np.ndarray:
    return np.asarray(source.get().read(start, stop))


def to_dask(recording: Any, chunk: int | None = None, **open_options: Any) -> Any:
    """A recording as a lazy ``dask.array`` [channels, samples] of float32 µV.

    Parameters
    ----------
    recording : path or Recording
        Opened with `dspk.open_recording` (``open_options`` passed on); a recording read
        from a file is reopened by each worker from its path.
    chunk : int, optional
        Samples per block along time (default one second).
    **open_options
        `open_recording` keywords (``dataset``, ``fs``, ``geometry``, ...), for a path.

    Returns
    -------
    dask.array.Array
        Blocks [channels, chunk] read through `Recording.read` when computed (gzip chunks
        inflated in parallel as usual). Its ``fs`` attribute carries the sampling rate.

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np, dspk
    >>> from dspk.dask import to_dask
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rec.h5")
    >>> with h5py.File(path, "w") as f:             # int16 [samples, channels] with its rate
    ...     d = f.create_dataset("traces", data=np.ones((30000, 6), dtype=np.int16))
    ...     d.attrs["fs"] = 30000.0
    >>> arr = to_dask(path, chunk=10000)
    >>> arr.shape, arr.dtype, arr.chunks[1], arr.fs
    ((6, 30000), dtype('float32'), (10000, 10000, 10000), 30000.0)
    >>> float(arr[:, 9990:10010].sum().compute(scheduler="sync"))   # two blocks read
    120.0
    >>> tmp.cleanup()
    """
    if not isinstance(recording, (str, os.PathLike, Recording)):
        raise TypeError(f"recording: expected a path or a dspk Recording, got "
                        f"{type(recording).__name__}")
    # a recording opened here is closed when the graph is made: the blocks reopen it
    with opened(recording, **open_options) as rec:
        chunk = int(round(CHUNK_S * rec.fs)) if chunk is None else int(chunk)
        if chunk < 1:
            raise ValueError(f"chunk: expected a positive number of samples, got {chunk}")
        source = _Reopened(rec)
        blocks = []
        for s0 in range(0, rec.n_samples, chunk):
            s1 = min(rec.n_samples, s0 + chunk)
            blocks.append(da.from_delayed(dask.delayed(_read)(source, s0, s1),
                                          shape=(rec.n_channels, s1 - s0), dtype=np.float32))
        arr = da.concatenate(blocks, axis=1)
        arr.fs = rec.fs            # for apply(): the sampling rate travels with the array
    return arr


def apply(pipeline: Pipeline, darray: Any, fs: float | None = None) -> Any:
    """The fitted ``pipeline`` on a [channels, samples] ``dask.array``: each block with a halo
    of ``pipeline.margin(fs)`` samples on each side (``map_overlap``, zeros outside the
    array), through the single-process steps, trimmed back — the same samples as
    `Pipeline.transform` on the whole array. Blocks are computed on the pipeline's backend
    and returned as the type they came in: with a GPU pipeline, NumPy blocks are moved to the
    worker's GPU and back (as `Pipeline.run` does with what it reads), CuPy blocks stay
    there; a CPU pipeline computes each block with its own array module. Whitening must be
    fitted first (`Pipeline.fit`, or `fit` here).

    Parameters
    ----------
    pipeline : Pipeline
        Fitted if it whitens; without a Detect step.
    darray : dask.array.Array
        [channels, samples], rechunked so that every block holds all channels (and, when a
        block is shorter than the margin, into equal blocks at least as long as it).
    fs : float, optional
        Sampling rate in Hz (default: ``darray.fs`` from `to_dask`, else ``pipeline.fs``).

    Returns
    -------
    dask.array.Array
        Lazy, of ``pipeline.dtype``, with the ``fs`` attribute.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.dask import apply, to_dask
    >>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
    >>> rec = dspk.open_recording(x, fs=30000.0)
    >>> p = dspk.Pipeline.from_options(reference="median", whiten="global", backend="cpu")
    >>> p = p.fit(rec)
    >>> y = apply(p, to_dask(rec, chunk=3000))
    >>> y.shape, y.dtype
    ((4, 9000), dtype('float32'))
    >>> bool(np.allclose(y.compute(scheduler="threads"), p.transform(x), atol=1e-4))
    True
    """
    fs = fs or getattr(darray, "fs", None) or pipeline.fs
    if fs is None:
        raise PipelineError("fs: unknown (pass fs= or use an array from to_dask)")
    if getattr(darray, "ndim", None) != 2:
        raise ValueError(f"darray: expected a 2-D [channels, samples] dask array, got "
                         f"{getattr(darray, 'shape', None)}")
    if pipeline.sinks:
        raise PipelineError("apply: the Detect step writes spikes, not traces; run "
                            "preprocess_many (Pipeline.run) for detection")
    if pipeline.steps and getattr(pipeline.steps[0], "front_end", False):
        raise PipelineError(f"apply: {pipeline.steps[0].describe()} changes the number of "
                            f"samples, which map_overlap keeps; run preprocess_many "
                            f"(Pipeline.run) or run_split")
    if not pipeline.is_fitted:
        raise PipelineError("the pipeline's whitening is not fitted (Pipeline.fit or "
                            "dspk.dask.fit first)")
    darray = darray.rechunk({0: -1})         # all channels in each block (spatial steps)
    m = pipeline.margin(fs)
    n = darray.shape[1]
    chunks = list(darray.chunks[1])
    if len(chunks) > 1 and m > min(chunks):
        # map_overlap takes a halo from the neighbouring blocks only: every block at least m
        # long (the last, shorter one merged into the one before), so that dask does not
        # rechunk on its own and the blocks' starts below stay right
        size = max(m, max(chunks))
        chunks = [size] * (n // size) + ([n % size] if n % size else [])
        if len(chunks) > 1 and chunks[-1] < m:
            chunks[-2:] = [chunks[-2] + chunks[-1]]
        darray = darray.rechunk({1: tuple(chunks)})
    starts = np.concatenate([[0], np.cumsum(darray.chunks[1])])
    gpu = resolve_backend(pipeline.backend) == "gpu"

    def block(x: Any, block_info: Any = None) -> Any:
        i = block_info[None]["chunk-location"][1]
        host = isinstance(x, np.ndarray)
        if gpu and host:      # a GPU pipeline computes host blocks on its device, as run() does
            import cupy  # noqa: PLC0415 (GPU pipelines only)

            y = cupy.asarray(x).astype(pipeline.dtype, copy=False)
        else:
            y = x.astype(pipeline.dtype, copy=True)
        y = pipeline.apply(y, fs, int(starts[i]) - m, n)
        return y.get() if host and not isinstance(y, np.ndarray) else y

    out = darray.map_overlap(block, depth={0: 0, 1: m}, boundary=0, dtype=pipeline.dtype,
                             meta=meta_from_array(darray, dtype=pipeline.dtype))
    out.fs = fs
    return out


def _write_block(block: np.ndarray, path: str, offset: int, shape: tuple, dtype: str,
                 starts: np.ndarray, layout: str, block_info: Any = None) -> np.ndarray:
    """One block [channels, samples] of traces into the output's samples, in its layout
    (`dspk.pipeline.outputs.write_traces` through os.pwrite; no HDF5 in the worker)."""
    s0 = int(starts[block_info[None]["chunk-location"][1]])
    host = np.asarray(getattr(block, "get", lambda: block)(), dtype=dtype)
    writer = RawDatasetWriter(path, offset=offset, shape=shape, dtype=dtype)
    try:
        write_traces(writer, None, s0, s0 + host.shape[1], host, layout, transposed=False)
    finally:
        writer.close()
    return np.zeros((1, 1), dtype=np.int8)


def to_hdf5(darray: Any, out_path: str, fs: float | None = None,
            layout: str = "samples_channels", dtype: Any = np.float32,
            overwrite: bool = False, client: Any = None) -> Path:
    """Write a [channels, samples] dask array (`apply`'s result, say) as the ``/traces`` of a
    new HDF5 file, every block by its own task: the file is created (contiguous, allocated)
    first, then each task writes its block's bytes at their place with ``os.pwrite`` — blocks
    are disjoint, so workers write at once with no lock and no HDF5 in the workers — and the
    file, written to ``OUT.partial``, gets its name when every block is in.

    Parameters
    ----------
    darray : dask.array.Array
        [channels, samples], NumPy or CuPy blocks (rechunked to all channels per block).
    out_path : str
        The output; refused if it exists unless ``overwrite``.
    fs : float, optional
        Stored as the ``fs`` attribute of the file and of ``/traces`` (default:
        ``darray.fs``; none is stored without either).
    layout : {"samples_channels", "channels_samples"}
        The layout of ``/traces`` (also stored as its ``layout`` attribute).
    dtype : float32 or float64
        The stored sample type.
    overwrite : bool
        Replace an existing output.
    client : dask.distributed.Client, optional
        Where the blocks are computed and written (default: dask's default scheduler).

    Returns
    -------
    pathlib.Path
        The completed output.

    Examples
    --------
    >>> import os, tempfile
    >>> import dask.array as da, numpy as np, dspk
    >>> from dspk.dask import to_hdf5
    >>> tmp = tempfile.TemporaryDirectory()
    >>> y = da.arange(24, dtype=np.float32, chunks=8).reshape(2, 12)    # [channels, samples]
    >>> out = to_hdf5(y, os.path.join(tmp.name, "out.h5"), fs=1000.0)
    >>> with dspk.open_recording(out) as rec:      # fs and layout from the attributes
    ...     rec.fs, bool(np.array_equal(rec.read(), y.compute()))
    (1000.0, True)
    >>> tmp.cleanup()
    """
    # the checks of Pipeline.run's output: not an existing file unless overwrite, a folder
    # that exists and is writable
    output = HDF5Output(out_path, overwrite=overwrite)
    output.check(None)
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'samples_channels' or 'channels_samples', got "
                         f"{layout!r}")
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype: expected float32 or float64, got {dtype}")
    c, n = darray.shape
    shape = (n, c) if layout == "samples_channels" else (c, n)
    output.discard()
    partial = output.files.partial
    # a failed block: no file that could pass for an output
    with output.writing():
        with new_file(partial) as f:
            dset = create_contiguous(f, "traces", shape, dtype)
            dset.attrs["layout"] = layout
            fs = fs or getattr(darray, "fs", None)
            if fs is not None:
                dset.attrs["fs"] = fs
                f.attrs["fs"] = fs
            offset = raw_offset(dset)
        darray = darray.rechunk({0: -1})
        starts = np.concatenate([[0], np.cumsum(darray.chunks[1])])
        done = darray.map_blocks(_write_block, str(partial), offset, shape, dtype.str, starts,
                                 layout, dtype=np.int8, chunks=(1, 1))
        if client is not None:
            client.compute(done).result()
        else:
            dask.compute(done)
    return output.out


def _span_job(pipeline: Pipeline, source: _Reopened, path: str, offset: int, s0: int,
              s1: int, chunk_s: float, dtype: str, scale: float, layout: str,
              on_chunk: Callable[[int], Any] | None) -> dict:
    """One span of a split job, in a worker: `Pipeline.run_span` into the prepared file."""
    return pipeline.run_span(source.get(), path, offset, s0, s1, chunk_s=chunk_s,
                             output_dtype=dtype, scale=scale, layout=layout,
                             on_chunk=on_chunk)


def run_split(pipeline: Pipeline, recording: Any, out_path: str, client: Any = None,
              spans: int | None = None, chunk_s: float = 1.0, output_dtype: Any = np.float32,
              output_scale: float | None = None, layout: str = "samples_channels",
              overwrite: bool = False, on_chunk: Callable[[int], Any] | None = None,
              **open_options: Any) -> Path:
    """One long recording split over the workers in spans of whole chunks, each span run by a
    worker with `Pipeline.run`'s own chunk loop (reads ahead, computes on the worker's GPU or
    CPU, writes behind) into one prepared output — the bytes `Pipeline.run` writes.

    The whitening is fitted first (`fit`, the fit chunks as tasks) unless ``pipeline`` is
    fitted; the output (contiguous ``/traces`` with `Pipeline.run`'s metadata) is allocated as
    ``OUT.partial``, every span writes its samples at their place with ``os.pwrite`` (disjoint:
    no lock, no HDF5 in the workers), and the file gets its name when every span is in. A
    failed span leaves no file under ``out_path``.

    Parameters
    ----------
    pipeline : Pipeline
        Without a Detect step (spikes are written by `preprocess_many`).
    recording : path or Recording
        Opened with `dspk.open_recording` (``open_options`` passed on) when a path.
    out_path : str
        The output file; refused if it exists unless ``overwrite``.
    client : dask.distributed.Client, optional
        Default: dask's threaded scheduler in this process (not a global default client: the
        spans run where the caller says).
    spans : int, optional
        Number of spans (default: one per worker of ``client``, else 1).
    chunk_s, output_dtype, output_scale, layout, overwrite :
        As for `Pipeline.run` (uncompressed output).
    on_chunk : callable, optional
        ``on_chunk(samples_done)`` in the worker after each chunk of its span is written,
        with the span's samples done so far (`Pipeline.run_span`); pickled to the workers
        (a module-level function or an instance of a module-level class).
    **open_options
        `open_recording` keywords, also used by the workers that reopen the file.

    Returns
    -------
    pathlib.Path
        The completed output.

    Examples
    --------
    Three spans on the threaded scheduler give the bytes of the single-process job:

    >>> import os, tempfile
    >>> import h5py, numpy as np, dspk
    >>> from dspk.dask import run_split
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rec.h5")
    >>> rng = np.random.default_rng(0)
    >>> with h5py.File(path, "w") as f:
    ...     d = f.create_dataset("traces", data=rng.integers(-200, 200, (30000, 6), np.int16))
    ...     d.attrs["fs"] = 30000.0
    ...     d.attrs["geometry"] = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    >>> p = dspk.Pipeline.from_options(whiten="local", n_neighbors=3, backend="cpu")
    >>> split = run_split(p, path, os.path.join(tmp.name, "split.h5"), spans=3, chunk_s=0.1)
    >>> whole = p.run(path, os.path.join(tmp.name, "whole.h5"), chunk_s=0.1, progress=False)
    >>> with h5py.File(split, "r") as a, h5py.File(whole, "r") as b:
    ...     bool(np.array_equal(a["traces"][:], b["traces"][:]))
    True
    >>> tmp.cleanup()
    """
    with opened(recording, **open_options) as rec:
        return _run_split(pipeline, rec, out_path, client, spans, chunk_s, output_dtype,
                          output_scale, layout, overwrite, on_chunk)


def _run_split(pipeline: Pipeline, rec: Recording, out_path: str, client: Any,
               spans: int | None, chunk_s: float, output_dtype: Any,
               output_scale: float | None, layout: str, overwrite: bool,
               on_chunk: Callable[[int], Any] | None) -> Path:
    if pipeline.sinks:
        raise PipelineError("run_split: the Detect step writes spikes; use preprocess_many")
    # every check of Pipeline.run's job (output, options, what the steps need) before work
    job = Job(pipeline, rec, out_path, chunk_s=chunk_s, output_dtype=output_dtype,
              output_scale=output_scale, layout=layout, overwrite=overwrite)
    if not pipeline.is_fitted:
        # without a client, the fit's task runs where the spans will: in this process's
        # threads, not on a global default client
        with dask.config.set(scheduler="threads") if client is None else nullcontext():
            fit(pipeline, rec, client=client)
    n, chunk = job.rec.n_samples, job.chunk      # (the job's: a Decimate's rate)
    if spans is None:
        spans = len(client.scheduler_info()["workers"]) if client is not None else 1
    n_chunks = -(-n // chunk)
    spans = max(1, min(int(spans), n_chunks))
    bounds = [min(n, (i * n_chunks // spans) * chunk) for i in range(spans + 1)]
    t0 = time.perf_counter()
    marks, timings, tasks = [], [], []

    def in_spans(output: Any) -> None:
        """The chunks written by the workers, each span by `Pipeline.run_span` into the
        output begun with the metadata and fitted state of Pipeline.run's."""
        source = _Reopened(rec)
        tasks.extend(dask.delayed(_span_job)(pipeline, source, str(output.files.partial),
                                             output.offset, a, b, chunk_s, job.out_dtype.str,
                                             job.scale, layout, on_chunk)
                     for a, b in zip(bounds[:-1], bounds[1:]) if b > a)
        marks.append(time.perf_counter())
        timings.extend(client.gather(client.compute(tasks)) if client is not None else
                       dask.compute(*tasks, scheduler="threads"))
        marks.append(time.perf_counter())

    # a failed span leaves no file that could pass for an output (the job's lifecycle)
    out = job.run(progress=False, elsewhere=in_spans)
    t1, t2 = marks
    log.info("run_split %s: output prepared in %.3f s, %d span(s) in %.3f s", out.name,
             t1 - t0, len(tasks), t2 - t1)
    for t in timings:
        log.info("run_split %s: span of %d samples in %.3f s (setup %.3f, read %.3f, compute "
                 "%.3f, write %.3f)", out.name, t["samples"], t["wall_s"], t["setup_s"],
                 t["read_s"], t["compute_s"], t["write_s"])
    return out


def _fit_task(pipeline: Pipeline, source: _Reopened, seed: int) -> tuple:
    """`Pipeline.fit` of a copy of ``pipeline``, in a worker: (fitted states, rate)."""
    fitted = Pipeline(pipeline.steps, backend=pipeline.backend, dtype=pipeline.dtype,
                      states=[dict(st) for st in pipeline.states])
    fitted.fit(source.get(), seed=seed)
    return fitted.states, fitted.fs


def fit(pipeline: Pipeline, recording: Any, client: Any = None, seed: int = 0,
        **open_options: Any) -> Pipeline:
    """`Pipeline.fit` as a task (on ``client``'s cluster, or dask's default scheduler): the
    worker reopens the recording and runs the one fit pass of `Pipeline.fit` (each fit chunk
    read and filtered once, several read at once), so the fitted state is that of
    `Pipeline.fit`, bit for bit, computed where the pipeline's backend is (a GPU worker for
    a GPU pipeline).

    Parameters
    ----------
    pipeline : Pipeline
        Fitted in place and returned.
    recording : path or Recording
        Opened with `dspk.open_recording` (``open_options`` passed on) when a path; a file
        is reopened by the worker.
    client : dask.distributed.Client, optional
        Where the fit runs (default: dask's default scheduler).
    seed : int
        Seeds the fit chunks' positions, as for `Pipeline.fit` (its default chunk count and
        length).
    **open_options
        `open_recording` keywords.

    Returns
    -------
    Pipeline
        ``pipeline``, fitted.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.dask import fit
    >>> x = np.random.default_rng(0).standard_normal((4, 30000)).astype(np.float32)
    >>> rec = dspk.open_recording(x, fs=30000.0)
    >>> tasks = fit(dspk.Pipeline.from_options(whiten="global", backend="cpu"), rec)
    >>> alone = dspk.Pipeline.from_options(whiten="global", backend="cpu").fit(rec)
    >>> bool(np.array_equal(tasks.states[-1]["W"], alone.states[-1]["W"]))   # bit for bit
    True
    """
    with opened(recording, **open_options) as rec:
        pipeline.check(rec)             # refused here, before a task is sent
        task = dask.delayed(_fit_task)(pipeline, _Reopened(rec), seed)
        states, fs = client.compute(task).result() if client is not None else task.compute()
    for k, st in enumerate(states):
        pipeline.set_fitted(k, st)
    pipeline.fs = fs
    return pipeline


# -- many recordings ----------------------------------------------------------------------------
def cluster_client(scheduler: str | None = None, workers: int | None = None,
                   gpu: bool = False, timeout: float = CONNECT_TIMEOUT_S) -> Any:
    """A ``dask.distributed.Client``: connected to ``scheduler`` (an address; a clear error
    within ``timeout`` seconds if it cannot be reached), else a local cluster — with dask-cuda
    and ``gpu``, one worker per visible GPU (each bound to its device), otherwise ``workers``
    CPU worker processes (default: one per core).

    Parameters
    ----------
    scheduler : str, optional
        A scheduler's address (``"tcp://host:8786"``); None starts a local cluster.
    workers : int, optional
        CPU worker processes of a local cluster, one thread each (default: one per core).
    gpu : bool
        A LocalCUDACluster when dask-cuda is installed (otherwise a warning, and CPU workers).
    timeout : float
        Seconds to wait for ``scheduler``.

    Returns
    -------
    distributed.Client
        Close it (and its local cluster) with `close_client`.

    Raises
    ------
    ConnectionError
        ``scheduler`` could not be reached within ``timeout``.

    Examples
    --------
    Not run here (it starts worker processes):

    >>> from dspk.dask import close_client, cluster_client
    >>> client = cluster_client(workers=2)                      # doctest: +SKIP
    >>> len(client.scheduler_info()["workers"])                 # doctest: +SKIP
    2
    >>> close_client(client)                                    # doctest: +SKIP
    """
    try:
        from distributed import Client, LocalCluster  # noqa: PLC0415
    except ImportError as exc:   # pragma: no cover
        raise ImportError("dspk.dask needs distributed: pip install 'dspk[dask]'") from exc
    if scheduler is not None:
        try:
            return Client(scheduler, timeout=f"{timeout}s")
        except (OSError, TimeoutError) as exc:
            raise ConnectionError(f"scheduler: cannot reach {scheduler} within {timeout:g} s "
                                  f"({exc})") from exc
    if gpu:
        try:
            from dask_cuda import LocalCUDACluster  # noqa: PLC0415
        except ImportError:
            log.warning("dask-cuda is not installed: CPU worker processes instead")
        else:
            # one worker per visible GPU, CUDA_VISIBLE_DEVICES rotated so each worker's
            # device 0 is its own GPU; the parent's environment (NCCL settings) is inherited
            return Client(LocalCUDACluster(threads_per_worker=1, dashboard_address=":0"))
    return Client(LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                               processes=True, dashboard_address=":0"))


#: preprocess_many's keywords, by where they go (the pipeline's: `pipeline_keys`)
OPEN_KEYS = {"dataset", "fs", "layout", "gain_to_uv", "offset_to_uv", "geometry", "n_channels",
             "dtype", "header_bytes", "allow_external_links"}
RUN_KEYS = {"chunk_s", "output_dtype", "output_scale", "layout_out", "compression",
            "overwrite", "on_chunk", "format", "inputs", "subject"}
#: each format's output name for a recording's stem (a Kilosort output is a folder)
OUTPUT_SUFFIX = {name: output_class(name).suffix for name in formats(listed=True)}


def pipeline_keys() -> set:
    """preprocess_many's pipeline keywords: every option of the stage registry
    (`dspk.pipeline.registry.options`, steps registered by your code included), ``backend``,
    and ``dtype_processing`` for the processing dtype (``dtype`` is the raw files').

    Examples
    --------
    >>> from dspk.dask import pipeline_keys
    >>> sorted(pipeline_keys())[:4]
    ['artifact_mode', 'artifact_window', 'artifacts', 'backend']
    """
    return {o.name for o in registry.options()} | {"backend", "dtype_processing"}


def _pipeline(pipe_options: dict) -> Pipeline:
    opts = dict(pipe_options)
    if "dtype_processing" in opts:
        opts["dtype"] = opts.pop("dtype_processing")
    return Pipeline.from_options(**opts)


def _job(path: str, out: str, open_options: dict, pipeline: Pipeline,
         run_options: dict) -> str:
    """One recording, in a worker: open, fit, run — resuming the partial output that a
    killed worker left (`Pipeline.run`'s resume), so a retried job ends with the same file."""
    run = dict(run_options)
    if "layout_out" in run:
        run["layout"] = run.pop("layout_out")
    # an output written in one go (NWB) is started again by a retried job
    resume = output_class(run.get("format", "hdf5")).resumes
    with open_recording(path, **open_options) as rec:
        return str(pipeline.run(rec, out, resume=resume, progress=False, **run))


def _tune_job(path: str, open_options: dict, pipeline: Pipeline, chunk_s: float) -> tuple:
    """`Pipeline.tune` for one recording, in a worker: its choices land in the shared tuner
    cache before the jobs start. First-use decisions (``thorough=False``): a thorough one
    would replace choices other processes sharing the cache may hold (their bits would
    differ from the workers'). Returns the fit it made, (states, fs): that recording's job
    starts from it rather than fitting again (a motion pass reads the whole recording)."""
    with open_recording(path, **open_options) as rec:
        pipeline.tune(rec, chunk_s, thorough=False)
    return pipeline.states, pipeline.fs


def _fitted(pipeline: Pipeline, fit: tuple | None) -> Pipeline:
    """The pipeline, or a copy holding ``fit`` (`_tune_job`'s states and rate)."""
    if fit is None:
        return pipeline
    done = copy.deepcopy(pipeline)
    done.states, done.fs = [dict(st) for st in fit[0]], fit[1]
    return done


def _shape_class(path: str, open_options: dict, chunk_s: float) -> tuple | None:
    """(channels, sampling rate, size class of the last chunk) of a recording: recordings of
    one class need the same tuner decisions (None if it cannot be opened: its job reports
    why)."""
    try:
        with open_recording(path, **open_options) as rec:
            chunk = chunk_samples(chunk_s, rec.fs)
            last = rec.n_samples - (rec.n_samples - 1) // chunk * chunk
            return rec.n_channels, rec.fs, min(rec.n_samples, chunk), int(last).bit_length()
    except Exception:   # reported by its own job
        return None


def close_client(client: Any) -> None:
    """Close a client and the local cluster it started, if any.

    Parameters
    ----------
    client : distributed.Client
        From `cluster_client`, or any client: one made from a cluster object
        (``Client(cluster)``) closes that cluster too; one connected to a scheduler's address
        leaves the scheduler running.

    Examples
    --------
    Not run here (the client starts worker processes):

    >>> from dspk.dask import close_client, cluster_client
    >>> client = cluster_client(workers=2)                      # doctest: +SKIP
    >>> close_client(client)                                    # doctest: +SKIP
    >>> client.status                                           # doctest: +SKIP
    'closed'
    """
    cluster = getattr(client, "cluster", None)
    client.close()
    if cluster is not None:
        cluster.close()


def preprocess_many(paths: Sequence[str] | str, out_dir: str, client: Any = None,
                    retries: int = 0, tune: bool = True, **options: Any) -> dict:
    """Preprocess many recordings in parallel, one output per recording.

    Parameters
    ----------
    paths : glob pattern or sequence of paths
    out_dir : str
        Outputs ``<out_dir>/<recording stem>.h5`` (``format="kilosort"``: the folder
        ``<out_dir>/<recording stem>``; ``"nwb"``: ``<stem>.nwb``), each written atomically by
        `Pipeline.run` (a job killed with its worker is retried and resumes its partial
        output; an NWB output is started again).
    client : dask.distributed.Client or callable, optional
        Default: `cluster_client()` (local CPU worker processes), closed at the end. A
        callable (``lambda: cluster_client(workers=4)``) is called once every check has
        passed — no cluster starts for a call refused — and its client is closed at the end
        too.
    retries : int
        Attempts beyond the first for a job that raised (a job whose worker died is
        rescheduled by the scheduler anyway, and resumes its partial file).
    tune : bool
        Take the tuner's decisions first, once per kind of recording (`Pipeline.tune` in a
        worker), so that every worker sharing the tuner's cache makes the same choices. False
        when the cache already holds them (after ``dspk tune`` on one of the recordings).
    **options
        `open_recording` keywords (dataset, fs, n_channels, ...), `Pipeline.from_options`
        keywords (highpass, bandpass, reference, whiten, n_neighbors, backend, detect, ...;
        ``dtype_processing`` for its dtype) and `Pipeline.run` keywords (chunk_s,
        output_dtype, output_scale, compression, overwrite, format; ``layout_out`` for its
        layout; ``subject``, every NWB output's subject; ``inputs``, the other files the
        jobs read — ``{"--probe": "probe.json"}`` — that no output may be; ``on_chunk``,
        called in the worker after each committed chunk, pickled to it). A ``geometry``
        given as a probe file is one of the files the jobs read too.

    Returns
    -------
    dict
        path -> output path, or the exception that stopped that recording (the others are
        not stopped by it).

    Raises
    ------
    FileNotFoundError
        A pattern that matches no file.
    ValueError
        No paths, or two recordings with the same stem (one output name).
    TypeError
        An unknown keyword (checked before any cluster starts).
    PipelineError
        A ``format`` with options it cannot honour (compression, [channels, samples], a
        detecting pipeline), or an output that would be one of the files the jobs read
        (``inputs``, a probe file given as ``geometry``; with ``overwrite`` or without:
        `dspk.pipeline.outputs.Output.check_read`), before any cluster starts.

    Examples
    --------
    Two recordings (the job itself is not run here: it starts worker processes):

    >>> import os, tempfile
    >>> import h5py, numpy as np
    >>> from dspk.dask import preprocess_many
    >>> tmp = tempfile.TemporaryDirectory()
    >>> for name in ("a", "b"):
    ...     with h5py.File(os.path.join(tmp.name, f"{name}.h5"), "w") as f:
    ...         d = f.create_dataset("traces", data=np.zeros((30000, 6), dtype=np.int16))
    ...         d.attrs["fs"] = 30000.0
    ...         d.attrs["geometry"] = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    >>> pattern, out = os.path.join(tmp.name, "*.h5"), os.path.join(tmp.name, "out")
    >>> results = preprocess_many(pattern, out, whiten="local", n_neighbors=3)  # doctest: +SKIP
    >>> sorted(os.path.basename(str(v)) for v in results.values())      # doctest: +SKIP
    ['a.h5', 'b.h5']

    Bad keywords are refused before a cluster starts:

    >>> preprocess_many(pattern, out, whitening="local")
    Traceback (most recent call last):
    ...
    TypeError: preprocess_many: unknown keyword(s) ['whitening']
    >>> tmp.cleanup()
    """
    if isinstance(paths, (str, os.PathLike)):
        pattern = os.fspath(paths)
        paths = sorted(glob.glob(pattern))
        if not paths:
            raise FileNotFoundError(f"paths: the pattern {pattern!r} matches no file")
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("paths: no recordings given")
    stems = [Path(p).stem for p in paths]
    if len(set(stems)) != len(stems):
        raise ValueError(f"paths: two recordings would write the same output name: "
                         f"{sorted(s for s in set(stems) if stems.count(s) > 1)}")
    out = Path(out_dir)
    pipe_keys = pipeline_keys()
    unknown = set(options) - OPEN_KEYS - pipe_keys - RUN_KEYS
    if unknown:
        raise TypeError(f"preprocess_many: unknown keyword(s) {sorted(unknown)}")
    open_options = {k: v for k, v in options.items() if k in OPEN_KEYS}
    run_options = {k: v for k, v in options.items() if k in RUN_KEYS}
    # the files every job reads besides its recording (a probe file, a file named by an
    # option): no output is ever one of them, with overwrite or without — refused here for
    # every recording, before a cluster starts, by the check each job makes again (its
    # recording's own files are checked there, where it is opened)
    inputs = read_files(run_options.get("inputs"))
    if isinstance(open_options.get("geometry"), (str, os.PathLike)):
        inputs.setdefault("geometry", []).append(open_options["geometry"])
    run_options["inputs"] = inputs
    kind = output_class(run_options.get("format", "hdf5"))
    outputs = {p: str(out / f"{Path(p).stem}{kind.suffix}") for p in paths}
    for path in outputs.values():
        kind(path, overwrite=bool(run_options.get("overwrite", False))).check_read(inputs)
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK):
        raise PermissionError(f"out_dir: {out} is not writable")
    # the pipeline is made here, once (a bad option is refused before a cluster starts), and
    # sent to the workers: its stages travel with it, those of your own registered steps too
    pipeline = _pipeline({k: v for k, v in options.items() if k in pipe_keys})
    kind.check_options(pipeline, run_options.get("layout_out", "samples_channels"),
                       run_options.get("compression"), False)
    own = client is None or not hasattr(client, "submit")     # (a callable making one)
    if own:
        client = cluster_client(gpu=resolve_backend(pipeline.backend) == "gpu") \
            if client is None else client()
    try:
        # the tuner's decisions first, once per kind of recording, so that every worker (on a
        # machine sharing the tuner's cache) makes the same choices: outputs identical to a
        # single process's, and a retried job resumes rather than refits differently
        chunk_s = float(run_options.get("chunk_s", 1.0))
        first: dict = {}
        for p in paths if tune else ():
            key = _shape_class(p, open_options, chunk_s)
            if key is not None:
                first.setdefault(key, p)
        fits: dict = {}
        for p in first.values() if tune else ():
            try:
                fits[p] = client.submit(_tune_job, p, open_options, pipeline, chunk_s,
                                        pure=False).result()
            except Exception as exc:   # its own job will report it
                log.warning("%s: tuning failed: %s", p, exc)
        futures = {p: client.submit(_job, p, outputs[p], open_options,
                                    _fitted(pipeline, fits.get(p)), run_options,
                                    retries=retries, pure=False)
                   for p in paths}
        results: dict = {}
        for p, fut in futures.items():
            try:
                results[p] = fut.result()
            except Exception as exc:   # one recording's failure is reported, not raised
                log.error("%s: %s: %s", p, type(exc).__name__, exc)
                results[p] = exc
        return results
    finally:
        if own:
            close_client(client)
