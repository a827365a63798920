"""One NaN policy for the public array API (issue 45, item 5), whatever the tuner's cache holds.

Every public op is called on finite data with one NaN (or infinity) placed in it, on an empty
tuner cache (a fresh ``DSPK_CACHE_DIR``, nothing in memory) and on a warm one (the same op run
first on the clean data, so every product and operation it meets is cached): an op of the
"raise" policy raises `dspk.finite.NonFiniteError` (a ValueError) naming the argument and the
first non-finite element, the same message both times; an op of the "propagate" policy
(`dspk.matmul`, documented as IEEE arithmetic; `dspk.blank_saturation`, which documents that
a NaN is never blanked) returns non-finite values at the same places both times. The GPU rows
(``gpu`` marker) run the same table on CuPy arrays.

Also: the check runs once per public call (an op called by another, or a pipeline's steps,
does not scan again), and the tuner keeps no data-dependent rejection after tuning on NaN.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import dspk
import dspk.finite as finite
from dspk.detect import (default_templates, detect_spikes, learn_templates, spike_clips,
                         spike_features, template_noise)
from dspk.finite import NonFiniteError, check_finite, checked, first_nonfinite, is_finite
from dspk.ops import (PCA, CovarianceAccumulator, SpatialFilter, blank_saturation,
                      common_reference, covariance, decimate, demux_reference,
                      detect_bad_channels, fir_bank, fir_filter, highpass_spatial_filter,
                      highpass_taps, knn, pairwise_sqdist, phase_shift, remove_artifacts,
                      spatial_filter, whitening_matrix)
from dspk.pipeline import HighPass, Pipeline, Reference

from tests.conftest import xp_params
from tests.geometry import np1_geometry

FS = 30000.0
C, N = 16, 3000
BAD = (3, 1234)               # where the NaN goes: channel 3, sample 1234


def geometry(c: int = C) -> np.ndarray:
    return np1_geometry(c)


def clean(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((C, N)).astype(np.float32)


def clips(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((400, 30)).astype(np.float32)


def spikes() -> np.ndarray:
    s = np.zeros(3, dtype=dspk.detect.SPIKE_DTYPE)
    s["sample_index"] = [500, 1234, 2500]
    s["channel_index"] = [2, 3, 8]
    return s


def spoil(a, where, value=np.nan):
    a = a.copy()
    a[where] = value
    return a


def w_matrix(xp):
    rng = np.random.default_rng(5)
    return xp.asarray((np.eye(C) + 0.1 * rng.standard_normal((C, C))).astype(np.float32))


def _fitted_pca(xp):
    return PCA(3).fit(xp.asarray(clips()))


def _pipeline():
    return Pipeline([HighPass(300.0), Reference("median")], dtype=np.float32)


# (id, policy, call(xp, data) -> result, the data's builder(xp, value) -> the argument(s),
#  the message's fragment): each row spoils one argument with `value` (NaN or inf)
def traces_in(xp, value):
    return xp.asarray(spoil(clean(), BAD, value))


AT = "channel 3, sample 1234"
CASES = [
    ("covariance", "raise", lambda xp, x: covariance(x), traces_in, f"x: not finite at {AT}"),
    ("CovarianceAccumulator.add", "raise", lambda xp, x: CovarianceAccumulator().add(x),
     traces_in, f"x: not finite at {AT}"),
    ("spatial_filter.x", "raise", lambda xp, x: spatial_filter(w_matrix(xp), x), traces_in,
     f"x: not finite at {AT}"),
    ("spatial_filter.w", "raise", lambda xp, w: spatial_filter(w, xp.asarray(clean())),
     lambda xp, v: xp.asarray(spoil(np.asarray(w_matrix(np)), (2, 5), v)),
     "w: not finite at row 2, column 5"),
    ("SpatialFilter.__call__", "raise", lambda xp, x: SpatialFilter(w_matrix(xp))(x),
     traces_in, f"x: not finite at {AT}"),
    ("SpatialFilter.w", "raise", lambda xp, w: SpatialFilter(w),
     lambda xp, v: xp.asarray(spoil(np.asarray(w_matrix(np)), (4, 1), v)),
     "w: not finite at row 4, column 1"),
    ("common_reference.median", "raise", lambda xp, x: common_reference(x, "median"),
     traces_in, f"x: not finite at {AT}"),
    ("common_reference.mean", "raise", lambda xp, x: common_reference(x, "mean"), traces_in,
     f"x: not finite at {AT}"),
    ("whitening_matrix", "raise", lambda xp, cov: whitening_matrix(cov),
     lambda xp, v: xp.asarray(spoil(spoil(np.cov(clean()), (2, 3), v), (3, 2), v)),
     "cov: not finite at channels (2, 3)"),
    ("PCA.fit", "raise", lambda xp, c: PCA(3).fit(c),
     lambda xp, v: xp.asarray(spoil(clips(), (7, 5), v)), "clips: not finite at clip 7, tap 5"),
    ("PCA.transform", "raise", lambda xp, c: _fitted_pca(xp).transform(c),
     lambda xp, v: xp.asarray(spoil(clips(2), (9, 0), v)), "clips: not finite at clip 9, tap 0"),
    ("PCA.fit_transform", "raise", lambda xp, c: PCA(2).fit_transform(c),
     lambda xp, v: xp.asarray(spoil(clips(), (0, 29), v)),
     "clips: not finite at clip 0, tap 29"),
    ("pairwise_sqdist.a", "raise", lambda xp, a: pairwise_sqdist(a, xp.asarray(clips(3))),
     lambda xp, v: xp.asarray(spoil(clips(), (11, 2), v)), "a: not finite at row 11, column 2"),
    ("knn.b", "raise", lambda xp, b: knn(xp.asarray(clips(3)), b, 2),
     lambda xp, v: xp.asarray(spoil(clips(), (5, 6), v)), "b: not finite at row 5, column 6"),
    ("fir_filter", "raise", lambda xp, x: fir_filter(x, highpass_taps(FS)), traces_in,
     f"x: not finite at {AT}"),
    ("fir_filter.zero_phase", "raise",
     lambda xp, x: fir_filter(x, highpass_taps(FS), zero_phase=True), traces_in,
     f"x: not finite at {AT}"),
    ("fir_bank.x", "raise", lambda xp, x: fir_bank(x, default_templates(FS)), traces_in,
     f"x: not finite at {AT}"),
    ("fir_bank.bank", "raise", lambda xp, b: fir_bank(xp.asarray(clean()), b),
     lambda xp, v: spoil(default_templates(FS), (1, 3), v), "bank: not finite at filter 1, tap 3"),
    ("phase_shift", "raise", lambda xp, x: phase_shift(x, np.linspace(0, 0.9, C)), traces_in,
     f"x: not finite at {AT}"),
    ("highpass_spatial_filter", "raise",
     lambda xp, x: highpass_spatial_filter(x, geometry(), FS), traces_in,
     f"x: not finite at {AT}"),
    ("detect_bad_channels", "raise",
     lambda xp, x: detect_bad_channels(x, geometry(), FS, num_random_chunks=None), traces_in,
     f"x: not finite (NaN or inf) at {AT}"),
    ("detect_spikes", "raise", lambda xp, x: detect_spikes(x, geometry(), FS), traces_in,
     f"x: not finite at {AT}"),
    ("template_noise", "raise", lambda xp, x: template_noise(x, FS), traces_in,
     f"x: not finite at {AT}"),
    ("learn_templates", "raise",
     lambda xp, x: learn_templates(x, FS, n_templates=2, threshold=3.0), traces_in,
     f"x: not finite at {AT}"),
    ("spike_clips", "raise", lambda xp, x: spike_clips(x, spikes(), geometry(), FS, 3),
     traces_in, f"x: not finite at {AT}"),
    ("spike_features", "raise",
     lambda xp, x: spike_features(x, spikes(), geometry(), FS, n_neighbors=3), traces_in,
     f"x: not finite at {AT}"),
    ("decimate", "raise", lambda xp, x: decimate(x, 4), traces_in, f"x: not finite at {AT}"),
    ("demux_reference", "raise", lambda xp, x: demux_reference(x, np.arange(C) % 4),
     traces_in, f"x: not finite at {AT}"),
    ("remove_artifacts", "raise",
     lambda xp, x: remove_artifacts(x, [500, 2000], 0.5, 0.5, "linear", fs=FS), traces_in,
     f"x: not finite at {AT}"),
    ("Pipeline.transform", "raise", lambda xp, x: _pipeline().transform(x, FS), traces_in,
     f"x: not finite at {AT}"),
    ("Pipeline.apply", "raise", lambda xp, x: _pipeline().apply(x.copy(), FS, 0, N), traces_in,
     f"x: not finite at {AT}"),
    # documented to propagate
    ("matmul.xxT", "propagate", lambda xp, x: dspk.matmul(x, x.T), traces_in, None),
    ("matmul.Wx", "propagate", lambda xp, x: dspk.matmul(w_matrix(xp), x), traces_in, None),
    ("blank_saturation", "propagate", lambda xp, x: blank_saturation(x, 2.0, fill=0.0),
     traces_in, None),
]


def _nonfinite_mask(r, xp):
    r = r[0] if isinstance(r, tuple) else r
    return ~np.isfinite(np.asarray(r.get() if hasattr(r, "get") else r))


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("xp_name", xp_params())
def test_nonfinite_input_same_whatever_the_cache(case, xp_name, value, tmp_path, monkeypatch):
    xp = np if xp_name == "numpy" else pytest.importorskip("cupy")
    name, policy, call, build, fragment = case
    outcomes = []
    for cache in ("cold", "warm"):
        monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path / cache))
        dspk.linalg.forget()
        if cache == "warm":                    # every product and choice of the op cached
            call(xp, build(xp, 0.5))
        bad = build(xp, value)
        if policy == "raise":
            with pytest.raises(ValueError) as info:
                call(xp, bad)
            msg = str(info.value)
            assert fragment in msg, msg
            assert "tuner" not in msg and "candidate" not in msg, msg
            outcomes.append(msg)
        else:
            outcomes.append(_nonfinite_mask(call(xp, bad), xp))
    if policy == "raise":
        assert outcomes[0] == outcomes[1]
        assert isinstance(info.value, NonFiniteError)
    else:
        np.testing.assert_array_equal(outcomes[0], outcomes[1])
        # (an infinity is above any threshold: blank_saturation blanks it, as documented)
        assert outcomes[0].any() or (name == "blank_saturation" and value == np.inf)


def test_matmul_propagates_exactly_where_ieee_does(tmp_path, monkeypatch):
    """x·xᵀ with a NaN at (3, t): row and column 3 NaN, the rest finite, on a cold cache
    (which raised 'every candidate failed' before) and a warm one."""
    x = spoil(clean(), BAD)
    want = np.zeros((C, C), bool)
    want[3, :] = want[:, 3] = True
    for cache in ("cold", "warm"):
        monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path / "c"))
        dspk.linalg.forget()
        np.testing.assert_array_equal(~np.isfinite(dspk.matmul(x, x.T)), want)


def test_tuning_on_nan_leaves_no_data_dependent_rejection(tmp_path, monkeypatch):
    """A first use on NaN operands is tuned on a finite probe: no candidate is stored as
    'wrong' because of the data, and the clean product then runs the same choice."""
    monkeypatch.setenv("DSPK_CACHE_DIR", str(tmp_path))
    dspk.linalg.forget()
    x = spoil(np.random.default_rng(2).standard_normal((24, 6000)), (5, 4000))
    dspk.matmul(x, x.T)
    y = np.random.default_rng(3).standard_normal((24, 6000))
    choice = dspk.explain(y, y.T).choice
    assert choice.source.startswith("cache")
    assert not any("wrong" in why for why in choice.rejected.values()), choice.rejected
    np.testing.assert_allclose(dspk.matmul(y, y.T), y @ y.T, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("call, scans", [
    (lambda x: covariance(x), 1),
    (lambda x: detect_spikes(x, geometry(), FS), 1),       # fir_bank inside: not again
    (lambda x: _pipeline().transform(x, FS), 1),           # the steps: not again
    (lambda x: PCA(2).fit(x.T.copy()), 1),
    (lambda x: highpass_spatial_filter(x, geometry(), FS), 1),   # spatial_filter inside
])
def test_checked_once_per_public_call(call, scans, monkeypatch):
    seen = []
    real = finite.is_finite
    monkeypatch.setattr(finite, "is_finite", lambda a: seen.append(a.shape) or real(a))
    call(clean())
    assert len(seen) == scans, seen


def test_checked_block_and_force():
    x = spoil(clean(), BAD)
    with checked():
        check_finite(x, "x")                   # trusted
        covariance(x[:4, :10].copy() * 0 + 1)  # an op inside: no scan either
        with pytest.raises(NonFiniteError, match=f"x: not finite at {AT}"):
            check_finite(x, "x", force=True)


def test_is_finite_and_first_nonfinite():
    x = np.full((4, 1000), 3e38, np.float32)   # the sum overflows: the exact test decides
    assert is_finite(x)
    x[1, 7] = -np.inf
    x[2, 1] = np.nan
    assert not is_finite(x) and first_nonfinite(x) == (1, 7)
    assert is_finite(np.zeros((3, 3), np.int16)) and first_nonfinite(np.ones(3)) is None
    with pytest.raises(NonFiniteError, match=re.escape("y: not finite at element 2 (inf)")):
        check_finite(np.array([0.0, 1.0, np.inf]), "y")
    with pytest.raises(NonFiniteError, match="z: not finite at row 0, channel 1, sample 2"):
        check_finite(spoil(np.zeros((2, 3, 4)), (0, 1, 2)), "z")


def test_recording_path_is_not_scanned_twice(monkeypatch):
    """A job's blocks come from a recording, which refuses non-finite samples itself: the
    pipeline's compute path does not scan them again (on the GPU: no sync per chunk)."""
    seen = []
    real = finite.is_finite
    monkeypatch.setattr(finite, "is_finite", lambda a: seen.append(a.shape) or real(a))
    rec = dspk.open_recording(np.round(clean() * 100).astype(np.int16), fs=FS,
                              geometry=geometry())
    p = _pipeline().fit(rec)
    seen.clear()
    p.block(rec, 0, 1000)
    assert seen == []
