"""pip's own configuration of the package index, read as `pip download` reads it, since that is
where users configure their index: `PIP_INDEX_URL`, else the `index-url` of pip's configuration
files (`[global]`, then `[download]`). Its credentials (the URL's own, netrc's, keyring's) are
kept per origin by `patchkit.net.auth`, sent to that origin only and never printed."""

from __future__ import annotations

import configparser
import contextlib
import os
import sys


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
