"""Each patchkit process's own scratch folder in $TMPDIR: the working directory of git calls on
a bare repository, scratch indexes, verify's extracted members, every temporary folder
(`temporary_folder`) and, while `children_contained` holds, the temp files of this process and
of its children (pip, the build backend).  Whatever a run leaves there goes with the folder:
removed at exit, and by the next run after a SIGKILL.  A folder that must lie beside its target
instead (to be renamed onto it, on its file system) is recorded there (`folder_beside`) and goes
with it."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

PREFIX = "patchkit-run-"  # in $TMPDIR: one folder per running patchkit process
MARK = "_PATCHKIT_RUN"  # set, never read, in a contained child: the scratch folder of its run
BESIDE = "beside"  # in a scratch folder: a link to each folder_beside() its process made
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
        with signals_held():  # made and registered for removal, or not made
            path = tempfile.mkdtemp(prefix=PREFIX)
            # Locked under another name, then named `held`: a sweep never finds an unlocked
            # `held` in a folder being made (it took such a folder for a dead run's).
            fd = os.open(os.path.join(path, "making"), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(os.path.join(path, "making"), os.path.join(path, "held"))
            os.mkdir(os.path.join(path, "cwd"))
            _SCRATCH[pid] = (path, fd)
            atexit.register(_remove, pid)
        return path


_HELD = {"depth": 0, "pending": False}  # the main thread's `signals_held` sections


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """An interrupt (patchkit's SIGINT / SIGTERM handler) that comes while the main thread is
    in this section is raised as it leaves it: a folder made and recorded for removal, a git
    started and held for stopping, never one without the other. (An interrupt between the two
    left the folder behind, or a git running unwatched, writing into a folder the clean-up was
    removing.) Deferred in the handler, not by masking: the kernel hands a process-directed
    signal to any thread that does not mask it, and Python raises it in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield  # interrupts are raised in the main thread only
        return
    _HELD["depth"] += 1
    try:
        yield
    finally:
        _HELD["depth"] -= 1
        if not _HELD["depth"] and _HELD["pending"]:
            _HELD["pending"] = False
            raise KeyboardInterrupt


def defer_interrupt() -> bool:
    """For the interrupt handler: True, and the interrupt raised later, while the main thread
    is in a `signals_held` section."""
    if _HELD["depth"]:
        _HELD["pending"] = True
        return True
    return False


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


def folder_beside(target: str | os.PathLike, tag: str) -> str:
    """A new, empty folder ``.<name>.<tag>-<random>`` beside ``target``, on its file system (a
    tree renamed onto ``target`` when complete).  It is recorded in this process's scratch
    folder before it is made, so it goes with that folder: removed at exit, and by the next
    patchkit run after a SIGKILL (`sweep_dead`).  The caller renames or removes it when done."""
    parent, name = os.path.split(os.path.abspath(target))
    records = os.path.join(root(), BESIDE)
    os.makedirs(records, exist_ok=True)
    while True:
        path = os.path.join(parent, f".{name}.{tag}-{secrets.token_hex(6)}")
        record = os.path.join(records, os.path.basename(path))
        try:
            os.symlink(path, record)  # first: a kill before the mkdir leaves nothing to sweep
        except FileExistsError:
            continue
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            os.unlink(record)
            continue
        return path


def _remove_beside(scratch: str) -> None:
    """Remove the folders recorded in ``scratch`` by `folder_beside` that are still there
    (renamed onto their target, they are gone): only a real folder of this user whose name
    is a `folder_beside` name."""
    records = os.path.join(scratch, BESIDE)
    try:
        names = os.listdir(records)
    except OSError:
        return
    for name in names:
        try:
            path = os.readlink(os.path.join(records, name))
            st = os.lstat(path)
        except OSError:
            continue
        if os.path.basename(path) == name and name.startswith(".") and st.st_uid == os.getuid():
            if not os.path.islink(path) and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def temporary_folder(prefix: str) -> Iterator[str]:
    """A new folder in the scratch folder, removed when the block ends (a killed run's goes
    with its scratch folder, never left in $TMPDIR)."""
    with tempfile.TemporaryDirectory(dir=root(), prefix=prefix) as path:
        yield path


# Run by the watchdog `children_contained` starts: it waits for EOF on stdin (its parent closed
# the pipe or died, a SIGKILL included), then SIGKILLs every process whose environment names the
# run (the children and all their descendants) until none is left.  It holds the scratch
# folder's flock meanwhile, so the next run sweeps the folder only once they are gone.
WATCHDOG = r"""
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
    signal.signal(s, signal.SIG_IGN)
mark, me = ("%s=" % sys.argv[1] + sys.argv[2]).encode(), os.getpid()
while os.read(0, 4096):
    pass
def marked():
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open("/proc/%s/environ" % name, "rb") as fh:
                    if mark in fh.read().split(b"\0"):
                        yield int(name)
            except OSError:
                pass
for _ in range(200):
    pids = list(marked())
    if not pids:
        break
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.05)
"""


class Children:
    """The processes started inside `children_contained` (see there)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._watchdog: subprocess.Popen | None = None

    def start(self) -> None:
        _, held = _SCRATCH[os.getpid()]
        self._watchdog = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", WATCHDOG, MARK, self.folder],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(held,),  # holds the scratch folder's flock until its work is done
            start_new_session=True,  # a Ctrl-C to the terminal's process group spares it
            env={"PATH": os.environ.get("PATH", "")},
        )

    def stop(self) -> None:
        """Kill every process started meanwhile that still runs, and its descendants."""
        if self._watchdog is None:
            return
        watchdog, self._watchdog = self._watchdog, None
        assert watchdog.stdin is not None
        watchdog.stdin.close()  # EOF: the watchdog kills what is left, then exits
        deadline = time.monotonic() + 30
        while watchdog.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if watchdog.poll() is None:
            watchdog.kill()
            watchdog.wait()


@contextlib.contextmanager
def children_contained() -> Iterator[Children]:
    """For the block, the temp files of this process (`tempfile`) and of every child it starts
    (`$TMPDIR`: pip's build environment and requirement files, the build backend's) go to a
    folder in the scratch folder, and no child outlives the block or this process: each
    inherits a mark in its environment, and a watchdog in its own session kills every marked
    process when the block ends or this process dies (a SIGKILL included).  A process group
    would not do: pip and the backend start their own children, and nothing is left to signal
    the group after a SIGKILL; PR_SET_PDEATHSIG reaches no grandchild."""
    folder = os.path.join(root(), "tmp")
    os.makedirs(folder, exist_ok=True)
    saved = {name: os.environ.get(name) for name in ("TMPDIR", MARK)}
    saved_tempdir = tempfile.tempdir
    children = Children(folder)
    children.start()
    os.environ["TMPDIR"] = folder
    os.environ[MARK] = folder
    tempfile.tempdir = folder
    try:
        yield children
    finally:
        tempfile.tempdir = saved_tempdir
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        children.stop()


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
                _remove_beside(path)
                shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


def _remove(pid: int) -> None:
    if os.getpid() == pid and pid in _SCRATCH:
        path, fd = _SCRATCH.pop(pid)
        _remove_beside(path)
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
