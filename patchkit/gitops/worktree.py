"""Work trees: checkouts, resets, rebases, and the state of a user's checkout (an unfinished
git operation, an interrupted checkout, untracked files in the way)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from patchkit.gitops.faults import GitError
from patchkit.gitops.refs import current_branch, resolve
from patchkit.gitops.repo import _LITERAL, Identity, Repo, _hash_name, verb
from patchkit.gitops.trees import empty_tree


@verb
def dirty_files(repo: Repo) -> list[str]:
    """Tracked files with uncommitted changes (staged or not)."""
    out = str(repo.run("status", "--porcelain=v1", "--untracked-files=no", "-z"))
    return [entry[3:] for entry in out.split("\0") if entry]


@verb
def changed_paths(repo: Repo, tree: str) -> list[str]:
    """Paths whose work-tree content differs from `tree` (tracked files only)."""
    out = str(repo.run("diff", "--name-only", "-z", tree))
    return [p for p in out.split("\0") if p]


@verb
def status_entries(repo: Repo) -> list[str]:
    """`XY path` for every changed, unmerged or untracked path of a work tree."""
    out = str(repo.run("status", "--porcelain=v1", "--untracked-files=all", "-z"))
    return [entry for entry in out.split("\0") if len(entry) > 3]


@verb
def checkout_branch(repo: Repo, branch: str, sha: str) -> None:
    """Point `branch` at `sha` and check it out (git refuses to clobber untracked files)."""
    repo.run("checkout", "--quiet", "-B", branch, sha)


@verb
def reset_hard(repo: Repo, sha: str) -> None:
    repo.run("reset", "--quiet", "--hard", sha)


@verb
def restore_head(repo: Repo, branch: str | None, sha: str) -> None:
    """Put HEAD back where it was (a branch at sha, or detached at sha)."""
    if branch:
        repo.run("checkout", "--quiet", "-B", branch, sha)
    else:
        repo.run("checkout", "--quiet", "--detach", sha)


@verb
def force_checkout(repo: Repo, sha: str, branch: str | None) -> None:
    """Check out `sha` (on `branch`, else detached), overwriting tracked files and index."""
    if branch:
        repo.run("checkout", "--quiet", "--force", "-B", branch, sha)
    else:
        repo.run("checkout", "--quiet", "--force", "--detach", sha)


@verb
def unborn_checkout(repo: Repo, branch: str) -> None:
    """Put `repo` back on the unborn `branch`: every tracked file removed, the index emptied
    (the caller has checked that each tracked file is one the interrupted checkout wrote)."""
    for name in _names(repo.run("ls-files", "-z", env=_LITERAL)):
        with contextlib.suppress(FileNotFoundError):
            (repo.path / name).unlink()
        for folder in (repo.path / name).parents:  # the folders the checkout made, once empty
            if folder == repo.path or not folder.is_relative_to(repo.path):
                break
            try:
                folder.rmdir()
            except OSError:
                break
    repo.run("read-tree", "--empty")
    repo.run("symbolic-ref", "HEAD", f"refs/heads/{branch}")


@verb
def rebase_onto(
    repo: Repo, onto: str, upstream: str, tip: str, branch: str, who: Identity
) -> tuple[bool, str]:
    """`git rebase --onto` in a work tree (empty results dropped); (finished, git's messages)."""
    repo.run("checkout", "--quiet", "-B", branch, tip)
    env = {**_committer_env(who), "GIT_EDITOR": "true", "GIT_SEQUENCE_EDITOR": "true"}
    try:
        out = repo.run(
            "rebase",
            "--empty=drop",
            "--no-autosquash",
            "--onto",
            onto,
            upstream,
            branch,
            env=env,
        )
    except GitError as exc:
        return False, exc.stderr
    return True, str(out)


@verb
def rebase_continue(repo: Repo, who: Identity) -> tuple[bool, str]:
    """`git rebase --continue` (message kept); (finished, git's messages)."""
    env = {**_committer_env(who), "GIT_EDITOR": "true"}
    try:
        out = repo.run("rebase", "--continue", env=env)
    except GitError as exc:
        return False, exc.stderr
    return True, str(out)


@verb
def rebase_in_progress(repo: Repo) -> bool:
    git_dir = Path(str(repo.run("rev-parse", "--absolute-git-dir")).strip())
    return (git_dir / "rebase-merge").is_dir() or (git_dir / "rebase-apply").is_dir()


@verb
def rebase_stopped_at(repo: Repo) -> str | None:
    """The commit a stopped rebase is replaying (REBASE_HEAD), if any."""
    return resolve(repo, "REBASE_HEAD")


@verb
def conflicted_files(repo: Repo) -> list[str]:
    out = str(repo.run("diff", "--name-only", "--diff-filter=U", "-z"))
    return [p for p in out.split("\0") if p]


def _committer_env(who: Identity) -> dict[str, str]:
    return {
        "GIT_COMMITTER_NAME": who.name,
        "GIT_COMMITTER_EMAIL": who.email,
        "GIT_COMMITTER_DATE": who.date,
    }


@verb
def files_written_by_checkout(repo: Repo, old: str, new: str) -> list[str]:
    """Untracked files holding exactly what `new` adds over `old`: what an interrupted
    checkout of `new` left behind (a user's own file at such a path has other bytes)."""
    added = [
        p
        for p in str(
            repo.run("diff", "--name-only", "-z", "--no-renames", "--diff-filter=A", old, new)
        ).split("\0")
        if p
    ]
    if not added:
        return []
    blobs = {}
    for entry in str(repo.run("ls-tree", "-r", "-z", "--full-tree", new)).split("\0"):
        meta, _, name = entry.partition("\t")
        if name:
            blobs[name] = meta.split(" ")[2]
    tracked = set(str(repo.run("ls-files", "-z")).split("\0"))
    algorithm = _hash_name(repo)
    found = []
    for path in added:
        full = repo.path / path
        if path in tracked or path not in blobs or not (full.is_file() or full.is_symlink()):
            continue
        data = os.readlink(full).encode() if full.is_symlink() else full.read_bytes()
        if hashlib.new(algorithm, b"blob %d\0" % len(data) + data).hexdigest() == blobs[path]:
            found.append(path)
    return found


# --- the state of a user's checkout ---------------------------------------------------------

# What an unfinished git operation leaves in the git directory, and how a user finishes it.
OPERATIONS = (
    ("rebase-merge", "rebase", "git rebase --continue, or git rebase --abort"),
    ("rebase-apply/applying", "git am", "git am --continue, or git am --abort"),
    ("rebase-apply", "rebase", "git rebase --continue, or git rebase --abort"),
    ("MERGE_HEAD", "merge", "git merge --continue, or git merge --abort"),
    ("CHERRY_PICK_HEAD", "cherry-pick", "git cherry-pick --continue, or git cherry-pick --abort"),
    ("REVERT_HEAD", "revert", "git revert --continue, or git revert --abort"),
    ("sequencer", "cherry-pick or revert", "git cherry-pick --continue, or --abort"),
    ("BISECT_LOG", "bisect", "git bisect reset"),
)


@verb
def operation_in_progress(repo: Repo) -> tuple[str, str, str] | None:
    """(what, the file that says so, how to finish it) for an unfinished git operation."""
    git_dir = repo.git_dir()
    for marker, what, finish in OPERATIONS:
        if (git_dir / marker).exists():
            return what, str(git_dir / marker), finish
    return None


@verb
def contained_in_refs(repo: Repo, sha: str) -> bool:
    """True when a branch, tag or remote-tracking ref contains `sha`."""
    out = str(
        repo.run(
            "for-each-ref", "--count=1", "--contains", sha, "refs/heads", "refs/tags",
            "refs/remotes",
        )
    )  # fmt: skip
    return bool(out.strip())


def _names(out: str | bytes) -> list[str]:
    return [p for p in str(out).split("\0") if p]


def _blobs(repo: Repo, commit: str | None, paths: list[str]) -> dict[str, str]:
    """path -> blob id in `commit` for those of `paths` it holds."""
    if not commit or not paths:
        return {}
    out = str(
        repo.run(
            "ls-tree", "-r", "-z", "--full-tree", commit, "--", *paths,
            env={"GIT_LITERAL_PATHSPECS": "1"},
        )
    )  # fmt: skip
    found = {}
    for entry in out.split("\0"):
        meta, _, name = entry.partition("\t")
        if name:
            found[name] = meta.split(" ")[2]
    return found


def _worktree_blob(repo: Repo, path: str, algorithm: str) -> str | None:
    full = repo.path / path
    if full.is_symlink():
        data = os.readlink(full).encode()
    elif full.is_file():
        data = full.read_bytes()
    else:
        return None
    return hashlib.new(algorithm, b"blob %d\0" % len(data) + data).hexdigest()


@verb
def untracked_in_the_way(repo: Repo, source: Repo, result: str) -> list[str]:
    """Untracked files (ignored or not) of the checkout `repo` where `result` (a commit of
    `source`) has a file, or at a parent directory of one: what `git checkout` would
    overwrite (ignored files) or refuse. Reads nothing into `repo`."""
    wanted = _names(source.run("ls-tree", "-r", "-z", "--name-only", "--full-tree", result))
    tracked = set(_names(repo.run("ls-files", "-z")))
    blocked: list[str] = []
    seen: set[str] = set()
    for path in wanted:
        if path in tracked:
            continue
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            full = repo.path / prefix
            if prefix in seen or not os.path.lexists(full):
                break
            last = i == len(parts)
            if (last or full.is_symlink() or not full.is_dir()) and prefix not in tracked:
                blocked.append(prefix)
                seen.add(prefix)
                break
    return sorted(blocked)


@verb
def interrupted_checkout_state(
    repo: Repo, head: str | None, branch: str | None, result: str, result_branch: str
) -> tuple[str, list[str]]:
    """Where a checkout from `head` (on `branch`) to `result` stopped, judged from the files.

    "finished": HEAD is the result on its branch (git moves HEAD last). "interrupted": HEAD
    is still where it was and every difference from it is a path the checkout changes, holding
    either the old bytes, the new bytes or nothing. Anything else is "changed", with a line
    for each thing that differs from what the interrupted checkout could have left.
    """
    now_head, now_branch = resolve(repo, "HEAD"), current_branch(repo)
    if now_head == result and now_branch == result_branch:
        return "finished", []
    if now_head != head or now_branch != branch:
        was = f"{(head or '?')[:12]} on {branch or 'a detached HEAD'}"
        now = f"{(now_head or '?')[:12]} on {now_branch or 'a detached HEAD'}"
        return "changed", [f"HEAD is now {now}; the interrupted apply left it at {was}"]
    if head is None:  # an unborn branch: the checkout started from nothing
        head = empty_tree(repo)
    moving = _names(repo.run("diff", "--name-only", "-z", "--no-renames", head, result))
    moving_set = set(moving)
    problems = []
    differs = set(_names(repo.run("diff", "--name-only", "-z", "--no-renames", head)))
    differs |= set(_names(repo.run("diff", "--cached", "--name-only", "-z", "--no-renames", head)))
    for path in sorted(differs - moving_set):
        problems.append(f"{path} was changed")
    old, new = _blobs(repo, head, moving), _blobs(repo, result, moving)
    algorithm = _hash_name(repo)
    staged = {}
    for entry in _names(
        repo.run("ls-files", "-s", "-z", "--", *moving, env=_LITERAL) if moving else ""
    ):
        meta, _, name = entry.partition("\t")
        staged[name] = meta.split(" ")[1]
    for path in moving:
        allowed = {old.get(path), new.get(path), None}
        if _worktree_blob(repo, path, algorithm) not in allowed:
            problems.append(f"{path} was edited")
        elif staged.get(path) not in allowed:
            problems.append(f"{path} was staged with other content")
    return ("changed", problems) if problems else ("interrupted", [])
