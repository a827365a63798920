"""The exact, tuned GEMM engine every heavy operation in dspk lowers to.

- `MatrixView`: batches of matrices as shape, strides and offset over a 1-D buffer.
- `matmul`: float32/float64 products in the operands' own precision (never TF32).
- `int_matmul`: uint8/int8/int16 products, bit-exact, as int64 (INT8 tensor cores on the GPU).
- `int_gram`: x·xᵀ of an integer matrix with its row sums, exact, from one pass over x.
- `explain`: which candidate runs for a product, and why.
- `tuner`: the autotuner that chooses among cuBLAS, direct kernels, split-K and CPU BLAS.
- `Engine`: the tuner, bound plans and prepared operands in one object; `current_engine` is
  the one in use (a default one, or another in a ``with Engine(...)`` block).
"""

from .engine import Engine, current_engine, default_engine
from .intmm import int_gram, int_matmul
from .matmul import Explanation, explain, forget, matmul, tuner
from .view import MatrixView

__all__ = ["MatrixView", "matmul", "int_matmul", "int_gram", "explain", "Explanation", "tuner",
           "forget", "Engine", "current_engine", "default_engine"]
