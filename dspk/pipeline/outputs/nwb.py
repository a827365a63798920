"""An NWB file (`NWBOutput`, ``format="nwb"``): a processed ``ElectricalSeries`` in the
``ecephys`` processing module (`dspk.io.nwb`), written through pynwb with its electrodes table
(channel ids, shanks, positions, contact ids, ADC sample shifts:
`dspk.pipeline.record.channel_metadata`) and the session's start and subject an NWB or
SpikeGLX input gives (`dspk.io.nwb.input_metadata`), its samples written chunk by chunk into
the allocated dataset; ``conversion`` is scale × 1e-6, so that data × conversion × 1e6 is in
µV (in noise SDs when whitened: NWB fixes the unit to volts, the series' description says
so). Written as ``OUT.partial``, renamed when complete; not resumable.

Examples
--------
>>> import os, tempfile
>>> import numpy as np, dspk
>>> tmp = tempfile.TemporaryDirectory()
>>> rec = dspk.open_recording(np.ones((3000, 2), np.float32), fs=3e4,
...                           geometry=np.c_[np.zeros(2), [0.0, 20.0]])
>>> out = dspk.Pipeline.from_options(whiten="global").run(
...     rec, os.path.join(tmp.name, "o.nwb"), format="nwb", progress=False)
>>> with dspk.open_recording(out) as back:
...     back.n_samples, back.n_channels
(3000, 2)
>>> tmp.cleanup()
"""

from __future__ import annotations

import os
from typing import Any

from ..._version import __version__
from ...io import RecordingError, SubsetRecording
from ...io.nwb import create_processed_series, input_metadata, pynwb_module, subject_fields
from ..errors import PipelineError
from ..record import channel_metadata
from .base import register_output
from .raw import RawTracesOutput

__all__ = ["NWBOutput", "steps_text"]


def steps_text(steps: list) -> str:
    """The pipeline's steps as one line: ``HighPass(cutoff_hz=300.0) -> ...``.

    Parameters
    ----------
    steps : list of dict
        `Pipeline.options`.

    Examples
    --------
    >>> from dspk.pipeline.outputs.nwb import steps_text
    >>> steps_text([{"step": "HighPass", "cutoff_hz": 300.0}, {"step": "Whiten"}])
    'HighPass(cutoff_hz=300.0) -> Whiten()'
    """
    def one(s: dict) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in s.items() if k != "step")
        return f"{s['step']}({fields})"
    return " -> ".join(one(s) for s in steps) or "no steps"


@register_output
class NWBOutput(RawTracesOutput):
    """An NWB file (see the module's description): ``OUT`` a file. pynwb is looked for when
    the output is made, before any work.

    Parameters
    ----------
    out : path
        The output file (``.nwb``).
    overwrite : bool
        Replace an existing output (never a file of the input).
    subject : dict, optional
        The experiment's subject, pynwb ``Subject`` fields (`dspk.io.nwb.subject_fields`:
        ``subject_id``, ``species``, ``sex``, ``age`` ...; ``Pipeline.run(format="nwb",
        subject=...)``, ``dspk preprocess --subject KEY=VALUE``): they win over those an
        NWB input gives. DANDI and nwbinspector require a subject with a species and an age;
        dspk never invents one, so an output of a recording that does not say it (SpikeGLX,
        Open Ephys) has none unless given here.

    Raises
    ------
    dspk.pipeline.PipelineError
        A ``subject`` field pynwb's ``Subject`` does not have.

    Examples
    --------
    >>> from dspk.pipeline.outputs import NWBOutput
    >>> NWBOutput("o.nwb").files.partial.name, NWBOutput.resumes
    ('o.nwb.partial', False)
    >>> NWBOutput("o.nwb", subject={"species": "Mus musculus", "age": "P90D"}).subject
    {'species': 'Mus musculus', 'age': 'P90D'}
    """

    format = "nwb"
    summary = "an NWB file with a processed ElectricalSeries (needs pynwb)"
    layouts = ("samples_channels",)
    reader = "NWB"
    suffix = ".nwb"

    def __init__(self, out: str | os.PathLike | None = None, *, overwrite: bool = False,
                 subject: dict | None = None) -> None:
        super().__init__(out, overwrite=overwrite)
        pynwb_module()                          # before any work: a clear error without it
        try:                                    # before any work too: a field misspelt
            self.subject = None if subject is None else subject_fields(subject)
        except RecordingError as exc:
            raise PipelineError(str(exc)) from None

    def begin(self, job: Any, done: int, rows: dict) -> int:
        """The file with its electrodes table and the series allocated (pynwb), the traces
        written into the series' samples."""
        rec, steps = job.rec, job.pipeline.options()
        unit = "the noise's standard deviation (whitened), not volts" if \
            job.pipeline.whitens else "µV"
        start = rec.start if isinstance(rec, SubsetRecording) else 0
        channels = channel_metadata(rec, steps)
        offset = create_processed_series(
            self.files.partial, n_samples=rec.n_samples, fs=rec.fs, dtype=job.out_dtype,
            conversion=job.scale * 1e-6,
            description=f"{rec.source} processed by dspk {__version__}; data x conversion x "
                        f"1e6 is in {unit}",
            filtering=f"dspk {__version__}: {steps_text(steps)} (fingerprint "
                      f"{job.job_record['fingerprint'][:16]})",
            geometry=rec.geometry, shank_ids=rec.shank_ids, channel_ids=channels["channel_ids"],
            contact_ids=channels["contact_ids"], sample_shifts=channels["sample_shifts"],
            starting_time=start / rec.fs, session_description=f"{rec.source}, processed by dspk",
            **self._metadata(rec))
        self.open_traces(job, self.files.partial, offset)
        self._duration, self._t0 = rec.n_samples / rec.fs, start / rec.fs
        return done

    def _metadata(self, rec: Any) -> dict:
        """The session's start and subject: the input's (`dspk.io.nwb.input_metadata`), the
        subject's fields given to this output winning."""
        found = input_metadata(rec.files())
        if self.subject:
            found["subject"] = {**found.get("subject", {}), **self.subject}
        return found

    def events(self, table: Any, fs: float, source: str = "") -> None:
        """The recording's sync bits / TTL lines as the ``TimeIntervals`` table
        ``/intervals/events`` (`dspk.io.events.write_events_nwb`: each bit's high periods):
        the `~dspk.pipeline.Job`'s hook, once the traces are written."""
        from ...io.events import write_events_nwb  # noqa: PLC0415

        self.close()                      # the traces' descriptor: pynwb appends to the file
        table = table.copy()
        table["time"] = table["sample"] / float(fs) + self._t0   # the series' clock
        write_events_nwb(self.files.partial, table, self._t0 + self._duration)
