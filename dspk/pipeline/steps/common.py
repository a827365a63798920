"""What the steps share: the pipeline's logger, the channel groups a reference or a whitening
can be taken within, and the error of a step prepared before it is fitted."""

from __future__ import annotations

import logging

from ...argnames import arg
from ..errors import PipelineError

# one logger for all of the pipeline's messages (the command line prints its name)
log = logging.getLogger("dspk.pipeline")

#: the channel groups a reference or a whitening can be taken within
GROUPS = ("none", "shank")


def _check_groups(option: str, groups: str) -> None:
    if groups not in GROUPS:
        raise PipelineError(f"{arg(option)}: expected 'shank' or 'none', got {groups!r}")


def _not_fitted(step: str) -> PipelineError:
    """What `prepare` raises for a step whose state is not fitted yet."""
    return PipelineError(f"{step}: not fitted (call Pipeline.fit(recording) first)")
