"""The files Kilosort and Phy read beside a flat binary: the probe in Kilosort's form (the
JSON that Kilosort4's ``kilosort.io.load_probe`` reads, and the ``chanMap.mat`` of
Kilosort 2 to 4), the probe as probeinterface JSON (SpikeInterface reads it), and Phy's
``params.py``. Writers only: every value is given, nothing is computed.

Kilosort's probe names each channel by its row in the binary (``chanMap``, 0-based in the
JSON, 1-based in the .mat as MATLAB counts), places it at ``xc``, ``yc`` (µm; ``xcoords``,
``ycoords`` in the .mat) and groups channels by shank (``kcoords``: Kilosort4 places its
templates per shank). ``n_chan`` is the binary's channel count.

Examples
--------
>>> import numpy as np
>>> from dspk.io.kilosort import kilosort_probe
>>> probe = kilosort_probe(np.array([[0.0, 0.0], [32.0, 0.0], [0.0, 20.0]]))
>>> probe["chanMap"], probe["yc"], probe["kcoords"], probe["n_chan"]
([0, 1, 2], [0.0, 0.0, 20.0], [0.0, 0.0, 0.0], 3)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import RecordingError

__all__ = ["kilosort_probe", "write_kilosort_probe", "write_chanmap_mat",
           "write_probeinterface", "write_phy_params", "PHY_DTYPES"]

#: the sample types Kilosort4 reads from a flat binary (``BinaryRWFile.supported_dtypes``)
#: and Phy's ``params.py`` names
PHY_DTYPES = ("int16", "uint16", "int32", "float32")


def _checked_geometry(geometry: Any) -> np.ndarray:
    g = np.asarray(geometry, dtype=np.float64) if geometry is not None else None
    if g is None or g.ndim != 2 or g.shape[1] != 2 or len(g) < 1:
        raise RecordingError(f"geometry: expected [channels, 2] positions in µm, got "
                             f"{None if g is None else g.shape}")
    if not np.all(np.isfinite(g)):
        raise RecordingError("geometry: positions must be finite")
    return g


def _checked_shanks(shank_ids: Any, n: int) -> np.ndarray:
    if shank_ids is None:
        return np.zeros(n, dtype=np.int64)
    s = np.asarray(shank_ids)
    if s.shape != (n,) or s.dtype.kind not in "iu" or (s.size and s.min() < 0):
        raise RecordingError(f"shank_ids: expected {n} integers >= 0 (one shank per "
                             f"channel), got {s.dtype} of shape {s.shape}")
    return s.astype(np.int64)


def kilosort_probe(geometry: Any, shank_ids: Any = None) -> dict:
    """The probe as Kilosort4 holds it (``kilosort.io.load_probe``'s dictionary), with
    lists for values: row i of the binary is channel i at ``geometry[i]``.

    Parameters
    ----------
    geometry : [channels, 2] array
        Contact positions in µm, row i for the binary's channel i.
    shank_ids : [channels] int array, optional
        Each channel's shank (0-based); all on shank 0 when not given.

    Returns
    -------
    dict
        ``chanMap`` (0..channels−1), ``xc``, ``yc`` (µm), ``kcoords`` (the shank, as a
        float, as Kilosort keeps it) and ``n_chan``.

    Raises
    ------
    RecordingError
        Positions that are not [channels, 2] finite numbers, or shanks that are not one
        non-negative integer per channel.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io.kilosort import kilosort_probe
    >>> kilosort_probe(np.array([[0.0, 0.0], [250.0, 0.0]]), shank_ids=[0, 1])["kcoords"]
    [0.0, 1.0]
    """
    g = _checked_geometry(geometry)
    shanks = _checked_shanks(shank_ids, len(g))
    return {"chanMap": list(range(len(g))), "xc": g[:, 0].tolist(), "yc": g[:, 1].tolist(),
            "kcoords": shanks.astype(np.float64).tolist(), "n_chan": int(len(g))}


def write_kilosort_probe(path: str | os.PathLike, geometry: Any,
                         shank_ids: Any = None) -> Path:
    """Kilosort4's JSON probe (`kilosort_probe`), which ``kilosort.io.load_probe`` and the
    Kilosort4 GUI read (the file name must end in ``.json``).

    Parameters
    ----------
    path : path
        The file to write (``.json``).
    geometry, shank_ids :
        As for `kilosort_probe`.

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import json, os, tempfile
    >>> import numpy as np
    >>> from dspk.io.kilosort import write_kilosort_probe
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = write_kilosort_probe(os.path.join(tmp.name, "chanMap.json"),
    ...                             np.array([[0.0, 0.0], [0.0, 20.0]]))
    >>> sorted(json.loads(path.read_text()))
    ['chanMap', 'kcoords', 'n_chan', 'xc', 'yc']
    >>> tmp.cleanup()
    """
    path = Path(path)
    if path.suffix.lower() != ".json":
        raise RecordingError(f"{path}: Kilosort4 reads a JSON probe only from a file named "
                             f"*.json")
    path.write_text(json.dumps(kilosort_probe(geometry, shank_ids), indent=1) + "\n")
    return path


def write_chanmap_mat(path: str | os.PathLike, geometry: Any, shank_ids: Any = None,
                      fs: float | None = None, name: str = "dspk") -> Path:
    """The ``chanMap.mat`` of Kilosort 2, 2.5 and 3 (Kilosort4 reads it too): ``chanMap``
    (1-based, as MATLAB counts), ``chanMap0ind``, ``connected`` (all true), ``xcoords``,
    ``ycoords`` (µm), ``kcoords`` (the shank, 1-based) and, when given, ``fs``; column
    vectors of doubles, as MATLAB saves them.

    Parameters
    ----------
    path : path
        The file to write (``.mat``).
    geometry, shank_ids :
        As for `kilosort_probe`.
    fs : float, optional
        The sampling rate in Hz.
    name : str
        The probe's name (``name``).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from scipy.io import loadmat
    >>> from dspk.io.kilosort import write_chanmap_mat
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = write_chanmap_mat(os.path.join(tmp.name, "chanMap.mat"),
    ...                          np.array([[0.0, 0.0], [0.0, 20.0]]), fs=30000.0)
    >>> loadmat(path)["chanMap"].ravel().tolist()
    [1.0, 2.0]
    >>> tmp.cleanup()
    """
    from scipy.io import savemat  # noqa: PLC0415 (scipy.io loaded when a .mat is written)

    g = _checked_geometry(geometry)
    shanks = _checked_shanks(shank_ids, len(g))
    n = len(g)
    column = np.arange(n, dtype=np.float64)[:, None]
    contents = {"chanMap": column + 1.0, "chanMap0ind": column.copy(),
                "connected": np.ones((n, 1), dtype=bool),
                "xcoords": g[:, :1].copy(), "ycoords": g[:, 1:].copy(),
                "kcoords": shanks.astype(np.float64)[:, None] + 1.0, "name": str(name)}
    if fs is not None:
        contents["fs"] = float(fs)
    path = Path(path)
    savemat(str(path), contents)
    return path


def write_probeinterface(path: str | os.PathLike, geometry: Any, shank_ids: Any = None,
                         contact_ids: Sequence[Any] | None = None) -> Path:
    """The probe as probeinterface JSON (``probeinterface.read_probeinterface`` and
    SpikeInterface's ``set_probe`` read it): one planar probe in µm whose contact i is
    wired to device channel i (the binary's column i), with its shank and contact id.
    dspk knows positions, not the contacts' shapes: they are written as probeinterface's
    default (circles of radius 10 µm).

    Parameters
    ----------
    path : path
        The file to write (``.json``).
    geometry, shank_ids :
        As for `kilosort_probe`.
    contact_ids : sequence, optional
        Each contact's id (strings; default ``"0"``, ``"1"``, ...).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from dspk.io import read_probe
    >>> from dspk.io.kilosort import write_probeinterface
    >>> tmp = tempfile.TemporaryDirectory()
    >>> geometry = np.array([[0.0, 0.0], [0.0, 20.0]])
    >>> path = write_probeinterface(os.path.join(tmp.name, "probe.json"), geometry)
    >>> read_probe(path).tolist()
    [[0.0, 0.0], [0.0, 20.0]]
    >>> tmp.cleanup()
    """
    # probeinterface imports requests and its probe library (~0.2 s): loaded when a probe is
    # written, so that `import dspk` stays light
    from probeinterface import Probe, ProbeGroup, write_probeinterface as write  # noqa: PLC0415

    g = _checked_geometry(geometry)
    shanks = _checked_shanks(shank_ids, len(g))
    ids = [str(i) for i in range(len(g))] if contact_ids is None else \
        [str(v) for v in contact_ids]
    if len(ids) != len(g):
        raise RecordingError(f"contact_ids: expected {len(g)} ids (one per channel), got "
                             f"{len(ids)}")
    probe = Probe(ndim=2, si_units="um")
    probe.set_contacts(positions=g, shank_ids=[str(s) for s in shanks])
    probe.set_contact_ids(ids)
    probe.set_device_channel_indices(np.arange(len(g)))
    group = ProbeGroup()
    group.add_probe(probe)
    path = Path(path)
    write(str(path), group)
    return path


def write_phy_params(path: str | os.PathLike, dat_path: str, n_channels: int, dtype: Any,
                     fs: float, offset: int = 0, hp_filtered: bool = True) -> Path:
    """Phy's ``params.py``: where the traces are and how to read them (``dat_path``,
    ``n_channels_dat``, ``dtype``, ``offset``, ``sample_rate``, ``hp_filtered``), as Python
    literals (Phy executes the file).

    Parameters
    ----------
    path : path
        The file to write (``params.py``).
    dat_path : str
        The flat binary, relative to the folder of ``params.py`` (Phy resolves it there) or
        absolute.
    n_channels : int
        Channels per sample of the binary.
    dtype : int16, uint16, int32 or float32
        Its sample type (`PHY_DTYPES`).
    fs : float
        The sampling rate in Hz.
    offset : int
        Bytes before the first sample.
    hp_filtered : bool
        Whether the traces are high-pass filtered already (Phy filters them otherwise).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import os, tempfile
    >>> from dspk.io.kilosort import write_phy_params
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = write_phy_params(os.path.join(tmp.name, "params.py"), "traces.bin", 32,
    ...                         "int16", 30000.0)
    >>> params = {}
    >>> exec(path.read_text(), {}, params)
    >>> params["dat_path"], params["n_channels_dat"], params["sample_rate"]
    ('traces.bin', 32, 30000.0)
    >>> tmp.cleanup()
    """
    dtype = np.dtype(dtype).name
    if dtype not in PHY_DTYPES:
        raise RecordingError(f"dtype: expected one of {', '.join(PHY_DTYPES)} (what Kilosort "
                             f"and Phy read), got {dtype}")
    if int(n_channels) < 1:
        raise RecordingError(f"n_channels: expected at least 1 channel, got {n_channels}")
    if not (np.isfinite(fs) and fs > 0):
        raise RecordingError(f"fs: expected a positive sampling rate in Hz, got {fs}")
    if int(offset) < 0:
        raise RecordingError(f"offset: expected a byte offset >= 0, got {offset}")
    values = {"dat_path": str(dat_path), "n_channels_dat": int(n_channels), "dtype": dtype,
              "offset": int(offset), "sample_rate": float(fs), "hp_filtered": bool(hp_filtered)}
    path = Path(path)
    path.write_text("".join(f"{k} = {v!r}\n" for k, v in values.items()))
    return path
