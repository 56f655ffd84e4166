"""What a wheel or an installed distribution carries, and whether its files are intact.

An installed distribution is checked file by file against its RECORD hashes: a file edited
after install (the overlay-and-sed habit), deleted, or dropped into its packages shows up by
name.  Nothing here prints; callers render the `Inspection`.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from importlib import metadata
from pathlib import Path

from patchkit.archives import archive_problem
from patchkit.errors import InvalidArchiveError, UsageError
from patchkit.wheels.provenance import PROVENANCE_FILE, Provenance
from patchkit.wheels.reproducible import check_record, dist_info_dir, record_hash
from patchkit.wheels.sbom import SBOM_DIR

EXIT_OK, EXIT_MODIFIED, EXIT_NO_PROVENANCE = 0, 1, 3


@dataclass(frozen=True)
class FileProblem:
    path: str
    problem: str  # changed | missing | added | unhashed

    def to_json(self) -> dict:
        return {"path": self.path, "problem": self.problem}


@dataclass
class Inspection:
    """The result of `inspect`: provenance (if any) and the files that do not match RECORD."""

    kind: str  # wheel | installed
    subject: str  # the wheel's path, or the distribution name
    distribution: str
    version: str
    location: str
    provenance: Provenance | None
    sboms: list[str] = field(default_factory=list)
    checked: int = 0
    problems: list[FileProblem] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.problems:
            return "modified"
        if self.provenance is None:
            return "no-provenance"
        return "ok"

    @property
    def exit_code(self) -> int:
        if self.problems:
            return EXIT_MODIFIED
        if self.provenance is None:
            return EXIT_NO_PROVENANCE
        return EXIT_OK

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "distribution": self.distribution,
            "version": self.version,
            "location": self.location,
            "status": self.status,
            "provenance": self.provenance.to_json() if self.provenance else None,
            "sboms": self.sboms,
            "files_checked": self.checked,
            "problems": [p.to_json() for p in self.problems],
        }


def _provenance(text: str | None, where: str) -> Provenance | None:
    if text is None:
        return None
    try:
        return Provenance.from_json(json.loads(text))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        raise UsageError(f"{where}: {PROVENANCE_FILE} is not valid JSON") from None


def inspect_wheel(path: Path) -> Inspection:
    """Read a wheel's provenance and check its files against its own RECORD."""
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise UsageError(f"{path}: not a readable wheel ({exc})") from None
    with zf:
        problem = archive_problem(zf.infolist())
        if problem:
            raise InvalidArchiveError(f"{path}: invalid archive: {problem}; nothing was read")
        names = zf.namelist()
        try:
            dist_info = dist_info_dir(names)
        except ValueError as exc:
            raise InvalidArchiveError(f"{path}: invalid archive: {exc}") from None
        if f"{dist_info}/RECORD" not in names or f"{dist_info}/METADATA" not in names:
            raise InvalidArchiveError(
                f"{path}: invalid archive: {dist_info}/ lacks RECORD or METADATA"
            )
        headers = HeaderParser().parsestr(zf.read(f"{dist_info}/METADATA").decode("utf-8"))
        prov_name = f"{dist_info}/{PROVENANCE_FILE}"
        text = zf.read(prov_name).decode("utf-8") if prov_name in names else None
        sboms = sorted(n for n in names if n.startswith(f"{dist_info}/{SBOM_DIR}/"))
        checked = sum(1 for n in names if not n.endswith("/"))
    problems = [FileProblem(name, problem) for name, problem in check_record(path)]
    return Inspection(
        "wheel",
        str(path),
        headers["Name"],
        headers["Version"],
        str(path),
        _provenance(text, str(path)),
        sboms,
        checked,
        problems,
    )


def _find_distribution(name: str, paths: list[str] | None) -> metadata.Distribution:
    search = paths if paths is not None else sys.path
    for dist in metadata.distributions(name=name, path=search):
        return dist
    where = ", ".join(search) if paths is not None else "this interpreter's sys.path"
    raise UsageError(
        f"no installed distribution '{name}' in {where}",
        hint="pass --path SITE_PACKAGES for another environment",
    )


def inspect_installed(name: str, paths: list[str] | None = None) -> Inspection:
    """Check every file an installed distribution's RECORD lists (and look for added ones)."""
    dist = _find_distribution(name, paths)
    location = Path(str(dist.locate_file(""))).resolve()
    records = list(dist.files or [])
    if not records:
        raise UsageError(f"{name}: the installed distribution has no RECORD to check against")
    problems: list[FileProblem] = []
    recorded: set[str] = set()
    checked = 0
    for entry in records:
        recorded.add(entry.as_posix())
        if entry.hash is None:
            continue
        target = Path(str(dist.locate_file(entry)))
        checked += 1
        try:
            data = target.read_bytes()
        except FileNotFoundError:
            problems.append(FileProblem(entry.as_posix(), "missing"))
            continue
        if record_hash(data) != f"{entry.hash.mode}={entry.hash.value}":
            problems.append(FileProblem(entry.as_posix(), "changed"))
    problems.extend(FileProblem(p, "added") for p in _added_files(dist, location, recorded))
    prov = _provenance(dist.read_text(PROVENANCE_FILE), f"{name} at {location}")
    meta_dir = _dist_info_name(records)
    sboms = sorted(p for p in recorded if meta_dir and p.startswith(f"{meta_dir}/{SBOM_DIR}/"))
    return Inspection(
        "installed",
        name,
        dist.metadata["Name"],
        dist.version,
        str(location),
        prov,
        sboms,
        checked,
        sorted(problems, key=lambda p: p.path),
    )


def _dist_info_name(records) -> str | None:
    for entry in records:
        top = entry.parts[0] if entry.parts else ""
        if top.endswith(".dist-info"):
            return top
    return None


def _added_files(dist: metadata.Distribution, location: Path, recorded: set[str]) -> list[str]:
    """Files inside the distribution's own package directories that no RECORD lists."""
    tops = {p.split("/", 1)[0] for p in recorded if "/" in p and not p.startswith("..")}
    tops = {t for t in tops if not t.endswith((".dist-info", ".data")) and (location / t).is_dir()}
    if not tops:
        return []
    owned = set(recorded)
    for other in metadata.distributions(path=[str(location)]):
        if other.metadata["Name"] == dist.metadata["Name"]:
            continue
        owned.update(f.as_posix() for f in other.files or [] if f.parts and f.parts[0] in tops)
    added = []
    for top in sorted(tops):
        for root, dirs, files in os.walk(location / top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for filename in sorted(files):
                rel = (Path(root) / filename).relative_to(location).as_posix()
                if rel not in owned:
                    added.append(rel)
    return added
