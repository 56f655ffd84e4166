"""The cache on another file system than the work tree (a Docker cache mount, /home vs /data):
apply into a new directory and onto an existing checkout, export and rebase all work; no pack
is hard-linked or renamed across devices, nothing is left in the mirror, and a damaged mirror
pack damages no checkout made from it. The second file system is a tmpfs mounted by the test
(root only; skips cleanly where mounting is not permitted)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from reliability_support import (
    cache_problems,
    checkout_problems,
    cli,
    git_ok,
    leftovers,
    make_project,
    make_toy,
    record,
    rev,
)

SECTION = "cache on another file system (tests/reliability/test_cross_fs.py)"


@pytest.fixture
def tmpfs(tmp_path):
    """A tmpfs mounted for this test only (skips where mount is not permitted)."""
    where = tmp_path / "tmpfs"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _packs(repo_objects) -> list:
    return sorted((repo_objects / "pack").glob("pack-*"))


def _mirror_leftovers(cache) -> list[str]:
    mirror = cache / "mirrors" / "toy.git" / "objects"
    return [str(p) for p in mirror.rglob("tmp_*")] + [str(p) for p in mirror.glob("incoming-*")]


@pytest.mark.parametrize("cache_on", ["tmpfs", "disk"])
def test_apply_export_across_file_systems(tmp_path, tmpfs, cache_on):
    toy = make_toy(tmp_path / "toy")
    cache = (tmpfs if cache_on == "tmpfs" else tmp_path) / "cache"
    work = tmp_path / "work" if cache_on == "tmpfs" else tmpfs / "work"
    work.mkdir()
    assert os.stat(cache.parent).st_dev != os.stat(work).st_dev
    env = {**toy.env, "PATCHKIT_CACHE": str(cache)}
    # a new directory, from a cold cache
    into = work / "wt"
    done = cli("apply", "--target", "toy", "--into", str(into), env=env)
    assert done.returncode == 0, done.stderr
    result = rev(into, "HEAD")
    assert not checkout_problems(into, {result})
    # onto an existing checkout (made by an older series), warm cache
    older = tmp_path / "project-v1"
    make_project(older, toy.upstream, toy.base, dict(list(toy.patches.items())[:2]))
    existing = work / "existing"
    done = cli(
        "apply", "--target", "toy", "--into", str(existing),
        env={**env, "PATCHKIT_PROJECT": str(older)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = cli("apply", "--target", "toy", "--into", str(existing), env=env)
    assert done.returncode == 0, done.stderr
    assert rev(existing, "HEAD") == result
    # export from it into a directory on the cache's file system
    out = cache.parent / "exported"
    done = cli("export", str(existing), "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert len(list(out.glob("*.patch"))) == len(toy.patches)
    # no inode shared with the mirror, nothing left in it
    mirror = cache / "mirrors" / "toy.git" / "objects"
    mirror_inodes = {(os.stat(p).st_dev, os.stat(p).st_ino) for p in _packs(mirror)}
    for tree in (into, existing):
        for pack in _packs(tree / ".git" / "objects"):
            st = os.stat(pack)
            assert (st.st_dev, st.st_ino) not in mirror_inodes and st.st_nlink == 1, pack
    assert not _mirror_leftovers(cache)
    assert not cache_problems(cache)
    assert not leftovers(work, "wt", cache)
    record(
        SECTION,
        f"cache on {cache_on}, work tree on {'disk' if cache_on == 'tmpfs' else 'tmpfs'}: "
        "new checkout, existing checkout and export succeeded; 0 packs shared with the "
        "mirror, 0 tmp_pack_* left in it",
    )


def test_damaged_mirror_pack_damages_no_checkout(tmp_path):
    """Checkouts own their objects: flipping bytes of the mirror's pack leaves them intact."""
    toy = make_toy(tmp_path / "toy")
    into = tmp_path / "wt"
    assert cli("apply", "--target", "toy", "--into", str(into), env=toy.env).returncode == 0
    mirror = toy.cache / "mirrors" / "toy.git"
    packs = [p for p in _packs(mirror / "objects") if p.suffix == ".pack"]
    assert packs, "the toy mirror holds a pack"
    for pack in packs:
        pack.chmod(0o644)
        data = bytearray(pack.read_bytes())
        for i in range(200, len(data) - 40, 97):
            data[i] ^= 0xFF
        pack.write_bytes(bytes(data))  # in place: what disk damage does
    assert not git_ok(mirror, "fsck", "--no-dangling", "--no-progress", bare=True)
    assert git_ok(into, "fsck", "--no-dangling", "--no-progress", "--full")
    shutil.rmtree(mirror)  # the next run re-fetches; the checkout is not involved
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert done.returncode == 3, done.stderr
