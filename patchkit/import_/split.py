"""Which concern each change belongs to: areas by default, steered by a mapping file.

An area is a package directory (at most three levels below the top package, e.g.
`sglang/srt/layers/moe`) or, for a module directly in a top package (`sglang/srt/server_args.py`),
that module. The mapping file (TOML, documented in docs/migrating.md) names patches and the
path globs, and optionally the functions or classes, whose hunks they take; the first patch that
claims a hunk wins, hunk selectors before path globs, and what no entry claims goes to its area.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from patchkit.compat import tomllib
from patchkit.errors import UsageError
from patchkit.import_.diffparse import FileDiff, Hunk, render_file
from patchkit.series import PATCH_NAME_RE

AREA_DEPTH = 3
PACKAGING = ("pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in")
MAPPING_KEYS = {"name", "subject", "description", "paths", "hunks"}


@dataclass
class MappingEntry:
    name: str  # file name without .patch
    subject: str | None = None
    description: str | None = None
    paths: list[str] = field(default_factory=list)
    hunks: list[tuple[str, str]] = field(default_factory=list)  # (path glob, qualname glob)


@dataclass
class Mapping:
    entries: list[MappingEntry]
    source: str = ""


def load_mapping(path: Path) -> Mapping:
    """Read and check a mapping file; every error names the file and the entry."""
    data = _read_toml(path)
    unknown = set(data) - {"patch"}
    if unknown:
        raise UsageError(f"{path}: unknown table(s) {', '.join(sorted(unknown))} (only [[patch]])")
    entries: list[MappingEntry] = []
    for number, raw in enumerate(data.get("patch", []), 1):
        taken = {e.name for e in entries}
        entries.append(_mapping_entry(f"{path}: [[patch]] #{number}", raw, taken))
    if not entries:
        raise UsageError(f"{path}: no [[patch]] entries")
    return Mapping(entries, str(path))


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such mapping file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None


def _mapping_entry(where: str, raw: object, taken: set[str]) -> MappingEntry:
    """One [[patch]] table, checked (`taken`: the names of the entries before it)."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: not a table")
    extra = set(raw) - MAPPING_KEYS
    if extra:
        raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
    name = str(raw.get("name", "")).removesuffix(".patch")
    if not PATCH_NAME_RE.match(f"{name}.patch") or "/" in name:
        raise UsageError(f"{where}: name {name!r} is not a patch name (letters, digits, .-_+)")
    if name in taken:
        raise UsageError(f"{where}: name {name!r} is used twice")
    paths = raw.get("paths", [])
    hunks = raw.get("hunks", [])
    if not all(isinstance(p, str) for p in [*paths, *hunks]):
        raise UsageError(f"{where}: paths and hunks are lists of strings")
    if not paths and not hunks:
        raise UsageError(f"{where} ({name}): give paths or hunks")
    subject = raw.get("subject")
    if subject is not None and (not isinstance(subject, str) or "\n" in subject or "\r" in subject):
        raise UsageError(f"{where}: subject {subject!r} is not one line of text")
    return MappingEntry(
        name=name,
        subject=subject,
        description=raw.get("description"),
        paths=list(paths),
        hunks=[_hunk_selector(where, sel) for sel in hunks],
    )


def _hunk_selector(where: str, selector: str) -> tuple[str, str]:
    glob, sep, qual = selector.partition("::")
    if not sep or not glob or not qual:
        raise UsageError(f"{where}: hunk selector {selector!r} is not PATH_GLOB::FUNCTION_GLOB")
    return glob, qual


# --- areas ----------------------------------------------------------------------------------


def area_of(path: str, subdir: str) -> tuple[str, str]:
    """(slug, shown name) of the area a path belongs to."""
    rel = path[len(subdir) + 1 :] if subdir and path.startswith(subdir + "/") else path
    parts = PurePosixPath(rel).parts
    if len(parts) == 1:
        if parts[0] in PACKAGING or parts[0].startswith("requirements"):
            return "packaging", "packaging"
        return "top-level-files", "top-level files"
    dirs = list(parts[:-1])
    if len(dirs) <= 2 and parts[-1].endswith(".py") and parts[-1] != "__init__.py":
        shown = "/".join([*dirs, PurePosixPath(parts[-1]).stem])
    else:
        shown = "/".join(dirs[: AREA_DEPTH + 1])
    words = shown.split("/")
    if len(words) > 1:
        words = words[1:]  # the top package is the same for every file: leave it out of names
    return _slug("-".join(words)), shown


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:50].rstrip("-") or "changes"


# --- enclosing functions --------------------------------------------------------------------


def enclosing_names(source: bytes | None, path: str, hunks: list[Hunk]) -> list[str]:
    """For each hunk, the dotted name of the function or class its first change is inside
    ('' at module level or for a file that is not Python)."""
    if source is None or not path.endswith(".py"):
        return ["" for _ in hunks]
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ["" for _ in hunks]
    scopes: list[tuple[int, int, int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                scopes.append((start, child.end_lineno or child.lineno, child.col_offset, name))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return [_scope_of(hunk, scopes) for hunk in hunks]


def _scope_of(hunk: Hunk, scopes: list[tuple[int, int, int, str]]) -> str:
    old_line = hunk.old_start if hunk.old_len else hunk.old_start + 1
    for line in hunk.lines:
        tag = line[:1]
        if tag == " ":
            old_line += 1
            continue
        if tag not in "+-":
            continue
        anchor = old_line if tag == "-" else old_line - 1
        text = line[1:]
        indent = len(text) - len(text.lstrip()) if text.strip() else 10**6
        best = ""
        for start, end, col, name in scopes:
            if start <= anchor <= end and col < indent and len(name) >= len(best):
                best = name
        return best
    return ""


# --- assignment -----------------------------------------------------------------------------


@dataclass
class Concern:
    """One proposed patch: its name, subject, description and the hunks it takes."""

    name: str
    subject: str
    description: str
    parts: list[tuple[FileDiff, list[int]]] = field(default_factory=list)  # file, hunk indexes

    @property
    def files(self) -> list[str]:
        return [f.path for f, _ in self.parts]

    @property
    def added(self) -> int:
        return sum(f.hunks[i].added for f, idx in self.parts for i in idx)

    @property
    def removed(self) -> int:
        return sum(f.hunks[i].removed for f, idx in self.parts for i in idx)


def _matches(path: str, glob: str) -> bool:
    return fnmatch.fnmatchcase(path, glob)


def _qual_matches(qual: str, glob: str) -> bool:
    if glob == "<module>":
        return qual == ""
    pieces = qual.split(".") if qual else []
    return any(fnmatch.fnmatchcase(".".join(pieces[:n]), glob) for n in range(1, len(pieces) + 1))


@dataclass
class _Concerns:
    """The concerns met so far: the mapping's entries, then each area as its files are met."""

    subdir: str
    by_name: dict[str, Concern] = field(default_factory=dict)
    areas: dict[str, str] = field(default_factory=dict)  # area concern -> the area as shown

    def of_area(self, path: str) -> str:
        """The name of the concern of `path`'s area (made when first met)."""
        slug, shown = area_of(path, self.subdir)
        name = f"{slug}-changes"
        if name not in self.by_name:
            self.by_name[name] = Concern(name, f"{shown} changes", "")
            self.areas[name] = shown
        return name


def assign(
    files: list[FileDiff],
    names_of: dict[str, list[str]],
    subdir: str,
    mapping: Mapping | None,
    source_name: str,
) -> tuple[list[Concern], list[str]]:
    """Group the hunks of `files` into concerns, in series order; returns (concerns, notes)."""
    entries = mapping.entries if mapping else []
    concerns = _Concerns(subdir)
    for entry in entries:
        concerns.by_name[entry.name] = Concern(
            entry.name,
            entry.subject or _subject_from_name(entry.name),
            entry.description or "",
        )
    used: set[str] = set()
    for diff in files:
        quals = names_of.get(diff.path, [""] * len(diff.hunks))
        for owner, indexes in _by_owner(_owners(diff, quals, entries, concerns)).items():
            used.add(owner)
            parts = concerns.by_name[owner].parts
            parts.append((diff, [i for i in indexes if i < len(diff.hunks)]))
    notes = [
        f"mapping entry {e.name} matches no change of {source_name}"
        for e in entries
        if e.name not in used
    ]
    order = [e.name for e in entries] + sorted(concerns.areas)
    result = [concerns.by_name[name] for name in order if name in used]
    for concern in result:
        if not concern.description:
            concern.description = _placeholder_description(
                concern, concerns.areas.get(concern.name), source_name
            )
    return result, notes


def _owners(
    diff: FileDiff, quals: list[str], entries: list[MappingEntry], concerns: _Concerns
) -> list[str]:
    """The concern taking each hunk of `diff`: the first entry whose hunk selector takes it,
    else the first whose path glob does, else the file's area. A file that cannot be split
    by hunk goes whole to one concern."""
    by_path = next((e.name for e in entries if any(_matches(diff.path, g) for g in e.paths)), None)
    owners = [
        _hunk_owner(diff.path, qual, entries) or by_path or concerns.of_area(diff.path)
        for qual in quals
    ]
    if diff.whole or not diff.hunks:
        whole = owners[0] if owners else (by_path or concerns.of_area(diff.path))
        owners = [whole] * max(len(diff.hunks), 1)
    return owners


def _hunk_owner(path: str, qual: str, entries: list[MappingEntry]) -> str | None:
    """The first entry with a hunk selector taking a hunk inside `qual` of `path`."""
    return next(
        (
            e.name
            for e in entries
            if any(_matches(path, g) and _qual_matches(qual, q) for g, q in e.hunks)
        ),
        None,
    )


def _by_owner(owners: list[str]) -> dict[str, list[int]]:
    """owner -> the indexes it takes, owners in the order first met."""
    groups: dict[str, list[int]] = {}
    for index, owner in enumerate(owners):
        groups.setdefault(owner, []).append(index)
    return groups


def _placeholder_description(concern: Concern, area: str | None, source_name: str) -> str:
    """What a concern without a mapping description says: where it comes from, and that the
    user is to say why it exists."""
    what = f"the {area} part" if area else f"the part named {concern.name}"
    return textwrap.fill(
        f"{what[0].upper()}{what[1:]} of {source_name}, imported as one patch "
        f"({len(concern.files)} file(s)). Say here why the change exists and when it "
        "can be dropped.",
        72,
    )


def _subject_from_name(name: str) -> str:
    text = name.replace("-", " ").replace("_", " ").strip()
    return text[:1].upper() + text[1:]


# --- rendering each concern's diff ----------------------------------------------------------


def concern_diffs(concerns: list[Concern]) -> list[str]:
    """The diff of each concern, in order, with hunk positions moved by the hunks that the
    concerns before it already applied to the same file (git merges hunks whose context would
    meet, so separate hunks never share context lines and apply in any order)."""
    position = {c.name: n for n, c in enumerate(concerns)}
    owner: dict[tuple[int, int], int] = {}
    for concern in concerns:
        for diff, indexes in concern.parts:
            for i in indexes:
                owner[(id(diff), i)] = position[concern.name]
    out = []
    for k, concern in enumerate(concerns):
        text = []
        for diff, indexes in concern.parts:
            if diff.whole or len(indexes) == len(diff.hunks):
                split = any(owner.get((id(diff), i), k) != k for i in range(len(diff.hunks)))
                if not split:
                    text.append(render_file(diff))
                    continue
            moved = []
            for j in indexes:
                hunk = diff.hunks[j]
                before = sum(
                    diff.hunks[i].new_len - diff.hunks[i].old_len
                    for i in range(j)
                    if owner[(id(diff), i)] < k
                )
                mine = sum(
                    diff.hunks[i].new_len - diff.hunks[i].old_len
                    for i in range(j)
                    if owner[(id(diff), i)] == k
                )
                start = hunk.old_start + before
                moved.append(
                    Hunk(
                        start,
                        hunk.old_len,
                        start + mine + (hunk.new_start - hunk.old_start) - _delta_before(diff, j),
                        hunk.new_len,
                        hunk.section,
                        hunk.lines,
                        hunk.line,
                    )
                )
            text.append(render_file(diff, moved, index=False))
        out.append("".join(text))
    return out


def _delta_before(diff: FileDiff, j: int) -> int:
    return sum(h.new_len - h.old_len for h in diff.hunks[:j])
