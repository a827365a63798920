"""int_matmul(): bit-exact products of uint8, int8 and int16 operands, as int64."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import cupy_module, is_cupy_array
from .candidates_int import INT_DTYPES
from .engine import current_engine
from .matmul import as_problem, operand_signature, product

__all__ = ["int_matmul", "int_gram", "INT_DTYPES"]


def int_matmul(a: Any, b: Any, out: Any = None) -> Any:
    """Batched integer product ``out[i] = a[i] · b[i]``, exact to the bit, as int64.

    Parameters
    ----------
    a, b : numpy.ndarray, cupy.ndarray or MatrixView
        uint8, int8 or int16 (both the same dtype), 2-D or 3-D with a batch axis; a single-batch
        operand is broadcast against a batched one.
    out : array or MatrixView, optional
        int64, ``[B, M, N]`` (or ``[M, N]``); must not overlap ``a`` or ``b``.

    Returns
    -------
    numpy.ndarray or cupy.ndarray
        int64, the array type of the operands.

    Notes
    -----
    On the GPU the products run on INT8 tensor cores (cuBLAS gemmEx, int32 accumulation): uint8
    is centred to int8 and corrected with row and column sums, int16 is split into two int8
    planes and recombined in int64, and K is chunked so that no int32 sum can overflow. On the
    CPU, float64 BLAS is exact while every partial sum stays below 2^53 (K is chunked beyond).
    The tuner chooses among the candidates like `matmul`'s; `explain` covers both. As with
    `matmul`, a repeated call with arrays of the same geometry reuses a bound plan.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> x = np.array([[30000, -32768, 7]], dtype=np.int16)
    >>> int(dspk.int_matmul(x, x.T)[0, 0]) == 30000**2 + 32768**2 + 49
    True
    """
    return product(a, b, out, "int_matmul", INT_DTYPES, np.int64)


def int_gram(x: Any) -> tuple:
    """The Gram matrix of the rows of an integer matrix and their sums, from one pass over it:
    ``(x · xᵀ, x.sum(axis=1))``, both int64 and exact.

    Parameters
    ----------
    x : numpy.ndarray or cupy.ndarray
        [rows, K] uint8, int8 or int16.

    Returns
    -------
    tuple
        (S int64 [rows, rows], s int64 [rows]), the array type of ``x``.

    Notes
    -----
    The product is `int_matmul`'s (same candidates, same tuner key). On the GPU, when a
    tensor-core candidate runs, the row sums are formed from what it reads anyway (the packing
    pass of the INT8 GEMM, or the fused int16 kernel's diagonal tiles): the channel sums of a
    covariance cost no second read of the data. Elsewhere they are summed separately, in int64.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.linalg import int_gram
    >>> x = np.array([[1, -2, 3], [30000, 0, -32768]], dtype=np.int16)
    >>> s_mat, s = int_gram(x)
    >>> s_mat.tolist(), s.tolist()
    ([[14, -68304], [-68304, 1973741824]], [2, -2768])
    """
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"x: expected a 2-D [rows, K] integer array, got shape "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    engine = current_engine()
    sig = operand_signature(x, x.T, None)
    if sig is not None:
        plan = engine.plans["int_gram"].get(sig)
        if plan is not None:
            return plan(x)
    if x.dtype not in INT_DTYPES:
        raise TypeError(f"x: unsupported dtype {x.dtype}; int_gram takes "
                        f"{', '.join(d.name for d in INT_DTYPES)}")
    if is_cupy_array(x):
        cp = cupy_module()
        if x.device.id != cp.cuda.runtime.getDevice():
            with cp.cuda.Device(x.device.id):
                return int_gram(x)
    p, s_mat = as_problem(x, x.T, None, allowed=INT_DTYPES, what="int_gram",
                        result_dtype=np.int64)
    runner = None
    if p.gpu and p.dtype != np.int8 and p.m and p.k:
        choice = engine.tuner.select(p, run=False)
        runner = choice.candidate.bind(p) if getattr(choice.candidate, "row_sums", False) \
            else None
    if runner is None:
        s_mat = int_matmul(x, x.T)
        return s_mat, x.sum(axis=1, dtype=np.int64)
    plan = _GramPlan(runner, p.m, p.device_id, choice.candidate.name)
    if sig is not None:
        engine.remember("int_gram", sig, plan)
    return plan(x)


class _GramPlan:
    """The tensor-core runner of X·Xᵀ for one geometry, writing the row sums it forms."""

    __slots__ = ("runner", "m", "dev", "name", "_cp")

    def __init__(self, runner: Any, m: int, dev: int, name: str) -> None:
        self.runner, self.m, self.dev, self.name = runner, m, dev, name
        self._cp = cupy_module()

    def __call__(self, x: Any) -> tuple:
        cp = self._cp
        if cp.cuda.runtime.getDevice() != self.dev:
            with cp.cuda.Device(self.dev):
                return self(x)
        s_mat = cp.empty((self.m, self.m), dtype=np.int64)
        s = cp.empty(self.m, dtype=np.int64)
        p = x.data.ptr
        self.runner(p, p, s_mat.data.ptr, s.data.ptr)
        return s_mat, s
