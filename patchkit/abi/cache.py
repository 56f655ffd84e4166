"""Per-file analysis results keyed by path, size and mtime: an unchanged stack re-verifies at once.

One pickle per file under ``$PATCHKIT_CACHE/verify`` (default ``~/.cache/patchkit``), named by a
hash of the file's identity; each is written to a temporary name and renamed into place, so a
reader never sees half a file and concurrent runs cannot corrupt each other.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile

# Bump when FileReport or the analysis changes meaning.
FORMAT = 5


def cache_root() -> str:
    """``$PATCHKIT_CACHE`` or ``~/.cache/patchkit``."""
    return os.environ.get("PATCHKIT_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "patchkit"
    )


class ResultCache:
    """Load and store per-file results; a miss, a stale entry or a corrupt one all read as None."""

    def __init__(self, root: str | None = None, enabled: bool = True) -> None:
        self.dir = os.path.join(root or cache_root(), "verify")
        self.enabled = enabled

    def _path(self, key: str) -> str:
        digest = hashlib.sha1(key.encode("utf-8", "surrogateescape")).hexdigest()
        return os.path.join(self.dir, digest[:2], digest[2:] + ".pickle")

    def load(self, key: str, size: int, mtime: int):
        if not self.enabled:
            return None
        try:
            with open(self._path(key), "rb") as fh:
                fmt, k, s, m, value = pickle.load(fh)
        except Exception:  # missing, truncated, or from another version: a miss
            return None
        if (fmt, k, s, m) != (FORMAT, key, size, mtime):
            return None
        return value

    def store(self, key: str, size: int, mtime: int, value) -> None:
        if not self.enabled:
            return
        path = self._path(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                pickle.dump((FORMAT, key, size, mtime, value), fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except OSError:
            # A read-only or full cache only costs speed.
            try:
                os.unlink(tmp)
            except (OSError, UnboundLocalError):
                pass


def run_key(parts) -> str:
    """A digest of everything a whole verify run depends on (see patchkit.abi.verify)."""
    h = hashlib.sha1(f"{FORMAT}".encode())
    for part in parts:
        h.update(repr(part).encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()
