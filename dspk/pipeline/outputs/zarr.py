"""A Zarr folder in SpikeInterface's layout (`ZarrOutput`, ``format="zarr"``, OUT a folder,
``.zarr`` by convention): the format SpikeInterface saves recordings to by default, read back
by ``spikeinterface.read_zarr`` (or ``spikeinterface.load``) with the channel ids, the
probe (the channel locations and shanks), the gains and the units.

What the folder holds (zarr v2, `zarr<3`: the version SpikeInterface 0.105 uses on Python
< 3.14; its metadata consolidated, as SpikeInterface writes it):

- ``traces_seg0`` [samples, channels], float32 or int16 (``scale`` units per step, as the
  HDF5 output's), chunked by the job's chunks along time, compressed with Blosc zstd
  (SpikeInterface's default compressor);
- ``channel_ids`` (the input's ids: SpikeInterface's, ``"imec0.ap#AP0"`` for SpikeGLX),
  the attributes ``sampling_frequency``, ``num_segments`` (1), ``probegroup``
  (probeinterface's dict: positions in µm, contact i on channel i, the shanks and the
  contact ids the input says) and ``annotations`` (``is_filtered``);
- ``properties/``: ``gain_to_uV`` and ``offset_to_uV`` for µV traces (the int16 scale, or 1;
  0) — none for whitened traces, in units of the noise's standard deviation, which
  SpikeInterface then never takes for µV — and for every output ``physical_unit``
  (``"uV"`` or ``"whitened (noise SD)"``), ``gain_to_physical_unit`` (the scale),
  ``offset_to_physical_unit`` and ``group`` (the shanks the input says, else 0); and
  ``inter_sample_shift`` (the ADC sample shifts, SpikeInterface's ``phase_shift`` reads
  them) where the input says them and no ``PhaseShift`` step corrected them;
- ``dspk.json`` (`dspk.pipeline.record.zarr_about`: what the folder holds, the channels'
  metadata, the pipeline's steps and the job's record) and ``fitted.h5`` (the fitted
  state, `dspk.pipeline.record.read_fitted`): files zarr ignores. `dspk.pipeline.record.describe`
  (``dspk info``) reads them.

Written as ``OUT.partial/`` and renamed ``OUT`` when complete, in one go (not resumable).

Examples
--------
>>> import os, tempfile
>>> import numpy as np, dspk
>>> tmp = tempfile.TemporaryDirectory()
>>> x = np.random.default_rng(0).standard_normal((4, 9000)).astype(np.float32)
>>> rec = dspk.open_recording(x, fs=30000.0, geometry=np.c_[np.zeros(4), 20.0 * np.arange(4)])
>>> out = dspk.Pipeline.from_options(whiten="global").run(
...     rec, os.path.join(tmp.name, "o.zarr"), format="zarr", progress=False)
>>> import spikeinterface as si
>>> back = si.read_zarr(out)
>>> back.get_num_samples(), back.get_channel_locations()[1].tolist()
(9000, [0.0, 20.0])
>>> str(back.get_property("physical_unit")[0]), back.has_scaleable_traces()
('whitened (noise SD)', False)
>>> tmp.cleanup()
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ...io.rawio import new_file
from ..errors import PipelineError
from ..record import (UNITS_UV, json_channel_ids, output_sample_shifts, write_fitted,
                      zarr_about)
from .base import Output, register_output
from .raw import write_traces

__all__ = ["ZarrOutput", "ZARR_FILES", "zarr_module", "zarr_probegroup"]

#: every file and folder of a Zarr output (a folder holding anything else is never replaced)
ZARR_FILES = (".zgroup", ".zattrs", ".zmetadata", "traces_seg0", "channel_ids", "properties",
              "dspk.json", "fitted.h5")


def zarr_module() -> Any:
    """The zarr package (version 2: SpikeInterface 0.105's on Python < 3.14).

    Raises
    ------
    dspk.pipeline.PipelineError
        zarr is not installed, or is version 3 or later.

    Examples
    --------
    >>> from dspk.pipeline.outputs.zarr import zarr_module
    >>> zarr_module().__version__.split(".")[0]
    '2'
    """
    try:
        import zarr  # noqa: PLC0415 (an optional dependency, imported when used)
    except ImportError:
        raise PipelineError("format='zarr' needs zarr: pip install 'zarr>=2.18,<3' (or "
                            "dspk[zarr])") from None
    if int(zarr.__version__.split(".")[0]) >= 3:
        raise PipelineError(f"format='zarr' writes zarr v2 as SpikeInterface 0.105 does; "
                            f"zarr {zarr.__version__} is installed: pip install "
                            f"'zarr>=2.18,<3'")
    return zarr


def zarr_probegroup(geometry: Any, shank_ids: Any = None, contact_ids: Any = None) -> dict:
    """The probe as SpikeInterface's Zarr folder holds it (``probegroup``: probeinterface's
    ``ProbeGroup.to_dict``): one planar probe in µm, contact i wired to channel i, its shank
    and contact id when given (contact shapes are probeinterface's default: dspk stores
    none).

    Parameters
    ----------
    geometry : [channels, 2] array
        µm.
    shank_ids : [channels] array, optional
    contact_ids : [channels] array, optional
        probeinterface's contact ids (``"e12"``), as text.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.pipeline.outputs.zarr import zarr_probegroup
    >>> d = zarr_probegroup(np.c_[np.zeros(2), [0.0, 20.0]])
    >>> d["probes"][0]["contact_positions"], d["probes"][0]["device_channel_indices"]
    ([[0.0, 0.0], [0.0, 20.0]], [0, 1])
    """
    from probeinterface import Probe, ProbeGroup  # noqa: PLC0415 (a dspk dependency)

    g = np.asarray(geometry, np.float64)
    if g.ndim != 2 or g.shape[1] != 2:
        raise PipelineError(f"geometry: expected [channels, 2] positions in µm, got "
                            f"{g.shape}")
    probe = Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=g, shank_ids=None if shank_ids is None else
                       [str(s) for s in np.asarray(shank_ids)])
    if contact_ids is not None:
        probe.set_contact_ids([str(v) for v in np.asarray(contact_ids).tolist()])
    probe.set_device_channel_indices(np.arange(len(g)))
    group = ProbeGroup()
    group.add_probe(probe)
    return group.to_dict(array_as_list=True)


@register_output
class ZarrOutput(Output):
    """A Zarr folder in SpikeInterface's layout (see the module's description): ``OUT`` a
    folder, new or empty, or with ``overwrite`` one holding a dspk Zarr output and nothing
    else. zarr (version 2) is looked for when the output is made, before any work.

    Parameters
    ----------
    out : path
        The output folder (``.zarr``).
    overwrite : bool
        Replace the dspk Zarr output there.

    Examples
    --------
    >>> from dspk.pipeline.outputs import ZarrOutput
    >>> ZarrOutput("o.zarr").files.partial.name, ZarrOutput.resumes, ZarrOutput.target
    ('o.zarr.partial', False, 'folder')
    """

    format = "zarr"
    summary = ("a Zarr folder that SpikeInterface's read_zarr reads (its default save "
               "format; needs zarr<3)")
    target = "folder"
    layouts = ("samples_channels",)
    reader = "SpikeInterface"
    uncompressed = "compressed with Blosc zstd, as SpikeInterface saves"
    suffix = ".zarr"
    fitted_name = "fitted.h5"
    owned = ZARR_FILES
    marker = "dspk.json"
    what = "the dspk Zarr output"

    def __init__(self, out: str | os.PathLike | None = None, *, overwrite: bool = False
                 ) -> None:
        super().__init__(out, overwrite=overwrite)
        zarr_module()                           # before any work: a clear error without it
        self._traces: Any = None
        self._job: Any = None

    def begin(self, job: Any, done: int, rows: dict) -> int:
        """The partial folder: the Zarr group with ``traces_seg0`` allocated (chunks of the
        job's chunk length), the channel ids and the fitted state."""
        zarr = zarr_module()
        from numcodecs import Blosc  # noqa: PLC0415 (zarr's own dependency)

        partial, rec = self.files.partial, job.rec
        partial.mkdir()
        root = zarr.open_group(str(partial), mode="w")
        n, c = rec.n_samples, rec.n_channels
        self._traces = root.create_dataset(
            "traces_seg0", shape=(n, c), dtype=job.out_dtype, chunks=(max(1, min(n, job.chunk)), c),
            compressor=Blosc(cname="zstd", clevel=5, shuffle=Blosc.BITSHUFFLE))
        root.create_dataset("channel_ids", data=np.asarray(json_channel_ids(rec)),
                            compressor=None)
        with new_file(partial / self.fitted_name) as f:
            write_fitted(f, job.pipeline.steps, rec.fs, job.states)
        self._root, self._job = root, job
        return done

    def write(self, s0: int, s1: int, block: Any, rows: list) -> None:
        """Chunk [s0, s1) of the traces into ``traces_seg0``."""
        write_traces(None, self._traces, s0, s1, block, "samples_channels", self._job.staged)

    def commit(self) -> None:
        """The properties, the probe, the attributes and ``dspk.json``; the metadata
        consolidated; then the folder named OUT."""
        job, root = self._job, self._root
        zarr = zarr_module()
        rec, c = job.rec, job.rec.n_channels
        steps = job.pipeline.options()
        scale = float(job.scale)
        props = root.create_group("properties")
        values = {"physical_unit": np.array([job.units] * c),
                  "gain_to_physical_unit": np.full(c, scale),
                  "offset_to_physical_unit": np.zeros(c)}
        if job.units == UNITS_UV:
            values.update(gain_to_uV=np.full(c, scale), offset_to_uV=np.zeros(c))
        values["group"] = np.zeros(c, np.int64) if rec.shank_ids is None else \
            np.asarray(rec.shank_ids, np.int64)         # SpikeInterface's groups: the shanks
        shifts = output_sample_shifts(rec, steps)
        if shifts is not None:                   # what SpikeInterface's phase_shift reads
            values["inter_sample_shift"] = shifts
        for key, v in values.items():
            props.create_dataset(key, data=v, compressor=None)
        root.attrs["sampling_frequency"] = float(rec.fs)
        root.attrs["num_segments"] = 1
        root.attrs["annotations"] = {"is_filtered": any(
            s["step"] in ("HighPass", "BandPass") for s in steps)}
        root.attrs["provenance"] = None
        if rec.geometry is not None:
            root.attrs["probegroup"] = zarr_probegroup(rec.geometry, rec.shank_ids,
                                                       rec.contact_ids)
        about = zarr_about(rec, "traces_seg0", job.out_dtype, scale, job.units,
                           job.pipeline.whitens, steps, job.job_record)
        (self.files.partial / "dspk.json").write_text(json.dumps(about, indent=1) + "\n")
        zarr.consolidate_metadata(root.store)
        super().commit()

    def close(self) -> None:
        """Nothing to close (zarr writes each chunk as it is given)."""
        self._traces = None
