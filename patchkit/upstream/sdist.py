"""Sdist bases: download a release's sdist (hash-checked) and import its tree as a commit.

An sdist import is a parentless commit with a fixed identity and date, so its id is the same on
every machine; its message records the sdist hash and the upstream commit the sdist stands for.
"""

from __future__ import annotations

import contextlib
import gzip
import re
import tarfile
import zlib
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
MAX_UNPACKED_BYTES = 4 * MAX_SDIST_BYTES
MAX_SDIST_MEMBER_BYTES = 256 << 20  # sglang's and flashinfer's largest source file: < 3 MiB
MAX_SDIST_RATIO = 100  # their sdists unpack to 5-8x their size
MIN_UNPACK_ALLOWANCE = 64 << 20
MAX_COMMIT_ID_FILE_BYTES = 1 << 20
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
    if not (release.sdist_sha256 or index_sha):
        raise FetchError(
            f"{name}=={version}: the index lists its sdist without a sha256; an unpinned sdist "
            "needs one (as an unpinned wheel does); refusing",
            hint="pin the release's sdist sha256 in targets.toml, or use an index that "
            "publishes hashes (PEP 503 #sha256= or PEP 691 hashes)",
        )
    archive = download(
        url,
        dest,
        expected_sha256=release.sdist_sha256 or index_sha,
        label=release.sdist or name,
    )
    try:
        check_sdist(archive)
    except FetchError:
        archive.unlink(missing_ok=True)
        raise
    return archive


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
        with path.open("rb") as fh:
            text = fh.read(MAX_COMMIT_ID_FILE_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    return commit_id_in(text)


def safe_extract_sdist(archive: Path, dest: Path) -> Path:
    """Extract a .tar.gz refusing links, devices, absolute and climbing names, and members or
    totals over the caps (`check_sdist`); returns its top directory."""
    with _readable(archive):
        top = check_sdist(archive)
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(dest, filter="data")
    return dest / top


@contextlib.contextmanager
def _readable(archive: Path):
    """A damaged or non-gzip archive as a one-line FetchError naming it."""
    try:
        yield
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError) as exc:
        cause = str(exc).splitlines()[0].rstrip(":") if str(exc) else type(exc).__name__
        raise FetchError(
            f"{archive.name}: not a readable .tar.gz ({cause})",
            hint="the file is damaged or is not an sdist; nothing was imported",
        ) from None


def unpack_cap(archive: Path) -> int:
    """What an sdist may unpack to: 100x its size (at least 64 MiB), at most 2 GiB."""
    size = archive.stat().st_size
    return min(MAX_UNPACKED_BYTES, max(MIN_UNPACK_ALLOWANCE, MAX_SDIST_RATIO * size))


def check_sdist(archive: Path) -> str:
    """Check every member of an sdist from its header, before its data is inflated (a member
    over 256 MiB or a total over `unpack_cap` is refused as soon as its header is read, so a
    small archive cannot make patchkit inflate GiBs); returns the one top directory."""
    cap = unpack_cap(archive)
    tops: set[str] = set()
    total = 0
    with _readable(archive), tarfile.open(archive, "r:*") as tar:
        for member in tar:  # the next header is read only after this one is checked
            _check_member(archive, member)
            total += member.size
            if member.size > MAX_SDIST_MEMBER_BYTES:
                raise FetchError(
                    f"{archive.name}: member {member.name} holds {member.size} bytes (over "
                    f"{MAX_SDIST_MEMBER_BYTES >> 20} MiB); refusing"
                )
            if total > cap:
                raise FetchError(
                    f"{archive.name}: unpacks to more than {cap >> 20} MiB "
                    f"({MAX_SDIST_RATIO}x its size, at most {MAX_UNPACKED_BYTES >> 20} MiB); "
                    "refusing"
                )
            tops.add(PurePosixPath(member.name).parts[0])
    if len(tops) != 1:
        raise FetchError(f"{archive.name}: expected one top-level directory, found {len(tops)}")
    return tops.pop()


def _check_member(archive: Path, member: tarfile.TarInfo) -> None:
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts:
        raise FetchError(f"{archive.name}: member {member.name} escapes the archive")
    if any(part.lower() == ".git" for part in name.parts):
        raise FetchError(f"{archive.name}: member {member.name} is inside a .git directory")
    if not (member.isfile() or member.isdir()):
        raise FetchError(f"{archive.name}: member {member.name} is a link or device")


def read_sdist_member(archive: Path, inner: str, limit: int = MAX_COMMIT_ID_FILE_BYTES):
    """The bytes of the file `inner` under an sdist's top directory (None when absent), read
    to `limit` bytes at most."""
    with _readable(archive), tarfile.open(archive, "r:*") as tar:
        for member in tar:
            parts = member.name.split("/", 1)
            if member.isfile() and len(parts) == 2 and parts[1] == inner:
                data = tar.extractfile(member)
                return data.read(limit) if data else b""
    return None


def sdist_identity(archive: Path) -> gitops.Identity:
    """A fixed identity dated by the sdist itself: the newest member mtime (same everywhere)."""
    with tarfile.open(archive, "r:*") as tar:
        stamp = max((m.mtime for m in tar.getmembers()), default=0)
    return gitops.Identity(IMPORT_IDENTITY_NAME, IMPORT_IDENTITY_EMAIL, f"{int(stamp)} +0000")


def _sdist_files(archive: Path, subdir: str) -> dict[str, tuple[bool, bytes]]:
    """Each file of an sdist as extraction would leave it, read in place after every header
    is checked (`check_sdist`): path under the target's layout (its top folder replaced by
    `subdir`) -> (executable, bytes)."""
    top = check_sdist(archive)
    files: dict[str, tuple[bool, bytes]] = {}
    with _readable(archive), tarfile.open(archive, "r:*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            rest = PurePosixPath(member.name).relative_to(top).as_posix()
            handle = tar.extractfile(member)
            data = handle.read() if handle else b""
            path = f"{subdir}/{rest}" if subdir else rest
            files.pop(path, None)  # a later member replaces an earlier one, as on disk
            files[path] = (bool(member.mode & 0o100), data)  # git: the owner's x bit
    return files


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
