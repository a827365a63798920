"""dspk: preprocessing of extracellular recordings for spike sorting, on the GPU or the CPU.

commands:
  dspk info                       backend, devices and the tuner cache
  dspk info IN                    what a recording or output file holds (series, datasets,
                                  shape, rate, units, geometry, sync bits and their edges)
  dspk events IN OUT.csv          the sync bits' / TTL lines' edges (bit, edge, sample, s)
  dspk preprocess IN OUT          filter, reference, whiten (and detect) into an HDF5 file;
                                  --format kilosort: a folder Kilosort4 and Phy read as it
                                  is; --format nwb: an NWB file
  dspk preprocess-many GLOB DIR   the same for many recordings on a Dask cluster
  dspk detect IN OUTDIR           detection alone: peaks in SpikeInterface's form
                                  (OUTDIR/peaks.npy, peak_locations.npy, detect.json)
  dspk tune IN                    pre-tune the products and kernels a recording will need
  dspk tune --compile             load or compile every GPU kernel for this machine's GPU,
                                  and warm up CuPy's own kernels (every GPU call once)
  dspk tune-cache show|clear      the tuned choices stored on disk

IN is an HDF5/NWB file, a SpikeGLX .bin (with its .meta), an Open Ephys recording, or a flat
binary: [samples, channels] with --n-channels and --fs (--dtype, --gain-to-uv, --header-bytes
as it needs). Local whitening and --detect need the channel positions: from the file, or
--probe FILE (probeinterface JSON, .prb, CSV of x,y in µm). For example:

  dspk preprocess raw.bin out.h5 --n-channels 384 --fs 30000 --gain-to-uv 2.34375 \\
      --probe probe.json --detect
  dspk preprocess run_g0_t0.imec0.ap.bin ks_in --preset kilosort --format kilosort

`dspk COMMAND --help` lists each command's options and their defaults.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import textwrap
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator

import numpy as np

from ._version import __version__
from .argnames import command_line_spelling
from .backend import cupy_module, device_name, gpu_unavailable_reason, resolve_backend
from .io import RecordingError, open_recording, read_probe
from .io.hdf5 import contents, electrical_series, h5py_module, is_hdf5
from .io.subset import SubsetRecording, parse_channels
from .kernels import kernel_origin_mode, loaded_from, precompile
from .warmup import warm_gpu_calls
from .kernels.build import declare_all
from .linalg.tuner import cache_path, clear_cache, read_cache, tune_mode
from .linalg.winners import gpu_class, host_class, load_table, table_folder
from .motion import Motion as MotionEstimate
from .pipeline import Detect, JobInterrupted, Pipeline, registry
from .pipeline.outputs import DETECT_FILES, PeaksOutput, formats, output_class
from .pipeline.record import describe, is_output
from .pipeline.steps import BAD_CHANNEL_LABELS

#: the raw sample types a flat binary may hold
RAW_DTYPES = ("int16", "uint16", "int32", "float32", "float64", "int8", "uint8")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter,
                     argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions as written (the module docstring's layout); every option's default
    shown, except where there is none (None, or an off switch: the help says what that
    means)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action)


def _files_read(args: argparse.Namespace) -> dict:
    """{option: path} of every option given to the command that names a file it reads
    (its metavar says FILE: --probe, ...): OUT is never one of them, with --overwrite or
    without."""
    return {flag: getattr(args, dest) for flag, dest in getattr(args, "file_options", ())
            if getattr(args, dest, None) is not None}


#: the suffixes of --gpu-memory (powers of 1000; with "i", of 1024)
_BYTE_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                  "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def _byte_count(text: str) -> int:
    """A positive number of bytes: ``800000000``, ``800M``, ``0.8G``, ``4GiB``."""
    t = text.strip().upper().removesuffix("B")
    num = t.rstrip("KMGTI")
    try:
        value = float(num) * _BYTE_SUFFIXES[t[len(num):]]
    except (KeyError, ValueError):
        value = float("nan")
    if not (value >= 1 and value < 2**63):
        raise argparse.ArgumentTypeError(f"expected a positive number of bytes (e.g. "
                                         f"800000000, 800M, 4G, 4GiB), got {text!r}")
    return int(value)


def _open_options(args: argparse.Namespace) -> dict:
    """The input options (``_input_options``) as `dspk.open_recording` keywords, those given
    only (the others keep open_recording's defaults); ``--probe`` read into ``geometry``."""
    options = {key: getattr(args, key) for key in ("dataset", "fs", "n_channels", "dtype",
                                                   "gain_to_uv")
               if getattr(args, key) is not None}
    if args.header_bytes:
        options["header_bytes"] = args.header_bytes
    if getattr(args, "allow_negative_gain", False):
        options["allow_negative_gain"] = True
    if args.probe is not None:      # one probe for every recording
        options["geometry"] = read_probe(args.probe, n_channels=args.n_channels)
    return options


def _open(args: argparse.Namespace, dataset: str | None = None) -> Any:
    """The input recording, with the geometry of ``--probe`` and the flat-binary options;
    with ``--time``/``--channels`` (where the command has them) that part of it, which closes
    the recording when it is closed."""
    options = _open_options(args)
    if dataset is not None:
        options["dataset"] = dataset
    rec = open_recording(args.input, **options)
    span, channels = getattr(args, "time", None), getattr(args, "channels", None)
    if span is None and channels is None:
        return rec
    try:
        start, stop = (0, None) if span is None else \
            (int(round(span[0] * rec.fs)), int(round(span[1] * rec.fs)))
        if span is not None and not 0 <= span[0] < span[1]:
            raise RecordingError(f"--time: expected 0 <= START < END seconds, got {span[0]:g} "
                                 f"{span[1]:g}")
        return SubsetRecording(rec, start, stop, None if channels is None
                               else parse_channels(channels), own=True)
    except BaseException:
        rec.close()
        raise


def _subset_args(p: argparse.ArgumentParser) -> None:
    """``--time`` and ``--channels``: a part of the recording."""
    p.add_argument("--time", type=float, nargs=2, default=None, metavar=("START", "END"),
                   help="only this time range of the recording, in seconds from its start")
    p.add_argument("--channels", default=None, metavar="IDS",
                   help="only these channels, by 0-based index in the recording's order: "
                        "indices and inclusive ranges, e.g. 0-95,100")


def _info(args: argparse.Namespace) -> int:
    if args.input is not None:
        return _info_file(args)
    print(f"dspk {__version__}")
    print(f"backend: {resolve_backend(args.backend)}")
    reason = gpu_unavailable_reason()
    if reason is None:
        cp = cupy_module()
        for i in range(cp.cuda.runtime.getDeviceCount()):
            print(f"gpu {i}: {device_name(i)}")
        print(f"cupy {cp.__version__}, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}")
    else:
        print(f"gpu: none ({reason})")
    print(f"tuner: DSPK_TUNE={tune_mode()}, cache {cache_path()}")
    for line in _winners_lines([] if reason is not None else
                               range(cupy_module().cuda.runtime.getDeviceCount())):
        print(line)
    return 0


def _winners_lines(gpus: Any) -> list[str]:
    """The winners table of the host's class and of each GPU's (`dspk.linalg.winners`)."""
    folder = table_folder()
    if folder is None:
        return ["winners tables: off (DSPK_WINNERS)"]
    lines = []
    for what, cls in [("host", host_class())] + [(f"gpu {i}", gpu_class(device_name(i)))
                                                 for i in gpus]:
        table = load_table(cls, folder)
        found = f"{len(table.entries)} keys" if table is not None else f"no table in {folder}"
        lines.append(f"winners table ({what}): {cls or 'no class'}: {found}")
    return lines


def _dataset_line(name: str, shape: tuple, dtype: Any) -> str:
    if dtype.names is not None and len(shape) == 1:     # a table: /spikes
        return f"{name}: {shape[0]} rows ({', '.join(dtype.names)})"
    dims = " x ".join(str(v) for v in shape) or "scalar"
    return f"{name} [{dims}] {dtype}"


def _bad_channels(fitted: dict) -> str | None:
    """The channels a `BadChannels` step replaced, by label (``"dead [3, 40], given [5]"``),
    from an output's fitted state (`describe`'s ``fitted``); None where no such step ran."""
    for name in sorted(fitted):
        if name.endswith("_BadChannels") and "labels" in fitted[name]:
            labels = np.asarray(fitted[name]["labels"])
            found = [f"{label} {np.flatnonzero(labels == code).tolist()}"
                     for code, label in enumerate(BAD_CHANNEL_LABELS) if code and
                     (labels == code).any()]
            return ", ".join(found) or "none"
    return None


def _drift(fitted: dict) -> str | None:
    """The drift a `Motion` step corrected (``"rigid, 60 time bins of 2 s, displacement
    -20.1..18.9 µm (range 39 µm)"``), from an output's fitted state (`describe`'s
    ``fitted``); None where no such step ran."""
    for name in sorted(fitted):
        group = fitted[name]
        if name.endswith("_Motion") and all(k in group for k in MotionEstimate.STATE_KEYS):
            m = MotionEstimate.from_state(dict(group))
            lo, hi = m.drift_range()
            return f"{m.summary()}, displacement {lo:.3g}..{hi:.3g} µm (range {hi - lo:.3g} µm)"
    return None


def _info_fitted(about: dict) -> None:
    """What a dspk output's fitted state (`describe`) says: the channels found bad and the
    drift corrected."""
    bad, drift = _bad_channels(about["fitted"]), _drift(about["fitted"])
    if bad is not None:
        print(f"  bad channels (interpolated): {bad}")
    if drift is not None:
        print(f"  drift (corrected): {drift}")


def _info_folder(about: dict) -> int:
    """``dspk info`` of a folder written by ``--format kilosort`` or ``--format zarr``
    (`describe`): its traces, units, probe and channels, the steps that ran, the channels
    found bad and the drift corrected."""
    n, c, fs = about["n_samples"], about["n_channels"], about["fs"]
    kilosort = about["format"] == "kilosort"
    what = "a Kilosort folder" if kilosort else "a Zarr folder (SpikeInterface's read_zarr)"
    print(f"{about['path']}: {what} written by dspk {about['dspk']}")
    where = f"([samples, channels], offset {about['offset']})" if kilosort else \
        "([samples, channels], Blosc zstd)"
    print(f"  {about['binary'] if kilosort else about['traces']}: {c} channels x {n} samples "
          f"{about['dtype']} {where}, {fs:g} Hz, {n / fs:.3f} s")
    print(f"  values: raw x {about['scale']:g}, in {about['units']}")
    print(f"  written by dspk: {' -> '.join(about['steps']) or 'no steps'}")
    geometry = about["geometry"]
    if geometry is not None:
        (x0, y0), (x1, y1) = np.nanmin(geometry, axis=0), np.nanmax(geometry, axis=0)
        shanks = about["shank_ids"]
        count = 1 if shanks is None else len(np.unique(shanks))
        print(f"  probe ({'chanMap.json' if kilosort else 'probegroup'}): {len(geometry)} "
              f"channels, x {x0:g}..{x1:g} µm, y {y0:g}..{y1:g} µm, {count} shank(s)")
    _info_channels(about)
    _info_fitted(about)
    return 0


def _info_channels(about: dict) -> None:
    """``dspk info``'s line on an output's channel metadata (`describe`): the ids, and
    whether it carries contact ids and ADC sample shifts."""
    ids = about.get("channel_ids")
    if ids is None or len(ids) == 0:
        return
    ids = [str(v) for v in ids]
    said = f"  channels: {ids[0]}" + (f" .. {ids[-1]}" if len(ids) > 1 else "")
    if about.get("contact_ids") is not None:
        contacts = about["contact_ids"]
        said += f"; contacts {contacts[0]}" + (f" .. {contacts[-1]}" if len(contacts) > 1 else "")
    if about.get("sample_shifts") is not None:
        said += "; ADC sample shifts (inter_sample_shift) kept"
    print(said)


def _info_file(args: argparse.Namespace) -> int:
    path = args.input
    about = describe(path) if is_output(path) else None
    if about is not None and about["format"] in ("kilosort", "zarr"):
        return _info_folder(about)
    series: list = []
    steps = None if about is None else about["steps"]
    if os.path.isfile(path) and is_hdf5(path):
        with h5py_module().File(path, "r") as f:
            series = electrical_series(f)
            datasets = contents(f)
        print(f"{path}: HDF5")
        for name in series:
            print(f"  ElectricalSeries {name}")
        for name, shape, dtype in datasets:
            if not any(name.startswith(s + "/") for s in series):
                print(f"  dataset {_dataset_line(name, shape, dtype)}")
        if about is not None:
            print(f"  written by dspk: {' -> '.join(steps) or 'no steps'}")
            _info_channels(about)
            _info_fitted(about)
    names = series if (series and args.dataset is None) else [args.dataset]
    for name in names:
        with _open(args, dataset=name) as rec:
            print(f"{rec.source}")
            print(f"  {rec.n_channels} channels x {rec.n_samples} samples {rec.dtype}, "
                  f"{rec.fs:g} Hz, {rec.duration_s:.3f} s")
            # a whitened dspk output is in units of the noise's standard deviation, not µV
            whitened = steps is not None and "Whiten" in steps and \
                getattr(rec, "dataset", None) == "/traces"
            unit = "noise SDs" if whitened else "µV"
            g, o = rec.gain_to_uv, rec.offset_to_uv
            same = np.all(g == g[0]) and np.all(o == o[0])
            print(f"  {unit} = raw x {g[0]:g} + {o[0]:g}" if same else
                  f"  {unit} = raw x gain + offset, per channel: gain {g.min():g}..{g.max():g}, "
                  f"offset {o.min():g}..{o.max():g}")
            if whitened:
                print("  (whitened: units of the noise's standard deviation, not µV)")
            if rec.geometry is None:
                print("  geometry: none (pass --probe FILE for local whitening and --detect)")
            else:
                lo, hi = rec.geometry.min(axis=0), rec.geometry.max(axis=0)
                print(f"  geometry: x {lo[0]:g}..{hi[0]:g} µm, y {lo[1]:g}..{hi[1]:g} µm")
            _info_events(rec)
    return 0


def _info_events(rec: Any) -> None:
    """``dspk info``'s lines on the recording's sync bits / TTL lines and their edges."""
    from .io.events import edge_counts, recording_events  # noqa: PLC0415

    table = recording_events(rec)
    if table is None:
        return
    counts = edge_counts(table)
    words = int(getattr(rec, "n_sync_words", 0) or 0)
    what = f"{words} sync word(s)" if words else "TTL events"
    if not counts:
        print(f"  events: {what}, no edges")
    for bit, (up, down) in counts.items():
        print(f"  events: bit {bit}: {up} rising, {down} falling edges")


def _events(args: argparse.Namespace) -> int:
    """``dspk events IN OUT.csv``: every edge of IN's sync bits / TTL lines."""
    from .io.events import recording_events, write_events_csv  # noqa: PLC0415

    bits = None
    if args.bits is not None:
        try:
            bits = parse_channels(args.bits)
        except (ValueError, RecordingError):
            raise RecordingError(f"--bits: expected bit numbers and ranges (e.g. 0,6 or "
                                 f"0-7), got {args.bits!r}") from None
    with _open(args) as rec:
        table = recording_events(rec, bits)
        if table is None:
            raise RecordingError(f"{rec.source}: keeps no events (a SpikeGLX .bin/.cbin's "
                                 f"sync channel or an Open Ephys recording's TTL events are "
                                 f"read)")
        write_events_csv(args.output, table, rec.fs)
        print(f"{args.output}: {len(table)} edges of {len(set(table['bit'].tolist()))} "
              f"bit(s)")
    return 0


def _pipeline_options(args: argparse.Namespace) -> dict:
    """The pipeline options (`_pipeline_args`: every option of the stage registry) as
    `Pipeline.from_options` keywords: the one mapping from the command line to a pipeline
    (``dspk preprocess``, ``tune`` and ``preprocess-many``)."""
    options = {o.name: getattr(args, o.name) for o in registry.options()}
    for o in registry.options():
        if o.nargs and options[o.name] is not None:
            options[o.name] = tuple(options[o.name])
    if getattr(args, "preset", None) is not None:
        # the preset's values, except for the options given on the command line
        given = getattr(args, "given_flags", set())
        flags = {o.name: o.flag for o in registry.options()}
        options.update({k: v for k, v in registry.preset(args.preset).items()
                        if flags[k] not in given})
    _spikeinterface_filter(args, options)
    return {**options, "backend": args.backend or "auto"}


#: values of options spelled as SpikeInterface spells them (`common_reference`'s
#: ``operator="average"`` is ``--reference mean``), mapped when the command line is read
VALUE_ALIASES = {"reference": {"average": "mean"}}


def _alias(name: str) -> Any:
    """The argparse ``type`` of an option with `VALUE_ALIASES`: the alias's dspk value."""
    aliases = VALUE_ALIASES[name]
    return lambda value: aliases.get(value, value)


def _spikeinterface_filter(args: argparse.Namespace, options: dict) -> None:
    """``--freq-min``/``--freq-max`` (SpikeInterface's ``highpass_filter(freq_min)`` and
    ``bandpass_filter(freq_min, freq_max)``) into ``options``: ``--freq-min LO`` is
    ``--highpass LO``, with ``--freq-max HI`` it is ``--bandpass LO HI``. Refused with
    ``--highpass``/``--bandpass`` (the same option twice), and ``--freq-max`` alone (dspk has
    no low-pass alone)."""
    lo, hi = getattr(args, "freq_min", None), getattr(args, "freq_max", None)
    if lo is None and hi is None:
        return
    given = [f for f in ("--highpass", "--bandpass") if f in getattr(args, "given_flags", ())]
    if given:
        raise ValueError(f"--freq-min/--freq-max: SpikeInterface's names for --highpass and "
                         f"--bandpass; give {given[0]} or them, not both")
    if lo is None:
        raise ValueError(f"--freq-max: dspk filters with a high-pass or a band-pass; give "
                         f"--freq-min too (--freq-min LO --freq-max HI is --bandpass LO HI), "
                         f"got --freq-max {hi:g} alone")
    options["highpass"], options["bandpass"] = (lo, None) if hi is None else (None, (lo, hi))


def _pipeline(args: argparse.Namespace) -> Pipeline:
    return Pipeline.from_options(**_pipeline_options(args))


def _job_options(args: argparse.Namespace) -> dict:
    """The job options `dspk preprocess` and `dspk preprocess-many` share, as `Pipeline.run`
    keywords: the chunk, the output's sample type, --overwrite, --format, and ``inputs``, the
    files the job reads besides IN (`_files_read`: --probe's, ...), which OUT is never,
    with --overwrite or without."""
    return {"chunk_s": args.chunk_s,
            "output_dtype": np.int16 if args.int16 else np.float32 if args.float32 else None,
            "overwrite": args.overwrite, "format": args.format, "inputs": _files_read(args)}


def _preprocess(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    pipe = _pipeline(args)
    with _open(args) as rec:
        print(f"{rec.source}: {rec.n_channels} channels x {rec.n_samples} samples, "
              f"{rec.fs:g} Hz ({rec.duration_s:.2f} s)")
        print("steps: " + " -> ".join(f"{o['step']}" for o in pipe.options()))
        t0 = time.perf_counter()
        out = pipe.run(rec, args.output, **_job_options(args), **_subject(args),
                       resume=args.resume,
                       compression=None if args.compression == "none" else args.compression,
                       layout="channels_samples" if args.channels_first else
                       "samples_channels",
                       progress=not args.quiet, fsync=False if args.no_fsync else None,
                       gpu_memory=args.gpu_memory)
        dt = time.perf_counter() - t0
        print(f"{out}: written in {dt:.2f} s ({rec.duration_s / dt:.1f} x real time, "
              f"{'gpu' if pipe.xp.__name__ == 'cupy' else 'cpu'} backend)")
    return 0


def _subject_arg(p: argparse.ArgumentParser, whose: str) -> None:
    p.add_argument("--subject", action="append", default=None, metavar="KEY=VALUE",
                   help=f"with --format nwb, a field of {whose} (repeat it: --subject "
                        "species=\"Mus musculus\" --subject age=P90D --subject subject_id=m1); "
                        "DANDI and nwbinspector require a species and an age, which dspk does "
                        "not invent (an NWB input's are taken over)")


def _subject(args: argparse.Namespace) -> dict:
    """``--subject KEY=VALUE`` (repeated) as the NWB output's ``subject`` (refused with
    another format: only NWB has a subject)."""
    pairs = args.subject or []
    if not pairs:
        return {}
    if args.format != "nwb":
        raise ValueError(f"--subject: only --format nwb stores the subject; got --format "
                         f"{args.format}")
    subject = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--subject: expected KEY=VALUE (species=\"Mus musculus\", "
                             f"age=P90D), got {pair!r}")
        subject[key.strip()] = value.strip()
    return {"subject": subject}


def _preprocess_many(args: argparse.Namespace) -> int:
    # dspk.dask needs the optional extra dask: loaded only by this command
    from .dask import cluster_client, preprocess_many  # noqa: PLC0415

    options = {**_pipeline_options(args), **_open_options(args), **_job_options(args),
               **_subject(args)}

    def client() -> Any:
        # started once preprocess_many's checks have passed (the outputs against the files
        # the jobs read, among them): a refused command starts no cluster; closed by it
        return cluster_client(args.scheduler, args.workers, gpu=options["backend"] == "gpu")

    results = preprocess_many(args.pattern, args.outdir, client=client, **options)
    failed = 0
    for path, res in results.items():
        if isinstance(res, Exception):
            failed += 1
            print(f"{path}: FAILED: {type(res).__name__}: {res}")
        else:
            print(f"{path} -> {res}")
    print(f"{len(results) - failed} of {len(results)} recordings preprocessed")
    return 1 if failed else 0


# -- dspk detect ----------------------------------------------------------------------------------
#: the steps turned off on a dspk output, unless given: its traces are processed already
DETECT_OFF_ON_OUTPUT = {"highpass": None, "reference": "none", "whiten": "none"}


def _dspk_output_units(path: str) -> str | None:
    """The units of a dspk output file's traces (None: not a dspk output file)."""
    if not (os.path.isfile(path) and is_output(path)):
        return None
    return describe(path, fitted=False)["units"]


def _detect_pipeline(args: argparse.Namespace, on_output: bool) -> Pipeline:
    """The pipeline of the options with detection (without its PCA features: only the
    spikes are kept); on a dspk output the steps that `DETECT_OFF_ON_OUTPUT` names are off
    unless given (or a preset is)."""
    options = {**_pipeline_options(args), "detect": True}
    if on_output and getattr(args, "preset", None) is None:
        given = getattr(args, "given_flags", set())
        for o in registry.options():
            if o.name in DETECT_OFF_ON_OUTPUT and o.flag not in given and \
                    options[o.name] == o.default:
                options[o.name] = DETECT_OFF_ON_OUTPUT[o.name]
    pipe = Pipeline.from_options(**options)
    pipe.steps = [replace(s, features=0) if isinstance(s, Detect) else s for s in pipe.steps]
    return pipe


def _detect(args: argparse.Namespace) -> int:
    """``dspk detect``: the pipeline into a `dspk.pipeline.outputs.PeaksOutput`, OUTDIR."""
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    found = PeaksOutput(args.output, overwrite=args.overwrite)
    found.check(None, _files_read(args))   # OUTDIR before the input is read (the job: again)
    found.units = _dspk_output_units(args.input)
    pipe = _detect_pipeline(args, on_output=found.units is not None)
    with _open(args) as rec:
        steps = [o["step"] for o in pipe.options()]
        print(f"{rec.source}: {rec.n_channels} channels x {rec.n_samples} samples, "
              f"{rec.fs:g} Hz ({rec.duration_s:.2f} s)")
        print("steps: " + " -> ".join(steps))
        t0 = time.perf_counter()
        pipe.run(rec, found, chunk_s=args.chunk_s, progress=False, inputs=_files_read(args))
        dt = time.perf_counter() - t0
        n = len(found.peaks)
        print(f"{n} peaks ({n / rec.duration_s:.1f} per s) in {dt:.2f} s -> {args.output}: "
              f"{', '.join(DETECT_FILES)}")
    return 0


def _tune(args: argparse.Namespace) -> int:
    """Fit the pipeline and push one chunk through it: every tuner decision the job will need
    (products, FIR and reference implementations) is taken now and stored in the cache. With
    --compile, first load or compile every kernel for the current GPU and warm up CuPy's own
    kernels (`_compile_kernels`)."""
    if args.compile:
        _compile_kernels()
    if args.input is None:
        if not args.compile:
            raise ValueError("tune: give IN (a recording to tune for), or --compile")
        return 0
    pipe = _pipeline(args)
    with _open(args) as rec:
        t0 = time.perf_counter()
        pipe.tune(rec, args.chunk_s)
        chunk = min(rec.n_samples, max(1, int(round(args.chunk_s * rec.fs))))
        print(f"tuned for {rec.n_channels} channels, chunks of {chunk} samples in "
              f"{time.perf_counter() - t0:.2f} s; choices in {cache_path()}")
    return 0


def _compile_kernels() -> None:
    """Every declared kernel instance of every CUDA source, for the current GPU: from the
    prebuilt fatbins where they are usable, else compiled by NVRTC (then cached on disk by
    CuPy, so later processes load them); printed per source with where it came from and
    how long it took."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"--compile prepares the GPU's kernels, but there is no GPU: {reason}")
    device = cupy_module().cuda.runtime.getDevice()
    print(f"kernels for {device_name(device)} (DSPK_KERNELS={kernel_origin_mode()}):")
    t0 = time.perf_counter()
    for name in declare_all():
        t1 = time.perf_counter()
        count = precompile([name])[name]
        print(f"  {name}: {count} instances in {time.perf_counter() - t1:.2f} s, "
              f"{loaded_from(name, device)}", flush=True)
    print(f"all kernels ready in {time.perf_counter() - t0:.2f} s")
    print("CuPy's own kernels, compiled into its cache by each GPU call on small inputs:")
    t0 = time.perf_counter()
    done = warm_gpu_calls(report=lambda line: print(f"  {line}", flush=True))
    failed = [name for name, v in done.items() if isinstance(v, str)]
    if failed:
        raise RuntimeError(f"--compile: the warm-up of {', '.join(failed)} failed (above)")
    print(f"GPU calls warmed up in {time.perf_counter() - t0:.2f} s")


#: how to open IN: which series, and what a flat binary does not say about itself (each
#: option stores to the `dspk.open_recording` keyword of its name; --probe to ``geometry``)
INPUT_OPTIONS = (
    ("--dataset", dict(default=None, help="the HDF5 dataset or NWB ElectricalSeries path, or "
                       "the Open Ephys stream (needed when the file holds several)")),
    ("--fs", dict(type=float, default=None, metavar="HZ",
                  help="sampling rate in Hz (required for flat binaries; overrides the file's)")),
    ("--n-channels", dict(type=int, default=None, metavar="N",
                          help="channels per frame of a flat binary")),
    ("--dtype", dict(default=None, choices=RAW_DTYPES,
                     help="sample type of a flat binary (when not given: int16)")),
    ("--header-bytes", dict(type=int, default=0, metavar="BYTES",
                            help="bytes before the first sample of a flat binary")),
    ("--gain-to-uv", dict(type=float, default=None, metavar="UV",
                          help="µV per raw unit (overrides the file's; when neither gives one: "
                               "1, the samples taken as µV)")),
    ("--allow-negative-gain", dict(action="store_true",
                                   help="accept a negative gain (refused by default: it flips "
                                        "the signal's sign)")),
    ("--probe", dict(default=None, metavar="FILE",
                     help="channel positions in µm: probeinterface JSON, .prb, CSV/TSV (x,y or "
                          "channel,x,y per line) or .npy; overrides the file's (needed by "
                          "local whitening and --detect when the file has none)")),
    ("--backend", dict(default=None, metavar="auto|cpu|gpu",
                       help="where to compute (when not given: $DSPK_BACKEND, else auto)")),
)


def _input_options(p: argparse.ArgumentParser) -> None:
    """The input options (`INPUT_OPTIONS`)."""
    for flag, kwargs in INPUT_OPTIONS:
        p.add_argument(flag, **kwargs)


def _pipeline_args(p: argparse.ArgumentParser, implied: tuple = (),
                   defaults: dict | None = None) -> None:
    """Every option of the stage registry (`dspk.pipeline.registry`: a step registered by
    your code gets its option here too), ``--preset``, the chunk length and the input
    options; the options in ``implied`` left out (the command sets them), and the help of
    those in ``defaults`` ending with that text instead of argparse's "(default: ...)"."""
    defaults = defaults or {}
    p.add_argument("--preset", default=None, choices=sorted(registry.PRESETS),
                   help="the options of a known chain: ibl (phase shift, high-pass, bad "
                        "channels, spatial high-pass: IBL's destripe), ibl-lfp (decimation "
                        "to 2.5 kHz where the input is faster, phase shift, Butterworth "
                        "0.5-300 Hz band-pass, bad channels, median per shank: IBL's "
                        "destripe_lfp), kilosort (high-pass, "
                        "median reference, local whitening: Kilosort4's); options given win")
    groups: dict = {}
    for o in registry.options():
        if o.name in implied:
            continue
        if o.group is not None and o.group not in groups:
            groups[o.group] = p.add_mutually_exclusive_group()
        where = p if o.group is None else groups[o.group]
        if o.switch:
            where.add_argument(o.flag, dest=o.name, action="store_true", help=o.help)
            continue
        aliases = VALUE_ALIASES.get(o.name)
        text = o.help if aliases is None else o.help + " (" + ", ".join(
            f"{a} is {v}" for a, v in aliases.items()) + ", as SpikeInterface names it)"
        where.add_argument(o.flag, dest=o.name, default=o.default,
                           type=o.type if aliases is None else _alias(o.name),
                           choices=o.choices, nargs=o.nargs, metavar=o.metavar,
                           help=text + defaults[o.name] if o.name in defaults else text)
    p.add_argument("--freq-min", type=float, default=None, metavar="HZ",
                   help="SpikeInterface's freq_min: --highpass HZ (with --freq-max: "
                        "--bandpass FREQ_MIN FREQ_MAX)")
    p.add_argument("--freq-max", type=float, default=None, metavar="HZ",
                   help="SpikeInterface's freq_max: the band-pass's upper edge, with "
                        "--freq-min")
    p.add_argument("--chunk", dest="chunk_s", type=float, default=1.0, metavar="SECONDS",
                   help="chunk length (the output does not depend on it)")
    _input_options(p)


def _cache(args: argparse.Namespace) -> int:
    path = cache_path()
    if args.action == "clear":
        print(f"removed {path}" if clear_cache(path) else f"no cache at {path}")
        return 0
    entries = read_cache(path)
    if not entries:
        print(f"no tuned choices in {path}")
        return 0
    for key, entry in sorted(entries.items()):
        times = entry.get("timings_ms", {})
        best = entry["ranking"][0] if entry["ranking"] else "?"
        how = entry.get("tuned", "thorough")
        if how == "table":
            how = f"table {entry.get('table', {}).get('class', '?')}"
        print(f"{key}\n    -> {best} ({times.get(best, float('nan')):.4g} ms); "
              f"ranking {json.dumps(entry['ranking'])}; tuned: {how}")
    return 0


def parser() -> argparse.ArgumentParser:
    """The ``dspk`` command's argument parser (its help: the module docstring)."""
    top = argparse.ArgumentParser(prog="dspk", description=__doc__,
                                  formatter_class=_HelpFormatter)
    top.add_argument("--version", action="version", version=f"dspk {__version__}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str = "") -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary,
                              description=textwrap.fill(description or summary, 79),
                              formatter_class=_HelpFormatter)

    p_info = command("info", "backend, devices and tuner cache; or what a recording or "
                             "output file holds",
                     "Without IN: the backend, the GPUs and the tuner's cache. With IN: its "
                     "series and datasets (/spikes and /features of a dspk output with their "
                     "lengths), shape, rate, units (µV, or noise SDs for a whitened output) "
                     "and geometry.")
    p_info.add_argument("input", nargs="?", default=None, metavar="IN",
                        help="a recording or a dspk output")
    _input_options(p_info)
    p_info.set_defaults(func=_info)
    p_ev = command("events", "export the sync bits' / TTL lines' edges to a CSV file",
                   "Every rising and falling edge of IN's sync channel (a SpikeGLX .bin/.cbin: "
                   "the imec SY word, the NI-DAQ digital words; bit 16*word + b for the "
                   "NI-DAQ's second word and beyond) or Open Ephys TTL lines (line L is bit "
                   "L-1), as CatGT extracts them: the sample where the bit changes. OUT.csv: "
                   "bit,edge,sample,seconds, one row per edge, by sample.")
    p_ev.add_argument("input", metavar="IN", help="the recording (see dspk --help)")
    p_ev.add_argument("output", metavar="OUT.csv", help="the CSV file written")
    p_ev.add_argument("--bits", default=None, metavar="BITS",
                      help="only these bits: numbers and inclusive ranges, e.g. 0,6 or 0-7")
    _input_options(p_ev)
    _subset_args(p_ev)
    p_ev.set_defaults(func=_events)
    p_pre = command("preprocess", "filter, reference and whiten a recording into an HDF5 file",
                    "High-pass (or band-pass) FIR, common reference and whitening, chunk by "
                    "chunk into OUT (/traces, and /spikes and /features with --detect), "
                    "written as OUT.partial and renamed when complete. OUT is refused before "
                    "any work if it exists (without --overwrite), is any file of IN (its "
                    ".meta, structure.oebin, ...) or not a regular file, with --overwrite or "
                    "without, or its folder is missing. Ctrl-C or SIGTERM stops a job with "
                    "OUT.partial kept (exit status 130); --resume continues it. With --format "
                    "kilosort OUT is a folder (written as OUT.partial/, renamed when "
                    "complete): new or empty, or with --overwrite one holding a dspk Kilosort "
                    "output and nothing else. --format nwb writes an NWB file in one go (not "
                    "resumable).")
    p_pre.add_argument("input", metavar="IN", help="the recording (see dspk --help)")
    p_pre.add_argument("output", metavar="OUT", help="the output HDF5 file (with --format "
                       "kilosort a folder, with --format nwb an .nwb file)")
    _pipeline_args(p_pre)
    _subset_args(p_pre)
    p_pre.add_argument("--format", default="hdf5", choices=formats(listed=True),
                       help="; ".join(f"{name}: {output_class(name).summary}"
                                      for name in formats(listed=True)))
    kind = p_pre.add_mutually_exclusive_group()
    kind.add_argument("--int16", action="store_true",
                      help="scaled int16 output (the default of --format kilosort: whitened "
                           "traces 200 steps per noise SD, else 0.1 µV per step)")
    kind.add_argument("--float32", action="store_true",
                      help="float32 output (the default, except for --format kilosort)")
    p_pre.add_argument("--compression", default="none", choices=("none", "gzip", "lzf"),
                       help="HDF5 compression of the output")
    p_pre.add_argument("--channels-first", action="store_true",
                       help="write traces as [channels, samples] (else [samples, channels])")
    p_pre.add_argument("--resume", action="store_true",
                       help="continue a killed job from OUT.partial with its fitted state "
                            "(else a partial file is discarded)")
    p_pre.add_argument("--overwrite", action="store_true", help="replace an existing OUT (never "
                       "IN or a file an option names, such as --probe's)")
    p_pre.add_argument("--no-fsync", action="store_true",
                       help="do not flush OUT to the disk before naming it (faster on slow "
                            "disks; a power cut may then leave an OUT that looks complete)")
    p_pre.add_argument("--gpu-memory", type=_byte_count, default=None, metavar="BYTES",
                       help="the most device memory a GPU job's chunks may use, e.g. 800M or "
                            "4G (default: sized to the free device memory; the chunk is "
                            "halved when the device runs out all the same)")
    _subject_arg(p_pre, "the NWB file's subject")
    p_pre.add_argument("--quiet", action="store_true", help="no progress bar")
    p_pre.set_defaults(func=_preprocess)
    p_many = command("preprocess-many", "preprocess many recordings on a Dask cluster (needs "
                                        "dspk[dask])",
                     "Every recording matching GLOB into OUTDIR/<its name>.h5, in parallel; a "
                     "failed recording is reported without stopping the others. The input "
                     "options (--probe, --gain-to-uv, ...) apply to every recording.")
    p_many.add_argument("pattern", metavar="GLOB", help="a glob of recording files (quote it)")
    p_many.add_argument("outdir", metavar="OUTDIR",
                        help="outputs OUTDIR/<recording name>.h5 (see --format)")
    where = p_many.add_mutually_exclusive_group()
    where.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="a running dask.distributed scheduler (else a local cluster)")
    where.add_argument("--workers", type=int, default=None,
                       help="local worker processes (when not given: one per core; with "
                            "--backend gpu and dask-cuda, one per GPU)")
    _pipeline_args(p_many)
    p_many.add_argument("--format", default="hdf5", choices=formats(listed=True),
                        help="each output as dspk preprocess --format writes it: " + ", ".join(
                            f"{name}: OUTDIR/<name>{output_class(name).suffix}"
                            for name in formats(listed=True)))
    many_kind = p_many.add_mutually_exclusive_group()
    many_kind.add_argument("--int16", action="store_true",
                           help="scaled int16 output (the default of --format kilosort)")
    many_kind.add_argument("--float32", action="store_true",
                           help="float32 output (the default, except for --format kilosort)")
    p_many.add_argument("--overwrite", action="store_true",
                        help="replace existing outputs (never a recording or a file an option "
                             "names, such as --probe's: refused before the cluster starts)")
    _subject_arg(p_many, "every NWB file's subject")
    p_many.set_defaults(func=_preprocess_many)
    p_det = command("detect", "detection alone, its peaks in SpikeInterface's form",
                    "Spike detection on IN without writing traces: on a dspk output its "
                    "traces as they are (the high-pass, reference and whitening off unless "
                    "given), on a recording the steps of `dspk preprocess` first (the same "
                    "options, the same fit: the peaks are the /spikes that `dspk preprocess "
                    "--detect` writes). OUTDIR gets peaks.npy (SpikeInterface's peak dtype: "
                    "sample_index, channel_index, amplitude — the processed trace at the "
                    "spike's trough, in noise SDs when whitened — and segment_index), "
                    "peak_locations.npy (x, y in µm: the detecting channel's position), "
                    "the names SpikeInterface's motion tools use, and detect.json (rate, "
                    "channel ids, steps, amplitude units).")
    p_det.add_argument("input", metavar="IN", help="a dspk output or a recording (see dspk "
                                                   "--help)")
    p_det.add_argument("output", metavar="OUTDIR", help="the folder of the peaks (new, "
                                                        "empty, or with --overwrite one "
                                                        "dspk detect wrote)")
    _pipeline_args(p_det, implied=("detect",), defaults={
        name: f" (default: %(default)s on a recording, {value or 'none'} on a dspk output)"
        for name, value in DETECT_OFF_ON_OUTPUT.items()})
    p_det.add_argument("--overwrite", action="store_true",
                       help="replace the peaks in an OUTDIR that dspk detect wrote")
    p_det.set_defaults(func=_detect, detect=True)
    p_tune = command("tune", "pre-tune what preprocessing a recording needs",
                     "Fit the pipeline on IN and push a chunk through it, so that every "
                     "tuner decision a job will need is in the cache before it starts.")
    p_tune.add_argument("input", metavar="IN", nargs="?", default=None,
                        help="the recording (see dspk --help); optional with --compile")
    p_tune.add_argument("--compile", action="store_true",
                        help="load or compile every GPU kernel for this GPU first (the prebuilt "
                             "fatbins where usable, else NVRTC, cached on disk), then run every "
                             "GPU call once on small inputs so that CuPy compiles its own "
                             "kernels into its cache: a machine's first GPU call then compiles "
                             "nothing")
    _pipeline_args(p_tune)
    _subset_args(p_tune)
    p_tune.set_defaults(func=_tune)
    p_cache = command("tune-cache", "show or clear the tuner's stored choices")
    p_cache.add_argument("action", choices=("show", "clear"),
                         help="list the stored choices, or forget them (re-tuned on next use)")
    p_cache.set_defaults(func=_cache)
    for p in sub.choices.values():      # the options naming a file the command reads
        p.set_defaults(file_options=tuple(
            (a.option_strings[0], a.dest) for a in p._actions
            if a.option_strings and isinstance(a.metavar, str) and "FILE" in a.metavar))
    return top


#: the keywords whose command-line option has another name (or none of its own) than the
#: keyword's: how messages spell them on the command line (`dspk.argnames`)
OPTION_NAMES = {"geometry": "--probe FILE", "chunk_s": "--chunk", "output_dtype": "--int16",
                "layout": "--channels-first", "compression": "--compression",
                "resume": "--resume", "overwrite": "--overwrite", "time": "--time",
                "channels": "--channels", "preset": "--preset", "format": "--format",
                "gpu_memory": "--gpu-memory", "subject": "--subject"}


def spelling() -> dict:
    """Python keyword -> command-line option, for the options of every command: the stage
    registry's, the input options' (each stores to the keyword of its name) and
    `OPTION_NAMES`.

    Examples
    --------
    >>> from dspk import cli
    >>> table = cli.spelling()
    >>> table["fs"], table["n_neighbors"], table["geometry"]
    ('--fs', '--neighbors', '--probe FILE')
    """
    table = {o.name: o.flag for o in registry.options()}
    table.update({flag[2:].replace("-", "_"): flag for flag, _ in INPUT_OPTIONS})
    return {**table, **OPTION_NAMES}


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM stops a command as Ctrl-C does (a job keeps its partial output for
    --resume), in the main thread; the handler before it is restored at the end."""
    try:
        before = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:          # not the main thread (an embedding program): left as it is
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    """Run the ``dspk`` command; returns its exit status (0 done, 1 some recordings of
    preprocess-many failed, 2 an error, printed on one line as ``dspk: error: ...``; 130
    interrupted by Ctrl-C or SIGTERM, one line saying where a job stopped and that --resume
    continues it). Messages spell arguments as this command's options (`dspk.argnames`)."""
    args = parser().parse_args(argv)
    # the options written out (a --preset gives way to them)
    args.given_flags = {a.split("=")[0] for a in (sys.argv[1:] if argv is None else argv)
                        if a.startswith("--")}
    with command_line_spelling(spelling()), _terminate_as_interrupt():
        try:
            return args.func(args)
        except KeyboardInterrupt as exc:
            what = str(exc) if isinstance(exc, JobInterrupted) else "interrupted"
            print(f"\ndspk: {what}", file=sys.stderr)
            return 130
        except Exception as exc:  # a clear one-line error for the command line
            print(f"dspk: error: {exc}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
