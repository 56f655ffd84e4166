"""Helpers that write small, real format-patch series against the real upstream trees."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import git, series_folder

EXPORT = [
    "-c",
    "diff.renames=true",
    "format-patch",
    "--keep-subject",
    "--no-stat",
    "--no-signature",
    "--zero-commit",
    "--full-index",
    "--stdout",
]
TRAILERS = (
    "Origin: vendor, patchkit\nForwarded: not-needed\nLast-Update: 2026-11-29\n"
    "Patchkit-Tests: tests/test_apply.py"
)


def tree_from_mirror(mirror: Path, commit: str, dest: Path) -> Path:
    """A throw-away work tree of `commit` for authoring patches."""
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(mirror), str(dest)], check=True)
    git(dest, "checkout", "-q", commit)
    return dest


def make_patch(repo: Path, path: str, old: str, new: str, subject: str) -> bytes:
    """Edit one line of `path` in `repo`, commit it, and return the canonical patch bytes."""
    file = repo / path
    text = file.read_text()
    assert old in text, f"{old!r} not in {path}"
    file.write_text(text.replace(old, new, 1))
    git(repo, "add", path)
    git(repo, "commit", "-q", "-m", f"{subject}\n\nWhy this change.\n\n{TRAILERS}")
    return subprocess.run(
        ["git", *EXPORT, "-1", "HEAD"], cwd=repo, check=True, capture_output=True
    ).stdout


def write_series(project: Path, target: str, patches: dict[str, bytes]) -> None:
    """Replace a target's series in a scratch project with `patches` (in order)."""
    directory = series_folder(project, target)
    for old in directory.glob("*.patch"):
        old.unlink()
    for name, raw in patches.items():
        (directory / name).write_bytes(raw)
    (directory / "series").write_text("# test series\n" + "".join(f"{n}\n" for n in patches))
