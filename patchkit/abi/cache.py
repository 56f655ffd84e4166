"""Per-file analysis results keyed by path, size and `changed` (modification and change times,
inode): an unchanged stack re-verifies at once.

One JSON document per entry under ``<cache>/verify`` (``$PATCHKIT_CACHE``, else
``$XDG_CACHE_HOME/patchkit``, else ``~/.cache/patchkit``), named by a hash of its key (an
installed environment's files, a wheel's members, a wheel's listing, a whole run). Entries are
data, never code: each is parsed as JSON and checked field by field by
the reader the caller passes; a missing, truncated, foreign or ill-typed entry is a miss.
Writes go to a temporary name that is renamed into place, so a reader never sees half a file and
concurrent runs cannot corrupt each other.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

from patchkit.archives import read_regular

# Bump when FileReport or the analysis changes meaning.
FORMAT = 9

# An entry read back is a regular file of at most this many bytes (the installed torch stack's
# files entry is 47 MB); anything else is a miss.
MAX_ENTRY_BYTES = 1 << 30


def changed(st: os.stat_result) -> int:
    """What a file's `stat` says of its bytes beside their size, as one number: its
    modification and change times, its inode and device. The change time cannot be set back
    from user space, so a file rewritten in place with its modification time restored, or
    replaced by a copy that kept it (`cp -p`, `rsync -a`, `tar x`), reads as changed."""
    key = f"{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:{st.st_dev}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def cache_root() -> str:
    """``$PATCHKIT_CACHE``, else ``$XDG_CACHE_HOME/patchkit``, else ``~/.cache/patchkit``."""
    from patchkit.project import cache_root as project_cache_root

    return str(project_cache_root())


class ResultCache:
    """Load and store per-file results; a miss, a stale entry or a corrupt one all read as None."""

    def __init__(self, root: str | None = None, enabled: bool = True) -> None:
        self.dir = os.path.join(root or cache_root(), "verify")
        self.enabled = enabled

    def _path(self, key: str) -> str:
        digest = hashlib.sha1(key.encode("utf-8", "surrogateescape")).hexdigest()
        return os.path.join(self.dir, digest[:2], digest[2:] + ".json")

    def load(self, key: str, size: int, mtime: int, decode: Callable[[Any], Any]):
        """The stored value for (key, size, mtime) passed through ``decode``, else None.

        ``decode`` rebuilds the value from plain JSON data and raises (KeyError, TypeError,
        ValueError ...) on anything it does not expect; that is a miss, never an error.
        """
        if not self.enabled:
            return None
        try:
            doc = json.loads(read_regular(self._path(key), MAX_ENTRY_BYTES))
            if not isinstance(doc, dict):
                return None
            if (doc.get("format"), doc.get("key"), doc.get("size"), doc.get("mtime")) != (
                FORMAT,
                key,
                size,
                mtime,
            ):
                return None
            return decode(doc["value"])
        except Exception:  # missing, truncated, from another version, ill-typed: a miss
            return None

    def store(self, key: str, size: int, mtime: int, value: Any) -> None:
        """Store ``value`` (plain JSON data) for (key, size, mtime)."""
        if not self.enabled:
            return
        try:
            text = encode(value)
        except (ValueError, TypeError):
            return
        self.store_encoded(key, size, mtime, text)

    def store_encoded(
        self, key: str, size: int, mtime: int, value: str | list[bytes | str]
    ) -> None:
        """Store a value already encoded as JSON text (``encode``), e.g. by a worker; a list
        is the text in pieces (str, or bytes already UTF-8), written one after the other
        (tens of MB are not joined)."""
        if not self.enabled:
            return
        path = self._path(key)
        tmp = None
        try:
            head = encode({"format": FORMAT, "key": key, "size": size, "mtime": mtime})
            pieces = [value] if isinstance(value, str) else value
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(f'{head[:-1]},"value":'.encode("utf-8", "surrogateescape"))
                for piece in pieces:
                    if isinstance(piece, str):
                        piece = piece.encode("utf-8", "surrogateescape")
                    fh.write(piece)
                fh.write(b"}")
            os.replace(tmp, path)
        except (OSError, ValueError, TypeError):
            # A read-only or full cache only costs speed.
            if tmp:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


def encode(value: Any) -> str:
    """The JSON text an entry's value is stored as."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def run_key(parts) -> str:
    """A digest of everything a whole verify run depends on (see patchkit.abi.verify)."""
    h = hashlib.sha1(f"{FORMAT}".encode())
    for part in parts:
        h.update(repr(part).encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()
