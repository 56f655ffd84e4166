"""Special files and git's stale lock files: a clear one-line error that names the file,
never a hang. A FIFO where the series or a patch file should be would block the reader
forever; a lock file left by a killed git would block every later run without saying why."""

from __future__ import annotations

import os

from reliability_support import cli, git, make_project, one_or_two_lines, record, rev

SECTION = "bounded input (tests/reliability/test_bounded_input.py)"


def test_fifo_as_series_file_refused(toy, tmp_path):
    series = toy.project / "patches" / "toy" / "series"
    series.unlink()
    os.mkfifo(series)
    done = cli("apply", "--target", "toy", "--into", str(tmp_path / "wt"), env=toy.env, timeout=60)
    assert done.returncode == 2 and one_or_two_lines(done.stderr), done.stderr
    assert "is a FIFO" in done.stderr and str(series) in done.stderr


def test_fifo_as_patch_file_refused(toy, tmp_path):
    patch = toy.project / "patches" / "toy" / next(iter(toy.patches))
    patch.unlink()
    os.mkfifo(patch)
    done = cli("apply", "--target", "toy", "--into", str(tmp_path / "wt"), env=toy.env, timeout=60)
    assert done.returncode == 2 and "is a FIFO" in done.stderr, done.stderr
    done = cli("lint", env=toy.env, timeout=60)  # finishes: lint never opens it
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    record(SECTION, "a FIFO as the series file or as a patch: refused in one line naming it")


def _older_checkout(toy, tmp_path):
    older = tmp_path / "project-v1"
    make_project(older, toy.upstream, toy.base, dict(list(toy.patches.items())[:2]))
    into = tmp_path / "wt"
    done = cli(
        "apply", "--target", "toy", "--into", str(into),
        env={**toy.env, "PATCHKIT_PROJECT": str(older)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return into


def test_stale_index_lock_is_named(toy, tmp_path):
    into = _older_checkout(toy, tmp_path)
    lock = into / ".git" / "index.lock"
    lock.write_text("")
    before = rev(into, "HEAD")
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert str(lock) in done.stderr and "remove" in done.stderr
    assert rev(into, "HEAD") == before and lock.exists()  # a user's lock is theirs to remove
    lock.unlink()
    assert cli("apply", "--target", "toy", "--into", str(into), env=toy.env).returncode == 0


def test_stale_index_lock_in_a_linked_worktree_is_named(toy, tmp_path):
    main = _older_checkout(toy, tmp_path)
    linked = tmp_path / "linked"
    git(main, "worktree", "add", "-q", "--detach", str(linked))
    git(linked, "checkout", "-q", "-b", "mine")
    git_dir = git(linked, "rev-parse", "--absolute-git-dir").strip()
    lock = os.path.join(git_dir, "index.lock")
    open(lock, "w").close()
    done = cli("apply", "--target", "toy", "--into", str(linked), env=toy.env)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert lock in done.stderr, done.stderr
    os.unlink(lock)
    done = cli("apply", "--target", "toy", "--into", str(linked), env=toy.env)
    assert done.returncode == 0, done.stderr


def test_stale_ref_lock_is_named(toy, tmp_path):
    into = _older_checkout(toy, tmp_path)
    lock = into / ".git" / "refs" / "patchkit" / "toy" / "series.lock"
    lock.write_text("")
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert str(lock) in done.stderr and "internal error" not in done.stderr
    record(SECTION, "stale index.lock (checkout, linked worktree) and ref lock: named in the "
           "one-line error with the step to take; nothing moved")  # fmt: skip
