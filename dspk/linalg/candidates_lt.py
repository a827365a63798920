"""GPU candidates through cuBLASLt (`dspk.linalg.cublaslt`): the algorithm ranked ``rank`` by
cuBLASLt's heuristic for the problem's exact geometry, fixed when bound. The tuner times the
first ranks beside cuBLAS and the direct kernels and keeps the fastest."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ..caches import shared
from . import cublaslt
from .gpu_common import blas_dims_reason, stream_getter
from .problem import Candidate, Problem, Runner

__all__ = ["CublasLtGemm"]

#: the process-wide store (`dspk.caches`) of the cuBLASLt plans by geometry and rank (an
#: OrderedDict, oldest first), shared by every rank's candidate
PLANS = "cublaslt_gemm_plans"
MAX_PLANS = 256


class _Plans(OrderedDict):
    """The plans and their lock."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


class CublasLtGemm(Candidate):
    """cublasLtMatmul with the heuristic's ``rank``-th algorithm (0: its first choice)."""

    gpu = True

    def __init__(self, rank: int):
        self.rank = rank
        self.name = f"cublaslt{rank}"
        self.summary = (f"cuBLASLt matmul, the algorithm its heuristic ranks #{rank} for this "
                        f"geometry (fixed when bound: no per-call heuristic), compute type "
                        f"32F/64F passed explicitly")

    @staticmethod
    def _key(p: Problem) -> tuple:
        return (p.device_id, p.dtype.str, p.batches, p.a.shape, p.a.strides, p.b.shape,
                p.b.strides, p.out.shape, p.out.strides)

    def _plan(self, p: Problem) -> Any:
        key = (self._key(p), self.rank)
        plans = shared(PLANS, _Plans)
        with plans.lock:
            plan = plans.get(key)
            if plan is not None:
                plans.move_to_end(key)
                return plan
        plan = cublaslt.LtGemm(p.a, p.b, p.out, p.batches,
                               (p.a.strides[0], p.b.strides[0], p.out.strides[0]), self.rank,
                               p.device_id)
        with plans.lock:
            plans[key] = plan
            while len(plans) > MAX_PLANS:
                plans.popitem(last=False)
        return plan

    def unavailable(self, p: Problem) -> str | None:
        reason = cublaslt.available() or blas_dims_reason(p)
        if reason:
            return reason
        if "S" in (p.a.layout(), p.b.layout(), p.out.layout()):
            return "an operand has no unit stride (cuBLASLt takes R or C layouts)"
        if p.batches > 1 and 0 in (p.a.strides[0], p.b.strides[0]):
            return "a broadcast operand (batch stride 0)"
        plan = self._plan(p)
        if not plan.ok:
            return f"cuBLASLt's heuristic offers {plan.algorithms} algorithm(s) for this geometry"
        return None

    def bind(self, p: Problem) -> Runner:
        plan = self._plan(p)
        get_stream = stream_getter()

        def run(pa: int, pb: int, po: int) -> None:
            plan(pa, pb, po, get_stream().ptr)

        return run

    def run(self, p: Problem) -> None:
        self.bind(p)(p.a.ptr, p.b.ptr, p.out.ptr)
