"""dspk.warmup / ``dspk tune --compile`` on a GPU: after it, a fresh process's first calls
(full-size inputs, other sizes than the warm-up's) make CuPy compile no kernel."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: a fresh process: the calls whose CuPy kernels the warm-up is for, on other sizes, counting
#: NVRTC compiles (CuPy 14 compiles through compiler._compile_using_nvrtc_no_warning)
FIRST_CALLS = textwrap.dedent("""
    import json
    import numpy as np, cupy as cp
    from cupy.cuda import compiler
    import dspk
    from dspk.detect import default_templates
    from dspk.match import ncc
    compiled = []
    inner = compiler._compile_using_nvrtc_no_warning
    def counted(source, *a, **k):
        import re
        compiled.append(",".join(re.findall(r"__global__\\s+void\\s+(\\w+)", source)))
        return inner(source, *a, **k)
    compiler._compile_using_nvrtc_no_warning = counted
    rng = np.random.default_rng(1)
    C, N, FS = 64, 45000, 30000.0
    col = np.arange(C)
    geom = np.c_[np.array([43.0, 11.0, 59.0, 27.0])[col % 4], 20.0 * (col // 2)]
    x = rng.standard_normal((C, N)).astype(np.float32)
    w = default_templates(FS)
    for i, t in enumerate(range(100, N - 100, 30)):
        c = 1 + i % (C - 2)
        k = w[i % 6]
        x[c - 1:c + 2, t - 20:t + 41] += np.array([[6.0], [12.0], [6.0]]) * k / -k.min()
    xg = cp.asarray(x)
    dspk.learn_templates(xg, FS)
    dspk.detect_spikes(xg, geom, FS)
    clips = cp.asarray(rng.standard_normal((5000, 61)).astype(np.float32))
    dspk.PCA(4).fit(clips).transform(clips)
    ncc(cp.asarray(rng.integers(0, 256, (300, 200), dtype=np.uint8)),
        cp.asarray(rng.integers(0, 256, (8, 16, 16), dtype=np.uint8)))
    y = dspk.ops.phase_shift(xg, cp.asarray((col % 12) / 13.0))
    dspk.ops.detect_bad_channels(y, geom, FS, num_random_chunks=None)
    dspk.ops.highpass_spatial_filter(y, geom, FS)
    cp.cuda.Device().synchronize()
    print("COMPILED " + json.dumps(compiled))
""")


@pytest.mark.gpu
def test_tune_compile_leaves_nothing_for_cupy_to_compile(tmp_path):
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cupy"),
               DSPK_CACHE_DIR=str(tmp_path / "dspk"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    prep = subprocess.run([sys.executable, "-m", "dspk", "tune", "--compile"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert prep.returncode == 0, prep.stderr[-2000:]
    assert "GPU calls warmed up in" in prep.stdout
    run = subprocess.run([sys.executable, "-c", FIRST_CALLS], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("COMPILED ")][0]
    assert json.loads(line[9:]) == []
