"""Prepared operands for one-shot calls.

A user who calls ``spatial_filter(W, x)`` or ``ncc(image, templates)`` in a loop should not pay,
on every call, for what a prepared object (`SpatialFilter`, `TemplateBank`) does once: the
analysis of W's sparsity and the sparse kernel's plan, the bank's sums and packed words.
`PreparedCache` keeps the objects built from recent operands, keyed by the operand's
`fingerprint` — its shape, dtype, device and a hash of its bytes — so an operand that was
modified in place is never served a stale plan, and one that comes back is recognised whatever
the Python object holding it.

The fingerprint of a CuPy array is computed on its device (dspk/kernels/fingerprint.cu: one
pass over the bytes, a few µs for a 384 × 384 matrix, then an 8-byte copy back, that is, a wait
for the work queued before); of a NumPy array, with BLAKE2b. A cache that prepares on a
second sighting does not wait for the hash of a GPU buffer it has no reason to think repeated:
it starts the hash, counts it when it has landed, and answers "not prepared" at once. Where
preparing costs less than that wait — a template bank on the GPU — `dspk.match` does not look
the operand up at all: it loads it into a bank kept per shape and stream and packs it again,
on the device.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any, Callable

import numpy as np

from ..backend import is_cupy_array, pinned_empty
from ..caches import LRU, shared
from ..kernels import FastLaunch, declare_instances, grid_1d, kernel

__all__ = ["fingerprint", "PreparedCache"]

_FP_BLOCK = 256
#: contents a PreparedCache remembers having seen (not yet prepared)
_MAX_SEEN = 64
_FP_MAX_BLOCKS = 1024
#: the fingerprint kernel over 32-bit words (an array of whole aligned words) or bytes
_FP_KERNELS = {True: "fingerprint64<unsigned int>", False: "fingerprint64<unsigned char>"}
declare_instances("fingerprint.cu", lambda props: _FP_KERNELS.values())


def fingerprint(a: Any) -> tuple:
    """(array module, device, shape, dtype, content hash) of a NumPy or CuPy array: equal for
    two arrays with the same values in the same layout, different (but for a 2^-64 chance on
    the GPU) once any byte changes."""
    if is_cupy_array(a):
        return ("cupy", a.data.device_id, a.shape, a.dtype.str, _device_hash(a))
    c = np.ascontiguousarray(a)
    digest = hashlib.blake2b(c.reshape(-1).view(np.uint8), digest_size=16).hexdigest()
    return ("numpy", None, c.shape, c.dtype.str, digest)


def _device_hash(a: Any) -> int:
    import cupy as cp  # noqa: PLC0415 (only for CuPy input)

    dev = a.data.device_id
    if dev != cp.cuda.runtime.getDevice():
        with cp.cuda.Device(dev):
            return _device_hash(a)
    if not a.flags.c_contiguous:
        a = cp.ascontiguousarray(a)
    nbytes = a.nbytes
    if nbytes == 0:
        return 0
    return _hasher(dev).hash(a.data.ptr, nbytes, cp.cuda.get_current_stream())


def _hashable_now(a: Any) -> bool:
    """Whether `_start_hash` applies to CuPy array ``a``: C-contiguous, not empty, on the
    current device."""
    import cupy as cp  # noqa: PLC0415 (CuPy input)

    return (a.flags.c_contiguous and a.nbytes > 0 and
            a.data.device_id == cp.cuda.runtime.getDevice())


def _start_hash(a: Any, aside: bool = False) -> tuple:
    """Start `_device_hash` of ``a`` (see `_hashable_now`) without waiting: (hasher, number,
    event). On the current stream, or ``aside`` (see `_DeviceHasher.start`)."""
    import cupy as cp  # noqa: PLC0415 (CuPy input)

    hasher = _hasher(a.data.device_id)
    number, event = hasher.start(a.data.ptr, a.nbytes, cp.cuda.get_current_stream(),
                                 aside=aside)
    return hasher, number, event


def buffer_identity(a: Any) -> tuple:
    """The buffer a NumPy or CuPy array occupies: address, shape, strides, dtype, device (not
    its content)."""
    if is_cupy_array(a):
        return (a.data.ptr, a.shape, a.strides, a.dtype.str, a.data.device_id)
    return (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str, None)


class _DeviceHasher:
    """The fingerprint kernel's launches on one device, and a ring of device words with their
    pinned host copies for the results: a hash is a memset, a launch and an 8-byte copy back,
    about 10 µs of host time rather than the ~40 of allocating and converting on every call.
    `start` does not wait (the copy lands when the stream gets there, which its event
    tells; then `value`: a started hash only counts sightings, so a slot reused too early
    costs a miscount, never a wrong result); `hash` waits, in words of its own thread."""

    RING = 256

    def __init__(self, device_id: int) -> None:
        import cupy as cp  # noqa: PLC0415 (CuPy input)

        self._cp = cp
        self._words = cp.zeros(self.RING, dtype=np.uint64)
        self._host = pinned_empty(self.RING, np.uint64)
        self._host[...] = 0
        self._launches: dict = {}
        self._lock = threading.Lock()
        self._side = cp.cuda.Stream(non_blocking=True)
        self._marks = [cp.cuda.Event(block=False, disable_timing=True) for _ in range(16)]
        self._marks_next = 0
        self._local = threading.local()
        self.count = 0           # hashes started (a slot is reused RING hashes later)
        self.waited = 0          # hashes waited for (`hash`)

    def _launch(self, words: int, wide: bool) -> Any:
        key = (words, wide)
        fn = self._launches.get(key)
        if fn is None:
            fn = FastLaunch(kernel("fingerprint.cu", _FP_KERNELS[wide]),
                            grid_1d(words, _FP_BLOCK, _FP_MAX_BLOCKS), (_FP_BLOCK,),
                            [("ptr", None), ("i64", words), ("ptr", None)])
            if len(self._launches) < 256:
                self._launches[key] = fn
        return fn

    def start(self, ptr: int, nbytes: int, stream: Any, event: bool = True,
              aside: bool = False) -> tuple:
        """Launch the hash of ``nbytes`` at ``ptr`` on ``stream`` (a CuPy stream): (number,
        event or None).

        ``aside``: on a side stream that starts where ``stream`` is now, so the hash is not
        on ``stream``'s timeline (a one-shot call timed on an idle GPU does not see it). Work
        queued on ``stream`` later may then run before the hash reads the bytes: the hash of
        a buffer written meanwhile miscounts a sighting, never more (a prepared operand is
        always found by a fingerprint waited for). The caller keeps the buffer alive until
        the event has passed."""
        runtime = self._cp.cuda.runtime
        run_on = stream
        if aside:
            run_on = self._side
            with self._lock:         # a slot is recorded and waited for before its reuse
                slot = self._marks_next
                self._marks_next = (slot + 1) % len(self._marks)
                mark = self._marks[slot]
                mark.record(stream)
                run_on.wait_event(mark)
        sp = run_on.ptr
        wide = nbytes % 4 == 0 and ptr % 4 == 0
        launch = self._launch(nbytes // 4 if wide else nbytes, wide)
        with self._lock:
            number = self.count
            self.count += 1
            slot = number % self.RING
            word = self._words.data.ptr + 8 * slot
            runtime.memsetAsync(word, 0, 8, sp)
            launch(sp, ptr, word)
            runtime.memcpyAsync(self._host.ctypes.data + 8 * slot, word, 8,
                                runtime.memcpyDeviceToHost, sp)
        done = None
        if event or aside:
            done = self._cp.cuda.Event(block=False, disable_timing=True)
            done.record(run_on)
        return number, done

    def value(self, number: int) -> int | None:
        """The hash ``number``, once its copy has landed; None if its slot was reused."""
        if self.count - number > self.RING:
            return None
        return int(self._host[number % self.RING])

    def hash(self, ptr: int, nbytes: int, stream: Any) -> int:
        """The hash of ``nbytes`` at ``ptr``, waited for: in this thread's own words (not the
        ring, whose slots other threads' `start` calls could reuse while this one waits)."""
        runtime = self._cp.cuda.runtime
        mine = getattr(self._local, "words", None)
        if mine is None:
            mine = self._local.words = (self._cp.empty(1, dtype=np.uint64),
                                        pinned_empty(1, np.uint64))
        word, host = mine
        wide = nbytes % 4 == 0 and ptr % 4 == 0
        launch = self._launch(nbytes // 4 if wide else nbytes, wide)
        sp = stream.ptr
        runtime.memsetAsync(word.data.ptr, 0, 8, sp)
        launch(sp, ptr, word.data.ptr)
        runtime.memcpyAsync(host.ctypes.data, word.data.ptr, 8, runtime.memcpyDeviceToHost, sp)
        stream.synchronize()
        self.waited += 1
        return int(host[0])


#: the process-wide store (`dspk.caches`) of the device hashers, by device
HASHERS = "fingerprint_hashers"


def _hasher(device_id: int) -> _DeviceHasher:
    hashers = shared(HASHERS, dict)
    h = hashers.get(device_id)
    if h is None:
        h = hashers.setdefault(device_id, _DeviceHasher(device_id))
    return h


class PreparedCache:
    """The objects ``build(operand)`` made for recent operands, by `fingerprint`.

    Bounded: at most ``max_entries`` objects and ``max_bytes`` of operands (each entry holds
    its operand); the least recently used go first. Thread-safe; two threads that miss on the
    same operand at once may both build it (the second result is kept).

    Parameters
    ----------
    build : callable
        operand -> the prepared object.
    max_entries : int
    max_bytes : int
    prepare_on : int
        Build on the ``prepare_on``-th sighting of a content; `get` returns None before (the
        caller computes without preparation). 2 where preparing costs more than a call
        without it: an operand used once never pays for it.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.linalg.prepared import PreparedCache
    >>> built = []
    >>> cache = PreparedCache(lambda a: built.append(a.sum()) or float(a.sum()))
    >>> w = np.ones((3, 3))
    >>> cache.get(w), cache.get(w.copy()), len(built)      # the same content: built once
    (9.0, 9.0, 1)
    >>> w[0, 0] = 5.0
    >>> cache.get(w), len(built)                           # modified in place: built again
    (13.0, 2)
    """

    def __init__(self, build: Callable[[Any], Any], max_entries: int = 8,
                 max_bytes: int = 256 << 20, prepare_on: int = 1) -> None:
        self._build = build
        self.prepare_on = int(prepare_on)
        # fingerprint -> (object, nbytes)
        self._entries = LRU(int(max_entries), int(max_bytes), nbytes=lambda entry: entry[1])
        self._seen = LRU(_MAX_SEEN)       # fingerprint -> sightings, not built
        self._pending: list = []          # (identity, (hasher, number, event), operand)
        self._last = LRU(_MAX_SEEN)       # identity -> fingerprint seen there
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @property
    def max_entries(self) -> int:
        """Prepared objects kept, at most (a new bound holds from the next one kept)."""
        return self._entries.max_entries

    @max_entries.setter
    def max_entries(self, value: int) -> None:
        self._entries.max_entries = int(value)

    @property
    def max_bytes(self) -> int:
        """Bytes of operands kept, at most (a new bound holds from the next one kept)."""
        return self._entries.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._entries.max_bytes = int(value)

    def get(self, operand: Any) -> Any:
        """The prepared object for ``operand``: built now on the ``prepare_on``-th sighting of
        this content, None before it.

        With ``prepare_on`` > 1 and a CuPy operand, a buffer whose last known content was not
        seen ``prepare_on`` times is not waited for: its hash is started and counted when it
        has landed (a later call), and None is returned now. Only a buffer that looks
        repeated (or holds a prepared operand) costs the wait for its fingerprint. So a new
        operand on every call never waits, and a repeated one is prepared from its third
        call. `lookup` does the same but lets the caller start the hash later."""
        obj, sight = self.lookup(operand)
        if sight is not None:
            sight()
        return obj

    def lookup(self, operand: Any,
               ident: tuple | None = None) -> tuple[Any, Callable[[], None] | None]:
        """`get`, but where `get` would start a hash without waiting for it, (None, sight):
        the caller computes without preparation, then calls ``sight()``, which starts the
        hash on a side stream. Everything a sighting costs then comes after the caller's
        launch: the hash is off its stream's timeline, and before the launch there are only
        a few dictionary lookups (what a user who times a one-shot call on an idle GPU sees;
        measured on an H200, a hash and its bookkeeping queued before the product made a new
        W's spatial_filter 10% slower than cuBLAS). Otherwise (the object or None, None).
        ``ident``: `buffer_identity` of ``operand``, where the caller has it."""
        if self.prepare_on > 1 and is_cupy_array(operand):
            ident = ident or buffer_identity(operand)
            with self._lock:
                if any(entry[0] == ident for entry in self._pending):
                    self._fold()           # its last sighting counts before deciding
                last = self._last.peek(ident)
                hot = last is not None and (last in self._entries or
                                            self._seen.peek(last, 0) >= self.prepare_on)
            if not hot and _hashable_now(operand):
                return None, lambda: self._sight(ident, operand)
        return self._get_waited(operand), None

    def _sight(self, ident: tuple, operand: Any) -> None:
        started = _start_hash(operand, aside=True)
        with self._lock:
            self._fold()
            self.misses += 1
            self._pending.append((ident, started, operand))   # alive until hashed
            while len(self._pending) > _MAX_SEEN:
                _, (_, _, event0), _ = self._pending.pop(0)
                event0.synchronize()      # rare: more than _MAX_SEEN hashes in flight

    def _get_waited(self, operand: Any) -> Any:
        key = fingerprint(operand)
        if is_cupy_array(operand):
            with self._lock:
                self._remember_last(buffer_identity(operand), key)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self.hits += 1
                return hit[0]
            self.misses += 1
            seen = self._seen.pop(key, 0) + 1
            if seen < self.prepare_on:
                self._seen.put(key, seen)
                return None
        obj = self._build(operand)
        nbytes = int(operand.nbytes)
        with self._lock:
            if nbytes <= self.max_bytes:
                self._entries.put(key, (obj, nbytes))
        return obj

    def _fold(self) -> None:
        """Count the started hashes that have landed (under the lock)."""
        keep = []
        for entry in self._pending:
            ident, (hasher, number, event), _ = entry
            if not event.done:
                keep.append(entry)
                continue
            value = hasher.value(number)
            if value is None:
                continue
            ptr, shape, strides, dtype, dev = ident
            key = ("cupy", dev, shape, dtype, value)
            self._seen.put(key, self._seen.pop(key, 0) + 1)
            self._remember_last(ident, key)
        self._pending = keep

    def _remember_last(self, ident: tuple, key: tuple) -> None:
        self._last.put(ident, key)

    def clear(self) -> None:
        """Forget every prepared object (and every sighting)."""
        with self._lock:
            self._entries.clear()
            self._seen.clear()
            for _, (_, _, event), _ in self._pending:
                event.synchronize()        # the operands may go once their hashes are read
            self._pending.clear()
            self._last.clear()

    def __len__(self) -> int:
        return len(self._entries)
