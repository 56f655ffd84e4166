"""Wheel (zip) archives that patchkit reads without installing: refuse hostile members.

Shared by `verify --wheelhouse` and `inspect WHEEL`: a member with an absolute or climbing
name, a symbolic link, a duplicate name, an encrypted member, an unknown compression method,
or a size that looks like a decompression bomb makes the whole archive invalid, before
anything is read from it. Members are then read with a size limit checked before and while
decompressing (`read_member`, `hash_member`), and files with `open_regular`, which refuses a
FIFO or device instead of blocking on it.
"""

from __future__ import annotations

import base64
import bz2
import hashlib
import lzma
import os
import re
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator
from typing import BinaryIO

MAX_MEMBER_BYTES = 8 << 30
# A member that inflates more than MAX_RATIO times is a decompression bomb once it claims more
# than BOMB_MIN_BYTES: below that a high ratio is a real library's page-alignment padding
# (pillow 13.0.0's libXau: 2 MB from 9 kB, 224x), and a bomb of it costs nothing.
MAX_RATIO = 200
BOMB_MIN_BYTES = 16 << 20
MAX_WHEEL_BYTES = 32 << 30
MAX_METADATA_BYTES = 4 << 20
MAX_RECORD_BYTES = 64 << 20
MAX_JSON_BYTES = 16 << 20
KNOWN_COMPRESSION = {
    zipfile.ZIP_STORED: "stored",
    zipfile.ZIP_DEFLATED: "deflate",
    zipfile.ZIP_BZIP2: "bzip2",
    zipfile.ZIP_LZMA: "lzma",
}
# What a damaged or crafted member raises while it is read (bad CRC, truncated stream, ...).
READ_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    EOFError,
    OSError,
    RuntimeError,  # encrypted
    NotImplementedError,  # compression method
    ValueError,
)


class MemberError(Exception):
    """One member cannot be read safely; the message names it and says why."""


class SpecialFileError(OSError):
    """A path that is not a regular file (a FIFO, socket or device) where one is needed."""


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def file_kind(mode: int) -> str:
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "not a regular file"


def open_regular(path: os.PathLike | str) -> BinaryIO:
    """Open a regular file for reading; a FIFO or device is refused, never waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SpecialFileError(f"{path} is {file_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: os.PathLike | str, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them: a FIFO or device is refused
    (SpecialFileError), never waited on or read without end; a longer file is refused
    (ValueError) after ``limit + 1`` bytes, whatever it claims."""
    with open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return data


def special_file_problem(path: os.PathLike | str) -> str | None:
    """Why `path` (followed if a symlink) is not a regular file, or None (also when absent)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else f"{path} is {file_kind(mode)}, not a regular file"


def member_problem(info: zipfile.ZipInfo, seen: set[str]) -> str | None:
    """Why one member makes the archive unsafe to read, or None."""
    name = info.filename
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return f"member {name!r} has an absolute path"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return f"member {name!r} escapes the archive root (..)"
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return f"member {name!r} is a symbolic link"
    if name in seen:
        return f"member {name!r} appears twice"
    if info.flag_bits & 0x1:
        return f"member {name!r} is encrypted"
    if info.compress_type not in KNOWN_COMPRESSION:
        return f"member {name!r} uses unknown compression method {info.compress_type}"
    if info.file_size > MAX_MEMBER_BYTES:
        return f"member {name!r} claims {info.file_size} bytes uncompressed"
    if is_bomb(info.file_size, info.compress_size):
        ratio = info.file_size // max(info.compress_size, 1)
        return f"member {name!r} expands {ratio}x (a decompression bomb)"
    return None


def is_bomb(file_size: int, compress_size: int) -> bool:
    return file_size > BOMB_MIN_BYTES and file_size > MAX_RATIO * max(compress_size, 1)


def archive_problem(infos: list[zipfile.ZipInfo]) -> str | None:
    """Why the archive as a whole is unsafe to read (first problem), or None."""
    seen: set[str] = set()
    total = 0
    for info in infos:
        problem = member_problem(info, seen)
        total += info.file_size
        if problem is None and total > MAX_WHEEL_BYTES:
            problem = f"members add up to {total} bytes uncompressed"
        if problem:
            return problem
        seen.add(info.filename)
    return None


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def claim_problem(info, limit: int) -> str | None:
    """Why a member is refused before a byte of it is inflated: its header claims more than
    `limit` bytes (`info`: a ZipInfo, or anything with its `filename` and `file_size`)."""
    if info.file_size > limit:
        return f"member {info.filename!r} claims {info.file_size} bytes (limit {limit})"
    return None


def member_decoder(compress_type: int, inflate=zlib):
    """A decoder whose every call is bounded in output (`decompress(data, max_length)`), for
    a member's stored bytes; None for a stored member. zipfile's own bzip2 and lzma readers
    have no such bound: one 4 kB read of a crafted stream inflates to GiBs. *inflate* is the
    zlib-compatible module deflate runs on (verify's faster backend where it has one)."""
    if compress_type == zipfile.ZIP_STORED:
        return None
    if compress_type == zipfile.ZIP_DEFLATED:
        return inflate.decompressobj(-15)
    if compress_type == zipfile.ZIP_BZIP2:
        return bz2.BZ2Decompressor()
    if compress_type == zipfile.ZIP_LZMA:
        return _ZipLzma()
    raise NotImplementedError(f"compression method {compress_type}")


class _ZipLzma:
    """zipfile's LZMA member format (2 version bytes, the properties' size, the properties, a
    raw LZMA1 stream) behind the `decompress(data, max_length)`, `eof`, `needs_input` of
    lzma's own decoder."""

    def __init__(self) -> None:
        self._header = b""
        self._decoder: lzma.LZMADecompressor | None = None

    @property
    def eof(self) -> bool:
        return self._decoder is not None and self._decoder.eof

    @property
    def needs_input(self) -> bool:
        return self._decoder is None or self._decoder.needs_input

    def decompress(self, data: bytes, max_length: int = -1) -> bytes:
        if self._decoder is None:
            self._header += data
            if len(self._header) < 4:
                return b""
            (size,) = struct.unpack_from("<H", self._header, 2)
            if len(self._header) < 4 + size:
                return b""
            props = self._header[4 : 4 + size]
            filters = [lzma._decode_filter_properties(lzma.FILTER_LZMA1, props)]
            self._decoder = lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=filters)
            data, self._header = self._header[4 + size :], b""
        return self._decoder.decompress(data, max_length)


_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")


class _Stored:
    """Reads at offsets of the archive a ZipFile has open, without moving its position (pread
    on its file descriptor; seek and read for a file object without one)."""

    def __init__(self, zf: zipfile.ZipFile) -> None:
        self.fp = zf.fp
        if self.fp is None:
            raise MemberError("the archive is closed")
        try:
            self.fd: int | None = self.fp.fileno()
            self.size = os.fstat(self.fd).st_size
        except (AttributeError, OSError, ValueError):
            self.fd = None
            self.size = self.fp.seek(0, os.SEEK_END)

    def read_at(self, pos: int, n: int) -> bytes:
        if self.fd is not None:
            return os.pread(self.fd, n, pos)
        self.fp.seek(pos)
        return self.fp.read(n)


def _data_start(src: _Stored, info: zipfile.ZipInfo) -> int:
    """Where a member's stored bytes start, after its local header (checked as zipfile checks
    it: signature, the central directory's name), and that they end inside the archive."""
    head = src.read_at(info.header_offset, _LOCAL_HEADER.size)
    if len(head) < _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
        raise MemberError(f"member {info.filename!r}: bad local header")
    fields = _LOCAL_HEADER.unpack(head)
    name = src.read_at(info.header_offset + _LOCAL_HEADER.size, fields[10])
    if name != info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"):
        raise MemberError(f"member {info.filename!r}: the local header names {name!r}")
    start = info.header_offset + _LOCAL_HEADER.size + fields[10] + fields[11]
    if start + info.compress_size > src.size:
        raise MemberError(f"member {info.filename!r} runs past the end of the archive")
    return start


def member_chunks(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, step: int = 1 << 20
) -> Iterator[bytes]:
    """A member's bytes in pieces of at most `step`, whatever its compression: refused before a
    byte is inflated when it claims more than `limit`, and while inflating the moment it
    produces more than it claims (each decoder call is bounded, so memory stays at a few
    `step`s); checked at its end for a complete stream, its size and its CRC-32. The one way
    patchkit reads a member of an archive it downloaded (MemberError names the member)."""
    problem = claim_problem(info, limit) or member_problem(info, set())
    if problem:
        raise MemberError(problem)
    try:
        src = _Stored(zf)
        yield from _decoded(src, info, _data_start(src, info), step)
    except READ_ERRORS as exc:
        raise MemberError(f"member {info.filename!r} cannot be read ({_reason(exc)})") from None


def _decoded(src: _Stored, info: zipfile.ZipInfo, start: int, step: int) -> Iterator[bytes]:
    decoder = member_decoder(info.compress_type)
    pos, end, produced, crc = start, start + info.compress_size, 0, 0
    while decoder is None or not decoder.eof:
        data = b""
        if decoder is None or not _holds(decoder):
            if pos >= end:
                break
            data = src.read_at(pos, min(step, end - pos))
            if not data:
                raise MemberError(f"member {info.filename!r} runs past the end of the archive")
            pos += len(data)
        piece = _step(decoder, data, min(step, info.file_size - produced + 1))
        produced += len(piece)
        if produced > info.file_size:
            raise MemberError(
                f"member {info.filename!r} inflates past the {info.file_size} bytes its header "
                "claims (a decompression bomb or a damaged archive)"
            )
        crc = zlib.crc32(piece, crc)
        if piece:
            yield piece
    if decoder is not None and not decoder.eof:
        raise MemberError(f"member {info.filename!r}: its compressed stream is truncated")
    if produced != info.file_size:
        raise MemberError(
            f"member {info.filename!r} holds {produced} bytes, smaller than its header says "
            f"({info.file_size})"
        )
    if crc != info.CRC:
        raise MemberError(f"member {info.filename!r}: Bad CRC-32 (the archive is damaged)")


def _holds(decoder) -> bool:
    """Whether the decoder holds input it has not decoded yet (zlib keeps it in
    `unconsumed_tail`, bz2 and lzma inside)."""
    tail = getattr(decoder, "unconsumed_tail", None)
    return bool(tail) if tail is not None else not decoder.needs_input


def _step(decoder, data: bytes, most: int) -> bytes:
    """At most `most` bytes decoded from `data` and what the decoder holds."""
    if decoder is None:
        return data
    tail = getattr(decoder, "unconsumed_tail", None)
    if tail:
        data = tail + data
    return decoder.decompress(data, most)


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    """The bytes of one member, refusing more than `limit` (checked before decompressing and
    again on the bytes actually produced, so a lying header gains nothing)."""
    return b"".join(member_chunks(zf, info, limit))


def member_head(zf: zipfile.ZipFile, info: zipfile.ZipInfo, n: int) -> bytes:
    """A member's first `n` bytes, inflated only that far (no checks of its end)."""
    pieces = member_chunks(zf, info, MAX_MEMBER_BYTES, step=max(n, 4096))
    try:
        return next(pieces, b"")[:n]
    finally:
        pieces.close()


def hash_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    """The RECORD-form sha256 of one member, read in 1 MiB steps (never more than it claims)."""
    digest = hashlib.sha256()
    for piece in member_chunks(zf, info, MAX_MEMBER_BYTES):
        digest.update(piece)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")


def hash_file(path: os.PathLike | str) -> str:
    """The RECORD-form sha256 of a regular file (SpecialFileError for a FIFO or device)."""
    digest = hashlib.sha256()
    with open_regular(path) as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")
