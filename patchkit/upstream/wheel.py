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

from patchkit import gitops
from patchkit.archives import archive_problem
from patchkit.errors import FetchError, InvalidArchiveError, PinError
from patchkit.targets import Release, Target, WheelPin
from patchkit.upstream.index import check_sha256, download, file_sha256, find_file
from patchkit.upstream.mirror import WHEEL_REF
from patchkit.upstream.sdist import IMPORT_IDENTITY_EMAIL, IMPORT_IDENTITY_NAME, commit_id_in

if TYPE_CHECKING:
    from patchkit.upstream.mirror import Mirror

COMPILED_RE = re.compile(r"\.(so(\.[0-9]+)*|pyd|dll|dylib)$")
ELF_MAGIC = b"\x7fELF"


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


def wheel_layout(zf: zipfile.ZipFile, label: str) -> WheelLayout:
    """Check a wheel's members (refusing hostile ones) and divide them."""
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
    for info in files:
        parts = PurePosixPath(info.filename).parts
        if any(p.lower() == ".git" for p in parts) or "\\" in info.filename:
            raise InvalidArchiveError(f"{label}: member {info.filename!r} is not a plain path")
        mode = info.external_attr >> 16
        if mode and not stat.S_ISREG(mode) and stat.S_IFMT(mode):
            raise InvalidArchiveError(f"{label}: member {info.filename!r} is not a regular file")
        if parts[0].endswith((".dist-info", ".data")):
            metadata.append(info)
            continue
        with zf.open(info) as fh:
            head = fh.read(4)
        (compiled if is_compiled(info.filename, head) else sources).append(info)
    return WheelLayout(dist_info, tuple(sources), tuple(compiled), tuple(metadata))


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
        text = zf.read(target.commit_id_file).decode("utf-8", "replace")
    except KeyError:
        return None
    return commit_id_in(text)


def import_wheel(
    mirror: Mirror, target: Target, release: Release, pin: WheelPin, archive: Path
) -> str:
    """Import the wheel's source files under the target's subdir as a deterministic commit."""
    check_wheel_file(archive, pin)
    with zipfile.ZipFile(archive) as zf:
        layout = wheel_layout(zf, pin.filename)
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
        files = _source_files(zf, layout, target.subdir)
        sha = gitops.import_files(mirror.repo, files, message, who)
    gitops.update_ref(mirror.repo, WHEEL_REF.format(version=release.version), sha)
    return sha


def _source_files(zf: zipfile.ZipFile, layout: WheelLayout, subdir: str):
    """(path under the target's layout, executable, bytes) of each source member, read from
    the archive as git is given them (nothing is extracted)."""
    prefix = f"{subdir}/" if subdir else ""
    for info in layout.sources:
        with zf.open(info) as src:
            data = src.read()
        executable = bool((info.external_attr >> 16) & 0o111)
        yield prefix + PurePosixPath(info.filename).as_posix(), executable, data
