"""Which release a diff was made against, from its `index <blob>..<blob>` lines.

git writes the blob id of each file's pre-image in a diff's `index` line.  Compared with the
blob ids the same paths have in each release imported into the target's mirror (the bases
`outlook`, `rebase` and every verb import: sdists and wheels, one ref per release), they name
the release the author had checked out, even when the diff also applies to another one (a
diff made against SGLang 0.5.12.post1 applies to 0.5.12 where the two files agree).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from patchkit import gitops
from patchkit.import_.diffparse import FileDiff

_INDEX_RE = re.compile(r"^index ([0-9a-f]{7,64})\.\.([0-9a-f]{7,64})")
_ZERO = re.compile(r"^0+$")
RELEASE_REFS = ("refs/patchkit/sdist/", "refs/patchkit/wheel/")


@dataclass
class BlobMatch:
    """How far a diff's pre-image blobs match one tree."""

    label: str
    matching: list[str] = field(default_factory=list)
    differing: list[str] = field(default_factory=list)  # different blob, or no such file

    @property
    def whole(self) -> bool:
        return not self.differing


def index_blobs(files: list[FileDiff]) -> dict[str, str]:
    """path -> the (possibly abbreviated) pre-image blob id its `index` line names; files the
    diff creates and diffs without index lines are left out."""
    out = {}
    for diff in files:
        if diff.old is None:
            continue
        for line in diff.extended:
            match = _INDEX_RE.match(line)
            if match and not _ZERO.match(match.group(1)):
                out[diff.old] = match.group(1)
    return out


def match_blobs(mirror: gitops.Repo, commit: str, blobs: dict[str, str], label: str) -> BlobMatch:
    """Which of the diff's files have, in `commit`, the blob its index line names."""
    have = gitops.blob_ids(mirror, commit, sorted(blobs))
    result = BlobMatch(label)
    for path, blob in sorted(blobs.items()):
        (result.matching if have.get(path, "").startswith(blob) else result.differing).append(path)
    return result


def imported_releases(mirror: gitops.Repo) -> list[tuple[str, str]]:
    """(version, commit) of every release imported into the mirror, oldest first."""
    found: dict[str, str] = {}
    for prefix in RELEASE_REFS:
        for ref, commit in gitops.refs(mirror, prefix).items():
            found.setdefault(ref.removeprefix(prefix), commit)
    return sorted(found.items(), key=lambda item: _order(item[0]))


def made_against(
    mirror: gitops.Repo, blobs: dict[str, str], releases: list[tuple[str, str]]
) -> list[BlobMatch]:
    """The releases whose files are the diff's every pre-image."""
    matches = [match_blobs(mirror, commit, blobs, version) for version, commit in releases]
    return [m for m in matches if m.whole]


def _order(version: str) -> tuple[int, Version | str]:
    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)
