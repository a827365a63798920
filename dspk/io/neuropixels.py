"""The Neuropixels probe of a SpikeGLX or Open Ephys recording, read through probeinterface
(``read_spikeglx``, ``read_openephys_neuropixels``), which builds it from its catalogue of
probe models by part number and the recording's electrode selection: the geometry, shanks
and contact ids that SpikeInterface gives the same recording.

probeinterface is imported when a probe is read (it loads its catalogue and ``requests``:
about 0.2 s). A probe it cannot build (an unknown or missing part number, metadata it does
not parse) or one whose contacts are not the recording's channels gives None and a log line
saying why: the recording is still read, with the format's own geometry where it has one.

Examples
--------
>>> import numpy as np
>>> from dspk.io.neuropixels import probe_arrays
>>> class Probe:                                   # what a probeinterface Probe carries
...     contact_positions = np.array([[0.0, 0.0], [250.0, 0.0], [0.0, 15.0]])
...     device_channel_indices = np.array([0, 2, 1])
...     shank_ids = np.array(["0", "1", "0"])
...     contact_ids = np.array(["s0e0", "s1e0", "s0e1"])
>>> info = probe_arrays(Probe(), 3, "probe")
>>> info.geometry.tolist(), info.shank_ids.tolist(), info.contact_ids.tolist()
([[0.0, 0.0], [0.0, 15.0], [250.0, 0.0]], [0, 0, 1], ['s0e0', 's0e1', 's1e0'])
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ProbeInfo", "probe_arrays", "adc_sample_shifts", "spikeglx_probe",
           "openephys_probe", "openephys_settings"]

log = logging.getLogger("dspk.io")


@dataclass(frozen=True)
class ProbeInfo:
    """A probe's contacts as a recording's channels see them, row i for channel i.

    Parameters
    ----------
    geometry : numpy.ndarray
        [channels, 2] contact positions in µm.
    shank_ids : numpy.ndarray
        [channels] int64, each contact's shank (0-based; 0 on a single-shank probe).
    contact_ids : numpy.ndarray
        [channels] str, probeinterface's contact ids (``"e12"``, ``"s1e40"``).
    sample_shifts : numpy.ndarray or None
        [channels] float64, each channel's ADC sample shift in samples where the probe's
        metadata give its ADC sampling order (`adc_sample_shifts`), else None.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io.neuropixels import ProbeInfo
    >>> ProbeInfo(np.zeros((1, 2)), np.zeros(1, np.int64), np.array(["e0"])).contact_ids
    array(['e0'], dtype='<U2')
    """

    geometry: np.ndarray
    shank_ids: np.ndarray
    contact_ids: np.ndarray
    sample_shifts: np.ndarray | None = None


def adc_sample_shifts(probe: Any) -> np.ndarray | None:
    """Each contact's ADC sample shift (in samples) from a probeinterface Neuropixels probe's
    metadata, in the probe's contact order: its ``adc_sample_order`` over the ADC's cycle,
    ``num_channels_per_adc · (1 + lf rate / ap rate)`` slots (13 on NP1.0: 12 AP channels and
    an LFP slot; 16 on NP2.0, which has no LFP band), as SpikeInterface's
    ``get_neuropixels_sample_shifts_from_probe`` computes ``inter_sample_shift`` for its Open
    Ephys and SpikeGLX readers; None where the probe does not give these.

    Parameters
    ----------
    probe : probeinterface.Probe

    Returns
    -------
    numpy.ndarray or None

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io.neuropixels import adc_sample_shifts
    >>> class Probe:
    ...     annotations = {"num_channels_per_adc": 12, "ap_sample_frequency_hz": 30000.0,
    ...                    "lf_sample_frequency_hz": 2500.0}
    ...     contact_annotations = {"adc_sample_order": np.array([0, 0, 1, 1, 12])}
    >>> adc_sample_shifts(Probe()) * 13
    array([ 0.,  0.,  1.,  1., 12.])
    """
    notes = getattr(probe, "annotations", None) or {}
    order = (getattr(probe, "contact_annotations", None) or {}).get("adc_sample_order")
    per_adc, ap, lf = (notes.get(k) for k in ("num_channels_per_adc", "ap_sample_frequency_hz",
                                              "lf_sample_frequency_hz"))
    if order is None or per_adc is None or ap is None or lf is None or float(ap) <= 0:
        return None
    cycle = int(int(per_adc) * (1 + float(lf) / float(ap)))
    return np.asarray(order, dtype=np.float64) / cycle


def probe_arrays(probe: Any, n_channels: int, source: str) -> ProbeInfo | None:
    """A probeinterface ``Probe`` wired to a recording's channels as `ProbeInfo` (rows by
    ``device_channel_indices``), or None (logged) when its wired contacts are not exactly
    channels 0..n_channels−1.

    Parameters
    ----------
    probe : probeinterface.Probe
    n_channels : int
        The recording's channel count.
    source : str
        The metadata file, for the log.

    Returns
    -------
    ProbeInfo or None

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io.neuropixels import probe_arrays
    >>> class Probe:
    ...     contact_positions = np.zeros((2, 2))
    ...     device_channel_indices = np.array([0, 1])
    ...     shank_ids = contact_ids = None
    >>> probe_arrays(Probe(), 3, "x.meta") is None           # 2 contacts, 3 channels
    True
    """
    pos = np.asarray(probe.contact_positions, dtype=np.float64)
    wired = getattr(probe, "device_channel_indices", None)
    order = np.arange(len(pos)) if wired is None else np.asarray(wired, dtype=np.int64)
    if len(pos) != n_channels or not np.array_equal(np.sort(order), np.arange(n_channels)):
        log.info("%s: probeinterface's probe has %d contacts wired to other channels than "
                 "the recording's %d; not used", source, len(pos), n_channels)
        return None
    rows = np.argsort(order)
    shanks = getattr(probe, "shank_ids", None)
    shank = np.zeros(len(pos), np.int64) if shanks is None or \
        all(str(s) == "" for s in shanks) else \
        np.array([int(s) if str(s) != "" else 0 for s in shanks], dtype=np.int64)
    ids = getattr(probe, "contact_ids", None)
    contact = np.array([str(i) for i in range(len(pos))] if ids is None else
                       [str(i) for i in ids])
    shifts = adc_sample_shifts(probe)
    return ProbeInfo(pos[rows, :2], shank[rows], contact[rows],
                     None if shifts is None or len(shifts) != len(pos) else shifts[rows])


def _probeinterface() -> Any:
    # loaded when a probe is read: probeinterface imports requests and its catalogue
    try:
        import probeinterface  # noqa: PLC0415
    except ImportError:
        return None
    return probeinterface


def spikeglx_probe(meta_file: str, n_channels: int) -> ProbeInfo | None:
    """The probe of a SpikeGLX imec stream (``probeinterface.read_spikeglx``: the part
    number's model, the IMRO table's electrodes, the saved channels), or None (logged).

    Parameters
    ----------
    meta_file : str
        The stream's ``.meta``.
    n_channels : int
        The recording's channel count (its AP or LF channels, without the sync word).

    Returns
    -------
    ProbeInfo or None

    Examples
    --------
    >>> import os, tempfile
    >>> from dspk.io.neuropixels import spikeglx_probe
    >>> tmp = tempfile.TemporaryDirectory()
    >>> meta = os.path.join(tmp.name, "x.imec0.ap.meta")
    >>> _ = open(meta, "w").write("imDatPrb_type=0\\n")         # no part number, no IMRO
    >>> spikeglx_probe(meta, 384) is None
    True
    >>> tmp.cleanup()
    """
    pi = _probeinterface()
    if pi is None:
        return None
    try:
        probe = pi.read_spikeglx(meta_file)
    # probeinterface asserts, and raises key and value errors, on metadata it does not know
    except Exception as exc:  # noqa: BLE001
        log.info("%s: probeinterface cannot build the probe (%s: %s); dspk's own tables give "
                 "the geometry", meta_file, type(exc).__name__, exc)
        return None
    return probe_arrays(probe, n_channels, meta_file)


def openephys_settings(oebin: str) -> str | None:
    """The ``settings.xml`` that describes the experiment of a recording folder in the Open
    Ephys GUI's layout (``<Record Node>/experimentE/recordingR/structure.oebin``): the Record
    Node's ``settings.xml`` for experiment 1, ``settings_E.xml`` for experiment E (as the GUI
    writes them); None when the folders are not laid out so or the file is missing.

    Parameters
    ----------
    oebin : str
        The recording's ``structure.oebin``.

    Examples
    --------
    >>> from dspk.io.neuropixels import openephys_settings
    >>> openephys_settings("/nowhere/Record Node 101/experiment2/recording1/structure.oebin")
    """
    experiment = os.path.dirname(os.path.dirname(os.path.abspath(oebin)))
    m = re.fullmatch(r"experiment(\d+)", os.path.basename(experiment))
    if m is None:
        return None
    node = os.path.dirname(experiment)
    number = int(m.group(1))
    path = os.path.join(node, "settings.xml" if number == 1 else f"settings_{number}.xml")
    return path if os.path.isfile(path) else None


def openephys_probe(oebin: str, stream: str, n_channels: int) -> ProbeInfo | None:
    """The Neuropixels probe of an Open Ephys stream, from the experiment's settings file
    (`openephys_settings`, ``probeinterface.read_openephys_neuropixels`` with the stream's
    folder name, as SpikeInterface reads it), or None (logged) where the settings hold no
    Neuropixels probe for the stream.

    Parameters
    ----------
    oebin : str
        The recording's ``structure.oebin``.
    stream : str
        The stream's folder name (``"Neuropix-PXI-100.ProbeA-AP"``).
    n_channels : int
        The recording's channel count (without ADC/AUX channels).

    Returns
    -------
    ProbeInfo or None

    Examples
    --------
    >>> from dspk.io.neuropixels import openephys_probe
    >>> openephys_probe("/nowhere/structure.oebin", "Rhythm Data", 32) is None
    True
    """
    settings = openephys_settings(oebin)
    pi = _probeinterface()
    if settings is None or pi is None:
        return None
    read = getattr(pi, "read_openephys_neuropixels", None) or pi.read_openephys
    has = getattr(pi, "has_neuropixels_probes", None)
    try:
        if has is not None and not has(settings, stream_name=stream):
            return None
        probe = read(settings, stream_name=stream)
    # probeinterface asserts, and raises key and value errors, on settings it does not know
    except Exception as exc:  # noqa: BLE001
        log.info("%s: probeinterface cannot read the probe of stream %r (%s: %s); pass the "
                 "geometry", settings, stream, type(exc).__name__, exc)
        return None
    return None if probe is None else probe_arrays(probe, n_channels, settings)
