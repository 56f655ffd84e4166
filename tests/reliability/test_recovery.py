"""Recovery never guesses, and apply refuses checkouts it could damage.

A journal left by a killed apply is acted on only when the checkout is exactly as the killed
run left it; after a user's edit or commit the next run refuses, names what changed and
keeps everything. Detached HEADs with commits no branch holds, unfinished rebases, merges,
cherry-picks and bisects, and ignored files where the series puts its files are refused
before anything is touched. Real git, real checkouts, the real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from reliability_support import (
    ROOT,
    cli,
    git,
    make_project,
    one_or_two_lines,
    record,
    rev,
    snapshot,
)
from test_kill import MID_CHECKOUT

SECTION = "recovery and refusals (tests/reliability/test_recovery.py)"


@pytest.fixture
def older_checkout(toy, tmp_path):
    """A checkout made by a two-patch series; applying the five-patch one moves it."""
    older = tmp_path / "project-v1"
    make_project(older, toy.upstream, toy.base, dict(list(toy.patches.items())[:2]))
    into = tmp_path / "wt"
    done = cli(
        "apply", "--target", "toy", "--into", str(into),
        env={**toy.env, "PATCHKIT_PROJECT": str(older)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return into


def _apply(toy, into):
    return cli("apply", "--target", "toy", "--into", str(into), env=toy.env)


def _killed_mid_checkout(toy, into, seed: int = 1) -> None:
    killed = subprocess.run(
        [sys.executable, "-c", MID_CHECKOUT, "apply", "--target", "toy", "--into", str(into)],
        cwd=ROOT,
        env={**os.environ, **toy.env, "KILL_SEED": str(seed)},
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (into.parent / f".{into.name}.patchkit.journal").exists()


def _first_moved_path(into) -> str:
    changed = git(into, "diff", "--name-only", "HEAD").split()
    return changed[0] if changed else "pkg/mod01/file03.py"


def test_user_edit_after_a_kill_is_not_reset(toy, older_checkout):
    into = older_checkout
    _killed_mid_checkout(toy, into)
    (into / ".git" / "index.lock").unlink()  # the user cleans up as git tells them
    edited = into / "pkg/mod01/file03.py"
    edited.write_text("the user's own work\n")
    before = snapshot(into)
    done = _apply(toy, into)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert "pkg/mod01/file03.py was changed" in done.stderr and "will not guess" in done.stderr
    assert snapshot(into) == before
    assert edited.read_text() == "the user's own work\n"
    assert (into.parent / ".wt.patchkit.journal").exists()


def test_file_torn_by_a_killed_git_names_its_index_lock(toy, older_checkout):
    """git killed as it wrote a file: the torn file is refused as changed, and the refusal
    names the index.lock the killed git left, whose removal its hint puts first."""
    into = older_checkout
    head = rev(into, "HEAD")
    _killed_mid_checkout(toy, into)
    journal = into.parent / f".{into.name}.patchkit.journal"
    result = json.loads(journal.read_text())["result"]
    lock = into / ".git" / "index.lock"
    torn = git(into, "diff", "--name-only", head, result).split()[0]
    new = git(into, "show", f"{result}:{torn}").encode()
    (into / torn).write_bytes(new[: len(new) // 2])  # git had written half of it
    done = _apply(toy, into)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert f"{torn} was edited" in done.stderr and str(lock) in done.stderr
    hint = done.stderr.splitlines()[-1]
    assert hint.index(f"remove {lock}") < hint.index(f"checkout --force {head[:12]}"), hint
    assert journal.exists() and lock.exists()
    lock.unlink()  # as the hint says, in its order
    git(into, "checkout", "--force", head)
    git(into, "clean", "-fdq")  # files the checkout added stay untracked (no user files here)
    journal.unlink()
    done = _apply(toy, into)
    assert done.returncode == 0, done.stderr
    assert rev(into, "HEAD") == result


def test_user_commit_after_a_kill_is_not_reset(toy, older_checkout):
    into = older_checkout
    _killed_mid_checkout(toy, into)
    (into / ".git" / "index.lock").unlink()
    git(into, "checkout", "-q", "-b", "main")
    git(into, "add", "-A")
    git(into, "commit", "-qm", "my work on main")
    mine = rev(into, "HEAD")
    done = _apply(toy, into)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert "HEAD is now" in done.stderr and "on main" in done.stderr, done.stderr
    assert rev(into, "HEAD") == mine and rev(into, "refs/heads/main") == mine
    # the user decides: remove the journal, and apply runs normally (keeping their branch)
    (into.parent / ".wt.patchkit.journal").unlink()
    done = _apply(toy, into)
    assert done.returncode == 0, done.stderr
    assert rev(into, "refs/heads/main") == mine


def test_untouched_checkout_after_a_kill_is_put_back_then_applied(toy, older_checkout):
    into = older_checkout
    old = rev(into, "HEAD")
    _killed_mid_checkout(toy, into)
    (into / "untracked-notes.txt").write_text("mine\n")  # untracked elsewhere: fine
    done = _apply(toy, into)
    assert done.returncode == 0, done.stderr
    assert rev(into, "HEAD") != old
    assert (into / "untracked-notes.txt").read_text() == "mine\n"
    assert not (into.parent / ".wt.patchkit.journal").exists()


def test_journal_outliving_its_checkout_breaks_nothing(toy, older_checkout, tmp_path):
    into = older_checkout
    pristine = tmp_path / "pristine"
    shutil.copytree(into, pristine, symlinks=True)
    _killed_mid_checkout(toy, into)
    shutil.rmtree(into)
    done = _apply(toy, into)  # a new checkout at the same path
    assert done.returncode == 0, done.stderr
    assert not (into.parent / ".wt.patchkit.journal").exists()
    # and a checkout re-made by hand at that path is another repository: the journal is stale
    shutil.rmtree(into)
    shutil.copytree(pristine, into, symlinks=True)
    _killed_mid_checkout(toy, into)
    shutil.rmtree(into)
    shutil.copytree(tmp_path / "toy" / "upstream-work", into, symlinks=True)
    git(into, "checkout", "-q", "main")
    done = _apply(toy, into)
    assert done.returncode == 0, done.stderr
    record(SECTION, "journal after a kill: user edit -> refused naming the file; user commit "
           "-> refused naming the HEAD move; untouched -> put back and applied; checkout "
           "removed or re-made -> journal dropped, apply works")  # fmt: skip


def test_unreadable_journal_is_named(toy, older_checkout):
    journal = older_checkout.parent / ".wt.patchkit.journal"
    journal.write_text("{not json")
    done = _apply(toy, older_checkout)
    assert done.returncode == 1 and one_or_two_lines(done.stderr)
    assert str(journal) in done.stderr


def test_detached_head_with_own_commits_refused(toy, older_checkout):
    into = older_checkout
    git(into, "checkout", "-q", "--detach")
    (into / "mine.txt").write_text("mine\n")
    git(into, "add", "mine.txt")
    git(into, "commit", "-qm", "my detached work")
    mine = rev(into, "HEAD")
    done = _apply(toy, into)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert "detached HEAD" in done.stderr and "no branch or tag contains" in done.stderr
    assert rev(into, "HEAD") == mine
    git(into, "branch", "keep", mine)  # the named next step
    assert _apply(toy, into).returncode == 0
    assert rev(into, "refs/heads/keep") == mine


def test_detached_head_on_a_branch_commit_is_fine(toy, older_checkout):
    git(older_checkout, "checkout", "-q", "--detach")
    assert _apply(toy, older_checkout).returncode == 0


def _start_merge(into):
    git(into, "checkout", "-q", "-b", "side")
    (into / "README.md").write_text("side\n")
    git(into, "commit", "-qam", "side")
    git(into, "checkout", "-q", "-")
    git(into, "checkout", "-q", "-b", "other")
    (into / "README.md").write_text("other\n")
    git(into, "commit", "-qam", "other")
    subprocess.run(["git", "merge", "-q", "side"], cwd=into, capture_output=True)


def _start_rebase(into):
    _start_merge(into)
    git(into, "merge", "--abort")
    subprocess.run(["git", "rebase", "-q", "side"], cwd=into, capture_output=True)


def _start_cherry_pick(into):
    _start_merge(into)
    git(into, "merge", "--abort")
    subprocess.run(["git", "cherry-pick", "side"], cwd=into, capture_output=True)


def _start_bisect(into):
    git(into, "bisect", "start")


@pytest.mark.parametrize(
    "start,what",
    [
        (_start_merge, "merge"),
        (_start_rebase, "rebase"),
        (_start_cherry_pick, "cherry-pick"),
        (_start_bisect, "bisect"),
    ],
)
def test_operation_in_progress_refused(toy, older_checkout, start, what):
    into = older_checkout
    start(into)
    before = snapshot(into)
    done = _apply(toy, into)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert f"a {what} in progress" in done.stderr, done.stderr
    assert snapshot(into) == before


@pytest.mark.parametrize(
    "ignore,make",
    [
        ("pkg/mod03/new_module.py", lambda d: (d / "pkg/mod03/new_module.py").write_text("m\n")),
        ("pkg/mod03/", lambda d: (d / "pkg/mod03/new_module.py").mkdir(parents=True)),
    ],
)
def test_ignored_files_in_the_way_refused_and_named(toy, older_checkout, ignore, make):
    """git checkout overwrites ignored files silently (the `--into ~` dotfiles case)."""
    into = older_checkout
    (into / ".git" / "info" / "exclude").write_text(ignore + "\n")
    (into / "pkg/mod03").mkdir(parents=True, exist_ok=True)
    make(into)
    (into / "pkg/mod03/new_module.py").is_dir() and (
        into / "pkg/mod03/new_module.py/data.bin"
    ).write_bytes(b"precious")
    before = snapshot(into)
    done = _apply(toy, into)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert "pkg/mod03/new_module.py" in done.stderr and "nothing was touched" in done.stderr
    assert snapshot(into) == before
    assert not (into.parent / ".wt.patchkit.journal").exists()
    record(SECTION, f"ignored {'directory' if ignore.endswith('/') else 'file'} at a path the "
           "series adds: refused naming it, 0 bytes changed")  # fmt: skip


@pytest.mark.parametrize("sig", ["TERM", "INT"])
def test_interrupt_at_the_checkout_says_what_was_put_back(toy, older_checkout, tmp_path, sig):
    """SIGTERM/SIGINT at the in-place `git checkout` (the last git call of the apply): the
    checkout is put back, or found finished, and the one line says which (it once said "put
    back" of a checkout git had finished)."""
    from reliability_support import GitFaults

    into = older_checkout
    old = rev(into, "HEAD")
    probe = tmp_path / "probe"
    faults = GitFaults.install(tmp_path / "faults")
    counts: list[int] = []
    # Until two runs make the same calls: the first builds the series and records it, the
    # next reads the record (and re-hashes the base once, its objects' files touched by the
    # build); from then on each run makes the calls the run below will make.
    while len(counts) < 2 or counts[-1] != counts[-2]:
        assert len(counts) < 5, counts
        shutil.rmtree(probe, ignore_errors=True)
        shutil.copytree(into, probe, symlinks=True)
        faults.arm(0, "KILL")
        env = {**toy.env, **faults.env()}
        done = cli("apply", "--target", "toy", "--into", str(probe), env=env)
        assert done.returncode == 0, done.stderr
        counts.append(len(faults.calls()))
    calls = faults.calls()
    assert " checkout " in calls[-1], calls[-1]
    faults.arm(len(calls), sig)
    done = cli("apply", "--target", "toy", "--into", str(into), env={**toy.env, **faults.env()})
    assert done.returncode == 130 and one_or_two_lines(done.stderr), done.stderr
    # git runs on after the signal, as after a real Ctrl-C: stopped part-way, the checkout is
    # put back; done already, it stays done. Either way the line says which.
    if rev(into, "HEAD") == old:
        assert f"{into} was put back at {old[:12]}" in done.stderr, done.stderr
    else:
        result = rev(probe, "HEAD")
        assert rev(into, "HEAD") == result, "neither the old checkout nor the result"
        finished = f"interrupted as the checkout finished: {into} is at {result[:12]}"
        assert finished in done.stderr, done.stderr
    assert not (into.parent / ".wt.patchkit.journal").exists()
    assert not git(into, "status", "--porcelain", "--untracked-files=all").strip()
