"""Bases that no pin names yet: a release version taken from the package index, trusted on
first use, and the pin `rebase --write` would record for any new base.

Used through `acquire(..., allow_unpinned=True)` (so `apply --allow-unpinned` and `rebase` see
the same bases) and by `resolve_new_base`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from patchkit import gitops, ui
from patchkit.errors import FetchError, PinError
from patchkit.targets import SHA256_RE, SHA_RE, Release, Target, WheelPin
from patchkit.upstream.index import normalize_name, project_files
from patchkit.upstream.mirror import SDIST_REF, WHEEL_REF, Mirror, import_fields, wheel_fields
from patchkit.upstream.sdist import (
    commit_id_in,
    download_sdist,
    import_sdist,
    read_sdist_member,
)
from patchkit.upstream.wheel import download_wheel, import_wheel


@dataclass
class NewPin:
    """What `--write` records in targets.toml for the new base."""

    version: str
    commit: str | None
    tag: str | None = None
    sdist: str | None = None
    sdist_sha256: str | None = None
    recorded_commit: str | None = None
    new: bool = True  # False: the release is already listed, only the pin moves
    trust: str = ""
    wheels: list[dict] = field(default_factory=list)  # [{"file": ..., "sha256": ...}]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def version_of(ref: str) -> str | None:
    try:
        return str(Version(ref.removeprefix("v")))
    except InvalidVersion:
        return None


def index_name(target: Target) -> str | None:
    """The target's distribution name on the index (from any release's sdist or wheel)."""
    for release in reversed(target.releases):
        if release.sdist_name:
            return release.sdist_name
        if release.wheels:
            return release.wheels[0].distribution
    return None


def from_index_unpinned(mirror: Mirror, target: Target, version: str) -> tuple[Release, str, str]:
    """Import release `version` from the index as no pin names it: its sdist when there is
    one, else its wheels for the platforms the target already pins.  Returns (provisional
    release, import commit, trust words).  The caller holds the mirror lock."""
    name = index_name(target)
    if name is None:
        raise FetchError(f"{target.name}: no release names a package on the index")
    requirement = f"{name}=={version}"
    sha = gitops.resolve(mirror.repo, SDIST_REF.format(version=version))
    wheel_sha = gitops.resolve(mirror.repo, WHEEL_REF.format(version=version))
    if sha is None and wheel_sha is None:
        files = project_files(name)
        sdists = [f for f in files if f["filename"].endswith(".tar.gz")]
        if any(_is_version(f["filename"], version, name) for f in sdists):
            sha = _import_sdist_tofu(mirror, target, version, requirement)
        else:
            wheel_sha = _import_wheels_tofu(mirror, target, name, version, files)
    if sha is not None:
        return _sdist_release(mirror, version, requirement, sha)
    assert wheel_sha is not None
    return _wheel_release(mirror, version, wheel_sha)


def _is_version(filename: str, version: str, name: str) -> bool:
    """Whether an sdist file name is `name`'s release `version` (versions hold no '-')."""
    project, _, got = filename.removesuffix(".tar.gz").rpartition("-")
    if normalize_name(project) != normalize_name(name):
        return False
    try:
        return Version(got) == Version(version)
    except InvalidVersion:
        return False


def _import_sdist_tofu(mirror: Mirror, target: Target, version: str, requirement: str) -> str:
    provisional = Release(version=version, commit=None, sdist=requirement)
    archive = download_sdist(provisional, mirror.root)
    recorded = sdist_recorded_commit(archive, target)
    if recorded and not SHA_RE.match(recorded):
        raise PinError(
            f"{requirement} records upstream commit {recorded}, an abbreviated id; "
            "pinning needs the full commit",
            hint=f"pass --upstream with a clone that has it, or rebase onto "
            f"{target.name}@<full sha>",
        )
    provisional = dataclasses.replace(provisional, commit=recorded)
    ui.progress(f"importing {archive.name} into the {target.name} mirror")
    return import_sdist(mirror, target, provisional, archive)


def wanted_tags(target: Target) -> list[tuple[str, str]]:
    """(python tag, platform tag) pairs the target already pins wheels for, newest first."""
    for release in reversed(target.releases):
        if release.wheels:
            return [(w.python_tag, w.platform_tag) for w in release.wheels]
    return [("py3", "any")]


def _import_wheels_tofu(
    mirror: Mirror, target: Target, name: str, version: str, files: list[dict]
) -> str:
    chosen: list[WheelPin] = []
    for python_tag, platform in wanted_tags(target):
        for entry in files:
            filename = entry["filename"]
            sha256 = (entry.get("hashes") or {}).get("sha256")
            if not filename.endswith(".whl") or not sha256:
                continue
            try:
                _, got, _, tags = parse_wheel_filename(filename)
            except InvalidWheelFilename:
                continue
            if got != Version(version):
                continue
            if any(t.interpreter == python_tag and t.platform == platform for t in tags):
                chosen.append(WheelPin(filename, sha256))
                break
    if not chosen:
        raise FetchError(f"{name}=={version}: no sdist and no wheel for the pinned platforms")
    provisional = Release(version=version, commit=None, wheels=tuple(chosen))
    archive = download_wheel(chosen[0], mirror.root)
    ui.progress(f"importing {archive.name} into the {target.name} mirror")
    sha = import_wheel(mirror, target, provisional, chosen[0], archive)
    # The other wheels' sha256 is what the index lists today; they are downloaded (and
    # checked against it) when a build needs them, not for a preview or an outlook.
    _remember_wheels(mirror, version, chosen)
    return sha


def _wheels_note(mirror: Mirror, version: str) -> Path:
    return mirror.root / "wheels" / f".tofu-{mirror.target.name}-{version}.txt"


def _remember_wheels(mirror: Mirror, version: str, pins: list[WheelPin]) -> None:
    """The wheels chosen on first use (the import commit names only the first)."""
    note = _wheels_note(mirror, version)
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text("".join(f"{p.filename} {p.sha256}\n" for p in pins), encoding="utf-8")


def _recalled_wheels(mirror: Mirror, version: str) -> list[WheelPin]:
    try:
        text = _wheels_note(mirror, version).read_text(encoding="utf-8")
    except OSError:
        return []
    pins = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and SHA256_RE.match(parts[1]):
            pins.append(WheelPin(parts[0], parts[1]))
    return pins


def _sdist_release(
    mirror: Mirror, version: str, requirement: str, sha: str
) -> tuple[Release, str, str]:
    fields = import_fields(gitops.commit_message(mirror.repo, sha))
    sha256 = fields.get("Patchkit-Sdist-Sha256")
    recorded = fields.get("Patchkit-Sdist-Commit-Id")
    recorded = None if recorded in (None, "none") else recorded
    release = Release(version=version, commit=recorded, sdist=requirement, sdist_sha256=sha256)
    if recorded:
        trust = (
            f"trust on first use: sdist sha256 {sha256} as served by the package index; "
            f"it records upstream commit {recorded}"
        )
    else:
        trust = (
            f"trust on first use: sdist sha256 {sha256} as served by the package index; "
            "the sdist records no upstream commit (none recorded: relying on the sha256; "
            f"its deterministic import is {sha})"
        )
    return release, sha, trust


def _wheel_release(mirror: Mirror, version: str, sha: str) -> tuple[Release, str, str]:
    fields = wheel_fields(gitops.commit_message(mirror.repo, sha))
    first = WheelPin(fields.get("Patchkit-Wheel", ""), fields.get("Patchkit-Wheel-Sha256", ""))
    pins = _recalled_wheels(mirror, version) or [first]
    if pins[0] != first:
        pins = [first]
    release = Release(version=version, commit=None, wheels=tuple(pins))
    trust = (
        "trust on first use: wheel sha256s as served by the package index ("
        + ", ".join(f"{p.filename} {p.sha256}" for p in pins)
        + f"); no sdist on the index, the wheel records no upstream commit; its "
        f"deterministic import is {sha}"
    )
    return release, sha, trust


def sdist_recorded_commit(archive: Path, target: Target) -> str | None:
    """The upstream commit an sdist records in its commit-id file (None when it records none)."""
    if not target.commit_id_file:
        return None
    data = read_sdist_member(archive, target.commit_id_file)
    if data is None:
        return None
    found = commit_id_in(data.decode("utf-8", "replace"))
    return found.lower() if found else None
