"""The releases a target published on the package index after a given version.

A release counts when the index has its sdist, or a wheel for a platform the target already
pins (SGLang publishes only wheels from 0.5.11); pre-releases and development releases do not.
"""

from __future__ import annotations

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from patchkit.errors import FetchError
from patchkit.targets import Target
from patchkit.upstream.index import project_files
from patchkit.upstream.newbase import index_name, wanted_tags


def releases_after(target: Target, after: str, files: list[dict] | None = None) -> list[str]:
    """Release versions newer than `after` the index offers a base for, oldest first
    (`files`: the index's file list, read when not given)."""
    name = index_name(target)
    if name is None:
        raise FetchError(f"{target.name}: no release names a package on the index")
    floor = Version(after)
    wanted = set(wanted_tags(target))
    found: set[Version] = set()
    for entry in project_files(name) if files is None else files:
        version = _base_version(entry.get("filename", ""), wanted)
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
