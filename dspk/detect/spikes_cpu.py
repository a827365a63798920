"""Detection of NumPy input (`_cpu_spikes`): the scores of `dspk.detect.spikes` computed only
where they can reach the threshold (a Cauchy–Schwarz bound per window of `BOUND_WINDOW`
samples), the bank output computed channel block by channel block and reduced while it is in
cache (`_BankBlocks`: to the noise, `_cpu_noise`, and to the bound), the maxima found among
the points above the threshold alone (`_sparse_maxima`). The spikes of the engine path,
amplitudes to the bit.
"""

from __future__ import annotations

import threading

import numpy as np

from ..linalg import matmul
from ..linalg.threads import blas_threads, parallel_blocks
from ..ops.fir_cpu import ToeplitzBank
from .noise import (MAD_TO_SD, NOISE_BLOCK_BYTES, NOISE_SAMPLES, _abs_median_rows,
                    _inverse_noise, _noise_samples)


#: the CPU path tests its bound and computes scores in windows of this many samples
BOUND_WINDOW = 8
#: a window is scored when its bound reaches (1 - BOUND_MARGIN)·threshold²: the bound and the
#: scores round differently (a few float32 ulps), the margin is far above both
BOUND_MARGIN = 1e-3
#: below this threshold the CPU path scores every window (squares of the bound could underflow)
BOUND_MIN_THRESHOLD = 1e-12
#: channels per block of the bound's pass over the bank output (a block stays in cache)
BOUND_ROWS = 4
#: time samples per block of the bound's neighbour sums
BOUND_BLOCK = 4096
#: windows of one position per product member, at least (more when the product would be
#: small enough for the engine to consider a non-BLAS candidate: see `_cpu_spikes`)
MEMBER_WINDOWS = 8
#: windows per product of the second pass of `_cpu_spikes` (the exact outputs again)
WINDOWS_PER_PRODUCT = 4096
#: product members per `dspk.matmul` call, at most (the last call is padded: one shape per
#: probe and bank, tuned once)
MEMBERS_PER_CALL = 256


class _BankBlocks:
    """The bank output of NumPy input channel block by channel block, each block reduced
    while it is in cache (`_cpu_spikes`, `_cpu_noise`): the products of
    `dspk.ops.fir_cpu.ToeplitzBank` into per-thread buffers that are reused, so the
    [C, k, n] output is never written (on 2 cores: 276 MB of new pages and three passes over
    them for 384 x 30 000 float32). Detection calls these products directly rather than
    `dspk.fir_bank`: what is timed here is a product fused with its reduction, not one the
    tuner could time against the bank's other implementations; `toeplitz_gemm` is the bank's
    fastest on the CPU at detection's sizes (6 x 61 taps), and where the tuner chose it the
    bits are those of `dspk.fir_bank`."""

    def __init__(self, x: np.ndarray, bank: np.ndarray):
        self.x = x
        self.c, self.n = x.shape
        self.tb = ToeplitzBank(bank, self.n, x.dtype)
        self.local = threading.local()
        tb = self.tb
        # where the noise samples sit in a block's pieces (interior, head, tail)
        idx = _noise_samples(self.n, tb.taps)
        mid = (idx >= tb.half) & (idx < tb.stop)
        q, r = np.divmod(idx[mid] - tb.half, tb.length)
        self.noise_mid = ((q * tb.k * tb.length + r)[None, :] +
                          (np.arange(tb.k) * tb.length)[:, None]).ravel()   # [k·m_mid] flat
        self.noise_head = idx[idx < tb.half]
        self.noise_tail = idx[idx >= tb.stop] - tb.stop

    def block(self, c0: int, c1: int) -> tuple:
        """(interior [rows, blocks, k, L] in this thread's buffer, head [rows, k, half], tail
        [rows, k, n − stop]) of channels [c0, c1)."""
        tb = self.tb
        buf = getattr(self.local, "buf", None)
        if buf is None or buf.shape[0] < c1 - c0:
            buf = np.empty((c1 - c0, max(tb.blocks, 1), tb.k * tb.length), dtype=self.x.dtype)
            self.local.buf = buf
        for i in range(c1 - c0):
            tb.interior(self.x, c0 + i, buf[i, :tb.blocks])
        inner = buf[:c1 - c0, :tb.blocks].reshape(c1 - c0, tb.blocks, tb.k, tb.length)
        rows = self.x[c0:c1]
        return inner, tb.span(rows, 0, tb.half), tb.span(rows, tb.stop, self.n)

    def noise(self, inner: np.ndarray, head: np.ndarray, tail: np.ndarray) -> np.ndarray:
        """[rows, k] float64 noise SDs of a block (`_template_noise`'s values: the median is
        of the same outputs at the same samples, in another order)."""
        rows, k = head.shape[:2]
        mid = np.take(inner.reshape(rows, -1), self.noise_mid, axis=1)   # (4x faster than
        v = np.concatenate([mid.reshape(rows, k, -1),                    # a 2-D index)
                            head[:, :, self.noise_head], tail[:, :, self.noise_tail]], axis=2)
        sd = _abs_median_rows(v.reshape(rows * k, -1)) if v.shape[2] % 2 else \
            np.median(np.abs(v), axis=-1)
        return sd.reshape(rows, k).astype(np.float64) / MAD_TO_SD


def _cpu_noise(x: np.ndarray, bank: np.ndarray) -> np.ndarray:
    """`_template_noise` of NumPy input: [C, k] noise SDs, the bank computed channel block by
    channel block (`_BankBlocks`) and never written whole."""
    bb = _BankBlocks(np.ascontiguousarray(x), bank)
    rows = max(1, min(BOUND_ROWS, NOISE_BLOCK_BYTES // max(1, bank.shape[0] * x.shape[1]
                                                            * x.itemsize)))
    parts = parallel_blocks(lambda c0: bb.noise(*bb.block(c0, min(bb.c, c0 + rows))),
                            range(0, bb.c, rows))
    return np.concatenate(parts) if parts else np.zeros((0, bank.shape[0]))


def _cpu_spikes(x: np.ndarray, bank: np.ndarray, nbr: np.ndarray, w: np.ndarray,
                inv_sd: np.ndarray | None, threshold: float, dead: int,
                memory_bytes: int) -> tuple:
    """(positions, samples, scores, best templates) of the spikes of NumPy input: the
    scores of `_engine_scores` (bit for bit where its `fir_bank` is the Toeplitz products:
    the same products, summed in the same order by the same BLAS) and the maxima of
    `_local_maxima`, computed only where a score can reach the threshold.

    A score is Σₙ w[p, s, n]·bs[nbr[p, n], k, t] with bs the noise-scaled bank output and
    w ≥ 0 of unit norm, so by Cauchy–Schwarz it is at most √(Σₙ max(0, bs[nbr[p, n], k, t])²)
    ≤ √(Σₙ m[nbr[p, n], t]²) with m = max(0, maxₖ bs), and within a window of `BOUND_WINDOW`
    samples at most √(Σₙ (max over the window of m[nbr[p, n]])²). Only the (position, window)
    pairs where that bound reaches the threshold (2–4 % of them on whitened Neuropixels data
    with ~750 spikes/s) are scored: the windows' bank outputs gathered for the neighbours,
    multiplied by the weights with `dspk.matmul` (``MEMBER_WINDOWS`` windows of one position
    per member). Every other score is below the threshold, and a score below the threshold
    neither is a spike nor suppresses one (a spike is at least the threshold and at least
    every score around it), so the maxima are found among the scored points above the
    threshold alone (`_sparse_maxima`).

    The bank output is never written whole (`_BankBlocks`): a first pass computes it channel
    block by channel block into a buffer that stays in cache and reduces it there to the
    noise (unless given; `_template_noise`'s values), bs = b·(1 / noise) and the window maxima
    of m; a second computes again the exact outputs of the (channel, window) pairs a scored
    pair needs (the neighbours of the scored positions: ~10 % of the pairs), the same
    products by `ToeplitzBank.windows`. The channel blocks, the window blocks of the bound
    and the groups of members run on the engine's threads; each score is computed on its
    own, so neither the blocks (the memory budget) nor the thread count change a bit.
    Memory: the bound per window ([C, n / BOUND_WINDOW], dtype and bool), blocks within
    ``memory_bytes`` per thread, the needed windows' outputs (k·BOUND_WINDOW values each) and
    the points above the threshold (~28 bytes each)."""
    c, n = x.shape
    k = bank.shape[0]
    nn, n_widths = nbr.shape[1], w.shape[1]
    dt = x.dtype
    isz = dt.itemsize
    x = np.ascontiguousarray(x)
    bb = _BankBlocks(x, bank)
    given = inv_sd is not None
    inv_all = inv_sd.astype(dt) if given else np.empty((c, k), dtype=dt)
    wd = w.astype(dt)
    win = min(BOUND_WINDOW, n)
    n_windows = -(-n // win)
    share = max(1, int(memory_bytes) // max(1, blas_threads()))
    limit = dt.type(threshold * threshold * (1 - BOUND_MARGIN))
    prune = threshold >= BOUND_MIN_THRESHOLD
    mw = np.empty((c, n_windows), dtype=dt)        # per channel and window: max(0, bs)²
    tb = bb.tb
    half, stop = tb.half, tb.stop

    def peaks(c0: int) -> None:
        """Channels [c0, c0 + rows): their bank output (`_BankBlocks.block`), its noise
        (unless given), bs = b·(1 / noise) (as _engine_scores), and the largest max(0, bs) of
        each window over the templates, squared, into mw."""
        c1 = min(c, c0 + rows)
        inner, head, tail = bb.block(c0, c1)
        if not given:
            inv_all[c0:c1] = _inverse_noise(bb.noise(inner, head, tail), c1 - c0,
                                            k).astype(dt)    # (raises as before on NaN)
        inv = inv_all[c0:c1]
        np.multiply(inner, inv[:, None, :, None], out=inner)
        np.multiply(head, inv[:, :, None], out=head)
        np.multiply(tail, inv[:, :, None], out=tail)
        m = getattr(bb.local, "m", None)
        if m is None or m.shape[0] < c1 - c0:
            m = bb.local.m = np.zeros((c1 - c0, n_windows * win), dtype=dt)  # zeros pad
        m = m[:c1 - c0]                                                      # the last window
        mi = m[:, half:stop].reshape(c1 - c0, tb.blocks, tb.length)
        if k == 1:
            mi[...] = inner[:, :, 0]
        else:                                      # (a chain of maxima: faster than a
            np.maximum(inner[:, :, 0], inner[:, :, 1], out=mi)   # reduction over a short
            for j in range(2, k):                                # middle axis)
                np.maximum(mi, inner[:, :, j], out=mi)
        np.max(head, axis=1, out=m[:, :half])
        np.max(tail, axis=1, out=m[:, stop:n])
        np.maximum(m, 0, out=m)
        o = mw[c0:c1]
        np.maximum(m[:, 0::win], m[:, 1::win] if win > 1 else m[:, 0::win], out=o)
        for j in range(2, win):                    # (faster than a max over an axis of
            np.maximum(o, m[:, j::win], out=o)     # `win` elements)
        np.multiply(o, o, out=o)

    # channels in blocks of a few whole rows (their bank output stays in cache)
    rows = max(1, min(BOUND_ROWS, share // max(1, (k * n + n_windows * win + k * NOISE_SAMPLES)
                                                  * isz)))
    parallel_blocks(peaks, range(0, c, rows))
    block = max(1, min(BOUND_BLOCK // win, share // max(1, 2 * c * isz)))
    active = np.ones((c, n_windows), dtype=bool)   # (position, window) may reach threshold

    def bound(w0: int) -> None:
        """The bound of windows [w0, w0 + block) (NaN passes: scored as before)."""
        part = mw[:, w0:w0 + block]
        e = part[nbr[:, 0]]
        for j in range(1, nn):
            e += part[nbr[:, j]]
        np.logical_not(e < limit, out=active[:, w0:w0 + block])

    if prune:
        parallel_blocks(bound, range(0, n_windows, block))
    pos, wi = np.nonzero(active)                   # by position, then window
    # the (channel, window) pairs a scored pair needs: its neighbours' windows, computed again
    # (the same products), scaled as in the first pass; row `len(need)` is zeros (empty slots)
    needed = np.zeros(c * n_windows, dtype=bool)
    needed[(nbr[pos] * n_windows + wi[:, None]).ravel()] = True
    need = np.flatnonzero(needed)
    lookup = np.full(c * n_windows, len(need), dtype=np.int64)
    lookup[need] = np.arange(len(need))
    exact = np.zeros((len(need) + 1, k, win), dtype=dt)
    need_ch, need_start = need // n_windows, np.minimum((need % n_windows) * win, n - win)
    chunk = max(1, min(WINDOWS_PER_PRODUCT, share // max(1, (2 * k + 1) * (win + tb.taps)
                                                         * isz)))

    def recompute(j0: int) -> None:
        ch = need_ch[j0:j0 + chunk]
        e = tb.windows(x, ch, need_start[j0:j0 + chunk], win)
        np.multiply(e, inv_all[ch][:, :, None], out=exact[j0:j0 + len(ch)])

    parallel_blocks(recompute, range(0, len(need), chunk))
    # members: `per` window slots of one position; a product of fewer than 4097 multiply-adds
    # per member could go to the engine's einsum candidate (other roundings), so never fewer
    per = max(MEMBER_WINDOWS, -(-4097 // (n_widths * nn * k * win)))
    counts = np.bincount(pos, minlength=c)
    members_of = -(-counts // per)
    first_slot = (np.cumsum(members_of) - members_of) * per
    first_win = np.cumsum(counts) - counts
    size = (nn + n_widths + 2) * per * k * win * isz            # bytes per member, about
    mb = max(1, min(MEMBERS_PER_CALL, share // max(1, size)))   # members per product
    total = -(-int(members_of.sum()) // mb) * mb                # padded: one shape
    member_pos = np.zeros(total, dtype=np.int64)
    member_pos[:members_of.sum()] = np.repeat(np.arange(c), members_of)
    slot_win = np.full(total * per, -1, dtype=np.int64)         # -1: an empty slot
    slot_win[first_slot[pos] + np.arange(len(pos)) - first_win[pos]] = wi
    offsets = np.arange(win)

    def score(m0: int) -> tuple:
        """(positions, samples, scores, templates) above the threshold in members
        [m0, m0 + mb)."""
        mp = member_pos[m0:m0 + mb]
        sw = slot_win[m0 * per:(m0 + mb) * per]
        start = np.where(sw >= 0, np.minimum(sw * win, n - win), 0)    # the last: shifted
        key = nbr[mp][:, :, None] * n_windows + sw.reshape(mb, 1, per)
        g = exact[np.where(sw.reshape(mb, 1, per) >= 0, lookup[key], len(need))]
        s = matmul(wd[mp], g.reshape(mb, nn, per * k * win))           # [mb, S, per·k·win]
        top = s[:, 0].copy()
        for j in range(1, n_widths):                                   # the best width
            np.maximum(top, s[:, j], out=top)
        s = top.reshape(mb, per, k, win)
        top = s[:, :, 0].copy()                                        # the best template:
        best = np.zeros(top.shape, dtype=np.int64)                     # the first of equals,
        for j in range(1, k):                                          # as argmax (a chain of
            v = s[:, :, j]                                             # maxima is faster than
            best[v > top] = j                                          # reductions over short
            np.maximum(top, v, out=top)                                # axes)
        top, best = top.reshape(-1, win), best.reshape(-1, win)        # [slots, win]
        t = start[:, None] + offsets
        hit = (top >= threshold) & (sw[:, None] >= 0) & (t >= sw[:, None] * win)
        slot, col = np.nonzero(hit)
        return mp[slot // per], t[slot, col], top[slot, col], best[slot, col]

    parts = parallel_blocks(score, range(0, total, mb))
    if not parts:
        none = np.zeros(0, np.int64)
        return none, none, np.zeros(0, dt), none
    p, t, s, best = (np.concatenate(v) for v in zip(*parts))
    keep = _sparse_maxima(p, t, s, nbr, dead, n)
    return p[keep], t[keep], s[keep], best[keep]


def _sparse_maxima(p: np.ndarray, t: np.ndarray, s: np.ndarray, nbr: np.ndarray, dead: int,
                   n: int) -> np.ndarray:
    """Which of the points (p, t) of score s (every score >= the threshold; any other score
    is lower) are `_local_maxima`: at least every score within ±dead samples at p and at the
    positions ``nbr[p, 1:]``. A point below the next or the previous sample of its position
    is none; the others are compared with the window maxima of a sparse table over the points
    sorted by (position, sample): first their own position's, then the neighbours'."""
    m = len(s)
    keep = np.zeros(m, dtype=bool)
    if m == 0:
        return keep
    stride = n + 2 * dead + 1                      # a position's keys never reach the next's
    key = p * stride + (t + dead)
    order = None
    if np.any(key[1:] <= key[:-1]):                # (`_cpu_spikes` gives them sorted)
        order = np.argsort(key)
        key, s = key[order], s[order]
    adjacent = key[1:] == key[:-1] + 1
    cand = np.ones(m, dtype=bool)
    cand[1:] &= ~(adjacent & (s[:-1] > s[1:]))
    cand[:-1] &= ~(adjacent & (s[1:] > s[:-1]))
    levels = [s]                                   # levels[i][j] = max(s[j:j + 2**i])
    while 2 << (len(levels) - 1) <= min(m, 2 * dead + 1):
        half = 1 << (len(levels) - 1)
        levels.append(np.maximum(levels[-1][:-half], levels[-1][half:]))

    def window_max(centre: np.ndarray) -> np.ndarray:
        lo = np.searchsorted(key, centre - dead, "left")
        hi = np.searchsorted(key, centre + dead, "right")
        out = np.full(len(centre), -np.inf, dtype=s.dtype)
        length = hi - lo
        level = np.frexp(length)[1] - 1                          # floor(log2(length))
        for i in np.unique(level[length > 0]):
            at = np.flatnonzero((length > 0) & (level == i))
            out[at] = np.maximum(levels[i][lo[at]], levels[i][hi[at] - (1 << int(i))])
        return out

    at = np.flatnonzero(cand)
    around = window_max(key[at])                   # its own position (itself included)
    up = s[at] >= around
    at, around = at[up], around[up]
    ps, ts = key[at] // stride, key[at] % stride
    for j in range(1, nbr.shape[1]):
        np.maximum(around, window_max(nbr[ps, j] * stride + ts), out=around)
    keep[at if order is None else order[at]] = s[at] >= around
    return keep
