"""IBL's compressed recordings: ``mtscomp``'s ``.cbin`` (the samples in chunks, each
time-differenced and zlib-compressed) with its ``.ch`` (a JSON header: the chunks' bounds in
samples and their offsets in the file), decoded chunk by chunk in a thread pool.

The format is mtscomp's (github.com/int-brain-lab/mtscomp, format version 1.0, what
``mtscomp.Writer`` writes and ``mtscomp.Reader`` reads): chunk ``i`` holds the samples
``chunk_bounds[i]:chunk_bounds[i + 1]`` of every channel, stored at bytes
``chunk_offsets[i]:chunk_offsets[i + 1]`` of the ``.cbin`` as one zlib stream of the
chunk's samples in ``chunk_order`` ("F", the default: channel after channel; "C": sample
after sample), after a difference along time (``do_time_diff``, the first sample kept) and
optionally across channels (``do_spatial_diff``). Decoding inverts the differences with
cumulative sums in the samples' own dtype, so int16 samples wrap exactly as the differences
did: the samples come back bit for bit (tests/io/test_cbin.py checks them against
``mtscomp.decompress``).

Why not ``mtscomp.Reader``: it returns [samples, channels], a transposing copy of each chunk
(half its time), and decodes one chunk at a time when sliced (how SpikeInterface's
``read_cbin_ibl`` and ibl-neuropixel's reader use it); dspk computes on [channels, samples],
which is the layout an "F" chunk is stored in, so a chunk decodes in one inflate and one
cumulative sum along each channel's contiguous row. The inflate (about 80 % of a chunk's
time) runs outside the GIL, so the chunks of a read (and, for a reader that reads forward,
the next ones) decode on several cores at once; NumPy's cumulative sum holds the GIL
(measured: two threads took as long as one). Nothing is allocated per chunk: zlib inflates
straight into a per-thread buffer (libz's ``uncompress`` through ctypes, which releases the
GIL; ``zlib.decompress`` where libz cannot be loaded) and the sums go into recycled chunk
buffers — freshly allocated 23-MB arrays cost their page faults, and two threads faulting
at once ran 15x slower than one (2 cores, measured).

Examples
--------
>>> import os, tempfile
>>> import numpy as np
>>> from dspk.io.cbin import CbinReader, write_cbin
>>> tmp = tempfile.TemporaryDirectory()
>>> x = np.arange(40, dtype=np.int16).reshape(10, 4)          # 10 samples x 4 channels
>>> cbin = write_cbin(os.path.join(tmp.name, "rec.cbin"), x, 1000.0, chunk_samples=4)
>>> with CbinReader(cbin) as r:
...     r.n_samples, r.n_channels, r.read(3, 6, columns=[0, 3])      # across a chunk edge
(10, 4, array([[12, 16, 20],
       [15, 19, 23]], dtype=int16))
>>> tmp.cleanup()
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import threading
import time
import zlib
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..backend import blocked_transpose
from .errors import RecordingError
from .sync import SyncLedger

__all__ = ["CbinReader", "read_ch", "ch_path", "decode_chunk", "write_cbin", "CBIN_SUFFIXES"]

#: the suffixes of mtscomp's files: the compressed samples and their header
CBIN_SUFFIXES = (".cbin", ".ch")
#: the header keys a reader needs (mtscomp writes these and a few more: hashes, version)
CH_KEYS = ("algorithm", "n_channels", "dtype", "sample_rate", "chunk_bounds", "chunk_offsets",
           "chunk_order", "do_time_diff", "do_spatial_diff")


def ch_path(cbin: str) -> str:
    """The ``.ch`` header of a ``.cbin`` (the same stem, as mtscomp names it).

    Parameters
    ----------
    cbin : str
        The ``.cbin`` file.

    Examples
    --------
    >>> from dspk.io.cbin import ch_path
    >>> ch_path("run_g0_t0.imec0.ap.cbin")
    'run_g0_t0.imec0.ap.ch'
    """
    return os.path.splitext(os.fspath(cbin))[0] + ".ch"


def read_ch(path: str) -> dict:
    """An mtscomp ``.ch`` header, checked: the keys a reader needs (`CH_KEYS`) present and
    consistent (zlib; chunk bounds from 0, increasing; one offset per bound, from 0,
    non-decreasing; "C" or "F" order).

    Parameters
    ----------
    path : str
        The ``.ch`` file (JSON).

    Returns
    -------
    dict
        The header, ``chunk_bounds`` and ``chunk_offsets`` as int64 arrays, ``dtype`` as a
        NumPy dtype.

    Raises
    ------
    RecordingError
        Not JSON, or a key missing or inconsistent (the message names it and the file).
    FileNotFoundError
        No such file.

    Examples
    --------
    >>> import json, os, tempfile
    >>> from dspk.io.cbin import read_ch
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "x.ch")
    >>> with open(path, "w") as f:
    ...     json.dump({"algorithm": "zlib", "n_channels": 2, "dtype": "int16",
    ...                "sample_rate": 30000.0, "chunk_bounds": [0, 5], "chunk_offsets": [0, 9],
    ...                "chunk_order": "F", "do_time_diff": True, "do_spatial_diff": False}, f)
    >>> read_ch(path)["chunk_bounds"]
    array([0, 5])
    >>> tmp.cleanup()
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file (mtscomp keeps the chunk table of a "
                                f".cbin in its .ch)")
    try:
        with open(path, encoding="utf-8") as f:
            ch = json.load(f)
    except (OSError, ValueError) as exc:
        raise RecordingError(f"{path}: not an mtscomp header (JSON): {exc}") from None
    if not isinstance(ch, dict):
        raise RecordingError(f"{path}: not an mtscomp header (a JSON object)")
    missing = [k for k in CH_KEYS if k not in ch]
    if missing:
        raise RecordingError(f"{', '.join(missing)}: missing from {path} (an mtscomp .ch "
                             f"header has them)")
    if ch["algorithm"] != "zlib":
        raise RecordingError(f"algorithm: {path} says {ch['algorithm']!r}; mtscomp writes "
                             f"'zlib', the only one it (and dspk) reads")
    if ch["chunk_order"] not in ("C", "F"):
        raise RecordingError(f"chunk_order: expected 'C' or 'F' in {path}, got "
                             f"{ch['chunk_order']!r}")
    try:
        dtype = np.dtype(ch["dtype"])
        n_channels = int(ch["n_channels"])
        rate = float(ch["sample_rate"])
        bounds = np.asarray(ch["chunk_bounds"], dtype=np.int64)
        offsets = np.asarray(ch["chunk_offsets"], dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise RecordingError(f"{path}: a malformed mtscomp header ({exc})") from None
    if n_channels < 1 or dtype.kind not in "iuf":
        raise RecordingError(f"n_channels/dtype: {path} says {n_channels} channels of "
                             f"{dtype}")
    if bounds.ndim != 1 or bounds.size < 2 or bounds[0] != 0 or np.any(np.diff(bounds) <= 0):
        raise RecordingError(f"chunk_bounds: expected increasing sample bounds from 0 in "
                             f"{path}")
    if offsets.shape != bounds.shape or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise RecordingError(f"chunk_offsets: expected {bounds.size} non-decreasing byte "
                             f"offsets from 0 (one per chunk bound) in {path}, got "
                             f"{offsets.size}")
    return dict(ch, dtype=dtype, n_channels=n_channels, sample_rate=rate,
                chunk_bounds=bounds, chunk_offsets=offsets)


def _load_libz() -> Any:
    """libz's ``uncompress`` through ctypes (None where libz cannot be loaded)."""
    name = ctypes.util.find_library("z")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        fn = lib.uncompress
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulong), ctypes.c_char_p,
                   ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


_UNCOMPRESS = _load_libz()


def _inflate(raw: bytes, scratch: np.ndarray | None) -> Any:
    """The inflated bytes of a zlib stream: into ``scratch`` (a uint8 array) by libz when it
    is loaded and scratch is given (a view of scratch returned), else a new bytes object."""
    if _UNCOMPRESS is None or scratch is None:
        return zlib.decompress(raw)
    size = ctypes.c_ulong(scratch.nbytes)
    rc = _UNCOMPRESS(scratch.ctypes.data, ctypes.byref(size), raw, len(raw))
    if rc != 0:
        # Z_BUF_ERROR (-5): more bytes than the chunk holds; Z_DATA_ERROR (-3): not zlib
        raise zlib.error(f"libz uncompress returned {rc} "
                         f"({'more bytes than the chunk' if rc == -5 else 'invalid data'})")
    return scratch[:size.value]


def decode_chunk(raw: bytes, n_samples: int, n_channels: int, dtype: Any, order: str = "F",
                 time_diff: bool = True, spatial_diff: bool = False,
                 out: np.ndarray | None = None, scratch: np.ndarray | None = None) -> np.ndarray:
    """One mtscomp chunk decoded to [channels, samples]: inflated, its differences undone.

    The inverse of what ``mtscomp.Writer`` does to a chunk (time difference, then the
    spatial one, then zlib of the bytes in ``order``), as ``mtscomp.Reader.read_chunk``
    undoes it (the spatial cumulative sum first, then the time one), in the samples' dtype:
    bit for bit the samples that were compressed.

    Parameters
    ----------
    raw : bytes
        The chunk's compressed bytes.
    n_samples, n_channels : int
        The chunk's shape.
    dtype : numpy dtype
    order : {"F", "C"}
        The header's ``chunk_order`` ("F": channel after channel).
    time_diff, spatial_diff : bool
        The header's ``do_time_diff`` and ``do_spatial_diff``.
    out : numpy.ndarray, optional
        A C-contiguous [n_channels, n_samples] array of ``dtype`` to decode into.
    scratch : numpy.ndarray, optional
        A uint8 buffer of at least the chunk's bytes to inflate into (no allocation).

    Returns
    -------
    numpy.ndarray
        [n_channels, n_samples], C-contiguous.

    Raises
    ------
    zlib.error, ValueError
        Bytes that are not a zlib stream, or one of the wrong length.

    Examples
    --------
    >>> import zlib
    >>> import numpy as np
    >>> from dspk.io.cbin import decode_chunk
    >>> x = np.array([[1, 3, 6], [-2, 0, 5]], dtype=np.int16)        # [channels, samples]
    >>> d = np.diff(x, axis=1, prepend=np.int16(0))                   # the time difference
    >>> decode_chunk(zlib.compress(d.tobytes()), 3, 2, np.int16)
    array([[ 1,  3,  6],
           [-2,  0,  5]], dtype=int16)
    """
    dtype = np.dtype(dtype)
    data = _inflate(raw, scratch)
    if len(data) != n_samples * n_channels * dtype.itemsize:
        raise ValueError(f"{len(data)} bytes inflated, expected {n_samples} samples x "
                         f"{n_channels} channels of {dtype}")
    flat = np.frombuffer(data, dtype=dtype)
    if out is None:
        out = np.empty((n_channels, n_samples), dtype=dtype)
    if order == "F":
        # channel after channel: already [channels, samples]
        d = flat.reshape(n_channels, n_samples)
        if spatial_diff:
            d = np.cumsum(d, axis=0, dtype=dtype)
        if time_diff:
            # along each channel's contiguous row, straight into out (no temporary)
            np.cumsum(d, axis=1, dtype=dtype, out=out)
        else:
            np.copyto(out, d)
        return out
    d = flat.reshape(n_samples, n_channels)
    if spatial_diff:
        d = np.cumsum(d, axis=1, dtype=dtype)
    if time_diff:
        d = np.cumsum(d, axis=0, dtype=dtype)
    return blocked_transpose(d, out)


class CbinReader:
    """An mtscomp ``.cbin`` read as [channels, samples] blocks: the chunks a read touches
    decoded in a thread pool (`decode_chunk`), the last ones kept (a pipeline's reads overlap
    by their halos), and, when reads go forward, the next ones decoded ahead.

    Parameters
    ----------
    cbin : str
        The ``.cbin``.
    ch : str, optional
        Its header (default: the ``.ch`` of the same stem, `ch_path`).
    threads : int, optional
        Decoding threads (default: the CPU count, at most 16).

    Attributes
    ----------
    n_samples, n_channels : int
    dtype : numpy.dtype
    sample_rate : float
        The header's rate in Hz.
    chunk_bounds : numpy.ndarray
        int64 [chunks + 1], chunk i holds samples ``chunk_bounds[i]:chunk_bounds[i + 1]``.
    seconds : float
        Time spent reading and decoding chunks, summed over the threads.

    Raises
    ------
    RecordingError
        A bad header (`read_ch`), a ``.cbin`` shorter than its chunk table says.
    FileNotFoundError
        The ``.cbin`` or the ``.ch`` missing.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from dspk.io.cbin import CbinReader, write_cbin
    >>> tmp = tempfile.TemporaryDirectory()
    >>> x = np.random.default_rng(0).integers(-500, 500, (3000, 3)).astype(np.int16)
    >>> path = write_cbin(os.path.join(tmp.name, "x.cbin"), x, 30000.0, chunk_samples=1000)
    >>> with CbinReader(path, threads=2) as r:
    ...     bool((r.read(0, 3000) == x.T).all()), r.chunk_bounds.tolist()
    (True, [0, 1000, 2000, 3000])
    >>> tmp.cleanup()
    """

    def __init__(self, cbin: str, ch: str | None = None, threads: int | None = None) -> None:
        self.path = os.fspath(cbin)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"{self.path}: no such file")
        self.ch_path = ch_path(self.path) if ch is None else os.fspath(ch)
        head = read_ch(self.ch_path)
        self.header = head
        self.n_channels = head["n_channels"]
        self.dtype = head["dtype"]
        self.sample_rate = head["sample_rate"]
        self.chunk_bounds = head["chunk_bounds"]
        self.chunk_offsets = head["chunk_offsets"]
        self.n_samples = int(self.chunk_bounds[-1])
        self._order = head["chunk_order"]
        self._time_diff = bool(head["do_time_diff"])
        self._spatial_diff = bool(head["do_spatial_diff"])
        size = os.path.getsize(self.path)
        if size < self.chunk_offsets[-1]:
            raise RecordingError(f"{self.path}: {size} bytes on disk, but its chunk table "
                                 f"({self.ch_path}) ends at byte {int(self.chunk_offsets[-1])}: "
                                 f"the file is truncated (or the .ch belongs to another file)")
        self.threads = max(1, int(threads or min(16, os.cpu_count() or 1)))
        # decoded chunks kept: a read spanning two, the ones decoding ahead of it and the
        # reads a pipeline has in flight (each ~23 MB for 385 channels x 1 s of int16)
        self.capacity = 2 * self.threads + 4
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="dspk-cbin")
        self._lock = threading.Lock()
        self._chunks: OrderedDict[tuple, _Entry] = OrderedDict()
        self._free: list[np.ndarray] = []            # recycled chunk buffers
        self._longest = int(np.diff(self.chunk_bounds).max())
        self._local = threading.local()               # each thread's inflate buffer
        self._fd: int | None = os.open(self.path, os.O_RDONLY)
        self._last_chunk = -2
        self.seconds = 0.0
        #: stored channels whose edges every decode keeps (`kept_edges`): SpikeGLX's sync
        #: words, so that a job's pass over the file gives them without a second decode
        self.keep_rows: np.ndarray | None = None
        self._kept = SyncLedger(limit=len(self.chunk_bounds))

    def __repr__(self) -> str:
        return (f"CbinReader({self.path!r}, {self.n_channels} channels x {self.n_samples} "
                f"samples {self.dtype}, {len(self.chunk_bounds) - 1} chunks)")

    def __enter__(self) -> "CbinReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop the threads and close the file (reading afterwards raises `RecordingError`).

        Examples
        --------
        >>> r = CbinReader("x.cbin")                           # doctest: +SKIP
        >>> r.close()                                          # doctest: +SKIP
        """
        self._pool.shutdown(wait=True)
        with self._lock:
            self._chunks.clear()
            self._free.clear()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _pread(self, offset: int, size: int) -> bytes:
        parts, done = [], 0
        fd = self._fd
        if fd is None:
            raise RecordingError(f"{self.path}: closed")
        while done < size:
            got = os.pread(fd, size - done, offset + done)
            if not got:
                raise RecordingError(f"{self.path}: ends inside a chunk (truncated)")
            parts.append(got)
            done += len(got)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _scratch(self) -> np.ndarray:
        """This thread's inflate buffer (the longest chunk's bytes), made once."""
        buf = getattr(self._local, "scratch", None)
        if buf is None:
            buf = np.empty(self._longest * self.n_channels * self.dtype.itemsize, np.uint8)
            self._local.scratch = buf
        return buf

    def _decode(self, i: int, buf: np.ndarray, differenced: bool = False) -> np.ndarray:
        t = time.perf_counter()
        a, b = int(self.chunk_offsets[i]), int(self.chunk_offsets[i + 1])
        raw = self._pread(a, b - a)
        n = int(self.chunk_bounds[i + 1] - self.chunk_bounds[i])
        out = buf[:n * self.n_channels].reshape(self.n_channels, n)
        try:
            # differenced: inflated only (`read_differences`), the sums left to the reader
            decode_chunk(raw, n, self.n_channels, self.dtype, self._order,
                         self._time_diff and not differenced, self._spatial_diff, out=out,
                         scratch=self._scratch())
        except (zlib.error, ValueError) as exc:
            raise RecordingError(f"{self.path}: chunk {i} (samples "
                                 f"{int(self.chunk_bounds[i])}..{int(self.chunk_bounds[i + 1]) - 1}"
                                 f", bytes {a}..{b - 1}) cannot be decompressed ({exc}): the "
                                 f"file is damaged") from exc
        if self.keep_rows is not None and len(self.keep_rows):
            kept = out[self.keep_rows]
            if differenced:                          # (one row: the sums cost nothing)
                kept = np.cumsum(kept, axis=1, dtype=self.dtype)
            self._kept.add(int(self.chunk_bounds[i]), kept)
        with self._lock:
            self.seconds += time.perf_counter() - t
        return out

    def kept_edges(self) -> np.ndarray | None:
        """Every edge of the `keep_rows` words (16·word + bit, as `dspk.io.sync.sync_edges`
        numbers them; ``time`` NaN) when every chunk has been decoded since they were set —
        a job's pass over the whole file —, else None.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np
        >>> from dspk.io.cbin import CbinReader, write_cbin
        >>> tmp = tempfile.TemporaryDirectory()
        >>> x = np.zeros((10, 2), np.int16)
        >>> x[3:7, 1] = 64
        >>> with CbinReader(write_cbin(os.path.join(tmp.name, "x.cbin"), x, 1e3, 4)) as r:
        ...     r.keep_rows = np.array([1])
        ...     before = r.kept_edges()
        ...     _ = r.read(0, 10)
        ...     before, r.kept_edges()[["sample", "polarity"]].tolist()
        (None, [(3, 1), (7, -1)])
        >>> tmp.cleanup()
        """
        if self.keep_rows is None:
            return None
        return self._kept.edges(int(self.chunk_bounds[-1]))

    def _acquire(self, i: int, pin: bool, differenced: bool = False) -> "_Entry":
        """Chunk i's entry (its decode submitted now unless kept), pinned when ``pin``: a
        pinned chunk's buffer is not recycled until `_release`. Called under the lock. A
        chunk kept decoded and one kept differenced are two entries."""
        key = (i, differenced)
        entry = self._chunks.get(key)
        if entry is None:
            buf = self._free.pop() if self._free else \
                np.empty(self._longest * self.n_channels, dtype=self.dtype)
            entry = _Entry(buf)
            entry.future = self._pool.submit(self._decode, i, buf, differenced)
            self._chunks[key] = entry
            self._evict()
        else:
            self._chunks.move_to_end(key)
        entry.pins += pin
        return entry

    def _evict(self) -> None:
        """Drop the oldest chunks beyond `capacity` that no read holds and whose decode is
        over, their buffers kept for the next chunks (under the lock)."""
        over = len(self._chunks) - self.capacity
        for i in list(self._chunks):
            if over <= 0:
                break
            e = self._chunks[i]
            if e.pins == 0 and e.future.done():
                del self._chunks[i]
                if len(self._free) < self.capacity:
                    self._free.append(e.buffer)
                over -= 1

    def _release(self, entries: list) -> None:
        with self._lock:
            for e in entries:
                e.pins -= 1
            self._evict()

    def read(self, start: int, stop: int, columns: Any = None,
             out: np.ndarray | None = None) -> np.ndarray:
        """Samples ``start:stop`` of the stored channels ``columns`` (default: all, in order)
        as [channels, samples], C-contiguous, in the stored dtype.

        Parameters
        ----------
        start, stop : int
            0 <= start <= stop <= n_samples.
        columns : sequence of int, optional
            Stored channels, in the order wanted.
        out : numpy.ndarray, optional
            A C-contiguous [len(columns), stop − start] array of the dtype to read into.

        Returns
        -------
        numpy.ndarray

        Raises
        ------
        RecordingError
            A range or channel out of bounds, a damaged chunk, a closed reader.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np
        >>> from dspk.io.cbin import CbinReader, write_cbin
        >>> tmp = tempfile.TemporaryDirectory()
        >>> x = np.arange(12, dtype=np.int16).reshape(6, 2)
        >>> with CbinReader(write_cbin(os.path.join(tmp.name, "x.cbin"), x, 1e3, 4)) as r:
        ...     r.read(2, 5, columns=[1])
        array([[5, 7, 9]], dtype=int16)
        >>> tmp.cleanup()
        """
        return self._gather(start, stop, columns, out, differenced=False)

    @property
    def differences_supported(self) -> bool:
        """Whether `read_differences` can read this file: its chunks time-differenced, in
        "F" order (channel after channel), not differenced across channels (mtscomp's
        defaults, what IBL's files are)."""
        return self._time_diff and self._order == "F" and not self._spatial_diff \
            and self.dtype.kind in "iu"

    def read_differences(self, start: int, stop: int, columns: Any = None,
                         out: np.ndarray | None = None) -> np.ndarray:
        """Samples ``start:stop`` as differences D along time whose cumulative sum in the
        stored dtype (wrapping, as mtscomp's differences do) is `read`'s block, exactly:
        ``numpy.cumsum(D, axis=1, dtype=D.dtype)``. The chunks are only inflated here (the
        sums, ~20 % of a chunk's decode, hold NumPy's GIL): a GPU job sums them on the
        device (`dspk.pipeline.stream.Staging`), and the reader's threads no longer take
        turns with the job's own. D's first column is the first sample; where the block
        crosses into a chunk, the difference to the sample before it.

        Parameters
        ----------
        start, stop : int
        columns : sequence of int, optional
        out : numpy.ndarray, optional
            As `read`'s.

        Returns
        -------
        numpy.ndarray

        Raises
        ------
        RecordingError
            As `read`; also a file whose chunks `differences_supported` says no to.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np
        >>> from dspk.io.cbin import CbinReader, write_cbin
        >>> tmp = tempfile.TemporaryDirectory()
        >>> x = np.arange(12, dtype=np.int16).reshape(6, 2) ** 2
        >>> with CbinReader(write_cbin(os.path.join(tmp.name, "x.cbin"), x, 1e3, 4)) as r:
        ...     d = r.read_differences(1, 6, columns=[1])
        ...     x = r.read(1, 6, columns=[1])
        >>> d
        array([[ 9, 16, 24, 32, 40]], dtype=int16)
        >>> np.cumsum(d, axis=1, dtype=d.dtype)
        array([[  9,  25,  49,  81, 121]], dtype=int16)
        >>> np.array_equal(np.cumsum(d, axis=1, dtype=d.dtype), x)
        True
        >>> tmp.cleanup()
        """
        if not self.differences_supported:
            raise RecordingError(f"{self.path}: its chunks are not time-differenced channel "
                                 f"by channel (do_time_diff, chunk_order 'F', no "
                                 f"do_spatial_diff): read it with read()")
        return self._gather(start, stop, columns, out, differenced=True)

    def _gather(self, start: int, stop: int, columns: Any, out: np.ndarray | None,
                differenced: bool) -> np.ndarray:
        """`read` (decoded chunks) or `read_differences` (inflated chunks, their first
        columns made differences across the block, `_anchor`)."""
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.n_samples:
            raise RecordingError(f"read: expected 0 <= start <= stop <= {self.n_samples}, "
                                 f"got start={start}, stop={stop}")
        if self._fd is None:
            raise RecordingError(f"{self.path}: closed")
        cols = None if columns is None else np.asarray(columns, dtype=np.int64)
        if cols is not None and cols.size and (cols.min() < 0 or cols.max() >= self.n_channels):
            raise RecordingError(f"columns: stored channels of {self.path} are 0.."
                                 f"{self.n_channels - 1}")
        # a run of consecutive channels (every signal channel, the sync word left out) is a
        # basic slice of each chunk: one copy, no gather
        run = cols is None or (cols.size > 0 and bool(np.all(np.diff(cols) == 1)))
        rows: Any = slice(None) if cols is None else \
            slice(int(cols[0]), int(cols[-1]) + 1) if run else cols
        shape = (self.n_channels if cols is None else cols.size, stop - start)
        if out is None:
            out = np.empty(shape, dtype=self.dtype)
        elif out.shape != shape or out.dtype != self.dtype:
            raise RecordingError(f"out: expected {shape} {self.dtype}, got {out.shape} "
                                 f"{out.dtype}")
        if stop == start:
            return out
        bounds = self.chunk_bounds
        first = int(np.searchsorted(bounds, start, side="right")) - 1
        last = int(np.searchsorted(bounds, stop, side="left")) - 1
        with self._lock:
            if self._fd is None:
                raise RecordingError(f"{self.path}: closed")
            entries = [self._acquire(i, True, differenced) for i in range(first, last + 1)]
            # a forward reader (a pipeline, a benchmark, a conversion): the next chunks
            # decode while the caller works on these, one per thread. A read from the
            # file's start counts as forward (a job's run begins there, whatever its fit
            # read before): waiting for its second read left the job's first chunks
            # decoding one after another (~0.14 s a chunk on the H100's host)
            if first == 0 or first in (self._last_chunk, self._last_chunk + 1):
                for i in range(last + 1, min(last + 1 + self.threads, len(bounds) - 1)):
                    self._acquire(i, False, differenced)
            self._last_chunk = last
        try:
            running = None                      # the block's last sample so far (differenced)
            for i, entry in zip(range(first, last + 1), entries):
                chunk = entry.future.result()
                c0 = int(bounds[i])
                a, b = max(start, c0), min(stop, int(bounds[i + 1]))
                seg = out[:, a - start:b - start]
                seg[...] = chunk[rows, a - c0:b - c0]
                if differenced:
                    running = self._anchor(seg, chunk[rows, :a - c0 + 1], running)
        finally:
            self._release(entries)
        return out

    def _anchor(self, seg: np.ndarray, head: np.ndarray, running: Any) -> np.ndarray:
        """Make the differences ``seg`` of one chunk's part continue the block: its first
        column the sample there (a block starting inside the chunk: the sum of the chunk's
        differences up to it, ``head``) or the difference to the block's previous sample
        (``running``); returns the block's last sample after ``seg``. In the stored dtype,
        wrapping as the differences do."""
        dt = self.dtype
        if running is None:
            if head.shape[1] > 1:             # inside the chunk: the sample itself
                seg[:, 0] = np.add.reduce(head, axis=1, dtype=dt)
        else:                                 # a chunk's first sample, stored as is
            seg[:, 0] -= running
            first = seg[:, 0] + running
            return first + np.add.reduce(seg[:, 1:], axis=1, dtype=dt)
        return np.add.reduce(seg, axis=1, dtype=dt)


class _Entry:
    """A chunk of `CbinReader`: its buffer, the future of its decode, the reads using it."""

    __slots__ = ("buffer", "future", "pins")

    def __init__(self, buffer: np.ndarray) -> None:
        self.buffer = buffer
        self.future: Future | None = None
        self.pins = 0


def write_cbin(path: str, samples: np.ndarray, sample_rate: float, chunk_samples: int = 30000,
               time_diff: bool = True, order: str = "F") -> str:
    """Write [samples, channels] as an mtscomp ``.cbin`` and ``.ch`` (what
    ``mtscomp.compress`` writes, without its hashes and integrity pass): for tests, examples
    and benchmarks. IBL's files are written by mtscomp itself.

    Parameters
    ----------
    path : str
        The ``.cbin`` to write (its ``.ch`` beside it, `ch_path`).
    samples : numpy.ndarray
        [samples, channels], any integer or float dtype.
    sample_rate : float
        Hz, written to the header.
    chunk_samples : int
        Samples per chunk (mtscomp: 1 s).
    time_diff : bool
        Difference along time before compressing (mtscomp's default).
    order : {"F", "C"}
        The chunks' byte order (mtscomp's default "F").

    Returns
    -------
    str
        ``path``.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from dspk.io.cbin import read_ch, write_cbin
    >>> tmp = tempfile.TemporaryDirectory()
    >>> p = write_cbin(os.path.join(tmp.name, "x.cbin"), np.zeros((5, 2), np.int16), 1e3, 2)
    >>> read_ch(p[:-5] + ".ch")["chunk_bounds"].tolist()
    [0, 2, 4, 5]
    >>> tmp.cleanup()
    """
    x = np.asarray(samples)
    if x.ndim != 2:
        raise ValueError(f"samples: expected [samples, channels], got shape {x.shape}")
    if order not in ("C", "F"):
        raise ValueError(f"order: expected 'C' or 'F', got {order!r}")
    n = x.shape[0]
    bounds = list(range(0, n, int(chunk_samples))) + [n]
    offsets = [0]
    with open(path, "wb") as f:
        for a, b in zip(bounds[:-1], bounds[1:]):
            chunk = x[a:b]
            if time_diff:
                d = np.diff(chunk, axis=0)
                chunk = np.concatenate([chunk[:1], d.astype(x.dtype, copy=False)])
            raw = zlib.compress(chunk.tobytes(order=order))
            f.write(raw)
            offsets.append(offsets[-1] + len(raw))
    head = dict(version="1.0", algorithm="zlib", comp_level=-1, do_time_diff=bool(time_diff),
                do_spatial_diff=False, dtype=str(x.dtype), n_channels=int(x.shape[1]),
                sample_rate=float(sample_rate), chunk_bounds=bounds, chunk_offsets=offsets,
                chunk_order=order, shape=list(x.shape))
    with open(ch_path(path), "w", encoding="utf-8") as f:
        json.dump(head, f, indent=2, sort_keys=True)
    return path
