"""Credentials per origin, as pip's `MultiDomainBasicAuth` keeps them: a password belongs to
the origin (scheme, host, port) it was configured for and is sent nowhere else, not to another
port of the same host, not over http to a host it was given for over https.

Where they come from, in pip's order: the index URL's own `user:password@` (percent-encoded),
netrc's entry for the index's host, then keyring when it is installed (never imported
otherwise) and pip's `keyring-provider` does not turn it off.
"""

from __future__ import annotations

import base64
import contextlib
import netrc
import os
import urllib.parse

Origin = tuple[str, str, int]
DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> Origin:
    """(scheme, host, port) of a URL; the host lower-cased, an IPv6 literal without brackets."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or DEFAULT_PORTS.get(scheme, 0)


def split_credentials(url: str) -> tuple[str, tuple[str, str | None] | None]:
    """`url` without its `user:password@` (messages must not show them), and those credentials
    percent-decoded (password None for a bare `user@`)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    clean = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
    unquote = urllib.parse.unquote
    return clean, (unquote(user), unquote(password) if colon else None)


def basic(user: str, password: str) -> str:
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"


def netrc_entry(host: str) -> tuple[str, str] | None:
    """netrc's (login, password) for `host` ($NETRC, else ~/.netrc), as requests reads it."""
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    with contextlib.suppress(OSError, netrc.NetrcParseError):
        if os.path.isfile(path):
            entry = netrc.netrc(path).authenticators(host)
            if entry is not None:
                return entry[0] or "", entry[2] or ""
    return None


def keyring_entry(url: str, user: str | None) -> tuple[str, str] | None:
    """keyring's credential for `url` when the keyring package is installed (pip's
    `keyring-provider = import`); $PIP_KEYRING_PROVIDER=disabled turns it off."""
    if os.environ.get("PIP_KEYRING_PROVIDER", "auto") == "disabled":
        return None
    try:
        import keyring  # optional: only those who installed it pay for it
    except ImportError:
        return None
    with contextlib.suppress(Exception):  # a keyring backend may fail in any way
        found = keyring.get_credential(url, user)
        if found is not None:
            return found.username, found.password
    return None


class Credentials:
    """The Basic credentials of each origin patchkit was configured for, and nothing else."""

    def __init__(self) -> None:
        self._by_origin: dict[Origin, tuple[str, str]] = {}
        self._asked_keyring: set[Origin] = set()

    def add_index(self, url: str) -> str:
        """Record the credentials of an index URL (its own, else netrc's for its host, with a
        bare `user@` taking netrc's password for that login); returns the URL without them."""
        clean, given = split_credentials(url)
        origin = origin_of(clean)
        if origin[0] not in DEFAULT_PORTS:
            return clean
        found = netrc_entry(origin[1])
        if given is not None and given[1] is not None:
            self._by_origin[origin] = (given[0], given[1])
        elif given is not None:  # `user@` alone: netrc's password for that user, else none
            password = found[1] if found and found[0] == given[0] else ""
            self._by_origin[origin] = (given[0], password)
        elif found is not None:
            self._by_origin[origin] = found
        return clean

    def header_for(self, url: str) -> str | None:
        """The `Authorization` value for a request to `url`: only for the exact origin the
        credentials were configured for."""
        credentials = self._by_origin.get(origin_of(url))
        return basic(*credentials) if credentials else None

    def from_keyring(self, index: str, url: str) -> str | None:
        """After a 401 from the index's origin with no credentials: keyring's, asked once."""
        origin = origin_of(url)
        if origin != origin_of(index) or origin in self._by_origin:
            return None
        if origin in self._asked_keyring:
            return None
        self._asked_keyring.add(origin)
        found = keyring_entry(index, None)
        if found is None:
            return None
        self._by_origin[origin] = found
        return basic(*found)
