"""The process-wide caches every engine shares, in one registry.

What dspk derives once and reuses is either an engine's own (its tuner's decisions, its bound
plans and prepared operands: `dspk.linalg.Engine`, `Engine.prepared`) or the process's: CUDA
modules compiled per device, cuBLASLt's library and handles, BLAS's thread pool, the plans
kept per operand geometry by the product candidates, the device hashers of `fingerprint`.
The process's are kept here, as named stores made on first use by the module that needs them;
`Engine.forget` (and `dspk.linalg.forget`) clears every one of them, so no other module keeps
a cache of its own.

A store is any object with ``clear()`` and ``len()``: a dict, or an object that owns a
resource (a thread pool, a library handle) and releases it in ``clear()`` where that is safe
while other threads may still hold what they took from it. This module imports nothing of
dspk's, so the lowest modules (the kernels, the BLAS threads, the candidates) can register
here without importing the engine, which imports them.

`LRU` is the bounded mapping the caches that keep only their recent entries are made of (a
store of the registry, or a cache an object keeps of its own).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Iterator, TypeVar

__all__ = ["shared", "forget_shared", "shared_sizes", "LRU"]

S = TypeVar("S")


class _Registry:
    """Named stores, each made once by the first caller's ``make()``."""

    def __init__(self) -> None:
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, name: str, make: Callable[[], Any]) -> Any:
        store = self._stores.get(name)
        if store is None:
            with self._lock:
                store = self._stores.get(name)
                if store is None:
                    store = self._stores[name] = make()
        return store

    def clear(self) -> None:
        with self._lock:
            stores = list(self._stores.values())
        for store in stores:
            store.clear()

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {name: len(store) for name, store in self._stores.items()}


_REGISTRY = _Registry()


def shared(name: str, make: Callable[[], S]) -> S:
    """The process-wide store called ``name``, made by ``make()`` on first use and cleared by
    every engine's `forget` (the store itself stays: a caller may keep it).

    Parameters
    ----------
    name : str
        One name per store (the module's, e.g. ``"cuda_modules"``).
    make : callable
        Makes the empty store: an object with ``clear()`` and ``len()`` (``dict``, say).

    Returns
    -------
    object
        The store.

    Examples
    --------
    >>> from dspk.caches import forget_shared, shared
    >>> plans = shared("example_plans", dict)
    >>> plans["geometry"] = "plan"
    >>> shared("example_plans", dict) is plans
    True
    >>> forget_shared()
    >>> len(plans)
    0
    """
    return _REGISTRY.get(name, make)


def forget_shared() -> None:
    """Clear every process-wide store (`Engine.forget` calls it).

    Examples
    --------
    >>> from dspk.caches import forget_shared, shared_sizes
    >>> forget_shared()
    >>> any(shared_sizes().values())
    False
    """
    _REGISTRY.clear()


def shared_sizes() -> dict[str, int]:
    """Entries held by each process-wide store made so far, by name.

    Examples
    --------
    >>> from dspk.caches import shared, shared_sizes
    >>> shared("example_sizes", dict)["k"] = 1
    >>> shared_sizes()["example_sizes"]
    1
    """
    return _REGISTRY.sizes()


class LRU:
    """A mapping that keeps its most recently used entries: at most ``max_entries`` of them
    and at most ``max_bytes`` of their sizes (``nbytes(value)``); past either, the least
    recently used go first.

    An entry is used when it is put (`put`), read (`get`) or moved (`move_to_end`); `peek`,
    ``in``, `pop` and iteration (least recently used first) leave the order as it is. Not
    thread-safe: a cache shared between threads holds its own lock around it.

    Parameters
    ----------
    max_entries : int, optional
        Entries kept, at most (None: no bound on the count).
    max_bytes : int, optional
        Sum of the entries' ``nbytes`` kept, at most (None: no bound on the size).
    nbytes : callable, optional
        value -> its size in bytes (an int, the same each time it is asked); needed with
        ``max_bytes``.

    Examples
    --------
    >>> from dspk.caches import LRU
    >>> cache = LRU(max_entries=2)
    >>> cache.put("a", 1)
    >>> cache.put("b", 2)
    >>> cache.get("a")                      # "a" used: "b" is now the least recently used
    1
    >>> cache.put("c", 3)                   # one too many: "b" goes
    >>> list(cache.items())
    [('a', 1), ('c', 3)]
    >>> sized = LRU(max_bytes=100, nbytes=len)
    >>> sized.put("x", b"0" * 60)
    >>> sized.put("y", b"1" * 60)           # 120 bytes: "x" goes
    >>> list(sized), sized.total_bytes
    (['y'], 60)
    """

    def __init__(self, max_entries: int | None = None, max_bytes: int | None = None,
                 nbytes: Callable[[Any], int] | None = None) -> None:
        if max_bytes is not None and nbytes is None:
            raise ValueError("nbytes: a byte bound (max_bytes) needs the size of each value")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._nbytes = nbytes
        self._entries: OrderedDict = OrderedDict()
        self._total = 0

    @property
    def total_bytes(self) -> int:
        """The sum of the entries' ``nbytes`` (0 without ``nbytes``)."""
        return self._total

    def _size(self, value: Any) -> int:
        return 0 if self._nbytes is None else int(self._nbytes(value))

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, now the most recently used entry (``default`` when absent)."""
        try:
            self._entries.move_to_end(key)
        except KeyError:
            return default
        return self._entries[key]

    def peek(self, key: Any, default: Any = None) -> Any:
        """The value of ``key`` (``default`` when absent), its place left as it is."""
        return self._entries.get(key, default)

    def put(self, key: Any, value: Any, touch: bool = True) -> None:
        """``value`` for ``key``, then the least recently used entries dropped while the
        bounds are exceeded (the new entry too, were it alone beyond them).

        A new key is the most recently used entry; a key already held becomes it too, unless
        ``touch`` is False: then it keeps its place (as a dict's assignment leaves an
        OrderedDict's order)."""
        old = self._entries.get(key, self)
        if old is not self:
            self._total -= self._size(old)
        self._entries[key] = value
        self._total += self._size(value)
        if touch:
            self._entries.move_to_end(key)
        self._evict()

    def move_to_end(self, key: Any) -> None:
        """``key`` (held: KeyError otherwise) becomes the most recently used entry."""
        self._entries.move_to_end(key)

    def pop(self, key: Any, default: Any = None) -> Any:
        """Remove ``key`` and return its value (``default`` when absent)."""
        value = self._entries.pop(key, self)
        if value is self:
            return default
        self._total -= self._size(value)
        return value

    def _evict(self) -> None:
        while self._entries and (
                (self.max_entries is not None and len(self._entries) > self.max_entries) or
                (self.max_bytes is not None and self._total > self.max_bytes)):
            _, value = self._entries.popitem(last=False)
            self._total -= self._size(value)

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._total = 0

    def __contains__(self, key: Any) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._entries)

    def keys(self) -> Any:
        """The keys, least recently used first."""
        return self._entries.keys()

    def values(self) -> Any:
        """The values, least recently used first."""
        return self._entries.values()

    def items(self) -> Any:
        """The (key, value) pairs, least recently used first."""
        return self._entries.items()

    def __repr__(self) -> str:
        return f"LRU({len(self)} entries, max_entries={self.max_entries}, " \
            f"max_bytes={self.max_bytes})"
