"""Recordings in HDF5: any 2-D dataset, and NWB ElectricalSeries read through h5py alone.

gzip-compressed datasets are decompressed in parallel: the raw chunks are read with
``read_direct_chunk`` (fast, under HDF5's global lock) and inflated by zlib in a thread pool
(zlib releases the GIL), so a compressed file is not capped at one core the way h5py's own
filter pipeline is. Other filters (lzf, hdf5plugin's) go through h5py.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..argnames import arg
from .errors import RecordingError
from .layout import LAYOUTS, channels_first, resolve_layout
from .probe import stored_geometry
from .rawio import RawDatasetReader
from .recording import OpenOptions, Recording, RecordingSpec, resolved_metadata, source_path

__all__ = ["HDF5Recording", "electrical_series", "contents", "pipeline_steps", "is_hdf5",
           "h5py_module", "GzipReader", "OUTPUT_CHANNELS",
           "output_channels"]

FS_ATTRS = ("fs", "sampling_rate", "sampling_frequency", "rate", "sample_rate")
#: HDF5 filter ids
_DEFLATE, _SHUFFLE = 1, 2
#: the raw-data chunk cache per open dataset (h5py's default, 1 MiB, holds less than one chunk
#: of a typical 384-channel layout)
CHUNK_CACHE_BYTES = 64 << 20


def h5py_module() -> Any:
    """The h5py module, imported on first use (when a file is opened, not with dspk).

    Examples
    --------
    >>> from dspk.io.hdf5 import h5py_module
    >>> h5py_module().__name__
    'h5py'
    """
    import h5py  # noqa: PLC0415 (h5py deferred: imported when a file is opened)

    return h5py


def is_hdf5(path: Any) -> bool:
    """Whether ``path`` is an existing file in HDF5 format (NWB files are); False for a
    folder or a missing path.

    Parameters
    ----------
    path : str or path-like

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py
    >>> from dspk.io.hdf5 import is_hdf5
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rec.h5")
    >>> h5py.File(path, "w").close()
    >>> is_hdf5(path), is_hdf5(tmp.name), is_hdf5(os.path.join(tmp.name, "none.h5"))
    (True, False, False)
    >>> tmp.cleanup()
    """
    return os.path.isfile(path) and bool(h5py_module().is_hdf5(path))


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _open_file(path: str) -> Any:
    h5py = h5py_module()
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if not h5py.is_hdf5(path):
        raise RecordingError(f"{path}: not an HDF5 file (a flat binary needs "
                             f"{arg('n_channels')} and {arg('fs')})")
    try:
        return h5py.File(path, "r", rdcc_nbytes=CHUNK_CACHE_BYTES)
    except OSError as exc:
        raise RecordingError(f"{path}: cannot be read as HDF5 ({exc}); truncated or "
                             f"damaged?") from exc


def _resolve(f: Any, name: str, allow_external_links: bool) -> Any:
    """The object at ``name``, refusing external links (anywhere along the path) unless
    allowed: a link may point outside the file the user named."""
    h5py = h5py_module()
    parts = [p for p in name.strip("/").split("/") if p]
    node = f["/"]
    for i, part in enumerate(parts):
        link = node.get(part, getlink=True)
        here = "/" + "/".join(parts[:i + 1])
        if link is None:
            raise RecordingError(f"{f.filename}: no object {here}; datasets found: "
                                 f"{', '.join(_datasets(f)) or 'none'}")
        if isinstance(link, h5py.ExternalLink) and not allow_external_links:
            raise RecordingError(f"{f.filename}: {here} is an external link to "
                                 f"{link.filename}:{link.path}; refused (pass "
                                 f"{arg('allow_external_links', True)} to follow it)")
        try:
            node = node[part]
        except (KeyError, OSError) as exc:
            raise RecordingError(f"{f.filename}: {here} cannot be opened ({exc})") from exc
    return node


def _datasets(f: Any) -> list[str]:
    """2-D numeric datasets of the file (for error messages and discovery)."""
    h5py = h5py_module()
    found: list[str] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and obj.ndim == 2 and obj.dtype.kind in "iuf":
            found.append("/" + name)

    f.visititems(visit)   # visititems does not follow external links
    return found


def contents(f: Any) -> list[tuple]:
    """Every dataset of an open file, whatever its rank or type: (path, shape, dtype), sorted
    by path (external links are not followed).

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np
    >>> from dspk.io.hdf5 import contents
    >>> tmp = tempfile.TemporaryDirectory()
    >>> with h5py.File(os.path.join(tmp.name, "out.h5"), "w") as f:
    ...     _ = f.create_dataset("traces", data=np.zeros((100, 4), np.float32))
    ...     _ = f.create_dataset("spikes", data=np.zeros(3, [("sample_index", "<i8")]))
    ...     [(name, shape, dtype.names) for name, shape, dtype in contents(f)]
    [('/spikes', (3,), ('sample_index',)), ('/traces', (100, 4), None)]
    >>> tmp.cleanup()
    """
    h5py = h5py_module()
    found: list[tuple] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            found.append(("/" + name, obj.shape, obj.dtype))

    f.visititems(visit)
    return sorted(found, key=lambda item: item[0])


def pipeline_steps(f: Any) -> list[str] | None:
    """The steps that wrote a dspk output, in order (its ``pipeline`` attribute: "HighPass",
    "Reference", "Whiten", "Detect", ...), or None for a file that dspk did not write.

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py
    >>> from dspk.io.hdf5 import pipeline_steps
    >>> tmp = tempfile.TemporaryDirectory()
    >>> with h5py.File(os.path.join(tmp.name, "out.h5"), "w") as f:
    ...     f.attrs["pipeline"] = '[{"step": "HighPass"}, {"step": "Whiten"}]'
    ...     pipeline_steps(f)
    ['HighPass', 'Whiten']
    >>> tmp.cleanup()
    """
    raw = f.attrs.get("pipeline")
    if raw is None:
        return None
    try:
        return [str(step["step"]) for step in json.loads(_text(raw))]
    except (ValueError, TypeError, KeyError):
        return None


def electrical_series(f: Any) -> list[str]:
    """Paths of the NWB ElectricalSeries groups under /acquisition and /processing.

    Parameters
    ----------
    f : h5py.File
        An open file (or group holding /acquisition or /processing). External links there
        are not followed.

    Returns
    -------
    list of str
        Absolute paths of the groups whose ``neurodata_type`` is ``ElectricalSeries``, sorted.

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np
    >>> from dspk.io import electrical_series, open_recording
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rec.nwb")
    >>> with h5py.File(path, "w") as f:                  # the parts of NWB that dspk reads
    ...     es = f.create_group("acquisition/raw")
    ...     es.attrs["neurodata_type"] = "ElectricalSeries"
    ...     data = es.create_dataset("data", data=np.zeros((3000, 4), dtype=np.int16))
    ...     data.attrs["conversion"] = 1e-6                   # volts per unit: 1 µV
    ...     es.create_dataset("starting_time", data=0.0).attrs["rate"] = 30000.0
    >>> with h5py.File(path, "r") as f:
    ...     electrical_series(f)
    ['/acquisition/raw']
    >>> with open_recording(path) as rec:                 # the only series: found by itself
    ...     rec.fs, rec.n_channels, float(rec.gain_to_uv[0])
    (30000.0, 4, 1.0)
    >>> tmp.cleanup()
    """
    h5py = h5py_module()
    found: list[str] = []
    for top in ("acquisition", "processing"):
        if top not in f or not isinstance(f.get(top, getlink=True), h5py.HardLink):
            continue

        def visit(name: str, obj: Any, top: str = top) -> None:
            if isinstance(obj, h5py.Group) and \
                    _text(obj.attrs.get("neurodata_type", "")) == "ElectricalSeries":
                found.append(f"/{top}/{name}")

        f[top].visititems(visit)
    return sorted(found)


class HDF5Recording(Recording):
    """A 2-D HDF5 dataset, or an NWB ElectricalSeries, as a recording.

    Metadata not given as arguments is taken from attributes: for a plain dataset, the
    sampling rate from ``fs``/``sampling_rate``/``sampling_frequency``/``rate``/
    ``sample_rate`` (on the dataset or its group; the dataset's win), ``gain_to_uv``,
    ``offset_to_uv``, ``geometry`` and ``layout``, and the Neuropixels metadata
    ``sample_shifts`` (each channel's ADC shift in samples, for `dspk.ops.phase_shift`) and
    ``shank_ids`` where present; for NWB, the series' rate or timestamps,
    conversion × channel_conversion and offset, and the electrodes' rel_x/rel_y. The
    channels' ids, shanks, contact ids and ADC sample shifts (`Recording.channel_ids`,
    ``shank_ids``, ``contact_ids``, ``sample_shifts``): for NWB, the electrodes'
    ``channel_name``, the groups' names when they are shanks' (``shank0``, ``...Shank1``),
    ``contact_id`` and ``inter_sample_shift`` columns (what dspk writes and SpikeInterface
    reads); for a dspk output's ``/traces``, the datasets beside it (`output_channels`).
    The file is opened read-only and kept open while the recording is in use (``close()``,
    or a ``with`` block).

    Parameters
    ----------
    path : str or path-like
        An HDF5 file.
    dataset : str, optional
        A 2-D dataset or an ElectricalSeries group in the file. Default: the file's only
        ElectricalSeries, else its only 2-D dataset, else the only 2-D dataset with a
        sampling-rate attribute.
    fs : float, optional
        Overrides the file's sampling rate.
    layout : {"samples_channels", "channels_samples"}, optional
        Overrides the ``layout`` attribute; otherwise told from the shape (NWB: samples
        first).
    gain_to_uv, offset_to_uv, geometry : optional
        Override the file's (as for `open_recording`).
    allow_external_links : bool
        Follow HDF5 external links (refused by default).
    threads : int, optional
        Threads that inflate gzip chunks (default: the cores, at most 32).

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np
    >>> from dspk.io import HDF5Recording
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rec.h5")
    >>> with h5py.File(path, "w") as f:
    ...     d = f.create_dataset("traces", data=np.ones((3000, 4), dtype=np.int16),
    ...                          chunks=(1000, 4), compression="gzip")
    ...     d.attrs["fs"] = 30000.0
    ...     d.attrs["geometry"] = np.c_[np.zeros(4), 20.0 * np.arange(4)]
    >>> with HDF5Recording(path) as rec:
    ...     rec.compressed, rec.layout, rec.geometry.shape, rec.read(999, 1001)
    (True, 'samples_channels', (4, 2), array([[1., 1.],
           [1., 1.],
           [1., 1.],
           [1., 1.]], dtype=float32))
    >>> tmp.cleanup()
    """

    def __init__(self, path: str, dataset: str | None = None, fs: float | None = None,
                 layout: str | None = None, gain_to_uv: Any = None, offset_to_uv: Any = None,
                 geometry: Any = None, allow_external_links: bool = False,
                 threads: int | None = None) -> None:
        h5py = h5py_module()
        path = os.fspath(path)
        f = _open_file(path)
        try:
            if dataset is None:
                series = electrical_series(f)
                if len(series) > 1:
                    raise RecordingError(f"{path}: {len(series)} ElectricalSeries; choose one "
                                         f"with {arg('dataset')}: {', '.join(series)}")
                if series:
                    dataset = series[0]
                else:
                    found = _datasets(f)
                    # several 2-D datasets (a dspk output holds traces, geometry, fitted
                    # matrices): the one that carries its own sampling rate is the recording
                    rated = [d for d in found if any(k in f[d].attrs for k in FS_ATTRS)]
                    if len(found) == 1 or len(rated) == 1:
                        dataset = found[0] if len(found) == 1 else rated[0]
                    else:
                        raise RecordingError(f"{path}: no ElectricalSeries and "
                                             f"{len(found)} 2-D datasets; choose one with "
                                             f"{arg('dataset')}: {', '.join(found) or 'none'}")
            node = _resolve(f, dataset, allow_external_links)
            meta: dict = {}
            if isinstance(node, h5py.Group):
                if _text(node.attrs.get("neurodata_type", "")) != "ElectricalSeries":
                    raise RecordingError(f"{path}: {dataset} is a group, not a dataset or an "
                                         f"NWB ElectricalSeries")
                dset = _resolve(f, node.name + "/data", allow_external_links)
                meta = _nwb_meta(f, node, dset)
                layout = layout or "samples_channels"
            else:
                dset = node
            if not isinstance(dset, h5py.Dataset) or dset.ndim != 2:
                raise RecordingError(f"{path}: {dataset} has shape "
                                     f"{getattr(dset, 'shape', None)}; expected 2-D "
                                     f"[samples, channels] or [channels, samples]")
            if dset.dtype.kind not in "iuf":
                raise RecordingError(f"{path}: {dataset} holds {dset.dtype}, not samples")
            attrs = _plain_meta(dset)
            layout = resolve_layout(layout or attrs.pop("layout", None), dset.shape,
                                    f"{path}:{dataset}")
            self._samples_first = layout == "samples_channels"
            n, c = dset.shape if self._samples_first else dset.shape[::-1]
            pick = lambda arg, key: arg if arg is not None else \
                meta.get(key, attrs.get(key))  # noqa: E731
            source = f"{path}:{dset.name}"
            super().__init__(fs=pick(fs, "fs"), n_channels=c, n_samples=n, dtype=dset.dtype,
                             gain_to_uv=pick(gain_to_uv, "gain_to_uv"),
                             offset_to_uv=pick(offset_to_uv, "offset_to_uv"),
                             geometry=geometry if geometry is not None else
                             stored_geometry(pick(None, "geometry"), source), source=source)
            # the channels' ids, shanks, contact ids and ADC shifts: an NWB series' electrodes
            # columns, or the datasets beside a dspk output's /traces
            channels = _nwb_channels(f, node, c) if node is not dset else \
                output_channels(f, c, source) if dset.name == "/traces" and \
                pipeline_steps(f) is not None else {}
        except BaseException:
            f.close()
            raise
        self.path, self.dataset, self.layout = path, dset.name, layout
        self._allow_external_links = allow_external_links
        self._file, self._dset = f, _with_chunk_cache(f, dset)
        # where the samples are: another file for a dataset behind an external link, and any
        # external raw-data files of the dataset (relative to its file)
        self._dset_file = dset.file.filename
        self._external = list(dset.external or [])
        self._threads = threads or min(32, os.cpu_count() or 1)
        self._gzip = _gzip_plan(dset)
        self._gzip_io: GzipReader | None = None
        # unfiltered samples read straight from the file, outside the GIL (`RawDatasetReader`)
        self._raw = RawDatasetReader.open(self._dset, self._dset_file) \
            if self._samples_first and self._gzip is None and not self._external else None
        self.compressed = dset.compression is not None
        self.samples_first = self._samples_first
        # per-channel Neuropixels metadata a file may carry beside the traces (a SpikeGLX
        # recording converted to HDF5 keeps its ADC shifts and shanks this way); the
        # dataset's own attributes win over the file's columns or datasets
        self.sample_shifts = _per_channel(attrs.get("sample_shifts",
                                                    channels.get("sample_shifts")), c,
                                          "sample_shifts", source, np.float64)
        self.shank_ids = _per_channel(attrs.get("shank_ids", channels.get("shank_ids")), c,
                                      "shank_ids", source, np.int64)
        self.channel_ids = channels.get("channel_ids")
        self.contact_ids = channels.get("contact_ids")

    @property
    def decompress_s(self) -> float:
        """Seconds spent reading and inflating gzip chunks so far, summed over threads."""
        return self._gzip_io.seconds if self._gzip_io is not None else 0.0

    def _gzip_reader(self) -> "GzipReader":
        if self._gzip_io is None:
            self._gzip_io = GzipReader(self._dset, self._gzip, self._threads,
                                       samples_axis=0 if self._samples_first else 1)
        return self._gzip_io

    def close(self) -> None:
        """Close the file (and stop the gzip reader's threads)."""
        if self._gzip_io is not None:
            self._gzip_io.close()
            self._gzip_io = None
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        self._file.close()
        super().close()

    def spec(self) -> RecordingSpec:
        """An `HDF5Recording` of the same dataset with the metadata resolved here (see
        `Recording.spec`).

        Examples
        --------
        >>> import os, tempfile
        >>> import h5py, numpy as np
        >>> from dspk.io import HDF5Recording
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = os.path.join(tmp.name, "rec.h5")
        >>> with h5py.File(path, "w") as f:
        ...     f.create_dataset("traces", data=np.ones((3000, 4), np.int16)).attrs["fs"] = 3e4
        >>> with HDF5Recording(path, gain_to_uv=0.5) as rec, rec.reopen() as again:
        ...     again.dataset, again.fs, float(again.read(0, 1)[0, 0])
        ('/traces', 30000.0, 0.5)
        >>> tmp.cleanup()
        """
        return RecordingSpec(HDF5Recording, dict(
            path=self.path, dataset=self.dataset, layout=self.layout,
            allow_external_links=self._allow_external_links, threads=self._threads,
            **resolved_metadata(self)))

    def files(self) -> tuple[Path, ...]:
        """The HDF5 file; also, when the dataset was reached through an external link
        (``allow_external_links``) or keeps its samples in external raw files, those files
        (see `Recording.files`).

        Examples
        --------
        >>> import os, tempfile
        >>> import h5py, numpy as np
        >>> from dspk.io import HDF5Recording
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = os.path.join(tmp.name, "rec.h5")
        >>> with h5py.File(path, "w") as f:
        ...     f.create_dataset("traces", data=np.ones((3000, 4), np.int16)).attrs["fs"] = 3e4
        >>> with HDF5Recording(path) as rec:
        ...     [p.name for p in rec.files()]
        ['rec.h5']
        >>> tmp.cleanup()
        """
        found = [self.path, self._dset_file]
        folder = os.path.dirname(os.path.abspath(self._dset_file))
        for name, _, _ in self._external:
            # a relative name is looked up from the working directory unless HDF5 is told
            # otherwise: both places counted
            name = os.fsdecode(name)
            found += [os.path.join(folder, name), os.path.abspath(name)]
        return tuple(dict.fromkeys(Path(f).resolve() for f in found))

    @classmethod
    def recognizes(cls, source: Any, options: OpenOptions) -> bool:
        """An HDF5 file (NWB files are; see `Recording.recognizes`)."""
        path = source_path(source)
        return path is not None and is_hdf5(path)

    @classmethod
    def from_source(cls, source: Any, options: OpenOptions) -> "HDF5Recording":
        """The dataset (``dataset``, or the one found), with ``fs``, ``layout``,
        ``allow_external_links`` and the metadata overrides; ``n_channels``, ``dtype`` and
        ``header_bytes`` refused unless they agree with the dataset (see
        `Recording.from_source`)."""
        rec = cls(os.fspath(source), options.dataset, options.fs, options.layout,
                  allow_external_links=options.allow_external_links, **options.meta())
        return options.check(rec, "an HDF5 dataset", layout=False)

    def _read(self, start: int, stop: int, idx: np.ndarray) -> np.ndarray:
        return channels_first(self._read_native(start, stop, None), idx, self.n_channels,
                       self._samples_first)

    def _read_native(self, start: int, stop: int, out: np.ndarray | None) -> np.ndarray:
        sel = (slice(start, stop), slice(None)) if self._samples_first else \
            (slice(None), slice(start, stop))
        if self._gzip is not None and stop > start:
            return self._gzip_reader().read(sel, out)   # names a damaged chunk itself
        if self._raw is not None and stop > start and (out is None or out.flags.c_contiguous):
            got = self._raw.read(start, stop, out)
            if got is not None:
                return got
        try:
            if out is None:
                return self._dset[sel]
            if stop > start:
                self._dset.read_direct(out, source_sel=sel)
            return out
        except OSError as exc:    # h5py: a chunk its filters cannot decode, a short file, ...
            where = _failing_chunk(self._dset, start, stop, self._samples_first) or \
                f"samples {start}..{stop - 1}"
            raise RecordingError(f"{self.path}:{self.dataset}: {where} cannot be read "
                                 f"({exc}): the file is damaged or truncated") from exc


def _with_chunk_cache(f: Any, dset: Any) -> Any:
    """The dataset reopened with a raw-data chunk cache sized for its chunks: enough for two
    rows of chunks across all channels (a read of consecutive samples touches one row; h5py's
    default 1 MiB cache can hold less than one chunk, so a chunk would be decompressed once
    per read that touches it)."""
    h5py = h5py_module()
    if dset.chunks is None:
        return dset
    per_chunk = int(np.prod(dset.chunks)) * dset.dtype.itemsize
    across = -(-dset.shape[1] // dset.chunks[1])           # chunks spanning the second axis
    nbytes = max(CHUNK_CACHE_BYTES, 2 * across * per_chunk)
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_chunk_cache(max(521, 8 * across + 1), nbytes, 0.75)
    return h5py.Dataset(h5py.h5d.open(dset.file.id, dset.name.encode(), dapl))


def _failing_chunk(dset: Any, start: int, stop: int, samples_first: bool) -> str | None:
    """"the chunk of samples a..b" of the first chunk in [start, stop) that h5py cannot read
    (a read that failed, retried chunk by chunk to name the damaged one), else None."""
    if dset.chunks is None:
        return None
    axis = 0 if samples_first else 1
    step, n = dset.chunks[axis], dset.shape[axis]
    for a in range(start // step * step, stop, step):
        b = min(n, a + step)
        try:
            dset[a:b] if samples_first else dset[:, a:b]
        except OSError:
            return f"the chunk of samples {a}..{b - 1}"
    return None


# -- metadata ---------------------------------------------------------------------------------
def _per_channel(value: Any, n_channels: int, key: str, source: str,
                dtype: Any) -> np.ndarray | None:
    """A per-channel attribute (``sample_shifts`` in samples, ``shank_ids``) checked: one
    finite value per channel, integers where ``dtype`` is one; None where absent."""
    if value is None:
        return None
    v = np.asarray(value)
    if v.shape != (n_channels,) or v.dtype.kind not in "iuf" or \
            not np.all(np.isfinite(v.astype(np.float64))):
        raise RecordingError(f"{source}: attribute {key!r} must hold one finite number per "
                             f"channel ({n_channels}), got {v.dtype} of shape {v.shape}")
    if np.dtype(dtype).kind in "iu" and np.any(v != np.round(v)):
        raise RecordingError(f"{source}: attribute {key!r} must hold whole numbers")
    return v.astype(dtype)


def _plain_meta(dset: Any) -> dict:
    meta: dict = {}
    for holder in (dset.parent, dset):            # the dataset's own attributes win
        a = holder.attrs
        for key in FS_ATTRS:
            if key in a:
                meta["fs"] = float(np.asarray(a[key]).ravel()[0])
        for key in ("gain_to_uv", "offset_to_uv", "geometry", "sample_shifts", "shank_ids"):
            if key in a:
                meta[key] = np.asarray(a[key])
        if "layout" in a:
            meta["layout"] = _text(a["layout"])
            if meta["layout"] not in LAYOUTS:
                raise RecordingError(f"{dset.name}: layout attribute {meta['layout']!r} is "
                                     f"not one of {LAYOUTS}")
    return meta


def _nwb_meta(f: Any, series: Any, dset: Any) -> dict:
    """fs, µV scaling and geometry of an NWB ElectricalSeries (NWB 2.x schema)."""
    meta: dict = {}
    if "starting_time" in series and "rate" in series["starting_time"].attrs:
        meta["fs"] = float(series["starting_time"].attrs["rate"])
    elif "timestamps" in series:
        ts = np.asarray(series["timestamps"][:100_000], dtype=np.float64)
        steps = np.diff(ts)
        if ts.size < 2 or not np.all(steps > 0):
            raise RecordingError(f"{series.name}: timestamps are not increasing; cannot "
                                 f"derive a sampling rate (pass {arg('fs')})")
        meta["fs"] = 1.0 / float(np.median(steps))
    conversion = float(dset.attrs.get("conversion", 1.0))
    offset = float(dset.attrs.get("offset", 0.0))
    gain = np.full(dset.shape[1], conversion * 1e6)
    if "channel_conversion" in series:
        gain = gain * np.asarray(series["channel_conversion"][:], dtype=np.float64)
    meta["gain_to_uv"] = gain
    meta["offset_to_uv"] = np.full(dset.shape[1], offset * 1e6)
    geometry = _nwb_geometry(f, series)
    if geometry is not None and len(geometry) == dset.shape[1]:
        meta["geometry"] = geometry
    return meta


def _electrodes(f: Any, series: Any) -> tuple[Any, np.ndarray] | None:
    """The electrodes table of an NWB series and the series' rows of it (its
    ``electrodes`` region), or None where the series has none."""
    if "electrodes" not in series:
        return None
    region = series["electrodes"]
    ref = region.attrs.get("table")
    try:
        table = f[ref] if ref is not None else f["/general/extracellular_ephys/electrodes"]
    except (KeyError, ValueError, TypeError):
        return None
    return table, np.asarray(region[:], dtype=np.int64)


def _column(table: Any, rows: np.ndarray, name: str, where: str) -> np.ndarray | None:
    """One value per row of an electrodes table's column, for ``rows`` (text as str); None
    where the table has no such column of one value per electrode (a ragged one has an
    ``_index``)."""
    col = table.get(name)
    if col is None or not hasattr(col, "dtype") or col.ndim != 1 or f"{name}_index" in table:
        return None
    if rows.size and (rows.min() < 0 or rows.max() >= len(col)):
        raise RecordingError(f"{where}: electrodes refer to rows outside the electrodes "
                             f"table")
    if col.dtype.kind in "SO":
        return np.array([str(v) for v in col.asstr()[()]])[rows]
    return np.asarray(col[()])[rows]


def _nwb_geometry(f: Any, series: Any) -> np.ndarray | None:
    """rel_x, rel_y of the series' electrodes (a region of the electrodes table)."""
    found = _electrodes(f, series)
    if found is None:
        return None
    table, rows = found
    x, y = (_column(table, rows, key, series.name) for key in ("rel_x", "rel_y"))
    if x is None or y is None:
        return None
    return np.stack([x, y], axis=1).astype(np.float64)


#: the shank an electrode group's name gives: dspk's "shank1", neuroconv's
#: "NeuropixelsImec0Shank1"
_SHANK_GROUP = re.compile(r"shank(\d+)$", re.I)


def _nwb_channels(f: Any, series: Any, n_channels: int) -> dict:
    """The channel metadata of an NWB series' electrodes, as dspk writes them
    (`dspk.io.nwb.create_processed_series`) and SpikeInterface reads them: ``channel_ids``
    from the ``channel_name`` column (SpikeInterface's channel ids), ``contact_ids`` from
    ``contact_id``, ``sample_shifts`` from ``inter_sample_shift``, and ``shank_ids`` from the
    electrode groups' names when each is a shank's (``shank<k>``, ``...Shank<k>``); those
    the table has, one per channel."""
    found = _electrodes(f, series)
    if found is None:
        return {}
    table, rows = found
    if len(rows) != n_channels:
        return {}
    out: dict = {}
    for key, column in (("channel_ids", "channel_name"), ("contact_ids", "contact_id"),
                        ("sample_shifts", "inter_sample_shift")):
        values = _column(table, rows, column, series.name)
        if values is not None:
            out[key] = values
    groups = _column(table, rows, "group_name", series.name)
    shanks = None if groups is None else [_SHANK_GROUP.search(g) for g in groups]
    if shanks and all(shanks):
        out["shank_ids"] = np.array([int(m.group(1)) for m in shanks], dtype=np.int64)
    return out


#: the per-channel datasets beside a dspk output's /traces
#: (`dspk.pipeline.record.write_metadata` writes them)
OUTPUT_CHANNELS = ("channel_ids", "shank_ids", "contact_ids", "sample_shifts")


def output_channels(f: Any, n_channels: int, source: str = "") -> dict:
    """The channel metadata of a dspk HDF5 output: those of the datasets `OUTPUT_CHANNELS`
    it holds beside ``/traces`` (``channel_ids``, ``shank_ids``, ``contact_ids``,
    ``sample_shifts``; text as str arrays, numbers as stored), one value per channel.

    Parameters
    ----------
    f : h5py.File
        The open output.
    n_channels : int
        The channels of ``/traces``.
    source : str
        The file, for messages.

    Returns
    -------
    dict

    Raises
    ------
    RecordingError
        A dataset that does not hold one value per channel.

    Examples
    --------
    >>> import os, tempfile
    >>> import h5py, numpy as np
    >>> from dspk.io.hdf5 import output_channels
    >>> tmp = tempfile.TemporaryDirectory()
    >>> with h5py.File(os.path.join(tmp.name, "o.h5"), "w") as f:
    ...     _ = f.create_dataset("contact_ids", data=np.array([b"e0", b"e1"]))
    ...     output_channels(f, 2)
    {'contact_ids': array(['e0', 'e1'], dtype='<U2')}
    >>> tmp.cleanup()
    """
    out: dict = {}
    for key in OUTPUT_CHANNELS:
        ds = f.get(key)
        if ds is None:
            continue
        if ds.shape != (n_channels,):
            raise RecordingError(f"{source or f.filename}: /{key} must hold one value per "
                                 f"channel ({n_channels}), got shape {ds.shape}")
        out[key] = np.array([str(v) for v in ds.asstr()[()]]) if ds.dtype.kind in "SO" \
            else ds[()]
    return out


# -- parallel gzip ----------------------------------------------------------------------------
def _gzip_plan(dset: Any) -> dict | None:
    """The filter pipeline if this module can inflate the chunks itself (deflate, optionally
    after byte shuffle, nothing else), else None (h5py reads)."""
    if dset.chunks is None or dset.compression != "gzip":
        return None
    if dset.fletcher32 or dset.scaleoffset is not None or dset.dtype.byteorder == ">":
        return None
    if not hasattr(dset.id, "get_chunk_info_by_coord"):   # h5py >= 3 on HDF5 >= 1.10.5
        return None
    return {"shuffle": bool(dset.shuffle), "chunks": dset.chunks}


def _inflate(raw: bytes, shuffle: bool, dtype: np.dtype, shape: tuple) -> np.ndarray:
    data = zlib.decompress(raw)
    if shuffle and dtype.itemsize > 1:   # undo HDF5's byte shuffle: byte planes -> elements
        planes = np.frombuffer(data, np.uint8).reshape(dtype.itemsize, -1)
        if dtype.itemsize in (2, 4, 8):
            # whole-plane shifts and ors (vectorized) instead of a transposing copy of 1-byte
            # elements, which NumPy does element by element (~3x slower for int16)
            word = np.dtype(f"<u{dtype.itemsize}")
            acc = planes[0].astype(word)
            for i in range(1, dtype.itemsize):
                acc |= planes[i].astype(word) << word.type(8 * i)
            return acc.view(dtype.newbyteorder("<")).reshape(shape)
        return np.ascontiguousarray(planes.T).view(dtype).reshape(shape)
    return np.frombuffer(data, dtype=dtype).reshape(shape)


class GzipReader:
    """Reads a gzip dataset's chunks for consecutive requests: each chunk's place in the file
    looked up through HDF5, its bytes read with ``os.pread`` and inflated in a persistent
    thread pool — both outside Python's GIL and HDF5's lock, which h5py holds for the length
    of every call (measured: with the raw chunks read through h5py, 16 cores inflated at the
    speed of about two) — and the inflated chunks of the last requests kept (a pipeline's
    reads overlap by their halos, and two reads in flight share the chunk between them)."""

    def __init__(self, dset: Any, plan: dict, threads: int, keep_rows: int = 3,
                 samples_axis: int = 0) -> None:
        self.dset, self.plan, self.samples_axis = dset, plan, samples_axis
        self.pool = ThreadPoolExecutor(max_workers=threads)
        across = -(-dset.shape[1] // plan["chunks"][1])
        self.capacity = max(1, keep_rows * across)
        self._lock = threading.Lock()
        self._chunks: OrderedDict = OrderedDict()     # chunk offset -> Future or None
        self._fd: int | None = None
        try:
            self._fd = os.open(dset.file.filename, os.O_RDONLY)
        except (OSError, TypeError, ValueError):
            self._fd = None
        self._checked = False
        #: time spent reading and inflating chunks, summed over the pool's threads
        self.seconds = 0.0

    def _pread(self, offset: int, size: int) -> bytes:
        parts, done = [], 0
        while done < size:
            got = os.pread(self._fd, size - done, offset + done)   # file offsets
            if not got:
                raise OSError(f"{self.dset.file.filename}: a chunk ends past the end of the "
                              f"file (truncated?)")
            parts.append(got)
            done += len(got)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _fetch(self, coord: tuple, offset: int, size: int) -> np.ndarray:
        t = time.perf_counter()
        raw = self._pread(offset, size) if self._fd is not None else \
            self.dset.id.read_direct_chunk(coord)[1]
        try:
            chunk = _inflate(raw, self.plan["shuffle"], self.dset.dtype, self.plan["chunks"])
        except (zlib.error, ValueError) as exc:    # bad deflate data, or the wrong length
            raise RecordingError(f"{self.dset.file.filename}:{self.dset.name}: "
                                 f"{self._chunk_name(coord)} cannot be decompressed ({exc}): "
                                 f"the file is damaged") from exc
        with self._lock:
            self.seconds += time.perf_counter() - t
        return chunk

    def _chunk_name(self, coord: tuple) -> str:
        """"the gzip chunk of samples a..b (channels c..d)" of the chunk at ``coord``."""
        spans = [(c0, min(c0 + step, n) - 1)
                 for c0, step, n in zip(coord, self.plan["chunks"], self.dset.shape)]
        (s0, s1), (c0, c1) = spans[self.samples_axis], spans[1 - self.samples_axis]
        return f"the gzip chunk of samples {s0}..{s1} (channels {c0}..{c1})"

    def _chunk(self, coord: tuple) -> Any:
        """A future of the inflated chunk at ``coord``, or None when h5py must read it (not
        stored, or its filters were skipped)."""
        with self._lock:
            if coord in self._chunks:
                self._chunks.move_to_end(coord)
                return self._chunks[coord]
        info = self.dset.id.get_chunk_info_by_coord(coord)
        fut = None
        if info.byte_offset is not None and info.size > 0 and info.filter_mask == 0:
            if not self._checked and self._fd is not None:
                # the file offsets HDF5 reports, read directly, must give its own bytes
                if self._pread(info.byte_offset, info.size) != \
                        self.dset.id.read_direct_chunk(coord)[1]:
                    os.close(self._fd)
                    self._fd = None
                self._checked = True
            fut = self.pool.submit(self._fetch, coord, info.byte_offset, info.size)
        with self._lock:
            self._chunks[coord] = fut
            while len(self._chunks) > self.capacity:
                self._chunks.popitem(last=False)
        return fut

    def read(self, sel: tuple, out: np.ndarray | None = None) -> np.ndarray:
        """dset[sel] (two slices), into ``out`` when given."""
        dset, chunks = self.dset, self.plan["chunks"]
        bounds = [(s.start or 0, dset.shape[d] if s.stop is None else s.stop)
                  for d, s in enumerate(sel)]
        if out is None:
            out = np.empty([b - a for a, b in bounds], dtype=dset.dtype)
        firsts = [range(a // c * c, b, c) for (a, b), c in zip(bounds, chunks)]
        tasks = [((r0, c0), self._chunk((r0, c0))) for r0 in firsts[0] for c0 in firsts[1]]
        for (r0, c0), fut in tasks:
            # the part of chunk (r0, c0) inside the request, in chunk and in output coordinates
            lo = [max(r0, bounds[0][0]), max(c0, bounds[1][0])]
            hi = [min(r0 + chunks[0], bounds[0][1]), min(c0 + chunks[1], bounds[1][1])]
            dst = (slice(lo[0] - bounds[0][0], hi[0] - bounds[0][0]),
                   slice(lo[1] - bounds[1][0], hi[1] - bounds[1][0]))
            if fut is None:
                out[dst] = dset[lo[0]:hi[0], lo[1]:hi[1]]
            else:
                out[dst] = fut.result()[lo[0] - r0:hi[0] - r0, lo[1] - c0:hi[1] - c0]
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self._chunks.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_gzip(dset: Any, sel: tuple, plan: dict, threads: int,
               out: np.ndarray | None = None) -> np.ndarray:
    """dset[sel] (two slices) with the chunks inflated in a thread pool; a chunk whose filters
    were skipped, or that is not stored (fill value), is read through h5py. Into ``out``
    when given."""
    reader = GzipReader(dset, plan, threads)
    try:
        return reader.read(sel, out)
    finally:
        reader.close()
