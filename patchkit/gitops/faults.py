"""git's failures as exceptions: `GitError` (git's answer) and the faults outside a command
(`GitFaultError`: a damaged or foreign repository, a full disk, a path too long), each
mapped from git's words in one place, `raise_for`.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Protocol

from patchkit.errors import PatchkitError


class Where(Protocol):
    """Where a failed git ran (a `repo.Repo`): what the messages and repair hints name."""

    path: Path
    bare: bool


class GitError(Exception):
    """A git command failed; `stderr` holds git's words."""

    def __init__(self, args: list[str], status: int, stderr: str) -> None:
        super().__init__(stderr.strip() or f"git {' '.join(args)} exited {status}")
        self.args_ = args
        self.status = status
        self.stderr = stderr


class DamagedObjectError(GitError):
    """A loose object's file does not inflate to bytes that hash to its id."""

    def __init__(self, path: Path) -> None:
        super().__init__(["copy"], 1, f"the object file {path} does not hash to its id")
        self.path = path


class GitLockError(GitError, PatchkitError):
    """git found its own lock file in place: another git is running there, or one was killed."""

    exit_code = 1

    def __init__(self, args: list[str], status: int, stderr: str, lock: str) -> None:
        GitError.__init__(self, args, status, stderr)
        self.lock = lock
        self.message = (
            f"git's lock file {lock} exists: a git process is working in that repository, or "
            "one was killed there; nothing was changed"
        )
        self.hint = f"if no git process is running there, remove {lock} and run again"


class GitFaultError(PatchkitError):
    """git could not do its work for a reason outside the command: a damaged repository,
    another user's repository, a full disk, a path too long. Not a GitError: no caller takes
    it for git's answer ("no such ref", "does not apply"); `ok` and `check=False` calls raise
    it too, and it ends the command in one line naming the file and the repair."""

    exit_code = 1

    def __init__(self, args: list[str], status: int, stderr: str, message: str, hint: str):
        super().__init__(message, hint)
        self.args_ = args
        self.status = status
        self.stderr = stderr


class DamagedRepositoryError(GitFaultError):
    """A repository's own files (config, packed-refs, a pack or its index) cannot be read."""


class MissingObjectsError(GitError, PatchkitError):
    """Objects a command had to read are missing or unreadable. A GitError (callers that ask
    whether an object is there take it as "no"); uncaught, it names the repository's objects
    and the repair."""

    exit_code = 1

    def __init__(self, args: list[str], status: int, stderr: str, message: str, hint: str):
        GitError.__init__(self, args, status, stderr)
        self.message = message
        self.hint = hint


class OwnershipError(GitFaultError):
    """git's ownership check (`safe.directory`) refuses a repository another user owns."""

    exit_code = 2


class NoSpaceError(GitFaultError):
    """git could not write: no space (or quota) left on the file system."""


class PathTooLongError(GitFaultError):
    """A path is longer than the file system (or git) takes."""


_LOCK_RE = re.compile(r"Unable to create '([^']+\.lock)': File exists")


# git's words for each fault (git runs under LC_ALL=C): (pattern, kind); a kind's message and
# hint are made by `_fault`. The file a pattern captures is the one named to the user.
_FAULTS = (
    (re.compile(r"detected dubious ownership in repository at '([^']+)'"), "owner"),
    (re.compile(r"unexpected line in (\S*packed-refs)"), "file"),
    (re.compile(r"bad config line \d+ in (?:file|blob) (.+?)\s*$", re.M), "file"),
    (re.compile(r"packfile (\S+) cannot be accessed"), "file"),
    (re.compile(r"index file (\S+) is too small"), "file"),
    (re.compile(r"packfile (\S+) does not match index"), "file"),
    (re.compile(r"non-monotonic index (\S+)"), "file"),
    (re.compile(r"No space left on device|Disk quota exceeded"), "space"),
    (re.compile(r"File name too long|Filename too long"), "long"),
)


# Objects a ref or a walk needs and the repository lacks: damage when a command had to read
# them, but an answer ("not there") to a question asked with `ok` or `check=False`.
_MISSING_OBJECT = re.compile(
    r"missing object|unable to parse object|bad object [0-9a-f]{7}|invalid object [0-9a-f]{7}|"
    r"(?:could not|unable to) read [0-9a-f]{40}|object (?:file )?\S+ is (?:empty|corrupt)",
    re.I,
)


def raise_for(repo: Where, args: list[str], status: int, err: bytes, check: bool = True) -> None:
    """The one mapping of a failed git call to an exception: a fault (see _FAULTS) always, a
    lock or a missing object only where the caller asked git to succeed (`check`)."""
    text = err.decode("utf-8", "replace")
    fault = _fault(repo, args, status, text)
    if fault is not None:
        raise fault
    if not check:
        return
    lock = _LOCK_RE.search(text)
    if lock:
        raise GitLockError(args, status, text, lock.group(1))
    if _MISSING_OBJECT.search(text):
        objects = f"{repo.path if repo.bare else repo.path / '.git'}/objects"
        raise MissingObjectsError(
            args, status, text, _damaged(repo, objects, text), _repair_hint(repo, objects)
        )
    raise GitError(args, status, text)


def _fault(repo: Where, args: list[str], status: int, text: str) -> GitFaultError | None:
    for pattern, kind in _FAULTS:
        found = pattern.search(text)
        if found is None:
            continue
        named = found.group(1) if pattern.groups else str(repo.path)
        if kind == "owner":
            return OwnershipError(args, status, text, *_ownership(named))
        if kind == "file":
            return DamagedRepositoryError(
                args, status, text, _damaged(repo, named, text), _repair_hint(repo, named)
            )
        if kind == "space":
            return NoSpaceError(args, status, text, *_no_space(repo, text))
        return PathTooLongError(args, status, text, *_too_long(repo, text))
    return None


def _git_words(text: str) -> str:
    """git's first line of complaint, without its `fatal:`/`error:` prefix."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return re.sub(r"^(?:fatal|error): ", "", line)[:300]


def _damaged(repo: Where, named: str, text: str) -> str:
    words = _git_words(text)
    if named in words:
        return f"the git repository {repo.path} is damaged: {words}"
    return f"the git repository {repo.path} is damaged: {named} cannot be read ({words})"


def _repair_hint(repo: Where, named: str) -> str:
    """A mirror (`<cache>/mirrors/<target>.git`) patchkit makes again; anything else is the
    user's: patchkit names the file and never removes it."""
    if repo.bare and repo.path.parent.name == "mirrors" and repo.path.suffix == ".git":
        target = repo.path.stem
        return (
            f"remove the mirror ({repo.path}); the next run fetches or imports it again "
            f"(`patchkit fetch --target {target}`)"
        )
    return f"repair {named} (`git fsck` in {repo.path} names what is wrong), then run again"


def _ownership(where: str) -> tuple[str, str]:
    return (
        f"git refuses {where}: it belongs to another user (git's ownership check, "
        "safe.directory: 'dubious ownership'); nothing was changed",
        "run patchkit as the user who owns it, or give it to yourself (chown); patchkit reads "
        "no global git config, so a safe.directory entry there does not apply",
    )


def _no_space(repo: Where, text: str) -> tuple[str, str]:
    tmp = os.environ.get("TMPDIR") or tempfile.gettempdir()
    return (
        f"git ran out of disk space working in {repo.path} ({_git_words(text)})",
        f"free space on the file systems of {repo.path} and of TMPDIR ({tmp}), or point "
        "TMPDIR or PATCHKIT_CACHE at one with room, then run again",
    )


def _too_long(repo: Where, text: str) -> tuple[str, str]:
    return (
        f"a path is too long for git or the file system in {repo.path} ({_git_words(text)})",
        "use a shorter folder (--into, PATCHKIT_CACHE, TMPDIR), then run again",
    )
