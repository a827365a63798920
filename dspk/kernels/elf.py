"""The little of ELF64 that building the prebuilt kernels reads: the symbols of an object
file, and the functions the entries of a pointer array point to.

`dspk.kernels.build` names each template instance by compiling a table of their addresses
(``void* const dspk_instances[] = {(void*)&k<float, 4>, ...}``) in the host object nvcc
writes: the linker relocations of entry i name the function, so the compiler itself resolves
each expression to its mangled symbol, with no demangler and no guess at how a type is
spelled. The same reader lists the kernels of each architecture's cubin (ELF too), so the
build checks that every name it found is compiled for the architectures that need it.

Only the standard library: the build runs where nvcc is, not necessarily the CUDA libraries.
"""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple

#: ELF constants (System V ABI): section types, symbol types
_SHT_SYMTAB = 2
_SHT_RELA = 4
_SHT_NOTE = 7
_SHT_NOBITS = 8
_STT_SECTION = 3
_STT_FUNC = 2


class Symbol(NamedTuple):
    name: str
    value: int
    size: int
    type: int
    section: int


class _Section(NamedTuple):
    name: str
    type: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


def _sections(data: bytes) -> list[_Section]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = raw[shstrndx][4]

    def name(off: int) -> str:
        return _cstring(data, names_at + off)

    return [_Section(name(s[0]), s[1], s[4], s[5], s[6], s[7], s[9]) for s in raw]


def _cstring(data: bytes, at: int) -> str:
    return data[at:data.index(b"\0", at)].decode()


def _symtab(data: bytes, sections: list[_Section]) -> tuple[int, list[Symbol]]:
    for i, sec in enumerate(sections):
        if sec.type == _SHT_SYMTAB:
            strings = sections[sec.link].offset
            syms = []
            for off in range(sec.offset, sec.offset + sec.size, sec.entsize):
                name, info, _, shndx, value, size = struct.unpack_from("<IBBHQQ", data, off)
                syms.append(Symbol(_cstring(data, strings + name), value, size, info & 0xF,
                                   shndx))
            return i, syms
    raise ValueError("no symbol table")


def symbols(data: bytes) -> list[Symbol]:
    """Every symbol of the ELF file ``data``."""
    return _symtab(data, _sections(data))[1]


def functions(data: bytes) -> set[str]:
    """The names of the function symbols of ``data`` (in a cubin: its kernels and device
    functions)."""
    return {s.name for s in symbols(data) if s.type == _STT_FUNC and s.name}


def code_hash(data: bytes) -> str:
    """SHA-256 (hex) over every section of the ELF file ``data`` but its notes, by name and
    contents (a section without contents: its size): a cubin's code, constants and kernel
    attributes, without the note that records the compiler's command line (warnings as
    errors or not, say), so two compiles of the same code with other such options agree."""
    h = hashlib.sha256()
    for sec in _sections(data):
        if sec.type == _SHT_NOTE:
            continue
        h.update(sec.name.encode() + b"\0")
        h.update(str(sec.size).encode() if sec.type == _SHT_NOBITS else
                 data[sec.offset:sec.offset + sec.size])
    return h.hexdigest()


def pointer_targets(data: bytes, array: str) -> list[str]:
    """The functions the entries of the pointer array ``array`` (a defined symbol of the
    relocatable object ``data``) point to, in the array's order: each entry's relocation
    names the function, or its section and offset (a local function: the function symbol
    at that offset)."""
    sections = _sections(data)
    symtab_index, syms = _symtab(data, sections)
    found = [s for s in syms if s.name == array and s.section]
    if not found:
        raise ValueError(f"no symbol {array!r} defined")
    table = found[0]
    entries: dict[int, str] = {}
    for sec in sections:
        if sec.type != _SHT_RELA or sec.info != table.section or sec.link != symtab_index:
            continue
        for off in range(sec.offset, sec.offset + sec.size, sec.entsize):
            where, info, addend = struct.unpack_from("<QQq", data, off)
            if not table.value <= where < table.value + table.size:
                continue
            target = syms[info >> 32]
            if target.type == _STT_SECTION:
                at = [s.name for s in syms if s.section == target.section and
                      s.type == _STT_FUNC and s.value == addend]
                if len(at) != 1:
                    raise ValueError(f"{array}[{(where - table.value) // 8}]: "
                                     f"{len(at)} functions at section {target.section} "
                                     f"+ {addend:#x}")
                entries[(where - table.value) // 8] = at[0]
            else:
                if addend:
                    raise ValueError(f"{array}: an entry points into {target.name} + {addend}")
                entries[(where - table.value) // 8] = target.name
    count = table.size // 8
    if sorted(entries) != list(range(count)):
        raise ValueError(f"{array}: relocations for {len(entries)} of its {count} entries")
    return [entries[i] for i in range(count)]
