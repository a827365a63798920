"""matmul(): batched float32/float64 products computed in the operands' own precision, on the
candidate the tuner picked for the shape, layout and device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import cupy_module, is_cupy_array
from .candidates_int import INT_DTYPES
from .engine import Engine, current_engine, default_engine
from .problem import Problem
from .tuner import Choice
from .view import MatrixView

__all__ = ["matmul", "explain", "Explanation", "tuner", "forget", "FLOAT_DTYPES"]

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

#: the default engine's tuner (`dspk.linalg.tuner`); calls use the engine in use
#: (`current_engine`), which is this one outside a ``with Engine(...)`` block
tuner = default_engine().tuner


def _view(x: Any, name: str) -> MatrixView:
    if isinstance(x, MatrixView):
        return x.named(name)
    if isinstance(x, np.ndarray) or is_cupy_array(x):
        return MatrixView.of(x, name)
    raise TypeError(f"{name}: expected a NumPy or CuPy array or a MatrixView, got "
                    f"{type(x).__name__}")


def _overlaps(x: MatrixView, y: MatrixView) -> bool:
    if x.is_gpu != y.is_gpu or x.size == 0 or y.size == 0:
        return False
    if x.is_gpu and x.device_id != y.device_id:
        return False
    x0, x1 = x.byte_range()
    y0, y1 = y.byte_range()
    return x0 <= y1 and y0 <= x1


def as_problem(a: Any, b: Any, out: Any, allowed=FLOAT_DTYPES, what="matmul",
               result_dtype: Any = None) -> tuple:
    """Validate the operands; returns (Problem, result to hand back). The result has the
    operands' dtype unless ``result_dtype`` is given (int64 for integer products)."""
    av, bv = _view(a, "a"), _view(b, "b")
    for v in (av, bv):
        if v.dtype not in allowed:
            raise TypeError(f"{v.name}: unsupported dtype {v.dtype}; {what} takes "
                            f"{', '.join(d.name for d in allowed)}")
    if av.dtype != bv.dtype:
        raise TypeError(f"a is {av.dtype} but b is {bv.dtype}: dspk never promotes or demotes "
                        f"silently; convert one of them explicitly")
    if av.is_gpu != bv.is_gpu:
        raise TypeError("a and b mix NumPy and CuPy arrays; move both to one device first")
    if av.is_gpu and av.device_id != bv.device_id:
        raise ValueError(f"a is on GPU {av.device_id} but b is on GPU {bv.device_id}")
    if av.shape[2] != bv.shape[1]:
        raise ValueError(f"inner dimensions differ: a is [{av.shape[1]}, {av.shape[2]}] and b is "
                         f"[{bv.shape[1]}, {bv.shape[2]}] (a's columns must equal b's rows)")
    ba, bb = av.shape[0], bv.shape[0]
    if ba != bb and 1 not in (ba, bb):
        raise ValueError(f"batch counts differ: a has {ba}, b has {bb} (equal, or one of them 1)")
    B, M, N = max(ba, bb), av.shape[1], bv.shape[2]
    av.check()
    bv.check()
    symmetric = av.is_transpose_of(bv)
    if ba != B:
        av = av.broadcast_to(B)
    if bb != B:
        bv = bv.broadcast_to(B)
    plain_2d = all(not isinstance(x, MatrixView) and x.ndim == 2 for x in (a, b))
    ndim = 2 if plain_2d else 3
    xp = av.xp
    rdt = np.dtype(result_dtype) if result_dtype is not None else av.dtype
    if out is None:
        result = xp.empty((B, M, N) if ndim == 3 else (M, N), dtype=rdt)
        ov = MatrixView.of(result, "out")
    else:
        result = out
        ov = _view(out, "out")
        if ov.dtype != rdt:
            raise TypeError(f"out: dtype {ov.dtype} differs from the result's {rdt}")
        if ov.is_gpu != av.is_gpu or (ov.is_gpu and ov.device_id != av.device_id):
            where = f"GPU {av.device_id}" if av.is_gpu else "the host"
            raise ValueError(f"out: must be on the operands' device ({where})")
        if ov.shape != (B, M, N):
            raise ValueError(f"out: shape {tuple(getattr(out, 'shape', ov.shape))} does not hold "
                             f"the [{B}, {M}, {N}] result")
        if not ov.is_gpu and not ov.buffer.flags.writeable:
            raise ValueError("out: array is read-only")
        ov.check()
        if ov.batches > 1 and ov.strides[0] == 0:
            raise ValueError("out: batch stride 0 would write several results to one place")
        for v in (av, bv):
            if _overlaps(ov, v):
                raise ValueError(f"out overlaps {v.name}: the product cannot be written over its "
                                 f"own input")
    return Problem(av, bv, ov, symmetric), result


def matmul(a: Any, b: Any, out: Any = None) -> Any:
    """Batched matrix product ``out[i] = a[i] · b[i]``, exact in the operands' precision.

    Parameters
    ----------
    a, b : numpy.ndarray, cupy.ndarray or MatrixView
        float32 or float64 (both the same), 2-D ``[M, K]``/``[K, N]`` or 3-D with a batch axis.
        A single-batch operand is broadcast against a batched one.
    out : array or MatrixView, optional
        Where to write the ``[B, M, N]`` (or ``[M, N]``) result; must not overlap ``a`` or ``b``.

    Returns
    -------
    numpy.ndarray or cupy.ndarray
        The array type of the operands: 2-D when both operands are 2-D arrays, else 3-D; ``out``
        itself when given.

    Notes
    -----
    The product is computed in the operands' dtype with fused multiply-adds: never TF32, never
    a silent promotion or demotion. Which kernel runs (cuBLAS, a direct kernel for skinny
    shapes, split-K, BLAS syrk for X·Xᵀ...) is decided by the autotuner; `explain` says which
    and why. An X·Xᵀ product is detected when ``b`` is exactly ``a.T`` over the same memory.
    A repeated call with arrays of the same geometry reuses a bound plan: no validation beyond
    the geometry and no tuner lookup (a few microseconds of Python).

    Examples
    --------
    >>> import numpy as np, dspk
    >>> x = np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32)
    >>> c = dspk.linalg.matmul(x, x.T)          # channel covariance (uncentred)
    >>> c.shape, c.dtype
    ((4, 4), dtype('float32'))
    """
    return product(a, b, out, "matmul")


def product(a: Any, b: Any, out: Any, table: str, allowed: tuple = FLOAT_DTYPES,
            result_dtype: Any = None) -> Any:
    """The body of `matmul` and `int_matmul` (``table`` names the entry point: its plans are
    kept apart): a bound plan for the operands' geometry if the engine in use has one; else
    validate, switch to the operands' GPU, let the tuner choose (running the product), and
    bind the choice for the next call."""
    engine = current_engine()
    sig = operand_signature(a, b, out)
    if sig is not None:
        plan = engine.plans[table].get(sig)
        if plan is not None:
            return plan(a, b, out)
    if is_cupy_array(a) and is_cupy_array(b):
        cp = cupy_module()
        if a.device.id != cp.cuda.runtime.getDevice() and a.device.id == b.device.id:
            with cp.cuda.Device(a.device.id):
                return product(a, b, out, table, allowed, result_dtype)
    p, result = as_problem(a, b, out, allowed=allowed, what=table, result_dtype=result_dtype)
    if p.m == 0 or p.n == 0 or p.batches == 0:
        return result
    if p.k == 0:
        p.out.to_array()[...] = 0
        return result
    choice = engine.tuner.select(p, run=True)
    if sig is not None:
        _remember(engine, table, sig, choice, p, result, a, b, out)
    return result


# -- bound plans: repeated calls with the same geometry ------------------------------------------
_cupy_ndarray: Any = None  # cupy.ndarray, once CuPy has been imported by a call


def operand_signature(a: Any, b: Any, out: Any) -> tuple | None:
    """Everything the choice and the bound runner depend on, for plain arrays: device, shapes,
    strides, dtypes, and whether b is a.T (X·Xᵀ). None for MatrixViews. Kept to cheap attribute
    reads: this runs on every call. (DSPK_TUNE is read when a plan is made; `forget` drops
    the plans.)"""
    global _cupy_ndarray
    ta = type(a)
    if ta is not type(b) or (out is not None and type(out) is not ta):
        return None
    if ta is np.ndarray:
        dev = -1
        misaligned = 0
        if out is not None and not out.flags.writeable:
            return None
    elif ta is _cupy_ndarray or (_cupy_ndarray is None and is_cupy_array(a)):
        _cupy_ndarray = ta
        ad, bd = a.data, b.data
        dev = ad.device_id
        if bd.device_id != dev or (out is not None and out.data.device_id != dev):
            return None
        # 16-byte alignment of the operands decides some candidates (vector loads)
        misaligned = (ad.ptr | bd.ptr | (0 if out is None else out.data.ptr)) & 15
    else:
        return None
    ash, ast, bsh, bst = a.shape, a.strides, b.shape, b.strides
    sym = False
    if len(ash) == 2 and ash == bsh[::-1] and ast == bst[::-1]:
        sym = (a.data.ptr == b.data.ptr) if dev >= 0 else \
            (a.__array_interface__["data"][0] == b.__array_interface__["data"][0])
    if out is None:
        return (dev, ash, ast, a.dtype.char, bsh, bst, b.dtype.char, sym, misaligned)
    return (dev, ash, ast, a.dtype.char, bsh, bst, b.dtype.char, sym, misaligned, out.shape,
            out.strides, out.dtype.char)


def _remember(engine: Engine, table: str, sig: tuple, choice: Any, p: Problem, result: Any,
              a: Any, b: Any, out: Any) -> None:
    """Keep the chosen candidate's bound runner (if it has one) for ``sig`` in the engine's
    plan table ``table``."""
    runner = choice.candidate.bind(p)
    if runner is None:
        return
    plan = _Plan(runner, p, result.shape, a, b, out)
    plan.dtype = result.dtype            # int_matmul: int64 results of integer operands
    engine.remember(table, sig, plan)


def _byte_span(shape: tuple, strides: tuple, itemsize: int) -> tuple[int, int]:
    lo = sum(min(0, s * (n - 1)) for s, n in zip(strides, shape))
    hi = sum(max(0, s * (n - 1)) for s, n in zip(strides, shape)) + itemsize - 1
    return lo, hi


class _Plan:
    """A bound runner for one geometry; checks only what the signature does not fix (device
    selection and, when ``out`` is given, that it does not overlap an input)."""

    __slots__ = ("runner", "shape", "dtype", "gpu", "dev", "span_a", "span_b", "span_o", "_cp",
                 "_get_device", "_new")

    def __init__(self, runner: Any, p: Problem, shape: tuple, a: Any, b: Any, out: Any):
        self.runner = runner
        self.shape = shape
        self.dtype = p.dtype
        self.gpu = p.gpu
        self.dev = p.device_id
        self.span_a = _byte_span(a.shape, a.strides, a.itemsize)
        self.span_b = _byte_span(b.shape, b.strides, b.itemsize)
        self.span_o = None if out is None else _byte_span(out.shape, out.strides, out.itemsize)
        self._cp = cupy_module() if p.gpu else None
        self._get_device = self._cp.cuda.runtime.getDevice if p.gpu else None
        self._new = self._cp.ndarray if p.gpu else np.empty

    def __call__(self, a: Any, b: Any, out: Any) -> Any:
        if self.gpu:
            if self._get_device() != self.dev:
                with self._cp.cuda.Device(self.dev):
                    return self(a, b, out)
            pa, pb = a.data.ptr, b.data.ptr
            if out is None:
                out = self._new(self.shape, self.dtype)
                po = out.data.ptr
            else:
                po = out.data.ptr
                ol, oh = po + self.span_o[0], po + self.span_o[1]
                if (ol <= pa + self.span_a[1] and pa + self.span_a[0] <= oh) or \
                        (ol <= pb + self.span_b[1] and pb + self.span_b[0] <= oh):
                    _any_problem(a, b, out)  # raises the precise error
            self.runner(pa, pb, po)
            return out
        if out is None:
            out = np.empty(self.shape, self.dtype)
        elif np.may_share_memory(out, a) or np.may_share_memory(out, b):
            _any_problem(a, b, out)
        self.runner(a, b, out)
        return out


def forget() -> None:
    """Drop every in-memory tuning decision, bound plan and prepared operand of the engine in
    use, and the caches every engine shares (compiled kernels, plans by geometry: see
    `Engine.forget`); the cache file is read again. Call it after changing ``DSPK_TUNE`` in a
    running process.

    The cache file itself is kept (``dspk tune-cache clear`` removes it).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.linalg import forget, matmul
    >>> x = np.random.default_rng(0).standard_normal((3, 500))
    >>> _ = matmul(x, x.T)           # tuned (or found in the cache file), then bound
    >>> forget()                     # the next call looks its choice up again
    >>> matmul(x, x.T).shape
    (3, 3)
    """
    current_engine().forget()


@dataclass
class Explanation:
    """Which candidate computes a product and why (`explain`); ``str()`` gives a report.

    Parameters
    ----------
    choice : dspk.linalg.tuner.Choice
        The tuner's decision: the candidate, the cache key, where the decision came from
        (``source``), the timings measured and the candidates rejected.
    available : dict
        Candidate name -> ``"available"`` or why it cannot run this product.
    mode : str
        ``DSPK_TUNE`` when the explanation was made.
    shape : tuple
        (batches, M, N, K) of the product.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.linalg import Explanation, explain
    >>> x = np.ones((4, 1000), dtype=np.float32)
    >>> e = explain(x, x.T)
    >>> isinstance(e, Explanation), e.shape, e.available["numpy"]
    (True, (1, 4, 4, 1000), 'available')
    >>> isinstance(e.candidate, str)          # the name of the candidate that runs
    True
    """

    choice: Choice
    available: dict[str, str]
    mode: str
    shape: tuple

    @property
    def candidate(self) -> str:
        """The name of the candidate that computes the product."""
        return self.choice.candidate.name

    def __str__(self) -> str:
        c = self.choice
        lines = [f"product {self.shape[0]} x [{self.shape[1]}, {self.shape[3]}]·"
                 f"[{self.shape[3]}, {self.shape[2]}]",
                 f"key: {c.key}",
                 f"DSPK_TUNE={self.mode}; runs: {c.candidate.name} ({c.candidate.summary})",
                 f"because: {c.source}"]
        if c.tuned:
            lines.append("tuned: " + _HOW_TUNED[c.tuned](c))
        if c.timings_ms:
            what = ("measured (median ms per call)" if c.tuned in ("thorough", "brief") else
                    "measured on the table's machine (median ms per call)"
                    if c.tuned == "table" else
                    "estimated for the whole product from the best sample on each slice (ms)")
            lines.append(f"{what}: " + ", ".join(
                f"{n} {t:.4g}" for n, t in sorted(c.timings_ms.items(), key=lambda kv: kv[1])))
        for name, why in self.available.items():
            if why != "available":
                lines.append(f"  {name}: {why}")
        for name, why in c.rejected.items():
            if not why.startswith("unavailable"):
                lines.append(f"  {name}: rejected: {why}")
        for name, why in c.untimed.items():
            lines.append(f"  {name}: {why}")
        return "\n".join(lines)


def _slices(c: Choice) -> str:
    """The slices a first use timed, grouped: "numpy, blas_syrk on [1, 384, 384, 1536]"."""
    by_shape: dict[tuple, list[str]] = {}
    for name, shape in c.timed_on.items():
        by_shape.setdefault(tuple(shape), []).append(name)
    return "; ".join(f"{', '.join(names)} on {list(shape)}" for shape, names in by_shape.items())


#: how a choice was tuned, in words (`Choice.tuned`)
_HOW_TUNED = {
    "slice": lambda c: (f"on first use, on slices of the product within a budget of about its "
                        f"own time ({_slices(c)}); a thorough tuning (dspk tune, "
                        f"Engine.thorough) times every candidate on the whole product"),
    "brief": lambda c: ("on first use, on the whole product with few samples (within a budget "
                        "of about its own time); a thorough tuning (dspk tune, "
                        "Engine.thorough) takes more"),
    "thorough": lambda c: "thoroughly: every candidate on the whole product, median of samples",
    "table": lambda c: (f"from the shipped table for {c.table.get('class', '?')} (measured on "
                        f"{c.table.get('device', '?')} {c.table.get('measured', '?')}, dspk "
                        f"{c.table.get('dspk', '?')}): a thorough tuning's winner on a machine "
                        f"of this class, not timed here, its result checked on first use; a "
                        f"thorough tuning (dspk tune, Engine.thorough) times this machine's"),
}


def _any_problem(a: Any, b: Any, out: Any) -> tuple:
    """`as_problem` for float or integer operands (integer products give int64)."""
    dt = getattr(a, "dtype", None)
    if dt is not None and np.dtype(dt) in INT_DTYPES:
        return as_problem(a, b, out, allowed=INT_DTYPES, what="int_matmul", result_dtype=np.int64)
    return as_problem(a, b, out)


def explain(a: Any, b: Any, out: Any = None, tune: bool = True) -> Explanation:
    """Which candidate `matmul` (or `int_matmul`, for integer operands) runs, and why.

    With ``tune=True`` an unseen key is tuned now (as `matmul` would: the winners table's
    choice where it covers the key, else tuned on first use); with ``tune=False`` nothing runs
    and an unseen key reports the winners table's choice (checked when a call first uses it),
    else the candidate that would run without timing.

    Parameters
    ----------
    a, b : numpy.ndarray, cupy.ndarray or MatrixView
        The operands, as for `matmul` (float32/float64) or `int_matmul` (uint8/int8/int16);
        validated the same way.
    out : array or MatrixView, optional
        The output the product would write (its layout is part of the key).
    tune : bool
        Tune an unseen key now (True) or report without running anything (False).

    Returns
    -------
    Explanation
        ``str()`` of it: the product, the tuner key, ``DSPK_TUNE``, the candidate that runs
        and why (tuned now, from the cache file, from the shipped winners table...), how it
        was tuned (``"from the shipped table for <class> (measured on <device> <date>..."``
        for a table's choice), the timings measured and why the other candidates cannot run
        or were rejected.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> x = np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32)
    >>> print(dspk.explain(x, x.T, tune=False))     # doctest: +ELLIPSIS
    product 1 x [4, 1000]·[1000, 4]
    key: cpu:...|float32|...|sym
    DSPK_TUNE=...; runs: ...
    because: ...
    """
    p, _ = _any_problem(a, b, out)
    tuner = current_engine().tuner
    names = {c.name: (c.unavailable(p) or "available")
             for c in tuner.candidates(p.gpu, p.dtype.kind)}
    if tune or tuner.mode == "off":
        choice = tuner.select(p, run=False)
    else:
        choice = tuner.cached(p) or (tuner.table_choice(p) if tuner.mode != "off" else None) \
            or tuner.first_available(p, "not tuned yet (explain(tune=False)): first available "
                                        "candidate")
    return Explanation(choice, names, tuner.mode, (p.batches, p.m, p.n, p.k))
