"""The engine context: everything the product engine and the tuned operations above it keep
between calls, in one object.

An `Engine` holds

- the `Tuner` (its mode and its cache file) that chooses every product's candidate and every
  tuned operation's implementation (FIR, spatial filters, NCC, the median reference);
- the bound plans of `matmul`, `int_matmul` and `int_gram`, by operand geometry (each plan
  owns its per-stream scratch buffers: the workspaces);
- the named stores of the operations above the product engine (`Engine.prepared`): the
  prepared operands of one-shot calls (`spatial_filter`'s filters, `ncc`'s banks), their
  packed launches, by name.

What every engine shares — compiled CUDA modules, cuBLASLt and BLAS thread resources, plans
kept per operand geometry below the tuner's choice — is in `dspk.caches`, made by the modules
that use it; `Engine.forget` clears those too, so an engine's `forget` leaves nothing derived
in memory (`Engine.cache_sizes` lists it all).

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
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any, Callable, Iterator

from ..caches import forget_shared, shared_sizes
from .candidates_cpu import cpu_candidates
from .candidates_gpu import gpu_candidates
from .candidates_int import int_candidates
from .problem import Candidate
from .tuner import Tuner

__all__ = ["Engine", "current_engine", "default_engine"]

#: the plan tables every engine has (one per entry point: a float call must never find an
#: integer plan)
PLAN_TABLES = ("matmul", "int_matmul", "int_gram")


def candidates(gpu: bool, tuner: Tuner) -> list[Candidate]:
    """Every candidate of a device class, in the order used when tuning is off (float, then
    integer); ``tuner`` (theirs) also chooses the float product integer candidates may use."""
    if gpu:
        return gpu_candidates() + int_candidates(True, tuner)
    return cpu_candidates() + int_candidates(False, tuner)


class Engine:
    """The tuner, bound plans and prepared operands of dspk's compute engine.

    Parameters
    ----------
    cache_dir : str or os.PathLike, optional
        Folder of the tuner's JSON cache; default ``DSPK_CACHE_DIR`` (else ``~/.cache/dspk``),
        read when the tuner uses it.
    mode : {"on", "off", "readonly"}, optional
        Tune unseen keys (``"on"``), take the first available candidate in a fixed order
        (``"off"``), or use the cache and the winners tables without timing or writing
        (``"readonly"``); default ``DSPK_TUNE``, read when used.
    winners : str, os.PathLike or False, optional
        The folder of the winners tables the tuner looks a key up in after its cache
        (`dspk.linalg.winners`); False: none; default ``DSPK_WINNERS`` (unset: the package's
        tables), read when used.

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
    >>> engine.forget()                    # every cache emptied, this engine's and the process's
    >>> any(engine.cache_sizes().values())
    False
    """

    MAX_PLANS = 256

    def __init__(self, cache_dir: str | os.PathLike | None = None,
                 mode: str | None = None,
                 winners: str | os.PathLike | bool | None = None) -> None:
        self.tuner = Tuner(lambda gpu: candidates(gpu, self.tuner), cache_dir=cache_dir,
                           mode=mode, winners=winners)
        self.plans: dict[str, dict] = {name: {} for name in PLAN_TABLES}
        self._prepared: dict[str, Any] = {}
        self._lock = threading.Lock()

    def prepared(self, name: str, make: Callable[[], Any]) -> Any:
        """The store called ``name`` (made by ``make()`` on first use: an object with
        ``clear()`` and ``len()``, a dict say), kept with the engine, so another engine makes
        its own; `forget` clears it (the store itself stays: a caller may keep it)."""
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
        """Drop every in-memory tuning decision, bound plan and store of this engine, and
        every process-wide cache (`dspk.caches`: compiled kernels, cuBLASLt and BLAS thread
        resources, plans by geometry), which every engine shares. The cache file is kept, and
        read again; what is dropped is made again when next needed, and gives the same
        results."""
        self._drop_bound()
        self.tuner.forget()
        forget_shared()

    @contextmanager
    def thorough(self) -> Iterator["Engine"]:
        """Tune thoroughly inside the block (what ``dspk tune`` and `dspk.Pipeline.tune`
        are for): every key met is tuned on the whole product (or operation), every candidate
        timed by the median of several samples, and a choice a first use made on a slice is
        replaced (`dspk.linalg.tuner.Tuner.thorough`). The engine's bound plans and prepared
        stores are dropped on entry, so that calls in the block reach the tuner again rather
        than a plan bound to a first use's choice. The engine is the one in use inside the
        block (as in ``with engine:``).

        A thorough tuning may change a stored choice, and with it the last bits of what
        follows: run it before jobs, not between a killed job and its resumption.

        Examples
        --------
        >>> import numpy as np, tempfile
        >>> from dspk.linalg import Engine, explain, matmul
        >>> x = np.random.default_rng(0).standard_normal((4, 3000))
        >>> engine = Engine(cache_dir=tempfile.mkdtemp(), mode="on")
        >>> with engine.thorough():
        ...     c = matmul(x, x.T)
        ...     explain(x, x.T).choice.tuned
        'thorough'
        """
        self._drop_bound()
        with self, self.tuner.thorough():
            yield self

    def _drop_bound(self) -> None:
        """Drop the bound plans and the prepared stores (not the tuner's choices)."""
        with self._lock:
            for plans in self.plans.values():
                plans.clear()
            stores = list(self._prepared.values())
        for store in stores:
            store.clear()

    def cache_sizes(self) -> dict[str, int]:
        """Entries held by everything `forget` clears: ``"plans:<table>"``, ``"tuner"``,
        ``"prepared:<name>"`` (this engine's) and ``"shared:<name>"`` (the process's)."""
        with self._lock:
            sizes = {f"plans:{name}": len(plans) for name, plans in self.plans.items()}
            sizes.update({f"prepared:{name}": len(store)
                          for name, store in self._prepared.items()})
        sizes["tuner"] = self.tuner.entries_in_memory()
        sizes.update({f"shared:{name}": n for name, n in shared_sizes().items()})
        return sizes

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
