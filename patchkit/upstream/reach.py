"""Remembering that a git host could not be reached, so that the next runs within a few
minutes go straight to the next source instead of asking it again for each release.

A failure counts only when git says the network failed (no name, no route, refused, timed
out), never for an answer such as "no such ref". The note is a file per host in the cache,
`<cache>/network/<host>`, holding the time and git's words; it is ignored once older than
`$PATCHKIT_UNREACHABLE_TTL` seconds (600 by default; 0 asks every time).
"""

from __future__ import annotations

import os
import re
import time
import urllib.parse
from pathlib import Path

DEFAULT_TTL = 600
_NETWORK_FAILURE = re.compile(
    r"Could not resolve host|Couldn't resolve host|Failed to connect|Connection timed out"
    r"|Connection refused|Network is unreachable|No route to host|Operation timed out"
    r"|Temporary failure in name resolution|Name or service not known|Could not read from "
    r"remote repository|SSL_connect|Connection reset",
    re.I,
)


def _host(source: str) -> str | None:
    """The host of a URL (scheme://host/... or scp-like host:path); None for a local path."""
    if "://" in source:
        host = urllib.parse.urlsplit(source).hostname
    else:
        match = re.match(r"^(?:[\w.-]+@)?([\w.-]+):", source)
        host = match.group(1) if match else None
    return host.lower() if host and re.fullmatch(r"[\w.-]+", host) else None


def _ttl() -> float:
    try:
        return float(os.environ.get("PATCHKIT_UNREACHABLE_TTL", DEFAULT_TTL))
    except ValueError:
        return DEFAULT_TTL


def _note(cache: Path, host: str) -> Path:
    return cache / "network" / host


def known_unreachable(source: str, cache: Path) -> str | None:
    """Why `source` is not asked now (its host failed less than the TTL ago), or None."""
    host = _host(source)
    if host is None or _ttl() <= 0:
        return None
    note = _note(cache, host)
    try:
        age = time.time() - note.stat().st_mtime
        words = note.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    if not 0 <= age < _ttl():
        return None
    return (
        f"skipped: {host} was unreachable {int(age)} s ago ({words}); asked again after "
        f"{int(_ttl())} s (PATCHKIT_UNREACHABLE_TTL)"
    )


def note_failure(source: str, error: str, cache: Path) -> None:
    """Remember `source`'s host as unreachable when `error` (git's words) is a network
    failure; any other failure, or a cache that cannot be written, records nothing."""
    host = _host(source)
    if host is None or not _NETWORK_FAILURE.search(error):
        return
    note = _note(cache, host)
    tmp = note.with_name(f".{host}.{os.getpid()}")
    try:
        note.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(error.strip().splitlines()[0][:200] + "\n", encoding="utf-8")
        os.replace(tmp, note)
    except OSError:
        tmp.unlink(missing_ok=True)
