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
import hashlib
import lzma
import os
import re
import stat
import zipfile
import zlib
from typing import BinaryIO

MAX_MEMBER_BYTES = 8 << 30
MAX_RATIO = 200
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
    if info.file_size > (1 << 20) and info.file_size > MAX_RATIO * max(info.compress_size, 1):
        ratio = info.file_size // max(info.compress_size, 1)
        return f"member {name!r} expands {ratio}x (a decompression bomb)"
    return None


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


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    """The bytes of one member, refusing more than `limit` (checked before decompressing and
    again on the bytes actually produced, so a lying header gains nothing)."""
    problem = claim_problem(info, limit)
    if problem:
        raise MemberError(problem)
    try:
        with zf.open(info) as fh:
            data = fh.read(limit + 1)
    except READ_ERRORS as exc:
        raise MemberError(f"member {info.filename!r} cannot be read ({_reason(exc)})") from None
    if len(data) > limit:
        raise MemberError(f"member {info.filename!r} expands beyond {limit} bytes")
    return data


def hash_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    """The RECORD-form sha256 of one member, read in 1 MiB steps (never more than it claims)."""
    digest = hashlib.sha256()
    total = 0
    try:
        with zf.open(info) as fh:
            while chunk := fh.read(1 << 20):
                total += len(chunk)
                if total > info.file_size:
                    raise MemberError(f"member {info.filename!r} expands beyond its stated size")
                digest.update(chunk)
    except READ_ERRORS as exc:
        raise MemberError(f"member {info.filename!r} cannot be read ({_reason(exc)})") from None
    if total != info.file_size:  # zipfile stops at the data's end without a word (no CRC check)
        raise MemberError(
            f"member {info.filename!r} holds {total} bytes, smaller than its header says "
            f"({info.file_size})"
        )
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")


def hash_file(path: os.PathLike | str) -> str:
    """The RECORD-form sha256 of a regular file (SpecialFileError for a FIFO or device)."""
    digest = hashlib.sha256()
    with open_regular(path) as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")
