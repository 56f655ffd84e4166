"""Wheel members read in place, without zipfile's per-member cost: the central directory
parsed with struct, one descriptor per wheel, verify's own inflater that stops as soon as the
bytes wanted are out (a member's head, a raw cubin's note), and extraction of a member into
the scratch folder when a reader needs a file."""

from __future__ import annotations

import importlib
import os
import stat
import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import NamedTuple

from patchkit.archives import SpecialFileError, file_kind, member_decoder, open_regular


@dataclass
class Member:
    """A shared object: its installed path, where to read it, and a cache identity."""

    relpath: str  # posix, relative to site-packages
    path: str | None  # readable file (None: wheel member not extracted, served from cache)
    size: int
    mtime: int  # ns for files; for wheel members the wheel's mtime mixed with the CRC
    origin: str  # what to print: the file path, or "wheel.whl!member"
    cache_key: str
    wheel: str | None = None  # the wheel this member is read from
    scratch: str | None = None  # where it may be extracted
    kind: str = "elf"  # kinds.classify: elf | cubin | fatbin | ptx
    # the member's central-directory entry, so a worker reads it without parsing the directory
    zinfo: Entry | zipfile.ZipInfo | None = None


HEAD_BYTES = 64


class Entry(NamedTuple):
    """A central-directory entry: what reading a member needs (the attribute names are
    zipfile.ZipInfo's, so archives.member_problem reads it as it reads a ZipInfo)."""

    filename: str
    raw_name: bytes  # as stored, what the local header must repeat
    header_offset: int
    compress_size: int
    file_size: int
    CRC: int
    compress_type: int
    flag_bits: int
    external_attr: int

    def is_dir(self) -> bool:
        return self.filename.endswith("/")


_CENTRAL = struct.Struct(zipfile.structCentralDir)


def central_directory(path: str) -> list[Entry]:
    """The wheel's central directory, read with one read and parsed entry by entry with
    struct (no ZipInfo objects). An archive this reader does not take the short way with
    (bytes prepended to the zip, ZIP64 sizes or offsets, a newer version) goes through zipfile,
    which also gives its errors for a damaged one."""
    entries = _fast_directory(path)
    if entries is not None:
        return entries
    with zipfile.ZipFile(path) as zf:
        return [
            Entry(
                i.filename,
                i.orig_filename.encode("utf-8" if i.flag_bits & 0x800 else "cp437"),
                i.header_offset,
                i.compress_size,
                i.file_size,
                i.CRC,
                i.compress_type,
                i.flag_bits,
                i.external_attr,
            )
            for i in zf.infolist()
        ]


def _fast_directory(path: str) -> list[Entry] | None:
    with open_regular(path) as fp:  # a FIFO swapped in since listing: refused, not waited on
        end = zipfile._EndRecData(fp)
        if end is None or end[zipfile._ECD_SIGNATURE] != zipfile.stringEndArchive:
            return None
        size_cd, offset_cd = end[zipfile._ECD_SIZE], end[zipfile._ECD_OFFSET]
        if end[zipfile._ECD_LOCATION] - size_cd - offset_cd != 0 or 0xFFFFFFFF in (
            size_cd,
            offset_cd,
        ):
            return None
        fp.seek(offset_cd)
        data = fp.read(size_cd)
    if len(data) != size_cd:
        return None
    out: list[Entry] = []
    pos, unpack, fixed = 0, _CENTRAL.unpack_from, _CENTRAL.size
    while pos < size_cd:
        if pos + fixed > size_cd:
            return None
        f = unpack(data, pos)
        if f[0] != b"PK\x01\x02" or f[3] > zipfile.MAX_EXTRACT_VERSION:
            return None
        csize, usize, offset = f[10], f[11], f[18]
        if 0xFFFFFFFF in (csize, usize, offset):
            return None  # ZIP64 extra fields: zipfile decodes them
        name_end = pos + fixed + f[12]
        raw = data[pos + fixed : name_end]
        if f[5] & 0x800:
            name = raw.decode("utf-8")
        else:
            name = raw.decode("ascii") if raw.isascii() else raw.decode("cp437")
        if "\0" in name:
            name = name[: name.index("\0")]
        out.append(Entry(name, raw, offset, csize, usize, f[9], f[6], f[5], f[17]))
        pos = name_end + f[13] + f[14]
    return out


def member_head(member: Member) -> bytes:
    """A wheel member's first HEAD_BYTES (what classifies it), inflated only that far."""
    assert member.wheel is not None and member.zinfo is not None
    fd, _ = _fd(member.wheel)
    return _head(fd, member.zinfo, HEAD_BYTES)


_OPEN: dict[str, zipfile.ZipFile] = {}


def _zip(path: str) -> zipfile.ZipFile:
    """One open ZipFile per wheel and process: its central directory is parsed once, not per
    member (a wheel of 10,000 cubins)."""
    zf = _OPEN.get(path)
    if zf is None:
        if len(_OPEN) > 16:
            for old in _OPEN.values():
                old.close()
            _OPEN.clear()
        zf = _OPEN[path] = zipfile.ZipFile(path)
    return zf


_FDS: dict[str, tuple[int, int, tuple]] = {}


def _identity(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _fd(path: str) -> tuple[int, int]:
    """A descriptor of the wheel (read with pread only, so one per process serves every
    member) and the wheel's size; reopened when the file at ``path`` is another one now."""
    st = os.stat(path)
    got = _FDS.get(path)
    if got is not None and got[2] == _identity(st):
        return got[0], got[1]
    if got is not None:
        os.close(got[0])
        del _FDS[path]
    if len(_FDS) > 64:
        for old in _FDS.values():
            os.close(old[0])
        _FDS.clear()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # pread only: never blocks on a file
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SpecialFileError(f"{path} is {file_kind(st.st_mode)}, not a regular file")
    _FDS[path] = (fd, st.st_size, _identity(st))
    return fd, st.st_size


def prefetch_heads(members: list[Member], head: int = 64 << 10) -> None:
    """Ask the disk for the start of each wheel member at once (local header and up to
    ``head`` stored bytes; POSIX_FADV_WILLNEED), so a cold wheel serves those reads in flight
    together instead of one blocking read per member."""
    for member in members:
        info = member.zinfo
        if member.wheel is None or info is None:
            continue
        try:
            fd, _ = _fd(member.wheel)
            length = _LOCAL_HEADER.size + 1024 + min(info.compress_size, head)
            os.posix_fadvise(fd, info.header_offset, length, os.POSIX_FADV_WILLNEED)
        except (AttributeError, OSError):
            return


def forget_open() -> None:
    """In a forked worker: drop the parent's open wheels (their file offsets are shared)."""
    _OPEN.clear()
    _FDS.clear()


# Compressed bytes read per step: the kernel is asked for the whole member up front
# (POSIX_FADV_WILLNEED), so the disk reads ahead while the steps before are inflated.
INFLATE_STEP = 4 << 20


_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")


_BACKEND: list = []


def inflate_backend():
    """The zlib-compatible module members are inflated with: ``zlib_ng`` (zlib-ng), else
    ``isal`` (ISA-L), else the standard library's ``zlib``. The first two inflate the same
    deflate streams 2-3x faster; they are optional (``pip install 'patchkit[fast-inflate]'``)."""
    if not _BACKEND:
        for name in ("zlib_ng.zlib_ng", "isal.isal_zlib"):
            try:
                _BACKEND.append(importlib.import_module(name))
                break
            except ImportError:
                continue
        else:
            _BACKEND.append(zlib)
    return _BACKEND[0]


def _data_range(fd: int, info, file_size: int | None = None) -> int:
    """Where the member's stored bytes start, after its local header (checked as zipfile
    checks it: signature, not encrypted, the same name as the central directory's)."""
    what = f"member {info.filename!r}"
    head = os.pread(fd, _LOCAL_HEADER.size + 512, info.header_offset)
    if len(head) < _LOCAL_HEADER.size:
        raise ValueError(f"{what}: truncated local header")
    fields = _LOCAL_HEADER.unpack_from(head)
    if fields[0] != b"PK\x03\x04":
        raise ValueError(f"{what}: bad local header signature")
    if info.flag_bits & 0x1:
        raise ValueError(f"{what} is encrypted")
    name_len, extra_len = fields[10], fields[11]
    name = head[_LOCAL_HEADER.size : _LOCAL_HEADER.size + name_len]
    if len(name) < name_len:
        name = os.pread(fd, name_len, info.header_offset + _LOCAL_HEADER.size)
    if isinstance(info, Entry):
        want = info.raw_name
    else:
        want = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
    if name != want:
        raise ValueError(f"{what}: local header names {name!r}")
    start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    size = os.fstat(fd).st_size if file_size is None else file_size
    if start + info.compress_size > size:
        raise ValueError(f"{what} runs past the end of the wheel")
    return start


def _held(decoder, most: int) -> bytes:
    """Output from input the decoder holds already, at most ``most`` bytes (b"": none)."""
    tail = getattr(decoder, "unconsumed_tail", None)  # zlib's way
    if tail is not None:
        return decoder.decompress(tail, most) if tail else b""
    return b"" if decoder.needs_input else decoder.decompress(b"", most)


def _stored(fd: int, pos: int, size: int, step: int, relpath: str):
    """A member's ``size`` stored bytes from ``pos``, ``step`` bytes at a time."""
    end = pos + size
    while pos < end:
        chunk = os.pread(fd, min(step, end - pos), pos)
        if not chunk:
            raise ValueError(f"member {relpath!r} runs past the end of the wheel")
        pos += len(chunk)
        yield chunk


def _decoded(decoder, raw, step: int):
    """The decoded bytes of ``raw`` (stored chunks), in pieces of ``step`` bytes at most (the
    last may be shorter), none decoded before it is taken."""
    while True:
        out = b""
        while len(out) < step and not decoder.eof:
            more = _held(decoder, step - len(out))
            if not more:
                data = next(raw, None)
                if data is None:
                    break
                more = decoder.decompress(data, step - len(out))
            out += more
        if not out:
            return
        yield out


def _head(fd: int, info, n: int) -> bytes:
    """A member's first ``n`` bytes (its local header checked; decoded only that far)."""
    start = _data_range(fd, info)
    decoder = member_decoder(info.compress_type, inflate_backend())
    if decoder is None:
        return os.pread(fd, min(n, info.compress_size), start)
    raw = _stored(fd, start, info.compress_size, 4096, info.filename)
    return next(_decoded(decoder, raw, n), b"")


def _ask_ahead(fd: int, start: int, size: int) -> None:
    """Ask the disk for a large member's whole stored range at once: it reads ahead while the
    steps before are inflated."""
    if size > INFLATE_STEP:
        try:
            os.posix_fadvise(fd, start, size, os.POSIX_FADV_WILLNEED)
        except (AttributeError, OSError):
            pass


def _pieces(member: Member, check_crc: bool = True, step: int | None = None):
    """A member's bytes, decoded step by step (no zipfile object, no copy of the compressed
    bytes in memory), never more than one byte past its declared size: a lying header gains
    nothing (the rest of the input stays unconsumed and the member is refused). Ends with the
    size and CRC-32 checked against the central directory."""
    assert member.wheel is not None
    info = member.zinfo or _zip(member.wheel).getinfo(member.relpath)
    fd, wheel_size = _fd(member.wheel)
    start = _data_range(fd, info, wheel_size)
    _ask_ahead(fd, start, info.compress_size)
    decoder = member_decoder(info.compress_type, inflate_backend())
    crc32 = inflate_backend().crc32
    produced, crc = 0, 0
    for chunk in _stored(fd, start, info.compress_size, step or INFLATE_STEP, member.relpath):
        piece = decoder.decompress(chunk, info.file_size - produced + 1) if decoder else chunk
        produced += len(piece)
        if produced > info.file_size:
            raise ValueError(f"member {member.relpath!r} is larger than its header says")
        if check_crc:
            crc = crc32(piece, crc)
        yield piece
    _check_end(member.relpath, info, decoder, produced, crc if check_crc else None)


def _check_end(relpath: str, info, decoder, produced: int, crc: int | None) -> None:
    """A member read to its end: its stream complete, its size and CRC-32 the directory's."""
    if decoder is not None and not decoder.eof:
        raise ValueError(f"member {relpath!r}: compressed stream is truncated")
    if produced != info.file_size:
        raise ValueError(f"member {relpath!r} is smaller than its header says")
    if crc is not None and crc != info.CRC:
        raise ValueError(f"Bad CRC-32 for member {relpath!r}")


def read_member(member: Member) -> bytes | bytearray:
    """A wheel member's bytes (size and CRC-32 checked), inflated into one buffer."""
    assert member.wheel is not None
    pieces = _pieces(member)
    first = next(pieces, b"")
    if len(first) == member.size:  # the usual small member: one step, no copy
        for _ in pieces:  # the checks at the end (and nothing more may come)
            raise ValueError(f"member {member.relpath!r} is larger than its header says")
        return first
    if len(first) > member.size:
        raise ValueError(f"member {member.relpath!r} is larger than its header says")
    out = bytearray(member.size)
    view = memoryview(out)
    view[: len(first)] = first
    pos = len(first)
    for piece in pieces:
        if pos + len(piece) > len(out):
            raise ValueError(f"member {member.relpath!r} is larger than its header says")
        view[pos : pos + len(piece)] = piece
        pos += len(piece)
    view.release()
    if pos != len(out):
        raise ValueError(f"member {member.relpath!r} is smaller than its header says")
    return out


HEAD_STEP = 4096


def head_chunks(member: Member, step: int = HEAD_STEP):
    """A wheel member's bytes from its start in ``step``-byte pieces, decoded only as far as
    they are taken (no more output than asked for per piece); neither size nor CRC-32 is
    checked, the member is not meant to be read to its end this way."""
    assert member.wheel is not None
    info = member.zinfo or _zip(member.wheel).getinfo(member.relpath)
    fd, wheel_size = _fd(member.wheel)
    pos = _data_range(fd, info, wheel_size)
    raw = _stored(fd, pos, info.compress_size, step, member.relpath)
    decoder = member_decoder(info.compress_type, inflate_backend())
    yield from raw if decoder is None else _decoded(decoder, raw, step)


def read_member_head(member: Member, limit: int, until: bytes, started=None) -> bytes:
    """A wheel member's first bytes, inflated in HEAD_STEP steps until ``until`` appears (then
    4 kB more: the rest of the note), or ``limit``; the member is not read to its end, so
    neither its size nor its CRC-32 is checked. ``started``: (a ``head_chunks`` generator,
    the bytes already taken from it)."""
    pieces, out = started if started is not None else (head_chunks(member), b"")
    try:
        if until in out:
            return out + next(pieces, b"")[:4096]
        for chunk in pieces:
            out += chunk
            if until in out[-len(chunk) - len(until) :]:
                return out + next(pieces, b"")[:4096]  # the rest of the note
            if len(out) >= limit:
                return out
        return out
    finally:
        pieces.close()


def extract_member(member: Member) -> str:
    """Write a wheel member under the scratch folder (never outside it) and return its path."""
    assert member.wheel is not None and member.scratch is not None
    root = os.path.realpath(member.scratch)
    target = os.path.realpath(os.path.join(root, member.relpath))
    if not target.startswith(root + os.sep):
        raise ValueError(f"member {member.relpath!r} would land outside the scratch folder")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        with open(target, "wb") as dst:
            for piece in _pieces(member):
                dst.write(piece)
    except BaseException:
        os.unlink(target)
        raise
    return target
