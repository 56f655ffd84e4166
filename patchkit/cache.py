"""What the cache holds, and pruning it.

Every series build writes its trees and commits into the mirror as loose objects that no ref
names: a checkout copies what it needs (it shares no file with the mirror), lint's stamps and
the review keep no object, so once a build is done nothing depends on them and a later build
writes them again. They are what grows. `prune` removes the unreferenced loose objects older
than a cut-off (git's own `git prune --expire`, under the mirror's lock); packs, refs, the
bases (every base is named by a ref) and downloads are never touched, so the mirrors' integrity
stamps stay valid. The cut-off keeps the objects of a build running meanwhile (builds write
outside the mirror lock).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import gitops
from patchkit.errors import UsageError
from patchkit.locks import locked

DEFAULT_DAYS = 14.0  # git gc's own default for unreachable objects
MIN_DAYS = 1 / 24  # an hour: no build takes that long, so none loses its objects mid-way


@dataclass
class MirrorUsage:
    name: str
    path: Path
    packs: int = 0
    pack_bytes: int = 0
    loose: int = 0
    loose_bytes: int = 0
    unreferenced: int = 0  # loose objects no ref reaches
    prunable: int = 0  # of those, older than the cut-off
    prunable_bytes: int = 0
    pruned: int = 0
    pruned_bytes: int = 0

    def to_json(self) -> dict:
        out = {k: v for k, v in vars(self).items() if k != "path"}
        return {**out, "path": str(self.path)}


@dataclass
class CacheReport:
    root: Path
    older_than_days: float
    prune: bool
    mirrors: list[MirrorUsage] = field(default_factory=list)
    download_bytes: int = 0

    def to_json(self) -> dict:
        return {
            "root": str(self.root),
            "older_than_days": self.older_than_days,
            "prune": self.prune,
            "mirrors": [m.to_json() for m in self.mirrors],
            "download_bytes": self.download_bytes,
        }


def survey(
    root: Path, *, older_than_days: float = DEFAULT_DAYS, prune: bool = False
) -> CacheReport:
    """Sizes of the cache at `root`, and with `prune` its mirrors' old unreferenced objects
    removed."""
    if not math.isfinite(older_than_days):
        raise UsageError(f"--older-than {older_than_days}: give a number of days")
    if older_than_days < MIN_DAYS:
        raise UsageError(
            f"--older-than {older_than_days:g} is under an hour: a build running now could lose "
            "its objects",
            hint="pass a number of days of at least 0.042 (one hour); the default is 14",
        )
    report = CacheReport(root, older_than_days, prune)
    cutoff = time.time() - older_than_days * 86400
    mirrors = root / "mirrors"
    # patchkit makes its mirrors folder in place: a link leads to someone's repositories
    listed = mirrors.is_dir() and not mirrors.is_symlink()
    for path in sorted(mirrors.glob("*.git")) if listed else []:
        if path.is_symlink() or not (path / "HEAD").is_file():
            continue  # patchkit makes its mirrors in place: a link leads to someone's repository
        name = path.name[: -len(".git")]
        repo = gitops.Repo.bare_at(path)
        if not prune:  # reading only: no lock, so a read-only cache can be shown
            report.mirrors.append(_mirror(repo, name, cutoff, prune))
            continue
        with locked(root / "locks" / f"mirror-{name}.lock", f"the {name} mirror"):
            report.mirrors.append(_mirror(repo, name, cutoff, prune))
    report.download_bytes = sum(
        _size(p) for folder in ("sdists", "wheels") for p in _files(root / folder)
    )
    return report


def _mirror(repo: gitops.Repo, name: str, cutoff: float, prune: bool) -> MirrorUsage:
    usage = MirrorUsage(name, repo.path)
    objects = repo.path / "objects"
    for pack in _files(objects / "pack"):
        if pack.name.startswith("pack-") and pack.suffix == ".pack":
            usage.packs += 1
            usage.pack_bytes += _size(pack)
    loose = {}
    for folder in _files(objects):
        if len(folder.name) == 2 and folder.is_dir():
            for entry in _files(folder):
                if gitops.HEX_ID_RE.match(folder.name + entry.name):  # not tmp_obj_* files
                    loose[folder.name + entry.name] = entry
    usage.loose = len(loose)
    usage.loose_bytes = sum(_size(p) for p in loose.values())
    unreferenced = [oid for oid in gitops.unreachable_loose_objects(repo) if oid in loose]
    usage.unreferenced = len(unreferenced)
    old = {loose[oid]: _size(loose[oid]) for oid in unreferenced if _mtime(loose[oid]) < cutoff}
    usage.prunable, usage.prunable_bytes = len(old), sum(old.values())
    if prune and old:
        gitops.prune_unreachable(repo, cutoff)
        gone = [p for p in old if not p.exists()]
        usage.pruned, usage.pruned_bytes = len(gone), sum(old[p] for p in gone)
    return usage


def _files(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")
