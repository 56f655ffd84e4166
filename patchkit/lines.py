"""Series lines: which line of a target a command works on, and that line's series."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from patchkit.errors import UsageError, did_you_mean
from patchkit.project import Project
from patchkit.series import Series, load_series
from patchkit.targets import Target

if TYPE_CHECKING:
    from patchkit import gitops


def line_series(project: Project, target: Target) -> Series:
    """The series of the line `target` is seen through."""
    return load_series(project.patches_dir / target.current_line.series, target.name)


def check_line_names(targets: Iterable[Target], wanted: Iterable[str]) -> None:
    """Refuse a `--line` that none of `targets` has, naming the lines they have (a filter
    matching nothing would check nothing and pass)."""
    targets = list(targets)
    known = list(dict.fromkeys(name for target in targets for name in target.line_names))
    for line in wanted:
        for target in targets:
            if line not in known and line in {old.name for old in target.retired}:
                target.on_line(line)  # refuses, naming the line that carries it on
        if line not in known:
            raise UsageError(
                f"--line {line}: no target has that line (lines: {', '.join(known) or 'none'})"
                + did_you_mean(line, known)
            )


def pick_line(target: Target, ref: str | None, line: str | None) -> Target:
    """The line a `NAME@REF [--line L]` means: `--line` when given (its pin must match a
    pinned REF), else the line whose pin is REF (refused, listing the lines, when REF is a
    pinned release no line is pinned to), else the default line."""
    if line is not None:
        view = target.on_line(line)
        if ref is not None:
            release = target.release(ref)
            if release is not None and release.version != view.pin:
                raise UsageError(
                    f"{target.name}@{ref} is release {release.version}, but line {line} is "
                    f"pinned to {view.pin}",
                    hint=f"drop --line, or use --target {target.name}@{view.pin}",
                )
        return view
    if ref is None:
        return target.on_line(None)
    release = target.release(ref) or _release_by_commit(target, ref)
    if release is None:
        # Not a pinned release (a commit or tag no pin names): the default line is carried
        # onto it, and acquiring the base says whether it may be used (--allow-unpinned).
        return target.on_line(None)
    chosen = target.line_for_release(release)
    if chosen is None:
        for old in target.retired:
            if old.pin == release.version:
                target.on_line(old.name)  # refuses, naming the line to use instead
        what = f"release {release.version}"
        lines = ", ".join(f"{ln.name} (pin {ln.pin})" for ln in target.lines)
        raise UsageError(
            f"{target.name}@{ref} is {what}, which no line of {target.name} is pinned to "
            f"(lines: {lines})",
            hint="pass --line NAME to apply that line's series onto it, or start a line with "
            f"`patchkit rebase --target {target.name}@{ref} --write --new-line`",
        )
    return target.on_line(chosen.name)


def _release_by_commit(target: Target, ref: str):
    lowered = ref.lower()
    if len(lowered) < 7 or not all(c in "0123456789abcdef" for c in lowered):
        return None
    hits = [r for r in target.releases if r.commit and r.commit.startswith(lowered)]
    return hits[0] if len(hits) == 1 else None


def checkout_line(checkout: gitops.Repo, target: Target, line: str | None = None) -> Target:
    """The line a work tree made by `patchkit apply` carries: the line pinned to the release
    its base stands for (`--line` overrides; a base no release names: the default line)."""
    from patchkit import gitops
    from patchkit.apply import BASE_REF
    from patchkit.upstream.mirror import import_fields
    from patchkit.upstream.sdist import sdist_path

    if line is not None:
        return target.on_line(line)
    base = gitops.resolve(checkout, BASE_REF.format(target=target.name))
    release = None
    if base is not None:
        release = next((r for r in target.releases if r.commit == base), None)
        if release is None:
            fields = import_fields(gitops.commit_message(checkout, base))
            wheel, sdist = fields.get("Patchkit-Wheel"), fields.get("Patchkit-Sdist")
            for candidate in target.releases:
                if wheel and any(w.filename == wheel for w in candidate.wheels):
                    release = candidate
                elif sdist and candidate.sdist and sdist_path(candidate, Path()).name == sdist:
                    release = candidate
    chosen = target.line_for_release(release) if release is not None else None
    return target.on_line(chosen.name if chosen else None)
