"""Faults from outside patchkit's inputs (a damaged mirror, a full disk, another user's
checkout, a path too long, a file nested past the parser, a series file linking out of the
project): each ends in one line naming the file and the next step, never in "internal error",
and a refusal leaves the disk as it found it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from reliability_support import ROOT, cli, one_or_two_lines, snapshot

from patchkit import gitops

OFFLINE = {"PATCHKIT_OFFLINE_GIT": "1"}
# git 2.39's words when the repository belongs to another user (LC_ALL=C).
DUBIOUS = (
    "fatal: detected dubious ownership in repository at '{path}'\n"
    "To add an exception for this directory, call:\n\n"
    "\tgit config --global --add safe.directory {path}\n"
)


def _warm_mirror(toy):
    """The toy's mirror once an apply made it (the checkout is removed again)."""
    done = cli("apply", "--target", "toy", "--into", str(toy.root / "first"), env=toy.env)
    assert done.returncode == 0, done.stderr
    shutil.rmtree(toy.root / "first")
    return toy.cache / "mirrors" / "toy.git"


def _refused(done, code: int, *named: str) -> None:
    assert done.returncode == code, done.stderr
    assert one_or_two_lines(done.stderr), done.stderr
    assert "internal error" not in done.stderr, done.stderr
    for word in named:
        assert word in done.stderr, (word, done.stderr)


def _git_wrapper(folder, script: str) -> dict[str, str]:
    """PATH with a `git` first that runs `script` (sh) before the real git."""
    folder.mkdir()
    real = shutil.which("git")
    (folder / "git").write_text(f'#!/bin/sh\n{script}\nexec {real} "$@"\n')
    (folder / "git").chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize("damaged", ["packed-refs", "config"])
def test_a_garbage_line_in_a_mirror_file_is_named_with_its_repair(toy, damaged):
    mirror = _warm_mirror(toy)
    with (mirror / damaged).open("a") as fh:
        fh.write("this line is garbage\n")
    into = toy.root / "wt"
    for args in (("apply", "--target", "toy", "--into", str(into)), ("cache",)):
        done = cli(*args, env=toy.env | OFFLINE)
        hint = f"remove the mirror ({mirror})"
        _refused(done, 1, str(mirror / damaged), hint, "patchkit fetch --target toy")
    assert not into.exists()
    shutil.rmtree(mirror)  # the repair the hint names
    assert cli("apply", "--target", "toy", "--into", str(into), env=toy.env).returncode == 0


@pytest.mark.parametrize("missing", [".pack", ".idx"])
def test_a_mirror_missing_a_pack_or_its_index_is_named(toy, missing):
    mirror = _warm_mirror(toy)
    for path in (mirror / "objects" / "pack").glob(f"pack-*{missing}"):
        path.unlink()
    done = cli("cache", env=toy.env | OFFLINE)
    _refused(done, 1, f"{mirror}/objects", f"remove the mirror ({mirror})")


def test_a_deeply_nested_targets_toml_is_a_config_error(toy):
    targets = toy.project / "patches" / "targets.toml"
    targets.write_text(targets.read_text() + "\n[deep]\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    for args in (("lint",), ("apply", "--target", "toy", "--into", str(toy.root / "wt"))):
        _refused(cli(*args, env=toy.env), 2, str(targets), "nested too deeply")


ENOSPC_IN_TMPDIR = """
import errno, os, sys, tempfile
full = os.environ["TMPDIR"]
tempfile.tempdir = full
real_open, real_mkdir = os.open, os.mkdir
def no_space(path):
    if os.fspath(path).startswith(full):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
def open_(path, flags, mode=0o777, *, dir_fd=None):
    if flags & os.O_CREAT:
        no_space(path)
    return real_open(path, flags, mode, dir_fd=dir_fd)
def mkdir(path, mode=0o777, *, dir_fd=None):
    no_space(path)
    return real_mkdir(path, mode, dir_fd=dir_fd)
os.open, os.mkdir = open_, mkdir
from patchkit import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_full_tmpdir_is_named_with_the_next_step(toy, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    into = toy.root / "wt"
    done = subprocess.run(
        [sys.executable, "-c", ENOSPC_IN_TMPDIR, "apply", "--target", "toy", "--into", str(into)],
        cwd=ROOT,
        env={**os.environ, **toy.env, "TMPDIR": str(full)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    _refused(done, 1, "No space left on device", "TMPDIR")
    assert not into.exists() and not list(full.iterdir())


def test_git_out_of_space_is_named_with_the_next_step(toy, tmp_path):
    # git's words when a file of the checkout cannot be written (error_errno, LC_ALL=C)
    path = _git_wrapper(
        tmp_path / "bin",
        'case " $* " in *" checkout "*) '
        'echo "error: unable to write file README.md: No space left on device" >&2; exit 128;; '
        "esac",
    )
    into = toy.root / "wt"
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env | path)
    _refused(done, 1, "out of disk space", "No space left on device", "TMPDIR")
    assert not into.exists()


def test_another_users_checkout_is_named_as_gits_ownership_check(toy, tmp_path):
    into = toy.root / "wt"
    assert cli("apply", "--target", "toy", "--into", str(into), env=toy.env).returncode == 0
    before = snapshot(into)
    words = DUBIOUS.format(path=into).replace("\n", "\\n").replace("\t", "\\t")
    path = _git_wrapper(
        tmp_path / "bin", f'[ "$(pwd)" = "{into}" ] && {{ printf "{words}" >&2; exit 128; }}'
    )
    status = ("status", "--target", "toy", str(into))
    for args in (status, ("apply", "--target", "toy", "--into", str(into))):
        done = cli(*args, env=toy.env | path)
        _refused(done, 2, f"git refuses {into}", "safe.directory", "dubious ownership")
        assert "not a git checkout" not in done.stderr and "no refs/patchkit" not in done.stderr
    assert snapshot(into) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_checkout_another_user_owns_is_named_as_gits_ownership_check(toy):
    into = toy.root / "wt"
    assert cli("apply", "--target", "toy", "--into", str(into), env=toy.env).returncode == 0
    for folder, _, names in os.walk(into):
        for name in (folder, *(os.path.join(folder, n) for n in names)):
            os.lchown(name, 4242, 4242)
    done = cli("status", "--target", "toy", str(into), env=toy.env)
    _refused(done, 2, f"git refuses {into}", "dubious ownership")


def test_git_naming_a_path_too_long_is_named_as_such(tmp_path):
    with pytest.raises(gitops.PathTooLongError) as raised:
        gitops.Repo.checkout(tmp_path).run("init", "-q", "x" * 300)  # git's own words
    assert "too long" in raised.value.message and raised.value.hint


def test_an_into_path_too_long_is_named_as_such(toy):
    into = toy.root / ("x" * 300)
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    _refused(done, 2, "File name too long", "too long for the file system")
    assert "make it writable" not in done.stderr


def test_a_series_file_linking_out_of_the_project_is_refused_unread(toy, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("SECRET-LINE\n")
    series = toy.project / "patches" / "toy" / "series"
    kept = series.read_bytes()
    series.unlink()
    series.symlink_to(secret)
    into = toy.root / "wt"
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    _refused(done, 2, f"{series} is a symbolic link", "outside the project")
    assert "SECRET" not in done.stderr + done.stdout
    assert not into.exists()
    done = cli("lint", env=toy.env)  # lint reports it as a finding and reads nothing
    assert done.returncode == 1 and "series-special" in done.stdout + done.stderr, done
    assert "outside the project" in done.stdout + done.stderr
    assert "SECRET" not in done.stderr + done.stdout
    inside = toy.project / "patches" / "toy.series"  # a link within the project is read
    inside.write_bytes(kept)
    series.unlink()
    series.symlink_to(inside)
    assert cli("apply", "--target", "toy", "--into", str(into), env=toy.env).returncode == 0


def test_a_series_version_that_is_not_a_string_is_refused(toy):
    targets = toy.project / "patches" / "targets.toml"
    targets.write_text(targets.read_text().replace('version = "1.0.0"', "version = 1", 1))
    for args in (("lint",), ("apply", "--target", "toy", "--into", str(toy.root / "wt"))):
        done = cli(*args, env=toy.env)
        _refused(done, 2, str(targets), "[series] version must be a string, not int")


def test_a_refused_into_leaves_no_lock_file(toy):
    place = toy.root / "place"
    into = place / "wt"
    into.mkdir(parents=True)
    (into / "mine.txt").write_text("not a checkout\n")
    before = snapshot(place)
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    _refused(done, 2, "not a git checkout")
    assert snapshot(place) == before
    fresh = place / "fresh"
    assert cli("apply", "--target", "toy", "--into", str(fresh), env=toy.env).returncode == 0
    assert sorted(p.name for p in place.iterdir()) == ["fresh", "wt"]
