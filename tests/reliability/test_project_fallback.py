"""Outside any project, an editable install falls back to the checkout it was installed from
(patchkit/project.py, find_project).  It says so in one stderr line naming that project, and no
verb writes into it: a project the user did not name is read, never written.

The installed checkout here is a toy project holding a copy of the package (imported from it
through PYTHONPATH), so a verb that wrongly writes writes there, never into this checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_support import ROOT, record

SECTION = "project fallback (tests/reliability/test_project_fallback.py)"

# Each writes into the project it found (patches/, targets.toml, work/, dist/).
WRITERS = {
    "export": ["export", "--target", "toy", "{wt}"],
    "import --into-series": ["import", "--target", "toy", "--into-series", "x.diff"],
    "rebase --write": ["rebase", "--target", "toy@v1.0", "--write"],
    "rebase --conflict-tree": ["rebase", "--target", "toy@v1.0", "--conflict-tree"],
    "rebase --continue": ["rebase", "--target", "toy", "--continue"],
    "rebase --abort": ["rebase", "--target", "toy", "--abort"],
    "apply without --into": ["apply", "--target", "toy"],
    "build": ["build", "--target", "toy"],
}


@pytest.fixture
def installed(toy, tmp_path):
    """The toy project as the checkout patchkit was installed from, a stray checkout of it
    made while it was named, and a folder outside any project."""
    shutil.copytree(ROOT / "patchkit", toy.project / "patchkit",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "x.diff").write_text("")
    wt = tmp_path / "wt"
    made = _run(["apply", "--target", "toy", "--into", str(wt)], toy, stray,
                PATCHKIT_PROJECT=str(toy.project))  # fmt: skip
    assert made.returncode == 0, made.stderr
    return stray, wt


def _run(args: list[str], toy, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "PATCHKIT_PROJECT"}
    clean.update(toy.env, PYTHONPATH=str(toy.project), **env)
    clean.pop("PATCHKIT_PROJECT", None) if "PATCHKIT_PROJECT" not in env else None
    return subprocess.run(
        [sys.executable, "-m", "patchkit", *args],
        cwd=cwd, env=clean, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.mark.parametrize("verb", sorted(WRITERS))
def test_a_writer_outside_any_project_refuses_the_installed_checkout(toy, installed, verb):
    stray, wt = installed
    before = _files(toy.project)
    args = [a.format(wt=wt) for a in WRITERS[verb]]
    done = _run(args, toy, stray)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    note = f"patchkit: note: no project in {stray} or above; using {toy.project}, the checkout"
    assert lines[0].startswith(note), lines
    assert f"{verb} would write into {toy.project}" in lines[1], lines
    assert "nothing was written" in lines[1], lines
    assert f"PATCHKIT_PROJECT={toy.project}" in lines[2] and len(lines) == 3, lines
    assert _files(toy.project) == before
    record(SECTION, f"{verb} outside any project: refused naming the project, 0 files written")


def test_a_reader_outside_any_project_names_the_project_it_reads(toy, installed):
    stray, wt = installed
    before = _files(toy.project)
    check = _run(["export", "--check", "."], toy, wt)  # a stray checkout, no project above it
    assert check.returncode in (0, 1) and "error" not in check.stderr, check.stderr  # 1: differs
    notes = [ln for ln in check.stderr.splitlines() if ln.startswith("patchkit: note: ")]
    assert len(notes) == 1 and f"using {toy.project}," in notes[0], check.stderr
    assert f"no project in {wt} or above" in notes[0], notes
    lint = _run(["lint", "--target", "toy"], toy, stray)
    assert f"using {toy.project}," in lint.stderr and "error:" not in lint.stderr, lint.stderr
    named = _run(["lint", "--target", "toy"], toy, stray, PATCHKIT_PROJECT=str(toy.project))
    assert named.stdout == lint.stdout and "note:" not in named.stderr, named.stderr
    inside = _run(["lint", "--target", "toy"], toy, toy.project / "patches")
    assert inside.stdout == lint.stdout and "note:" not in inside.stderr, inside.stderr
    assert _files(toy.project) == before
    record(SECTION, "export --check in a stray checkout and lint outside any project: one note "
           "naming the project; none when it is named (PATCHKIT_PROJECT) or found from the "
           "current folder")  # fmt: skip
