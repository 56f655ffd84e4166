"""What a wheel or an installed distribution carries, and whether its files are intact.

An installed distribution is checked file by file against its RECORD hashes: a file edited
after install (the overlay-and-sed habit), deleted, or dropped into its packages shows up by
name.  Nothing here prints; callers render the `Inspection`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from importlib import metadata
from pathlib import Path

from patchkit.archives import (
    MAX_JSON_BYTES,
    MAX_METADATA_BYTES,
    MAX_RECORD_BYTES,
    MemberError,
    SpecialFileError,
    archive_problem,
    hash_file,
    hash_member,
    open_regular,
    read_member,
    special_file_problem,
)
from patchkit.errors import InvalidArchiveError, UsageError
from patchkit.wheels.provenance import PROVENANCE_FILE, Provenance
from patchkit.wheels.reproducible import dist_info_dir
from patchkit.wheels.sbom import SBOM_DIR

EXIT_OK, EXIT_MODIFIED, EXIT_NO_PROVENANCE = 0, 1, 3


@dataclass(frozen=True)
class FileProblem:
    path: str
    problem: str  # changed | missing | added | unhashed | special (a FIFO or device)

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


_STR_FIELDS = {
    (): ("distribution", "version"),
    ("upstream",): ("target", "version", "git", "base_commit", "source"),
    ("series",): ("version", "hash", "result_commit"),
}
_OPTIONAL_STR = {("upstream",): ("commit", "sdist", "sdist_sha256")}


def _provenance_type_problem(data: object) -> str | None:
    """Where a provenance document has the wrong JSON types (it comes from the archive)."""
    if not isinstance(data, dict):
        return "the document is not a JSON object"
    for check in _PROVENANCE_CHECKS:
        problem = check(data)
        if problem:
            return problem
    return None


def _sections_problem(data: dict) -> str | None:
    for key in ("upstream", "series", "profile", "tools"):
        if key in data and not isinstance(data[key], dict):
            return f"'{key}' is not an object"
    return None


def _strings_problem(data: dict) -> str | None:
    """A field of _STR_FIELDS that is not a string, or of _OPTIONAL_STR neither that nor null."""
    for where, keys in _STR_FIELDS.items():
        node = data.get(where[0], {}) if where else data
        for key in keys:
            if key in node and not isinstance(node[key], str):
                return f"'{'.'.join((*where, key))}' is not a string"
    for where, keys in _OPTIONAL_STR.items():
        node = data.get(where[0], {})
        for key in keys:
            if node.get(key) is not None and not isinstance(node[key], str):
                return f"'{'.'.join((*where, key))}' is not a string or null"
    return None


def _patches_problem(data: dict) -> str | None:
    patches = data.get("series", {}).get("patches", [])
    if not isinstance(patches, list):
        return "'series.patches' is not a list"
    for i, patch in enumerate(patches):
        problem = _patch_problem(f"series.patches[{i}]", patch)
        if problem:
            return problem
    return None


def _patch_problem(where: str, patch: object) -> str | None:
    if not isinstance(patch, dict):
        return f"'{where}' is not an object"
    for key in ("name", "sha256", "subject"):
        if key in patch and not isinstance(patch[key], str):
            return f"'{where}.{key}' is not a string"
    links = patch.get("upstream_links", [])
    if not isinstance(links, list) or not all(isinstance(x, str) for x in links):
        return f"'{where}.upstream_links' is not a list of strings"
    return None


def _tools_problem(data: dict) -> str | None:
    if not all(isinstance(v, str) for v in data.get("tools", {}).values()):
        return "'tools' values are not all strings"
    return None


def _epoch_problem(data: dict) -> str | None:
    epoch = data.get("source_date_epoch", 0)
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        return "'source_date_epoch' is not an integer"
    return None


# The checks of a provenance document's types, in the order their problems are said (each
# may rely on the ones before it: a section is an object before its fields are read).
_PROVENANCE_CHECKS = (
    _sections_problem,
    _strings_problem,
    _patches_problem,
    _tools_problem,
    _epoch_problem,
)


def _provenance(text: str | None, where: str) -> Provenance | None:
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise UsageError(f"{where}: {PROVENANCE_FILE} is not valid JSON") from None
    problem = _provenance_type_problem(data)
    if problem:
        raise InvalidArchiveError(f"{where}: {PROVENANCE_FILE} is malformed: {problem}")
    try:
        return Provenance.from_json(data)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        raise InvalidArchiveError(f"{where}: {PROVENANCE_FILE} is malformed ({exc})") from None


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MemberError(f"{what} is not UTF-8 (byte {exc.start})") from None


def _record_problems(
    zf: zipfile.ZipFile, files: list[zipfile.ZipInfo], record_name: str, text: str
) -> list[FileProblem]:
    """Each file that does not match RECORD; linear in the number of members."""
    record: dict[str, str] = {}
    try:
        for row in csv.reader(io.StringIO(text)):
            if row:
                record[row[0]] = row[1] if len(row) > 1 else ""
    except csv.Error as exc:
        raise MemberError(f"{record_name} is not a RECORD file ({exc})") from None
    problems = []
    names = set()
    for info in files:
        names.add(info.filename)
        if info.filename == record_name:
            continue
        digest = record.get(info.filename)
        if digest is None:
            problems.append(FileProblem(info.filename, "added"))
        elif not digest:
            problems.append(FileProblem(info.filename, "unhashed"))
        elif digest != hash_member(zf, info):
            problems.append(FileProblem(info.filename, "changed"))
    problems.extend(FileProblem(path, "missing") for path in record if path not in names)
    return sorted(problems, key=lambda p: (p.path, p.problem))


def inspect_wheel(path: Path) -> Inspection:
    """Read a wheel's provenance and check its files against its own RECORD.

    Hostile archives (see patchkit.archives) are refused before any member is read; members
    are read with size limits; a damaged member (bad CRC, unreadable stream) or METADATA that
    is not UTF-8 make the archive invalid, with the member named.
    """
    try:
        fh = open_regular(path)
    except SpecialFileError as exc:
        raise UsageError(f"{exc}; pass a wheel file", hint="nothing was read") from None
    except OSError as exc:
        raise UsageError(f"{path}: not a readable wheel ({exc.strerror or exc})") from None
    try:
        zf = zipfile.ZipFile(fh)
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as exc:
        fh.close()
        raise UsageError(f"{path}: not a readable wheel ({exc})") from None
    with fh, zf:
        infos = zf.infolist()
        problem = archive_problem(infos)
        if problem:
            raise InvalidArchiveError(f"{path}: invalid archive: {problem}; nothing was read")
        by_name = {info.filename: info for info in infos}
        try:
            dist_info = dist_info_dir(by_name)
        except ValueError as exc:
            raise InvalidArchiveError(f"{path}: invalid archive: {exc}") from None
        record_name, meta_name = f"{dist_info}/RECORD", f"{dist_info}/METADATA"
        if record_name not in by_name or meta_name not in by_name:
            raise InvalidArchiveError(
                f"{path}: invalid archive: {dist_info}/ lacks RECORD or METADATA"
            )
        prov_name = f"{dist_info}/{PROVENANCE_FILE}"
        files = [info for info in infos if not info.is_dir()]
        try:
            meta = _text(read_member(zf, by_name[meta_name], MAX_METADATA_BYTES), meta_name)
            text = None
            if prov_name in by_name:
                raw = read_member(zf, by_name[prov_name], MAX_JSON_BYTES)
                text = _text(raw, prov_name)
            record = _text(read_member(zf, by_name[record_name], MAX_RECORD_BYTES), record_name)
            problems = _record_problems(zf, files, record_name, record)
        except MemberError as exc:
            raise InvalidArchiveError(f"{path}: invalid archive: {exc}") from None
        headers = HeaderParser().parsestr(meta)
        if not headers["Name"] or not headers["Version"]:
            raise InvalidArchiveError(f"{path}: invalid archive: {meta_name} lacks Name or Version")
        sboms = sorted(n for n in by_name if n.startswith(f"{dist_info}/{SBOM_DIR}/"))
    return Inspection(
        "wheel",
        str(path),
        str(headers["Name"]),
        str(headers["Version"]),
        str(path),
        _provenance(text, str(path)),
        sboms,
        len(files),
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
    meta_path = getattr(dist, "_path", None)  # the .dist-info directory of a PathDistribution
    for member in ("METADATA", "RECORD", PROVENANCE_FILE):
        problem = special_file_problem(Path(str(meta_path)) / member) if meta_path else None
        if problem:
            raise UsageError(f"{name}: {problem}; nothing was read")
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
            digest = hash_file(target)
        except FileNotFoundError:
            problems.append(FileProblem(entry.as_posix(), "missing"))
            continue
        except SpecialFileError:
            problems.append(FileProblem(entry.as_posix(), "special"))  # FIFO, device
            continue
        if digest != f"{entry.hash.mode}={entry.hash.value}":
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
