"""Each patchkit process's own scratch folder in $TMPDIR: the working directory of git calls on
a bare repository, scratch indexes, verify's extracted members.  Whatever a run leaves there
goes with the folder: removed at exit, and by the next run after a SIGKILL."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile
import threading

PREFIX = "patchkit-run-"  # in $TMPDIR: one folder per running patchkit process
_SCRATCH: dict[int, tuple[str, int]] = {}  # pid -> (its scratch folder, the fd holding it)
_MADE = threading.Lock()


def root() -> str:
    """This process's scratch folder, made on first use.  It is held by an flock on its
    `held` file for the life of the process and removed at exit; one whose holder died
    (SIGKILL) is removed by the next patchkit that makes its own (an flock dies with its
    process, in any pid namespace, so a folder in use is never taken)."""
    pid = os.getpid()
    entry = _SCRATCH.get(pid)
    if entry is not None and os.path.isdir(os.path.join(entry[0], "cwd")):
        return entry[0]
    with _MADE:  # threads: one folder per process
        entry = _SCRATCH.get(pid)
        if entry is not None and os.path.isdir(os.path.join(entry[0], "cwd")):
            return entry[0]
        sweep_dead()
        path = tempfile.mkdtemp(prefix=PREFIX)
        fd = os.open(os.path.join(path, "held"), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.mkdir(os.path.join(path, "cwd"))
        _SCRATCH[pid] = (path, fd)
        atexit.register(_remove, pid)
        return path


def cwd() -> str:
    """The working directory of every git call on a bare repository: an empty folder of this
    process's own, never the caller's.  git takes the working directory for a work tree even
    with `--git-dir` on a bare repository: `apply --cached --3way` of a patch creating a file
    the index already has writes that file there (git 2.39), into wherever patchkit was run."""
    return os.path.join(root(), "cwd")


def empty_cwd() -> None:
    """Remove whatever a bare git call left in `cwd()`."""
    entry = _SCRATCH.get(os.getpid())
    if entry is None:
        return
    with contextlib.suppress(OSError), os.scandir(os.path.join(entry[0], "cwd")) as entries:
        for item in entries:
            if item.is_dir(follow_symlinks=False):
                shutil.rmtree(item.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(item.path)


def new_path(prefix: str) -> str:
    """The path of a new, absent file in the scratch folder (a scratch index)."""
    fd, path = tempfile.mkstemp(dir=root(), prefix=prefix)
    os.close(fd)
    os.unlink(path)
    return path


def new_folder(prefix: str) -> str:
    """A new, empty folder in the scratch folder (the caller removes it when done)."""
    return tempfile.mkdtemp(dir=root(), prefix=prefix)


def sweep_dead() -> None:
    """Remove the scratch folders of patchkit processes that died without removing theirs."""
    tmp = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(tmp, name)
        try:
            fd = os.open(os.path.join(path, "held"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # not one of ours, or being made right now
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # its process is alive
        try:
            if not os.path.islink(path) and os.stat(path).st_uid == os.getuid():
                shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


def _remove(pid: int) -> None:
    if os.getpid() == pid and pid in _SCRATCH:
        path, fd = _SCRATCH.pop(pid)
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
