"""Kill `rebase --continue --write` (after a resolved conflict) at each of its git calls and
while it removes the conflict work tree after writing patches/: the next run always has a way
forward that needs no hand-removal.  The same `--continue --write` finishes, or (when the
write had landed) `--abort` removes the tree; either way patches/ ends as a clean run's.

Before, a SIGKILL part-way through the tree's removal left a folder that had lost its state
file but kept the rest: `--continue` and `--abort` said no rebase was in progress and a new
rebase refused it as `in the way`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest
from reliability_support import ROOT, GitFaults, cli, git, one_or_two_lines, record, tally_kill
from sampling import rotating
from test_reliability_conflict_tree import ARGS, toy_with_conflicting_release

SECTION = "rebase --continue --write killed (tests/reliability/test_kill_continue_write.py)"
SAMPLED = 8  # kills `make test` tries (rotating by commit); PATCHKIT_SAMPLE=all: every one
CONTINUE = ("rebase", "--target", "toy", "--continue", "--write")

# SIGKILL at the Nth file the removal of the conflict tree unlinks (0: as the removal starts).
KILL_IN_REMOVAL = """
import os, signal, sys
from patchkit import cli, rebase
from patchkit.commands import rebase as command
at, real_abort, real_unlink, count = int(os.environ["PK_AT"]), rebase.abort_rebase, os.unlink, [0]
def unlink(*args, **kwargs):
    count[0] += 1
    if count[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_unlink(*args, **kwargs)
def abort(dest):
    if at == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    os.unlink = unlink
    try:
        return real_abort(dest)
    finally:
        os.unlink = real_unlink
rebase.abort_rebase = command.abort_rebase = abort
sys.exit(cli.main(sys.argv[1:]))
"""


def _resolved(toy):
    """The conflict tree left and its conflict resolved and added, as a user would."""
    assert cli(*ARGS, env=toy.env).returncode == 1
    tree = toy.project / "work" / "rebase" / "toy"
    path = tree / "pkg/mod00/file00.py"
    kept = [ln for ln in path.read_text().splitlines()
            if not ln.startswith(("<<<<<<<", "=======", ">>>>>>>"))]  # fmt: skip
    path.write_text("\n".join(ln for ln in kept if ln != "upstream rewrote this line") + "\n")
    git(tree, "add", "pkg/mod00/file00.py")
    return tree


def _patches(toy) -> dict[str, bytes]:
    root = toy.project / "patches"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


def _way_forward(toy, tree, final, where) -> str:
    """Take the next run's way forward; say which it was."""
    again = cli(*CONTINUE, env=toy.env)
    assert again.returncode != 70 and "Traceback" not in again.stderr, (where, again.stderr)
    if again.returncode in (0, 3):
        how = "--continue --write finished"
    else:
        assert again.returncode in (1, 2) and one_or_two_lines(again.stderr), (where, again.stderr)
        assert "--abort" in again.stderr, (where, "the refusal names no way on", again.stderr)
        stop = cli("rebase", "--target", "toy", "--abort", env=toy.env)
        assert stop.returncode == 0, (where, again.stderr, stop.stderr)
        how = "--abort removed the tree"
    assert not tree.exists(), (where, how, sorted(p.name for p in tree.iterdir()))
    assert not list(tree.parent.glob(".toy.patchkit-*")), (where, how)
    assert _patches(toy) == final, (where, how, "patches/ is not the clean run's")
    return how


@pytest.mark.long
def test_continue_write_killed_at_every_point(tmp_path):
    toy = toy_with_conflicting_release(tmp_path / "toy")
    tree = _resolved(toy)
    saved = tmp_path / "saved"
    shutil.copytree(toy.project, saved, symlinks=True)

    def reset() -> None:
        shutil.rmtree(toy.project)
        shutil.copytree(saved, toy.project, symlinks=True)

    faults = GitFaults.install(tmp_path / "faults")
    faults.arm(0, "KILL")
    done = cli(*CONTINUE, env={**toy.env, **faults.env()})
    assert done.returncode == 0, done.stderr
    final, calls = _patches(toy), len(faults.calls())
    points = [("git", at) for at in range(1, calls + 1)]
    points += [("removal", at) for at in (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233)]
    ways: dict[str, int] = {}
    tried = 0
    for kind, at in rotating(points, SAMPLED, salt=17):
        reset()
        if kind == "git":
            faults.arm(at, "KILL")
            killed = cli(*CONTINUE, env={**toy.env, **faults.env()})
        else:
            tally_kill()
            killed = subprocess.run(
                [sys.executable, "-c", KILL_IN_REMOVAL, *CONTINUE], cwd=ROOT,
                env={**os.environ, **toy.env, "PK_AT": str(at)},
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
        if killed.returncode == 0:
            continue  # the removal unlinked fewer files than `at`
        assert killed.returncode == -signal.SIGKILL, (kind, at, killed.stderr)
        tried += 1
        how = _way_forward(toy, tree, final, f"{kind} {at}")
        ways[how] = ways.get(how, 0) + 1
    assert tried, "no kill fired"
    record(SECTION, f"{tried} SIGKILLs ({calls} git calls, the tree's removal at up to 13 "
           f"points): 0 trees every next run refused; {ways}")  # fmt: skip
