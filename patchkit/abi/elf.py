"""Dynamic-linking facts of one ELF shared object: NEEDED, SONAME, RPATH/RUNPATH, symbols, versions.

pyelftools reads the ELF header, the section table, the dynamic section and the symbol-version
sections; the symbol table itself (hundreds of thousands of entries in libtorch_cpu.so) is read
with ``struct.iter_unpack`` over an mmap, which is two orders of magnitude faster.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from typing import NamedTuple

from elftools.common.exceptions import ELFError, ELFParseError
from elftools.elf.elffile import ELFFile

ELF_MAGIC = b"\x7fELF"
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
# Visibility: DEFAULT 0 and PROTECTED 3 are exported; INTERNAL 1 / HIDDEN 2 are not.
EXPORTED_VISIBILITY = (0, 3)
VERSYM_HIDDEN = 0x8000

_CXX11_MARKERS = (b"St7__cxx11", b"B5cxx11")
# `Ss` is the mangled std::string of the pre-C++11 ABI; it follows a qualifier or a prefix.
_OLD_ABI_STRING = re.compile(rb"(?:RK|PK|[IEN]|_Z)Ss")


class MalformedElf(Exception):
    """The file is not an ELF object this tool can read (truncated, wrong magic, bad sizes)."""


class UndefinedSymbol(NamedTuple):
    """A symbol the object needs from elsewhere; ``version`` is ``(file, version)`` if versioned."""

    name: str
    weak: bool
    version: tuple[str, str] | None = None


@dataclass
class ElfInfo:
    """What the dynamic loader sees of one shared object."""

    path: str
    machine: str
    soname: str | None
    needed: list[str]
    rpath: list[str]
    runpath: list[str]
    defined: frozenset[str]
    undefined: list[UndefinedSymbol]
    verneed: dict[str, list[str]] = field(default_factory=dict)
    verdef: list[str] = field(default_factory=list)
    cxx11_abi: int | None = None
    sections: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def section(self, name: str) -> tuple[int, int, int] | None:
        """(file offset, size, address) of a section, if present."""
        return self.sections.get(name)


def is_elf(path: str) -> bool:
    """True if the file starts with the ELF magic."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == ELF_MAGIC
    except OSError:
        return False


def open_mapped(path: str) -> mmap.mmap:
    """Map a file read-only; an empty file cannot be mapped and is malformed."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 64:
            raise MalformedElf(f"file is {size} bytes, too short for an ELF header")
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def read_elf(path: str, data: mmap.mmap | bytes | None = None) -> ElfInfo:
    """Parse the dynamic-linking facts of ``path`` (or of ``data``, its bytes already mapped)."""
    own = data is None
    buf = open_mapped(path) if own else data
    try:
        return _parse(path, buf)
    except MalformedElf:
        raise
    except (ELFError, ELFParseError, struct.error, ValueError, IndexError, KeyError,
            AttributeError, TypeError, OverflowError, UnicodeDecodeError, RecursionError) as exc:
        raise MalformedElf(f"{type(exc).__name__}: {exc}".strip()) from None
    finally:
        if own:
            buf.close()


def _check_range(size: int, offset: int, length: int, what: str) -> None:
    if offset < 0 or length < 0 or offset + length > size:
        raise MalformedElf(f"{what} at {offset:#x}+{length:#x} is past the end of the file ({size:#x})")


def _parse(path: str, buf) -> ElfInfo:
    size = len(buf)
    if size < 64 or buf[:4] != ELF_MAGIC:
        raise MalformedElf("not an ELF file (wrong magic)")
    if buf[4] != 2 or buf[5] != 1:
        raise MalformedElf("not a 64-bit little-endian ELF object")
    shoff, = struct.unpack_from("<Q", buf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 0x3A)
    if shnum and (shentsize != 64 or shoff + shnum * 64 > size):
        raise MalformedElf(f"section table at {shoff:#x} ({shnum} entries) is past the end of the file")
    if shnum and shstrndx >= shnum:
        raise MalformedElf(f"section-name table index {shstrndx} >= {shnum} sections")
    elf = ELFFile(_Stream(buf))
    machine = elf["e_machine"]
    # The section table is read directly (pyelftools builds an object per section, which is
    # slow on 60-section, 1 GB libraries); pyelftools parses the few sections that need it.
    raw = [struct.unpack_from("<IIQQQQIIQQ", buf, shoff + i * 64) for i in range(shnum)]
    names = b""
    if shnum:
        str_off, str_size = raw[shstrndx][4], raw[shstrndx][5]
        _check_range(size, str_off, str_size, "section-name table")
        names = bytes(buf[str_off:str_off + str_size])
    sections: dict[str, tuple[int, int, int]] = {}
    by_type: dict[str, object] = {}
    wanted = {6: "SHT_DYNAMIC", 0x6FFFFFFE: "SHT_GNU_verneed", 0x6FFFFFFD: "SHT_GNU_verdef"}
    for index, (name_off, stype, _flags, addr, off, sec_size, *_rest) in enumerate(raw):
        end = names.find(b"\0", name_off)
        name = names[name_off:end].decode("ascii", "replace") if end >= 0 else ""
        if stype != 8:  # SHT_NOBITS occupies no file space
            _check_range(size, off, sec_size, f"section {name or index}")
        sections[name] = (off, sec_size, addr)
        if stype in wanted and wanted[stype] not in by_type:
            by_type[wanted[stype]] = elf.get_section(index)

    soname, needed, rpath, runpath = None, [], [], []
    dyn = by_type.get("SHT_DYNAMIC")
    if dyn is not None:
        for tag in dyn.iter_tags():
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                needed.append(tag.needed)
            elif kind == "DT_SONAME":
                soname = tag.soname
            elif kind == "DT_RPATH":
                rpath.extend(p for p in tag.rpath.split(":") if p)
            elif kind == "DT_RUNPATH":
                runpath.extend(p for p in tag.runpath.split(":") if p)

    verneed: dict[str, list[str]] = {}
    need_index: dict[int, tuple[str, str]] = {}
    vn = by_type.get("SHT_GNU_verneed")
    if vn is not None:
        for ver, auxes in vn.iter_versions():
            for aux in auxes:
                verneed.setdefault(ver.name, []).append(aux.name)
                need_index[aux["vna_other"]] = (ver.name, aux.name)
    verdef: list[str] = []
    vd = by_type.get("SHT_GNU_verdef")
    if vd is not None:
        for ver, auxes in vd.iter_versions():
            if ver["vd_flags"] & 0x1:  # VER_FLG_BASE names the file itself
                continue
            aux = next(iter(auxes), None)
            if aux is not None:
                verdef.append(aux.name)

    defined, undefined, cxx11 = _symbols(buf, sections, need_index)
    return ElfInfo(
        path=path, machine=str(machine), soname=soname, needed=needed, rpath=rpath,
        runpath=runpath, defined=defined, undefined=undefined, verneed=verneed, verdef=verdef,
        cxx11_abi=cxx11, sections=sections,
    )


def _symbols(buf, sections, need_index):
    sym = sections.get(".dynsym")
    strs = sections.get(".dynstr")
    if sym is None or strs is None:
        return frozenset(), [], None
    soff, ssize, _ = sym
    toff, tsize, _ = strs
    count = ssize // 24
    table = bytes(buf[toff:toff + tsize])
    versym = None
    gv = sections.get(".gnu.version")
    if gv is not None and gv[1] >= count * 2:
        versym = struct.unpack_from(f"<{count}H", buf, gv[0])
    defined: set[str] = set()
    undefined: list[UndefinedSymbol] = []
    find = table.find
    raw = bytes(buf[soff:soff + count * 24])
    for i, (name_off, info, other, shndx, _value, _size) in enumerate(struct.iter_unpack("<IBBHQQ", raw)):
        if i == 0 or not name_off:
            continue
        bind = info >> 4
        if bind not in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE):
            continue
        end = find(b"\0", name_off)
        if end < 0:
            raise MalformedElf(f"symbol name at {name_off:#x} runs past .dynstr")
        name = table[name_off:end].decode("utf-8", "replace")
        if shndx == SHN_UNDEF:
            version = None
            if versym is not None:
                version = need_index.get(versym[i] & 0x7FFF)
            undefined.append(UndefinedSymbol(name, bind == STB_WEAK, version))
        elif (other & 3) in EXPORTED_VISIBILITY:
            defined.add(name)
    cxx11 = None
    if any(marker in table for marker in _CXX11_MARKERS):
        cxx11 = 1
    elif _OLD_ABI_STRING.search(table):
        cxx11 = 0
    return frozenset(defined), undefined, cxx11


class _Stream:
    """A minimal file-like view over a buffer, so pyelftools reads an mmap without copying it."""

    def __init__(self, buf) -> None:
        self._buf = buf
        self._pos = 0

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 1:
            offset += self._pos
        elif whence == 2:
            offset += len(self._buf)
        self._pos = max(0, offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = len(self._buf) if n is None or n < 0 else min(len(self._buf), self._pos + n)
        out = bytes(self._buf[self._pos:end])
        self._pos = end
        return out
