"""GPU kernels of `dspk.detect` (dspk/kernels/detect.cu): the spatial combination fused with
its maxima over widths and templates (`scores`), the local maxima of the score (`peaks`),
and the median of each row's absolute values (`row_abs_median`, the robust noise of
`dspk.detect.noise`). CuPy arrays only; the caller checks ``fused_reason`` first (why the
kernels cannot take the inputs, or None) and uses the engine path otherwise.

The filter bank runs time block by time block (`dspk.fir_bank` on the block plus ``taps//2``
samples of real data on each side, zero only outside the recording), so the [channels,
templates, samples] bank output is bounded by ``memory_bytes`` and every block gives what
the whole batch would have given."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from ..kernels import FLOAT_DTYPES, LAUNCH, ctype, declare_instances, kernel
from ..ops import fir_bank

DS_THREADS, DS_R = LAUNCH["DS_THREADS"], LAUNCH["DS_R"]
DS_TILE = DS_THREADS * DS_R
DS_NN_MAX = LAUNCH["DS_NN_MAX"]
DP_THREADS = LAUNCH["DP_THREADS"]
S_MAX = 8                               # widths: detect_score<T, S> is compiled for S <= S_MAX
K_MAX = 127                             # templates: best_k is int8
#: first guess at the room for peaks (a 2-s batch of 384 channels has a few thousand)
PEAKS_CAPACITY = 1 << 16
_INT_MAX = 2**31 - 1


def fused_reason(x: Any, k: int, widths: int, nn: int, dead: int = 0) -> str | None:
    """Why the fused kernels cannot take these sizes (None if they can)."""
    if x.dtype not in FLOAT_DTYPES:
        return f"dtype {x.dtype}"
    if not 1 <= widths <= S_MAX:
        return f"{widths} widths (the kernels are compiled for 1 to {S_MAX})"
    if not 1 <= nn <= DS_NN_MAX:
        return f"{nn} neighbours (at most {DS_NN_MAX})"
    if not 1 <= k <= K_MAX:
        return f"{k} templates (at most {K_MAX}: best template as int8)"
    c, n = x.shape
    if c > _INT_MAX or n + dead + DS_TILE > _INT_MAX:
        return "more than 2^31 channels or samples"
    return None


def time_blocks(n: int, taps: int, block: int) -> Iterator[tuple[int, int, int, int]]:
    """(t0, t1, lo, hi): output samples [t0, t1) of blocks of ``block`` samples, and the input
    samples [lo, hi) that give them — taps//2 more on each side inside [0, n), widened to at
    least ``taps`` samples (fir_bank's minimum; more real data changes nothing)."""
    h = taps // 2
    block = max(1, int(block))
    for t0 in range(0, n, block):
        t1 = min(n, t0 + block)
        lo, hi = max(0, t0 - h), min(n, t1 + h)
        if hi - lo < taps:
            lo = max(0, hi - taps)
            hi = min(n, lo + taps)
        yield t0, t1, lo, hi


def block_samples(c: int, k: int, taps: int, itemsize: int, memory_bytes: int) -> int:
    """Samples per time block so that the bank output of a block ([c, k, block + taps - 1])
    stays within ``memory_bytes`` (at least 1)."""
    per_sample = c * k * itemsize
    return max(1, min(int(memory_bytes) // max(1, per_sample) - 2 * (taps // 2), 1 << 24))


def _score_expression(dtype: Any, widths: int) -> str:
    return f"detect_score<{ctype(dtype)}, {widths}>"


def _expression(name: str, dtype: Any) -> str:
    return f"{name}<{ctype(dtype)}>"


def _instances(props: dict) -> list[str]:
    """detect_score for 1 to S_MAX widths, the peaks and the row medians, both dtypes."""
    return [*(_score_expression(dt, s) for dt in FLOAT_DTYPES for s in range(1, S_MAX + 1)),
            *(_expression(n, dt) for dt in FLOAT_DTYPES
              for n in ("row_abs_median", "detect_peaks"))]


declare_instances("detect.cu", _instances)


def _score_fn(dtype: Any, widths: int) -> Any:
    return kernel("detect.cu", _score_expression(dtype, widths))


def score_block(b: Any, b_off: int, nt: int, nbr: Any, w: Any, inv_sd: Any, score: Any,
                best_k: Any, out_off: int) -> None:
    """score/best_k[:, out_off : out_off + nt] from the bank output ``b`` [C, k, L] (samples
    b_off .. b_off + nt of it), each channel's template outputs scaled by ``inv_sd`` [C, k]:
    the best width and template per position (detect.cu)."""
    import cupy as cp  # noqa: PLC0415 (GPU-only module)

    C, k, L = b.shape
    if not (0 <= b_off and b_off + nt <= L and out_off + nt <= score.shape[1]):
        raise ValueError(f"score_block: samples {b_off}..{b_off + nt} of {L}, out at {out_off}")
    if b.strides[2] != b.itemsize:
        b = cp.ascontiguousarray(b)
    P, S, nn = w.shape
    if nt == 0 or P == 0:
        return
    isz = b.itemsize
    fn = _score_fn(b.dtype, S)
    tiles = -(-nt // DS_TILE)
    fn((P, min(tiles, 65535)), (DS_THREADS,),
       (b, np.int64(b.strides[0] // isz), np.int64(b.strides[1] // isz), np.int64(b_off),
        np.int32(k), np.int32(nt), nbr, np.int32(nn), w, inv_sd, score, best_k,
        np.int64(score.strides[0] // score.itemsize), np.int64(out_off)))


def scores(x: Any, bank: np.ndarray, nbr: np.ndarray, w: np.ndarray, inv_sd: np.ndarray,
           memory_bytes: int) -> tuple:
    """(score [C, n] in x's dtype, best_k [C, n] int8): for every position p and sample t the
    maximum over widths s and templates i of
    Σ_j w[p, s, j]·fir_bank(x, bank)[nbr[p, j], i, t]·inv_sd[nbr[p, j], i] and the template of
    that maximum, computed time block by time block (the bank output of one block at a time,
    within ``memory_bytes``).

    Parameters
    ----------
    x : cupy.ndarray
        [C, n] float32 or float64.
    bank : numpy.ndarray
        [k, taps] (odd taps), in x's precision.
    nbr : numpy.ndarray
        [C, nn] neighbour channels of each position (int, in [0, C)).
    w : numpy.ndarray
        [C, S, nn] spatial weights.
    inv_sd : numpy.ndarray
        [C, k] the inverse noise SD of each channel's template outputs.
    """
    import cupy as cp  # noqa: PLC0415 (GPU-only module)

    C, n = x.shape
    k, taps = bank.shape
    nbr_d = cp.asarray(np.ascontiguousarray(nbr, dtype=np.int32))
    w_d = cp.asarray(np.ascontiguousarray(w, dtype=x.dtype))
    inv_d = cp.asarray(np.ascontiguousarray(inv_sd, dtype=x.dtype))
    score = cp.empty((C, n), dtype=x.dtype)
    best_k = cp.empty((C, n), dtype=np.int8)
    block = block_samples(C, k, taps, x.itemsize, memory_bytes)
    for t0, t1, lo, hi in time_blocks(n, taps, block):
        b = fir_bank(x[:, lo:hi], bank)                        # [C, k, hi - lo]
        score_block(b, t0 - lo, t1 - t0, nbr_d, w_d, inv_d, score, best_k, t0)
        del b                                                  # back to the pool for the next
    return score, best_k


RM_THREADS = LAUNCH["RM_THREADS"]
#: a row of row_abs_median sits in (default, not opted-in) shared memory
RM_MAX_BYTES = 48 * 1024


def row_abs_median(a: Any, steps: int) -> Any:
    """[rows] the median of |a[r, :]| for a [rows, m] float array with m odd and
    m·itemsize <= `RM_MAX_BYTES` (detect.cu: each row in shared memory, bisection on the
    value)."""
    import cupy as cp  # noqa: PLC0415 (GPU-only module)

    rows, m = a.shape
    if m % 2 == 0 or m * a.itemsize > RM_MAX_BYTES:
        raise ValueError(f"row_abs_median: rows of odd length up to {RM_MAX_BYTES} bytes, got "
                         f"{m} x {a.itemsize} bytes")
    if a.strides[1] != a.itemsize:
        a = cp.ascontiguousarray(a)
    out = cp.empty(rows, dtype=a.dtype)
    if rows:
        kernel("detect.cu", _expression("row_abs_median", a.dtype))(
            (rows,), (RM_THREADS,), (a, np.int64(a.strides[0] // a.itemsize), np.int32(m),
                                     np.int32(steps), out), shared_mem=m * a.itemsize)
    return out


def peaks(score: Any, nbr: np.ndarray, threshold: float, dead: int,
          capacity: int = PEAKS_CAPACITY) -> tuple:
    """(positions, samples) as host int64 arrays, unordered: the score >= threshold and the
    largest within ±dead samples at its own and its neighbouring positions (``nbr[p, 1:]``),
    like `dspk.detect.spikes._local_maxima`. A first launch with room for ``capacity`` peaks; if
    there were more, a second with room for all of them."""
    import cupy as cp  # noqa: PLC0415 (GPU-only module)

    C, n = score.shape
    nbr_d = cp.asarray(np.ascontiguousarray(nbr, dtype=np.int32))
    nn = nbr_d.shape[1]
    fn = kernel("detect.cu", _expression("detect_peaks", score.dtype))
    thr = score.dtype.type(threshold)          # NumPy compares float32 scores in float32
    cap = max(1, int(capacity))
    count = cp.zeros(1, dtype=np.uint64)
    while True:
        out = cp.empty(cap, dtype=np.int64)
        count.fill(0)
        fn((-(-n // DP_THREADS), min(C, 65535)), (DP_THREADS,),
           (score, np.int64(score.strides[0] // score.itemsize), np.int32(C), np.int32(n),
            nbr_d, np.int32(nn), thr, np.int32(dead), out, count, np.int64(cap)))
        m = int(count.get()[0])
        if m <= cap:
            break
        cap = m                                 # the same kernel finds exactly m again
    flat = out[:m].get()
    return flat // n, flat % n
