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

    @property
    def calls(self) -> frozenset[str]:
        return self._effects[0]

    @property
    def names(self) -> frozenset[str]:
        return self._effects[1]


@dataclass
class Delta:
    """Upstream's changes between two bases."""

    renames: dict[str, str] = field(default_factory=dict)  # old path -> new path
    added: list[AddedDefinition] = field(default_factory=list)
    net: dict[str, int] = field(default_factory=dict)  # normalised line -> added minus removed
    _call_sites: list[tuple[str, str]] = field(default_factory=list, repr=False)

    def calls_of(self, name: str) -> list[str]:
        """Files where an added line calls `name` (outside the line that defines it)."""
        return sorted({path for path, line in self._call_sites if f"{name}(" in line})


_CACHE: dict[tuple[gitops.Repo, str, str], Delta] = {}


def upstream_delta(mirror: gitops.Repo, old: str, new: str) -> Delta:
    """The delta between two commits of the mirror (read once per pair in a process)."""
    key = (mirror, old, new)
    if key not in _CACHE:
        _CACHE.clear()  # one pair at a time: a diff of two releases is tens of MB
        _CACHE[key] = read_delta(gitops.diff_trees(mirror, old, new))
    return _CACHE[key]


_FILE_RE = re.compile(r"^diff --git ", re.MULTILINE)


def read_delta(diff: str) -> Delta:
    """Parse `git diff` output (renames detected) into a Delta; only Python files' lines are
    read (most of a release's diff is kernels and data)."""
    delta = Delta()
    for chunk in _FILE_RE.split(diff)[1:]:
        header, _, body = chunk.partition("\n@@")
        lines = header.splitlines()
        path = lines[0].rsplit(" b/", 1)[-1]
        renamed = {k: ln.split(" ", 2)[2] for ln in lines for k in ("from", "to")
                   if ln.startswith(f"rename {k} ")}  # fmt: skip
        if "from" in renamed and "to" in renamed:
            delta.renames[renamed["from"]] = renamed["to"]
        if path.endswith(".py") and body:
            _read_file(delta, path, body.splitlines())
    return delta


def _read_file(delta: Delta, path: str, lines: list[str]) -> None:
    body: list[str] = []
    indent, name = -1, ""
    net = delta.net
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
            _close(delta, path, name, body)
            name, body = "", []
        if match:
            _close(delta, path, name, body)
            name, body, indent = match.group(1), [], depth
        else:
            if name:
                body.append(text)
            if "(" in text:
                delta._call_sites.append((path, text))
    _close(delta, path, name, body)


def _close(delta: Delta, path: str, name: str, body: list[str]) -> None:
    if name and body:
        delta.added.append(AddedDefinition(path, name, body))
