"""The bases of many releases that the mirror already holds, found at once: one lookup of
their imports (and pinned commits), no network, no lock, no object re-hash.

For a warm `outlook`, which reads each release's states from its cache by the base's commit:
a base that is not held, or whose states are not cached, is obtained by `acquire` as every
verb does (the source chain, the mirror's integrity check). The same order as `acquire`: a
pinned release's commit when the mirror has it, then its sdist import, then its wheel
import. A release no pin names is read from its import: the base an earlier run took from the
index when git gave none (git is asked for a release's tag by its version, which SGLang's
`v`-prefixed tags never match), so a warm run asks no git host whether it is reachable or not.
"""

from __future__ import annotations

from pathlib import Path

from patchkit import gitops
from patchkit.errors import PatchkitError
from patchkit.targets import Target
from patchkit.upstream.acquire import Base, _sdist_base, _wheel_base, unpinned_base
from patchkit.upstream.mirror import SDIST_REF, WHEEL_REF, Mirror


def held_bases(target: Target, versions: list[str], cache: Path) -> dict[str, Base]:
    """version -> the base the mirror holds for it (see above); versions it holds none
    for, or whose import a pin refuses, are left out (`acquire` obtains them)."""
    mirror = Mirror(target, cache)
    if not (mirror.path / "HEAD").is_file():
        return {}
    names: list[str] = []
    for version in versions:
        release = target.release(version)
        if release is not None and release.commit:
            names.append(release.commit)
        names += [SDIST_REF.format(version=version), WHEEL_REF.format(version=version)]
    held = gitops.read_commits(mirror.repo, names)  # the messages too, for the fields
    found: dict[str, Base] = {}
    for version in versions:
        try:
            base = _held_base(mirror, target, version, held)
        except PatchkitError:  # a refusal is acquire's to make, with its words
            base = None
        if base is not None:
            found[version] = base
    return found


def _held_base(mirror: Mirror, target: Target, version: str, held: dict) -> Base | None:
    repo = mirror.repo
    release = target.release(version)
    sdist = held.get(SDIST_REF.format(version=version))
    wheel = held.get(WHEEL_REF.format(version=version))
    if release is not None:
        if release.commit and held.get(release.commit) == release.commit:
            return Base(target.name, release.commit, "git", release, release.commit)
        if sdist:
            return _sdist_base(repo, target, release, sdist)
        if wheel and not release.sdist:
            return _wheel_base(repo, target, release, wheel)
        return None
    if not (sdist or wheel):
        return None
    from patchkit.upstream.newbase import _sdist_release, _wheel_release, index_name

    name = index_name(target)
    if name is None:
        return None
    if sdist:
        release, sha, trust = _sdist_release(mirror, version, f"{name}=={version}", sdist)
    else:
        release, sha, trust = _wheel_release(mirror, version, wheel)
    return unpinned_base(target, release, sha, trust)
