"""A product to compute, ``out[i] = a[i] · b[i]``, as the candidates see it, and the candidate
interface every way of computing it implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from .view import MatrixView

__all__ = ["Problem", "Candidate", "Runner", "instances_of"]

#: A bound candidate: ``f(a, b, out)`` for operands with the geometry it was bound to (GPU:
#: addresses of element [0, 0, 0]; CPU: the arrays themselves).
Runner = Callable[[Any, Any, Any], None]


@dataclass
class Problem:
    """Validated operands: ``a`` [B, M, K], ``b`` [B, K, N], ``out`` [B, M, N], all views on one
    device with one float dtype; single-batch operands already broadcast (batch stride 0)."""

    a: MatrixView
    b: MatrixView
    out: MatrixView
    symmetric: bool  # b is exactly a.T over the same memory: X·Xᵀ

    @property
    def batches(self) -> int:
        return self.out.shape[0]

    @property
    def m(self) -> int:
        return self.a.shape[1]

    @property
    def k(self) -> int:
        return self.a.shape[2]

    @property
    def n(self) -> int:
        return self.b.shape[2]

    @property
    def dtype(self) -> np.dtype:
        return self.a.dtype

    @property
    def gpu(self) -> bool:
        return self.a.is_gpu

    @property
    def device_id(self) -> int | None:
        return self.a.device_id

    def transposed(self) -> "Problem":
        """The same product as ``out.T = b.T · a.T`` (nothing is copied)."""
        return Problem(self.b.T.named("b.T"), self.a.T.named("a.T"), self.out.T.named("out.T"),
                       self.symmetric)

    def with_operands(self, a: MatrixView, b: MatrixView, out: MatrixView) -> "Problem":
        return Problem(a, b, out, self.symmetric)


class Candidate:
    """One way of computing a `Problem`. Subclasses set ``name`` and ``gpu`` and implement
    `unavailable` (None, or why this candidate cannot run this problem here) and `run`."""

    name: str = "?"
    gpu: bool = False
    #: dtype kinds this candidate computes ("f": float products; "iu": exact integer products)
    kinds: str = "f"
    #: one line for explain(): what the candidate is
    summary: str = ""
    #: modules a first run imports when nothing has yet (scipy.linalg: 0.2-0.4 s on 2 cores):
    #: a first use's tuning does not time the candidate while one of them is missing from
    #: ``sys.modules`` (that import would cost more than the product); a thorough one does
    first_use_imports: tuple[str, ...] = ()

    def unavailable(self, p: Problem) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError

    def run(self, p: Problem) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def instances(self, props: dict) -> dict[str, set[str]]:
        """The kernels this candidate can request on a device with properties ``props``, by
        source file (`dspk.kernels.declare_instances` compiles them together); none here."""
        return {}

    def bind(self, p: Problem) -> "Runner | None":
        """A fast runner for operands of exactly ``p``'s geometry (same shapes, strides,
        dtype, device and symmetry, other addresses), or None when this candidate has none.
        `matmul` keeps it per geometry, so a repeated call skips validation and tuning."""
        return None

    def __repr__(self) -> str:
        return f"<candidate {self.name}>"


def instances_of(candidates: Iterable[Candidate], filename: str, props: dict) -> set[str]:
    """Every kernel of ``filename`` the ``candidates`` can request on a device with properties
    ``props`` (what `dspk.kernels.declare_instances` is given for the file)."""
    return {e for c in candidates for e in c.instances(props).get(filename, ())}


def prepared(c: Candidate, p: Problem) -> Callable[[], None]:
    """``c`` on ``p`` as a zero-argument call, bound once when the candidate can bind: what
    `matmul` runs for a repeated geometry, so this is what the tuner and benchmarks time."""
    runner = c.bind(p)
    if runner is None:
        return lambda: c.run(p)
    if p.gpu:
        pa, pb, po = p.a.ptr, p.b.ptr, p.out.ptr
    else:
        pa, pb, po = p.a.to_array(), p.b.to_array(), p.out.to_array()
    return lambda: runner(pa, pb, po)


def scratch_like(xp: Any, shape: tuple, dtype: Any) -> MatrixView:
    """A fresh contiguous [B, M, N] view (for candidates that cannot write a strided ``out``)."""
    b, m, n = shape
    return MatrixView(xp.empty(b * m * n, dtype=dtype), (b, m, n), (m * n, n, 1), 0, "scratch")


def copy_into(out: MatrixView, src: MatrixView) -> None:
    """``out[...] = src[...]`` for two views of the same shape and device."""
    out.to_array()[...] = src.to_array()
