"""Per-file analysis: ELF dynamic facts and fatbin summary of each shared object, cached."""

from __future__ import annotations

import os
import re
import struct
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from patchkit.abi.cache import ResultCache
from patchkit.abi.elf import ElfInfo, MalformedElf, open_mapped, read_elf
from patchkit.abi.fatbin import Fatbin, MalformedFatbin, describe
from patchkit.abi.sources import Member, Tree, extract_member, read_member

_ARCH_FLAGS = re.compile(rb"(?:sm|compute)_\d+[af]?(?: (?:sm|compute)_\d+[af]?)+")
# Files whose bytes carry torch's TORCH_CUDA_ARCH_LIST (== torch._C._cuda_getArchFlags()).
ARCH_FLAG_FILES = ("libtorch_python.so",)
PARALLEL_BYTES = 64 << 20
# Wheel members up to this size are read into memory; larger ones go through the scratch folder.
IN_MEMORY_BYTES = 1 << 30
# Files with at most this many fatbins have every fatbin opened to count its kernels.
OPEN_ALL_BELOW = 64


@dataclass
class FileReport:
    """What one shared object is, as far as loading it and launching its kernels go."""

    relpath: str
    origin: str
    elf: ElfInfo | None = None
    error: str | None = None  # the file could not be read as ELF
    fatbins: list[Fatbin] = field(default_factory=list)
    fatbin_error: str | None = None
    arch_flags: list[str] = field(default_factory=list)

    @property
    def kernel_fatbins(self) -> list[Fatbin]:
        """Fatbins that hold (or may hold) kernels; the empty device-link fatbin is left out."""
        return [f for f in self.fatbins if f.has_kernels is not False]


def analyze_file(path: str, relpath: str, origin: str) -> FileReport:
    """Read one file; malformed ELF or fatbin data becomes ``error``/``fatbin_error``, no raise."""
    try:
        buf = open_mapped(path)
    except MalformedElf as exc:
        return FileReport(relpath=relpath, origin=origin, error=str(exc))
    except (OSError, ValueError) as exc:
        return FileReport(relpath=relpath, origin=origin, error=f"cannot read: {exc}")
    try:
        return analyze_buffer(buf, relpath, origin)
    finally:
        buf.close()


def analyze_buffer(buf, relpath: str, origin: str) -> FileReport:
    """Like analyze_file, over bytes already in memory (an mmap or a wheel member)."""
    report = FileReport(relpath=relpath, origin=origin)
    if len(buf) < 64:
        report.error = f"file is {len(buf)} bytes, too short for an ELF header"
        return report
    try:
        elf = read_elf(origin, buf)
    except MalformedElf as exc:
        report.error = str(exc)
        return report
    report.elf = elf
    sec = elf.section(".nv_fatbin")
    if sec is not None:
        seg = elf.section(".nvFatBinSegment")
        segment = bytes(buf[seg[0] : seg[0] + seg[1]]) if seg and seg[1] < (1 << 24) else None
        try:
            report.fatbins = describe(
                buf, sec[0], sec[0] + sec[1], segment, sec[2], open_images=OPEN_ALL_BELOW
            )
        except MalformedFatbin as exc:
            report.fatbin_error = str(exc)
        except (ValueError, IndexError, OverflowError, MemoryError, struct.error) as exc:
            report.fatbin_error = f"{type(exc).__name__}: {exc}"
    if os.path.basename(relpath) in ARCH_FLAG_FILES:
        m = _ARCH_FLAGS.search(buf)
        if m:
            report.arch_flags = m.group(0).decode().split()
    elf.sections = {k: v for k, v in elf.sections.items() if k.startswith((".nv", ".dyn"))}
    return report


def _analyze_member(member: Member) -> FileReport:
    if member.path is None and member.wheel is not None:
        try:
            if member.size <= IN_MEMORY_BYTES:
                return analyze_buffer(read_member(member), member.relpath, member.origin)
            path = extract_member(member)
        except (
            Exception
        ) as exc:  # zipfile raises BadZipFile, zlib.error, EOFError ... on corrupt members
            return FileReport(member.relpath, member.origin, error=f"invalid archive: {exc}")
        try:
            return analyze_file(path, member.relpath, member.origin)
        finally:
            os.unlink(path)  # the scratch copy is only needed while it is read
    return analyze_file(member.path, member.relpath, member.origin)


def _analyze_and_store(member: Member, cache: ResultCache) -> FileReport:
    report = _analyze_member(member)
    if not (report.error or "").startswith("invalid archive"):
        cache.store(member.cache_key, member.size, member.mtime, report)
    return report


def _worker(args: tuple[Member, ResultCache]) -> FileReport:
    # The worker writes the cache entry itself, so the parent does not pickle the report twice.
    return _analyze_and_store(*args)


def analyze_tree(tree: Tree, cache: ResultCache, jobs: int | None = None) -> dict[str, FileReport]:
    """A FileReport per shared object in ``tree``: from the cache, else computed in parallel."""
    reports: dict[str, FileReport] = {}
    todo: list[Member] = []
    for member in tree.members.values():
        hit = cache.load(member.cache_key, member.size, member.mtime)
        if hit is not None:
            hit.relpath, hit.origin = member.relpath, member.origin
            if hit.elf is not None:
                hit.elf.path = member.origin
            reports[member.relpath] = hit
        else:
            todo.append(member)
    todo.sort(key=lambda m: -m.size)
    jobs = jobs if jobs is not None else min(len(todo), os.cpu_count() or 1)
    big = sum(m.size for m in todo)
    if jobs > 1 and len(todo) > 1 and big > PARALLEL_BYTES:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_worker, [(m, cache) for m in todo], chunksize=1))
    else:
        results = [_analyze_and_store(m, cache) for m in todo]
    for member, report in zip(todo, results, strict=True):
        reports[member.relpath] = report
    return reports
