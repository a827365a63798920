"""The sync channel of a recording decoded to events: the rising and falling edges of each bit
of SpikeGLX's digital words (the imec stream's SY word: bit 6 is the sync pulse, the others
the probe's status flags; the NI-DAQ stream's XD words: one bit per digital input), as CatGT
extracts them (``-xd``/``-xid``: the sample where a bit goes high or low) and IBL's
``ibldsp.utils.fronts`` finds them in ibl-neuropixel's ``read_sync_digital`` bits.

`sync_edges` is the decoding of an array of words (pure, no file); `sync_events` streams a
recording's words through it, chunk by chunk.

Examples
--------
>>> import numpy as np
>>> from dspk.io.sync import sync_edges
>>> words = np.array([0, 64, 64, 0, 65, 1], dtype=np.uint16)       # bits 6 and 0
>>> ev = sync_edges(words)
>>> ev["sample"].tolist(), ev["bit"].tolist(), ev["polarity"].tolist()
([1, 3, 4, 4, 5], [6, 6, 0, 6, 6], [1, -1, 1, 1, -1])
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..argnames import arg
from .errors import RecordingError

__all__ = ["sync_edges", "sync_events", "SyncLedger", "EVENT_DTYPE", "SYNC_CHUNK"]

#: one edge: its sample, the bit (16·word + bit for a recording of several words), +1
#: rising or −1 falling (IBL's ``polarities``), and its time in seconds (`sync_events`)
EVENT_DTYPE = np.dtype([("sample", np.int64), ("bit", np.int16), ("polarity", np.int8),
                        ("time", np.float64)])
#: samples of sync words read at once by `sync_events`
SYNC_CHUNK = 1 << 20


def _as_words(words: Any) -> np.ndarray:
    """[words, samples] uint16 from 1-D or 2-D 16-bit (or smaller) integers, by their bits."""
    w = np.asarray(words)
    if w.ndim == 1:
        w = w[None]
    if w.ndim != 2 or w.dtype.kind not in "iu" or w.dtype.itemsize > 2:
        raise ValueError(f"words: expected 1-D [samples] or 2-D [words, samples] 8- or 16-bit "
                         f"integers (a sync word as stored), got {w.dtype} of shape {w.shape}")
    return w.astype(w.dtype.newbyteorder("=")).view(np.uint8 if w.dtype.itemsize == 1
                                                     else np.uint16).astype(np.uint16)


def sync_edges(words: Any, bits: Any = None, *, start: int = 0, previous: Any = None,
               fs: float | None = None) -> np.ndarray:
    """The rising and falling edges of each bit of digital words.

    An edge at sample ``i`` is a change of the bit between samples ``i − 1`` and ``i``
    (rising: 0 to 1); the first sample has one only when the word before it (``previous``)
    is given — streaming: pass the last word of the previous block. The definition of
    IBL's ``ibldsp.utils.fronts`` on ibl-neuropixel's ``split_sync`` bits (its index is the
    sample after the change, its sign the polarity) and of CatGT's edge extraction.

    Parameters
    ----------
    words : array-like
        [samples] or [words, samples] integers of 16 bits or fewer (int16 as SpikeGLX stores
        them: the bits are what count, not the sign).
    bits : int or sequence of int, optional
        The bits wanted (0..15, or 16·word + bit with several words); default: all.
    start : int
        The sample number of ``words[..., 0]`` (added to the samples returned).
    previous : int or array-like, optional
        The word(s) just before the first sample.
    fs : float, optional
        The sampling rate in Hz, for the ``time`` field (NaN without it).

    Returns
    -------
    numpy.ndarray
        `EVENT_DTYPE` records sorted by sample, then bit.

    Raises
    ------
    ValueError
        Words that are not 8/16-bit integers, a bit out of range, ``previous`` of the wrong
        shape.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io.sync import sync_edges
    >>> sy = np.array([64, 64, 0, 0, 64], dtype=np.int16)            # the sync pulse: bit 6
    >>> ev = sync_edges(sy, bits=6, start=1000, previous=0, fs=30000.0)
    >>> ev["sample"].tolist(), ev["polarity"].tolist()
    ([1000, 1002, 1004], [1, -1, 1])
    >>> ev["time"].round(6).tolist()
    [0.033333, 0.0334, 0.033467]
    """
    w = _as_words(words)
    n_words = w.shape[0]
    if bits is None:
        wanted = np.arange(16 * n_words)
    else:
        wanted = np.unique(np.atleast_1d(np.asarray(bits)))
        if wanted.dtype.kind not in "iu" or wanted.min() < 0 or wanted.max() >= 16 * n_words:
            raise ValueError(f"bits: expected bit numbers in 0..{16 * n_words - 1}, got {bits!r}")
    if previous is not None:
        prev = (np.atleast_1d(np.asarray(previous)).astype(np.int64) & 0xFFFF) \
            .astype(np.uint16)[:, None]
        if prev.shape[0] != n_words:
            raise ValueError(f"previous: expected {n_words} word(s), got {prev.shape[0]}")
        w = np.concatenate([prev, w], axis=1)
        first = start - 1
    else:
        first = start
    # the words' changes: one pass over them, then the bits of the few samples that change
    changed = np.flatnonzero((w[:, 1:] != w[:, :-1]).any(axis=0)) + 1
    samples, bit_ids, pol = [], [], []
    for word in range(n_words):
        mine = wanted[(wanted // 16) == word] % 16
        if mine.size == 0 or changed.size == 0:
            continue
        after = w[word, changed]
        before = w[word, changed - 1]
        for b in mine.tolist():
            a_bit = (after >> b) & 1
            b_bit = (before >> b) & 1
            edge = np.flatnonzero(a_bit != b_bit)
            samples.append(changed[edge])
            bit_ids.append(np.full(edge.size, 16 * word + b, np.int16))
            pol.append(np.where(a_bit[edge] > b_bit[edge], 1, -1).astype(np.int8))
    out = np.zeros(sum(len(s) for s in samples), dtype=EVENT_DTYPE)
    if out.size:
        out["sample"] = np.concatenate(samples) + first
        out["bit"] = np.concatenate(bit_ids)
        out["polarity"] = np.concatenate(pol)
        out = out[np.lexsort((out["bit"], out["sample"]))]
    out["time"] = out["sample"] / float(fs) if fs else np.nan
    return out


class SyncLedger:
    """The edges of the sync words of every block a reader has read, kept as it reads them,
    so that a job's pass over a SpikeGLX file gives its events without a second pass (over an
    hour's .bin, a second read of the whole file: the sync word is interleaved with the
    channels) or a second decode (.cbin).

    Each block [a, b) keeps its edges at samples a+1 .. b−1 and its first and last words;
    `edges` joins them — overlapping blocks (a job's halos) or touching ones (the word before
    a block's first sample is the previous block's last) — when they cover the recording.

    Parameters
    ----------
    limit : int
        The most blocks kept (distinct ranges): beyond it the ledger stops and `edges` says
        None (a reader used for many small random reads then decodes its sync words anew).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io.sync import SyncLedger
    >>> sy = np.zeros((1, 10), np.uint16)
    >>> sy[0, 4:7] = 64
    >>> ledger = SyncLedger()
    >>> ledger.add(0, sy[:, 0:4])
    >>> ledger.edges(10) is None                           # samples 4..9 not read
    True
    >>> ledger.add(3, sy[:, 3:10])                         # overlapping, as a job's halos
    >>> ledger.edges(10)[["sample", "bit", "polarity"]].tolist()
    [(4, 6, 1), (7, 6, -1)]
    """

    def __init__(self, limit: int = 1 << 16) -> None:
        self.limit = int(limit)
        self._blocks: dict = {}
        self._full = False
        self._lock = threading.Lock()

    def add(self, start: int, words: Any) -> None:
        """Keep the edges of ``words`` ([words, samples], the block's first sample at
        ``start``)."""
        w = np.asarray(words)
        if w.ndim != 2 or w.shape[1] == 0 or self._full:
            return
        key = (int(start), int(start) + w.shape[1])
        block = (w[:, 0].copy(), w[:, -1].copy(), sync_edges(w, start=int(start)))
        with self._lock:
            if key not in self._blocks and len(self._blocks) >= self.limit:
                self._full = True
                self._blocks.clear()
                return
            self._blocks[key] = block

    def edges(self, n_samples: int) -> np.ndarray | None:
        """Every edge of samples 1 .. n_samples−1 (``time`` NaN), or None where the blocks
        kept do not cover them (or the ledger stopped at its limit)."""
        with self._lock:
            if self._full:
                return None
            blocks = sorted(self._blocks.items(), key=lambda kv: (kv[0][0], -kv[0][1]))
        parts, covered, last = [], 0, None        # edges known at samples < covered
        for (a, b), (first, end, edges) in blocks:
            if b <= covered:
                continue
            if a > covered:
                return None
            if a == covered and a > 0:            # the edge between touching blocks
                parts.append(sync_edges(first[:, None], start=a, previous=last))
            parts.append(edges[edges["sample"] >= covered])
            covered, last = b, end
        if covered < n_samples:
            return None
        if not parts:
            return np.zeros(0, EVENT_DTYPE)
        out = np.concatenate(parts)
        return out[np.lexsort((out["bit"], out["sample"]))]


def sync_events(recording: Any, bits: Any = None, start: int = 0, stop: int | None = None,
                chunk: int = SYNC_CHUNK) -> np.ndarray:
    """Every edge of the sync bits of a recording (SpikeGLX: the imec SY word, the NI-DAQ
    digital words; `SpikeGLXRecording.read_sync`), read chunk by chunk: `sync_edges` of
    its words, with times in seconds from the recording's first sample.

    Parameters
    ----------
    recording : Recording or path
        A recording whose reader gives its sync words (``read_sync``), or a path opened
        with `dspk.io.open_recording` (and closed again).
    bits : int or sequence of int, optional
        As for `sync_edges` (16·word + bit for the NI-DAQ's second word and beyond).
    start, stop : int
        The samples read (default: all); an edge at ``start`` itself is not reported.
    chunk : int
        Samples read at once.

    Returns
    -------
    numpy.ndarray
        `EVENT_DTYPE` records sorted by sample, then bit.

    Raises
    ------
    RecordingError
        A recording without sync words (the message says which formats have them).

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from dspk.io import open_recording
    >>> from dspk.io.sync import sync_events
    >>> tmp = tempfile.TemporaryDirectory()
    >>> binpath = os.path.join(tmp.name, "run_g0_t0.imec0.ap.bin")
    >>> data = np.zeros((3000, 2), np.int16)
    >>> data[1000:2000, 1] = 64                              # the SY word: bit 6 high for 1000
    >>> data.tofile(binpath)
    >>> meta = ["typeThis=imec", "imSampRate=30000", "nSavedChans=2",
    ...         f"fileSizeBytes={data.nbytes}", "snsApLfSy=1,0,1", "snsSaveChanSubset=all",
    ...         "imAiRangeMax=0.6", "imMaxInt=512", "imDatPrb_type=0",
    ...         "~imroTbl=(0,1)(0 0 0 500 250 1)"]
    >>> with open(binpath[:-4] + ".meta", "w") as f:
    ...     _ = f.write("\\n".join(meta) + "\\n")
    >>> ev = sync_events(binpath, chunk=700)
    >>> ev[["sample", "bit", "polarity"]].tolist(), ev["time"].tolist()
    ([(1000, 6, 1), (2000, 6, -1)], [0.03333333333333333, 0.06666666666666667])
    >>> tmp.cleanup()
    """
    from . import open_recording  # noqa: PLC0415 (the package imports this module)

    own = not hasattr(recording, "read")
    rec = open_recording(recording) if own else recording
    try:
        read = getattr(rec, "read_sync", None)
        if read is None or getattr(rec, "n_sync_words", 0) == 0:
            raise RecordingError(f"{rec.source}: no sync channel (SpikeGLX .bin/.cbin files "
                                 f"keep one: the imec SY word, the NI-DAQ digital words)")
        stop = rec.n_samples if stop is None else int(stop)
        start = int(start)
        decoded = getattr(rec, "decoded_sync_edges", None)
        ev = decoded() if decoded is not None and (start, stop) == (0, rec.n_samples) \
            else None
        if ev is not None:                  # a .cbin whose every chunk a job decoded
            if bits is not None:
                wanted = np.atleast_1d(np.asarray(bits))
                if wanted.dtype.kind not in "iu" or wanted.min() < 0 or \
                        wanted.max() >= 16 * rec.n_sync_words:
                    raise ValueError(f"bits: expected bit numbers in "
                                     f"0..{16 * rec.n_sync_words - 1}, got {bits!r}")
                ev = ev[np.isin(ev["bit"], wanted)]
            ev = ev.copy()
            ev["time"] = ev["sample"] / float(rec.fs)
            return ev
        if not 0 <= start <= stop <= rec.n_samples:
            raise RecordingError(f"start, stop: expected 0 <= start <= stop <= "
                                 f"{rec.n_samples}, got {start}, {stop}")
        if int(chunk) < 1:
            raise ValueError(f"chunk: expected a positive number of samples, got {chunk!r}; "
                             f"pass {arg('chunk')}{SYNC_CHUNK}")
        parts, previous = [], None
        for a in range(start, stop, int(chunk)):
            b = min(stop, a + int(chunk))
            words = read(a, b)
            parts.append(sync_edges(words, bits, start=a, previous=previous, fs=rec.fs))
            previous = words[:, -1]
        if not parts:
            return sync_edges(np.zeros((rec.n_sync_words, 0), np.uint16), bits, fs=rec.fs)
        return np.concatenate(parts)
    finally:
        if own:
            rec.close()
