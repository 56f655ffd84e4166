"""git and patch text: a git on PATH that fails in a way patchkit does not know, or hangs, is
one line naming the git command (exit 1), never an internal error nor a run held for ever; a
path git quotes in a patch (core.quotePath: non-ASCII bytes, quotes) is read as git wrote it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from reliability_support import cli, git, one_or_two_lines, record

SECTION = "hostile git (tests/reliability/test_hostile_git.py)"
REAL_GIT = shutil.which("git")


def _fake_git(where: Path, verb: str, behaviour: str) -> dict[str, str]:
    """A `git` first on PATH that runs `behaviour` (shell) when its arguments hold `verb`, and
    the real git otherwise."""
    where.mkdir()
    script = where / "git"
    script.write_text(
        f'#!/bin/sh\ncase " $* " in *" {verb} "*) {behaviour} ;; esac\nexec {REAL_GIT} "$@"\n'
    )
    script.chmod(0o755)
    return {"PATH": f"{where}{os.pathsep}{os.environ['PATH']}"}


def _apply_with(toy, tmp_path: Path, env: dict[str, str]):
    """`patchkit apply --target toy` into a fresh tree, with `env` over the toy's."""
    return cli("apply", "--target", "toy", "--into", str(tmp_path / "tree"),
               env={**toy.env, **env}, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    "behaviour, words",
    [
        ("echo 'fatal: the disk said something new' >&2; exit 128", "the disk said something new"),
        ("echo 'error: odd' >&2; exit 3", "odd"),
    ],
    ids=["fatal-128", "error-3"],
)
def test_an_unknown_git_failure_is_one_line_naming_the_command(toy, tmp_path, behaviour, words):
    r = _apply_with(toy, tmp_path, _fake_git(tmp_path / "bin", "init", behaviour))
    assert r.returncode == 1, r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert "git init" in r.stderr and words in r.stderr, r.stderr
    assert one_or_two_lines(r.stderr), r.stderr


def test_a_git_that_hangs_is_stopped_at_its_timeout(toy, tmp_path):
    path = _fake_git(tmp_path / "bin", "init", "exec sleep 600")
    start = time.monotonic()
    r = _apply_with(toy, tmp_path, {**path, "PATCHKIT_GIT_TIMEOUT": "3"})
    took = time.monotonic() - start
    assert r.returncode == 1, r.stderr
    assert "did not finish within 3 s" in r.stderr and "git init" in r.stderr, r.stderr
    assert took < 30, took
    record(SECTION, f"a git that hangs (PATCHKIT_GIT_TIMEOUT=3): stopped, exit 1 in {took:.1f} s")


def _patch_adding(toy, tmp_path: Path, files: dict[str, str]) -> bytes:
    """A real `git format-patch` (git's default core.quotePath) of a commit adding `files`
    onto the toy's pinned commit."""
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(toy.upstream), str(work))
    git(work, "checkout", "-q", toy.base)
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text, encoding="utf-8")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "add files with names git quotes")
    return subprocess.run(
        [REAL_GIT, "-c", "core.quotePath=true", "format-patch", "-1", "--stdout", "HEAD"],
        cwd=work,
        check=True,
        capture_output=True,
        env={**os.environ, "LC_ALL": "C"},
    ).stdout


QUOTED = {"pkg/\u00fcn\u00ef.txt": "umlauts\n", 'pkg/say "hi".txt': "quotes\n"}


def test_a_patch_whose_paths_git_quotes_is_read_as_git_wrote_it(toy, tmp_path):
    raw = _patch_adding(toy, tmp_path, QUOTED)
    assert b'+++ "b/pkg/\\303\\274n\\303\\257.txt"' in raw, raw[:600]
    toy.write_series({**toy.patches, "quoted.patch": raw})
    for locale in ("C", "C.UTF-8"):
        r = cli("lint", env={**toy.env, "LC_ALL": locale})
        assert "bad path" not in r.stderr + r.stdout, r.stderr + r.stdout
    tree = tmp_path / "tree"
    r = cli("apply", "--target", "toy", "--into", str(tree), env=toy.env, timeout=120)
    assert r.returncode == 0, r.stderr
    for name, text in QUOTED.items():
        assert (tree / name).read_text(encoding="utf-8") == text


def test_quoted_paths_that_climb_out_are_still_refused(toy, tmp_path):
    raw = _patch_adding(toy, tmp_path, {"pkg/\u00fc.txt": "x\n"})
    raw = raw.replace(b"b/pkg/\\303\\274.txt", b"b/../\\303\\274.txt")
    toy.write_series({**toy.patches, "climbs.patch": raw})
    r = cli("apply", "--target", "toy", "--into", str(tmp_path / "tree"), env=toy.env)
    assert r.returncode != 0 and "climbs out" in r.stderr, r.stderr
    assert not (tmp_path / "tree").exists()
