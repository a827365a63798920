"""The neighbourhood-sparse spatial filter kernel (dspk/kernels/spatial.cu, ``sparse_rows``):
its plan, built once per matrix on the host, and its launch. CuPy arrays only.

The plan orders W's rows so that rows with overlapping neighbourhoods sit together (reverse
Cuthill–McKee on the pattern of a square W: a probe's channels in any order come out sorted
along the probe; otherwise by mean column), cuts them into groups of `SR_R` rows (one warp
each) and the groups into blocks of G groups (one thread block each), and stores per group
the sorted union of its rows' columns with the rows' weights on it, and per block the union of
its groups' columns (the x rows it stages in shared memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import device_properties
from ..kernels import FLOAT_DTYPES, LAUNCH, FastLaunch, ctype, declare_instances, kernel

SR_R = LAUNCH["SR_R"]          # rows per group


#: 16-byte vectors per lane the kernels are compiled for
VPL = (1, 2)


def _expression(dtype: Any, vpl: int, pipe: bool) -> str:
    return f"{'sparse_rows_pipe' if pipe else 'sparse_rows'}<{ctype(dtype)}, {vpl}>"


declare_instances("spatial.cu", lambda props: [_expression(dt, v, pipe) for dt in FLOAT_DTYPES
                                               for v in VPL for pipe in (False, True)])


def tile_samples(dtype: Any, vpl: int = 2) -> int:
    """Samples per block: ``vpl`` 16-byte vectors per lane."""
    return 32 * vpl * (16 // np.dtype(dtype).itemsize)


def row_order(pattern: np.ndarray) -> np.ndarray:
    """Rows with overlapping column sets next to each other."""
    m, c = pattern.shape
    if m == c:
        from scipy.sparse import csr_matrix  # noqa: PLC0415 (slow import: when used)
        from scipy.sparse.csgraph import reverse_cuthill_mckee  # noqa: PLC0415 (slow import)

        sym = csr_matrix(pattern | pattern.T)
        return np.asarray(reverse_cuthill_mckee(sym, symmetric_mode=True), dtype=np.int64)
    cols = np.arange(c, dtype=np.float64)
    counts = np.maximum(pattern.sum(axis=1), 1)
    return np.argsort((pattern * cols).sum(axis=1) / counts, kind="stable")


def _cat(parts: list, dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


class SparseRowsPlan:
    """W [M, C] (host, any float) laid out for ``sparse_rows`` with ``groups`` groups of
    `SR_R` rows per block and ``vpl`` vectors of samples per lane, in ``dtype`` on the current
    device."""

    def __init__(self, w: np.ndarray, dtype: Any, groups: int, vpl: int = 2,
                 pipe: bool = False) -> None:
        import cupy as cp  # noqa: PLC0415 (GPU-only module)

        if vpl not in VPL:
            raise ValueError(f"vpl: expected 1 or 2, got {vpl}")
        self.dtype = np.dtype(dtype)
        self.groups = int(groups)
        self.vpl = int(vpl)
        #: persistent, double-buffered blocks (sparse_rows_pipe): twice the shared memory
        self.pipe = bool(pipe)
        self.shape = w.shape
        m, c = w.shape
        pattern = w != 0
        order = row_order(pattern)
        n_groups = -(-m // SR_R)
        rows = np.full(n_groups * SR_R, -1, dtype=np.int32)
        rows[:m] = order
        gcols_all, goff, gw_all = [], [0], []
        bcols_all, boff = [], [0]
        most = 0
        for b0 in range(0, n_groups, self.groups):
            glist = range(b0, min(n_groups, b0 + self.groups))
            unions = []
            for g in glist:
                rs = rows[g * SR_R:(g + 1) * SR_R]
                real = rs[rs >= 0]
                unions.append(np.flatnonzero(pattern[real].any(axis=0)))
            busy = np.unique(np.concatenate(unions)) if unions else np.zeros(0, np.int64)
            if busy.size == 0:     # all-zero rows: stage one column so the block is valid
                busy = np.zeros(1, dtype=np.int64)
            most = max(most, busy.size)
            bcols_all.append(busy)
            boff.append(boff[-1] + busy.size)
            for g, cols in zip(glist, unions):
                rs = rows[g * SR_R:(g + 1) * SR_R]
                wg = np.zeros((cols.size, SR_R), dtype=np.float64)
                for r, row in enumerate(rs):
                    if row >= 0:
                        wg[:, r] = w[row, cols]
                gcols_all.append(np.searchsorted(busy, cols))
                gw_all.append(wg)
                goff.append(goff[-1] + cols.size)
        self.n_groups = n_groups
        self.n_blocks = len(boff) - 1
        self.max_union = most
        self.smem = (2 if self.pipe else 1) * most * tile_samples(self.dtype, self.vpl) * \
            self.dtype.itemsize
        self.mean_group_cols = goff[-1] / max(1, n_groups)
        self._dev = {
            "bcols": cp.asarray(_cat(bcols_all, np.int32)),
            "boff": cp.asarray(np.asarray(boff, dtype=np.int32)),
            "gcols": cp.asarray(_cat(gcols_all, np.int32)),
            "goff": cp.asarray(np.asarray(goff, dtype=np.int32)),
            "gw": cp.asarray(np.concatenate(gw_all).astype(self.dtype).reshape(-1)
                             if gw_all else np.zeros(0, self.dtype)),
            "grows": cp.asarray(rows),
        }
        self._launches: dict = {}

    def reason(self, device_id: int) -> str | None:
        """Why this plan cannot run on the device (None if it can)."""
        optin = int(device_properties(device_id).get("sharedMemPerBlockOptin", 48 * 1024))
        if self.smem > optin:
            return (f"a block's neighbourhood union ({self.max_union} channels) does not fit "
                    f"in shared memory")
        return None

    def _bind(self, x: Any, out: Any) -> FastLaunch:
        n = x.shape[1]
        ldx, ldo = x.strides[0] // x.itemsize, out.strides[0] // out.itemsize
        vec = int(x.data.ptr % 16 == 0 and out.data.ptr % 16 == 0 and
                  (ldx * x.itemsize) % 16 == 0 and (ldo * out.itemsize) % 16 == 0)
        key = (n, ldx, ldo, vec, x.device.id)
        launch = self._launches.get(key)
        if launch is None:
            fn = kernel("spatial.cu", _expression(self.dtype, self.vpl, self.pipe))
            if fn.max_dynamic_shared_size_bytes < self.smem:
                fn.max_dynamic_shared_size_bytes = self.smem
            d = self._dev
            ts = tile_samples(self.dtype, self.vpl)
            args = [("ptr", None), ("i64", ldx), ("i32", n), ("ptr", d["bcols"]),
                    ("ptr", d["boff"]), ("ptr", d["gcols"]), ("ptr", d["goff"]),
                    ("ptr", d["gw"]), ("ptr", d["grows"]), ("i32", self.n_groups),
                    ("ptr", None), ("i64", ldo), ("i32", vec)]
            tiles = -(-n // ts)
            if self.pipe:   # enough persistent blocks to fill every SM, each looping on tiles
                props = device_properties(x.device.id)
                per_sm = max(1, int(props.get("sharedMemPerMultiprocessor", 228 * 1024)) //
                             (self.smem + 1024))
                sms = int(props.get("multiProcessorCount", 1))
                tiles = min(tiles, max(1, -(-per_sm * sms // self.n_blocks)))
            launch = FastLaunch(fn, (self.n_blocks, tiles), (32 * self.groups,), args,
                                shared_mem=self.smem)
            self._launches[key] = launch
        return launch

    def __call__(self, x: Any) -> Any:
        """W·x for CuPy x [C, n] of the plan's dtype."""
        import cupy as cp  # noqa: PLC0415 (CuPy input)

        if x.strides[1] != x.itemsize:
            x = cp.ascontiguousarray(x)
        out = cp.empty((self.shape[0], x.shape[1]), dtype=self.dtype)
        if x.shape[1] == 0 or self.n_blocks == 0:
            return out
        stream = cp.cuda.get_current_stream().ptr
        # a launch covers at most 65535 sample tiles (grid y): longer x in slices of that
        # (persistent blocks loop over any number of tiles)
        step = x.shape[1] if self.pipe else 65535 * tile_samples(self.dtype, self.vpl)
        for s in range(0, x.shape[1], step):
            xs, os_ = x[:, s:s + step], out[:, s:s + step]
            self._bind(xs, os_)(stream, xs.data.ptr, os_.data.ptr)
        return out
