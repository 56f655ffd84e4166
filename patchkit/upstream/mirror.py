"""Per-target bare mirrors in the cache: creation, sweeping, object integrity and the records
of the imports they hold."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import gitops
from patchkit.errors import DamagedBaseError
from patchkit.locks import sweep_dead_temp_files
from patchkit.project import cache_root
from patchkit.scratch import signals_held
from patchkit.stamps import Stamp
from patchkit.targets import Target

# The refs under which the mirror keeps its imports of a release's sdist or pinned wheel.
SDIST_REF = "refs/patchkit/sdist/{version}"
WHEEL_REF = "refs/patchkit/wheel/{version}"


@dataclass
class Mirror:
    """A per-target bare repository in the cache."""

    target: Target
    root: Path = field(default_factory=cache_root)

    @property
    def path(self) -> Path:
        return self.root / "mirrors" / f"{self.target.name}.git"

    @property
    def repo(self) -> gitops.Repo:
        """The mirror as the bare repository every git verb of it is given."""
        return gitops.Repo.bare_at(self.path)

    @property
    def lock_path(self) -> Path:
        return self.root / "locks" / f"mirror-{self.target.name}.lock"

    def ensure(self) -> gitops.Repo:
        """Create the mirror (atomically: init off to the side, then rename) if it is missing."""
        if not (self.path / "HEAD").is_file():
            scratch = self.root / "tmp"
            scratch.mkdir(parents=True, exist_ok=True)
            tmp = None
            try:
                with signals_held():  # made and then removed, or not made
                    tmp = Path(tempfile.mkdtemp(dir=scratch, prefix=f"init-{self.target.name}-"))
                gitops.init_bare(tmp / "repo")
                shutil.rmtree(self.path, ignore_errors=True)  # no HEAD: a torn pre-rename init
                self.path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp / "repo", self.path)
            finally:
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
        return self.repo

    def sweep(self) -> None:
        """Remove what a killed holder of the mirror lock left: scratch dirs, partial downloads,
        git's lock files and temporary packs (refs and packs are written only under the lock).

        Loose objects are not only written under the lock: apply, status, rebase and review
        build the series in the mirror (blobs, trees and commits, each written by git to a
        `tmp_obj_*` file and renamed) while another process may hold the lock. Their temporary
        files are left alone: one may be in flight, and a killed writer's is never read (git
        gc expires them)."""
        scratch = self.root / "tmp"
        for prefix in (f"import-{self.target.name}-", f"init-{self.target.name}-"):
            for stale in scratch.glob(f"{prefix}*") if scratch.is_dir() else ():
                shutil.rmtree(stale, ignore_errors=True)
        for folder in (self.root / "sdists", self.root / "wheels"):
            # shared by every target: another run may be downloading there (it holds an flock)
            sweep_dead_temp_files(folder, ".*.download-*")
        if self.path.is_dir():
            for lock in gitops.stale_lock_files(self.repo, loose_temporaries=False):
                lock.unlink(missing_ok=True)

    def _objects_signature(self, commit: str) -> str:
        """Identity of the files holding `commit`'s objects: every pack (git never rewrites a
        pack in place) and those of the base's objects that are loose; any replacement or
        rewrite of one of them changes it."""
        digest = hashlib.sha256()
        objects = self.path / "objects"
        files = sorted((objects / "pack").glob("pack-*"))
        if _any_loose(objects):
            # Each of the base's objects looked up where it would be loose: the mirror's other
            # loose objects (every series build writes some) are never listed.
            # (an object loose then and packed since is skipped below, as if not listed)
            loose = sorted(gitops.loose_objects_of(self.repo, commit))
            files += [objects / o[:2] / o[2:] for o in loose]
        for path in files:
            try:
                st = os.stat(path)
            except FileNotFoundError:  # not loose (packed), or packed and pruned meanwhile
                continue
            # not ctime: hard-linked clones of the mirror change it without touching a byte
            digest.update(
                f"{path.relative_to(objects)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode()
            )
        return digest.hexdigest()

    def check_objects(self, commit: str) -> None:
        """Refuse a base whose objects in the mirror no longer hash to their ids.

        The full re-hash runs once per state of the object files; while no object file has
        changed since the last clean check, the recorded verdict stands.
        """
        alternates = self.path / "objects" / "info" / "alternates"
        if alternates.is_file() and alternates.read_bytes().strip():
            raise DamagedBaseError(
                f"the {self.target.name} mirror reads objects of another repository "
                f"({alternates}); a mirror must hold its own; refusing",
                hint=f"remove {self.path} and run again to fetch or import it afresh",
            )
        stamp = Stamp(
            self.root / "verified" / f"{self.target.name}-{commit}", self._objects_signature(commit)
        )
        if stamp.holds():
            return
        try:
            bad = gitops.corrupt_objects(self.repo, commit)
        except gitops.GitError as exc:
            bad = [first_line(str(exc))]
        if bad:
            raise DamagedBaseError(
                f"the {self.target.name} mirror is damaged or tampered: {len(bad)} object(s) of "
                f"{commit[:12]} do not match their hash (first: {bad[0][:40]}); refusing",
                hint=f"remove {self.path} and run again to fetch or import it afresh",
            )
        stamp.record()


def _any_loose(objects: Path) -> bool:
    """True when a loose-object folder holds an entry (stops at the first one); a folder that
    vanished (packed and pruned by a git process still running, e.g. orphaned by a killed
    patchkit) holds none."""
    for entry in os.scandir(objects):
        if len(entry.name) == 2 and entry.is_dir():
            try:
                with os.scandir(entry.path) as names:
                    if next(names, None) is not None:
                        return True
            except FileNotFoundError:
                continue
    return False


def first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line.removeprefix("fatal: ")
    return text.strip()


def import_fields(message: str) -> dict[str, str]:
    """The `Patchkit-*` fields an import commit (of an sdist or a wheel) records about itself."""
    return dict(re.findall(r"^(Patchkit-[A-Za-z0-9-]+): (.*)$", message, re.M))


def wheel_fields(message: str) -> dict[str, str]:
    """The `Patchkit-Wheel-*` fields of a wheel import commit (empty for other commits)."""
    fields = import_fields(message)
    return fields if "Patchkit-Wheel" in fields else {}
