"""Dynamic-linking facts of one ELF shared object: NEEDED, SONAME, RPATH/RUNPATH, symbols, versions.

Read with ``struct`` over an mmap, following the layouts in the ELF gABI / GNU symbol-versioning
spec. pyelftools was the first choice, but building its parser objects costs ~15 ms per file
(5 s of a 17 s cold run over a torch install with 350 shared objects); the tests use it as an
independent oracle for these facts instead.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Set
from dataclasses import dataclass, field
from itertools import compress, repeat

from patchkit.archives import open_regular

ELF_MAGIC = b"\x7fELF"
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10

_CXX11_MARKERS = (b"St7__cxx11", b"B5cxx11")
# `Ss` is the mangled std::string of the pre-C++11 ABI; it follows a qualifier or a prefix.
_OLD_ABI_STRING = re.compile(rb"(?:RK|PK|[IEN]|_Z)Ss")


class MalformedElf(Exception):
    """The file is not an ELF object this tool can read (truncated, wrong magic, bad sizes)."""


# Only torch-linked objects are judged for the C++11 ABI; the regex is skipped elsewhere.
_TORCH_NAMESPACES = (b"3c10", b"2at", b"5torch")
SHT_DYNAMIC, SHT_NOBITS = 6, 8
SHT_GNU_VERDEF, SHT_GNU_VERNEED = 0x6FFFFFFD, 0x6FFFFFFE
DT_NULL, DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 14, 15, 29
VER_FLG_BASE = 0x1


# Exported names are stored joined by a space (JSON escapes a newline, 272,000 times for an
# installed torch stack's exports, and unescapes it again: a space costs neither); a name
# holding a space, which ELF allows, makes the set a list instead.
SEP = " "


class Names(Set):
    """Exported names kept as the SEP-joined text they were stored as, made a set on the
    first lookup: a report decoded from the cache or from a worker has its exports read by
    the checks only where an extension's scope holds the library (of an installed torch
    stack's 272,000 exports, most are never looked up; cuSPARSELt's alone are 26 MB)."""

    __slots__ = ("_text", "_set")

    def __init__(self, text: str) -> None:
        self._text: str | None = text
        self._set: frozenset[str] | None = None

    def names(self) -> frozenset[str]:
        if self._set is None:
            self._set = frozenset(self._text.split(SEP) if self._text else ())
            self._text = None
        return self._set

    def __contains__(self, name) -> bool:
        return name in self.names()

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def joined(self) -> str:
        """The names joined by SEP (as stored), without making the set."""
        return self._text if self._text is not None else SEP.join(self._set or ())

    __hash__ = Set._hash


def name_set(names: frozenset[str] | Names) -> frozenset[str]:
    """The exported names as a frozenset (for lookups in a loop, without Names' own call)."""
    return names.names() if isinstance(names, Names) else names


@dataclass
class ElfInfo:
    """What the dynamic loader sees of one shared object."""

    path: str
    machine: str
    soname: str | None
    needed: list[str]
    rpath: list[str]
    runpath: list[str]
    defined: frozenset[str] | Names
    undefined: tuple[str, ...]  # strong (non-weak) undefined dynamic symbols
    verneed: dict[str, list[str]] = field(default_factory=dict)
    verdef: list[str] = field(default_factory=list)
    cxx11_abi: int | None = None
    sections: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # strong undefined symbol -> "library version" it is bound to (.gnu.version), if versioned
    undefined_versions: dict[str, str] = field(default_factory=dict)

    def section(self, name: str) -> tuple[int, int, int] | None:
        """(file offset, size, address) of a section, if present."""
        return self.sections.get(name)

    def symbol_library(self, name: str) -> str | None:
        """The library a versioned undefined symbol binds to (``logf`` -> ``libm.so.6``)."""
        v = self.undefined_versions.get(name)
        return v.split(" ", 1)[0] if v else None

    def example(self, lib: str, version: str) -> str | None:
        """One undefined symbol that needs ``version`` of ``lib`` (evidence for a message)."""
        want = f"{lib} {version}"
        return next((s for s, v in self.undefined_versions.items() if v == want), None)

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "machine": self.machine,
            "soname": self.soname,
            "needed": self.needed,
            "rpath": self.rpath,
            "runpath": self.runpath,
            "defined": _lines(self.defined),
            "undefined": list(self.undefined),
            "verneed": self.verneed,
            "verdef": self.verdef,
            "cxx11_abi": self.cxx11_abi,
            "sections": {k: list(v) for k, v in self.sections.items()},
            "undefined_versions": self.undefined_versions,
        }

    @classmethod
    def from_json(cls, d: dict) -> ElfInfo:
        """Rebuild from to_json() output; raises TypeError/KeyError on anything else."""
        sections = {}
        for k, v in _dict(d["sections"]).items():
            if not (isinstance(v, list) and len(v) == 3 and all(type(i) is int for i in v)):
                raise TypeError("section")
            sections[k] = (v[0], v[1], v[2])
        verneed = {k: _strs(v) for k, v in _dict(d["verneed"]).items()}
        versions = _dict(d["undefined_versions"])
        _strs(list(versions.values()))
        cxx = d["cxx11_abi"]
        if cxx not in (None, 0, 1):
            raise TypeError("cxx11_abi")
        return cls(
            path=_str(d["path"]),
            machine=_str(d["machine"]),
            soname=_opt_str(d["soname"]),
            needed=_strs(d["needed"]),
            rpath=_strs(d["rpath"]),
            runpath=_strs(d["runpath"]),
            defined=_names_of(d["defined"]),
            undefined=tuple(_strs(d["undefined"])),
            verneed=verneed,
            verdef=_strs(d["verdef"]),
            cxx11_abi=cxx,
            sections=sections,
            undefined_versions=versions,
        )

    @classmethod
    def from_worker(cls, d: dict) -> ElfInfo:
        """Rebuild from to_json() output made by this program's own worker (not read from
        the cache): the same object as from_json, without checking every field's type."""
        return cls(
            path=d["path"],
            machine=d["machine"],
            soname=d["soname"],
            needed=d["needed"],
            rpath=d["rpath"],
            runpath=d["runpath"],
            defined=_names_of(d["defined"]),
            undefined=tuple(d["undefined"]),
            verneed=d["verneed"],
            verdef=d["verdef"],
            cxx11_abi=d["cxx11_abi"],
            sections={k: (v[0], v[1], v[2]) for k, v in d["sections"].items()},
            undefined_versions=d["undefined_versions"],
        )


def _names_of(x) -> frozenset[str] | Names:
    """``defined`` from its stored form: one SEP-joined string (kept as it is, made a set on
    the first lookup) or, where a name holds SEP, a list."""
    if isinstance(x, str):
        return Names(x)
    return frozenset(_strs(x))


def _lines(names) -> str | list[str]:
    """A big name set as one SEP-joined string (fast to encode and decode as JSON)."""
    if isinstance(names, Names):
        return names.joined()
    joined = SEP.join(names)
    return joined if joined.count(SEP) == max(len(names) - 1, 0) else list(names)


def _str(x) -> str:
    if not isinstance(x, str):
        raise TypeError(f"expected a string, got {type(x).__name__}")
    return x


def _opt_str(x) -> str | None:
    return None if x is None else _str(x)


def _strs(x) -> list[str]:
    if not isinstance(x, list) or not all(isinstance(i, str) for i in x):
        raise TypeError("expected a list of strings")
    return x


def _dict(x) -> dict:
    if not isinstance(x, dict):
        raise TypeError("expected an object")
    return x


PAGE = mmap.PAGESIZE
# Linux reads at most max(read-ahead window, largest request) of one WILLNEED call (8 MB on
# the development machine, 128 kB with the common defaults) and drops the rest of the range:
# larger ranges are asked for in pieces of this size, all of them before any is read.
WILLNEED_PIECE = 128 << 10


def pieces(off: int, length: int, limit: int):
    """``(start, length)`` of the page-aligned pieces (at most WILLNEED_PIECE) that cover
    ``off`` .. ``off + length`` within a file of ``limit`` bytes."""
    start = off - off % PAGE
    end = min(off + length, limit)
    while start < end:
        yield start, min(WILLNEED_PIECE, end - start)
        start += WILLNEED_PIECE


def prefetch(buf, ranges) -> None:
    """Start reading ``(offset, length)`` ranges of a mapped file in the background
    (MADV_WILLNEED); a no-op for bytes already in memory."""
    if not isinstance(buf, mmap.mmap):
        return
    size, advise, willneed = len(buf), buf.madvise, mmap.MADV_WILLNEED
    asked = set()  # pages already asked for (fatbin entry headers often share one)
    try:
        for off, length in ranges:
            start = off - off % PAGE
            if length + off - start <= PAGE:
                if start not in asked:
                    asked.add(start)
                    advise(willneed, start, min(PAGE, size - start))
                continue
            for start, n in pieces(off, length, size):
                advise(willneed, start, n)
    except (OSError, ValueError, OverflowError):
        return


def open_mapped(path: str) -> mmap.mmap:
    """Map a file read-only; an empty file cannot be mapped and is malformed."""
    with open_regular(path) as fh:  # a FIFO swapped in since listing: refused, not waited on
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
    except (
        struct.error,
        ValueError,
        IndexError,
        KeyError,
        AttributeError,
        TypeError,
        OverflowError,
        UnicodeDecodeError,
        RecursionError,
    ) as exc:
        raise MalformedElf(f"{type(exc).__name__}: {exc}".strip()) from None
    finally:
        if own:
            buf.close()


def _check_range(size: int, offset: int, length: int, what: str) -> None:
    if offset < 0 or length < 0 or offset + length > size:
        raise MalformedElf(
            f"{what} at {offset:#x}+{length:#x} is past the end of the file ({size:#x})"
        )


def _parse(path: str, buf) -> ElfInfo:
    size = len(buf)
    if size < 64 or buf[:4] != ELF_MAGIC:
        raise MalformedElf("not an ELF file (wrong magic)")
    if buf[4] != 2 or buf[5] != 1:
        raise MalformedElf("not a 64-bit little-endian ELF object")
    (machine,) = struct.unpack_from("<H", buf, 0x12)
    raw, sections, by_type = _section_table(buf, size)
    # Ask for every range read below at once: the reads then overlap instead of queueing.
    prefetch(
        buf,
        [
            sections[n][:2]
            for n in (".dynamic", ".dynsym", ".dynstr", ".gnu.version", ".gnu.version_r",
                      ".gnu.version_d", ".nvFatBinSegment")
            if n in sections
        ],
    )  # fmt: skip
    soname, needed, rpath, runpath = _dynamic(buf, raw, by_type.get(SHT_DYNAMIC))
    verneed, version_index = _version_needs(buf, raw, by_type.get(SHT_GNU_VERNEED))
    verdef = _version_definitions(buf, raw, by_type.get(SHT_GNU_VERDEF))
    defined, undefined, cxx11, versions = _symbols(buf, sections, version_index)
    return ElfInfo(
        path=path,
        machine=str(machine),
        soname=soname,
        needed=needed,
        rpath=rpath,
        runpath=runpath,
        defined=defined,
        undefined=undefined,
        verneed=verneed,
        verdef=verdef,
        cxx11_abi=cxx11,
        sections=sections,
        undefined_versions=versions,
    )


def _section_table(buf, size: int) -> tuple[list[tuple], dict[str, tuple[int, int, int]], dict]:
    """The raw section headers, name -> (offset, size, address), and the first section of
    each type; every section's range checked against the file's size."""
    (shoff,) = struct.unpack_from("<Q", buf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 0x3A)
    if shnum and (shentsize != 64 or shoff + shnum * 64 > size):
        raise MalformedElf(
            f"section table at {shoff:#x} ({shnum} entries) is past the end of the file"
        )
    if shnum and shstrndx >= shnum:
        raise MalformedElf(f"section-name table index {shstrndx} >= {shnum} sections")
    raw = [struct.unpack_from("<IIQQQQIIQQ", buf, shoff + i * 64) for i in range(shnum)]
    names = b""
    if shnum:
        str_off, str_size = raw[shstrndx][4], raw[shstrndx][5]
        _check_range(size, str_off, str_size, "section-name table")
        names = bytes(buf[str_off : str_off + str_size])
    sections: dict[str, tuple[int, int, int]] = {}
    by_type: dict[int, tuple] = {}
    for index, sec in enumerate(raw):
        name_off, stype, _flags, addr, off, sec_size = sec[:6]
        end = names.find(b"\0", name_off)
        name = names[name_off:end].decode("ascii", "replace") if end >= 0 else ""
        if stype != SHT_NOBITS:
            _check_range(size, off, sec_size, f"section {name or index}")
        sections[name] = (off, sec_size, addr)
        by_type.setdefault(stype, sec)
    return raw, sections, by_type


def _linked_strings(buf, raw: list[tuple], sec: tuple) -> bytes:
    """The string table a section links to (sh_link)."""
    link = sec[6]
    if link >= len(raw):
        raise MalformedElf(f"section link {link} >= {len(raw)} sections")
    return bytes(buf[raw[link][4] : raw[link][4] + raw[link][5]])


# What a real object holds, with room to spare: a library name or version is a file name, a
# search path a colon-joined list of folders; an object names at most this many of either.
# An object past these is malformed (every entry may point at the same long string: without
# the bounds a 132 kB file would read as gigabytes of names).
MAX_NAME, MAX_PATHS, MAX_ENTRIES = 4096, 1 << 16, 4096


def _cstr(table: bytes, off: int, most: int = MAX_NAME) -> str:
    end = table.find(b"\0", off, off + most + 1)
    if off >= len(table) or end < 0:
        if off < len(table) and table.find(b"\0", off) >= 0:
            raise MalformedElf(f"string at {off:#x} is longer than {most} bytes")
        raise MalformedElf(f"string at {off:#x} runs past its string table")
    return table[off:end].decode("utf-8", "replace")


def _dynamic(buf, raw: list[tuple], dyn: tuple | None):
    """(soname, needed, rpath, runpath) from the dynamic section."""
    soname, needed, rpath, runpath = None, [], [], []
    if dyn is None:
        return soname, needed, rpath, runpath
    table = _linked_strings(buf, raw, dyn)
    for tag, value in struct.iter_unpack("<qQ", bytes(buf[dyn[4] : dyn[4] + dyn[5] // 16 * 16])):
        if tag == DT_NULL:
            break
        if tag == DT_NEEDED:
            needed.append(_cstr(table, value))
        elif tag == DT_SONAME:
            soname = _cstr(table, value)
        elif tag == DT_RPATH:
            rpath.extend(p for p in _cstr(table, value, MAX_PATHS).split(":") if p)
        elif tag == DT_RUNPATH:
            runpath.extend(p for p in _cstr(table, value, MAX_PATHS).split(":") if p)
        if max(len(needed), len(rpath), len(runpath)) > MAX_ENTRIES:
            raise MalformedElf(f"more than {MAX_ENTRIES} needed libraries or search paths")
    return soname, needed, rpath, runpath


def _version_needs(
    buf, raw: list[tuple], vn: tuple | None
) -> tuple[dict[str, list[str]], dict[int, str]]:
    """library -> the versions needed of it (.gnu.version_r), and vna_other -> "library
    version" for the symbols' version indexes."""
    verneed: dict[str, list[str]] = {}
    version_index: dict[int, str] = {}
    if vn is None:
        return verneed, version_index
    table = _linked_strings(buf, raw, vn)
    data = bytes(buf[vn[4] : vn[4] + vn[5]])
    pos, seen, visited = 0, 0, set()
    while pos + 16 <= len(data) and seen < MAX_ENTRIES:
        _ver, cnt, file_off, aux, nxt = struct.unpack_from("<HHIII", data, pos)
        lib = _cstr(table, file_off)
        apos = pos + aux
        for _ in range(min(cnt, MAX_ENTRIES)):
            if apos + 16 > len(data):
                raise MalformedElf("version-needed entry runs past .gnu.version_r")
            # each entry read once: a chain that comes back to one (entries shared by several
            # libraries, or a loop) is not an object a linker wrote
            if apos in visited or len(visited) >= MAX_ENTRIES:
                raise MalformedElf("version-needed entries overlap or exceed their count")
            visited.add(apos)
            _h, _f, other, name_off, anext = struct.unpack_from("<IHHII", data, apos)
            vname = _cstr(table, name_off)
            verneed.setdefault(lib, []).append(vname)
            version_index[other & 0x7FFF] = f"{lib} {vname}"
            if not anext:
                break
            apos += anext
        seen += 1
        if not nxt:
            break
        pos += nxt
    return verneed, version_index


def _version_definitions(buf, raw: list[tuple], vd: tuple | None) -> list[str]:
    """The versions the object defines (.gnu.version_d), its base version left out."""
    verdef: list[str] = []
    if vd is None:
        return verdef
    table = _linked_strings(buf, raw, vd)
    data = bytes(buf[vd[4] : vd[4] + vd[5]])
    pos, seen = 0, 0
    while pos + 20 <= len(data) and seen < 4096:
        _ver, flags, _ndx, cnt, _hash, aux, nxt = struct.unpack_from("<HHHHIII", data, pos)
        if cnt and not flags & VER_FLG_BASE and pos + aux + 8 <= len(data):
            (name_off,) = struct.unpack_from("<I", data, pos + aux)
            verdef.append(_cstr(table, name_off))
        seen += 1
        if not nxt:
            break
        pos += nxt
    return verdef


_EXPORTED_BIND = bytes(1 if (i >> 4) in (1, 2, 10) else 0 for i in range(256))
_STRONG_BIND = bytes(1 if (i >> 4) in (1, 10) else 0 for i in range(256))
_VISIBLE = bytes(1 if (i & 3) in (0, 3) else 0 for i in range(256))
_NONZERO = bytes([0] + [1] * 255)


def _names(text, offsets) -> list:
    """The NUL-terminated strings of ``text`` (.dynstr, as str or bytes) at ``offsets``, sliced
    in C (``map`` over ``find``): offsets inside another string (the linker merges common
    suffixes) need nothing special, and only the strings asked for are made."""
    offsets = list(offsets)
    if not offsets:
        return []
    nul = "\0" if isinstance(text, str) else b"\0"
    if max(offsets) > text.rfind(nul):
        bad = next(o for o in offsets if o > text.rfind(nul))
        raise MalformedElf(f"symbol name at {bad:#x} runs past .dynstr")
    ends = list(map(text.find, repeat(nul), offsets))
    # Names share bytes only where the linker merged a common suffix: their total stays
    # near the table's size. Many symbols naming one long string would make gigabytes.
    if sum(ends) - sum(offsets) > 2 * len(text) + (1 << 20):
        raise MalformedElf("symbol names overlap: they name far more bytes than .dynstr holds")
    return list(map(text.__getitem__, map(slice, offsets, ends)))


def _symbols(buf, sections, version_index: dict[int, str]):
    """Exported and strong-undefined dynamic symbols, read column-wise from .dynsym."""
    sym = sections.get(".dynsym")
    strs = sections.get(".dynstr")
    if sym is None or strs is None:
        return frozenset(), (), None, {}
    soff, ssize, _ = sym
    toff, tsize, _ = strs
    count = ssize // 24
    table = bytes(buf[toff : toff + tsize])
    raw = bytes(buf[soff : soff + count * 24])
    view = memoryview(raw)
    # Columns of the 24-byte Elf64_Sym: st_name u32 @0, st_info @4, st_other @5, st_shndx @6.
    names = view.cast("I")[0::6]
    info = raw[4::24]
    other = raw[5::24]
    text = table.decode("utf-8", "surrogateescape")
    if len(text) != len(table):  # non-ASCII names: offsets are byte offsets, decode per name

        def names_at(offsets) -> list[str]:
            return [b.decode("utf-8", "replace") for b in _names(table, offsets)]
    else:

        def names_at(offsets) -> list[str]:
            return _names(text, offsets)

    # The filters run as byte-string operations, not a Python loop over ~100k symbols:
    # bindings GLOBAL 1, WEAK 2, GNU_UNIQUE 10; visibility DEFAULT 0 / PROTECTED 3 exported.
    n = len(info)
    bound = int.from_bytes(info.translate(_EXPORTED_BIND), "little")
    strong_bind = int.from_bytes(info.translate(_STRONG_BIND), "little")
    visible = int.from_bytes(other.translate(_VISIBLE), "little")
    in_section = int.from_bytes(raw[6::24].translate(_NONZERO), "little") | int.from_bytes(
        raw[7::24].translate(_NONZERO), "little"
    )
    ones = int.from_bytes(b"\x01" * n, "little")
    defined_mask = (bound & visible & in_section).to_bytes(n, "little")
    undefined_mask = (strong_bind & (ones ^ in_section)).to_bytes(n, "little")
    exported = names_at(filter(None, compress(names, defined_mask)))
    # Kept joined (what to_json stores) and made a set only when looked up: a worker never
    # looks one up, and a run looks up the exports of the libraries extensions load.
    joined = SEP.join(exported)
    if joined.count(SEP) == max(len(exported) - 1, 0):
        defined: frozenset[str] | Names = Names(joined)
    else:  # a name with SEP in it
        defined = frozenset(exported)
    strong = [k for k in compress(range(n), undefined_mask) if names[k]]
    undefined = tuple(names_at(names[k] for k in strong))
    versions: dict[str, str] = {}
    ver = sections.get(".gnu.version")
    if ver is not None and version_index and ver[1] >= count * 2:
        versym = memoryview(bytes(buf[ver[0] : ver[0] + count * 2])).cast("H")
        for k, sym_name in zip(strong, undefined, strict=True):
            v = version_index.get(versym[k] & 0x7FFF)
            if v:
                versions[sym_name] = v
    cxx11 = None
    if any(marker in table for marker in _CXX11_MARKERS):
        cxx11 = 1
    elif any(ns in table for ns in _TORCH_NAMESPACES) and _OLD_ABI_STRING.search(table):
        cxx11 = 0
    return defined, undefined, cxx11, versions
