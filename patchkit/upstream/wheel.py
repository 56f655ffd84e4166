"""Wheel bases: a release published only as platform wheels, imported as a source tree.

The pinned wheel is downloaded (sha256-checked, nothing kept on a mismatch) and its files are
committed under the target's layout (`python/sglang/...`) as a parentless commit with a fixed
identity dated by the wheel itself, so the commit id is the same on every machine.  The
`.dist-info` (and any `.data`) directory is metadata, not source, and compiled members
(extension modules) are build products: both stay out of the tree, are named in the commit
message, and are carried unchanged when a patched wheel is repacked.
"""

from __future__ import annotations

import calendar
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from patchkit import gitops
from patchkit.archives import (
    MAX_METADATA_BYTES,
    MemberError,
    archive_problem,
    member_head,
    read_member,
)
from patchkit.errors import FetchError, InvalidArchiveError, PinError
from patchkit.targets import Release, Target, WheelPin
from patchkit.upstream.index import check_sha256, download, file_sha256, find_file
from patchkit.upstream.mirror import WHEEL_REF
from patchkit.upstream.sdist import (
    IMPORT_IDENTITY_EMAIL,
    IMPORT_IDENTITY_NAME,
    MAX_COMMIT_ID_FILE_BYTES,
    commit_id_in,
)

if TYPE_CHECKING:
    from patchkit.upstream.mirror import Mirror

MAX_SOURCE_MEMBER_BYTES = 256 << 20  # sglang's largest source file is under 1 MiB
COMPILED_RE = re.compile(r"\.(so(\.[0-9]+)*|pyd|dll|dylib)$")
ELF_MAGIC = b"\x7fELF"
# How many bytes of source members an import keeps read while it checks the wheel (sglang
# 0.5.23's wheel holds 117 MiB in all); past it, a member is read again when imported.
KEEP_BYTES = 128 << 20


def wheel_path(pin: WheelPin, cache: Path) -> Path:
    return cache / "wheels" / pin.filename


def download_wheel(pin: WheelPin, cache: Path) -> Path:
    """The pinned wheel in the cache: reused when its sha256 matches, else downloaded from the
    index (write-then-rename) and refused, with nothing written, on a sha256 mismatch."""
    dest = wheel_path(pin, cache)
    if dest.is_file() and file_sha256(dest) == pin.sha256:
        return dest
    url, _ = find_file(pin.distribution, {pin.filename}, f"{pin.filename}: no such wheel")
    return download(url, dest, expected_sha256=pin.sha256, label=pin.filename)


def check_wheel_file(path: Path, pin: WheelPin) -> None:
    """Refuse a wheel file whose sha256 is not the pin's."""
    check_sha256(pin.filename, file_sha256(path), pin.sha256)


@dataclass(frozen=True)
class WheelLayout:
    """How a wheel's members divide: source files, compiled members, metadata."""

    dist_info: str
    sources: tuple[zipfile.ZipInfo, ...]
    compiled: tuple[zipfile.ZipInfo, ...]
    metadata: tuple[zipfile.ZipInfo, ...]  # .dist-info/ and .data/ members

    @property
    def top_level(self) -> set[str]:
        """The wheel's top-level names that hold source (e.g. `sglang`, `tools`)."""
        return {PurePosixPath(i.filename).parts[0] for i in (*self.sources, *self.compiled)}


def is_compiled(name: str, head: bytes = b"") -> bool:
    """An extension module or shared library (by name, or by its ELF magic)."""
    return bool(COMPILED_RE.search(name)) or head.startswith(ELF_MAGIC)


def wheel_layout(
    zf: zipfile.ZipFile, label: str, keep: dict[str, bytes] | None = None
) -> WheelLayout:
    """Check a wheel's members (refusing hostile ones) and divide them. With `keep`, a member
    not compiled by its name is read whole (bounded, CRC-checked) to learn its head, and its
    bytes are kept there by name, up to KEEP_BYTES: an import reads each member once."""
    infos = zf.infolist()
    problem = archive_problem(infos)
    if problem:
        raise InvalidArchiveError(f"{label}: {problem}; nothing was imported")
    files = [i for i in infos if not i.is_dir()]
    tops = {i.filename.split("/", 1)[0] for i in files}
    dist_infos = {top for top in tops if top.endswith(".dist-info")}
    if len(dist_infos) != 1:
        raise InvalidArchiveError(
            f"{label}: expected one .dist-info directory, found {len(dist_infos)}"
        )
    dist_info = dist_infos.pop()
    if f"{dist_info}/RECORD" not in {i.filename for i in files}:
        raise InvalidArchiveError(f"{label}: no {dist_info}/RECORD")
    sources, compiled, metadata = [], [], []
    kept = 0
    for info in files:
        parts = _plain_member(info, label)
        if parts[0].endswith((".dist-info", ".data")):
            metadata.append(info)
            continue
        if COMPILED_RE.search(info.filename):
            compiled.append(info)
            continue
        if keep is not None and kept + info.file_size <= KEEP_BYTES:
            head = keep[info.filename] = read_member(zf, info, MAX_SOURCE_MEMBER_BYTES)
            kept += len(head)
        else:
            head = member_head(zf, info, 4)
        (compiled if is_compiled(info.filename, head) else sources).append(info)
    return WheelLayout(dist_info, tuple(sources), tuple(compiled), tuple(metadata))


def _plain_member(info: zipfile.ZipInfo, label: str) -> tuple[str, ...]:
    """The parts of a member's path; refused unless a plain path to a regular file."""
    parts = PurePosixPath(info.filename).parts
    if any(p.lower() == ".git" for p in parts) or "\\" in info.filename:
        raise InvalidArchiveError(f"{label}: member {info.filename!r} is not a plain path")
    mode = info.external_attr >> 16
    if mode and not stat.S_ISREG(mode) and stat.S_IFMT(mode):
        raise InvalidArchiveError(f"{label}: member {info.filename!r} is not a regular file")
    return parts


def wheel_epoch(zf: zipfile.ZipFile) -> int:
    """The newest member date of a wheel, as seconds since the epoch (zip dates carry no zone:
    read as UTC, the same everywhere)."""
    stamps = [calendar.timegm((*i.date_time, 0, 0, 0)) for i in zf.infolist()]
    return max(stamps, default=0)


def recorded_commit_id(zf: zipfile.ZipFile, target: Target) -> str | None:
    """The upstream commit id the wheel records in the target's commit-id file, if any."""
    if not target.commit_id_file:
        return None
    try:
        info = zf.getinfo(target.commit_id_file)
    except KeyError:
        return None
    text = read_member(zf, info, MAX_COMMIT_ID_FILE_BYTES).decode("utf-8", "replace")
    return commit_id_in(text)


def import_wheel(
    mirror: Mirror, target: Target, release: Release, pin: WheelPin, archive: Path
) -> str:
    """Import the wheel's source files under the target's subdir as a deterministic commit.
    A damaged wheel (not a zip, truncated, a bad CRC, a member that inflates past its claim)
    is a one-line FetchError naming it and the release, and is removed from the cache."""
    check_wheel_file(archive, pin)
    try:
        return _import_checked(mirror, target, release, pin, archive)
    except InvalidArchiveError:
        archive.unlink(missing_ok=True)  # never importable: the next run asks the index again
        raise
    except (zipfile.BadZipFile, MemberError, EOFError) as exc:
        archive.unlink(missing_ok=True)
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FetchError(
            f"{pin.filename} ({target.name} {release.version}): a damaged wheel ({why[:200]}); "
            "it was removed from the cache, nothing was imported"
        ) from None


def _import_checked(
    mirror: Mirror, target: Target, release: Release, pin: WheelPin, archive: Path
) -> str:
    with zipfile.ZipFile(archive) as zf:
        contents: dict[str, bytes] = {}
        layout = wheel_layout(zf, pin.filename, contents)
        check_identity(zf, layout, pin, release)
        recorded = recorded_commit_id(zf, target)
        if recorded and release.commit and not release.commit.startswith(recorded.lower()):
            raise PinError(
                f"{pin.filename}: the wheel records upstream commit {recorded}, but the pin "
                f"says {release.commit[:12]}; refusing"
            )
        upstream = release.commit or (recorded if recorded and len(recorded) == 40 else None)
        compiled = " ".join(i.filename for i in layout.compiled) or "none"
        message = (
            f"Import {pin.distribution} {release.version} from its wheel\n\n"
            f"Patchkit-Wheel: {pin.filename}\n"
            f"Patchkit-Wheel-Sha256: {pin.sha256}\n"
            f"Patchkit-Wheel-Dist-Info: {layout.dist_info}\n"
            f"Patchkit-Wheel-Compiled: {compiled}\n"
            f"Patchkit-Wheel-Commit-Id: {recorded or 'none'}\n"
            f"Patchkit-Upstream-Commit: {upstream or 'unknown'}\n"
        )
        who = gitops.Identity(
            IMPORT_IDENTITY_NAME, IMPORT_IDENTITY_EMAIL, f"{wheel_epoch(zf)} +0000"
        )
        if not layout.sources:
            raise FetchError(f"{pin.filename}: holds no source files to import")
        files = _source_files(zf, layout, target.subdir, contents)
        sha = gitops.import_files(mirror.repo, files, message, who)
    gitops.update_ref(mirror.repo, WHEEL_REF.format(version=release.version), sha)
    return sha


def _source_files(zf: zipfile.ZipFile, layout: WheelLayout, subdir: str, read: dict[str, bytes]):
    """(path under the target's layout, executable, bytes) of each source member, taken from
    `read` (popped: held once) or read from the archive as git is given them (nothing is
    extracted)."""
    prefix = f"{subdir}/" if subdir else ""
    for info in layout.sources:
        data = read.pop(info.filename, None)
        if data is None:
            data = read_member(zf, info, MAX_SOURCE_MEMBER_BYTES)  # bounded, CRC-checked
        executable = bool((info.external_attr >> 16) & 0o111)
        yield prefix + PurePosixPath(info.filename).as_posix(), executable, data


def check_identity(zf: zipfile.ZipFile, layout: WheelLayout, pin: WheelPin, release: Release):
    """Refuse a wheel whose file name, `.dist-info` folder and METADATA `Name`/`Version` do not
    all name the release asked for (pip refuses such wheels too)."""
    try:
        name, version, _, _ = parse_wheel_filename(pin.filename)
    except InvalidWheelFilename as exc:
        raise InvalidArchiveError(f"{pin.filename}: not a wheel file name ({exc})") from None
    problem = _release_problem(version, release) or _dist_info_problem(
        layout.dist_info, name, version
    )
    if problem is None:
        meta = _metadata(zf, layout.dist_info)
        got_name, got_version = meta.get("name", ""), meta.get("version", "")
        if canonicalize_name(got_name) != name:
            problem = f"its METADATA names project {got_name!r}, not {name}"
        elif _version(got_version) != version:
            problem = f"its METADATA says version {got_version!r}, not {version}"
    if problem:
        raise InvalidArchiveError(
            f"{pin.filename} ({release.version}): {problem}; refusing, nothing was imported"
        )


def _release_problem(version, release: Release) -> str | None:
    if _version(release.version) != version:
        return f"the file is version {version}, the release asked for is {release.version}"
    return None


def _dist_info_problem(dist_info: str, name: str, version) -> str | None:
    folder_name, _, folder_version = dist_info.removesuffix(".dist-info").rpartition("-")
    if canonicalize_name(folder_name) != name or _version(folder_version) != version:
        return f"its metadata folder {dist_info} names another project or version"
    return None


def _version(text: str):
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _metadata(zf: zipfile.ZipFile, dist_info: str) -> dict[str, str]:
    """The first `Name` and `Version` of a wheel's METADATA (lower-cased keys)."""
    try:
        info = zf.getinfo(f"{dist_info}/METADATA")
    except KeyError:
        raise InvalidArchiveError(f"no {dist_info}/METADATA") from None
    text = read_member(zf, info, MAX_METADATA_BYTES).decode("utf-8", "replace")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        key, sep, value = line.partition(":")
        if sep and key.lower() in ("name", "version"):
            fields.setdefault(key.lower(), value.strip())
    return fields
