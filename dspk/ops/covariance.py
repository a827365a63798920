"""Channel covariance, one-shot and accumulated over the chunks of a recording."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..linalg import int_gram, matmul
from ._covariance_gpu import center_rows, float_finish, int_finish
from ..finite import api, check_finite
from ._checks import channels_first_hint, traces

__all__ = ["covariance", "CovarianceAccumulator"]


@api
def covariance(x: Any, center: bool = True, ddof: int = 1) -> Any:
    """Covariance of the channels of ``x`` [channels, samples], as ``numpy.cov`` defines it.

    Parameters
    ----------
    x : numpy.ndarray or cupy.ndarray
        float32, float64, or raw int16.
    center : bool
        Subtract each channel's mean (True) or return the raw second moment X·Xᵀ/(n − ddof).
    ddof : int
        The divisor is ``n_samples − ddof`` (1: unbiased, like numpy.cov; 0: like Kilosort4's
        X·Xᵀ/n).

    Returns
    -------
    array
        [channels, channels]: x's dtype for float input, float64 for int16.

    Raises
    ------
    ValueError
        For an array with more than 4 times as many rows as columns, with a hint: arrays are
        [channels, samples] (a [samples, channels] array was probably passed); for a NaN or
        an infinity in x (`dspk.finite.NonFiniteError`, naming its channel and sample),
        whatever the tuner's cache holds.

    Notes
    -----
    Float data is centred before the product (a copy), never by subtracting a large mean from the
    product afterwards. int16 data takes the exact integer path: S = X·Xᵀ and the channel sums
    s in int64 (`dspk.linalg.int_matmul`), then n·S − s·sᵀ exactly in int64 when it fits (else in
    float64), and one division in float64.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[1, 2, 3, 4], [2, 4, 6, 9]], dtype=np.int16)
    >>> covariance(x)                       # the same as numpy.cov(x), exactly
    array([[1.66666667, 3.83333333],
           [3.83333333, 8.91666667]])
    """
    xp = traces(x, allow_int16=True)
    if x.shape[0] > 4 * x.shape[1]:
        channels_first_hint(x)
    check_finite(x, "x")
    n = x.shape[1]
    if xp is not np and x.dtype == np.int16 and (n < 2**16 or not center) and n - ddof > 0:
        # one chunk on the GPU: the product with its row sums, then one finishing kernel
        # (the accumulator's bookkeeping is host time the GPU would wait for)
        s_mat, s = int_gram(x)
        return _int_cov_gpu(s_mat, s, n, int(ddof), bool(center))
    if xp is not np and x.dtype != np.int16 and n - ddof > 0:
        return _float_cov_gpu(x, int(ddof), bool(center))
    acc = CovarianceAccumulator(center=center, ddof=ddof)
    acc.add(x)
    return acc.result()


class CovarianceAccumulator:
    """Adds chunks of a recording ([channels, samples] each) and gives the covariance of all
    of them — the same matrix as `covariance` of the concatenation: exactly for int16 (integer
    sums), within float rounding for float data (chunks combined with Chan's pairwise update of
    centred second moments in float64, so no large mean is subtracted after a product).

    Parameters
    ----------
    center : bool
        As for `covariance`: subtract each channel's mean (True) or not.
    ddof : int
        As for `covariance`: the divisor is ``n_samples − ddof``.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).integers(-500, 500, (3, 1000), dtype=np.int16)
    >>> acc = CovarianceAccumulator()
    >>> for start in range(0, 1000, 300):
    ...     _ = acc.add(x[:, start:start + 300])
    >>> bool(np.array_equal(acc.result(), covariance(x)))
    True
    """

    def __init__(self, center: bool = True, ddof: int = 1):
        self.center, self.ddof = bool(center), int(ddof)
        self.n = 0
        self._xp: Any = None
        self._int = None  # int16 path: exact int64 sums
        self._s = None
        self._mean = None  # float path: running mean and centred second moment (float64)
        self._m2 = None
        self._dtype = None

    @api
    def add(self, x: Any) -> "CovarianceAccumulator":
        """Add one chunk [channels, samples] (float32, float64 or int16; every chunk of the
        same dtype, channel count and array type as the first), finite (a NaN or an
        infinity is a `ValueError` naming its channel and sample). Returns the accumulator."""
        xp = traces(x, allow_int16=True)
        check_finite(x, "x")
        c, n = x.shape
        if self._xp is None:
            self._xp, self._dtype, self._c = xp, x.dtype, c
        elif xp is not self._xp or x.dtype != self._dtype or c != self._c:
            raise ValueError(f"x: chunk {x.shape} {x.dtype} does not match the first chunk "
                             f"({self._c} channels, {self._dtype}, same array type)")
        if x.dtype == np.int16:
            s_mat, s = int_gram(x)      # the sums from the product's own pass (GPU)
            self._int = s_mat if self._int is None else self._int + s_mat
            self._s = s if self._s is None else self._s + s
        else:
            if not self.center:
                mean, xc = xp.zeros(c, np.float64), x
            elif xp is np:
                mean = x.mean(axis=1, dtype=np.float64)
                xc = x - mean[:, None].astype(x.dtype)
            else:  # the same arithmetic in one pass (dspk/kernels/covariance.cu)
                with _on_device_of(x):
                    xc, mean = center_rows(x)
            m2 = matmul(xc, xc.T).astype(np.float64)
            if self._m2 is None:
                self._mean, self._m2 = mean, m2
            else:  # Chan et al.: combine centred moments of two sets
                na, nb = self.n, n
                delta = mean - self._mean
                self._m2 = self._m2 + m2 + xp.outer(delta, delta) * (na * nb / (na + nb))
                self._mean = self._mean + delta * (nb / (na + nb))
        self.n += n
        return self

    def merge(self, other: "CovarianceAccumulator") -> "CovarianceAccumulator":
        """Add everything ``other`` accumulated, as if its chunks had been added here: the
        same arithmetic as `add` (so partial accumulators computed elsewhere — dask tasks —
        merged in the chunks' order give the sequential result, bit for bit)."""
        if (other.center, other.ddof) != (self.center, self.ddof):
            raise ValueError("other: accumulates with different center/ddof")
        if other.n == 0:
            return self
        if self.n == 0:
            for key in ("_xp", "_dtype", "_c", "_int", "_s", "_mean", "_m2", "n"):
                if hasattr(other, key):
                    setattr(self, key, getattr(other, key))
            return self
        if other._xp is not self._xp or other._dtype != self._dtype or other._c != self._c:
            raise ValueError(f"other: {other._c} channels of {other._dtype} does not match "
                             f"{self._c} of {self._dtype} (same array type)")
        if self._int is not None:
            self._int = self._int + other._int
            self._s = self._s + other._s
        else:
            na, nb = self.n, other.n
            delta = other._mean - self._mean
            self._m2 = self._m2 + other._m2 + self._xp.outer(delta, delta) * (na * nb / (na + nb))
            self._mean = self._mean + delta * (nb / (na + nb))
        self.n += other.n
        return self

    def result(self) -> Any:
        """The covariance of everything added so far."""
        if self.n == 0:
            raise ValueError("no data added: the covariance of nothing is undefined")
        if self.n - self.ddof <= 0:
            raise ValueError(f"{self.n} samples with ddof={self.ddof}: the divisor would be "
                             f"{self.n - self.ddof}")
        xp = self._xp
        if self._int is not None:
            n = self.n
            if xp is not np and (n < 2**16 or not self.center):
                return _int_cov_gpu(self._int, self._s, n, self.ddof, self.center)
            if not self.center:
                return self._int.astype(np.float64) / (n - self.ddof)
            s = self._s
            # |S| <= n·2^30 and |s| <= n·2^15 for int16, so n·S − s·sᵀ fits int64 whenever
            # n < 2^16 (2 s at 30 kHz): known from n alone, with no look at the data (on the
            # GPU that look cost two host round trips, more than the product's combine)
            if n < 2**16:
                bound = 0
            else:
                bound = int(abs(self._int).max()) * n + int(abs(s).max()) ** 2
            if bound < 2**63:
                num = n * self._int - xp.outer(s, s)      # exact in int64
                return num.astype(np.float64) / (n * (n - self.ddof))
            return (self._int.astype(np.float64) - xp.outer(s, s).astype(np.float64) / n) / (
                n - self.ddof)
        return (self._m2 / (self.n - self.ddof)).astype(self._dtype)


def _on_device_of(a: Any):
    """The device context of CuPy array ``a`` (the launches are packed for one device)."""
    import cupy as cp  # noqa: PLC0415 (CuPy input)

    return cp.cuda.Device(a.data.device_id)


def _int_cov_gpu(s_mat: Any, s: Any, n: int, ddof: int, center: bool) -> Any:
    """`CovarianceAccumulator.result` of int16 sums on the GPU in one launch
    (dspk/kernels/covariance.cu), the same float64 bits as the CPU's expression; with
    ``center``, only while n·S − s·sᵀ is exact in int64 (n < 2^16)."""
    with _on_device_of(s_mat):
        return int_finish(s_mat, s, n, ddof, center)


def _float_cov_gpu(x: Any, ddof: int, center: bool) -> Any:
    """`covariance` of one float32/float64 CuPy array: the centred copy in one pass, the
    product through the engine, one finishing launch (three launches and the product, where
    the accumulator's CuPy expressions took eight)."""
    n = x.shape[1]
    with _on_device_of(x):
        xc = center_rows(x)[0] if center else x
        m2 = matmul(xc, xc.T)
        if not m2.flags.c_contiguous:
            m2 = m2.copy()
        return float_finish(m2, float(n - ddof))
