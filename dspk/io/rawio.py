"""Writing a job's output samples straight into an HDF5 file's contiguous dataset, and reading
an unfiltered dataset's samples straight from the file.

h5py holds Python's GIL (and HDF5's lock) for the whole of every read and write, so while the
writer thread stores a chunk of output nothing else in the process can run Python: the
readers cannot start the next chunk's decompression, the main thread cannot launch the next
chunk's work (measured on the H200 host: a float32 job's writes took 1.2 s of its 3.6 s
with a gzip input). A contiguous, unfiltered dataset's samples are one block of bytes at a
fixed file offset, allocated when the dataset is created; ``os.pwrite`` puts a chunk there
with the GIL released. HDF5 keeps no copy of those bytes (it never reads or writes this
dataset's data itself), so the file stays consistent.

Reading is the same story (measured on the H100 host: a GPU job's h5py reads, 0.6 s of a
1.8-s run, held the GIL while the main thread waited to launch the next chunk's work): the
samples of an unfiltered dataset, contiguous or in chunks that span every channel, lie in
blocks of bytes at offsets HDF5 reports, and ``os.preadv`` reads them into the caller's
buffer (a pinned one on the GPU) with the GIL released (`RawDatasetReader`).

The writers here store no object times (HDF5 records a creation and a modification time in
the header of every group and dataset unless told not to): a job's output is the same bytes
every time it is written, and a resumed job's output the same bytes as one that never stopped.
`new_file`, `require_group`, `create_dataset` and `create_contiguous` are the only ways the
jobs create HDF5 objects.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

__all__ = ["new_file", "require_group", "create_dataset", "create_contiguous", "raw_offset",
           "RawDatasetWriter", "RawDatasetReader"]


def new_file(path: Any) -> Any:
    """A new (truncated) HDF5 file, open for writing, whose root group stores no times.

    h5py >= 3.15 takes ``track_times=False``; before it, the file is created through a file
    creation property list that says so (HDF5's default records times, and the groups created
    in the file inherit that)."""
    import h5py  # noqa: PLC0415 (h5py deferred: imported when an output is written)

    try:
        return h5py.File(path, "w", track_times=False)
    except TypeError:
        fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
        fcpl.set_obj_track_times(False)
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        fapl.set_fclose_degree(h5py.h5f.CLOSE_STRONG)   # as h5py opens files
        return h5py.File(h5py.h5f.create(os.fsencode(path), h5py.h5f.ACC_TRUNC, fcpl=fcpl,
                                         fapl=fapl))


def require_group(parent: Any, path: str) -> Any:
    """The group at ``path`` under ``parent`` (``"a/b"``), each missing level created without
    times."""
    import h5py  # noqa: PLC0415 (h5py deferred: imported when an output is written)

    group = parent
    for part in (p for p in path.split("/") if p):
        if part not in group:
            gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
            gcpl.set_obj_track_times(False)
            h5py.h5g.create(group.id, part.encode(), gcpl=gcpl)
        group = group[part]
    return group


def create_dataset(parent: Any, name: str, **kwargs: Any) -> Any:
    """``parent.create_dataset(name, **kwargs)`` without times, its groups (``"a/b/name"``)
    made by `require_group`."""
    head, _, tail = name.rpartition("/")
    group = require_group(parent, head) if head else parent
    return group.create_dataset(tail, track_times=False, **kwargs)


def create_contiguous(group: Any, name: str, shape: tuple, dtype: Any) -> Any:
    """A contiguous dataset whose storage is allocated now and never filled: every sample is
    written by the job (an unfinished output is never renamed to its final name). No times
    are stored."""
    import h5py  # noqa: PLC0415 (h5py deferred: imported when an output is written)

    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    dcpl.set_obj_track_times(False)
    space = h5py.h5s.create_simple(tuple(int(v) for v in shape))
    h5py.h5d.create(group.id, name.encode(), h5py.h5t.py_create(np.dtype(dtype)), space,
                    dcpl=dcpl)
    return group[name]


def raw_offset(dset: Any) -> int | None:
    """The file offset of a dataset's samples when they are one contiguous, allocated,
    unfiltered block in this machine's byte order (None otherwise)."""
    if dset.chunks is not None or dset.compression is not None or not dset.dtype.isnative:
        return None
    try:
        offset = dset.id.get_offset()
    except (AttributeError, RuntimeError, ValueError):
        return None
    if offset is None or dset.id.get_storage_size() != dset.size * dset.dtype.itemsize:
        return None
    return int(offset)


class RawDatasetWriter:
    """Writes blocks of a 2-D contiguous dataset with ``os.pwrite`` (the GIL released)."""

    def __init__(self, path: str, dset: Any = None, *, offset: int | None = None,
                 shape: tuple | None = None, dtype: Any = None) -> None:
        """From an open dataset, or from its ``offset``, ``shape`` and ``dtype`` (a process
        that writes its blocks without opening the file through HDF5: disjoint blocks may be
        written by several processes at once)."""
        self._fd: int | None = None
        if dset is not None:
            offset = raw_offset(dset)
            if offset is None:
                raise ValueError(f"{dset.name}: not a contiguous, allocated, unfiltered "
                                 f"dataset")
            shape, dtype = dset.shape, dset.dtype
        if offset is None or shape is None or dtype is None:
            raise ValueError("RawDatasetWriter: give a dataset, or offset, shape and dtype")
        self.offset, self.shape, self.dtype = int(offset), tuple(shape), np.dtype(dtype)
        self._fd = os.open(path, os.O_WRONLY)

    def _pwrite(self, data: Any, at: int) -> None:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done:], at + done)

    def write(self, s0: int, block: np.ndarray, axis: int) -> None:
        """``dset[s0:s0+len]`` (axis 0) or ``dset[:, s0:s0+len]`` (axis 1) = block."""
        if block.dtype != self.dtype:
            raise ValueError(f"block: expected {self.dtype}, got {block.dtype}")
        rows, cols = self.shape
        size = self.dtype.itemsize
        block = np.ascontiguousarray(block)
        if axis == 0:
            if block.shape[1] != cols or not 0 <= s0 <= s0 + block.shape[0] <= rows:
                raise ValueError(f"block: {block.shape} at row {s0} outside {self.shape}")
            self._pwrite(block, self.offset + s0 * cols * size)
            return
        if block.shape[0] != rows or not 0 <= s0 <= s0 + block.shape[1] <= cols:
            raise ValueError(f"block: {block.shape} at column {s0} outside {self.shape}")
        for r in range(rows):
            self._pwrite(block[r], self.offset + (r * cols + s0) * size)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:   # a job that failed mid-way: the descriptor is not leaked
        self.close()


class RawDatasetReader:
    """Reads rows of a 2-D unfiltered dataset in this machine's byte order, contiguous or
    stored in chunks that span its second axis, with ``os.preadv`` into the caller's buffer
    (the GIL released; h5py holds it for the length of every read). `open` gives None
    where the samples are not laid out so (filters, external storage, chunks that cut the
    second axis, another byte order, a file that is not a file on disk) or where the bytes
    at the offsets HDF5 reports are not the ones h5py reads; `read` gives None for rows in
    a chunk never written (h5py fills those).

    Examples
    --------
    >>> import os, tempfile, h5py, numpy as np
    >>> from dspk.io.rawio import RawDatasetReader
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "x.h5")
    >>> x = np.arange(60, dtype=np.int16).reshape(20, 3)
    >>> with h5py.File(path, "w") as f:
    ...     _ = f.create_dataset("a", data=x)
    ...     _ = f.create_dataset("b", data=x, chunks=(7, 3))
    >>> f = h5py.File(path, "r")
    >>> [bool((RawDatasetReader.open(f[k]).read(5, 16) == x[5:16]).all()) for k in "ab"]
    [True, True]
    >>> f.close(); tmp.cleanup()
    """

    def __init__(self, dset: Any, fd: int) -> None:
        self.dset, self._fd = dset, fd
        self.shape, self.dtype = tuple(dset.shape), dset.dtype
        self.row_bytes = self.shape[1] * self.dtype.itemsize
        self.step = dset.chunks[0] if dset.chunks is not None else None
        self._offsets: dict = {}
        self._lock = threading.Lock()
        self._contiguous = raw_offset(dset) if self.step is None else None

    @classmethod
    def open(cls, dset: Any, path: str | None = None) -> "RawDatasetReader | None":
        """A reader of ``dset`` (its file at ``path``, default the dataset's own), or None
        (also where the platform has no ``os.preadv``: Windows)."""
        if not hasattr(os, "preadv"):
            return None
        try:
            if (dset.ndim != 2 or dset.size == 0 or not dset.dtype.isnative
                    or dset.dtype.kind not in "iuf" or dset.external):
                return None
            if dset.chunks is not None:
                if dset.chunks[1] != dset.shape[1] or dset.id.get_create_plist().get_nfilters():
                    return None
            elif raw_offset(dset) is None:
                return None
            fd = os.open(path or dset.file.filename, os.O_RDONLY)
        except (AttributeError, OSError, RuntimeError, TypeError, ValueError):
            return None
        reader = cls(dset, fd)
        rows = min(dset.shape[0], 64)
        got = reader.read(0, rows)
        if got is None or not np.array_equal(got, dset[:rows], equal_nan=dset.dtype.kind == "f"):
            reader.close()
            return None
        return reader

    def _chunk_offset(self, k: int) -> int | None:
        """The file offset of row chunk k (None: never written)."""
        with self._lock:
            if k not in self._offsets:
                info = self.dset.id.get_chunk_info_by_coord((k * self.step, 0))
                ok = info.byte_offset is not None and info.filter_mask == 0 and \
                    info.size == self.step * self.row_bytes
                self._offsets[k] = int(info.byte_offset) if ok else None
            return self._offsets[k]

    def _preadv(self, view: memoryview, at: int) -> None:
        done = 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], at + done)
            if got <= 0:
                raise OSError(f"{self.dset.file.filename}: the samples end past the end of "
                              f"the file (truncated?)")
            done += got

    def read(self, a: int, b: int, out: np.ndarray | None = None) -> np.ndarray | None:
        """Rows [a, b) as a [b - a, columns] array (``out`` when given: C-contiguous, this
        dataset's dtype and shape), or None where a chunk was never written."""
        if not 0 <= a <= b <= self.shape[0]:
            raise ValueError(f"rows {a}..{b} outside {self.shape[0]}")
        if out is None:
            out = np.empty((b - a, self.shape[1]), self.dtype)
        if not (out.flags.c_contiguous and out.dtype == self.dtype
                and out.shape == (b - a, self.shape[1])):
            raise ValueError(f"out: expected a C-contiguous {self.dtype} array of shape "
                             f"{(b - a, self.shape[1])}")
        if a == b:
            return out
        flat = memoryview(out.reshape(-1).view(np.uint8))
        if self.step is None:
            self._preadv(flat, self._contiguous + a * self.row_bytes)
            return out
        r = a
        while r < b:
            k = r // self.step
            e = min(b, (k + 1) * self.step)
            at = self._chunk_offset(k)
            if at is None:
                return None
            self._preadv(flat[(r - a) * self.row_bytes:(e - a) * self.row_bytes],
                         at + (r - k * self.step) * self.row_bytes)
            r = e
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()
