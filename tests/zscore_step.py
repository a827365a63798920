"""A pipeline step written outside the package, as a user writes one (docs/writing-a-step.rst
shows this file): each channel centred on its median and scaled to unit noise, the noise
measured as the median absolute deviation / 0.6745 on the fit chunks — SpikeInterface's
``zscore(mode="median+mad")``.

One class and one `dspk.pipeline.register` call: then ``Pipeline.from_options(zscore=True)``,
``dspk preprocess ... --zscore`` and ``dspk.dask.preprocess_many(..., zscore=True)`` make it.
(A package registers at import; the tests call `register_zscore` in a fixture and remove it
afterwards.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dspk.backend import to_numpy
from dspk.pipeline import Context, FitBlocks, Option, Step, register, registry

#: MAD of a standard normal variable
MAD_TO_SD = 0.6744897501960817


@dataclass
class ZScore(Step):
    """Each channel minus its median, divided by its noise (MAD / 0.6745), both measured on
    the fit chunks after the steps before this one."""

    fitted = ("center", "scale")            # the arrays fit() returns: saved, fingerprinted

    def describe(self) -> str:              # how messages name it: as the user asked for it
        return "zscore=True"

    def fit(self, blocks: FitBlocks, ctx: Context) -> dict:
        x = np.concatenate([to_numpy(b) for b in blocks.inner()], axis=1).astype(np.float64)
        center = np.median(x, axis=1)
        scale = np.median(np.abs(x - center[:, None]), axis=1) / MAD_TO_SD
        return {"center": center, "scale": np.where(scale > 0, scale, 1.0)}

    def prepare(self, ctx: Context, state: dict) -> tuple:
        # once per run: the vectors on the run's device, in its dtype
        xp, dtype = ctx.xp, ctx.dtype
        return (xp.asarray(state["center"].astype(dtype))[:, None],
                xp.asarray((1.0 / state["scale"]).astype(dtype))[:, None])

    def apply(self, x: Any, ctx: Context, prepared: tuple) -> Any:
        center, inverse = prepared
        x -= center
        x *= inverse
        return x


OPTION = Option("zscore", "--zscore", False, "centre each channel on its median and scale "
                "it to unit noise (MAD)", switch=True)


def register_zscore() -> None:
    """Register `ZScore`, asked for by ``zscore=True`` (``--zscore``), before whitening."""
    register(ZScore, (OPTION,), make=lambda zscore: ZScore() if zscore else None,
             before="Whiten")


def unregister_zscore() -> None:
    registry.unregister("ZScore")
