"""Interrupts at the awkward moments of an apply: a SIGKILL while checking out into a
`git init`-ed empty folder (an unborn branch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from reliability_support import ROOT, cli, git, leftovers, one_or_two_lines, rev

# The in-place checkout replaced by one that writes every other file of the result into the
# index and the work tree (as `git checkout` does, file by file), leaves git's index.lock and
# SIGKILLs the process: it needs no HEAD, so it works on an unborn branch too.
KILL_IN_UNBORN = """
import os, signal, sys
from patchkit import cli, gitops
def partial(repo, branch, sha):
    paths = gitops.run(repo, "ls-tree", "-r", "--name-only", "-z", sha).split("\\0")
    for path in [p for p in paths if p][::2]:
        gitops.run(repo, "checkout", sha, "--", path)
    open(os.path.join(repo, ".git", "index.lock"), "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
gitops.checkout_branch = partial
sys.exit(cli.main(sys.argv[1:]))
"""


def _apply(toy, into):
    return cli("apply", "--target", "toy", "--into", str(into), env=toy.env)


def test_kill_in_unborn_checkout_is_put_back(toy, tmp_path):
    into = tmp_path / "wt"
    into.mkdir()
    git(into, "init", "-q", "-b", "work")
    args = ("apply", "--target", "toy", "--into", str(into))
    killed = subprocess.run(
        [sys.executable, "-c", KILL_IN_UNBORN, *args],
        cwd=ROOT,
        env={**os.environ, **toy.env},
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    journal = into.parent / f".{into.name}.patchkit.journal"
    assert journal.exists()
    done = _apply(toy, into)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert git(into, "symbolic-ref", "--short", "HEAD").strip() == "patchkit/toy"
    assert git(into, "status", "--porcelain").strip() == ""
    assert not (into / ".git" / "index.lock").exists()
    assert not leftovers(tmp_path, "wt", toy.cache)
    # killed again, then the user commits on the unborn branch: refused, naming the journal
    git(into, "checkout", "-q", "--orphan", "work2")
    git(into, "rm", "-rq", "--cached", ".")
    for p in into.iterdir():
        if p.name != ".git":
            subprocess.run(["rm", "-rf", str(p)], check=True)
    killed = subprocess.run(
        [sys.executable, "-c", KILL_IN_UNBORN, *args],
        cwd=ROOT,
        env={**os.environ, **toy.env},
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (into / ".git" / "index.lock").unlink()
    (into / "mine.txt").write_text("the user's own file\n")
    git(into, "add", "mine.txt")
    done = _apply(toy, into)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert str(journal) in done.stderr and "will not guess" in done.stderr
    assert journal.exists() and rev(into, "HEAD") is None
