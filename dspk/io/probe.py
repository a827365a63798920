"""Probe geometry from files and probe objects: contact positions in µm, one row per recording
channel, without probeinterface at run time.

Read: probeinterface JSON, Klusta/Phy ``.prb`` files (literal assignments only: parsed, never
executed), CSV/TSV/whitespace tables of ``x, y`` or ``channel, x, y``, and ``.npy`` arrays.
A probeinterface ``Probe`` or ``ProbeGroup`` object is read through the same rules.

>>> import numpy as np
>>> from dspk.io.probe import probe_positions
>>> class Probe:                                  # what a probeinterface Probe carries
...     contact_positions = np.array([[0.0, 0.0], [0.0, 20.0], [16.0, 0.0]])
...     device_channel_indices = np.array([2, 0, 1])
>>> probe_positions(Probe()).tolist()             # row i: device channel i
[[0.0, 20.0], [16.0, 0.0], [0.0, 0.0]]
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import warnings
from typing import Any

import numpy as np

from ..argnames import arg
from .errors import RecordingError, RecordingWarning

__all__ = ["read_probe", "probe_positions", "check_distinct_positions", "stored_geometry"]

log = logging.getLogger("dspk.io")

#: the longest ``range(...)`` a .prb file may build (more is not a probe)
MAX_PRB_RANGE = 1 << 20
#: µm per unit of probeinterface's ``si_units``
UNITS_UM = {"um": 1.0, "µm": 1.0, "mm": 1000.0}


def read_probe(path: str | os.PathLike, n_channels: int | None = None) -> np.ndarray:
    """Contact positions in µm from a probe file, row i for recording channel i.

    Parameters
    ----------
    path : str or path-like
        One of:

        - ``.json``: probeinterface's format (``{"specification": "probeinterface",
          "probes": [...]}``). Contacts are ordered by ``device_channel_indices`` when the
          probes have them (unconnected contacts, −1, dropped; several probes concatenated by
          device channel), else taken in file order, probe after probe; ``si_units`` "mm"
          converted to µm.
        - ``.prb``: the Klusta/Phy dictionary ``channel_groups = {0: {"channels": [...],
          "geometry": {channel: (x, y)}}}``. The file is parsed, never executed: only
          assignments of literals are read (plus ``range``/``list(range(...))`` and names
          assigned earlier in the file); anything else is refused.
        - ``.csv``, ``.tsv``, ``.txt``: one contact per line, ``x, y`` (row i is channel i)
          or ``channel, x, y``; separated by commas, tabs, semicolons or spaces; an optional
          header line; ``#`` comments.
        - ``.npy``: a [channels, 2] array.
    n_channels : int, optional
        The recording's channel count: the file must describe exactly these channels.

    Returns
    -------
    numpy.ndarray
        [channels, 2] float64 (x, y) in µm.

    Raises
    ------
    FileNotFoundError
        A path that does not exist.
    RecordingError
        A file that cannot be read as a probe (the message names the file and what was
        expected): unknown type, code in a .prb, a table with the wrong number of columns,
        positions that are not finite, device channels missing or repeated, a channel
        count other than ``n_channels``, or two channels at the same position.

    Examples
    --------
    >>> import json, os, tempfile
    >>> from dspk.io import read_probe
    >>> tmp = tempfile.TemporaryDirectory()
    >>> csv = os.path.join(tmp.name, "probe.csv")
    >>> with open(csv, "w") as f:
    ...     _ = f.write("x,y\\n0,0\\n0,20\\n32,0\\n")
    >>> read_probe(csv)
    array([[ 0.,  0.],
           [ 0., 20.],
           [32.,  0.]])

    A probeinterface JSON file whose contacts are wired out of order:

    >>> path = os.path.join(tmp.name, "probe.json")
    >>> with open(path, "w") as f:
    ...     json.dump({"specification": "probeinterface", "version": "0.2.0",
    ...                "probes": [{"ndim": 2, "si_units": "um",
    ...                            "contact_positions": [[0, 0], [0, 20], [0, 40]],
    ...                            "device_channel_indices": [1, 2, 0]}]}, f)
    >>> read_probe(path, n_channels=3)[:, 1]          # device channel 0 is the 3rd contact
    array([40.,  0., 20.])

    A .prb file (literals only):

    >>> prb = os.path.join(tmp.name, "tetrode.prb")
    >>> with open(prb, "w") as f:
    ...     _ = f.write("channel_groups = {0: {'channels': [0, 1, 2, 3],\\n"
    ...                 "    'geometry': {0: (0, 0), 1: (20, 0), 2: (0, 20), 3: (20, 20)}}}\\n")
    >>> read_probe(prb).shape
    (4, 2)
    >>> tmp.cleanup()
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such probe file")
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".npy":
        try:
            g = np.load(path, allow_pickle=False)
        except ValueError as e:
            raise RecordingError(f"{path}: not a plain .npy array of positions ({e})") from None
        return _checked(g, n_channels, path)
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        text = f.read()
    if suffix == ".json" or (suffix not in (".prb", ".csv", ".tsv", ".txt")
                             and text.lstrip().startswith("{")):
        return _checked(_from_json(text, n_channels, path), n_channels, path)
    if suffix == ".prb":
        return _checked(_from_prb(text, n_channels, path), n_channels, path)
    if suffix in (".csv", ".tsv", ".txt"):
        return _checked(_from_table(text, n_channels, path), n_channels, path)
    raise RecordingError(f"{path}: unknown probe file type {suffix!r}; expected .json "
                         f"(probeinterface), .prb, .csv/.tsv/.txt (x, y per line) or .npy")


def probe_positions(probe: Any, n_channels: int | None = None,
                    source: str = "geometry") -> np.ndarray:
    """Positions in µm of a probeinterface ``Probe`` or ``ProbeGroup`` (or any object with
    their attributes), row i for device channel i.

    Parameters
    ----------
    probe : probeinterface Probe or ProbeGroup
        ``contact_positions`` ([contacts, 2]), and optionally ``device_channel_indices``
        (−1: not connected) and ``si_units``; a group: ``probes``, a list of those.
    n_channels : int, optional
        The recording's channel count, which the wired channels must match.
    source : str
        Named in error messages.

    Returns
    -------
    numpy.ndarray
        [channels, 2] float64.

    Raises
    ------
    RecordingError
        Not a probe, device channels missing or repeated, positions that are not finite, a
        channel count other than ``n_channels``, or two channels at the same position.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io.probe import probe_positions
    >>> class Probe:
    ...     contact_positions = np.array([[0.0, 0.0], [0.0, 20.0]])
    ...     device_channel_indices = None                 # not wired: contact order
    >>> probe_positions(Probe()).tolist()
    [[0.0, 0.0], [0.0, 20.0]]
    """
    probes = list(probe.probes) if hasattr(probe, "probes") else [probe]
    parts = []
    for p in probes:
        pos = getattr(p, "contact_positions", None)
        if pos is None:
            raise RecordingError(f"{source}: expected a probeinterface Probe (with "
                                 f"contact_positions), got {type(p).__name__}")
        parts.append((pos, getattr(p, "device_channel_indices", None),
                      getattr(p, "si_units", "um")))
    return _checked(_arrange(parts, n_channels, source), n_channels, source)


# -- ordering and checks --------------------------------------------------------------------------
def _arrange(parts: list[tuple[Any, Any, Any]], n_channels: int | None,
             source: str) -> np.ndarray:
    """[channels, 2] from (positions, device channels or None, units) per probe: in
    device-channel order when every probe is wired, else concatenated in order."""
    positions, wiring = [], []
    for i, (pos, dci, units) in enumerate(parts):
        scale = UNITS_UM.get(str(units or "um"))
        if scale is None:
            raise RecordingError(f"{source}: probe {i} has si_units {units!r}; expected one of "
                                 f"{sorted(UNITS_UM)}")
        try:
            p = np.asarray(pos, dtype=np.float64) * scale
        except (TypeError, ValueError):
            raise RecordingError(f"{source}: probe {i}'s contact positions are not numbers") \
                from None
        if p.ndim != 2 or p.shape[1] != 2:
            raise RecordingError(f"{source}: probe {i}: expected [contacts, 2] (x, y) "
                                 f"positions, got shape {p.shape}")
        positions.append(p)
        if dci is not None:
            d = np.asarray(dci)
            if d.shape != (len(p),) or (d.size and d.dtype.kind not in "iuf") or \
                    (d.dtype.kind == "f" and not np.all(d == np.round(d))):
                raise RecordingError(f"{source}: probe {i}: expected {len(p)} integer "
                                     f"device_channel_indices, got {dci!r:.80}")
            wiring.append(d.astype(np.int64))
    if not wiring:
        return np.concatenate(positions) if positions else np.zeros((0, 2))
    if len(wiring) != len(positions):
        raise RecordingError(f"{source}: some probes have device_channel_indices and some do "
                             f"not; row i must be device channel i, so set them on every probe")
    pos, dci = np.concatenate(positions), np.concatenate(wiring)
    return _by_channel(pos[dci >= 0], dci[dci >= 0], n_channels, source,
                       "device_channel_indices")


def _by_channel(pos: np.ndarray, chans: np.ndarray, n_channels: int | None, source: str,
                what: str) -> np.ndarray:
    """Rows ordered so that row i is channel i; every channel 0..n-1 exactly once."""
    if chans.size == 0:
        return np.zeros((0, 2))
    n = int(n_channels) if n_channels is not None else int(chans.max()) + 1
    uniq, counts = np.unique(chans, return_counts=True)
    if np.any(counts > 1):
        raise RecordingError(f"{source}: {what}: channel(s) {_few(uniq[counts > 1])} appear "
                             f"more than once")
    extra = chans[chans >= n]
    if extra.size:
        raise RecordingError(f"{source}: {what}: channel(s) {_few(np.sort(extra))} outside "
                             f"0..{n - 1} (the recording has {n} channels)")
    missing = np.setdiff1d(np.arange(n), chans)
    if missing.size:
        raise RecordingError(f"{source}: {what}: no position for channel(s) {_few(missing)}; "
                             f"expected each of 0..{n - 1} once (row i is channel i)")
    out = np.empty((n, 2))
    out[chans] = pos
    return out


def _few(values: np.ndarray, k: int = 10) -> str:
    vals = [str(int(v)) for v in values[:k]]
    return ", ".join(vals) + (f", ... ({len(values)} in all)" if len(values) > k else "")


def _checked(g: Any, n_channels: int | None, source: str) -> np.ndarray:
    try:
        g = np.asarray(g, dtype=np.float64)
    except (TypeError, ValueError):
        raise RecordingError(f"{source}: positions are not numbers") from None
    if g.ndim != 2 or g.shape[1] != 2 or g.shape[0] < 1:
        raise RecordingError(f"{source}: expected [channels, 2] (x, y) positions in µm, got "
                             f"shape {g.shape}")
    if not np.all(np.isfinite(g)):
        bad = np.flatnonzero(~np.all(np.isfinite(g), axis=1))
        raise RecordingError(f"{source}: positions must be finite; channel(s) {_few(bad)} "
                             f"are not")
    if n_channels is not None and g.shape[0] != int(n_channels):
        raise RecordingError(f"{source}: {g.shape[0]} channel positions, expected "
                             f"{int(n_channels)} (one per recording channel)")
    return check_distinct_positions(g, source)


def check_distinct_positions(positions: np.ndarray, source: str = "geometry") -> np.ndarray:
    """``positions``, refused when two channels sit at the same (x, y): a probe's contacts
    are at distinct places, so coincident ones are a wrong or placeholder geometry (all
    zeros, say) that would make every spatial step (neighbours, local whitening) silently
    wrong.

    Parameters
    ----------
    positions : numpy.ndarray
        [channels, 2] finite (x, y) in µm, row i for channel i.
    source : str
        Where the positions come from, named in the error.

    Returns
    -------
    numpy.ndarray
        ``positions`` itself.

    Raises
    ------
    RecordingError
        Two channels or more at one position: the message names a few such pairs of channels
        and their position, and how many positions are shared.

    Examples
    --------
    >>> import numpy as np
    >>> from dspk.io.probe import check_distinct_positions
    >>> check_distinct_positions(np.array([[0.0, 0.0], [0.0, 20.0]])).shape
    (2, 2)
    >>> check_distinct_positions(np.zeros((4, 2)), "probe.csv")    # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dspk.io.errors.RecordingError: probe.csv: channels 0, 1, 2 and 3 are all at (0, 0) µm: ...
    """
    if len(positions) < 2:
        return positions
    _, first, inverse, counts = np.unique(positions, axis=0, return_index=True,
                                          return_inverse=True, return_counts=True)
    shared = np.flatnonzero(counts > 1)
    if shared.size == 0:
        return positions
    inverse = inverse.reshape(-1)
    # the shared positions in the order their first channel appears
    shared = shared[np.argsort(first[shared])]
    groups = []
    for u in shared[:3]:
        chans = np.flatnonzero(inverse == u)
        x, y = positions[chans[0]]
        if len(chans) == 2:
            who = f"channels {chans[0]} and {chans[1]} are both"
        else:
            listed = ", ".join(str(c) for c in chans[:min(len(chans) - 1, 4)])
            last = f" and {chans[-1]}" if len(chans) <= 5 else f", ... ({len(chans)} in all)"
            who = f"channels {listed}{last} are all"
        groups.append(f"{who} at ({x:g}, {y:g}) µm")
    more = f"; {shared.size} positions are shared in all" if shared.size > 3 else ""
    raise RecordingError(f"{source}: {'; '.join(groups)}{more}: the contacts of a probe are at "
                         f"distinct positions (a placeholder geometry, or the wrong probe?)")


def stored_geometry(positions: Any, source: str) -> np.ndarray | None:
    """The geometry a file stores, or None with a `RecordingWarning` when its contacts are
    not at distinct positions: files often carry a placeholder (NWB electrodes with every
    ``rel_x``, ``rel_y`` at 0), which must not reach a spatial step, and must not stop the
    file from being read either (a geometry a user gives is refused instead:
    `check_distinct_positions`).

    Parameters
    ----------
    positions : array or None
        [channels, 2] positions in µm, as the file stores them.
    source : str
        The file (and dataset), named in the warning.

    Returns
    -------
    numpy.ndarray or None

    Examples
    --------
    >>> import warnings
    >>> import numpy as np
    >>> from dspk.io.probe import stored_geometry
    >>> stored_geometry(np.c_[np.zeros(2), [0.0, 20.0]], "a.nwb").shape
    (2, 2)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     stored_geometry(np.zeros((4, 2)), "a.nwb") is None
    True
    >>> print(caught[0].message)                       # doctest: +ELLIPSIS
    a.nwb: channels 0, 1, 2 and 3 are all at (0, 0) µm: ...; the file's geometry is not used ...
    """
    if positions is None:
        return None
    g = np.asarray(positions, dtype=np.float64)
    if g.ndim != 2 or g.shape[1] != 2 or not np.all(np.isfinite(g)):
        return g              # the recording's own checks name what is wrong with it
    try:
        return check_distinct_positions(g, source)
    except RecordingError as exc:
        message = (f"{exc}; the file's geometry is not used (give one with "
                   f"{arg('geometry')} to the steps that need one)")
        warnings.warn(message, RecordingWarning, stacklevel=3)
        log.warning("%s", message)
        return None


# -- probeinterface JSON --------------------------------------------------------------------------
def _from_json(text: str, n_channels: int | None, path: str) -> np.ndarray:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordingError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("specification") != "probeinterface" or \
            not isinstance(data.get("probes"), list):
        raise RecordingError(f"{path}: expected probeinterface JSON ({{\"specification\": "
                             f"\"probeinterface\", \"probes\": [...]}})")
    parts = []
    for i, p in enumerate(data["probes"]):
        if not isinstance(p, dict) or "contact_positions" not in p:
            raise RecordingError(f"{path}: probe {i} has no contact_positions")
        if int(p.get("ndim", 2)) != 2:
            raise RecordingError(f"{path}: probe {i} is {p.get('ndim')}-D; expected a planar "
                                 f"(ndim 2) probe")
        parts.append((p["contact_positions"], p.get("device_channel_indices"),
                      p.get("si_units", "um")))
    if not parts:
        raise RecordingError(f"{path}: the file holds no probe")
    return _arrange(parts, n_channels, path)


# -- .prb (Klusta / Phy) --------------------------------------------------------------------------
def _from_prb(text: str, n_channels: int | None, path: str) -> np.ndarray:
    names = _prb_assignments(text, path)
    groups = names.get("channel_groups")
    if not isinstance(groups, dict) or not groups:
        raise RecordingError(f"{path}: expected a channel_groups = {{group: {{'channels': [...], "
                             f"'geometry': {{channel: (x, y)}}}}}} assignment")
    chans, pos = [], []
    for key, group in groups.items():
        if not isinstance(group, dict) or "geometry" not in group:
            raise RecordingError(f"{path}: channel group {key!r} has no 'geometry'")
        geom = group["geometry"]
        listed = group.get("channels")
        if isinstance(geom, dict):
            listed = list(geom) if listed is None else list(listed)
            missing = [c for c in listed if c not in geom]
            if missing:
                raise RecordingError(f"{path}: channel group {key!r}: no geometry for "
                                     f"channel(s) {missing[:10]}")
            xy = [geom[c] for c in listed]
        elif isinstance(geom, (list, tuple)) and listed is not None and \
                len(geom) == len(listed):
            listed, xy = list(listed), list(geom)       # positions in the channels' order
        else:
            raise RecordingError(f"{path}: channel group {key!r}: expected 'geometry' as "
                                 f"{{channel: (x, y)}} (or a list as long as 'channels')")
        if any(not isinstance(c, int) or isinstance(c, bool) for c in listed):
            raise RecordingError(f"{path}: channel group {key!r}: channels must be integers")
        chans += listed
        pos += [_pair(v, path, key) for v in xy]
    return _by_channel(np.asarray(pos, dtype=np.float64).reshape(-1, 2),
                       np.asarray(chans, dtype=np.int64), n_channels, path, "channel_groups")


def _pair(v: Any, path: str, group: Any) -> tuple[float, float]:
    if not isinstance(v, (list, tuple)) or len(v) != 2 or \
            not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in v):
        raise RecordingError(f"{path}: channel group {group!r}: expected (x, y) positions, "
                             f"got {v!r}")
    return float(v[0]), float(v[1])


def _prb_assignments(text: str, path: str) -> dict[str, Any]:
    """The names a .prb file assigns, evaluated without executing it: a module of
    ``name = <literal>`` statements; anything else is refused (a .prb is data)."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as e:
        raise RecordingError(f"{path}: not a Python-literal .prb file (line {e.lineno}: "
                             f"{e.msg})") from None
    names: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, str):
            continue                                      # a docstring
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            value = _literal(node.value, names, path)
            for t in node.targets:
                names[t.id] = value
            continue
        raise RecordingError(f"{path}, line {node.lineno}: refused "
                             f"{ast.unparse(node)[:60]!r}: a .prb file is read, not run, and "
                             f"may only assign literals (name = {{...}})")
    return names


def _literal(node: ast.AST, names: dict[str, Any], path: str) -> Any:
    """A literal (numbers, strings, tuples, lists, dicts; unary/binary arithmetic on numbers),
    a name assigned before, ``range(...)`` or ``list(range(...))``; else RecordingError."""
    def ev(n: ast.AST) -> Any:
        return _literal(n, names, path)

    if isinstance(node, ast.Constant) and (node.value is None or
                                           isinstance(node.value, (int, float, str, bool))):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [ev(e) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Dict) and None not in node.keys:
        out = {}
        for k, v in zip(node.keys, node.values):
            key = ev(k)
            if isinstance(key, list):
                raise _refused(node, path, "a list as a dict key")
            out[key] = ev(v)
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = ev(node.operand)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        a, b = ev(node.left), ev(node.right)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
            return a + b if isinstance(node.op, ast.Add) else \
                a - b if isinstance(node.op, ast.Sub) else a * b
    if isinstance(node, ast.Name):
        if node.id in names:
            return names[node.id]
        raise _refused(node, path, f"the name {node.id!r} (not assigned before)")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords \
            and node.func.id in ("range", "list"):
        args = [ev(a) for a in node.args]
        if node.func.id == "range" and 1 <= len(args) <= 3 and \
                all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            r = range(*args)
            if len(r) > MAX_PRB_RANGE:
                raise _refused(node, path, f"a range of {len(r)} channels")
            return list(r)
        if node.func.id == "list" and len(args) == 1 and isinstance(args[0], (list, tuple)):
            return list(args[0])
    scalar = _numpy_scalar(node, ev)
    if scalar is not None:
        return scalar
    raise _refused(node, path, "an expression that is not a literal")


#: NumPy scalar types whose repr a .prb may hold: probeinterface's write_prb formats NumPy
#: values with repr, which NumPy 2 spells ``np.int64(7)``, ``np.float64(20.0)`` (NEP 51)
_NUMPY_SCALARS = {**{t: int for t in ("int8", "int16", "int32", "int64", "uint8", "uint16",
                                      "uint32", "uint64", "intc", "intp", "int_", "uint",
                                      "longlong", "ulonglong", "short", "ushort", "byte",
                                      "ubyte")},
                  **{t: float for t in ("float16", "float32", "float64", "half", "single",
                                        "double", "longdouble", "float_")},
                  "str_": str, "bool_": bool}


def _numpy_scalar(node: ast.AST, ev: Any) -> Any:
    """``np.int64(7)`` / ``numpy.float64(2.5)`` / ``np.str_('a')``: the Python value of a
    NumPy scalar's repr whose argument is itself a literal of its kind, or None. Nothing is
    called: the type's name picks int, float, str or bool."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and
            isinstance(node.func.value, ast.Name) and node.func.value.id in ("np", "numpy")
            and node.func.attr in _NUMPY_SCALARS and len(node.args) == 1
            and not node.keywords):
        return None
    kind = _NUMPY_SCALARS[node.func.attr]
    v = ev(node.args[0])
    if kind is int and isinstance(v, int) and not isinstance(v, bool):
        return v
    if kind is float and isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if kind is str and isinstance(v, str):
        return v
    if kind is bool and isinstance(v, bool):
        return v
    return None


def _refused(node: ast.AST, path: str, what: str) -> RecordingError:
    return RecordingError(f"{path}, line {getattr(node, 'lineno', '?')}: refused {what} "
                          f"({ast.unparse(node)[:60]!r}): a .prb file is read, not run, and may "
                          f"only assign literals")


# -- CSV / TSV tables -----------------------------------------------------------------------------
_SEP = re.compile(r"\s*[,;\t]\s*|\s+")


def _from_table(text: str, n_channels: int | None, path: str) -> np.ndarray:
    rows, ncols, first = [], None, True
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f for f in _SEP.split(line) if f != ""]
        try:
            values = [float(f) for f in fields]
        except ValueError:
            if first:                                     # a header line
                first = False
                continue
            raise RecordingError(f"{path}, line {lineno}: expected numbers, got {line!r}") \
                from None
        first = False
        if len(values) not in (2, 3):
            raise RecordingError(f"{path}, line {lineno}: {len(values)} columns; expected 2 "
                                 f"(x, y) or 3 (channel, x, y)")
        if ncols is not None and len(values) != ncols:
            raise RecordingError(f"{path}, line {lineno}: {len(values)} columns where the "
                                 f"lines before have {ncols}")
        ncols = len(values)
        rows.append(values)
    if not rows:
        raise RecordingError(f"{path}: no positions (expected x, y per line)")
    table = np.asarray(rows, dtype=np.float64)
    if ncols == 2:
        return table
    chans = table[:, 0]
    if not np.all(np.isfinite(chans)) or not np.all(chans == np.round(chans)):
        raise RecordingError(f"{path}: the first of 3 columns is the channel and must hold "
                             f"integers")
    return _by_channel(table[:, 1:], chans.astype(np.int64), n_channels, path, "channel column")
