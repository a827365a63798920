"""int_matmul(): bit-exact products of uint8, int8 and int16 operands, as int64."""

from __future__ import annotations

from typing import Any

import numpy as np

from .candidates_int import INT_DTYPES
from .matmul import _plan_tables, _problem, _remember, _signature, tuner

__all__ = ["int_matmul", "INT_DTYPES"]

#: bound plans of int_matmul, by geometry (apart from matmul's: a float call must never find
#: an integer plan)
_int_plans: dict = {}
_plan_tables.append(_int_plans)


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
    sig = _signature(a, b, out)
    if sig is not None:
        plan = _int_plans.get(sig)
        if plan is not None:
            return plan(a, b, out)
    p, result = _problem(a, b, out, allowed=INT_DTYPES, what="int_matmul",
                         result_dtype=np.int64)
    if p.m == 0 or p.n == 0 or p.batches == 0:
        return result
    if p.k == 0:
        p.out.to_array()[...] = 0
        return result
    choice = tuner.select(p, run=True)
    if sig is not None:
        _remember(_int_plans, sig, choice, p, result, a, b, out)
    return result
