"""Importing a tree of files (an sdist's or a wheel's) as one parentless commit, written as
one pack: no files extracted to disk, no index, no `git add` of thousands of paths.

The blobs, trees and commit are serialized here as git writes them (the trees by
`TreeModel`, the commit as commit-tree writes it), so the commit id is the one
`import_directory` gives for the same files; git then checks and indexes the stream
(`index-pack --strict`: every object hashed, its format checked, what it names present).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable

from patchkit.gitops.faults import GitError
from patchkit.gitops.objects import hashed
from patchkit.gitops.repo import Identity, Repo, _hash_name, verb
from patchkit.gitops.trees import TreeModel, _plain_identity, commit_tree, pack_of

_BLOB, _TREE, _COMMIT = 3, 2, 1  # pack object types
FILE_MODE, EXECUTABLE_MODE = "100644", "100755"

# How many bytes of file contents an import holds uncompressed while it learns which
# objects the repository lacks (beyond it, each is compressed as it is read).
RAW_BUDGET = 128 << 20


@verb
def import_files(
    repo: Repo, files: Iterable[tuple[str, bool, bytes]], message: str, who: Identity
) -> str:
    """Commit `files` ((path, executable, bytes); a later path replaces an earlier one) as
    a parentless commit with `message` and `who`; returns its id. The objects the
    repository lacks are written as one new pack."""
    algorithm = _hash_name(repo)
    # id -> (size, bytes, compressed?): kept as they are up to RAW_BUDGET bytes (compressed
    # later only if the repository lacks them), compressed at once beyond it
    blobs: dict[str, tuple[int, bytes, bool]] = {}
    changes: dict[str, tuple[str, str]] = {}
    raw = 0
    for path, executable, data in files:
        oid = hashlib.new(algorithm, b"blob %d\0" % len(data) + data).hexdigest()
        if oid not in blobs:
            keep = raw + len(data) <= RAW_BUDGET
            raw += len(data) if keep else 0
            blobs[oid] = (len(data), data if keep else zlib.compress(data, 1), not keep)
        changes[path] = (EXECUTABLE_MODE if executable else FILE_MODE, oid)
    if not changes:
        raise GitError(["import"], 0, "no file to import")
    root, tree_bodies, tree_ids = TreeModel({"": {}}, algorithm).change(changes)
    objects = [(oid, _BLOB, *blob) for oid, blob in blobs.items()]
    objects += [
        (oid, _TREE, len(body), body, False)
        for oid, body in zip(tree_ids, tree_bodies, strict=True)
    ]
    commit = None
    if _plain_identity(who):
        ident = f"{who.name} <{who.email}> {who.date}"
        text = message if message.endswith("\n") else message + "\n"
        body = f"tree {root}\nauthor {ident}\ncommitter {ident}\n\n{text}".encode()
        commit = hashlib.new(algorithm, b"commit %d\0" % len(body) + body).hexdigest()
        objects.append((commit, _COMMIT, len(body), body, False))
    held = _present(repo, [oid for oid, *_ in objects])
    new = [obj for obj in objects if obj[0] not in held]
    # compressed only when missing: a release shares most of its files with the one before
    missing = [(kind, size, data if packed else zlib.compress(data, 1))
               for _, kind, size, data, packed in new]  # fmt: skip
    if missing:
        repo.run("index-pack", "--stdin", "--strict", stdin=pack_of(missing, algorithm))
        hashed(repo, (oid for oid, *_ in new))
    if commit is None:  # an identity commit-tree would rewrite: let it write the commit
        commit = commit_tree(repo, root, None, message, who)
    return commit


def _present(repo: Repo, ids: list[str]) -> set[str]:
    """Which of `ids` the repository holds (one `cat-file --batch-check`)."""
    stdin = "".join(f"{oid}\n" for oid in ids).encode()
    out = str(repo.run("cat-file", "--batch-check=%(objectname)", stdin=stdin))
    return {line for line in out.split("\n") if line and not line.endswith(" missing")}
