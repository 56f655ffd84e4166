"""An overlay directory: whole replacement files laid out like the installed package.

`overlay/sglang/srt/server_args.py` replaces `python/sglang/srt/server_args.py` of the SGLang
base (the target's sdist subdir is tried first, then the repository root). Backups (`*.bak`,
what `cp --backup` and hand edits leave) and byte-code caches are skipped, and the report says
which.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from patchkit.errors import UsageError
from patchkit.series import safe_repo_path

SKIPPED_SUFFIXES = (".bak", ".pyc")
SKIPPED_DIRS = ("__pycache__", ".git")
MAX_FILE_BYTES = 16 * 1024 * 1024


@dataclass
class Overlay:
    root: Path
    files: dict[str, bytes] = field(default_factory=dict)  # repository path -> new bytes
    skipped: list[str] = field(default_factory=list)  # overlay-relative paths left out
    new_files: list[str] = field(default_factory=list)

    def digest(self) -> str:
        """sha256 over the overlay's files (path and content), stable across machines."""
        h = hashlib.sha256()
        for path, data in sorted(self.files.items()):
            h.update(f"{path}\0{hashlib.sha256(data).hexdigest()}\n".encode())
        return h.hexdigest()


def read_overlay(root: Path, base_paths: set[str], subdir: str) -> Overlay:
    """Map every file under `root` to the base path it replaces (or adds)."""
    if not root.is_dir():
        raise UsageError(f"{root}: not a directory")
    overlay = Overlay(root)
    base_dirs = {p.rsplit("/", 1)[0] for p in base_paths if "/" in p}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for name in dirnames:  # os.walk lists a link to a folder here and never enters it
            if (Path(dirpath) / name).is_symlink():
                raise UsageError(
                    f"{Path(dirpath) / name}: a link to a folder (overlays hold plain files only)"
                )
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if name.endswith(SKIPPED_SUFFIXES):
                overlay.skipped.append(rel)
                continue
            if full.is_symlink() or not full.is_file():
                raise UsageError(f"{full}: not a regular file (overlays hold plain files only)")
            if full.stat().st_size > MAX_FILE_BYTES:
                raise UsageError(f"{full}: larger than {MAX_FILE_BYTES >> 20} MiB")
            safe_repo_path(str(root), rel)
            path = _base_path(rel, base_paths, base_dirs, subdir)
            if path is None:
                raise UsageError(
                    f"{full}: neither {subdir + '/' if subdir else ''}{rel} nor a directory for "
                    "it is in the base: the overlay is not laid out like the package",
                    hint="lay the files out as in site-packages (e.g. sglang/srt/...)",
                )
            if path not in base_paths:
                overlay.new_files.append(path)
            overlay.files[path] = full.read_bytes()
    if not overlay.files:
        raise UsageError(f"{root}: holds no file to import (only backups or nothing)")
    return overlay


def _base_path(rel: str, base_paths: set[str], base_dirs: set[str], subdir: str) -> str | None:
    candidates = [f"{subdir}/{rel}", rel] if subdir else [rel]
    for candidate in candidates:
        if candidate in base_paths:
            return candidate
    for candidate in candidates:
        if "/" in candidate and candidate.rsplit("/", 1)[0] in base_dirs:
            return candidate
    return None
