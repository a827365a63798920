"""Where the names of a job's output file lived before `dspk.pipeline.outputs` (the `Output`
contract, its formats and the partial file) and `dspk.pipeline.record` (what an output holds:
the job record, the metadata, the fitted state): every name is importable from here as
before, and `check_output` is the HDF5 output's check (`dspk.pipeline.outputs.Output.check`).

Examples
--------
>>> import os, tempfile
>>> from dspk.pipeline.output import PartialOutput
>>> tmp = tempfile.TemporaryDirectory()
>>> files = PartialOutput(os.path.join(tmp.name, "out.h5"))
>>> with files.writing() as partial:          # renamed when the block completes
...     _ = open(partial, "w").write("done")
>>> sorted(os.listdir(tmp.name))
['out.h5']
>>> tmp.cleanup()
"""

from __future__ import annotations

import os
from pathlib import Path

from ..io import Recording
from .outputs import (LAYOUTS, OUTPUT_DTYPES, HDF5Output, PartialOutput, TraceOutput,
                      check_output_options, chunk_samples, int16_scale, write_traces)
from .record import UNITS_UV, UNITS_WHITENED, channel_ids, job_record, write_metadata

__all__ = ["OUTPUT_DTYPES", "LAYOUTS", "UNITS_UV", "UNITS_WHITENED", "check_output",
           "check_output_options", "int16_scale", "chunk_samples", "PartialOutput",
           "job_record", "write_metadata", "channel_ids", "TraceOutput", "write_traces"]


def check_output(out: str | os.PathLike, rec: Recording | None, overwrite: bool) -> Path:
    """Refuse an HDF5 output file before any work (`dspk.pipeline.outputs.Output.check`):
    any file of the input, anything but a regular file, an existing file without
    ``overwrite``, a missing or read-only folder.

    Parameters
    ----------
    out : path
        The output file.
    rec : Recording, optional
        The input.
    overwrite : bool
        Whether an existing output may be replaced.

    Returns
    -------
    pathlib.Path
        ``out``.

    Examples
    --------
    >>> from dspk.pipeline.output import check_output
    >>> check_output("/dev/null", None, overwrite=True)      # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.pipeline.PipelineError: /dev/null: is not a regular file (a character device); ...
    """
    HDF5Output(out, overwrite=overwrite).check(rec)
    return Path(out)
