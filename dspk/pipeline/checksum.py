"""The checksum of a committed block of a job's output (what a verified resume checks).

A block's checksum is the crc32 of the crc32s of its bytes' fixed 1 MiB pieces (`PIECE`,
the last one shorter), in the block's own C order: the pieces are checksummed on a small
pool of threads (zlib's crc32 releases the GIL), so a 1-s chunk of 384 float32 channels
(46 MB) costs ~2 ms on 16 cores where one crc32 over it took 20 ms (zlib 1.2.13: 2.3 GB/s
on one core). The pieces are fixed whatever the thread count, so the checksum is too: a job
resumed on another machine checks the same numbers. Written by hand (zlib has the crc32 but
no parallel form, and ``crc32_combine`` is not exposed by Python's zlib).

Examples
--------
>>> import numpy as np
>>> from dspk.pipeline.checksum import block_checksum
>>> a = np.arange(12, dtype=np.int16).reshape(3, 4)
>>> block_checksum(a) == block_checksum(a.copy())
True
>>> block_checksum(a) == block_checksum(a.T)             # another order, another checksum
False
"""

from __future__ import annotations

import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["CHECKSUM", "PIECE", "PendingChecksum", "block_checksum", "committed_blocks"]

#: bytes per piece; the name a resume record gives the checksum (a record with another is
#: not verified against this one: the job starts over)
PIECE = 1 << 20
CHECKSUM = "crc32 of 1 MiB pieces' crc32"
#: pieces from which the pool is used (below: one thread, no hand-over)
POOL_FROM = 4
#: the pool's threads at most (memory bandwidth, not cores, limits beyond)
MAX_THREADS = 8

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, min(MAX_THREADS, os.cpu_count() or 1)),
                                       thread_name_prefix="dspk-checksum")
        return _pool


class PendingChecksum:
    """A block's checksum begun on the pool, to be taken with `result`: the writer thread
    starts it, writes the block meanwhile (both only read the block, and the write's system
    calls leave the GIL to the crc32s), then takes it — so the checksum costs the job nothing
    where the pool has idle cores (a 1-s chunk of 384 int16 channels: 23 pieces).

    The block must stay unchanged until `result` returns (the writer thread holds it).

    Parameters
    ----------
    block : numpy.ndarray
        A host array (a pinned staging buffer included).

    Examples
    --------
    >>> import numpy as np
    >>> a = np.arange(3 << 20, dtype=np.int16)            # 6 pieces: on the pool
    >>> PendingChecksum(a).result() == block_checksum(a)
    True
    """

    __slots__ = ("_futures", "_pieces")

    def __init__(self, block: Any) -> None:
        a = np.ascontiguousarray(block).reshape(-1).view(np.uint8)
        pieces = [a[i:i + PIECE] for i in range(0, a.size, PIECE)] or [a]
        if len(pieces) < POOL_FROM:          # small: computed in `result`, no hand-over
            self._pieces, self._futures = pieces, None
        else:
            pool = _threads()
            self._pieces, self._futures = None, [pool.submit(zlib.crc32, p) for p in pieces]

    def result(self) -> int:
        """The checksum (an unsigned 32-bit number), waiting for the pool's pieces."""
        if self._futures is None:
            crcs = [zlib.crc32(p) for p in self._pieces]
        else:
            crcs = [f.result() for f in self._futures]
        return zlib.crc32(np.asarray(crcs, dtype="<u4").tobytes())


def block_checksum(block: Any) -> int:
    """The checksum of a block's samples in its own C order (see the module docstring).

    Parameters
    ----------
    block : numpy.ndarray
        A host array (a pinned staging buffer included).

    Returns
    -------
    int
        An unsigned 32-bit number.

    Examples
    --------
    >>> import numpy as np
    >>> block_checksum(np.zeros((2, 3), np.float32)) == block_checksum(np.zeros(6, np.float32))
    True
    """
    return PendingChecksum(block).result()


def committed_blocks(ends: list | None = None, crc: list | None = None,
                     rows: list | None = None, order: str = "") -> dict:
    """The record of an output's committed blocks (`dspk.pipeline.outputs.Output.blocks`):
    each one's end, checksum and tables' rows after it, the order each checksum was computed
    over ("c": [channels, samples], "s": [samples, channels]) and the checksum's name.

    Parameters
    ----------
    ends, crc, rows : list, optional
    order : str

    Examples
    --------
    >>> committed_blocks()["ends"], committed_blocks()["checksum"] == CHECKSUM
    ([], True)
    """
    return {"ends": list(ends or []), "crc": list(crc or []), "rows": list(rows or []),
            "order": order, "checksum": CHECKSUM}
