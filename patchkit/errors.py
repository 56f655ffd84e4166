"""The small exception hierarchy every patchkit failure is expressed in.

Each error carries a one-line message and, where there is one, the next step a user can take.
The CLI maps the class to an exit code; nothing else prints tracebacks.
"""

from __future__ import annotations

from collections.abc import Iterable


class PatchkitError(Exception):
    """Base class: a failure with a one-line cause and an optional next step."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(PatchkitError):
    """The command line or its inputs are wrong."""

    exit_code = 2


class ConfigError(PatchkitError):
    """targets.toml, a series file or a profile is malformed."""

    exit_code = 2


class PinError(PatchkitError):
    """An upstream does not match its pin (hash, commit) or a ref cannot be resolved."""

    exit_code = 1


class DamagedBaseError(PinError):
    """The base's objects in the mirror no longer hash to their ids (damage or tampering)."""


class FetchError(PatchkitError):
    """An upstream could not be obtained from any source."""

    exit_code = 1


class PatchFormatError(PatchkitError):
    """A patch file is malformed or hostile."""

    exit_code = 1


class ApplyError(PatchkitError):
    """The series did not apply; the target was left as it was."""

    exit_code = 1


class DirtyTreeError(PatchkitError):
    """A checkout has uncommitted changes to tracked files."""

    exit_code = 1


class NothingToDo(PatchkitError):
    """The requested state already holds (quilt's 'nothing to do', with its own exit code)."""

    exit_code = 3


class LockedError(PatchkitError):
    """Another patchkit process holds a lock on the same cache or target."""

    exit_code = 1


class SeriesChangedError(PatchkitError):
    """What a verb read of patches/ (a series folder, targets.toml) changed before it wrote:
    another command wrote there meanwhile; nothing was written."""

    exit_code = 1


class BuildError(PatchkitError):
    """A wheel build failed."""

    exit_code = 1


class VerifyInputError(PatchkitError):
    """An input to `verify` (environment, wheelhouse, profile) cannot be read."""

    exit_code = 2


class InvalidArchiveError(PatchkitError):
    """A wheel or sdist is malformed or hostile; nothing was extracted from it."""

    exit_code = 1


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`; did you mean 'X'?` naming the known name closest to a mistyped `word`, or "" when
    none is close: the one suggestion every unknown name (verb, target, ref, line) gets."""
    close = closest(word, known)
    return f"; did you mean {close!r}?" if close else ""


def closest(word: str, known: Iterable[str], cutoff: float = 0.7) -> str | None:
    """The known name closest to `word`, when one is close enough (difflib's ratio)."""
    from difflib import get_close_matches

    close = get_close_matches(word, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def os_error_hint(exc: OSError) -> str | None:
    """The next step for an OSError whose cause is the file system, not the file: a full
    disk (TMPDIR holds every run's scratch) or a path longer than it takes."""
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            "free space on that file system, or point TMPDIR (patchkit's scratch) or "
            "PATCHKIT_CACHE at one with room, then run again"
        )
    if exc.errno == errno.ENAMETOOLONG:
        return "the path is too long for the file system: use a shorter folder, then run again"
    return None


class Interrupted(KeyboardInterrupt):
    """An interrupt (SIGINT, SIGTERM) after which the core says exactly what it left."""

    def __init__(self, left: str) -> None:
        super().__init__(left)
        self.left = left
