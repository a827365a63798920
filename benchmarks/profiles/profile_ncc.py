#!/usr/bin/env python3
"""One launch of each NCC tensor-core kernel variant on a 4096x4096 uint8 image, for Nsight
Compute:

    ncu --kernel-name regex:ncc_bank_mma ... python benchmarks/profiles/profile_ncc.py N ...
    python benchmarks/profiles/profile_ncc.py [N ...]     (default: 1 32)
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

import cupy as cp  # noqa: E402

from dspk.match import TemplateBank  # noqa: E402

rng = np.random.default_rng(1)
image = cp.asarray(rng.integers(0, 256, (4096, 4096), dtype=np.uint8))
for n in [int(v) for v in sys.argv[1:]] or [1, 32]:
    bank = TemplateBank(cp.asarray(rng.integers(0, 256, (n, 16, 16), dtype=np.uint8)))
    bank._ncc_bank_mma(image)
    cp.cuda.Device().synchronize()
    print(f"N={n} done")
