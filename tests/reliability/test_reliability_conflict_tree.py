"""Interrupt `rebase --conflict-tree` while it builds the work tree it leaves for the user
(SIGINT, SIGTERM, SIGKILL at every git call, through the `git` wrapper on PATH).

After every interrupt: patches/ and targets.toml are untouched, the cache is sound, and
`work/rebase/<target>` is either absent or the complete tree a clean run leaves (never a
clone stopped half-way that both `--continue` and `--abort` deny).  The next run then either
finishes (the same command again) or, when a complete tree was left, `--abort` removes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from reliability_support import (
    ROOT,
    GitFaults,
    cache_problems,
    cli,
    git,
    make_toy,
    one_or_two_lines,
    record,
    snapshot,
)
from sampling import rotating

SAMPLED = 12  # interrupts `make test` tries (rotating by commit); PATCHKIT_SAMPLE=all: every one
SECTION = "rebase conflict tree interrupted (tests/reliability/test_reliability_conflict_tree.py)"


def toy_with_conflicting_release(root):
    """The toy target and a release v1.1 that rewrites the line the first patch edits."""
    toy = make_toy(root)
    work = root / "upstream-work"
    git(work, "checkout", "-q", "main")
    path = work / "pkg/mod00/file00.py"
    lines = path.read_text().splitlines()
    lines[5] = "upstream rewrote this line"
    path.write_text("\n".join(lines) + "\n")
    git(work, "commit", "-qam", "v1.1")
    git(work, "tag", "v1.1")
    git(work, "push", "-q", str(toy.upstream), "main", "v1.1")
    return toy


ARGS = ("rebase", "--target", "toy@v1.1", "--conflict-tree")


def verb(call: str) -> str:
    """The git verb of one recorded call (`N -c k=v ... verb args`)."""
    words = call.split()[1:]
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in ("-c", "-C", "--git-dir", "--work-tree") else 1
    return words[i] if i < len(words) else ""


def _tree_state(tree):
    """What `git status` of the conflict tree says, with HEAD: equal trees, equal states."""
    if not tree.exists():
        return None
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True
    ).stdout.strip()
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=tree,
        capture_output=True,
        text=True,
    ).stdout
    return head, status, sorted(p.name for p in tree.iterdir())


@pytest.mark.long
def test_conflict_tree_interrupted_at_every_git_call(tmp_path):
    toy = toy_with_conflicting_release(tmp_path / "toy")
    tree = toy.project / "work" / "rebase" / "toy"
    patches_before = snapshot(toy.project / "patches")
    faults = GitFaults.install(tmp_path / "faults")
    # Two warm runs: the first fills the cache and mirror, the second (through the same git as
    # the runs below: a rebase record is keyed by the git it ran) records the carry it
    # classified; the counted run is the steady one, which reads that record as every
    # interrupted run after it does.
    for env in (toy.env, {**toy.env, **faults.env()}):
        faults.arm(0, "KILL")
        warm = cli(*ARGS, env=env)
        assert warm.returncode == 1 and tree.is_dir(), warm.stderr
        assert cli("rebase", "--target", "toy", "--abort", env=toy.env).returncode == 0
    faults.arm(0, "KILL")
    clean = cli(*ARGS, env={**toy.env, **faults.env()})
    assert clean.returncode == 1 and tree.is_dir(), clean.stderr
    complete = _tree_state(tree)
    calls = faults.calls()
    # From the `git init` of the tree on: the calls that build it (the replay before it only
    # writes loose objects into the mirror, which test_kill_rebase covers).
    first = max(i for i, c in enumerate(calls, 1) if verb(c) == "init")
    assert cli("rebase", "--target", "toy", "--abort", env=toy.env).returncode == 0
    tried = aborted = rerun = messages = 0
    points = [(sig, at) for sig in ("KILL", "TERM", "INT") for at in range(first, len(calls) + 1)]
    for sig, at in rotating(points, SAMPLED, salt=5):
        faults.arm(at, sig)
        done = cli(*ARGS, env={**toy.env, **faults.env()})
        assert len(faults.calls()) >= at, f"call {at} was never made"
        tried += 1
        where = f"call {at} ({calls[at - 1]}) {sig}"
        assert snapshot(toy.project / "patches") == patches_before, where
        assert not cache_problems(toy.cache), where
        left = _tree_state(tree)
        assert left in (None, complete), f"{where}: a partial conflict tree {left}"
        assert not list(tree.parent.glob(".toy.patchkit-*")) or sig == "KILL", where
        if sig != "KILL":
            assert done.returncode == 130, (where, done.returncode, done.stderr)
            assert one_or_two_lines(done.stderr) and "interrupted" in done.stderr, where
            messages += 1
        if left is None:
            again = cli(*ARGS, env=toy.env)
            assert again.returncode == 1 and _tree_state(tree) == complete, (
                where,
                again.stderr,
            )
            rerun += 1
        leftover = list(tree.parent.glob(".toy.patchkit-*"))
        assert not leftover, f"{where}: scratch left after the next run: {leftover}"
        stop = cli("rebase", "--target", "toy", "--abort", env=toy.env)
        assert stop.returncode == 0 and not tree.exists(), (where, stop.stderr)
        aborted += 1
    record(
        SECTION,
        f"{tried} interrupts over the {len(calls) - first + 1} git calls that build the tree "
        f"(of {len(points)}: each call with SIGKILL/SIGTERM/SIGINT): 0 partial trees, "
        "0 changes to patches/; "
        f"{rerun} re-runs made the complete tree, {aborted}/{tried} --abort removed it; "
        f"{messages} SIGINT/SIGTERM exits were one line + 130",
    )


# The state file is the last thing written: a SIGKILL just before it must not leave a tree
# that looks finished (`--continue` would resume a rebase nobody recorded).
KILL_BEFORE_STATE = """
import os, signal, sys
from patchkit import cli, rebase
real = rebase.worktree_fingerprint
def fingerprint(dest):
    value = real(dest)
    os.kill(os.getpid(), signal.SIGKILL)
    return value
rebase.worktree_fingerprint = fingerprint
sys.exit(cli.main(sys.argv[1:]))
"""


def test_kill_before_the_state_file_leaves_no_tree(tmp_path):
    toy = toy_with_conflicting_release(tmp_path / "toy")
    tree = toy.project / "work" / "rebase" / "toy"
    killed = subprocess.run(
        [sys.executable, "-c", KILL_BEFORE_STATE, *ARGS],
        cwd=ROOT,
        env={**os.environ, **toy.env},
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not tree.exists(), "a conflict tree without its state file was left in place"
    cont = cli("rebase", "--target", "toy", "--continue", env=toy.env)
    assert cont.returncode != 70 and one_or_two_lines(cont.stderr), cont.stderr
    again = cli(*ARGS, env=toy.env)
    assert again.returncode == 1, again.stderr
    state = json.loads((tree / ".git" / "patchkit-rebase.json").read_text())
    assert state["target"] == "toy"
    assert not list(tree.parent.glob(".toy.patchkit-*"))
    # The renamed tree is a working rebase: resolve the conflict, --continue finishes it.
    path = tree / "pkg/mod00/file00.py"
    text = path.read_text()
    assert "<<<<<<<" in text
    kept = [ln for ln in text.splitlines() if not ln.startswith(("<<<<<<<", "=======", ">>>>>>>"))]
    path.write_text("\n".join(ln for ln in kept if ln != "upstream rewrote this line") + "\n")
    git(tree, "add", "pkg/mod00/file00.py")
    cont = cli("rebase", "--target", "toy", "--continue", env=toy.env)
    assert cont.returncode == 0 and "resolved" in cont.stdout, (cont.stdout, cont.stderr)
    record(
        SECTION,
        "SIGKILL before the state file: no tree left; the next run made it whole and "
        "--continue finished it after the resolution",
    )


def test_two_conflict_tree_runs_at_once_make_one_tree(tmp_path):
    """Two `rebase --conflict-tree` at once: one makes the tree, the other waits for it and
    then refuses in one line (the tree is there: --continue or --abort); no scratch is left."""
    toy = toy_with_conflicting_release(tmp_path / "toy")
    tree = toy.project / "work" / "rebase" / "toy"
    assert cli("fetch", "--target", "toy", env=toy.env).returncode == 0
    procs = [
        subprocess.Popen([sys.executable, "-m", "patchkit", *ARGS], cwd=ROOT,
                         env={**os.environ, **toy.env}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    codes = sorted(p.wait(timeout=120) for p in procs)
    errs = [p.stderr.read() for p in procs]
    # [1, 1] only when the second started after the first had finished: it then replaced
    # the untouched tree, as documented
    assert codes in ([1, 2], [1, 1]), (codes, errs)
    for proc, err in zip(procs, errs, strict=True):
        if proc.returncode == 2:
            told = "\n".join(ln for ln in err.splitlines() if "waiting for another" not in ln)
            assert "already holds a rebase in progress" in err and one_or_two_lines(told), err
    assert (tree / ".git" / "patchkit-rebase.json").is_file()
    assert not list(tree.parent.glob(".toy.patchkit-*"))
    record(SECTION, f"two conflict-tree runs at once: exit codes {codes}, one complete tree")
