"""Preparing a GPU machine: every public GPU call once on small inputs, so that CuPy compiles
its own kernels (elementwise, reductions, scans, cupyx.scipy.ndimage filters) into its
kernel cache (``CUPY_CACHE_DIR``) before a user's first call needs them.

dspk's own kernels ship prebuilt (`dspk.kernels`), and its first-use paths avoid CuPy's
runtime-compiled kernels where the work is small (the tuner's checks, whitening matrices,
PCA's eigendecomposition: `dspk.linalg.host_checks`). What remains compiles on first use:
measured on an H100 with an empty CuPy cache, ``learn_templates`` 34 kernels (4.6 s),
``ncc`` 35 (2.8 s), ``PCA`` 4 (0.3 s), ``detect_spikes`` 2 (0.2 s); the Neuropixels ops
(bad-channel features on the device: CuPy's FFT, median and float64 elementwise kernels) and
the motion estimate and correction are warmed up too. CuPy's kernel names
depend on dtypes and dimensions, not on sizes, so small inputs of the usual dtypes compile
what full-size calls use. ``dspk tune --compile`` runs this after loading dspk's kernels.

The calls tune as a user's would (so they compile what the tuned paths use); their choices are
stored under the small shapes' own size classes, which full-size calls do not share.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

__all__ = ["warm_gpu_calls"]

#: the sampling rate of the warm-up traces (the default templates' widths, and so the
#: ndimage filters' kernels, follow it)
FS = 30000.0


def _calls(fs: float) -> dict[str, Callable[[], Any]]:
    """name -> a call on small inputs of the usual dtypes (built on the host)."""
    import cupy as cp  # noqa: PLC0415 (GPU only)

    import dspk  # noqa: PLC0415 (the public API: this module sits above it)
    from dspk.detect import default_templates  # noqa: PLC0415
    from dspk.match import ncc  # noqa: PLC0415

    rng = np.random.default_rng(0)
    c, n = 16, int(fs)
    col = np.arange(c)
    geom = np.c_[np.array([43.0, 11.0, 59.0, 27.0])[col % 4], 20.0 * (col // 2)]
    x = rng.standard_normal((c, n)).astype(np.float32)
    bank = default_templates(fs)
    spiky = x.copy()                              # isolated spikes of the default shapes
    for i, t in enumerate(range(100, n - 100, 40)):
        ch = 1 + i % (c - 2)
        w = bank[i % len(bank)]
        spiky[ch - 1:ch + 2, t - 20:t - 20 + w.size] += \
            np.array([[6.0], [12.0], [6.0]]) * w / -w.min()
    xg, sg = cp.asarray(x), cp.asarray(spiky)
    xi = cp.asarray(rng.integers(-2000, 2000, (c, n), dtype=np.int16))
    img = cp.asarray(rng.integers(0, 256, (128, 128), dtype=np.uint8))
    tpl = cp.asarray(rng.integers(0, 256, (4, 16, 16), dtype=np.uint8))
    clips = cp.asarray(rng.standard_normal((2000, 61)).astype(np.float32))

    def pipeline() -> Any:
        rec = dspk.open_recording(xg, fs=fs, geometry=geom)
        return dspk.Pipeline.from_options(backend="gpu").fit(rec).transform(xg)

    def neuropixels() -> Any:
        """The Neuropixels chain's ops (IBL's order) and bad-channel detection on the device."""
        shifts = cp.asarray((col % 12) / 13.0)
        y = dspk.ops.phase_shift(xg, shifts)
        y = dspk.ops.blank_saturation(y, 5.0)
        dspk.ops.detect_bad_channels(y, geom, fs, num_random_chunks=None)
        w = dspk.ops.interpolation_matrix(geom, col == 3)
        y = dspk.spatial_filter(cp.asarray(w.astype(np.float32)), y)
        return dspk.ops.highpass_spatial_filter(y, geom, fs, n_channel_pad=8)

    def motion() -> Any:
        """A drift estimate from spike columns and its correction, on the device."""
        from dspk.motion import Correction, estimate  # noqa: PLC0415

        m = 20000
        cols = {"time_s": cp.asarray(np.sort(rng.uniform(0.0, 60.0, m))),
                "y": cp.asarray(rng.uniform(0.0, geom[:, 1].max(), m)),
                "amplitude": cp.asarray(rng.uniform(7.0, 30.0, m))}
        est = estimate(cols, geom, 60.0, rigid=False, win_step_um=40.0, win_scale_um=40.0)
        return Correction(geom, est)(xg, 0.0, fs)

    return {
        "covariance": lambda: (dspk.covariance(xg), dspk.covariance(xi)),
        "whitening and spatial filter": lambda: dspk.spatial_filter(
            dspk.whitening_matrix(dspk.covariance(xg), geometry_um=geom, n_neighbors=8), xg),
        "common_reference": lambda: (dspk.common_reference(xg, "median"),
                                     dspk.common_reference(xg, "mean")),
        "fir": lambda: (dspk.fir_filter(xg, dspk.highpass_taps(fs, 300.0)),
                        dspk.fir_bank(xg, bank)),
        "int_matmul": lambda: dspk.int_matmul(xi, xi.T),
        "PCA": lambda: dspk.PCA(3).fit(clips).transform(clips),
        "detect_spikes": lambda: dspk.detect_spikes(sg, geom, fs),
        "learn_templates": lambda: dspk.learn_templates(sg, fs),
        "ncc": lambda: ncc(img, tpl),
        "Pipeline.transform": pipeline,
        # a job on mtscomp's .cbin sums the inflated chunks on the device (`Staging`)
        ".cbin decode": lambda: cp.cumsum(xi, axis=1, dtype=xi.dtype),
        "Neuropixels ops": neuropixels,
        "motion": motion,
    }


def warm_gpu_calls(fs: float = FS, report: Callable[[str], None] | None = None) -> dict:
    """Run every public GPU call once on small inputs (see the module docstring).

    Parameters
    ----------
    fs : float
        Sampling rate of the warm-up traces (the rate the recordings will have).
    report : callable, optional
        Called with one line per call (its name and seconds, or why it failed).

    Returns
    -------
    dict
        name -> seconds, or the error's text for a call that failed (a failure is reported,
        not raised: the other calls still warm up).
    """
    import cupy as cp  # noqa: PLC0415 (GPU only)

    done: dict = {}
    for name, call in _calls(fs).items():
        t0 = time.perf_counter()
        try:
            call()
            cp.cuda.Device().synchronize()
            done[name] = time.perf_counter() - t0
            line = f"{name}: {done[name]:.2f} s"
        except Exception as exc:  # one failing call must not stop the others
            done[name] = f"{type(exc).__name__}: {exc}"
            line = f"{name}: failed: {done[name]}"
        if report is not None:
            report(line)
    return done
