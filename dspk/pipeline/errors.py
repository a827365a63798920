"""The pipeline's one error type (raised by the steps, the pipeline and the job alike)."""

from __future__ import annotations

__all__ = ["PipelineError"]


class PipelineError(ValueError):
    """A pipeline that cannot run as asked (the message says why).

    A `ValueError`, so ``except ValueError`` catches it too. Importable as
    ``dspk.pipeline.PipelineError``, its documented home (the tracebacks say so too).

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline import Pipeline, PipelineError, Whiten
    >>> x = np.zeros((4, 3000), dtype=np.float32)
    >>> try:
    ...     Pipeline([Whiten("global")]).transform(x, fs=30000.0)
    ... except PipelineError as exc:
    ...     print(exc)
    Whiten: not fitted (call Pipeline.fit(recording) first)
    """


# the public name (tracebacks print "dspk.pipeline.PipelineError: ...", as before the module
# became a package); pickles name it there too, and dspk.pipeline re-exports it
PipelineError.__module__ = "dspk.pipeline"
