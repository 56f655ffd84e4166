"""Sdist bases: download a release's sdist (hash-checked) and import its tree as a commit.

An sdist import is a parentless commit with a fixed identity and date, so its id is the same on
every machine; its message records the sdist hash and the upstream commit the sdist stands for.
"""

from __future__ import annotations

import gzip
import re
import tarfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from patchkit import gitops
from patchkit.errors import FetchError, PinError
from patchkit.targets import Release, Target
from patchkit.upstream.index import (
    MAX_DOWNLOAD_BYTES,
    check_sha256,
    download,
    file_sha256,
    find_file,
    normalize_name,
    project_name,
)
from patchkit.upstream.mirror import SDIST_REF

if TYPE_CHECKING:
    from patchkit.upstream.mirror import Mirror

IMPORT_IDENTITY_NAME = "patchkit import"
IMPORT_IDENTITY_EMAIL = "import@patchkit.invalid"
MAX_SDIST_BYTES = MAX_DOWNLOAD_BYTES
COMMIT_ID_RES = (
    re.compile(r"""commit_id\s*=\s*['"]g?([0-9a-f]{7,40})['"]"""),
    re.compile(r"""__git_version__\s*=\s*['"]([0-9a-f]{7,40})['"]"""),
)


def sdist_path(release: Release, cache: Path) -> Path:
    name, _, version = (release.sdist or "").partition("==")
    return cache / "sdists" / f"{normalize_name(name)}-{version.strip()}.tar.gz"


def download_sdist(release: Release, cache: Path) -> Path:
    """Download the release's sdist into the cache (write-then-rename) and check its sha256."""
    dest = sdist_path(release, cache)
    if dest.is_file() and file_sha256(dest) == release.sdist_sha256:
        return dest
    name, _, version = (release.sdist or "").partition("==")
    name, version = name.strip(), version.strip()
    wanted = {
        f"{normalize_name(name)}-{version}.tar.gz",
        f"{project_name(name)}-{version}.tar.gz",
        f"{name}-{version}.tar.gz",
    }
    url, index_sha = find_file(name, wanted, f"{name}=={version}: no sdist")
    return download(
        url,
        dest,
        expected_sha256=release.sdist_sha256 or index_sha,
        label=release.sdist or name,
    )


def check_sdist_hash(release: Release, got: str, index_sha: str | None = None) -> None:
    """Refuse an sdist whose sha256 differs from the pin (or, unpinned, from the index)."""
    check_sha256(release.sdist or "sdist", got, release.sdist_sha256 or index_sha)


def commit_id_in(text: str) -> str | None:
    """The upstream commit id a commit-id file's text records (the first pattern that matches)."""
    for pattern in COMMIT_ID_RES:
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def release_commit_id(tree: Path, target: Target) -> str | None:
    """The upstream commit id an unpacked sdist records about itself, if any."""
    if not target.commit_id_file:
        return None
    path = tree / target.commit_id_file
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return commit_id_in(text)


def safe_extract_sdist(archive: Path, dest: Path) -> Path:
    """Extract a .tar.gz refusing links, devices, absolute and climbing names; returns its top
    directory."""
    with _readable(archive), tarfile.open(archive, "r:*") as tar:
        members, top = _checked_members(tar, archive)
        tar.extractall(dest, members=members, filter="data")
    return dest / top


@contextmanager
def _readable(archive: Path) -> Iterator[None]:
    """A damaged or foreign archive as one FetchError naming it."""
    try:
        yield
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        cause = str(exc).splitlines()[0].rstrip(":") if str(exc) else type(exc).__name__
        raise FetchError(
            f"{archive.name}: not a readable .tar.gz ({cause})",
            hint="the file is damaged or is not an sdist; nothing was imported",
        ) from None


def _checked_members(tar: tarfile.TarFile, archive: Path) -> tuple[list[tarfile.TarInfo], str]:
    """The members of an sdist and its one top-level folder, refusing links, devices,
    absolute and climbing names, `.git` folders and more than 4x MAX_SDIST_BYTES unpacked."""
    members = tar.getmembers()
    tops = set()
    total = 0
    for member in members:
        name = PurePosixPath(member.name)
        if name.is_absolute() or ".." in name.parts:
            raise FetchError(f"{archive.name}: member {member.name} escapes the archive")
        if any(part.lower() == ".git" for part in name.parts):
            raise FetchError(f"{archive.name}: member {member.name} is inside a .git directory")
        if not (member.isfile() or member.isdir()):
            raise FetchError(f"{archive.name}: member {member.name} is a link or device")
        total += member.size
        if total > 4 * MAX_SDIST_BYTES:
            raise FetchError(
                f"{archive.name}: unpacks to more than {4 * MAX_SDIST_BYTES >> 20} MiB"
            )
        tops.add(name.parts[0])
    if len(tops) != 1:
        raise FetchError(f"{archive.name}: expected one top-level directory, found {len(tops)}")
    return members, tops.pop()


def _sdist_files(archive: Path, subdir: str) -> dict[str, tuple[bool, bytes]]:
    """Each file of an sdist as extraction would leave it, read in place: path under the
    target's layout (its top folder replaced by `subdir`) -> (executable, bytes)."""
    files: dict[str, tuple[bool, bytes]] = {}
    with _readable(archive), tarfile.open(archive, "r:*") as tar:
        members, top = _checked_members(tar, archive)
        for member in members:
            if not member.isfile():
                continue
            rest = PurePosixPath(member.name).relative_to(top).as_posix()
            handle = tar.extractfile(member)
            data = handle.read() if handle else b""
            path = f"{subdir}/{rest}" if subdir else rest
            files.pop(path, None)  # a later member replaces an earlier one, as on disk
            files[path] = (bool(member.mode & 0o100), data)  # git: the owner's x bit
    return files


def sdist_identity(archive: Path) -> gitops.Identity:
    """A fixed identity dated by the sdist itself: the newest member mtime (same everywhere)."""
    with tarfile.open(archive, "r:*") as tar:
        stamp = max((m.mtime for m in tar.getmembers()), default=0)
    return gitops.Identity(IMPORT_IDENTITY_NAME, IMPORT_IDENTITY_EMAIL, f"{int(stamp)} +0000")


def import_sdist(mirror: Mirror, target: Target, release: Release, archive: Path) -> str:
    """Import an sdist's tree under the target's subdir as a deterministic commit (its files
    read from the archive and written as one pack: nothing is extracted)."""
    repo = mirror.repo
    files = _sdist_files(archive, target.subdir)
    recorded = None
    if target.commit_id_file:
        prefix = f"{target.subdir}/" if target.subdir else ""
        found = files.get(prefix + target.commit_id_file)
        recorded = commit_id_in(found[1].decode("utf-8", "replace")) if found else None
    _check_recorded_commit(release, recorded)
    upstream = (release.commit or recorded) if recorded else None
    message = (
        f"Import {release.sdist} from its sdist\n\n"
        f"Patchkit-Sdist: {archive.name}\n"
        f"Patchkit-Sdist-Sha256: {file_sha256(archive)}\n"
        f"Patchkit-Sdist-Commit-Id: {recorded or 'none'}\n"
        f"Patchkit-Upstream-Commit: {upstream or 'unknown'}\n"
    )
    entries = ((path, executable, data) for path, (executable, data) in files.items())
    sha = gitops.import_files(repo, entries, message, sdist_identity(archive))
    gitops.update_ref(repo, SDIST_REF.format(version=release.version), sha)
    return sha


def _check_recorded_commit(release: Release, recorded: str | None) -> None:
    if recorded and release.commit and not release.commit.startswith(recorded.lower()):
        raise PinError(
            f"{release.sdist}: the sdist records upstream commit {recorded}, but the pin says "
            f"{release.commit[:12]}; refusing",
        )
