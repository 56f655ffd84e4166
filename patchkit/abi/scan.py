"""Per-file analysis: ELF dynamic facts and device code (fatbins, raw cubins, PTX), cached.

Every file is classified by its bytes, not its name: an ELF object (shared library, extension,
executable), a raw cubin (an EM_CUDA ELF), a raw fatbin (magic 0xBA55ED50) or a PTX module.
Only the bytes that matter are read: the ELF header, the section table, the dynamic sections and
the fatbin entry headers through an mmap; a wheel member is inflated only as far as needed
(a raw cubin: until its ``.note.nv.tkinfo`` names the target).
"""

from __future__ import annotations

import contextlib
import gc
import json
import mmap
import multiprocessing
import os
import re
import signal
import struct
import sys
import threading
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from patchkit.abi.cache import ResultCache, changed, encode
from patchkit.abi.elf import ElfInfo, MalformedElf, open_mapped, prefetch, read_elf
from patchkit.abi.fatbin import (
    Fatbin,
    FatbinEntry,
    MalformedFatbin,
    cubin_info,
    describe,
    ptx_kernels,
)
from patchkit.abi.kinds import KINDS, classify
from patchkit.abi.members import (
    HEAD_BYTES,
    Member,
    extract_member,
    forget_open,
    head_chunks,
    member_head,
    prefetch_heads,
    read_member,
    read_member_head,
)
from patchkit.abi.sources import Tree, drop_wheel, store_listing
from patchkit.archives import read_regular
from patchkit.scratch import signals_held

_ARCH_FLAGS = re.compile(rb"(?:sm|compute)_\d+[af]?(?: (?:sm|compute)_\d+[af]?)+")
# Files whose bytes carry torch's TORCH_CUDA_ARCH_LIST (== torch._C._cuda_getArchFlags()).
ARCH_FLAG_FILES = ("libtorch_python.so",)
PARALLEL_BYTES = 64 << 20
# Wheel members up to this size are read into memory; larger ones go through the scratch folder.
IN_MEMORY_BYTES = 1 << 30
# Files with at most this many fatbins have every fatbin opened to count its kernels.
OPEN_ALL_BELOW = 64
# How much of a raw cubin is inflated, at most, looking for its tkinfo note.
CUBIN_HEAD = 256 << 10
_TKINFO_ARCH = re.compile(rb"-arch[ =](sm_\d+[af]?)")
_TKINFO_RELEASE = re.compile(rb"release (\d+)\.(\d+)")
_PTX_TARGET = re.compile(rb"^\s*\.target\s+(sm_\d+[af]?)", re.M)
_PTX_VERSION = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", re.M)


@dataclass
class FileReport:
    """What one file is, as far as loading it and launching its kernels go."""

    relpath: str
    origin: str
    elf: ElfInfo | None = None
    error: str | None = None  # the file could not be read
    fatbins: list[Fatbin] = field(default_factory=list)
    fatbin_error: str | None = None
    arch_flags: list[str] = field(default_factory=list)
    kind: str = "elf"  # elf | cubin | fatbin | ptx

    @property
    def kernel_fatbins(self) -> list[Fatbin]:
        """Fatbins that hold (or may hold) kernels; the empty device-link fatbin is left out."""
        return [f for f in self.fatbins if f.has_kernels is not False]

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "elf": self.elf.to_json() if self.elf else None,
            "error": self.error,
            "fatbins": [f.to_json() for f in self.fatbins],
            "fatbin_error": self.fatbin_error,
            "arch_flags": self.arch_flags,
        }

    @classmethod
    def from_json(cls, d: dict, relpath: str, origin: str) -> FileReport:
        """Rebuild from to_json() output; raises on anything else (the cache's miss)."""
        if d["kind"] not in KINDS:
            raise ValueError("kind")
        for key in ("error", "fatbin_error"):
            if d[key] is not None and not isinstance(d[key], str):
                raise TypeError(key)
        flags = d["arch_flags"]
        if not isinstance(flags, list) or not all(isinstance(x, str) for x in flags):
            raise TypeError("arch_flags")
        elf = ElfInfo.from_json(d["elf"]) if d["elf"] is not None else None
        return cls._of(d, relpath, origin, elf, [Fatbin.from_json(f) for f in d["fatbins"]], flags)

    @classmethod
    def from_worker(cls, d: dict, relpath: str, origin: str) -> FileReport:
        """from_json for a report a forked worker of this run encoded (not read from the
        cache): the same object, without checking each field (0.25 s less in the parent for
        an installed torch stack)."""
        elf = ElfInfo.from_worker(d["elf"]) if d["elf"] is not None else None
        fatbins = [Fatbin.from_worker(f) for f in d["fatbins"]]
        return cls._of(d, relpath, origin, elf, fatbins, d["arch_flags"])

    @classmethod
    def _of(
        cls, d: dict, relpath: str, origin: str, elf: ElfInfo | None, fatbins: list, flags: list
    ) -> FileReport:
        if elf is not None:
            elf.path = origin
        return cls(
            relpath=relpath,
            origin=origin,
            elf=elf,
            error=d["error"],
            fatbins=fatbins,
            fatbin_error=d["fatbin_error"],
            arch_flags=flags,
            kind=d["kind"],
        )


# An installed PTX module is read whole (its text is parsed), and never past this many bytes.
MAX_PTX_BYTES = 1 << 30


def analyze_file(path: str, relpath: str, origin: str, kind: str = "elf") -> FileReport:
    """Read one file; malformed data becomes ``error``/``fatbin_error``, never a raise."""
    if kind == "ptx":
        try:
            return analyze_ptx(read_regular(path, MAX_PTX_BYTES), relpath, origin)
        except (OSError, ValueError) as exc:
            return FileReport(
                relpath=relpath, origin=origin, kind=kind, error=f"cannot read: {exc}"
            )
    try:
        buf = open_mapped(path)
    except MalformedElf as exc:
        return FileReport(relpath=relpath, origin=origin, kind=kind, error=str(exc))
    except (OSError, ValueError) as exc:
        return FileReport(relpath=relpath, origin=origin, kind=kind, error=f"cannot read: {exc}")
    try:
        # Only the pages touched are read; tell the kernel not to read ahead around them.
        buf.madvise(mmap.MADV_RANDOM)
    except (AttributeError, OSError, ValueError):
        pass
    try:
        if kind == "cubin":
            return analyze_cubin(buf, relpath, origin)
        if kind == "fatbin":
            return analyze_fatbin_file(buf, relpath, origin)
        return analyze_buffer(buf, relpath, origin)
    finally:
        buf.close()


def analyze_buffer(buf, relpath: str, origin: str) -> FileReport:
    """Like analyze_file for an ELF object, over bytes already in memory (mmap or member).

    Over an mmap (a file that stays on disk) no fatbin image is opened here: the checks open
    one only where an answer depends on it (a fatbin lacking a target; the toolkit of an
    extension), so a cold run does not read compressed payloads it never needs.
    """
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
                buf,
                sec[0],
                sec[0] + sec[1],
                segment,
                sec[2],
                open_images=0 if isinstance(buf, mmap.mmap) else OPEN_ALL_BELOW,
            )
        except MalformedFatbin as exc:
            report.fatbin_error = str(exc)
        except (ValueError, IndexError, OverflowError, MemoryError, struct.error) as exc:
            report.fatbin_error = f"{type(exc).__name__}: {exc}"
    if os.path.basename(relpath) in ARCH_FLAG_FILES:
        sec = elf.section(".rodata")
        if sec:  # searched whole: asked for at once, not faulted in 4 kB at a time
            prefetch(buf, [sec[:2]])
        region = buf[sec[0] : sec[0] + sec[1]] if sec else buf
        m = _ARCH_FLAGS.search(region)
        if m:
            report.arch_flags = m.group(0).decode().split()
    elf.sections = {k: v for k, v in elf.sections.items() if k.startswith((".nv", ".dyn"))}
    return report


def _cubin_entry(sm: int, variant: str, size: int, abi: int) -> FatbinEntry:
    return FatbinEntry("cubin", sm, variant, "", 0, 0, size, 0, size, (1, abi), 0)


def analyze_cubin(buf, relpath: str, origin: str, size: int | None = None) -> FileReport:
    """A raw cubin (``cuModuleLoad`` input): its SM, ``a``/``f`` variant and toolkit.

    ``buf`` may be only the head of the file (a wheel member inflated part way, ``size`` its
    full length): the ELF header gives the SM, the tkinfo note (near the start in nvcc's
    layout) the variant and toolkit; with the whole file, the section table is read instead.
    """
    report = FileReport(relpath=relpath, origin=origin, kind="cubin")
    size = len(buf) if size is None else size
    try:
        if len(buf) < 64 or buf[:4] != b"\x7fELF":
            raise MalformedFatbin("cubin does not start with the ELF magic")
        kernels = None
        if len(buf) == size:
            info = cubin_info(buf)
            sm, arch_a, abi, toolkit, target = (
                info.sm,
                info.arch_a,
                info.abi_version,
                info.toolkit,
                info.target,
            )
            kernels = info.kernels
        else:
            info = cubin_info(bytes(buf[:64]))  # header fields only: the table is not in the head
            sm, arch_a, abi = info.sm, info.arch_a, info.abi_version
            region = bytes(buf)
            m = _TKINFO_ARCH.search(region)
            target = m.group(1).decode() if m else None
            rel = _TKINFO_RELEASE.search(region)
            toolkit = f"{int(rel.group(1))}.{int(rel.group(2))}" if rel else None
        variant = "a" if arch_a else ""
        if target:
            m = re.fullmatch(r"sm_(\d+)([af]?)", target)
            if m:
                sm, variant = int(m.group(1)), m.group(2)
    except (MalformedFatbin, struct.error, ValueError, IndexError) as exc:
        report.error = f"not a readable cubin: {exc}"
        return report
    fat = Fatbin(offset=0, size=size, entries=[_cubin_entry(sm, variant, size, abi)])
    fat.has_kernels = True if kernels is None else kernels > 0
    fat.kernels, fat.toolkit = kernels, toolkit
    report.fatbins = [fat]
    return report


def analyze_fatbin_file(buf, relpath: str, origin: str) -> FileReport:
    """A raw fatbin file (``nvcc -fatbin``, ``cuModuleLoadFatBinary`` input)."""
    report = FileReport(relpath=relpath, origin=origin, kind="fatbin")
    try:
        report.fatbins = describe(buf, 0, len(buf), None, 0, open_images=OPEN_ALL_BELOW)
    except MalformedFatbin as exc:
        report.fatbin_error = str(exc)
    except (ValueError, IndexError, OverflowError, MemoryError, struct.error) as exc:
        report.fatbin_error = f"{type(exc).__name__}: {exc}"
    return report


def analyze_ptx(text: bytes, relpath: str, origin: str) -> FileReport:
    """A PTX module: its ``.target`` and ``.version`` (the ISA a driver must know)."""
    report = FileReport(relpath=relpath, origin=origin, kind="ptx")
    target = _PTX_TARGET.search(text)
    version = _PTX_VERSION.search(text)
    if not target or not version:
        report.error = "PTX without a .version and .target directive"
        return report
    m = re.fullmatch(rb"sm_(\d+)([af]?)", target.group(1))
    arch, variant = int(m.group(1)), m.group(2).decode()
    ver = (int(version.group(1)), int(version.group(2)))
    entry = FatbinEntry("ptx", arch, variant, "", 0, 0, len(text), 0, len(text), ver, 0)
    fat = Fatbin(offset=0, size=len(text), entries=[entry])
    fat.kernels = ptx_kernels(text)
    fat.has_kernels = fat.kernels > 0
    report.fatbins = [fat]
    return report


# A wheel member whose head could not be read: its wheel is invalid (analyze_tree).
HEAD_UNREADABLE = "head"


def _analyze_member(member: Member) -> FileReport | None:
    """The member's report; None for an unclassified wheel member that is no ELF object and
    no device code (its head says so; nothing more of it is read)."""
    if member.path is None and member.wheel is not None:
        if not member.kind:
            if member.size > CUBIN_HEAD:  # may be a cubin read only to its note: head first
                try:
                    head = member_head(member)
                except Exception as exc:  # zipfile/zlib errors on a corrupt member
                    return _unreadable(member, exc)
                member.kind = classify(head, member.relpath) or ""
                if not member.kind:
                    return None
            else:  # read whole anyway: classified by its first bytes once inflated
                return _classify_small(member)
        try:
            if member.kind == "cubin":
                return _cubin_member(member)
            if member.size <= IN_MEMORY_BYTES:
                return _analyze_data(member, read_member(member))
            path = extract_member(member)
        except (zlib.error, EOFError, ValueError, OSError, RuntimeError, KeyError) as exc:
            return FileReport(
                member.relpath, member.origin, kind=member.kind, error=f"invalid archive: {exc}"
            )
        except Exception as exc:  # zipfile raises BadZipFile and others on corrupt members
            return FileReport(
                member.relpath, member.origin, kind=member.kind, error=f"invalid archive: {exc}"
            )
        try:
            return analyze_file(path, member.relpath, member.origin, member.kind)
        finally:
            os.unlink(path)  # the scratch copy is only needed while it is read
    return analyze_file(member.path, member.relpath, member.origin, member.kind)


def _unreadable(member: Member, exc: BaseException) -> FileReport:
    return FileReport(
        member.relpath,
        member.origin,
        kind=HEAD_UNREADABLE,
        error=f"invalid archive: {member.relpath}: {exc}",
    )


def _cubin_member(member: Member, started=None) -> FileReport:
    """A raw cubin in a wheel, inflated as far as its tkinfo note (the target, the toolkit);
    the ELF header gives the SM. One over CUBIN_HEAD is taken to hold kernels; a smaller one
    whose head names a ``.text.`` section (its section names come first in nvcc's layout)
    does, and one whose head does not, or that its head covers, is read whole (its kernels
    counted from the section table, size and CRC-32 checked)."""
    head = read_member_head(member, CUBIN_HEAD, b"-arch", started)
    if member.size > CUBIN_HEAD or (len(head) < member.size and b".text." in head):
        return analyze_cubin(head, member.relpath, member.origin, member.size)
    return analyze_cubin(read_member(member), member.relpath, member.origin)


def _classify_small(member: Member) -> FileReport | None:
    """An unclassified member up to CUBIN_HEAD: classified by its first inflated piece, then
    read as its kind is (a cubin to its note, anything else whole). A damaged one is judged
    as listing it would have: by its head alone (an unreadable head makes the wheel invalid; a
    non-code member is skipped, damaged or not)."""
    pieces = head_chunks(member)
    try:
        first = next(pieces, b"")
        kind = classify(first[:HEAD_BYTES], member.relpath)
        if kind is None:
            pieces.close()
            return None
        member.kind = kind
        if kind == "cubin":
            return _cubin_member(member, (pieces, first))
        pieces.close()
        return _analyze_data(member, read_member(member))
    except Exception as exc:  # zipfile/zlib errors on a corrupt member
        try:
            head = member_head(member)
        except Exception as head_exc:
            return _unreadable(member, head_exc)
        kind = classify(head, member.relpath)
        if kind is None:
            return None
        member.kind = kind
        return FileReport(member.relpath, member.origin, kind=kind, error=f"invalid archive: {exc}")


def _analyze_data(member: Member, data) -> FileReport:
    if member.kind == "ptx":
        return analyze_ptx(data, member.relpath, member.origin)
    if member.kind == "cubin":
        return analyze_cubin(data, member.relpath, member.origin)
    if member.kind == "fatbin":
        return analyze_fatbin_file(data, member.relpath, member.origin)
    return analyze_buffer(data, member.relpath, member.origin)


# The members a forked worker reads by index (set before the pool starts, so a batch is a
# list of numbers, not thousands of pickled members).
_SHARED: list[Member] = []
_FORK_LOCK = threading.Lock()


def _worker(args: tuple[list, bool]) -> list:
    """Each member's report as JSON text, UTF-8 encoded (what the cache stores; the parent
    decodes it and stores it as it is: bytes cross the pipe without being transcoded, and
    are written without being encoded again), None for a member that is no ELF object or
    device code, (HEAD_UNREADABLE, error) for one whose head cannot be read.
    """
    batch, by_index = args
    members = [_SHARED[i] for i in batch] if by_index else batch
    prefetch_heads(members)
    out: list = []
    with no_collector():
        for member in members:
            report = _analyze_member(member)
            if report is None:
                out.append(None)
            elif report.kind == HEAD_UNREADABLE:
                out.append((HEAD_UNREADABLE, report.error))
            else:
                text = encode(report.to_json())
                try:
                    out.append(text.encode("utf-8", "surrogateescape"))
                except UnicodeEncodeError:  # a lone surrogate in a name: sent as text
                    out.append(text)
    return out


@contextlib.contextmanager
def no_collector():
    """The cyclic collector off while reports are built or decoded: they make no cycles, but
    their hundreds of thousands of tuples and lists set off collection after collection, each
    walking every young object (0.19 s of 0.37 s decoding an installed torch's reports)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _worker_init() -> None:
    """A worker's start: its own wheel descriptors, and glibc's malloc told to keep large
    blocks in the heap (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD: 1 GiB). Each inflate step's
    output and each member's buffer would otherwise be a fresh mmap, faulted in page by page
    and unmapped after: on the 0.5.12 payload that was as much system time as inflating
    (1.3 GB: 1.2-1.6 s sys, 0.04 s kept in the heap)."""
    forget_open()
    # Ctrl-C (and `timeout`'s SIGTERM) reach the whole process group: the parent alone
    # answers them, dropping the batches not started and waiting for those under way. A
    # worker stopped inside the pool's protocol (a result half written) left the parent
    # reading the rest of it for ever. A worker whose parent is gone ends at its next read.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, IN_MEMORY_BYTES)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, IN_MEMORY_BYTES)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc: only slower
        pass


def _pool_context():
    """fork on Linux (the workers see ``_SHARED``), else the platform's default."""
    if not sys.platform.startswith("linux"):
        return None, False
    try:
        return multiprocessing.get_context("fork"), True
    except ValueError:
        return None, False


def _files_root(member: Member) -> str:
    """The folder an installed member was found under (its path less its relpath)."""
    path = member.path or ""
    if member.relpath and path.endswith(member.relpath):
        return path[: len(path) - len(member.relpath)]
    return os.path.dirname(path) + os.sep


def _object(d):
    if not isinstance(d, dict):
        raise TypeError("files")
    return d


def _load_files(cache: ResultCache, root: str, members: list[Member], reports: dict) -> list:
    """Reports of installed files from their folder's entry (``files:<root>``: each file's
    cache key -> [size, mtime, report]); the members whose item is missing, stale or
    ill-typed are returned (each such item a miss of its own, not of the entry)."""
    entry = cache.load("files:" + root, 0, 0, _object)
    missed = []
    for member in members:
        item = entry.get(member.cache_key) if entry else None
        try:
            size, mtime, value = item
            if (size, mtime) != (member.size, member.mtime) or type(size) is not int:
                raise ValueError("stale")
            reports[member.relpath] = FileReport.from_json(value, member.relpath, member.origin)
        except Exception:  # missing, stale, ill-typed: a miss
            missed.append(member)
    return missed


def _files_entry(members: list[Member], reports, texts) -> list[bytes | str] | str:
    """The text, in pieces, of the one entry for a folder's installed files (a file per
    object would be hundreds of file creations, each a journal commit: 1 ms apiece on ext4
    here, more than parsing them)."""
    pieces = []
    for m in members:
        r = reports.get(m.relpath)
        if r is None or (r.error or "").startswith("invalid archive"):
            continue
        sep = "," if pieces else "{"
        pieces += [
            f"{sep}{encode(m.cache_key)}:[{m.size},{m.mtime},",
            texts.get(m.relpath) or encode(r.to_json()),
            "]",
        ]
    return pieces + ["}"] if pieces else "{}"


def _batches(todo: list[Member], jobs: int) -> list[list[Member]]:
    """Largest first, then small files in batches (thousands of cubins are not one task each)."""
    out: list[list[Member]] = []
    small: list[Member] = []
    for m in todo:
        if m.size >= (8 << 20):
            out.append([m])
        else:
            small.append(m)
    per = max(1, len(small) // (jobs * 4) or 1)
    # in the order they lie in their wheel: a batch reads one stretch of it
    small.sort(key=lambda m: (m.wheel or "", m.zinfo.header_offset if m.zinfo else 0))
    out += [small[i : i + per] for i in range(0, len(small), per)]
    return out


def _loads(text: bytes | str):
    """A worker's JSON; bytes that are not UTF-8 (a path's undecodable bytes, escaped) are
    decoded as they were encoded."""
    try:
        return json.loads(text)
    except UnicodeDecodeError:
        return json.loads(text.decode("utf-8", "surrogateescape"))


def _decode_batches(batches, done, texts: dict, results: list) -> None:
    """The workers' reports, batch by batch as they come: JSON text (kept for the cache),
    None (no ELF object, no device code) or (HEAD_UNREADABLE, error)."""
    for batch, encoded in zip(batches, done, strict=True):
        for member, got in zip(batch, encoded, strict=True):
            if isinstance(got, (bytes, str)):
                texts[member.relpath] = got
                rep = FileReport.from_worker(_loads(got), member.relpath, member.origin)
            elif got is not None:
                rep = FileReport(member.relpath, member.origin, kind=got[0], error=got[1])
            else:
                rep = None
            results.append(rep)


def _wheel_key(wheel: str) -> tuple[str, int, int]:
    st = os.stat(wheel)
    return "wheel:" + os.path.realpath(wheel), st.st_size, changed(st)


def analyze_tree(
    tree: Tree,
    cache: ResultCache,
    jobs: int | None = None,
    meanwhile=None,
    writes: list[threading.Thread] | None = None,
) -> dict[str, FileReport]:
    """A FileReport per object in ``tree``: from the cache, else computed in parallel.

    Installed files are cached one entry per folder they were found under (site-packages), each
    file an item of its own; the members of a wheel one entry per wheel
    (a wheel of 5,000 cubins is one file to write and read, not 5,000). Wheel members not yet
    classified are classified by the worker that reads them: those that are no ELF object and
    no device code leave ``tree.members``; one whose head cannot be read makes its wheel
    invalid (``tree.invalid``), as listing it would have. Each wheel's listing is stored.
    ``meanwhile``: called once in this process while the workers read (after they are forked:
    no thread runs across a fork), or at the end when there are none. ``writes``: where given,
    the entries of files and wheels are written by threads appended to it, which the caller
    joins (their writes wait in the kernel, not on the GIL, while the caller goes on)."""
    reports: dict[str, FileReport] = {}
    wheels, files = _by_source(tree)
    todo, stale = _cached_files(cache, files, reports)
    missed, computed = _cached_wheels(cache, wheels, reports)
    todo += missed
    todo.sort(key=lambda m: -m.size)
    jobs = jobs if jobs is not None else min(len(todo), os.cpu_count() or 1)
    texts: dict[str, bytes | str] = {}  # relpath -> the report as JSON, from a worker
    if jobs > 1 and len(todo) > 1 and sum(m.size for m in todo) > PARALLEL_BYTES:
        todo, results = _analyze_in_workers(todo, jobs, meanwhile, texts)
        meanwhile = None
    else:
        with no_collector():
            results = [_analyze_member(m) for m in todo]
    if meanwhile is not None:
        meanwhile()
    unreadable = _take_results(tree, todo, results, reports, wheels)
    store = _storer(cache, writes)
    for root in stale if cache.enabled else ():
        store("files:" + root, 0, 0, _files_entry(files[root], reports, texts))
    for wheel in computed:
        entry = None if wheel in unreadable else _wheel_entry(wheels[wheel], reports, texts)
        if entry is not None:
            store(*entry)
    _store_listings(cache, tree, wheels, computed, reports)
    return reports


def _by_source(tree: Tree) -> tuple[dict[str, list[Member]], dict[str, list[Member]]]:
    """The members by wheel, and the installed files by the folder they were found in."""
    wheels: dict[str, list[Member]] = {}
    files: dict[str, list[Member]] = {}
    for member in tree.members.values():
        if member.wheel is not None:
            wheels.setdefault(member.wheel, []).append(member)
        else:
            files.setdefault(_files_root(member), []).append(member)
    return wheels, files


def _store_listings(
    cache: ResultCache, tree: Tree, wheels: dict, computed: list[str], reports: dict
) -> None:
    """Each wheel's listing, its members classified, for the next run (not for a wheel whose
    listing came from the cache, nor one found to be an invalid archive)."""
    for info in tree.wheels.values():
        if info.listed or (info.path in wheels and info.path not in computed):
            continue
        kept = [m for m in wheels.get(info.path, ()) if m.relpath in tree.members]
        if any((reports[m.relpath].error or "").startswith("invalid archive") for m in kept):
            continue
        store_listing(cache, info, kept)


def _storer(cache: ResultCache, writes: list[threading.Thread] | None):
    """How an entry is written: now, or by a thread appended to `writes`."""

    def store(key: str, size: int, mtime: int, value) -> None:
        if writes is None:
            cache.store_encoded(key, size, mtime, value)
        else:  # the write (tens of MB) overlaps the caller's checks: it waits in the kernel
            thread = threading.Thread(
                target=cache.store_encoded, args=(key, size, mtime, value),
                name="patchkit-cache-write",
            )  # fmt: skip
            with signals_held():  # started and recorded to be waited for, or neither
                thread.start()
                writes.append(thread)

    return store


def _cached_files(
    cache: ResultCache, files: dict[str, list[Member]], reports: dict
) -> tuple[list[Member], list[str]]:
    """The installed files' reports the cache holds, into `reports`; returns the files to read
    and the folders whose entry is to be written again."""
    todo: list[Member] = []
    stale: list[str] = []
    for root, members in files.items():
        with no_collector():
            missed = _load_files(cache, root, members, reports) if cache.enabled else members
        if missed:
            todo.extend(missed)
            stale.append(root)
    return todo, stale


def _cached_wheels(
    cache: ResultCache, wheels: dict[str, list[Member]], reports: dict
) -> tuple[list[Member], list[str]]:
    """The wheels' reports the cache holds (one entry per wheel), into `reports`; returns the
    members to read and the wheels whose entry is to be written."""
    todo: list[Member] = []
    computed: list[str] = []
    for wheel, members in wheels.items():
        origins = {m.relpath: m.origin for m in members}

        def decode(d, origins=origins):
            if not isinstance(d, dict) or set(d) != set(origins):
                raise ValueError("members")
            return {rel: FileReport.from_json(v, rel, origins[rel]) for rel, v in d.items()}

        try:
            key = _wheel_key(wheel)
        except OSError:
            key = None
        # Unclassified members (no listing): the entry's member set cannot be compared.
        pending = any(not m.kind for m in members)
        hit = cache.load(*key, decode) if key and not pending else None
        if hit is not None:
            reports.update(hit)
        else:
            todo.extend(members)
            computed.append(wheel)
    return todo, computed


def _analyze_in_workers(
    todo: list[Member], jobs: int, meanwhile, texts: dict
) -> tuple[list[Member], list[FileReport | None]]:
    """`todo` read by `jobs` forked workers in batches; returns the members in the order of the
    results and the results. `meanwhile` (if any) runs once the workers are forked."""
    batches = _batches(todo, jobs)
    todo = [m for b in batches for m in b]
    context, by_index = _pool_context()
    if by_index:
        args, at = [], 0
        for b in batches:
            args.append((list(range(at, at + len(b))), True))
            at += len(b)
    else:
        args = [(b, False) for b in batches]
    # Objects alive now stay out of the collector's sight: a forked worker collecting would
    # touch every one of them and copy the parent's whole heap, page by page.
    gc.freeze()
    results: list[FileReport | None] = []
    _FORK_LOCK.acquire()  # one tree in _SHARED until its workers are forked
    forked = False
    try:
        _SHARED[:] = todo if by_index else []
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_worker_init)
        try:
            # the workers are forked here, then the pool's manager thread started: an
            # interrupt between the two would leave shutdown waiting on a thread never started
            with signals_held():
                done = pool.map(_worker, args)
            _SHARED.clear()
            forked = True
            _FORK_LOCK.release()
            if meanwhile is not None:
                meanwhile()
            # decoded batch by batch as they come, while the workers read the next ones
            with no_collector():
                _decode_batches(batches, done, texts, results)
        except BaseException:  # an interrupt, a failure: the batches not started are dropped
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
    finally:
        if not forked:
            _SHARED.clear()
            _FORK_LOCK.release()
        gc.unfreeze()
    return todo, results


def _take_results(
    tree: Tree,
    todo: list[Member],
    results: list[FileReport | None],
    reports: dict,
    wheels: dict[str, list[Member]],
) -> dict[str, str]:
    """The workers' results into `reports` and `tree` (members that are no code leave it; a
    wheel with a member whose head cannot be read is dropped); returns those wheels, each with
    the reason."""
    unreadable: dict[str, str] = {}
    for member, report in zip(todo, results, strict=True):
        if report is None:  # no ELF object, no device code
            tree.members.pop(member.relpath, None)
        elif report.kind == HEAD_UNREADABLE:
            unreadable.setdefault(member.wheel, report.error or "invalid archive")
        else:
            reports[member.relpath] = report
            member.kind = report.kind  # (a worker classified its own copy)
            tree.dirs.add(os.path.dirname(member.relpath))
    for wheel, reason in unreadable.items():
        info = tree.wheels.get(wheel)
        for m in wheels[wheel]:
            reports.pop(m.relpath, None)
        if info is not None:
            drop_wheel(tree, info, reason)
    return unreadable


def _wheel_entry(members: list[Member], reports: dict, texts: dict):
    """(key, size, mtime, value) of a wheel's cache entry, or None when it is not to be kept
    (a member is an invalid archive, the wheel cannot be stat'ed)."""
    found = [reports[m.relpath] for m in members if m.relpath in reports]
    if any((r.error or "").startswith("invalid archive") for r in found):
        return None
    try:
        key = _wheel_key(members[0].wheel)
    except OSError:
        return None
    pieces: list[bytes | str] = []
    for r in found:
        sep = "," if pieces else "{"
        pieces += [f"{sep}{encode(r.relpath)}:", texts.get(r.relpath) or encode(r.to_json())]
    return (*key, pieces + ["}"] if pieces else "{}")
