"""Replacing a file whole: the one way patchkit writes a file a user may read."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

TMP_MARK = ".patchkit-tmp-"  # in the names of the temporary files below, and only theirs


def replace_file(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write `data` to `path` in one rename: the bytes go to a new file beside it (created
    with O_EXCL under a random name, so never into an existing file nor through a link
    planted at a predictable name), which then replaces `path`; on any failure the
    temporary file is removed.  It is named `.<name>.patchkit-tmp-*`: what a killed writer
    left is found by `leftovers`.  `durable`: synced to disk before the rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{TMP_MARK}")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; these are ordinary files
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def leftovers(path: Path) -> list[Path]:
    """The temporary files a killed `replace_file(path, ...)` left beside `path`."""
    prefix = f".{path.name}{TMP_MARK}"
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    return [path.parent / n for n in names if n.startswith(prefix)]


def within(path: Path, folder: Path) -> bool:
    """Whether `path` is `folder` or lies below it, links resolved on both sides."""
    where, top = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return where == top or top in where.parents


def digest(path: Path) -> str | None:
    """What `path` holds, to tell later whether it changed: the sha256 of a file's bytes, a
    link's target, the kind of anything else (never opened: a FIFO would block); None when
    there is nothing there."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return f"link:{os.readlink(path)}"
    if not stat.S_ISREG(info.st_mode):
        return f"mode:{stat.S_IFMT(info.st_mode):o}"
    try:
        return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:  # removed between the two looks
        return None
