"""PATCHKIT_CACHE on /dev/shm (a tmpfs on Linux and in containers: another device than the work
tree) with every verb that reads or writes the cache: fetch from a cold cache, apply into a
new directory and onto an existing checkout, export, a rebase that leaves a conflict tree,
and a wheel build.  No `Invalid cross-device link`, nothing shared with the mirror, and no
`tmp_pack_*`, temp file or scratch directory left in the mirror, the cache or beside a target.

Unlike test_cross_fs.py this needs no mount (no root): it skips only where /dev/shm is missing
or on the work tree's own device.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import pytest
from reliability_support import (
    cache_problems,
    checkout_problems,
    cli,
    make_project,
    record,
    rev,
)
from test_reliability_build import build_args, make_buildable_toy
from test_reliability_conflict_tree import toy_with_conflicting_release

from patchkit.wheels.reproducible import check_record

SECTION = "cache on /dev/shm, work tree on disk (tests/reliability/test_reliability_cross_fs.py)"


@pytest.fixture
def shm_cache(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    if os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the work tree's device")
    where = Path(tempfile.mkdtemp(dir=shm, prefix="pk-test-cache-"))
    try:
        yield where / "cache"
    finally:
        shutil.rmtree(where, ignore_errors=True)


def cache_leftovers(cache: Path) -> list[str]:
    """Temp files and scratch a finished run must not leave anywhere in the cache."""
    found = []
    for path in cache.rglob("*"):
        name = path.name
        if (
            name.startswith(("tmp_pack_", "tmp_idx_", "tmp_obj_", "incoming-"))
            or (name.endswith((".tmp", ".lock")) and "locks" not in path.parts)
            or ".download-" in name
            or ".patchkit-" in name
        ):
            found.append(str(path.relative_to(cache)))
    tmp = cache / "tmp"
    if tmp.exists():
        found += [f"tmp/{p.name}" for p in tmp.iterdir()]
    return found


def shared_packs(cache: Path, trees: list[Path]) -> list[str]:
    mirror_inodes = {
        (p.stat().st_dev, p.stat().st_ino) for p in (cache / "mirrors").rglob("pack-*")
    }
    shared = []
    for tree in trees:
        for pack in (tree / ".git" / "objects" / "pack").glob("pack-*"):
            st = pack.stat()
            if (st.st_dev, st.st_ino) in mirror_inodes or st.st_nlink != 1:
                shared.append(str(pack))
    return shared


def test_apply_export_rebase_with_the_cache_on_dev_shm(tmp_path, shm_cache):
    toy = toy_with_conflicting_release(tmp_path / "toy")
    env = {**toy.env, "PATCHKIT_CACHE": str(shm_cache)}
    work = tmp_path / "work"
    work.mkdir()
    assert os.stat(shm_cache.parent).st_dev != os.stat(work).st_dev
    done = cli("fetch", "--target", "toy", env=env)
    assert done.returncode == 0, done.stderr
    into = work / "wt"
    done = cli("apply", "--target", "toy", "--into", str(into), env=env)
    assert done.returncode == 0, done.stderr
    result = rev(into, "HEAD")
    assert not checkout_problems(into, {result})
    older = tmp_path / "project-v1"
    make_project(older, toy.upstream, toy.base, dict(list(toy.patches.items())[:2]))
    existing = work / "existing"
    done = cli("apply", "--target", "toy", "--into", str(existing),
               env={**env, "PATCHKIT_PROJECT": str(older)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = cli("apply", "--target", "toy", "--into", str(existing), env=env)
    assert done.returncode == 0, done.stderr
    assert rev(existing, "HEAD") == result
    out = work / "exported"
    done = cli("export", str(existing), "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert len(list(out.glob("*.patch"))) == len(toy.patches)
    done = cli("rebase", "--target", "toy@v1.1", "--conflict-tree", env=env)
    tree = toy.project / "work" / "rebase" / "toy"
    assert done.returncode == 1 and (tree / ".git" / "patchkit-rebase.json").is_file(), done.stderr
    assert "cross-device" not in done.stderr
    assert not shared_packs(shm_cache, [into, existing, tree])
    assert not cache_problems(shm_cache)
    assert not cache_leftovers(shm_cache), cache_leftovers(shm_cache)
    # beside each target only its lock file (an flock, never stale) stays
    assert not [p for p in work.iterdir() if ".patchkit" in p.name and p.suffix != ".lock"]
    record(
        SECTION,
        "fetch (cold cache), apply into a new directory, apply onto an existing checkout, "
        "export, rebase --conflict-tree: all succeeded; 0 packs shared with the mirror, "
        "0 tmp_pack_*/temp files/scratch left in the cache",
    )


def test_wheel_build_with_the_cache_on_dev_shm(tmp_path, shm_cache):
    toy = make_buildable_toy(tmp_path / "toy")
    env = {**toy["env"], "PATCHKIT_CACHE": str(shm_cache)}
    out = tmp_path / "dist"
    done = cli(*build_args(out), env=env)
    assert done.returncode == 0, done.stderr
    [wheel] = out.glob("*.whl")
    assert not check_record(wheel)
    with zipfile.ZipFile(wheel) as zf:
        assert "toy/added.py" in zf.namelist()
    again = cli(*build_args(out), env=env)  # warm cache, the previous build moved aside
    assert again.returncode == 0, again.stderr
    assert [p.name for p in out.iterdir()] == [wheel.name]
    assert not cache_problems(shm_cache)
    assert not cache_leftovers(shm_cache), cache_leftovers(shm_cache)
    record(
        SECTION,
        "patchkit build (cold, then warm cache): the same complete wheel, 0 temp files in the "
        "out directory or the cache",
    )
