"""The mirror's integrity signature: the packs and the base's loose objects, found by looking
each base object up (not by listing every loose object of the mirror)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

from helpers import git

from patchkit import gitops
from patchkit.upstream.mirror import Mirror


def _mirror(tmp_path: Path) -> tuple[Mirror, str]:
    work = tmp_path / "work"
    (work / "d").mkdir(parents=True)
    for i in range(5):
        (work / "d" / f"f{i}.txt").write_text(f"{i}\n")
    git(tmp_path, "init", "-q", str(work))
    git(work, "add", "-A")
    git(work, "commit", "-qm", "base")
    mirror = Mirror(SimpleNamespace(name="t"), tmp_path / "cache")  # type: ignore[arg-type]
    mirror.path.parent.mkdir(parents=True)
    git(tmp_path, "clone", "-q", "--bare", "--no-local", str(work), str(mirror.path))
    git(mirror.path, "repack", "-a", "-d", "-q")
    return mirror, git(mirror.path, "rev-parse", "HEAD").strip()


def _by_listing(mirror: Mirror, commit: str) -> str:
    """The signature as computed before: every loose object listed, then the base's kept."""
    digest = hashlib.sha256()
    objects = mirror.path / "objects"
    files = sorted((objects / "pack").glob("pack-*"))
    loose = {
        f"{entry.name}{name}"
        for entry in os.scandir(objects)
        if len(entry.name) == 2 and entry.is_dir()
        for name in os.listdir(entry.path)
    }
    if loose:
        wanted = loose.intersection(gitops.object_ids(mirror.repo, commit))
        files += [objects / oid[:2] / oid[2:] for oid in sorted(wanted)]
    for path in files:
        st = os.stat(path)
        digest.update(
            f"{path.relative_to(objects)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode()
        )
    return digest.hexdigest()


def _unpack_loose(mirror: Mirror) -> None:
    """Every packed object made loose (the pack removed): the base is then all loose."""
    for pack in sorted((mirror.path / "objects" / "pack").glob("pack-*.pack")):
        moved = pack.with_name("moved.pack")
        pack.rename(moved)
        pack.with_suffix(".idx").unlink()
        with moved.open("rb") as fh:
            subprocess.run(
                ["git", "--git-dir", str(mirror.path), "unpack-objects", "-q"], stdin=fh, check=True
            )
        moved.unlink()


def test_signature_is_the_listing_one_and_ignores_other_loose_objects(tmp_path):
    mirror, base = _mirror(tmp_path)
    packed_only = mirror._objects_signature(base)
    assert packed_only == _by_listing(mirror, base)
    blob = subprocess.run(
        ["git", "--git-dir", str(mirror.path), "hash-object", "-w", "--stdin"],
        input=b"a series object, not the base's\n",
        check=True,
        capture_output=True,
    )
    assert blob.returncode == 0
    assert mirror._objects_signature(base) == packed_only  # a new loose object: no change
    _unpack_loose(mirror)
    loose = mirror._objects_signature(base)
    assert loose != packed_only and loose == _by_listing(mirror, base)
    # A base object's file replaced (same bytes, a new file) changes the signature.
    tree = git(mirror.path, "rev-parse", f"{base}^{{tree}}").strip()
    path = mirror.path / "objects" / tree[:2] / tree[2:]
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)
    assert mirror._objects_signature(base) not in (loose, packed_only)
    assert mirror._objects_signature(base) == _by_listing(mirror, base)


def test_the_mirror_sweep_leaves_loose_temporaries_alone(tmp_path):
    mirror, _ = _mirror(tmp_path)
    in_flight = mirror.path / "objects" / "ab" / "tmp_obj_Xy12"
    in_flight.parent.mkdir(exist_ok=True)
    in_flight.write_bytes(b"being written")
    stale = mirror.path / "objects" / "pack" / "tmp_pack_Zz99"
    stale.write_bytes(b"killed")
    mirror.sweep()
    assert in_flight.exists() and not stale.exists()
    assert in_flight in gitops.stale_lock_files(mirror.repo)
    assert in_flight not in gitops.stale_lock_files(mirror.repo, loose_temporaries=False)
