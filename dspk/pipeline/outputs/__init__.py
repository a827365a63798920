"""What a job writes into: the `Output` contract and the registry of formats
(`register_output`), and the formats dspk brings — `HDF5Output` (``"hdf5"``, dspk's own),
`KilosortOutput` (``"kilosort"``, a folder Kilosort4 and Phy read as it is), `NWBOutput`
(``"nwb"``), `SpanOutput` (``"span"``, a span of a prepared file: `dspk.dask.run_split`) and
`PeaksOutput` (``"peaks"``, detection alone: ``dspk detect``), `ZarrOutput` (``"zarr"``,
SpikeInterface's Zarr folder). One `dspk.pipeline.Job` runs
them all; adding a format is one `Output` subclass and one `register_output` call.

Examples
--------
>>> from dspk.pipeline.outputs import formats, output_class
>>> formats()
('hdf5', 'kilosort', 'nwb', 'span', 'peaks', 'zarr')
>>> output_class("nwb").suffix, output_class("kilosort").target
('.nwb', 'folder')
"""

from .base import (LAYOUTS, OUTPUT_DTYPES, Output, check_output_options, chunk_samples,
                   formats, int16_scale, output_class, read_files, register_output,
                   unregister_output)
from .partial import FolderOutput, PartialOutput
# each module registers its format when imported: this order is the order of `formats`
from .hdf5 import HDF5Output, TraceOutput
from .kilosort import KILOSORT_BINARY, KILOSORT_FILES, KILOSORT_STEPS_PER_SD, KilosortOutput
from .nwb import NWBOutput
from .span import SpanOutput
from .peaks import DETECT_FILES, PeaksOutput
from .raw import RawTracesOutput, write_traces
from .zarr import ZarrOutput

__all__ = ["Output", "register_output", "unregister_output", "output_class", "formats",
           "PartialOutput", "FolderOutput", "HDF5Output", "KilosortOutput", "NWBOutput",
           "SpanOutput", "PeaksOutput", "ZarrOutput", "RawTracesOutput", "TraceOutput",
           "write_traces",
           "OUTPUT_DTYPES", "LAYOUTS", "check_output_options", "int16_scale", "chunk_samples",
           "read_files", "KILOSORT_BINARY", "KILOSORT_FILES", "KILOSORT_STEPS_PER_SD",
           "DETECT_FILES"]
