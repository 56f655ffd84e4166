"""The equivalence signals: upstream implemented what the patch adds, in other words.

`definitions-present`: every public definition the patch adds is new in the new base's file;
whatever else it adds (a call of the new definition) is in the new base's file too; and no
line it removes is left there more often than in the patched file (upstream dropped what the
definition replaces).

`definitions-relocated`: the same, found anywhere in the new tree under any name: for every
public definition the patch adds, upstream added one (in any file) whose body calls and names
everything the patch's body does, and calls it somewhere; and what the patch removes upstream
removed too, counted over the whole tree (files moved and renamed included).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unidiff import PatchSet

from patchkit import gitops
from patchkit.classify.delta import AddedDefinition, Delta
from patchkit.classify.model import Signal
from patchkit.classify.text import (
    DEF_RE,
    definitions,
    effects,
    identifying,
    line_counts,
    normalize,
    significant,
    target_path,
)
from patchkit.series import Patch


@dataclass
class PatchShape:
    """What a patch adds and removes, per file: its definitions (with their bodies), the
    statements it adds outside them, and the balance of each changed line."""

    added: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # path -> name -> body
    outside: dict[str, list[str]] = field(default_factory=dict)
    balance: dict[str, dict[str, int]] = field(default_factory=dict)  # line -> added - removed

    @property
    def public(self) -> list[tuple[str, str]]:
        return sorted(
            (p, n) for p, names in self.added.items() for n in names if not n.startswith("_")
        )

    def removed_lines(self) -> dict[str, int]:
        """Identifying lines the patch removes on balance, over all its files (line -> count)."""
        out: dict[str, int] = {}
        for counts in self.balance.values():
            for line, delta in counts.items():
                if delta < 0 and identifying(line):
                    out[line] = out.get(line, 0) - delta
        return out


def patch_shape(patch: Patch) -> PatchShape:
    shape = PatchShape()
    for pf in PatchSet(patch.diff):
        path = target_path(pf)
        counts = shape.balance.setdefault(path, {})
        for hunk in pf:
            _read_hunk(shape, path, counts, hunk)
    return shape


def _read_hunk(shape: PatchShape, path: str, counts: dict[str, int], hunk) -> None:
    body: list[str] | None = None  # the body of the definition being added, if any
    for line in hunk:
        if significant(line.value) and (line.is_added or line.is_removed):
            key = normalize(line.value)
            counts[key] = counts.get(key, 0) + (1 if line.is_added else -1)
        if not line.is_added:
            body = None
            continue
        text = line.value.strip()
        if not text or text.startswith(("#", "@")):
            continue
        match = DEF_RE.match(line.value)
        if match:
            body = shape.added.setdefault(path, {}).setdefault(match.group(1), [])
        elif body is not None:
            body.append(line.value)
        elif significant(line.value):
            shape.outside.setdefault(path, []).append(normalize(line.value))


def definitions_signal(mirror: gitops.Repo, tip: str, old_base: str, patch: Patch) -> Signal:
    """Definitions the patch adds that the new base defines too, in the same files."""
    shape = patch_shape(patch)
    public = shape.public
    if not public:
        return Signal("definitions-present", False, "the patch adds no public definitions")
    have = [
        (p, n)
        for p, n in public
        if n in definitions(gitops.show_file(mirror, tip, p))
        and n not in definitions(gitops.show_file(mirror, old_base, p))
    ]
    missing = left = 0
    for path, counts in shape.balance.items():
        new = line_counts(gitops.show_file(mirror, tip, path))
        old = line_counts(gitops.show_file(mirror, old_base, path))
        missing += sum(1 for line in shape.outside.get(path, []) if not new.get(line))
        left += sum(
            1
            for line, delta in counts.items()
            if delta < 0 and identifying(line) and new.get(line, 0) > old.get(line, 0) + delta
        )
    fired = len(have) == len(public) and not missing and not left
    names = ", ".join(n for _, n in public)
    detail = f"{len(have)}/{len(public)} public definitions the patch adds ({names}) are new in "
    detail += "the new base"
    if missing:
        detail += f"; {missing} added statement(s) outside them are not in the new base"
    if left:
        detail += f"; {left} removed line(s) are still in the new base"
    return Signal("definitions-present", fired, detail)


def relocated_signal(patch: Patch, delta: Delta) -> Signal:
    """The patch's definitions found under any name anywhere in the new tree (see above)."""
    shape = patch_shape(patch)
    public = shape.public
    if not public:
        return Signal("definitions-relocated", False, "the patch adds no public definitions")
    found = []
    for path, name in public:
        match = _relocation(shape.added[path][name], name, delta)
        if match is not None:
            found.append((name, match))
    kept = [line for line, count in shape.removed_lines().items() if -delta.net(line) < count]
    fired = len(found) == len(public) and not kept
    detail = f"{len(found)}/{len(public)} public definitions the patch adds found in the new tree"
    if found:
        detail += " (" + "; ".join(
            f"{name} as {m.name} in {m.path}, called in {', '.join(delta.calls_of(m.name))}"
            for name, m in found
        ) + ")"  # fmt: skip
    if kept:
        detail += f"; {len(kept)} line(s) the patch removes upstream did not remove"
    return Signal("definitions-relocated", fired, detail)


def _relocation(body: list[str], name: str, delta: Delta) -> AddedDefinition | None:
    """An upstream-added definition doing what `body` does, and called somewhere."""
    calls, names = effects(body)
    if not calls:
        return None
    # cheap, before reading a candidate's effects: each name it must call or use is in its
    # text (the longest first: the rarest, most candidates fail there)
    first, *rest = sorted(calls | (names - {name}), key=len, reverse=True)
    for candidate in delta.added:
        text = candidate.text
        if first not in text or not all(n in text for n in rest):
            continue
        if calls <= candidate.calls and names <= candidate.names | {name}:
            if delta.calls_of(candidate.name):
                return candidate
    return None
