"""`gitops.import_files`: a tree of files committed as one pack gives the commit
`import_directory` (git add + write-tree + commit-tree of the files on disk) gives."""

from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path

import pytest
from helpers import git

from patchkit import gitops

WHO = gitops.Identity("patchkit import", "import@patchkit.invalid", "1700000000 +0000")
FILES = {
    "python/pkg/__init__.py": (False, b""),
    "python/pkg/a.py": (False, b"print('a')\n"),
    "python/pkg/a-b.py": (False, b"same\n"),
    "python/pkg/a.b/c.py": (False, b"same\n"),  # one blob under two paths
    "python/pkg/a/z.py": (True, b"#!/bin/sh\n"),  # a folder sorts as 'a/', after 'a.b'
    "python/tools/run.sh": (True, b"#!/bin/sh\necho \xff\n"),
    "python/caf\u00e9.txt": (False, b"utf-8 name\n"),
}


def _bare(path: Path) -> gitops.Repo:
    git(path.parent, "init", "--quiet", "--bare", path.name)
    return gitops.Repo.bare_at(path)


@pytest.mark.parametrize("budget", [128 << 20, 12], ids=["held-raw", "compressed-as-read"])
def test_the_same_commit_as_git_add_of_the_files(tmp_path, monkeypatch, budget):
    """Whether a file's bytes are held as read or compressed at once (past the import's
    budget of uncompressed bytes), the objects and the commit are the same."""
    monkeypatch.setattr("patchkit.gitops.imports.RAW_BUDGET", budget)
    tree = tmp_path / "tree"
    for name, (executable, data) in FILES.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o755 if executable else 0o644)
    message = "Import x\n\nPatchkit-Wheel: x.whl\n"
    expected = gitops.import_directory(_bare(tmp_path / "old.git"), tree, message, WHO)
    repo = _bare(tmp_path / "new.git")
    entries = [(name, x, data) for name, (x, data) in FILES.items()]
    assert gitops.import_files(repo, entries, message, WHO) == expected
    assert git(tmp_path / "new.git", "fsck", "--strict", "--no-dangling").strip() == ""
    packs = list((tmp_path / "new.git" / "objects" / "pack").glob("pack-*.pack"))
    assert len(packs) == 1  # one pack, no loose object
    # A second import sharing most blobs writes a pack of only what is new.
    entries.append(("python/pkg/new.py", False, b"new\n"))
    second = gitops.import_files(repo, entries, message, WHO)
    count = git(tmp_path / "new.git", "count-objects", "-v")
    assert "\ncount: 0\n" in "\n" + count and second != expected
    newest = max(
        (tmp_path / "new.git" / "objects" / "pack").glob("pack-*.idx"), key=os.path.getmtime
    )
    listed = git(tmp_path / "new.git", "verify-pack", "-v", str(newest))
    assert listed.count(" blob ") == 1  # new.py alone; the trees above it and the commit
    assert git(tmp_path / "new.git", "fsck", "--strict", "--no-dangling").strip() == ""


def _asked(monkeypatch) -> list[str]:
    """The object ids `corrupt_objects` reads back from now on (its one `cat-file --batch`)."""
    from patchkit.gitops import objects

    asked: list[str] = []
    real = objects._read_batch

    def read(repo, names):
        asked.extend(names)
        return real(repo, names)

    monkeypatch.setattr(objects, "_read_batch", read)
    return asked


def test_the_check_after_an_import_reads_only_what_no_one_hashed(tmp_path, monkeypatch):
    """What `index-pack --strict` wrote, and what a clean check read, is not read again by
    the next check in the process; an object the repository already held (here a tampered
    one, whose id the import's files name) is read and found, not taken on the import's word."""
    repo = _bare(tmp_path / "m.git")
    entries = [(name, x, data) for name, (x, data) in FILES.items()]
    first = gitops.import_files(repo, entries, "Import 1\n", WHO)
    asked = _asked(monkeypatch)
    assert gitops.corrupt_objects(repo, first) == [] and asked == []
    # a blob of the next release, planted beforehand with other bytes under its id
    data = b"print('the next release')\n"
    oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    loose = tmp_path / "m.git" / "objects" / oid[:2] / oid[2:]
    loose.parent.mkdir(exist_ok=True)
    evil = b"print('planted')\n"
    loose.write_bytes(zlib.compress(b"blob %d\0" % len(evil) + evil))
    second = gitops.import_files(repo, [*entries, ("python/pkg/b.py", False, data)], "2\n", WHO)
    assert gitops.corrupt_objects(repo, second) == [oid]
    assert gitops.corrupt_objects(repo, second) == [oid]  # a check that failed vouches for none
    assert oid in asked and not set(asked) & set(gitops.object_ids(repo, first))
