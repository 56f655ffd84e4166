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

from patchkit.errors import ConfigError, LockedError

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
    """
    if path in _HELD.values():
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only cache or target folder, a file where a folder goes
        raise ConfigError(
            f"cannot write the lock file {path} for {what}: {exc.strerror}; nothing was changed",
            hint="patchkit writes there: make it writable, or choose another folder "
            "(PATCHKIT_CACHE for the cache, --into or --out for a target)",
        ) from None
    try:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
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
        _HELD[fd] = path
        yield
    finally:
        _HELD.pop(fd, None)
        os.close(fd)


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
