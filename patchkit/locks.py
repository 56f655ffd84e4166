"""Advisory file locks so two patchkit processes never corrupt a cache entry or a target.

The kernel drops an flock when its holder dies (even by SIGKILL), so a lock is never stale;
whatever a holder's scratch files look like, the next holder may sweep them. A git process
that patchkit started inherits the locks patchkit holds (see `held_lock_fds`), so one that
outlives a killed patchkit keeps them until it exits: nobody sweeps what a running git writes.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from patchkit.errors import ConfigError, LockedError, os_error_hint

_HELD: dict[int, Path] = {}


def held_lock_fds() -> tuple[int, ...]:
    """The file descriptors of the locks this process holds (for child processes to inherit)."""
    return tuple(_HELD)


@contextmanager
def locked(
    path: Path, what: str, *, timeout: float = 600.0, notify: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold an exclusive lock on `path`; wait (saying so once) up to `timeout` seconds.

    The waiting line goes to `notify`, or to stderr when none is given: a user whose command
    seems to hang should always learn why. A lock this process already holds is held again
    at once (an flock taken twice by one process through two descriptors would wait on
    itself): a series writer called under the locks of another keeps them.

    The lock file goes when its holder lets go (removed while still locked), so a command,
    refused or not, leaves no file beside a folder it locked; one who waited on the removed
    file finds it gone or replaced once it gets the lock, and locks the file now there.
    A SIGKILLed holder leaves its file; the next holder removes it.
    """
    if path in _HELD.values():
        yield
        return
    fd = _acquire(path, what, time.monotonic() + timeout, notify)
    _HELD[fd] = path
    try:
        yield
    finally:
        _HELD.pop(fd, None)
        if _is_locked_file(fd, path):
            path.unlink(missing_ok=True)
        os.close(fd)


def _acquire(path: Path, what: str, deadline: float, notify: Callable[[str], None] | None) -> int:
    """An fd holding the flock of the file now at `path` (not of one its holder removed)."""
    told = False
    while True:
        fd = _open(path, what)
        try:
            told = _flock(fd, path, what, deadline, notify, told)
        except BaseException:
            os.close(fd)
            raise
        if _is_locked_file(fd, path):
            return fd
        os.close(fd)  # its holder removed it as it let go: lock the one at `path` now


def _open(path: Path, what: str) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only cache or target folder, a file where a folder goes
        raise ConfigError(
            f"cannot write the lock file {path} for {what}: {exc.strerror}; nothing was changed",
            hint=os_error_hint(exc)
            or "patchkit writes there: make it writable, or choose another folder "
            "(PATCHKIT_CACHE for the cache, --into or --out for a target)",
        ) from None


def _flock(
    fd: int,
    path: Path,
    what: str,
    deadline: float,
    notify: Callable[[str], None] | None,
    told: bool,
) -> bool:
    """Wait for the flock on `fd`; whether the waiting line was said."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return told
        except BlockingIOError:
            if not told:
                line = f"waiting for another patchkit process using {what}"
                if notify is not None:
                    notify(line)
                else:
                    sys.stderr.write(f"patchkit: {line}\n")
                    sys.stderr.flush()
                told = True
            if time.monotonic() > deadline:
                raise LockedError(
                    f"{what} is locked by another patchkit process ({path})",
                    hint="wait for it to finish, then run again",
                ) from None
            time.sleep(0.1)


def _is_locked_file(fd: int, path: Path) -> bool:
    """Whether `path` is still the file `fd` has open."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def locked_temp_file(folder: Path, prefix: str, suffix: str = "") -> tuple[int, str]:
    """A new temp file in `folder`, flocked by this process while it writes it: a sweeper
    (`sweep_dead_temp_files`) removes it only once its writer is dead. Keep the returned fd
    open until the file is renamed (write through `os.dup(fd)`)."""
    while True:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=suffix)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                return fd, tmp
        except FileNotFoundError:
            pass  # a sweeper took it between mkstemp and flock: make another
        os.close(fd)


def sweep_dead_temp_files(folder: Path, pattern: str) -> None:
    """Remove the temp files matching `pattern` in `folder` that a killed writer left: a live
    writer holds an flock on its own (`locked_temp_file`), which the kernel drops when the
    writer dies."""
    for stale in folder.glob(pattern) if folder.is_dir() else ():
        try:
            fd = os.open(stale, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            stale.unlink(missing_ok=True)
        except OSError:
            pass  # held: another writer is writing it
        finally:
            os.close(fd)
