"""Where a file the patch edits went, and whether a packaging patch's purpose is met.

A moved file is what git's rename detection between the two bases says; failing that, the
module the functions its hunks change moved to (`patchkit.classify.moved`); failing that, a file
of the same name that is new in the new base beside the old one (the same package: the
grandparent folder), never a file of that name that already existed elsewhere (a vendored
`pyproject.toml`, a `communicator.py` of another package).

A packaging patch edits only packaging files (`pyproject.toml`, `setup.py`, requirements); on a
wheel base those files are gone, and the release's `Requires-Dist` says what it requires.  The
patch is obsolete there when no requirement of the release contradicts one the patch sets;
requirements the release leaves open are named (the line's install constraints pin them).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from unidiff import PatchSet

from patchkit.classify.delta import Delta
from patchkit.classify.model import Signal
from patchkit.classify.moved import moved_code
from patchkit.series import Patch

PACKAGING_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "requirements.txt")
_QUOTED_REQUIREMENT = re.compile(r"^\s*[\"']([A-Za-z0-9][^\"']*)[\"']\s*,?")
_LOWER_BOUND_OPS = ("==", "===", ">=", "~=", ">")


def moved_hint(patch: Patch, present: set[str], old_paths: set[str], delta: Delta) -> str:
    """For files the new base lacks: where each went (renamed upstream?), or that it is gone."""
    hints = []
    diffs = None
    for change in patch.files:
        path = change.source or change.path
        if path in present or change.source is None:
            continue
        if diffs is None:
            diffs = {pf.source_file.removeprefix("a/"): pf for pf in PatchSet(patch.diff)}
        hints.append(_where(path, present, old_paths, delta, diffs.get(path)))
    return f" (not in the new base: {'; '.join(hints)})" if hints else ""


def _where(path: str, present: set[str], old_paths: set[str], delta: Delta, pf) -> str:
    renamed = delta.renames.get(path)
    if renamed and renamed in present:
        return f"{path} -> {renamed} (renamed upstream)"
    code = moved_code(pf, delta, path) if pf is not None else None
    if code is not None:
        return f"{path} -> {code.path} ({code.names()}: its code moved)"
    moved = same_package_namesakes(path, present, old_paths)
    if moved:
        return f"{path} -> {' or '.join(moved[:3])}?"
    return f"{path} is gone"


def same_package_namesakes(path: str, present: set[str], old_paths: set[str]) -> list[str]:
    """Files named as `path`, new in the new base, under the same grandparent folder."""
    pure = PurePosixPath(path)
    if len(pure.parts) < 3:
        return []  # a top-level file has no package to move within
    package = pure.parent.parent
    return sorted(
        p
        for p in present
        if PurePosixPath(p).name == pure.name
        and p not in old_paths
        and PurePosixPath(p).is_relative_to(package)
    )


def is_packaging_patch(patch: Patch) -> bool:
    return bool(patch.files) and all(
        PurePosixPath(f.source or f.path).name in PACKAGING_FILES for f in patch.files
    )


def requires_dist_signal(patch: Patch, requires: list[str] | None) -> Signal:
    """Whether the release's `Requires-Dist` meets the requirements the packaging patch sets."""
    if requires is None:
        return Signal("requires-dist", None, "the new base is not a wheel: no Requires-Dist")
    wanted = patch_requirements(patch)
    if not wanted:
        return Signal("requires-dist", None, "the patch sets no requirement")
    released = {}
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        released.setdefault(canonicalize_name(req.name), req)
    met, open_, against = [], [], []
    for text, req in wanted:
        have = released.get(canonicalize_name(req.name))
        verdict = _meets(req, have)
        words = f"{text} (release: {have or 'not required'})"
        {"met": met, "open": open_, "contradicts": against}[verdict].append(words)
    fired = not against
    parts = []
    if met:
        parts.append("met by the release's Requires-Dist: " + ", ".join(met))
    if open_:
        parts.append("left open by the release (pin them in the line's constraints): "
                     + ", ".join(open_))  # fmt: skip
    if against:
        parts.append("contradicted by the release: " + ", ".join(against))
    return Signal("requires-dist", fired, "; ".join(parts))


def patch_requirements(patch: Patch) -> list[tuple[str, Requirement]]:
    """The requirements a packaging patch adds or changes (quoted strings on added lines), as
    written and parsed."""
    out = []
    for line in patch.diff.splitlines():
        if not line.startswith("+") or line.startswith("+++"):
            continue
        match = _QUOTED_REQUIREMENT.match(line[1:])
        if not match:
            continue
        try:
            out.append((match.group(1), Requirement(match.group(1))))
        except InvalidRequirement:
            continue
    return out


def _meets(wanted: Requirement, have: Requirement | None) -> str:
    """ "met", "open" (the release leaves it unpinned) or "contradicts"."""
    want = _lower_bound(wanted)
    if want is None:
        return "met" if have is not None else "open"
    if have is None:
        return "open"
    got = _lower_bound(have)
    if got is None:
        return "open"
    return "met" if got >= want else "contradicts"


def _lower_bound(req: Requirement) -> Version | None:
    bounds = [Version(s.version) for s in req.specifier if s.operator in _LOWER_BOUND_OPS]
    return max(bounds) if bounds else None


def wheel_requires(wheel: Path) -> list[str] | None:
    """The `Requires-Dist` lines of a wheel's METADATA (None: no such wheel)."""
    import zipfile
    from email.parser import HeaderParser

    try:
        with zipfile.ZipFile(wheel) as archive:
            name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
            if name is None:
                return None
            text = archive.read(name).decode("utf-8", "replace")
    except (OSError, zipfile.BadZipFile):
        return None
    return HeaderParser().parsestr(text).get_all("Requires-Dist") or []
