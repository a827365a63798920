"""Eigendecompositions of a stack of small symmetric matrices on the GPU by cuSOLVER's
batched Jacobi (``cusolverDnDsyevjBatched``), called directly.

Local whitening decomposes one neighbourhood covariance per channel (384 matrices of 32 x 32
for a Neuropixels probe): LAPACK takes ~50 ms for them on one core of the H100's host, 14 ms
on its 16; cuSOLVER's batched Jacobi takes 0.35 ms. ``cupy.linalg.eigh`` reaches the same
routine, but through CuPy kernels (copies, checks) that NVRTC compiles on a fresh machine
(6-10 s measured); called here through CuPy's cuSOLVER binding, with the stack moved by
plain copies, no kernel is compiled. Jacobi's eigenpairs differ from LAPACK's in the last
bits (and eigenvectors in sign): a function of the matrix built from them (the ZCA matrix)
agrees to ~1e-13 relative.

Examples
--------
>>> import numpy as np
>>> from dspk.linalg.eigh import device_eigh_supported
>>> device_eigh_supported(np.zeros((4, 33, 33)))     # cuSOLVER's batched Jacobi: k <= 32
False
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..caches import shared

log = logging.getLogger("dspk")

__all__ = ["MAX_SIZE", "device_eigh", "device_eigh_supported"]

#: cuSOLVER's batched Jacobi decomposes matrices of at most this size
MAX_SIZE = 32


def device_eigh_supported(stack: Any) -> bool:
    """Whether `device_eigh` takes this stack: [batch, k, k] float64 with k <= `MAX_SIZE`.

    Examples
    --------
    >>> import numpy as np
    >>> device_eigh_supported(np.zeros((384, 32, 32)))
    True
    """
    return (getattr(stack, "ndim", 0) == 3 and stack.shape[1] == stack.shape[2] and
            0 < stack.shape[1] <= MAX_SIZE and len(stack) > 0 and
            np.dtype(stack.dtype) == np.float64)


def device_eigh(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.linalg.eigh(stack)`` computed on the current CUDA device (see the module
    docstring): eigenvalues ascending [batch, k], eigenvectors as columns [batch, k, k],
    returned on the host. A matrix Jacobi did not converge for (cuSOLVER's ``info`` > 0) is
    decomposed again by LAPACK, and so is the whole stack where this CuPy's cuSOLVER binding
    (not a public API of CuPy's) cannot be called as here (a warning, once).

    Parameters
    ----------
    stack : numpy.ndarray
        [batch, k, k] float64, symmetric (its lower triangle is read), k <= `MAX_SIZE`.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        d [batch, k], e [batch, k, k] (``stack[i] @ e[i] = e[i] * d[i]``).

    Raises
    ------
    ValueError
        A stack `device_eigh_supported` refuses.
    """
    if not device_eigh_supported(stack):
        raise ValueError(f"stack: expected [batch, k, k] float64 with k <= {MAX_SIZE}, got "
                         f"{getattr(stack, 'shape', None)} {getattr(stack, 'dtype', None)}")
    try:
        return _jacobi(stack)
    except (ImportError, AttributeError, TypeError) as exc:
        # CuPy's cuSOLVER binding (cupy_backends) is not a public API: where this CuPy's
        # differs, LAPACK's decomposition (the same matrices, slower), said once
        said = shared("device_eigh_fallback", set)
        if not said:
            said.add(type(exc).__name__)
            log.warning("dspk: cuSOLVER's batched Jacobi is not reachable through this "
                        "CuPy (%s: %s); eigendecompositions on the host (LAPACK)",
                        type(exc).__name__, exc)
        return np.linalg.eigh(stack)


def _jacobi(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`device_eigh` by cuSOLVER's ``dsyevjBatched`` (the stack already checked)."""
    import cupy  # noqa: PLC0415 (a GPU caller's)
    from cupy_backends.cuda.libs import cublas, cusolver  # noqa: PLC0415

    b, k = stack.shape[0], stack.shape[1]
    a = cupy.asarray(np.ascontiguousarray(stack))     # symmetric: C order is F order
    w = cupy.empty((b, k), dtype=np.float64)
    info = cupy.empty(b, dtype=np.int32)
    handle = cupy.cuda.device.get_cusolver_handle()
    cusolver.setStream(handle, cupy.cuda.get_current_stream().ptr)
    params = cusolver.createSyevjInfo()
    try:
        jobz = getattr(cusolver, "CUSOLVER_EIG_MODE_VECTOR", 1)
        uplo = cublas.CUBLAS_FILL_MODE_LOWER
        lwork = cusolver.dsyevjBatched_bufferSize(handle, jobz, uplo, k, a.data.ptr, k,
                                                  w.data.ptr, params, b)
        work = cupy.empty(max(1, lwork), dtype=np.float64)
        cusolver.dsyevjBatched(handle, jobz, uplo, k, a.data.ptr, k, w.data.ptr,
                               work.data.ptr, lwork, info.data.ptr, params, b)
    finally:
        cusolver.destroySyevjInfo(params)
    d = w.get()
    # column-major eigenvectors: row j of each stored matrix is eigenvector j
    e = np.ascontiguousarray(np.swapaxes(a.get(), 1, 2))
    flags = info.get()
    if np.any(flags < 0):
        raise RuntimeError(f"cusolverDnDsyevjBatched: invalid argument {int(-flags.min())}")
    again = np.flatnonzero(flags > 0)
    if again.size:                                    # not converged: LAPACK's
        d[again], e[again] = np.linalg.eigh(stack[again])
    return d, e
