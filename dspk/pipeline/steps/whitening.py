"""`Whiten`: ZCA whitening fitted on the covariance of the fit chunks, global or local, across
all channels or within each shank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...backend import to_numpy
from ...ops import CovarianceAccumulator, SpatialFilter, whitening_matrix
from ..errors import PipelineError
from ..registry import Option, register
from ..stage import Context, FitBlocks, Step
from .common import GROUPS, _check_groups, _not_fitted, log


@dataclass
class Whiten(Step):
    """ZCA whitening fitted on the recording: "global", or "local" (each channel against its
    ``n_neighbors`` nearest channels; needs the recording's geometry).

    `fit` computes W (`dspk.whitening_matrix`) from the covariance of the fit chunks after
    the steps before this one; it is the step's fitted state (``"W"``, float64), applied in
    the traces' dtype.

    Parameters
    ----------
    mode : {"local", "global"}
    n_neighbors : int
        Neighbourhood size for local whitening (at most the channel count is used).
    eps : float, optional
        Regularization, as for `dspk.whitening_matrix`.
    groups : {"none", "shank"}
        Whiten across all channels, or within each shank (W block-diagonal; needs the
        recording's `shank_ids`).

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline import Pipeline, Whiten
    >>> rng = np.random.default_rng(0)
    >>> x = ((np.eye(6) + 0.5 * np.eye(6, k=1)) @ rng.standard_normal((6, 30000)))
    >>> geom = np.c_[np.zeros(6), 20.0 * np.arange(6)]
    >>> rec = dspk.open_recording(x.astype(np.float32), fs=30000.0, geometry=geom)
    >>> p = Pipeline([Whiten("local", n_neighbors=3)]).fit(rec)
    >>> (p.states[0]["W"] != 0).sum(axis=1)           # 3 non-zeros per row
    array([3, 3, 3, 3, 3, 3])
    """
    mode: str = "local"
    n_neighbors: int = 32
    eps: float | None = None
    groups: str = "none"

    fitted = ("W",)
    whitens = True

    def __post_init__(self) -> None:
        _check_groups("whiten_groups", self.groups)

    @property
    def needs(self) -> tuple[str, ...]:
        """Local whitening needs the geometry; whitening per shank the channels' shanks."""
        return (("geometry",) if self.mode == "local" else ()) + \
            (("shank_ids",) if self.groups == "shank" else ())

    def describe(self) -> str:
        """``whiten='<mode>'`` (and ``whiten_groups='shank'``)."""
        groups = "" if self.groups == "none" else f", whiten_groups={self.groups!r}"
        return f"whiten={self.mode!r}{groups}"

    def instead(self, need: str) -> str:
        """Global whitening needs no geometry; whitening across shanks no shanks."""
        if need == "shank_ids":
            return "use whiten_groups='none' (--whiten-groups none)"
        return "use whiten='global' (--whiten global)" if need == "geometry" else ""

    def fit(self, blocks: FitBlocks, ctx: Context) -> dict:
        """``{"W": float64 [channels, channels]}`` from the covariance of the fit chunks
        (their own samples, after the steps before this one), accumulated chunk by chunk in
        order (`dspk.CovarianceAccumulator`).

        Parameters
        ----------
        blocks : FitBlocks
        ctx : Context
            Its geometry for local whitening.

        Returns
        -------
        dict

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Context, FitBlocks, Whiten
        >>> x = np.random.default_rng(0).standard_normal((3, 9000))
        >>> ctx = Context(fs=30000.0, n_channels=3, xp=np, dtype=np.dtype(np.float64))
        >>> Whiten("global").fit(FitBlocks([x], halo=0), ctx)["W"].shape
        (3, 3)
        """
        acc = CovarianceAccumulator()
        for x in blocks.inner():
            acc.add(x)
        shanks = getattr(ctx.recording, "shank_ids", None) if self.groups == "shank" else None
        return self.from_covariance(acc, ctx.geometry, shanks)

    def from_covariance(self, covariance: CovarianceAccumulator, geometry: Any = None,
                        shank_ids: Any = None) -> dict:
        """``{"W": ...}`` from an accumulated covariance (`fit`'s last part).

        Parameters
        ----------
        covariance : CovarianceAccumulator
        geometry : [channels, 2] array, optional
            Needed by local whitening.
        shank_ids : [channels] array, optional
            Needed per shank (``groups="shank"``): W is then block-diagonal, each shank
            whitened on its own channels' covariance (Kilosort4's and SpikeInterface's
            per-shank whitening).

        Examples
        --------
        >>> import numpy as np, dspk
        >>> from dspk.pipeline import Whiten
        >>> acc = dspk.CovarianceAccumulator()
        >>> _ = acc.add(np.random.default_rng(0).standard_normal((3, 9000)))
        >>> Whiten("global").from_covariance(acc)["W"].shape
        (3, 3)
        """
        if self.mode == "local" and geometry is None:
            raise PipelineError("whiten='local' needs the recording's geometry (channel "
                                "positions); pass geometry= when opening it, or use "
                                "whiten='global'")
        cov = covariance.result().astype(np.float64)
        if self.groups == "none":
            w = self._zca(cov, geometry)
        else:
            if shank_ids is None or len(shank_ids) != cov.shape[0]:
                raise PipelineError(f"{self.describe()} needs the recording's shanks; "
                                    f"{self.instead('shank_ids')}")
            shanks = np.asarray(shank_ids)
            w = np.zeros_like(cov)
            for s in np.unique(shanks):
                g = np.flatnonzero(shanks == s)
                w[np.ix_(g, g)] = self._zca(cov[np.ix_(g, g)],
                                            None if geometry is None else np.asarray(geometry)[g])
        log.info("fitted %s whitening on %d samples%s", self.mode, covariance.n,
                 "" if self.groups == "none" else " within each shank")
        return {"W": to_numpy(w).astype(np.float64)}

    def _zca(self, cov: np.ndarray, geometry: Any) -> np.ndarray:
        if self.mode == "global":
            return whitening_matrix(cov, eps=self.eps)
        return whitening_matrix(cov, eps=self.eps, geometry_um=geometry,
                                n_neighbors=min(self.n_neighbors, cov.shape[0]))

    def prepare(self, ctx: Context, state: dict) -> SpatialFilter:
        """W on the run's device, in its dtype, as a `dspk.SpatialFilter`; `PipelineError`
        before the fit."""
        if "W" not in state:
            raise _not_fitted("Whiten")
        return SpatialFilter(ctx.xp.asarray(state["W"].astype(ctx.dtype)))

    def apply(self, x: Any, ctx: Context, prepared: SpatialFilter) -> Any:
        """W·x for a block x [channels, samples]."""
        return prepared(x)


register(Whiten, (
    Option("whiten", "--whiten", "local", "ZCA whitening: local needs channel positions "
           "(--probe)", choices=("global", "local", "none")),
    Option("n_neighbors", "--neighbors", 32, "channels per neighbourhood for local whitening",
           type=int, metavar="N"),
    Option("whiten_groups", "--whiten-groups", "none", "whiten within each shank (shank: the "
           "recording's shanks; W block-diagonal) or across all channels",
           choices=GROUPS)),
    make=lambda whiten, n_neighbors, whiten_groups: None if whiten in (None, "none")
    else Whiten(whiten, int(n_neighbors), groups=whiten_groups or "none"))
