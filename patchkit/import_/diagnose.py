"""Bad input, said plainly: paths that leave the target, and hunks that do not apply.

Paths are mapped onto the target's layout first: a diff made in site-packages
(`a/sglang/srt/...`) or with `diff -ru old/ new/` is placed under the target's sdist subdir
when that is where its files are, and the report says so.
"""

from __future__ import annotations

from pathlib import Path

from patchkit import gitops
from patchkit.errors import PatchkitError
from patchkit.import_.diffparse import FileDiff, Message, Problem, render_file
from patchkit.scratch import temporary_folder
from patchkit.series import safe_repo_path


def _strip(path: str, level: int) -> str:
    """`path` without its first `level` components (git diffs were already stripped)."""
    if level == 0:
        return path
    parts = path.split("/", 1)
    return parts[1] if len(parts) == 2 else path


def normalize_paths(
    messages: list[Message], base_paths: set[str], subdir: str, target: str
) -> tuple[list[str], list[Problem]]:
    """Rewrite every file's paths to the target's layout; returns (notes, problems)."""
    files = [f for m in messages for f in m.files]
    for diff in files:
        _mark_created_or_deleted(diff)
    problems = _absolute_paths(files)
    if problems:
        return [], problems
    level, prefix = _layout(files, base_paths, subdir)
    for diff in files:
        lvl = 0 if diff.git else level
        diff.old = f"{prefix}{_strip(diff.old, lvl)}" if diff.old else None
        diff.new = f"{prefix}{_strip(diff.new, lvl)}" if diff.new else None
        diff.extended = [_rewrite_extended(e, prefix) for e in diff.extended]
    notes = []
    if prefix:
        notes.append(f"paths are relative to the package: placed under {prefix} ({target} layout)")
    for diff in files:
        problems += _placement_problems(diff, base_paths, subdir, target)
    return notes, problems


def _mark_created_or_deleted(diff: FileDiff) -> None:
    """A file the diff creates has no old path, one it deletes no new path (git's mode lines,
    or a plain diff's one hunk from or to nothing: `diff -N`)."""
    if diff.git and any(e.startswith("new file mode") for e in diff.extended):
        diff.old = None
    if diff.git and any(e.startswith("deleted file mode") for e in diff.extended):
        diff.new = None
    if not diff.git and len(diff.hunks) == 1:
        hunk = diff.hunks[0]
        if hunk.old_start == 0 and hunk.old_len == 0:
            diff.old = None  # `diff -N`: a new file
        elif hunk.new_start == 0 and hunk.new_len == 0:
            diff.new = None


def _absolute_paths(files: list[FileDiff]) -> list[Problem]:
    return [
        Problem(
            diff.line,
            raw,
            _first_hunk(diff),
            "absolute path: make the diff with relative paths "
            "(from the directory above the package: diff -ru old/ new/)",
        )
        for diff in files
        for raw in (diff.old, diff.new)
        if raw and raw.startswith("/")
    ]


def _layout(files: list[FileDiff], base_paths: set[str], subdir: str) -> tuple[int, str]:
    """(components to strip from a plain diff's paths, prefix to put before them): the pair
    under which most files land on a file (or, for a new one, a folder) of the base."""
    base_dirs = {p.rsplit("/", 1)[0] for p in base_paths if "/" in p}
    prefixes = ["", f"{subdir}/"] if subdir else [""]
    best, best_hits = (1, ""), -1
    for level in (1, 0):
        for prefix in prefixes:
            hits = 0
            for diff in files:
                lvl = 0 if diff.git else level
                if diff.old:
                    hits += f"{prefix}{_strip(diff.old, lvl)}" in base_paths
                elif diff.new:
                    path = f"{prefix}{_strip(diff.new, lvl)}"
                    hits += "/" in path and path.rsplit("/", 1)[0] in base_dirs
            if hits > best_hits:
                best, best_hits = (level, prefix), hits
    return best


def _placement_problems(
    diff: FileDiff, base_paths: set[str], subdir: str, target: str
) -> list[Problem]:
    """A placed path that is unsafe or outside the target, else an old file the base lacks."""
    problems = []
    for path in sorted({p for p in (diff.old, diff.new) if p}):
        what = None
        try:
            safe_repo_path("diff", path)
        except PatchkitError as exc:
            what = exc.message.removeprefix("diff: ")
        if what is None and subdir and not path.startswith(f"{subdir}/"):
            what = (
                f"outside the {target} target (its base holds only {subdir}/); "
                "leave this file out of the diff"
            )
        if what:
            problems.append(Problem(diff.line, path, _first_hunk(diff), what))
    if not problems and not diff.binary and diff.old and diff.old not in base_paths:
        problems.append(
            Problem(
                diff.line,
                diff.old,
                _first_hunk(diff),
                f"changes a file the {target} base does not have",
            )
        )
    return problems


def _rewrite_extended(line: str, prefix: str) -> str:
    for key in ("rename from ", "rename to ", "copy from ", "copy to "):
        if line.startswith(key):
            return key + prefix + line[len(key) :]
    return line


def _first_hunk(diff: FileDiff) -> str | None:
    return diff.hunks[0].at if diff.hunks else None


def failing_hunks(
    mirror: gitops.Repo, env: dict[str, str], files: list[FileDiff], release: str
) -> list[Problem]:
    """Each hunk tried alone, at zero fuzz, against the tree in the index of `env`."""
    problems = []
    with temporary_folder("import-hunk-") as tmp:
        single = Path(tmp) / "hunk.patch"
        for diff in files:
            if diff.binary:
                continue
            chunks = [[h] for h in diff.hunks] or [[]]
            for chunk in chunks:
                single.write_text(render_file(diff, chunk), encoding="utf-8")
                applied, err = gitops.apply_to_index(mirror, env, single, check=True)
                if applied:
                    continue
                hunk = chunk[0] if chunk else None
                why = "does not apply at zero fuzz"
                if "already exists" in err:
                    why = "creates a file that already exists"
                elif "does not exist" in err:
                    why = "changes a file that does not exist"
                problems.append(
                    Problem(
                        hunk.line if hunk else diff.line,
                        diff.path,
                        hunk.at if hunk else None,
                        f"{why} to {release}",
                    )
                )
    return problems


def applies_cleanly(mirror: gitops.Repo, commit: str, diff_text: str) -> bool:
    """Whether the whole diff applies at zero fuzz onto `commit`."""
    with (
        temporary_folder("import-fit-") as tmp,
        gitops.scratch_index(mirror, commit) as env,
    ):
        path = Path(tmp) / "input.patch"
        path.write_text(diff_text, encoding="utf-8")
        return gitops.apply_to_index(mirror, env, path, check=True)[0]
