"""What upstream changed between two bases, read once from `git diff old new`: the files it
renamed, the definitions it added anywhere in the tree (with what their bodies do) and how
often it added or removed each line.  Evidence for patches upstream carried under another
name, in another file."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from patchkit import gitops
from patchkit.classify.text import DEF_RE, effects, normalize


@dataclass
class AddedDefinition:
    """A definition upstream added between the bases; what its body calls and names is read
    when first asked (tens of thousands are added between two releases)."""

    path: str
    name: str
    body: list[str] = field(repr=False)

    @cached_property
    def _effects(self) -> tuple[frozenset[str], frozenset[str]]:
        return effects(self.body)

    @cached_property
    def text(self) -> str:
        """The body as one text: a name missing from it is in none of its calls or names."""
        return "\n".join(self.body)

    @cached_property
    def normalized(self) -> str:
        """The body's lines normalised, one per line (a normalised line is found in it
        exactly when it is part of one of them)."""
        return "\n".join(normalize(line) for line in self.body)

    @cached_property
    def lines(self) -> frozenset[str]:
        """The body's lines, normalised."""
        return frozenset(self.normalized.split("\n"))

    @property
    def calls(self) -> frozenset[str]:
        return self._effects[0]

    @property
    def names(self) -> frozenset[str]:
        return self._effects[1]


@dataclass
class FileDelta:
    """What one file's part of the diff says: read once per (paths, blobs) pair, the same
    object for every delta whose diff holds that part."""

    renamed: tuple[str, str] | None = None  # (old path, new path)
    added: list[AddedDefinition] = field(default_factory=list)
    net: dict[str, int] = field(default_factory=dict)
    call_sites: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Delta:
    """Upstream's changes between two bases, file by file."""

    files: list[FileDelta] = field(default_factory=list)

    @cached_property
    def renames(self) -> dict[str, str]:
        """Old path -> new path of each file upstream renamed."""
        return dict(f.renamed for f in self.files if f.renamed)

    @cached_property
    def added(self) -> list[AddedDefinition]:
        return [d for f in self.files for d in f.added]

    def net(self, line: str) -> int:
        """How many times the normalised `line` was added, minus how many removed."""
        return sum(f.net.get(line, 0) for f in self.files)

    def calls_of(self, name: str) -> list[str]:
        """Files where an added line calls `name` (outside the line that defines it)."""
        call = f"{name}("
        return sorted({p for f in self.files for p, line in f.call_sites if call in line})


_CACHE: dict[tuple[gitops.Repo, str, str], Delta] = {}
# Each file part of the last diff read, by its header (paths and full blob ids): the next
# release's diff against the same base repeats most of them, byte for byte.
_PARTS: dict[str, FileDelta] = {}


def upstream_delta(mirror: gitops.Repo, old: str, new: str) -> Delta:
    """The delta between two commits of the mirror (read once per pair in a process)."""
    key = (mirror, old, new)
    if key not in _CACHE:
        _CACHE.clear()  # one pair at a time: a diff of two releases is tens of MB
        _CACHE[key] = read_delta(gitops.diff_trees(mirror, old, new), _PARTS)
    return _CACHE[key]


_FILE_RE = re.compile(r"^diff --git ", re.MULTILINE)


def read_delta(diff: str, parts: dict[str, FileDelta] | None = None) -> Delta:
    """Parse `git diff --full-index` output (renames detected) into a Delta; only Python
    files' lines are read (most of a release's diff is kernels and data).  `parts`: the file
    parts of an earlier read, reused where a header repeats; left holding this read's."""
    earlier = parts or {}
    delta, seen = Delta(), {}
    for chunk in _FILE_RE.split(diff)[1:]:
        header, _, body = chunk.partition("\n@@")
        part = earlier.get(header)
        if part is None:
            part = _read_part(header, body)
        seen[header] = part
        delta.files.append(part)
    if parts is not None:
        parts.clear()
        parts.update(seen)
    return delta


def _read_part(header: str, body: str) -> FileDelta:
    lines = header.splitlines()
    path = lines[0].rsplit(" b/", 1)[-1]
    renamed = {k: ln.split(" ", 2)[2] for ln in lines for k in ("from", "to")
               if ln.startswith(f"rename {k} ")}  # fmt: skip
    part = FileDelta()
    if "from" in renamed and "to" in renamed:
        part.renamed = (renamed["from"], renamed["to"])
    if path.endswith(".py") and body:
        _read_file(part, path, body.splitlines())
    return part


def _read_file(part: FileDelta, path: str, lines: list[str]) -> None:
    body: list[str] = []
    indent, name = -1, ""
    net = part.net
    for line in lines:
        sign = line[:1]
        if sign not in ("+", "-"):
            continue
        text = line[1:]
        key = " ".join(text.split())
        net[key] = net.get(key, 0) + (1 if sign == "+" else -1)
        if sign == "-":
            continue
        match = DEF_RE.match(text) if ("def " in text or "class " in text) else None
        depth = len(text) - len(text.lstrip())
        closing = text.lstrip().startswith((")", "]", "}"))  # the end of a long signature
        if name and key and depth <= indent and not match and not closing:
            _close(part, path, name, body)
            name, body = "", []
        if match:
            _close(part, path, name, body)
            name, body, indent = match.group(1), [], depth
        else:
            if name:
                body.append(text)
            if "(" in text:
                part.call_sites.append((path, text))
    _close(part, path, name, body)


def _close(part: FileDelta, path: str, name: str, body: list[str]) -> None:
    if name and body:
        part.added.append(AddedDefinition(path, name, body))
