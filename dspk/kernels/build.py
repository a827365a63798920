"""Build the prebuilt kernels with nvcc: ``python -m dspk.kernels.build`` (``--help``).

For each CUDA source of dspk, one nvcc call compiles every template instance dspk declares
for it (`dspk.kernels.declare_instances`) into one fatbin, ``prebuilt/<name>.fatbin``: SASS
for each of `fatbins.SASS_ARCHS` and PTX for `fatbins.PTX_ARCH`, with NVRTC's semantics
(`fatbins.NVCC_OPTIONS`), so a kernel computes the same bits as the one NVRTC compiles at
run time. An architecture's instances are those dspk declares on the cards of
`REFERENCE_DEVICES` (the lists depend on a device's shared memory: an instance a device
declares that its architecture's image lacks is compiled by NVRTC at first use).

Beside it goes its table, ``prebuilt/<name>.json`` (`fatbins`): the hash of the text compiled
(a changed source is never run from a stale fatbin), the options, the nvcc version, each
architecture's instances and each instance's mangled name. The names come from the compiler:
the build compiles a table of the instances' addresses (``void* const dspk_instances[] =
{(void*)&k<float, 4>, ...}``) and reads the relocations of nvcc's host object (`elf`), then
checks that each architecture's cubin defines every name it should.

This is a tool that runs above every layer of dspk: it imports the modules that declare the
instances (`declare_all`). The wheel's build hook (``setup.py``) runs it for stale tables when
nvcc is available; CI checks that the committed fatbins match the sources.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from . import CUDA_SOURCES, KERNEL_DIR, declared_files, declared_instances, elf
from .fatbins import (NVCC_OPTIONS, PREBUILT_DIR, PTX_ARCH, SASS_ARCHS, TABLE_VERSION,
                      find_nvcc, paste_headers, read_table, stale, stem, text_hash)

#: the modules whose import declares every source's instances (`dspk` imports all but one)
DECLARING_MODULES = ("dspk", "dspk.match")
#: the array of instance addresses the build compiles
ARRAY = "dspk_instances"


def _props(name: str, cc: str, sms: int, optin_kib: int, per_sm_kib: int, l2_mib: int) -> dict:
    major, minor = (int(x) for x in cc.split("."))
    return {"name": name, "major": major, "minor": minor, "multiProcessorCount": sms,
            "sharedMemPerBlockOptin": optin_kib << 10,
            "sharedMemPerMultiprocessor": per_sm_kib << 10, "sharedMemPerBlock": 48 << 10,
            "l2CacheSize": l2_mib << 20}


#: architecture -> the cards whose properties decide its instances (CUDA programming guide,
#: "Features and Technical Specifications": shared memory per block with opt-in and per SM;
#: the SM count and L2 size decide no instance today, given for completeness)
REFERENCE_DEVICES = {
    "sm_80": [_props("A100", "8.0", 108, 163, 164, 40)],
    "sm_86": [_props("GeForce RTX 3090", "8.6", 82, 99, 100, 6),
              _props("RTX A6000", "8.6", 84, 99, 100, 6)],
    "sm_89": [_props("L4", "8.9", 58, 99, 100, 48),
              _props("GeForce RTX 4090", "8.9", 128, 99, 100, 72)],
    "sm_90": [_props("H100 SXM", "9.0", 132, 227, 228, 50),
              _props("H200", "9.0", 132, 227, 228, 60)],
    "sm_100": [_props("B200", "10.0", 148, 227, 228, 126)],
    "sm_120": [_props("GeForce RTX 5090", "12.0", 170, 99, 100, 96)],
}
#: the PTX is compiled in the same pass as this SASS, with its instances
PTX_WITH = "sm_120"
#: the oldest nvcc that knows every architecture of `fatbins.SASS_ARCHS`
MIN_NVCC = (12, 8)


def declare_all() -> tuple[str, ...]:
    """Import the modules that declare the sources' instances; every source of the kernel
    folder must then be declared (else a RuntimeError names those that are not)."""
    for name in DECLARING_MODULES:
        importlib.import_module(name)
    missing = sorted({p.name for p in CUDA_SOURCES} - set(declared_files()))
    if missing:
        raise RuntimeError(f"no instances declared for {', '.join(missing)} after importing "
                           f"{', '.join(DECLARING_MODULES)}")
    return declared_files()


def instances_by_arch(filename: str, archs: Iterable[str] = SASS_ARCHS,
                      ptx: str | None = PTX_ARCH) -> dict[str, list[str]]:
    """Architecture -> the instances of ``filename`` compiled for it: those declared on any
    card of `REFERENCE_DEVICES` of the architecture (the PTX: those of `PTX_WITH`)."""
    found = {}
    for arch in archs:
        found[arch] = sorted({e for props in REFERENCE_DEVICES[arch]
                              for e in declared_instances(filename, props) or ()})
    if ptx is not None:
        found[ptx] = found[PTX_WITH] if PTX_WITH in found else sorted(
            {e for props in REFERENCE_DEVICES[PTX_WITH]
             for e in declared_instances(filename, props) or ()})
    return found


def _arch_number(arch: str) -> int:
    return int(arch.split("_")[1])


def instantiation_unit(include: Path, by_arch: dict[str, list[str]]) -> tuple[str, list[str]]:
    """A translation unit that includes ``include`` and takes the address of every instance
    of ``by_arch``, each only in the device passes of the architectures that list it (and in
    the host pass, which names them all); and the instances in the array's order."""
    archs_of: dict[str, set[int]] = {}
    for arch, exprs in by_arch.items():
        for e in exprs:
            archs_of.setdefault(e, set()).add(_arch_number(arch) * 10)
    every = {_arch_number(a) * 10 for a in by_arch}
    order = sorted(archs_of)
    lines = [f'#include "{include}"']
    if order:
        lines += [f"extern void* const {ARRAY}[];", f"void* const {ARRAY}[] = {{"]
        for e in order:
            if archs_of[e] == every:
                lines.append(f"    (void*)&{e},")
                continue
            cond = " || ".join(f"__CUDA_ARCH__ == {a}" for a in sorted(archs_of[e]))
            lines += [f"#if !defined(__CUDA_ARCH__) || {cond}", f"    (void*)&{e},", "#endif"]
        lines.append("};")
    return "\n".join(lines) + "\n", order


def gencode(archs: Iterable[str], ptx: str | None) -> list[str]:
    """nvcc's ``-gencode`` options: SASS for each of ``archs``, and PTX ``ptx`` (compiled in
    the pass of the SASS of its number where there is one)."""
    args = []
    for arch in archs:
        n = _arch_number(arch)
        code = f"[sm_{n},compute_{n}]" if ptx is not None and _arch_number(ptx) == n else \
            f"sm_{n}"
        args += ["-gencode", f"arch=compute_{n},code={code}"]
    if ptx is not None and _arch_number(ptx) not in {_arch_number(a) for a in archs}:
        args += ["-gencode", f"arch={ptx},code={ptx}"]
    return args


def nvcc_version(nvcc: str) -> tuple[int, int, int]:
    """``nvcc --version`` -> (13, 0, 88)."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"V(\d+)\.(\d+)\.(\d+)", out)
    if m is None:
        raise RuntimeError(f"cannot read the version of {nvcc}: {out!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def nvcc_command(nvcc: str, unit: Path, obj: Path, keep: Path, archs: Iterable[str],
                 ptx: str | None, threads: int = 1, extra: Iterable[str] = ()) -> list[str]:
    """The nvcc call that compiles ``unit`` into the host object ``obj``, keeping its
    intermediate files (the fatbin, each architecture's cubin) in ``keep``."""
    return [nvcc, *NVCC_OPTIONS, *gencode(archs, ptx), "--compress-mode=size",
            "--threads", str(threads), "--keep", "--keep-dir", str(keep), *extra,
            "-c", str(unit), "-o", str(obj)]


_CUBIN = re.compile(r"\.compute_(\d+)(?:\.sm_(\d+))?\.cubin$")


def kept_cubins(keep: Path, sass: Iterable[str] = ()) -> dict[str, Path]:
    """Architecture -> the cubin nvcc kept for it (``x.compute_90.cubin``,
    ``x.compute_120.sm_120.cubin``; for a single architecture ``sass``, nvcc names it
    ``x.cubin``)."""
    found = {}
    cubins = list(keep.glob("*.cubin"))
    for path in cubins:
        m = _CUBIN.search(path.name)
        if m:
            found[f"sm_{m.group(2) or m.group(1)}"] = path
    sass = list(sass)
    if not found and len(sass) == 1 and len(cubins) == 1:
        found[sass[0]] = cubins[0]
    return found


def compile_file(filename: str, workdir: Path, by_arch: dict[str, list[str]], nvcc: str,
                 ptx: str | None, threads: int = 1, extra: Iterable[str] = ()
                 ) -> tuple[dict[str, str], Path, dict[str, Path], Path]:
    """Compile ``filename``'s instances (``by_arch``: architecture -> instances) in one nvcc
    call in ``workdir``: instance -> mangled name, checked in every cubin that should define
    it; the fatbin; each architecture's cubin; the host object."""
    workdir.mkdir(parents=True, exist_ok=True)
    text = (KERNEL_DIR / filename).read_text()
    src = workdir / filename
    src.write_text(paste_headers(text))           # what NVRTC compiles, headers pasted
    unit_text, order = instantiation_unit(src, by_arch)
    unit = workdir / f"unit_{filename}"
    unit.write_text(unit_text)
    keep = workdir / "keep"
    keep.mkdir(exist_ok=True)
    obj = workdir / "unit.o"
    sass = [a for a in by_arch if a.startswith("sm_")]
    cmd = nvcc_command(nvcc, unit, obj, keep, sass, ptx, threads, extra)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"nvcc failed on {filename} ({' '.join(cmd)}):\n"
                           f"{res.stderr[-6000:]}")
    mangled = elf.pointer_targets(obj.read_bytes(), ARRAY) if order else []
    if len(mangled) != len(order):
        raise RuntimeError(f"{filename}: {len(mangled)} names for {len(order)} instances")
    names = dict(zip(order, mangled))
    cubins = kept_cubins(keep, sass)
    for arch in sass:
        if arch not in cubins:
            raise RuntimeError(f"{filename}: nvcc kept no cubin for {arch} in {keep}")
        defined = elf.functions(cubins[arch].read_bytes())
        lacking = [e for e in by_arch[arch] if names[e] not in defined]
        if lacking:
            raise RuntimeError(f"{filename}: the {arch} cubin lacks {lacking[:3]} "
                               f"({len(lacking)} in all)")
    fatbins = list(keep.glob("*.fatbin"))
    if len(fatbins) != 1:
        raise RuntimeError(f"{filename}: nvcc kept {len(fatbins)} fatbins in {keep}")
    return names, fatbins[0], cubins, obj


def build_file(filename: str, out_dir: Path, nvcc: str, archs: Iterable[str] = SASS_ARCHS,
               ptx: str | None = PTX_ARCH, threads: int = 1) -> dict:
    """Build ``filename``'s fatbin and table into ``out_dir``; the table, with the seconds
    the build took (``build_seconds``, not written: a rebuild of the same sources gives the
    same files)."""
    archs = tuple(archs)
    by_arch = instances_by_arch(filename, archs, ptx)
    version = nvcc_version(nvcc)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"dspk-build-{stem(filename)}-") as tmp:
        names, fatbin, cubins, _ = compile_file(filename, Path(tmp), by_arch, nvcc, ptx,
                                                threads)
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / f"{stem(filename)}.fatbin"
        shutil.copyfile(fatbin, target)
        images = {a: {"cubin_sha256": _file_hash(p), "cubin_bytes": p.stat().st_size,
                      "code_sha256": elf.code_hash(p.read_bytes())}
                  for a, p in sorted(cubins.items())}
    seconds = time.perf_counter() - t0
    table = {
        "version": TABLE_VERSION,
        "file": filename,
        "source_sha256": text_hash(paste_headers((KERNEL_DIR / filename).read_text())),
        "nvcc_options": list(NVCC_OPTIONS),
        "nvcc": ".".join(map(str, version)),
        "cuda_version": list(version[:2]),
        "fatbin": target.name,
        "fatbin_bytes": target.stat().st_size,
        "fatbin_sha256": _file_hash(target),
        "devices": {a: [p["name"] for p in REFERENCE_DEVICES[a if a.startswith("sm_")
                                                               else PTX_WITH]]
                    for a in by_arch},
        "images": images,
        "archs": by_arch,
        "names": dict(sorted(names.items())),
    }
    (out_dir / f"{stem(filename)}.json").write_text(json.dumps(table, indent=1) + "\n")
    return {**table, "build_seconds": seconds}


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def problems(filename: str, directory: Path = PREBUILT_DIR) -> list[str]:
    """What is wrong with ``filename``'s prebuilt fatbin in ``directory`` for the current
    sources and declarations (empty when it is up to date): `fatbins.stale`, an architecture
    of `fatbins.SASS_ARCHS` or the PTX missing, a declared instance missing from an
    architecture's list, or one listed without a name."""
    table = read_table(filename, directory)
    why = stale(table, paste_headers((KERNEL_DIR / filename).read_text()), directory)
    if why is not None:
        return [why]
    found = []
    want = instances_by_arch(filename)
    for arch, exprs in want.items():
        have = table["archs"].get(arch)
        if have is None:
            found.append(f"no {arch} image")
            continue
        lacking = sorted(set(exprs) - set(have))
        if lacking:
            found.append(f"{arch} lacks {len(lacking)} declared instances ({lacking[0]}, ...)")
    unnamed = sorted({e for exprs in table["archs"].values() for e in exprs} -
                     set(table["names"]))
    if unnamed:
        found.append(f"no mangled name for {unnamed[:3]}")
    return found


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dspk.kernels.build",
        description="Compile every declared template instance of dspk's CUDA sources with nvcc "
                    "into one fatbin per source, with its table of names and hashes "
                    "(dspk/kernels/prebuilt/). --check only reports which are out of date.")
    p.add_argument("files", nargs="*", metavar="FILE.cu",
                   help="sources of dspk/kernels to build (default: every one)")
    p.add_argument("--out", type=Path, default=PREBUILT_DIR,
                   help="folder for the fatbins and tables")
    p.add_argument("--stale", action="store_true",
                   help="build only the sources whose fatbin is missing or out of date")
    p.add_argument("--check", action="store_true",
                   help="build nothing: list the out-of-date fatbins; exit status 1 if any")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="nvcc threads per source (its architectures compile in parallel)")
    p.add_argument("--parallel", type=int, default=1,
                   help="sources compiled at the same time")
    p.add_argument("--nvcc", default=None, help="the nvcc to use (default: found on PATH, "
                   "CUDA_HOME, CUDA_PATH or /usr/local/cuda)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    files = declare_all()
    if args.files:
        unknown = sorted(set(args.files) - set(files))
        if unknown:
            raise SystemExit(f"not a source of dspk/kernels: {', '.join(unknown)} "
                             f"(the sources: {', '.join(files)})")
        files = tuple(args.files)
    if args.check or args.stale:
        found = {f: problems(f, args.out) for f in files}
        for f, why in found.items():
            print(f"{f}: {'; '.join(why) if why else 'up to date'}")
        files = tuple(f for f in files if found[f])
        if args.check:
            return 1 if files else 0
    if not files:
        return 0
    nvcc = args.nvcc or find_nvcc()
    if nvcc is None:
        raise SystemExit("nvcc not found (give --nvcc, or set CUDA_HOME)")
    version = nvcc_version(nvcc)
    if version[:2] < MIN_NVCC:
        raise SystemExit(f"{nvcc} is CUDA {version[0]}.{version[1]}; the architectures "
                         f"{', '.join(SASS_ARCHS)} need {MIN_NVCC[0]}.{MIN_NVCC[1]} or later")
    print(f"nvcc {'.'.join(map(str, version))}: {', '.join(SASS_ARCHS)} + {PTX_ARCH}, "
          f"{len(files)} sources -> {args.out}", flush=True)
    t0 = time.perf_counter()

    def one(f: str) -> dict:
        table = build_file(f, args.out, nvcc, threads=args.jobs)
        count = len(table["names"])
        print(f"  {f}: {count} instances, {table['fatbin_bytes'] / 1e6:.2f} MB, "
              f"{table['build_seconds']:.0f} s", flush=True)
        return table

    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        tables = list(pool.map(one, sorted(files, key=_cost, reverse=True)))
    total = sum(t["fatbin_bytes"] for t in tables)
    print(f"built {len(tables)} fatbins, {total / 1e6:.2f} MB, in "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


def _cost(filename: str) -> int:
    """The longest compiles first (the more instances, the longer)."""
    return sum(len(v) for v in instances_by_arch(filename).values())


if __name__ == "__main__":
    sys.exit(main())
