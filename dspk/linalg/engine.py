"""The engine context: everything the product engine and the tuned operations above it keep
between calls, in one object.

An `Engine` holds

- the `Tuner` (its mode and its cache file) that chooses every product's candidate and every
  tuned operation's implementation (FIR, spatial filters, NCC, the median reference);
- the bound plans of `matmul`, `int_matmul` and `int_gram`, by operand geometry (each plan
  owns its per-stream scratch buffers: the workspaces);
- the prepared operands of one-shot calls (`spatial_filter`'s filters, `ncc`'s banks), by name.

One default engine serves the process; its tuner follows ``DSPK_TUNE`` and ``DSPK_CACHE_DIR``
as they are when it is used. Another engine is used inside a ``with`` block::

    with Engine(cache_dir="/scratch/tuning", mode="readonly"):
        y = dspk.spatial_filter(w, x)      # this engine's tuner, plans and prepared filters

The engine in use is a context variable: a ``with`` block covers its own thread (and asyncio
task); threads started inside it begin with the default engine.
"""

from __future__ import annotations

import os
import threading
from contextvars import ContextVar, Token
from typing import Any, Callable

from .problem import Candidate
from .tuner import Tuner

__all__ = ["Engine", "current_engine", "default_engine"]

#: the plan tables every engine has (one per entry point: a float call must never find an
#: integer plan)
PLAN_TABLES = ("matmul", "int_matmul", "int_gram")


def _candidates(gpu: bool) -> list[Candidate]:
    from .candidates_int import int_candidates  # noqa: PLC0415

    if gpu:
        from .candidates_gpu import gpu_candidates  # noqa: PLC0415 (needs CuPy)

        return gpu_candidates() + int_candidates(gpu=True)
    from .candidates_cpu import cpu_candidates  # noqa: PLC0415

    return cpu_candidates() + int_candidates(gpu=False)


class Engine:
    """The tuner, bound plans and prepared operands of dspk's compute engine.

    Parameters
    ----------
    cache_dir : str or os.PathLike, optional
        Folder of the tuner's JSON cache; default ``DSPK_CACHE_DIR`` (else ``~/.cache/dspk``),
        read when the tuner uses it.
    mode : {"on", "off", "readonly"}, optional
        Tune unseen keys (``"on"``), take the first available candidate in a fixed order
        (``"off"``), or use the cache without timing or writing (``"readonly"``); default
        ``DSPK_TUNE``, read when used.

    Attributes
    ----------
    tuner : dspk.linalg.tuner.Tuner
        This engine's tuner.
    plans : dict
        Table name (``"matmul"``, ``"int_matmul"``, ``"int_gram"``) -> {operand signature:
        bound plan}.

    Examples
    --------
    >>> import numpy as np, tempfile
    >>> from dspk.linalg import Engine, current_engine, matmul
    >>> x = np.random.default_rng(0).standard_normal((3, 400))
    >>> with Engine(cache_dir=tempfile.mkdtemp(), mode="off") as engine:
    ...     c = matmul(x, x.T)
    ...     current_engine() is engine, len(engine.plans["matmul"])
    (True, 1)
    >>> current_engine() is engine
    False
    """

    MAX_PLANS = 256

    def __init__(self, cache_dir: str | os.PathLike | None = None,
                 mode: str | None = None) -> None:
        self.tuner = Tuner(_candidates, cache_dir=cache_dir, mode=mode)
        self.plans: dict[str, dict] = {name: {} for name in PLAN_TABLES}
        self._prepared: dict[str, Any] = {}
        self._lock = threading.Lock()

    def prepared(self, name: str, make: Callable[[], Any]) -> Any:
        """The store of prepared operands called ``name`` (made by ``make()`` on first use):
        kept with the engine, so another engine prepares its own."""
        store = self._prepared.get(name)
        if store is None:
            with self._lock:
                store = self._prepared.setdefault(name, make())
        return store

    def remember(self, table: str, signature: tuple, plan: Any) -> None:
        """Keep ``plan`` for ``signature`` in plan table ``table`` (the oldest goes beyond
        `MAX_PLANS`)."""
        plans = self.plans[table]
        with self._lock:
            if len(plans) >= self.MAX_PLANS:
                plans.pop(next(iter(plans)), None)
            plans[signature] = plan

    def forget(self) -> None:
        """Drop every in-memory tuning decision, bound plan and prepared operand (the cache
        file is kept, and read again)."""
        with self._lock:
            for plans in self.plans.values():
                plans.clear()
            for store in self._prepared.values():
                store.clear()
        self.tuner.forget()

    @property
    def mode(self) -> str:
        """The tuner's mode now (``"on"``, ``"off"`` or ``"readonly"``)."""
        return self.tuner.mode

    def __enter__(self) -> "Engine":
        # the reset tokens live in the context too: one engine may be entered by several
        # threads or tasks at once, each unwinding its own blocks
        _TOKENS.set(_TOKENS.get() + (_CURRENT.set(self),))
        return self

    def __exit__(self, *exc: Any) -> None:
        tokens = _TOKENS.get()
        _TOKENS.set(tokens[:-1])
        _CURRENT.reset(tokens[-1])

    def __repr__(self) -> str:
        return (f"Engine(mode={self.tuner.mode!r}, cache={str(self.tuner.cache_file)!r}, "
                f"plans={sum(len(p) for p in self.plans.values())})")


_DEFAULT = Engine()
_CURRENT: ContextVar[Engine] = ContextVar("dspk_engine", default=_DEFAULT)
_TOKENS: ContextVar[tuple[Token, ...]] = ContextVar("dspk_engine_tokens", default=())


def current_engine() -> Engine:
    """The engine in use: the innermost ``with Engine(...)`` of this thread, else the
    default one.

    Returns
    -------
    Engine

    Examples
    --------
    >>> from dspk.linalg import Engine, current_engine, default_engine
    >>> current_engine() is default_engine()
    True
    >>> with Engine(mode="off") as e:
    ...     current_engine() is e
    True
    """
    return _CURRENT.get()


def default_engine() -> Engine:
    """The process's default engine: its tuner follows ``DSPK_TUNE`` and ``DSPK_CACHE_DIR``
    as they are when it is used.

    Returns
    -------
    Engine

    Examples
    --------
    >>> from dspk.linalg import default_engine
    >>> default_engine().mode in ("on", "off", "readonly")
    True
    """
    return _DEFAULT
