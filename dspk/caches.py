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
"""

from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

__all__ = ["shared", "forget_shared", "shared_sizes"]

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
