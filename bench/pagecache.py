"""Page-cache eviction for the benchmarks' cold runs: each file is dropped from the page
cache (``posix_fadvise(DONTNEED)`` after an ``fsync``, since dirty pages stay), and what is
still resident is measured with util-linux's ``fincore`` where it is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path


def files_under(roots: Iterable[Path | str]) -> list[str]:
    """Every regular file below each root (a file root is itself)."""
    out: list[str] = []
    for root in map(Path, roots):
        if root.is_file():
            out.append(str(root))
            continue
        for folder, _, names in os.walk(root):
            out += [os.path.join(folder, n) for n in names]
    return [p for p in out if os.path.isfile(p) and not os.path.islink(p)]


def evict(paths: list[str]) -> int:
    """Drop each file from the page cache; returns the bytes still resident (-1: no fincore)."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)
    if not shutil.which("fincore"):
        return -1
    resident = 0
    for i in range(0, len(paths), 200):
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--output", "RES", *paths[i : i + 200]],
            capture_output=True,
            text=True,
        ).stdout
        resident += sum(int(x) for x in out.split() if x.isdigit())
    return resident
