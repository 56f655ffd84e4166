"""pip's own configuration of the package index, read as `pip download` reads it, since that is
where users configure their index: `PIP_INDEX_URL`, else the `index-url` of pip's configuration
files (`[global]`, then `[download]`); credentials from the URL itself or from netrc (as pip's
requests session does), sent to that index's host only and never printed."""

from __future__ import annotations

import base64
import configparser
import contextlib
import netrc
import os
import sys
import urllib.parse


def config_files() -> list[str]:
    """pip's configuration files, lowest priority first (pip's `iter_config_files` on Linux):
    $PIP_CONFIG_FILE, the global ones, the user's (unless $PIP_CONFIG_FILE exists), the
    environment's. $PIP_CONFIG_FILE set to os.devnull turns them all off."""
    env_file = os.environ.get("PIP_CONFIG_FILE")
    if env_file == os.devnull:
        return []
    xdg_dirs = os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg"
    files = [env_file] if env_file else []
    files += [os.path.join(d, "pip", "pip.conf") for d in xdg_dirs.split(os.pathsep) if d]
    files.append("/etc/pip.conf")
    if not (env_file and os.path.exists(env_file)):
        home = os.path.expanduser("~")
        xdg_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
        files += [os.path.join(home, ".pip", "pip.conf"), os.path.join(xdg_home, "pip", "pip.conf")]
    files.append(os.path.join(sys.prefix, "pip.conf"))
    return files


def configured_index_url() -> str | None:
    """The index `pip download` would use: $PIP_INDEX_URL, else its configuration files."""
    url = os.environ.get("PIP_INDEX_URL")
    if url:
        return url
    for path in reversed(config_files()):  # the last file that names one wins
        found = _index_url_in(path)
        if found:
            return found
    return None


def _index_url_in(path: str) -> str | None:
    parser = configparser.RawConfigParser()
    with contextlib.suppress(OSError, configparser.Error, UnicodeDecodeError):
        if not os.path.isfile(path):
            return None
        parser.read(path, encoding="utf-8")
        for section in ("download", "global"):  # a command's section overrides [global]
            for key in ("index-url", "index_url"):
                if parser.has_option(section, key):
                    return parser.get(section, key).strip() or None
    return None


def without_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """`url` with any `user:password@` taken out (urllib cannot send them, and messages must
    not show them), and those credentials."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, None
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address keeps its brackets
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), (user, password)


def authorization(url: str, index: str, index_credentials: tuple[str, str] | None) -> str | None:
    """The Basic `Authorization` header for a request to `url`: the index URL's own
    credentials, else netrc's entry for the host, sent only where `url`'s host is the index's
    (files an index serves from another host get none, as pip does)."""
    target, index_parts = urllib.parse.urlsplit(url), urllib.parse.urlsplit(index)
    if target.scheme not in ("http", "https") or target.netloc != index_parts.netloc:
        return None
    credentials = index_credentials or _netrc_credentials(target.hostname or "")
    if credentials is None:
        return None
    token = base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode("ascii")
    return f"Basic {token}"


def _netrc_credentials(host: str) -> tuple[str, str] | None:
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    with contextlib.suppress(OSError, netrc.NetrcParseError):
        if os.path.isfile(path):
            entry = netrc.netrc(path).authenticators(host)
            if entry is not None:
                return entry[0] or "", entry[2] or ""
    return None
