"""Wheel (zip) archives that patchkit reads without installing: refuse hostile members.

Shared by `verify --wheelhouse` and `inspect WHEEL`: a member with an absolute or climbing
name, a symbolic link, a duplicate name, or a size that looks like a decompression bomb makes
the whole archive invalid, before anything is read from it.
"""

from __future__ import annotations

import re
import stat
import zipfile

MAX_MEMBER_BYTES = 8 << 30
MAX_RATIO = 200
MAX_WHEEL_BYTES = 32 << 30


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
