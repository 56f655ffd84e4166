"""The releases a target published on the package index after a given version.

A release counts when the index has its sdist, or a wheel for a platform the target already
pins (SGLang publishes only wheels from 0.5.11); pre-releases and development releases do not.

The file names the index lists are kept in the cache (`<cache>/index/<project>.json`) for
`$PATCHKIT_INDEX_TTL` seconds (300 by default; 0 asks the index every time): a second run
within minutes, as on release day, does not ask the index again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from patchkit.errors import FetchError
from patchkit.files import replace_file
from patchkit.targets import Target
from patchkit.upstream.index import index_url, project_files, project_name
from patchkit.upstream.newbase import index_name, wanted_tags

DEFAULT_INDEX_TTL = 300


def releases_after(
    target: Target, after: str, files: list[dict] | None = None, *, cache: Path | None = None
) -> list[str]:
    """Release versions newer than `after` the index offers a base for, oldest first
    (`files`: the index's file list, read when not given: kept in `cache` for a while)."""
    name = index_name(target)
    if name is None:
        raise FetchError(f"{target.name}: no release names a package on the index")
    floor = Version(after)
    wanted = set(wanted_tags(target))
    found: set[Version] = set()
    if files is None:
        names = listed_files(name, cache)
    else:
        names = [entry.get("filename", "") for entry in files]
    for filename in names:
        version = _base_version(filename, wanted)
        if version is not None and version > floor and not (version.is_prerelease):
            found.add(version)
    return [str(v) for v in sorted(found)]


def _base_version(filename: str, wanted: set[tuple[str, str]]) -> Version | None:
    """The version of an sdist, or of a wheel for a wanted (python, platform) tag pair."""
    try:
        if filename.endswith(".tar.gz"):
            return parse_sdist_filename(filename)[1]
        if filename.endswith(".whl"):
            _, version, _, tags = parse_wheel_filename(filename)
            if any((t.interpreter, t.platform) in wanted for t in tags):
                return version
    except (InvalidSdistFilename, InvalidWheelFilename, InvalidVersion):
        return None
    return None


def listed_files(name: str, cache: Path | None) -> list[str]:
    """The file names the index lists for `name`: from the cache while younger than the TTL
    (and of the same index), else asked and kept there (None: asked, not kept)."""
    url = f"{index_url()}/{project_name(name)}/"
    path = cache / "index" / f"{project_name(name)}.json" if cache is not None else None
    try:
        ttl = float(os.environ.get("PATCHKIT_INDEX_TTL", DEFAULT_INDEX_TTL))
    except ValueError:
        ttl = DEFAULT_INDEX_TTL
    if path is not None and ttl > 0:
        try:
            kept = json.loads(path.read_text(encoding="utf-8"))
            if kept["index"] == url and 0 <= time.time() - kept["time"] < ttl:
                return [str(f) for f in kept["files"]]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    names = [entry["filename"] for entry in project_files(name)]
    if path is not None:
        kept_now = {"index": url, "time": time.time(), "files": names}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            replace_file(path, json.dumps(kept_now).encode())
        except OSError:
            pass  # an unwritable cache: the next run asks again
    return names
