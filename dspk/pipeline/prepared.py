"""A pipeline prepared for one run (`PreparedPipeline`): every stage's `prepare` made once for
the run's context (the taps at its rate, W on its device), then applied to blocks, with the
samples outside the recording kept at zero after every step; and the fit pass
(`fitted_states`): each fit chunk read and filtered once, every stage that fits fitted in
order on the chunks as the stages before it left them.

The prepared data belong to the run: the pipeline's options and fitted state are only read.

Examples
--------
>>> import numpy as np
>>> from dspk.pipeline import Context, Pipeline, Reference
>>> p = Pipeline([Reference("mean")])
>>> run = p.prepare(Context(fs=1000.0, n_channels=2, xp=np, dtype=np.dtype(np.float32)))
>>> run.apply(np.eye(2, dtype=np.float32), start=0, n_total=2)
array([[ 0.5, -0.5],
       [-0.5,  0.5]], dtype=float32)
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterator, Sequence

from ..argnames import arg
from ..backend import DeviceOutOfMemory, free_device_memory, out_of_memory, to_numpy
from ..finite import check_finite, checked
from .stage import Context, FitBlocks, Sink, Step
from .stream import device_read_ahead

log = logging.getLogger("dspk.pipeline")

__all__ = ["PreparedPipeline", "fitted_states", "pass_blocks", "PASS_CHUNK_S", "FIT_CHUNKS",
           "FIT_CHUNK_S"]

#: chunks drawn (seeded) over the recording to fit whitening, and their length in seconds
#: (`dspk.pipeline.fit_spans`; the fit's out-of-memory message says them)
FIT_CHUNKS, FIT_CHUNK_S = 16, 0.5


class PreparedPipeline:
    """The stages of a pipeline (the first ``upto``), each prepared for ``ctx``.

    Parameters
    ----------
    stages : sequence of Stage
    states : sequence of dict
        Their fitted states.
    ctx : Context
    upto : int, optional
        Only the first ``upto`` stages.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline import Context, HighPass, Whiten
    >>> from dspk.pipeline.prepared import PreparedPipeline
    >>> ctx = Context(fs=30000.0, n_channels=2, xp=np, dtype=np.dtype(np.float32))
    >>> run = PreparedPipeline([HighPass(), Whiten()], [{}, {}], ctx, upto=1)  # not fitted:
    >>> len(run.steps)                                       # Whiten is not prepared
    1
    """

    def __init__(self, stages: Sequence[Any], states: Sequence[dict], ctx: Context,
                 upto: int | None = None) -> None:
        self.ctx = ctx
        pairs = list(zip(stages, states))[:upto]
        # a front end (`Decimate`) changed the recording the blocks come from: not applied
        self.steps = [(s, s.prepare(ctx, st)) for s, st in pairs
                      if isinstance(s, Step) and not getattr(s, "front_end", False)]
        self.sinks = [(s, s.prepare(ctx, st), st) for s, st in pairs if isinstance(s, Sink)]

    def apply(self, x: Any, start: int, n_total: int) -> Any:
        """The steps on a block x [channels, samples] in the run's dtype whose first sample
        is sample ``start`` of a recording of ``n_total`` samples (in place where a step
        allows): the samples outside [0, n_total) are set to zero after every step.

        ``x`` is checked once, here (`dspk.finite.check_finite`: a NaN or an infinity is a
        `ValueError` naming its channel and sample, which every step would spread); the steps
        do not check it again. `compute`, for blocks a recording read (and checked), skips
        the check.

        Parameters
        ----------
        x : array
        start : int
            Negative for a block that begins with a halo before the recording.
        n_total : int

        Examples
        --------
        >>> import numpy as np
        >>> from dspk.pipeline import Context, Pipeline, Reference
        >>> run = Pipeline([Reference("mean")]).prepare(
        ...     Context(fs=1e3, n_channels=2, xp=np, dtype=np.dtype(np.float32)))
        >>> x = np.array([[1, 1, 1], [3, 3, 3]], np.float32)   # samples -1, 0, 1 of 1
        >>> run.apply(x, start=-1, n_total=1)
        array([[ 0., -1.,  0.],
               [ 0.,  1.,  0.]], dtype=float32)
        """
        check_finite(x, "x")
        return self._apply(x, start, n_total)

    def _apply(self, x: Any, start: int, n_total: int) -> Any:
        """`apply` on a block already checked: the steps' own public calls do not scan it
        again (`dspk.finite.checked`; on the GPU each scan would wait for the device)."""
        ctx = self.ctx
        lo, hi = max(0, -start), min(x.shape[1], n_total - start)
        with checked():
            for step, prepared in self.steps:
                x = step.apply_at(x, ctx, prepared, start)
                if lo > 0 or hi < x.shape[1]:
                    x[:, :lo] = 0
                    x[:, hi:] = 0
        return x

    def compute(self, raw: tuple, s0: int, s1: int, m: int) -> Any:
        """The steps on a block read as (first sample, µV block) for [s0 − m, s1 + m),
        padded with zeros where that lies outside the recording.

        Parameters
        ----------
        raw : tuple
            (first sample read, block [channels, samples]) (`dspk.pipeline.stream.read_block`).
        s0, s1 : int
            The chunk.
        m : int
            Its halo.

        Returns
        -------
        array [channels, s1 − s0 + 2 m]
        """
        ctx = self.ctx
        xp, dtype = ctx.xp, ctx.dtype
        rec = ctx.recording
        a, block = raw
        width = s1 - s0 + 2 * m
        if a == s0 - m and block.shape[1] == width:   # inside the recording: no padding
            x = xp.asarray(block).astype(dtype, copy=False)
        else:
            x = xp.zeros((ctx.n_channels, width), dtype=dtype)
            x[:, a - (s0 - m):a - (s0 - m) + block.shape[1]] = \
                xp.asarray(block).astype(dtype, copy=False)
        # read by the recording, which refuses non-finite float samples (and an integer
        # recording holds none): not scanned again
        return self._apply(x, s0 - m, rec.n_samples)

    def tables(self) -> list:
        """Every sink's tables, in order (`dspk.pipeline.Sink.tables`)."""
        return [t for s, _, st in self.sinks for t in s.tables(self.ctx, st)]

    def rows(self, full: Any, s0: int, s1: int, m: int) -> list:
        """Every sink's rows of chunk [s0, s1) computed with halo m (each sink gets its own
        margin of exact context), in `tables`' order.

        Parameters
        ----------
        full : array [channels, s1 − s0 + 2 m]
        s0, s1, m : int
        """
        out: list = []
        with checked():                       # (the steps' output of a checked block)
            for sink, prepared, _ in self.sinks:
                md = sink.margin(self.ctx.fs)
                out += sink.rows(full[:, m - md:m + (s1 - s0) + md], s0, s1, self.ctx,
                                 prepared)
        return out


def fitted_states(stages: Sequence[Any], states: Sequence[dict], ctx: Context,
                  spans: Sequence[tuple]) -> list:
    """The fitted state of every stage from one pass over the fit chunks ``spans``: each read
    once with the whole pipeline's halo (in threads: several decompress at once) and put
    through the steps; a stage that fits is fitted on the chunks as the stages before it left
    them (with its own margin of context), then applied to them for the stages after it. A
    stage that asks for a pass over the whole recording (`Stage.fit_pass`: a drift estimate)
    gets it too, read when its fit iterates it (`pass_blocks`), through the steps before it
    as they were just fitted. Stages that fit nothing keep their state; nothing is read when
    no stage fits, or when those that fit do not read blocks (`Stage.reads_blocks`).

    The fit chunks are held on the device while the stages fit. When the device runs out of
    memory (`dspk.backend.out_of_memory`: a GPU fit of many channels under a memory limit),
    its pools are freed and the fit is made again on the same chunks held on the host, each
    moved to the device as a stage reads it (said in the log): a stage that reads them one
    at a time (whitening, a reference, bad channels) then holds one on the device, not all.
    When that runs out too, `dspk.backend.DeviceOutOfMemory` says what ran out and which
    option to change.

    Parameters
    ----------
    stages : sequence of Stage
    states : sequence of dict
        The current states (those of stages that fit nothing are kept).
    ctx : Context
        The fit's context, ``ctx.recording`` the recording read.
    spans : sequence of (int, int)
        The fit chunks (`dspk.pipeline.fit_spans`).

    Returns
    -------
    list of dict

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline import Context, HighPass, Whiten, fit_spans
    >>> from dspk.pipeline.prepared import fitted_states
    >>> x = np.random.default_rng(0).standard_normal((3, 9000)).astype(np.float32)
    >>> rec = dspk.open_recording(x, fs=30000.0)
    >>> ctx = Context.of(rec, np, np.float32)
    >>> states = fitted_states([HighPass(), Whiten("global")], [{}, {}], ctx,
    ...                        fit_spans(9000, 30000.0))
    >>> [sorted(s) for s in states]
    [[], ['W']]
    """
    out = [dict(st) for st in states]
    fitting = [k for k, s in enumerate(stages) if s.fitted]
    if not fitting:
        return out
    margins = [s.margin(ctx.fs) for s in stages]
    if not any(stages[k].reads_blocks for k in fitting):   # states from the recording alone
        for k in fitting:
            out[k] = stages[k].fit(FitBlocks([], margins[k]), ctx)
        return out
    with checked():     # blocks read by the recording (checked) and put through the steps
        return _fit_within_memory(stages, out, ctx, spans, fitting, margins)


def _fit_within_memory(stages: Sequence[Any], out: list, ctx: Context, spans: Sequence[tuple],
                       fitting: list, margins: list) -> list:
    """`_fit_blocks` with the chunks on the device; when the device runs out of memory, its
    pools freed, again with the chunks on the host; `DeviceOutOfMemory` when that runs out
    too (see `fitted_states`)."""
    said = ""
    for on_host in (False, True):
        if on_host:
            # out of the except block: the failed fit's arrays are gone, and the pools can
            # give their memory back
            free_device_memory(ctx.xp)
        try:
            return _fit_blocks(stages, [dict(st) for st in out], ctx, spans, fitting, margins,
                               on_host)
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            said = (str(exc).splitlines() or [""])[0][:120] or type(exc).__name__
        if not on_host:
            log.warning("the device ran out of memory fitting on %d chunks held on it (%s); "
                        "its pools freed, fitting again with them on the host, each moved to "
                        "the device as a stage reads it (the same chunks)", len(spans), said)
    free_device_memory(ctx.xp)
    raise DeviceOutOfMemory(_fit_out_of_memory(stages, fitting, ctx, spans, said))


def _fit_out_of_memory(stages: Sequence[Any], fitting: list, ctx: Context,
                       spans: Sequence[tuple], said: str) -> str:
    """What `DeviceOutOfMemory` says when the fit ran out of device memory for good: what
    was fitted on what, and what to change (the options spelled as the user passes them)."""
    names = ", ".join(type(stages[k]).__name__ for k in fitting)
    longest = max(s1 - s0 for s0, s1 in spans)
    return (f"the device ran out of memory fitting {names} on {len(spans)} fit chunks of "
            f"{longest / ctx.fs:.3g} s of {ctx.n_channels} channels, even with the chunks "
            f"held on the host ({said}): "
            f"free device memory (other processes), give the job more where it was capped "
            f"({arg('gpu_memory')}), fit on fewer or shorter chunks (in Python: "
            f"Pipeline.fit(recording, n_chunks=, chunk_s=), then run the fitted pipeline; "
            f"default {FIT_CHUNKS} chunks of {FIT_CHUNK_S:g} s), or compute on the CPU "
            f"({arg('backend', 'cpu')})")


def _fit_blocks(stages: Sequence[Any], out: list, ctx: Context, spans: Sequence[tuple],
                fitting: list, margins: list, on_host: bool = False) -> list:
    """`fitted_states` of stages that read blocks: ``out`` completed. With ``on_host`` the
    blocks are kept on the host between the steps and each moved to the device when used:
    one block at a time on the device, except where a stage's fit gathers them."""
    rec, fs, xp = ctx.recording, ctx.fs, ctx.xp

    def keep(b: Any) -> Any:
        return to_numpy(b) if on_host else b

    def device(b: Any) -> Any:
        return xp.asarray(b) if on_host else b

    m = sum(margins)
    first, last = fitting[0], fitting[-1]
    # the steps before the first stage that fits, chunk by chunk as the reads arrive; the
    # blocks keep their width (the chunk and m samples each side), as a job computes them
    head = PreparedPipeline(stages, out, ctx, upto=first)
    t0 = time.perf_counter()
    blocks = [keep(head.compute(raw, s0, s1, m))
              for (s0, s1), raw in zip(spans, device_read_ahead(rec, list(spans), m, xp))]
    # where a fit's time goes, in the log (a drift estimate's pass over the whole recording
    # is most of it: its stage's share)
    spent = [f"{len(spans)} chunks read and computed {time.perf_counter() - t0:.2f} s"]
    for k in range(first, last + 1):
        stage = stages[k]
        t = time.perf_counter()
        if stage.fitted:     # the stages before it took their margins: its own is exact
            cut = m - margins[k]
            halo = stage.fit_pass(fs)
            stream = () if halo is None else pass_blocks(stages[:k], out[:k], ctx, halo)
            if on_host:      # (cut on the device: the layout of the blocks it fits on)
                fit_blocks = FitBlocks(blocks, margins[k], stream,
                                       load=lambda b, c=cut: device(b)[:, c:b.shape[1] - c])
            else:
                fit_blocks = FitBlocks([b[:, cut:b.shape[1] - cut] for b in blocks],
                                       margins[k], stream)
            out[k] = stage.fit(fit_blocks, ctx)
        if k < last and isinstance(stage, Step):
            one = PreparedPipeline([stage], [out[k]], ctx)
            blocks = [keep(one._apply(device(b), s0 - m, rec.n_samples))
                      for (s0, _), b in zip(spans, blocks)]
        spent.append(f"{type(stage).__name__} {time.perf_counter() - t:.2f} s")
    log.info("fit in %.2f s: %s", time.perf_counter() - t0, ", ".join(spent))
    return out


#: the chunks of a fit pass over the whole recording (`pass_blocks`), in seconds
PASS_CHUNK_S = 1.0


def pass_blocks(steps: Sequence[Any], states: Sequence[dict], ctx: Context, halo: int,
                chunk_s: float = PASS_CHUNK_S) -> Iterator[tuple]:
    """The whole recording ``ctx.recording`` in chunks of ``chunk_s`` seconds through
    ``steps`` (fitted: ``states``), each with ``halo`` samples of exact context on each side
    (zeros outside the recording): ``(s0, s1, block)``, read ahead in threads and computed as
    iterated (a fit pass, `Stage.fit_pass`; only one chunk and those read ahead are held).

    Parameters
    ----------
    steps : sequence of Step
        The stages before the one fitted (sinks are not applied).
    states : sequence of dict
        Their fitted states.
    ctx : Context
    halo : int
        Samples of context each side.
    chunk_s : float
        Chunk length in seconds.

    Examples
    --------
    >>> import numpy as np, dspk
    >>> from dspk.pipeline import Context, Reference
    >>> from dspk.pipeline.prepared import pass_blocks
    >>> rec = dspk.open_recording(np.ones((2500, 2), np.float32), fs=1000.0)
    >>> ctx = Context.of(rec, np, np.float32)
    >>> [(s0, s1, b.shape) for s0, s1, b in pass_blocks([Reference("mean")], [{}], ctx, 5)]
    [(0, 1000, (2, 1010)), (1000, 2000, (2, 1010)), (2000, 2500, (2, 510))]
    """
    rec = ctx.recording
    m = sum(s.margin(ctx.fs) for s in steps) + int(halo)
    head = PreparedPipeline(steps, states, ctx)
    n = rec.n_samples
    chunk = max(1, int(round(chunk_s * ctx.fs)))
    spans = [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
    cut = m - int(halo)
    for (s0, s1), raw in zip(spans, device_read_ahead(rec, spans, m, ctx.xp)):
        full = head.compute(raw, s0, s1, m)
        yield s0, s1, full[:, cut:full.shape[1] - cut]
