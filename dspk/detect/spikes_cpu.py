"""Detection of NumPy input (`_cpu_spikes`): the scores of `dspk.detect.spikes` computed only
where they can reach the threshold (a Cauchy–Schwarz bound per window of `BOUND_WINDOW`
samples), the bank output computed channel by channel in chunks that stay in a core's L2 and
reduced there (`_RowBank`: to the noise, `_cpu_noise`, and to each template's window maxima,
the bound's input), the maxima found among
the points above the threshold alone (`_sparse_maxima`). The spikes of the engine path,
amplitudes to the bit.
"""

from __future__ import annotations

import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..linalg import matmul
from ..linalg.threads import blas_threads, parallel_blocks
from ..ops.fir_cpu import ToeplitzBank, gemm
from .noise import MAD_TO_SD, _inverse_noise, _noise_samples


#: the CPU path tests its bound and computes scores in windows of this many samples
BOUND_WINDOW = 8
#: a window is scored when its bound reaches (1 - BOUND_MARGIN)·threshold²: the bound and the
#: scores round differently (a few float32 ulps), the margin is far above both
BOUND_MARGIN = 1e-3
#: below this threshold the CPU path scores every window (squares of the bound could underflow)
BOUND_MIN_THRESHOLD = 1e-12
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


#: output blocks (of `ToeplitzBank.length` samples) per product of the first pass: the
#: windows' copy and the product stay in a core's L2 (2 MiB on the Xeon measured: 2048
#: blocks of 16 samples, 6 templates, float32 = 0.6 + 0.75 MiB). Measured on 2 shared cores
#: (one thread, 384 x 60 000 float32, the first pass's products and reductions, load ~11):
#: 256/512/1024/2048/4096 blocks took 554/446/416/403/473 ms of CPU
CHUNK_BLOCKS = 2048


class _RowBank:
    """The bank output of NumPy input one channel at a time, in chunks of `CHUNK_BLOCKS`
    output blocks reduced while they are in cache (`_cpu_spikes`, `_cpu_noise`): the products
    of `dspk.ops.fir_cpu.ToeplitzBank` in its own layout (its interior blocks of
    `ToeplitzBank.length` outputs from ``half`` to ``stop``, its edges by `ToeplitzBank.span`,
    computed once for all channels), each chunk's overlapping input windows copied to a
    contiguous per-thread buffer (a plain BLAS operand: numpy's matmul of the strided windows
    spends ~20 % more) and multiplied by the stacked Toeplitz matrix into another, so the
    [C, k, n] output is never written and the bits are `ToeplitzBank`'s (and
    `toeplitz_correlate`'s). Detection calls these products directly rather than
    `dspk.fir_bank`: what is timed here is a product fused with its reductions, not one the
    tuner could time against the bank's other implementations; `toeplitz_gemm` is the bank's
    fastest on the CPU at detection's sizes (6 x 61 taps), and where the tuner chose it the
    bits are those of `dspk.fir_bank`.

    A chunk is reduced to its outputs at the noise samples and to each template's maxima
    over the segments of its blocks that the windows of ``win`` samples (from sample 0) cut
    them into; a window across two blocks (``half`` not a multiple of ``win``) is the larger
    of its two segments' maxima."""

    def __init__(self, x: np.ndarray, bank: np.ndarray, win: int):
        self.x = x
        self.c, self.n = x.shape
        tb = self.tb = ToeplitzBank(bank, self.n, x.dtype)
        self.k, self.taps, self.half, self.win = tb.k, tb.taps, tb.half, int(win)
        self.length = length = tb.length
        # (a window of `BOUND_WINDOW` samples divides the block of 16 whenever there are
        # blocks: n >= 16 then; otherwise the row is one piece, a copy only for short rows)
        self.blocks = tb.blocks if length % self.win == 0 else 0
        if self.blocks == 0:                                # the row in one piece
            self.stop = self.half
            self.head = np.concatenate([tb.span(x, 0, tb.half), tb.span(x, tb.half, self.n)],
                                       axis=2)
            self.tail = self.head[:, :, :0]
        else:
            self.stop = tb.stop
            self.head = tb.span(x, 0, tb.half)              # [C, k, half]
            self.tail = tb.span(x, tb.stop, self.n)         # [C, k, n − stop]
        # a block's segments: [lo, hi) within the block, each inside one window; with
        # f > 0 the first and the last belong to windows shared with the blocks around
        per = length // self.win
        f = (self.win - self.half % self.win) % self.win
        self.f = f
        cuts = [0] + [f + j * self.win for j in range(per + 1) if 0 < f + j * self.win < length]
        self.segments = list(zip(cuts, cuts[1:] + [length]))
        self.chunks = [(b0, min(self.blocks, b0 + CHUNK_BLOCKS))
                       for b0 in range(0, self.blocks, CHUNK_BLOCKS)]
        self.local = threading.local()
        it = x.itemsize                                     # every row's overlapping windows
        self.windows = as_strided(x, shape=(self.c, self.blocks, length + self.taps - 1),
                                  strides=(x.strides[0], length * it, it), writeable=False)
        # the noise samples (`_noise_samples`): per chunk, their flat offsets in the product
        # ([k, m_chunk]: template, then sample), and those of the head and the tail
        idx = _noise_samples(self.n, self.taps)
        self.noise_m = len(idx)
        head_n = self.head.shape[2]
        self.noise_head = idx[idx < head_n]
        self.noise_tail = idx[idx >= max(head_n, self.stop)] - self.stop
        kl = self.k * length
        self.noise_chunk = []
        for b0, b1 in self.chunks:
            t0, t1 = self.half + b0 * length, self.half + b1 * length
            q, r = np.divmod(idx[(idx >= t0) & (idx < t1)] - t0, length)
            self.noise_chunk.append(((q * kl + r)[None, :] +
                                     (np.arange(self.k) * length)[:, None]))

    def buffers(self) -> tuple:
        """(windows, product, segment maxima) of this thread, reused."""
        buf = getattr(self.local, "buf", None)
        if buf is None:
            rows = min(CHUNK_BLOCKS, max(1, self.blocks))
            kk = self.length + self.taps - 1
            dt = self.x.dtype
            buf = (np.empty((rows, kk), dtype=dt),
                   np.empty((rows, self.k * self.length), dtype=dt),
                   np.empty((len(self.segments), rows, self.k), dtype=dt))
            self.local.buf = buf
        return buf

    @staticmethod
    def _pad_max(part: np.ndarray, t0: int, win: int, wmax: np.ndarray) -> None:
        """The maxima of ``part`` [k, m] (outputs t0 ...) over the windows it touches, into
        wmax (a window it has only part of: the maximum over that part)."""
        m = part.shape[1]
        if m == 0:
            return
        for w in range(t0 // win, -(-(t0 + m) // win)):
            lo, hi = max(0, w * win - t0), min(m, (w + 1) * win - t0)
            np.max(part[:, lo:hi], axis=1, out=wmax[w])

    def row(self, c: int, noise: np.ndarray | None, wmax: np.ndarray | None) -> None:
        """Channel c: the outputs at the noise samples into ``noise`` [k, m] (unless None;
        the order of `_noise_samples` within the head, each chunk and the tail) and the
        largest output of each template in each window of ``win`` samples into ``wmax``
        [windows, k] (unless None; the last window's maximum over the samples it has)."""
        k, win, length, half = self.k, self.win, self.length, self.half
        a, p, sg = self.buffers()
        nh = len(self.noise_head)
        col = nh
        if noise is not None and nh:
            noise[:, :nh] = self.head[c][:, self.noise_head]
        if wmax is not None:                       # the head's windows (the last may be
            self._pad_max(self.head[c], 0, win, wmax)      # completed by the first block)
        shared = self.f > 0 and self.blocks > 0
        carry = None                               # the last segment of the previous block
        for (b0, b1), flat in zip(self.chunks, self.noise_chunk):
            m = b1 - b0
            np.copyto(a[:m], self.windows[c, b0:b1])
            if m == 1 or p.shape[1] == 1:                 # (one row or column: `gemm`)
                p[:m] = gemm(a[:m], self.tb.stacked)
            else:
                np.matmul(a[:m], self.tb.stacked, out=p[:m])
            if noise is not None and flat.shape[1]:
                np.take(p[:m].reshape(-1), flat, out=noise[:, col:col + flat.shape[1]])
                col += flat.shape[1]
            if wmax is None:
                continue
            v = p[:m].reshape(m, k, length)
            for s, (lo, hi) in enumerate(self.segments):  # (a chain of maxima: faster
                o = sg[s, :m]                             # than a reduction over a short
                if hi - lo == 1:                          # axis)
                    o[...] = v[:, :, lo]
                else:
                    np.maximum(v[:, :, lo], v[:, :, lo + 1], out=o)
                    for j in range(lo + 2, hi):
                        np.maximum(o, v[:, :, j], out=o)
            t0 = half + b0 * length
            for s, (lo, hi) in enumerate(self.segments):
                w = (t0 + lo) // win
                dst = wmax[w:w + (m - 1) * (length // win) + 1:length // win]
                if shared and s == 0:                     # with the previous block's last
                    prev = wmax[w:w + 1] if b0 == 0 else carry
                    np.maximum(sg[0, :m], np.concatenate([prev, sg[-1, :m - 1]]), out=sg[0, :m])
                if shared and s == len(self.segments) - 1:
                    carry = sg[-1, m - 1:m].copy()        # (completed by the next block)
                    continue
                dst[...] = sg[s, :m]
        if wmax is not None:
            tail = self.tail[c]
            self._pad_max(tail, self.stop, win, wmax)
            if shared:                                    # the window across the last block
                w = self.stop // win                      # and the tail
                wmax[w] = np.maximum(carry[0], wmax[w]) if tail.shape[1] else carry[0]
        if noise is not None and len(self.noise_tail):
            noise[:, col:] = self.tail[c][:, self.noise_tail]


def _row_noise(v: np.ndarray) -> np.ndarray:
    """[k] float64 noise SDs of a channel's outputs at the noise samples ``v`` [k, m]
    (`_template_noise`'s values: the median |v| of each row, the middle value by
    np.partition for odd m, np.median where a row has a NaN or m is even)."""
    a = np.abs(v)
    m = a.shape[1]
    if m % 2 == 0 or np.isnan(a.max()):
        sd = np.median(a, axis=-1)
    else:
        sd = np.partition(a, m // 2, axis=1)[:, m // 2]
    return sd.astype(np.float64) / MAD_TO_SD


def _cpu_noise(x: np.ndarray, bank: np.ndarray) -> np.ndarray:
    """`_template_noise` of NumPy input: [C, k] noise SDs, the bank computed channel by
    channel (`_RowBank`) and never written whole."""
    x = np.ascontiguousarray(x)
    rb = _RowBank(x, bank, min(BOUND_WINDOW, x.shape[1]))
    out = np.zeros((x.shape[0], bank.shape[0]))

    def one(c: int) -> None:
        v = np.empty((rb.k, rb.noise_m), dtype=x.dtype)
        rb.row(c, v, None)
        out[c] = _row_noise(v)

    parallel_blocks(one, range(rb.c))
    return out


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

    The bank output is never written whole (`_RowBank`): a first pass computes it channel by
    channel, `CHUNK_BLOCKS` output blocks at a time, into a buffer that stays in L2 and
    reduces it there to the outputs at the noise samples and to each template's largest
    output per window; at the end of the channel, its noise (unless given;
    `_template_noise`'s values) and the window maxima of m = max(0, maxₖ b·(1 / noise)) (the
    scaling is monotone, so it is applied to the window maxima, to the same bits); a second
    computes again the exact outputs of the (channel, window) pairs a scored pair needs (the
    neighbours of the scored positions: ~10 % of the pairs), the same products by
    `ToeplitzBank.windows`. The channels, the window blocks of the bound and the groups of
    members run on the engine's threads; each score is computed on its own, so neither the
    blocks (the memory budget) nor the thread count change a bit.
    Memory: the bound per window ([C, n / BOUND_WINDOW], dtype and bool), the first pass's
    buffers (per thread: ~1.4 MiB for float32, and one channel's window maxima twice and
    noise samples; the rows' edges), blocks of the later passes within ``memory_bytes`` per
    thread, the needed windows' outputs (k·BOUND_WINDOW values each) and
    the points above the threshold (~28 bytes each)."""
    c, n = x.shape
    k = bank.shape[0]
    nn, n_widths = nbr.shape[1], w.shape[1]
    dt = x.dtype
    isz = dt.itemsize
    x = np.ascontiguousarray(x)
    given = inv_sd is not None
    inv_all = inv_sd.astype(dt) if given else np.empty((c, k), dtype=dt)
    wd = w.astype(dt)
    win = min(BOUND_WINDOW, n)
    n_windows = -(-n // win)
    share = max(1, int(memory_bytes) // max(1, blas_threads()))
    limit = dt.type(threshold * threshold * (1 - BOUND_MARGIN))
    prune = threshold >= BOUND_MIN_THRESHOLD
    rb = _RowBank(x, bank, win)
    tb = rb.tb
    mw = np.empty((c, n_windows), dtype=dt)        # per channel and window: max(0, bs)²

    def peaks(ch: int) -> None:
        """Channel ch: its bank output (`_RowBank.row`) reduced to its noise (unless given)
        and to the largest output of each template in each window; then bs = b·(1 / noise)
        (as _engine_scores) at those maxima (the products with 1 / noise >= 0 are monotone:
        the largest product of a window is the product of its largest output, to the bit),
        the largest over the templates, max(0, ·)², into mw."""
        wm = getattr(rb.local, "wm", None)
        if wm is None:
            wm = rb.local.wm = (np.empty((n_windows, k), dtype=dt),
                                np.empty((k, n_windows), dtype=dt))
        wm, wt = wm
        v = None
        if not given:
            v = getattr(rb.local, "noise", None)
            if v is None:
                v = rb.local.noise = np.empty((k, rb.noise_m), dtype=dt)
        rb.row(ch, v, wm)
        if not given:
            inv_all[ch] = _inverse_noise(_row_noise(v)[None], 1, k)[0].astype(dt)
        inv = inv_all[ch]                          # (raises as before on NaN)
        o = mw[ch]
        np.copyto(wt, wm.T)                        # (one transposed copy: then contiguous)
        np.multiply(wt[0], inv[0], out=o)
        for j in range(1, k):
            np.maximum(o, np.multiply(wt[j], inv[j], out=wt[j]), out=o)
        np.maximum(o, 0, out=o)
        np.multiply(o, o, out=o)

    parallel_blocks(peaks, range(c))
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
