"""The prebuilt kernels shipped with dspk: one fatbin per CUDA source (``prebuilt/<name>.fatbin``,
SASS for the common architectures and PTX for the newest, built by nvcc:
``python -m dspk.kernels.build``) and its table (``prebuilt/<name>.json``): the template
instances compiled for each architecture, each instance's mangled name, and the hash of the
text they were compiled from.

`dspk.kernels.kernel` takes a kernel from the fatbin when the table matches the sources (the
same text, the same options) and the fatbin holds an image for the device; otherwise NVRTC
compiles it, as without prebuilt kernels. This module decides which: reading and checking a
table, choosing the image the CUDA driver will run. It imports only the standard library
(the wheel's build hook, ``setup.py``, loads it by path to find stale tables).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent
#: where the fatbins and their tables are (package data)
PREBUILT_DIR = KERNEL_DIR / "prebuilt"
#: the format of the tables this module reads
TABLE_VERSION = 1
#: NVRTC's options for every source (CuPy appends ``-ftz=true``, the architecture and, where
#: the source has no execution space annotation to give, ``--device-as-default-execution-space``)
NVRTC_OPTIONS = ("-std=c++17",)
#: nvcc's, for the same code as NVRTC's: CuPy's ``-ftz=true``; IEEE division and square root
#: and contraction into FMA as NVRTC's defaults (nvcc's too, spelled out so that a changed
#: default could not change the bits); every function of the sources is annotated, so nvcc
#: needs no ``--device-as-default-execution-space`` (an NVRTC-only option)
NVCC_OPTIONS = (*NVRTC_OPTIONS, "-ftz=true", "-prec-div=true", "-prec-sqrt=true", "-fmad=true")
#: the architectures the fatbins hold SASS for, and the PTX for devices newer than those
SASS_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
PTX_ARCH = "compute_120"

#: a source's include of a header of this folder: ``#include "name.cuh"``
INCLUDE = re.compile(r'^#include "([A-Za-z0-9_]+\.cuh)"[ \t]*$', re.MULTILINE)


def paste_headers(text: str, pasted: set | None = None) -> str:
    """``text`` with each include of a header of this folder replaced by the header's own
    text (its includes pasted too), each header once: what NVRTC compiles, with no include
    path, and what the tables' hashes are taken of."""
    pasted = set() if pasted is None else pasted

    def paste(m: re.Match) -> str:
        name = m.group(1)
        if name in pasted:
            return ""
        pasted.add(name)
        return paste_headers((KERNEL_DIR / name).read_text(), pasted)

    return INCLUDE.sub(paste, text)


def text_hash(text: str) -> str:
    """The hash a table records of the text its fatbin was compiled from (SHA-256, hex)."""
    return hashlib.sha256(text.encode()).hexdigest()


def stem(filename: str) -> str:
    """``"ncc.cu"`` -> ``"ncc"``: the name of the file's fatbin and table."""
    return Path(filename).name.removesuffix(".cu")


def read_table(filename: str, directory: Path = PREBUILT_DIR) -> dict | None:
    """The table of ``filename``'s prebuilt fatbin in ``directory`` (None if there is none)."""
    path = Path(directory) / f"{stem(filename)}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def stale(table: dict | None, text: str, directory: Path = PREBUILT_DIR) -> str | None:
    """Why the fatbin of ``table`` cannot stand for the source text ``text`` (None if it
    can): no table, another table format, another text (the sources changed since the
    build), other options, or its fatbin missing or not the one built with the table."""
    if table is None:
        return "no prebuilt fatbin"
    if table.get("version") != TABLE_VERSION:
        return f"a table of format {table.get('version')} (this dspk reads {TABLE_VERSION})"
    if table["source_sha256"] != text_hash(text):
        return "the sources changed since the fatbin was built"
    if tuple(table["nvcc_options"]) != NVCC_OPTIONS:
        return f"built with other options ({' '.join(table['nvcc_options'])})"
    fatbin = Path(directory) / table["fatbin"]
    if not fatbin.is_file() or fatbin.stat().st_size != table["fatbin_bytes"]:
        return f"{fatbin.name} missing or not the one built with its table"
    return None


def _cc(arch: str) -> tuple[int, int]:
    """``"sm_86"`` or ``"compute_120"`` -> (8, 6), (12, 0)."""
    number = int(arch.split("_")[1])
    return number // 10, number % 10


def image_for(table: dict, cc: tuple[int, int], driver: int) -> tuple[str | None, str]:
    """The image of ``table``'s fatbin the CUDA driver runs on a device of compute capability
    ``cc`` under a driver of version ``driver`` (``cudaDriverGetVersion``: 13000 for 13.0),
    and a phrase saying which or why none.

    The driver takes the SASS of the device's major version with the highest minor version
    not above the device's (``sm_86`` on an 8.9 device without ``sm_89``), else JIT-compiles
    the PTX when the device is at least its architecture. SASS needs a driver of the
    building toolkit's major version or later, PTX one of its version or later.

    Examples
    --------
    >>> table = {"archs": {"sm_80": [], "sm_86": [], "compute_120": []},
    ...          "cuda_version": [13, 0]}
    >>> image_for(table, (8, 7), 13000)
    ('sm_86', 'SASS sm_86')
    >>> image_for(table, (12, 1), 13020)
    ('compute_120', 'PTX compute_120, compiled by the driver')
    >>> image_for(table, (7, 5), 13000)[0] is None
    True
    >>> image_for(table, (8, 0), 12080)
    (None, 'driver 12.8 is older than the CUDA 13.0 that built the fatbin')
    """
    major, minor = table["cuda_version"]
    if driver < major * 1000:
        return None, (f"driver {driver // 1000}.{driver % 1000 // 10} is older than the CUDA "
                      f"{major}.{minor} that built the fatbin")
    sass = [a for a in table["archs"] if a.startswith("sm_") and _cc(a)[0] == cc[0] and
            _cc(a)[1] <= cc[1]]
    if sass:
        best = max(sass, key=_cc)
        return best, f"SASS {best}"
    ptx = [a for a in table["archs"] if a.startswith("compute_") and _cc(a) <= cc]
    if ptx:
        if driver < major * 1000 + minor * 10:
            return None, (f"PTX needs driver {major}.{minor} or later (this one: "
                          f"{driver // 1000}.{driver % 1000 // 10})")
        best = max(ptx, key=_cc)
        return best, f"PTX {best}, compiled by the driver"
    archs = ", ".join(table["archs"])
    return None, f"no image for compute capability {cc[0]}.{cc[1]} (the fatbin has {archs})"


def names(table: dict, arch: str) -> dict[str, str]:
    """Instance expression -> mangled name, for the instances ``table`` has for ``arch``."""
    return {e: table["names"][e] for e in table["archs"][arch]}


def find_nvcc() -> str | None:
    """nvcc on PATH, else in $CUDA_HOME or $CUDA_PATH, else in /usr/local/cuda (here, in this
    standard-library module, for `dspk.kernels.build` and the wheel's build hook alike)."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None
