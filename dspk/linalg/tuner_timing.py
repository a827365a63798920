"""How the tuner measures and checks a candidate: the first use's budget, the clocks, the
check of a result, the precision probe, the slices of a product.

- The budget (`tuning_budget`, `BUDGET_RATIO` and the constants below it): what a first use's
  tuning may cost against the product's own time, and how it spends it (slices of about
  1/(`SLICE_SHARE` · candidates) of the product, extra samples for those within `CLOSE` of
  the best).
- The clocks: `Stopwatch` times one run (CUDA events on the GPU, the tuner's clock on the
  host) and tells whether a tuning started inside it; `_median_time` is a thorough tuning's
  measure (warm-up, then the median of several samples).
- The check of a result (`_Sampler`): sampled entries of a product against their float64
  (int64) reference, only those rows of ``a`` and columns of ``b`` read.
- The precision probe (`_precision`, `_make_probe`, `_probe_for`): a zero-mean probe on which
  TF32 or any demotion errs ~3e-4 and is rejected (`precision_tolerance`); integer candidates
  must be bit-exact over the dtype's full range.
- The slices (`_cut_dim`, `_slice_for`, `_cut`): the longest dimension cut, the others, the
  layouts and the strides as they are, grown where a candidate cannot run less.
- The operands timed fresh from memory (`_rotation`, `_cycling`): on the GPU, copies of small
  operands cycled so that no candidate is timed on operands hot in L2.

The tuner's two ladders use these: `dspk.linalg.tuner_products` for products,
`dspk.linalg.tuner_operations` for whole operations.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from typing import Any, Callable

import numpy as np

from ..backend import DeviceOutOfMemory, cupy_module, out_of_memory
from .host_checks import fill_rows, read_cols, read_matrix, read_rows
from .problem import Candidate, Problem, prepared
from .threads import single_threaded_blas
from .view import MatrixView

#: the tuner's logger: its modules all log as ``dspk.linalg.tuner``, the name a user filters on
log = logging.getLogger("dspk.linalg.tuner")


def _warn_failed(name: str, key: str, exc: Exception) -> None:
    log.warning("dspk tuner: candidate %s raised %s: %s; rejected for %s", name,
                type(exc).__name__, exc, key)


#: how an entry records a candidate rejected because the device ran out of memory running it
OUT_OF_MEMORY = "out of device memory"


def _failed(name: str, key: str, exc: Exception) -> str:
    """Why a candidate (or an operation's implementation) that raised ``exc`` while tuned for
    ``key`` is rejected, said in the log. One that ran out of device memory
    (`dspk.backend.out_of_memory`: CuPy's ``OutOfMemoryError``, a cuBLAS/cuFFT allocation
    failure) needs more memory than the device has left at this size: it is skipped, the
    others are tried, and it is never the choice stored for the key (the entry records
    it as rejected, `OUT_OF_MEMORY`). Any other error is a warning naming the candidate (a
    missing kernel source in an installed package must not pass unnoticed)."""
    if out_of_memory(exc):
        said = (str(exc).splitlines() or [""])[0][:120] or type(exc).__name__
        log.warning("dspk tuner: candidate %s ran out of device memory (%s); skipped for %s, "
                    "the others are tried", name, said, key)
        return f"{OUT_OF_MEMORY}: {type(exc).__name__}: {said}"
    _warn_failed(name, key, exc)
    return f"failed: {type(exc).__name__}: {exc}"


def _none_left(message: str, rejected: dict[str, str]) -> Exception:
    """The error to raise when no candidate is left (``message`` says for what, with
    ``rejected``): `dspk.backend.DeviceOutOfMemory` when one of them ran out of device memory
    (a smaller problem may fit: a job halves its chunk on it), else RuntimeError. Nothing is
    stored for the key either way."""
    if any(OUT_OF_MEMORY in str(why) for why in rejected.values()):
        return DeviceOutOfMemory(f"{message} (the device ran out of memory: a smaller "
                                 f"problem may fit)")
    return RuntimeError(message)


# -- first-use tuning: what it may cost ------------------------------------------------------------
#: A first use's tuning may take BUDGET_RATIO times the estimated time of the fastest candidate
#: on the whole product (or operation) — the product's own cost — but at least BUDGET_FLOOR_S
#: (below that no timing means anything, and a key is tuned once per machine), and on the GPU
#: at most BUDGET_CAP_S (the goal there: a first call within 0.3 s of a warm one), by device
#: class (False: CPU, True: GPU). The budget decides the extra samples; a candidate is not
#: timed at all when its slice would take the tuning beyond SKIP_RATIO x the budget (a slice
#: grown for the candidate to run it, or candidates before it that cost more than their work).
BUDGET_RATIO = 0.5
BUDGET_FLOOR_S = {False: 0.003, True: 0.03}
BUDGET_CAP_S = {False: math.inf, True: 0.2}
SKIP_RATIO = 1.5
#: Each candidate is timed on about 1/(SLICE_SHARE · candidates) of the product: the timed
#: runs together cost about 1/SLICE_SHARE of one product, which leaves most of the budget to
#: the checks, the cold first runs and extra samples of close contenders. A product of fewer
#: multiply-adds than MIN_SLICE_MACS (CPU: ~0.1-0.3 ms on 2 cores; GPU: a fraction of a ms,
#: where a smaller grid would no longer fill the device) is timed whole, and so is a slice
#: grown to more than 3/4 of its product.
SLICE_SHARE = 4
MIN_SLICE_MACS = {False: 1 << 23, True: 1 << 31}
#: slices are cut to multiples of this many rows, columns or K (batches: any count), which
#: keeps the alignment of what follows the cut (16 and 256 bytes)
SLICE_ALIGN = 64
#: the CPU's precision probe keeps the slice's reduction length (K) and cuts the other
#: dimensions to this many (grown where the candidate cannot run it); the GPU's is the slice
PROBE_MIN = 64
#: the probe's values: a block of this many (a prime: consecutive rows differ) repeated
PROBE_BLOCK = 4093
#: candidates whose estimate is within CLOSE of the best get extra samples (up to
#: MAX_SAMPLES) while the budget lasts; a result check of the whole product (and each slice)
#: looks at SAMPLED_COLS columns of its sampled rows
CLOSE = 1.3
MAX_SAMPLES = 5
SAMPLED_COLS = 32


def tuning_budget(best_s: float, gpu: bool) -> float:
    """Seconds a first use may spend tuning a product (or an operation) whose fastest
    candidate is estimated to take ``best_s`` seconds (see `BUDGET_RATIO`)."""
    return min(BUDGET_CAP_S[gpu], max(BUDGET_FLOOR_S[gpu], BUDGET_RATIO * best_s))


def precision_tolerance(dtype: Any, k: int) -> float:
    """Largest relative Frobenius error accepted on the zero-mean probe for a candidate that
    computes in ``dtype``. TF32 (10-bit mantissa) gives ~3e-4 there; float32 ~1e-7·√K·c."""
    if np.dtype(dtype) == np.float32:
        return min(1e-4, max(2e-5, 1.2e-7 * np.sqrt(k)))
    return max(1e-12, 1e-15 * np.sqrt(k))


# -- clocks ----------------------------------------------------------------------------------------
class Stopwatch:
    """How the tuner times a run: CUDA events on the GPU (the device's time), `clock` on the
    host; and whether a tuning started inside the run (`sample`).

    Parameters
    ----------
    clock : callable
        The host clock (`time.perf_counter`; tests give a fake one).

    Attributes
    ----------
    clock : callable
        The host clock, as given (its tuner's `dspk.linalg.tuner.Tuner.clock`).
    tunings : int
        Tunings its tuner has started: a run inside which one started is no measure of the
        runner (a nested one spoils a timing).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.tunings = 0

    def seconds(self, fn: Callable[[], Any], gpu: bool, reps: int = 1) -> float:
        """Seconds per call of ``fn`` over ``reps`` calls: CUDA events on the GPU (the
        device's time), `clock` on the host."""
        if gpu:
            cp = cupy_module()
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(reps):
                fn()
            stop.record()
            stop.synchronize()
            return cp.cuda.get_elapsed_time(start, stop) * 1e-3 / reps
        t0 = self.clock()
        for _ in range(reps):
            fn()
        return (self.clock() - t0) / reps

    def sample(self, run: Callable[[], Any], gpu: bool) -> tuple[Any, float, bool]:
        """(result, seconds, whether the run was clean: no tuning started inside it — a
        nested tuning's time is no measure of the runner)."""
        before = self.tunings
        box = [None]

        def call() -> None:
            box[0] = run()

        seconds = self.seconds(call, gpu)
        return box[0], seconds, self.tunings == before


def _median_time(fn: Callable[[], None], gpu: bool, budget_s: float = 0.25,
                 clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds per call of ``fn`` after a warm-up (CUDA events on the GPU, ``clock``
    on the host)."""
    if gpu:
        cp = cupy_module()
        start, stop = cp.cuda.Event(), cp.cuda.Event()

        def timed(n: int) -> float:
            start.record()
            for _ in range(n):
                fn()
            stop.record()
            stop.synchronize()
            return cp.cuda.get_elapsed_time(start, stop) * 1e-3 / n
    else:
        def timed(n: int) -> float:
            t0 = clock()
            for _ in range(n):
                fn()
            return (clock() - t0) / n

    fn()
    one = max(timed(1), 1e-7)
    n = int(min(200, max(1, (2e-4 if gpu else 2e-3) / one)))
    samples = max(3, min(9, int(budget_s / (one * n))))
    return float(np.median([timed(n) for _ in range(samples)]))


# -- checking a result, the precision probe --------------------------------------------------------
class NonFiniteOperands(Exception):
    """A product's sampled reference is not finite: its operands hold NaN or infinity. Not a
    candidate's failure (every candidate would be \"wrong\" against a NaN reference, and
    which of them are depends on where the NaN lies): the tuner chooses on a finite probe of
    the same geometry instead (`dspk.linalg.tuner.Tuner._tune`), and the product propagates
    the NaN as IEEE arithmetic does, whatever the cache held."""

    def __init__(self, p: Any):
        super().__init__("the product's operands are not finite")
        self.problem = p


class _Sampler:
    """Sampled entries of a product and their float64 (int64) reference: up to MAX_ROWS rows
    of the first, middle and last batch, every column or up to ``max_cols`` of them (the first
    and last included). Only those rows of ``a`` and columns of ``b`` are read."""

    MAX_ROWS = 8

    def __init__(self, p: Problem, max_cols: int | None = None):
        self.p = p
        B, M, N = p.batches, p.m, p.n
        self.batches = sorted({0, B // 2, B - 1})
        self.rows = sorted({int(r) for r in np.linspace(0, M - 1, min(M, self.MAX_ROWS))})
        self.cols = None if max_cols is None or N <= max_cols else \
            sorted({int(c) for c in np.linspace(0, N - 1, max_cols)})
        # on the GPU the sampled values are read to the host and compared there (host_checks:
        # CuPy's own kernels would be compiled in a first call)
        self.host = p.gpu
        xp = np if self.host else p.a.xp
        self.xp = xp
        self.exact = p.dtype.kind in "iu"
        ref_t = np.int64 if self.exact else np.float64
        if self.host:
            rows = cols = None
            a = read_rows(p.a, self.batches, self.rows).astype(ref_t)
            b = (read_matrix(p.b, self.batches) if self.cols is None
                 else read_cols(p.b, self.batches, self.cols)).astype(ref_t)
        else:
            rows = xp.asarray(self.rows)
            cols = None if self.cols is None else xp.asarray(self.cols)
            av, bv = p.a.to_array(), p.b.to_array()
            a = xp.stack([av[i][rows] for i in self.batches]).astype(ref_t)
            b = xp.stack([bv[i] if cols is None else bv[i][:, cols]
                          for i in self.batches]).astype(ref_t)
        # a small product: one BLAS thread (waking BLAS's threads on a loaded machine took
        # 0.04-0.6 s for 3 x 30 000 x 32 float64 on 2 cores)
        with single_threaded_blas() if xp is np else nullcontext():
            if not self.exact:
                self.ref = xp.matmul(a, b)
                if not bool(xp.isfinite(self.ref).all()):
                    # NaN or inf in the operands (or a float64 overflow): no candidate can be
                    # checked against this reference; the tuner chooses on a finite probe
                    raise NonFiniteOperands(p)
                self.absprod = xp.matmul(xp.abs(a), xp.abs(b))
            else:
                self.absprod = None
                bound = p.k * int(np.abs(a).max(initial=0)) * int(np.abs(b).max(initial=0))
                if bound < 2**53:  # every float64 partial sum is an exact integer: BLAS
                    self.ref = np.rint(np.matmul(a.astype(np.float64), b.astype(np.float64))
                                       ).astype(np.int64)
                else:              # NumPy's int64 loop (no BLAS: ~30x slower)
                    self.ref = np.matmul(a, b)
        self._rows, self._cols = rows, cols

    def _out_rows(self) -> Any:
        if self.host:
            got = read_rows(self.p.out, self.batches, self.rows)
            return got if self.cols is None else got[:, :, self.cols]
        out = self.p.out.to_array()
        got = [out[i][self._rows] for i in self.batches]
        if self._cols is not None:
            got = [g[:, self._cols] for g in got]
        return self.xp.stack(got)

    def poison(self) -> None:
        if self.host:  # the sampled rows whole (every candidate writes every output)
            out = self.p.out
            value = np.iinfo(out.dtype).min if out.dtype.kind in "iu" else np.nan
            fill_rows(out, self.batches, self.rows, value)
            return
        out = self.p.out.to_array()
        value = np.iinfo(np.int64).min if self.exact else np.nan
        for bi in self.batches:
            if self._cols is None:
                out[bi, self.rows, :] = value
            else:
                out[bi][self.xp.ix_(self._rows, self._cols)] = value

    def relative_error(self) -> float:
        xp = self.xp
        diff = self._out_rows().astype(np.float64) - self.ref
        return float(xp.linalg.norm(diff) / max(float(xp.linalg.norm(self.ref)), 1e-300))

    def check_result(self) -> str | None:
        if self.exact:
            got = self._out_rows()
            wrong = int(np.count_nonzero(got != self.ref))
            return None if wrong == 0 else (f"{wrong} of {got.size} sampled outputs differ from "
                                            f"the int64 reference")
        xp = self.xp
        got = self._out_rows().astype(np.float64)
        eps = float(np.finfo(self.p.dtype).eps)
        k = max(self.p.k, 1)
        bound = min(k, 64 * np.sqrt(k)) * eps * self.absprod + 1e-30
        err = xp.abs(got - self.ref)
        ok = bool(xp.all(err <= bound))  # NaN (an unwritten output) fails here
        if ok:
            return None
        worst = float(xp.nanmax(err / bound)) if bool(xp.isfinite(got).all()) else float("nan")
        return (f"sampled outputs differ from the float64 reference beyond the rounding bound "
                f"(worst {worst:.3g}x the bound; NaN means an output was not written)")


def _precision(run: Callable[[Problem], Any], probe: Problem, sampler: _Sampler,
               dtype: Any) -> str | None:
    """Run a candidate on the precision probe: None, or why it is rejected (an integer
    candidate not bit-exact over the full range; a float one beyond `precision_tolerance`)."""
    sampler.poison()
    run(probe)
    if sampler.exact:
        bad = sampler.check_result()
        return None if not bad else f"not bit-exact on a full-range probe: {bad}"
    err = sampler.relative_error()
    tol = precision_tolerance(dtype, probe.k)
    if err <= tol:
        return None
    if not err <= 1e-2:  # no rounding errs this much (NaN: an output not written)
        return (f"wrong result on the precision probe: relative error {err:.2e} against the "
                f"float64 reference")
    return (f"precision check failed: relative error {err:.2e} > {tol:.1e} on a zero-mean probe "
            f"(not computed in {np.dtype(dtype).name}?)")


def _probe_values(xp: Any, shape: tuple, dtype: Any) -> Any:
    """Probe values for an operand of ``shape``: a fixed block of PROBE_BLOCK zero-mean normal
    values (integers: the dtype's full range, both extremes included, which exercises every
    correction) repeated — as hard on precision as fresh values, and cheap for large probes."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(12345)
    n = int(np.prod(shape))
    size = min(n, PROBE_BLOCK)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        block = rng.integers(info.min, int(info.max) + 1, size, dtype=dtype)
        block[:2] = (info.min, info.max)[:size]
    else:
        block = rng.standard_normal(size, dtype=dtype)
    block = xp.asarray(block)
    if n > size:
        block = xp.tile(block, -(-n // size))[:n]
    return block.reshape(shape)


def _make_probe(p: Problem) -> Problem:
    """``p``'s geometry — strides, and addresses modulo 256 bytes (alignment decides some
    kernels) — over new buffers no larger than the views reach (views over the same memory,
    X and X.T, share one), the operands filled with `_probe_values`, the output not."""
    xp = p.a.xp
    views = (p.a, p.b, p.out)
    reach: dict[int, list[int]] = {}
    for v in views:
        lo, hi = v.extent()
        span = reach.setdefault(_base(v), [lo, hi])
        span[0], span[1] = min(span[0], lo), max(span[1], hi)
    buffers: dict[int, tuple[Any, int]] = {}
    for base, (lo, hi) in reach.items():
        item = p.a.itemsize if base in (_base(p.a), _base(p.b)) else p.out.itemsize
        dtype = p.a.dtype if base in (_base(p.a), _base(p.b)) else p.out.dtype
        shift = ((base + lo * item) % 256) // item
        buffers[base] = (xp.empty(shift + hi - lo + 1, dtype=dtype), shift - lo)

    def clone(v: MatrixView) -> MatrixView:
        buf, delta = buffers[_base(v)]
        return MatrixView(buf, v.shape, v.strides, v.offset + delta, v.name)

    a, b, out = (clone(v) for v in views)
    if xp is np:
        for v in (a, b):
            v.to_array()[...] = _probe_values(np, v.shape, v.dtype)
        return Problem(a, b, out, p.symmetric)
    # GPU: the values written into host copies of the buffers, then one copy each (CuPy's
    # strided assignment would compile a kernel in the first call). A buffer whose view's
    # elements overlap (the lags of `dspk.motion.pairwise_displacement`: a batch stride of one
    # element) is filled as a whole, the view reading the values as they lie: through the
    # view, an hour's rigid registration wrote 800 M probe values into 7.6 M elements (15 s
    # of its first call on the GPU machine)
    hosts: dict[int, tuple[Any, np.ndarray]] = {}
    for v in (a, b):
        buf = v.buffer
        if id(buf) not in hosts:
            hosts[id(buf)] = (buf, np.zeros(buf.size, buf.dtype))
        host = hosts[id(buf)][1]
        if v.size > buf.size:
            host[...] = _probe_values(np, host.shape, v.dtype)
        else:
            MatrixView(host, v.shape, v.strides, v.offset, v.name).to_array()[...] = \
                _probe_values(np, v.shape, v.dtype)
    for buf, host in hosts.values():
        buf.set(host)
    return Problem(a, b, out, p.symmetric)


def _base(v: MatrixView) -> int:
    return v.buffer.data.ptr if v.is_gpu else v.buffer.ctypes.data


# -- slices of a product ---------------------------------------------------------------------------
def _macs(p: Problem) -> int:
    """Multiply-adds of a product."""
    return p.batches * p.m * p.n * p.k


def _shape(p: Problem) -> tuple:
    return (p.batches, p.m, p.n, p.k)


def _dim_size(p: Problem, dim: str) -> int:
    return {"b": p.batches, "m": p.m, "n": p.n, "k": p.k, "mn": p.m}[dim]


def _cut_dim(p: Problem) -> str | None:
    """The dimension a slice cuts: the longest (ties: N, K, M, batches), the one whose cost per
    element the others fix — the samples of W·X, the reduction of X·Xᵀ. X·Xᵀ keeps b = aᵀ, so
    its rows and columns are cut together (``"mn"``) or K. None when none is worth cutting."""
    dims = [("k", p.k), ("mn", p.m), ("b", p.batches)] if p.symmetric else \
        [("n", p.n), ("k", p.k), ("m", p.m), ("b", p.batches)]
    dim, size = max(dims, key=lambda d: d[1])
    return dim if size > (1 if dim == "b" else SLICE_ALIGN) else None


def _cut(p: Problem, dim: str, size: int) -> Problem:
    """``p`` on the first ``size`` batches, rows, columns, K or (X·Xᵀ) rows and columns:
    views into its operands and output, nothing copied."""
    a, b, out = p.a, p.b, p.out
    if dim == "b":
        a, b, out = a.batch(0, size), b.batch(0, size), out.batch(0, size)
    elif dim == "m":
        a, out = a.rows(0, size), out.rows(0, size)
    elif dim == "n":
        b, out = b.cols(0, size), out.cols(0, size)
    elif dim == "k":
        a, b = a.cols(0, size), b.rows(0, size)
    else:  # "mn"
        a, b, out = a.rows(0, size), b.cols(0, size), out.rows(0, size).cols(0, size)
    return Problem(a, b, out, p.symmetric)


def _aligned(size: float, dim: str, full: int) -> int:
    step = 1 if dim == "b" else SLICE_ALIGN
    return min(full, max(step, -(-math.ceil(size) // step) * step))


def _slice_for(p: Problem, dim: str, target: int, c: Candidate) -> Problem:
    """The smallest slice of ``p`` along ``dim`` of at least ``target`` multiply-adds that
    ``c`` can run (a split-K candidate needs K of 4 chunks, say), or ``p`` itself when that
    is 3/4 of it or more: doubling from the target until ``c`` can run it, then bisecting
    back (availability grows with the size)."""
    full = _dim_size(p, dim)
    frac = target / _macs(p)
    size = _aligned(full * (math.sqrt(frac) if dim == "mn" else frac), dim, full)
    step = 1 if dim == "b" else SLICE_ALIGN
    low = None                                   # the largest size known unavailable
    while size < full and c.unavailable(_cut(p, dim, size)) is not None:
        low, size = size, _aligned(2 * size, dim, full)
    if low is not None:
        hi = size                                # available (or the whole)
        while hi - low > step:
            mid = _aligned((low + hi) / 2, dim, full)
            if mid >= hi:
                break
            if c.unavailable(_cut(p, dim, mid)) is None:
                hi = mid
            else:
                low = mid
        size = hi
    return p if 4 * size >= 3 * full else _cut(p, dim, size)


def _probe_for(q: Problem, c: Candidate,
               made: dict[tuple, tuple[Problem, _Sampler]]) -> tuple[Problem, _Sampler]:
    """The precision probe for ``c`` timed on slice ``q`` (and its sampler), made once per
    geometry in ``made``: on the CPU ``q`` with its K and its other dimensions cut to
    PROBE_MIN (doubled until ``c`` can run it), on the GPU ``q``'s own geometry."""
    geometry = q
    if not q.gpu:
        dims = ("mn", "b") if q.symmetric else ("m", "n", "b")
        size = PROBE_MIN
        while True:
            r = q
            for d in dims:
                if _dim_size(r, d) > size:
                    r = _cut(r, d, size)
            if r is q or c.unavailable(r) is None:
                geometry = r
                break
            size *= 2
    key = (_shape(geometry), geometry.a.strides, geometry.b.strides, geometry.out.strides)
    found = made.get(key)
    if found is None:
        probe = _make_probe(geometry)
        found = made[key] = (probe, _Sampler(probe))
    return found


# -- operands fresh from memory (GPU) --------------------------------------------------------------
#: Operand bytes the tuner's timing cycles through, in multiples of the GPU's L2 cache, and
#: the most operand sets it makes to get there. Timed back to back on one set, a product whose
#: operands fit in L2 (W·X of 64 channels, a 61 -> 6 projection) reads them from L2, and the
#: candidate that wins there is not the one that wins on operands fresh from memory, which is
#: what a pipeline's chunk is and what the benchmarks time: measured on an H200 for the
#: projection, direct_wxv2k16 0.0140 ms against direct_wxtile128c1s6w16 0.0116 with inputs
#: rotated beyond L2, while the L2-hot timing ranked them the other way.
ROTATE_L2_MULTIPLE = 4
ROTATE_MAX_SETS = 8


def _rotation(p: Problem) -> list[Problem]:
    """``p`` and copies of its operands (same values, strides and 256-byte alignment, fresh
    outputs) enough that timing cycles through ROTATE_L2_MULTIPLE times the GPU's L2: ``[p]``
    on the CPU, when the operands alone are that large, or when memory for copies is short."""
    if not p.gpu:
        return [p]
    cp = cupy_module()
    views = {id(v): v for v in (p.a, p.b, p.out)}
    footprint = sum((v.extent()[1] - v.extent()[0] + 1) * v.itemsize for v in views.values())
    l2 = int(cp.cuda.runtime.getDeviceProperties(p.a.device_id).get("l2CacheSize", 0))
    if footprint == 0 or l2 == 0 or footprint >= ROTATE_L2_MULTIPLE * l2:
        return [p]
    sets = min(ROTATE_MAX_SETS, -(-ROTATE_L2_MULTIPLE * l2 // footprint))
    out = [p]
    try:
        for _ in range(sets - 1):
            copies: dict[tuple, Any] = {}

            def clone(v: MatrixView, fill: bool) -> MatrixView:
                lo, hi = v.extent()
                addr = v.buffer.data.ptr + lo * v.itemsize
                shift = (addr % 256) // v.itemsize        # keep the address modulo 256
                ident = (v.buffer.data.ptr, lo, hi)       # X and X.T share one copy
                buf = copies.get(ident)
                if buf is None:
                    buf = cp.empty(shift + hi - lo + 1, dtype=v.dtype)
                    if fill:  # (a copy, not CuPy's assignment kernel: nothing compiled)
                        cp.cuda.runtime.memcpyAsync(
                            buf.data.ptr + shift * v.itemsize,
                            v.buffer.data.ptr + lo * v.itemsize, (hi - lo + 1) * v.itemsize,
                            cp.cuda.runtime.memcpyDeviceToDevice,
                            cp.cuda.get_current_stream().ptr)
                    copies[ident] = buf
                return MatrixView(buf, v.shape, v.strides, v.offset - lo + shift, v.name)

            if any(v.buffer.data.ptr % v.itemsize for v in views.values()):
                return [p]
            out.append(Problem(clone(p.a, True), clone(p.b, True), clone(p.out, False),
                               p.symmetric))
    except cp.cuda.memory.OutOfMemoryError:
        pass                                   # time on the sets made so far
    return out


def _cycling(c: Candidate, sets: list[Problem]) -> Callable[[], None]:
    """``c`` bound on each operand set, one call per set in turn."""
    calls = [prepared(c, q) for q in sets]
    if len(calls) == 1:
        return calls[0]
    state = [0]

    def run() -> None:
        i = state[0]
        state[0] = i + 1 if i + 1 < len(calls) else 0
        calls[i]()

    return run

