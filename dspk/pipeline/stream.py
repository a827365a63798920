"""The chunk loop of a job (`ChunkStream`): the next chunks read ahead in threads with their
halos (`read_block`; on the GPU through pinned buffers, `Staging`), each computed on the
caller's thread and written behind by one writer thread, in order; and the output blocks as
written (`output_block`, `quantize`).

Examples
--------
>>> import numpy as np, dspk
>>> from dspk.pipeline.stream import read_block
>>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
>>> a, x = read_block(rec, 0, 100, 10)           # clipped to the recording
>>> a, x.shape
(0, (2, 110))
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..backend import (array_module, free_device_memory, out_of_memory, pinned_empty,
                       to_numpy)
from ..io import Recording, to_uv

__all__ = ["READ_AHEAD", "READ_AHEAD_COMPRESSED", "ahead", "read_ahead", "read_block", "quantize",
           "output_block", "raw_transfer", "device_read_ahead", "Staging", "ChunkStream",
           "GpuMemory", "out_of_memory", "GPU_BYTES_PER_SAMPLE", "GPU_MEMORY_SHARE",
           "MIN_GPU_CHUNK_S"]

log = logging.getLogger("dspk.pipeline")

#: device bytes a chunk takes per channel and sample, its halo included (the raw block, its
#: float copy, the filtered, referenced and whitened traces, the detector's buffers and the
#: output block, with room for the libraries' workspaces): an estimate on the safe side
GPU_BYTES_PER_SAMPLE = 64
#: the share of the free device memory (or of ``gpu_memory``) a job's chunks are sized to
GPU_MEMORY_SHARE = 0.5
#: the shortest chunk, in seconds, that a job whose device runs out of memory goes down to
#: (never shorter than the pipeline's halo)
MIN_GPU_CHUNK_S = 0.02

#: chunks read ahead of the one being computed; more for compressed sources, whose chunks
#: are inflated in a thread pool (a 1-s read holds only a few chunks: several reads in flight
#: keep more cores busy; measured on the H200 host, 16 cores, gzip: 2 ahead gave 19x real time)
READ_AHEAD, READ_AHEAD_COMPRESSED = 2, 4


def ahead(rec: Recording) -> int:
    """Chunks a job reads ahead of the one it computes (more for a compressed source).

    Parameters
    ----------
    rec : Recording

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.stream import ahead
    >>> ahead(dspk.open_recording(np.zeros((3000, 2), np.int16), fs=3e4))
    2
    """
    return READ_AHEAD_COMPRESSED if getattr(rec, "compressed", False) else READ_AHEAD


def read_ahead(rec: Recording, spans: Sequence[tuple[int, int]], m: int) -> Iterator[tuple]:
    """`read_block` of each span in turn, the next `ahead` (rec) ones read in threads while
    the caller computes this one. Reads are CPU work too (the transpose and the µV scaling):
    more of them in flight than the caller can take would only compete with its computation
    (measured on 2 cores: the fit's 16 reads submitted at once cost it 2.4 s of thread time
    against 0.7 s in turn).

    Parameters
    ----------
    rec : Recording
    spans : sequence of (s0, s1)
    m : int
        Samples of context each side (see `read_block`).

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.stream import read_ahead
    >>> rec = dspk.open_recording(np.arange(20, dtype=np.int16).reshape(10, 2), fs=3e4)
    >>> [(a, x.shape) for a, x in read_ahead(rec, [(0, 4), (4, 10)], 1)]
    [(0, (2, 5)), (3, (2, 7))]
    """
    depth = ahead(rec)
    with ThreadPoolExecutor(depth) as pool:
        queue = deque(pool.submit(read_block, rec, s0, s1, m) for s0, s1 in spans[:depth])
        for k in range(len(spans)):
            raw = queue.popleft().result()
            if k + depth < len(spans):
                queue.append(pool.submit(read_block, rec, *spans[k + depth], m))
            yield raw


def raw_transfer(rec: Recording, xp: Any) -> bool:
    """Whether a job moves the raw samples to the device (integer sources on the GPU: half of
    float32's bytes for int16, transposed and scaled there; float sources take the checked,
    scaled read).

    Parameters
    ----------
    rec : Recording
    xp : module
        The pipeline's array module.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.stream import raw_transfer
    >>> raw_transfer(dspk.open_recording(np.zeros((3000, 2), np.int16), fs=3e4), np)
    False
    """
    return xp is not np and rec.dtype.kind in "iu"


def device_read_ahead(rec: Recording, spans: Sequence[tuple[int, int]], m: int,
                      xp: Any) -> Iterator[tuple]:
    """`read_ahead`'s (first sample, µV block) for each span, the blocks of an integer source
    on the GPU read as stored into pinned buffers, moved, then transposed and scaled on the
    device (`Staging`, as a job's chunks: the same bits as `Recording.read`'s) — a fit's
    chunks and a fit pass over the whole recording (a drift estimate) go this way. Others:
    `read_ahead` as is.

    Parameters
    ----------
    rec : Recording
    spans : sequence of (s0, s1)
    m : int
        Samples of context each side.
    xp : module
        The pipeline's array module.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.stream import device_read_ahead
    >>> rec = dspk.open_recording(np.arange(20, dtype=np.int16).reshape(10, 2), fs=3e4)
    >>> [(a, x.shape) for a, x in device_read_ahead(rec, [(0, 4), (4, 10)], 1, np)]
    [(0, (2, 5)), (3, (2, 7))]
    """
    if not raw_transfer(rec, xp) or not spans:
        yield from read_ahead(rec, spans, m)
        return
    depth = ahead(rec)
    width = max(s1 - s0 for s0, s1 in spans) + 2 * m
    # the slots: the reads in flight, the block being moved, and one spare
    staging = Staging(rec, width, depth + 2)
    with ThreadPoolExecutor(depth) as pool:
        queue = deque(pool.submit(staging.read, k, s0, s1, m)
                      for k, (s0, s1) in enumerate(spans[:depth]))
        for k in range(len(spans)):
            raw = queue.popleft().result()
            block = staging.to_device(raw, xp)      # copied before its slot is read into again
            if k + depth < len(spans):
                queue.append(pool.submit(staging.read, k + depth, *spans[k + depth], m))
            yield block


def read_block(rec: Recording, s0: int, s1: int, m: int) -> tuple:
    """(first sample read, µV block [channels, b - a]) for [s0 - m, s1 + m) clipped to the
    recording.

    Parameters
    ----------
    rec : Recording
    s0, s1 : int
        The chunk.
    m : int
        Samples of context on each side.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.stream import read_block
    >>> rec = dspk.open_recording(np.zeros((3000, 2), np.int16), fs=30000.0)
    >>> a, x = read_block(rec, 0, 100, 10)
    >>> a, x.shape
    (0, (2, 110))
    """
    a, b = max(0, s0 - m), min(rec.n_samples, s1 + m)
    return a, rec.read(a, b)


def quantize(xp: Any, y: Any, scale: float) -> Any:
    """int16 output samples: round(y / scale), clipped (the same operations on either
    backend, so the GPU and the CPU write the same integers).

    Parameters
    ----------
    xp : module
        numpy or cupy.
    y : array
    scale : float

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline.stream import quantize
    >>> quantize(np, np.array([0.014, 1e9]), 0.01)
    array([    1, 32767], dtype=int16)
    """
    return xp.clip(xp.rint(y / scale), -32768, 32767).astype(np.int16)


def output_block(i: int, y: Any, staging: "Staging | None", out_dtype: Any,
                 scale: float) -> np.ndarray:
    """Chunk i's traces y [channels, samples] as written: in pinned buffer i, transposed to
    the file's layout and quantized on the device, with staging; else a host array
    [channels, samples] in the output dtype.

    Parameters
    ----------
    i : int
        The chunk's index in the job (the pinned buffers rotate).
    y : array
    staging : Staging or None
    out_dtype : float32 or int16
    scale : float
        For int16 output.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline.stream import output_block
    >>> output_block(0, np.array([[0.5, 2.0]], np.float32), None, np.int16, 0.1)
    array([[ 5, 20]], dtype=int16)
    """
    if staging is not None:
        return staging.to_host(i, y, scale)
    y = to_numpy(y)
    if out_dtype == np.int16:
        return quantize(np, y, scale)
    return np.ascontiguousarray(y)


class Staging:
    """Pinned host buffers for the GPU job: raw input blocks as stored (read into directly,
    ``slots`` of them in rotation: the reads in flight and the one being copied) and output
    blocks in the file's layout and dtype (three in rotation: one being filled, one being
    written, one spare).

    Parameters
    ----------
    rec : Recording
        An integer source (`raw_transfer`).
    width : int
        The longest block read: a chunk and its halos.
    slots : int
        Input buffers.
    out_shape : tuple, optional
        (chunk samples, channels) of an output block (None: no output buffers, blocks are
        only read).
    out_dtype : float32 or int16
    layout : {"samples_channels", "channels_samples"}

    Examples
    --------
    GPU jobs only (not run here):

    >>> staging = Staging(rec, 30262, 4, (30000, 384), np.int16, "samples_channels")
    ... # doctest: +SKIP
    """

    def __init__(self, rec: Recording, width: int, slots: int, out_shape: tuple | None = None,
                 out_dtype: np.dtype = np.float32, layout: str = "samples_channels") -> None:
        self.rec, self.layout, self.out_dtype = rec, layout, out_dtype
        c = rec.n_channels
        self._in = [pinned_empty(width * c, rec.dtype) for _ in range(slots)]
        self._out = [] if out_shape is None else \
            [pinned_empty(out_shape[0] * c, out_dtype) for _ in range(3)]
        self.transfer_s = 0.0        # host <-> device copies (main thread)
        # a source stored as differences along time (mtscomp's .cbin): read inflated only,
        # summed on the device (`Recording.read_native_differences`), so that the reader's
        # threads do not hold the GIL the job's own thread needs
        self.differences = bool(getattr(rec, "differences_supported", False))

    def read(self, k: int, s0: int, s1: int, m: int) -> tuple:
        """(first sample, raw block) of [s0 - m, s1 + m) clipped to the recording, read into
        slot k's buffer."""
        rec = self.rec
        a, b = max(0, s0 - m), min(rec.n_samples, s1 + m)
        buf = self._in[k % len(self._in)][:(b - a) * rec.n_channels]
        shape = (b - a, rec.n_channels) if rec.samples_first else (rec.n_channels, b - a)
        if self.differences:
            return a, rec.read_native_differences(a, b, out=buf.reshape(shape))
        return a, rec.read_native(a, b, out=buf.reshape(shape))

    def to_device(self, raw: tuple, xp: Any) -> tuple:
        """(first sample, µV float32 [channels, samples] on the device): moved as stored,
        then transposed and scaled on the device by `dspk.io.to_uv`, the function
        `Recording.read` scales with (the same bits)."""
        a, block = raw
        if isinstance(block, np.ndarray):
            # straight from the pinned buffer (cupy.asarray would stage it through a pinned
            # buffer of its own: one more host copy)
            d = xp.empty(block.shape, dtype=block.dtype)
            t = time.perf_counter()
            d.set(block)
            self.transfer_s += time.perf_counter() - t
        else:
            d = xp.asarray(block)
        rec = self.rec
        if self.differences:
            # the decode's sums, in the stored dtype (wrapping as the differences did: the
            # samples to the bit)
            d = xp.cumsum(d, axis=1, dtype=d.dtype)
        return a, to_uv(d.T if rec.samples_first else d, rec.gain_to_uv, rec.offset_to_uv)

    def to_host(self, i: int, y: Any, scale: float) -> np.ndarray:
        """The output block in the file's layout and dtype, in pinned buffer i."""
        xp = array_module(y)
        if self.layout == "samples_channels":
            y = xp.ascontiguousarray(y.T)
        if self.out_dtype == np.int16:
            y = quantize(xp, y, scale)
        else:
            y = xp.ascontiguousarray(y, dtype=self.out_dtype)
        host = self._out[i % len(self._out)][:y.size].reshape(y.shape)
        xp.cuda.get_current_stream().synchronize()    # the chunk's work done: time the copy
        t = time.perf_counter()
        y.get(out=host)
        self.transfer_s += time.perf_counter() - t
        return host


class ChunkStream:
    """The chunk loop of a job over a recording: the next chunks read ahead in threads (their
    halos included; through pinned buffers on the GPU), each computed on the caller's thread,
    and written behind by one writer thread, in order, while the next is computed.

    Parameters
    ----------
    rec : Recording
    chunk : int
        Samples per chunk.
    margin : int
        Samples of context read on each side of a chunk.
    staging : Staging, optional
        The pinned buffers of a GPU job that moves raw samples (read into, and moved to the
        device by `to_device`).
    xp : module
        The array module `to_device` moves blocks to.

    Attributes
    ----------
    timing : dict
        Seconds spent reading (summed over threads), computing and writing, and the loop's
        wall time (``loop_s``: their overlap is ``read_s + compute_s + write_s − loop_s``).
    events : list
        ``[what, chunk, start, end]`` per read, computation and write ("read", "compute",
        "write"), seconds from the loop's start: the chunks' timeline, to see where the
        stages wait on each other.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline.stream import ChunkStream
    >>> rec = dspk.open_recording(np.arange(20, dtype=np.int16).reshape(10, 2), fs=1e3,
    ...                           layout="samples_channels")
    >>> stream = ChunkStream(rec, chunk=4, margin=0)
    >>> got = []
    >>> stream.run([0, 4, 8], 10, lambda i, raw, s0, s1: raw[1],
    ...            lambda s0, s1, y: got.append((s0, s1, y.shape)))
    >>> got
    [(0, 4, (2, 4)), (4, 8, (2, 4)), (8, 10, (2, 2))]
    """

    def __init__(self, rec: Recording, chunk: int, margin: int,
                 staging: Staging | None = None, xp: Any = np) -> None:
        self.rec, self.chunk, self.margin = rec, chunk, margin
        self.staging, self.xp = staging, xp
        self.ahead = ahead(rec)
        self.timing = {"read_s": 0.0, "compute_s": 0.0, "write_s": 0.0, "loop_s": 0.0}
        self.events: list = []
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()

    def read(self, k: int, s0: int, end: int) -> tuple:
        """Chunk k, [s0, min(end, s0 + chunk)), with its halos: (first sample, block)."""
        t = time.perf_counter()
        s1 = min(end, s0 + self.chunk)
        if self.staging is not None:
            r = self.staging.read(k, s0, s1, self.margin)
        else:
            r = read_block(self.rec, s0, s1, self.margin)
        t1 = time.perf_counter()
        with self._lock:
            self.timing["read_s"] += t1 - t
            self.events.append(["read", k, t - self._t0, t1 - self._t0])
        return r

    def to_device(self, raw: tuple) -> tuple:
        """A block read by `read` as (first sample, µV block) for the computation: moved and
        scaled on the device with staging, else as read."""
        return self.staging.to_device(raw, self.xp) if self.staging is not None else raw

    def run(self, starts: Sequence[int], end: int, compute: Callable[..., Any],
            write: Callable[..., Any]) -> None:
        """The chunks starting at ``starts`` (each to ``min(end, s0 + chunk)``):
        ``compute(i, raw, s0, s1)`` on this thread, its result passed to
        ``write(s0, s1, result)`` on the writer thread; the first failed write stops the
        loop (raised here)."""
        ahead = self.ahead
        self._t0 = time.perf_counter()

        def timed_write(i: int, s0: int, s1: int, result: Any) -> None:
            t = time.perf_counter()
            write(s0, s1, result)
            with self._lock:
                self.events.append(["write", i, t - self._t0, time.perf_counter() - self._t0])

        # the next `ahead` chunks are read while this one is computed (decompression of
        # several chunks overlaps), the last one written while the next is computed (one
        # writer thread: chunks are written in order)
        with ThreadPoolExecutor(ahead) as reader, ThreadPoolExecutor(1) as writer:
            queue = deque(reader.submit(self.read, k, starts[k], end)
                          for k in range(min(ahead, len(starts))))
            pending = None
            for i, s0 in enumerate(starts):
                s1 = min(end, s0 + self.chunk)
                raw = queue.popleft().result()
                if i + ahead < len(starts):
                    queue.append(reader.submit(self.read, i + ahead, starts[i + ahead], end))
                t = time.perf_counter()
                result = compute(i, raw, s0, s1)
                t1 = time.perf_counter()
                self.timing["compute_s"] += t1 - t
                with self._lock:
                    self.events.append(["compute", i, t - self._t0, t1 - self._t0])
                if pending is not None:
                    pending.result()        # a failed write stops the job here
                pending = writer.submit(timed_write, i, s0, s1, result)
            if pending is not None:
                pending.result()
        self.timing["loop_s"] = time.perf_counter() - self._t0


# -- device memory ---------------------------------------------------------------------------------
# what says the device ran out of memory (`out_of_memory`) lives in dspk.backend, below the
# tuner, which skips a candidate that runs out; it stays importable from here


class GpuMemory:
    """The device memory a GPU job's chunks may use: the chunk sized to fit it before the
    loop (`fit_chunk`), halved when the device runs out of memory all the same (`smaller`,
    after the memory pools are freed), down to a floor; ``gpu_memory`` caps CuPy's pool for
    the job's duration (`capped`). Nothing is done for a CPU job.

    Parameters
    ----------
    xp : module
        The job's array module (``cupy`` for a GPU job).
    cap : int, optional
        The most bytes of device memory the job may use (``--gpu-memory``); None: the free
        device memory.
    n_channels : int
    margin : int
        The pipeline's halo in samples (the floor is never shorter).
    fs : float
        The sampling rate in Hz.
    enabled : bool, optional
        Default: whether ``xp`` is CuPy (a test may enable it on the CPU).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline.stream import GpuMemory
    >>> gm = GpuMemory(np, None, 384, 100, 30000.0, enabled=True)
    >>> gm.floor, gm.fit_chunk(30000, budget=400_000_000)
    (600, 7938)
    >>> class OutOfMemoryError(MemoryError):
    ...     pass
    >>> gm.smaller(7938, OutOfMemoryError())
    3969
    """

    def __init__(self, xp: Any, cap: int | None, n_channels: int, margin: int, fs: float,
                 enabled: bool | None = None) -> None:
        if cap is not None:
            ok = isinstance(cap, (int, np.integer)) and not isinstance(cap, bool) and cap > 0
            if not ok:
                raise ValueError(f"gpu_memory: expected a positive number of bytes, got "
                                 f"{cap!r}")
        self.xp, self.cap = xp, None if cap is None else int(cap)
        self.enabled = getattr(xp, "__name__", "") == "cupy" if enabled is None else enabled
        self.n_channels, self.margin, self.fs = int(n_channels), int(margin), float(fs)
        self.floor = max(int(round(MIN_GPU_CHUNK_S * fs)), self.margin, 1)

    def budget(self) -> int | None:
        """Bytes the job may still take on the device: the free device memory and what
        CuPy's pool holds unused, within the pool's limit (``CUPY_GPU_MEMORY_LIMIT``) and
        ``cap``; None for a CPU job."""
        if not self.enabled:
            return None
        if getattr(self.xp, "__name__", "") != "cupy":
            return self.cap
        pool = self.xp.get_default_memory_pool()
        free = int(self.xp.cuda.runtime.memGetInfo()[0]) + int(pool.free_bytes())
        for limit in (int(pool.get_limit()), self.cap or 0):
            if limit:
                free = min(free, limit - int(pool.used_bytes()))
        return max(free, 0)

    def fit_chunk(self, chunk: int, budget: int | None = None) -> int:
        """The chunk (samples), shortened so that it and its halo fit `GPU_MEMORY_SHARE` of
        ``budget`` (default: `budget`), never below `floor`; said in the log when
        shortened.

        Parameters
        ----------
        chunk : int
        budget : int, optional
        """
        if not self.enabled:
            return chunk
        budget = self.budget() if budget is None else budget
        if budget is None:
            return chunk
        fits = int(GPU_MEMORY_SHARE * budget) // (GPU_BYTES_PER_SAMPLE * self.n_channels)
        fits = max(self.floor, fits - 2 * self.margin)
        if fits >= chunk:
            return chunk
        log.warning("chunks of %d samples (%.3f s) instead of %d: what fits %.0f MB of free "
                    "device memory%s (the output does not depend on it)", fits, fits / self.fs,
                    chunk, budget / 1e6, " (gpu_memory, --gpu-memory)" if self.cap else "")
        return fits

    def smaller(self, chunk: int, exc: BaseException,
                goes_on: str = "the job goes on from its last written chunk") -> int | None:
        """After ``exc`` stopped the chunk loop: half the chunk (not below `floor`) when
        ``exc`` says the device ran out of memory (said in the log; the caller frees the
        pools with `free` once the failed chunk's arrays are gone); None when it did not, or
        the chunk is at the floor already (the error goes on).

        Parameters
        ----------
        chunk : int
        exc : BaseException
        goes_on : str
            What the log says goes on with the smaller chunk.
        """
        if not self.enabled or not out_of_memory(exc):
            return None
        if chunk <= self.floor:
            log.error("the device ran out of memory with chunks of %d samples (%.3f s), the "
                      "shortest a job takes: free device memory (other processes), or give "
                      "the job more (gpu_memory, --gpu-memory)", chunk, chunk / self.fs)
            return None
        new = max(self.floor, chunk // 2)
        log.warning("the device ran out of memory with chunks of %d samples (%s); its pools "
                    "freed, %s with chunks of %d samples (%.3f s; the output does not depend "
                    "on it)", chunk,
                    str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__,
                    goes_on, new, new / self.fs)
        return new

    def free(self) -> None:
        """Give CuPy's unused pooled device and pinned memory back (a GPU job), after a
        garbage collection (arrays held by reference cycles go first)."""
        free_device_memory(self.xp)

    @contextmanager
    def capped(self) -> Iterator[None]:
        """A block in which CuPy's memory pool is limited to ``cap`` (when given, and lower
        than its limit), restored at the end."""
        if not (self.enabled and self.cap and getattr(self.xp, "__name__", "") == "cupy"):
            yield
            return
        pool = self.xp.get_default_memory_pool()
        before = int(pool.get_limit())
        pool.set_limit(size=min(before, self.cap) if before else self.cap)
        try:
            yield
        finally:
            pool.set_limit(size=before)
