"""Building trees and commits without a work tree: scratch indexes, an in-memory tree model,
commits and objects serialized here and written in one git call."""

from __future__ import annotations

import hashlib
import os
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from patchkit import scratch
from patchkit.gitops.faults import GitError
from patchkit.gitops.repo import _LITERAL, Identity, Repo, _algorithm_of, verb


@verb
@contextmanager
def scratch_index(repo: Repo, tree: str) -> Iterator[dict[str, str]]:
    """A private index holding `tree`; yields the env that selects it."""
    path = scratch.new_path("index-")
    env = {"GIT_INDEX_FILE": path}
    try:
        read_tree_into(repo, env, tree)
        yield env
    finally:
        for leftover in (path, path + ".lock"):
            if os.path.exists(leftover):
                os.unlink(leftover)


@verb
def read_tree_into(repo: Repo, env: dict[str, str], treeish: str) -> None:
    """Reset a scratch index (from scratch_index) to `treeish`."""
    repo.run("read-tree", treeish, env=env)


@verb
def import_directory(repo: Repo, source: Path, message: str, who: Identity) -> str:
    """Commit every file under `source` (ignore rules off) as a parentless commit."""
    index = scratch.new_path("import-index-")
    env = {"GIT_INDEX_FILE": index, "GIT_WORK_TREE": str(source), **who.env()}
    try:
        repo.run("add", "--all", "--force", ".", env=env)
        tree = str(repo.run("write-tree", env=env)).strip()
        return str(repo.run("commit-tree", tree, "-m", message, env=env)).strip()
    finally:
        if os.path.exists(index):
            os.unlink(index)


@verb
def write_tree(repo: Repo, env: dict[str, str]) -> str:
    return str(repo.run("write-tree", env=env)).strip()


_PATHS_PER_CALL = 2000


@verb
def index_entries(
    repo: Repo, env: dict[str, str], paths: list[str]
) -> dict[str, tuple[str, str]] | None:
    """path -> (mode, blob id) of the scratch index's entries at exactly `paths` (paths it
    lacks are left out); None when one of them is unmerged."""
    found: dict[str, tuple[str, str]] = {}
    for start in range(0, len(paths), _PATHS_PER_CALL):
        chunk = paths[start : start + _PATHS_PER_CALL]
        out = bytes(
            repo.run("ls-files", "-s", "-z", "--", *chunk, env={**env, **_LITERAL}, binary=True)
        )  # fmt: skip
        for entry in out.split(b"\0"):
            meta, _, raw = entry.partition(b"\t")
            if not raw:
                continue
            mode, oid, stage = meta.decode().split(" ")
            if stage != "0":
                return None
            found[raw.decode("utf-8", "surrogateescape")] = (mode, oid)
    wanted = set(paths)
    return {path: entry for path, entry in found.items() if path in wanted}


class TreeModel:
    """The directories of a tree, kept in memory, that new trees are computed from: each
    change of a set of paths gives the new root tree's id and the tree objects it needs
    (serialized as git writes them: entries sorted by name, a folder's name compared with a
    trailing '/', folder mode 40000). No empty folder is kept, as the index never has one.
    """

    def __init__(self, dirs: dict[str, dict[str, tuple[str, str]]], algorithm: str) -> None:
        self.dirs = dirs  # folder ('' the root) -> name -> (mode, id)
        self.algorithm = algorithm

    @classmethod
    def read(cls, repo: Repo, treeish: str) -> TreeModel:
        """Every folder of `treeish`, read by one `ls-tree -r -t`."""
        out = bytes(repo.run("ls-tree", "-r", "-t", "-z", "--full-tree", treeish, binary=True))
        dirs: dict[str, dict[str, tuple[str, str]]] = {"": {}}
        oid = ""
        for entry in out.split(b"\0"):
            meta, _, raw = entry.partition(b"\t")
            if not raw:
                continue
            mode, kind, oid = meta.decode().split(" ")
            path = raw.decode("utf-8", "surrogateescape")
            parent, _, name = path.rpartition("/")
            if kind == "tree":
                mode = TREE_MODE
                dirs.setdefault(path, {})
            dirs.setdefault(parent, {})[name] = (mode, oid)
        return cls(dirs, _algorithm_of(oid))

    def change(
        self, changes: dict[str, tuple[str, str] | None]
    ) -> tuple[str, list[bytes], list[str]]:
        """Set each path to (mode, blob id), or remove it (None); returns the new root tree's
        id and the bodies and ids of the tree objects that changed, children first."""
        dirty: set[str] = {""}
        for path, entry in sorted(changes.items(), key=lambda item: item[1] is not None):
            parent, _, name = path.rpartition("/")
            if entry is None:  # removals first: a file may give way to a folder
                self.dirs.get(parent, {}).pop(name, None)
            else:
                self._make_folders(parent)
                self.dirs[parent][name] = entry
            while True:
                dirty.add(parent)
                if not parent:
                    break
                parent = parent.rpartition("/")[0]
        bodies, ids = [], []
        for folder in sorted(dirty, key=lambda d: -d.count("/") - bool(d)):
            entries = self.dirs.get(folder)
            if folder and not entries:  # an empty folder is not written
                self.dirs.pop(folder, None)
                up, _, name = folder.rpartition("/")
                if self.dirs.get(up, {}).get(name, ("",))[0] == TREE_MODE:
                    del self.dirs[up][name]
                continue
            body = _tree_body(entries or {})
            oid = hashlib.new(self.algorithm, b"tree %d\0" % len(body) + body).hexdigest()
            if folder:
                up, _, name = folder.rpartition("/")
                self.dirs[up][name] = (TREE_MODE, oid)
            bodies.append(body)
            ids.append(oid)
        return ids[-1], bodies, ids

    def _make_folders(self, folder: str) -> None:
        if folder in self.dirs:
            return
        up, _, name = folder.rpartition("/")
        self._make_folders(up)
        self.dirs[up][name] = (TREE_MODE, "")  # its id is set when the folder is written
        self.dirs[folder] = {}


TREE_MODE = "40000"


def _tree_body(entries: dict[str, tuple[str, str]]) -> bytes:
    def key(name: str) -> bytes:
        raw = name.encode("utf-8", "surrogateescape")
        return raw + b"/" if entries[name][0] == TREE_MODE else raw

    return b"".join(
        f"{entries[name][0]} ".encode()
        + name.encode("utf-8", "surrogateescape")
        + b"\0"
        + bytes.fromhex(entries[name][1])
        for name in sorted(entries, key=key)
    )


@verb
def commit_tree(repo: Repo, tree: str, parent: str | None, message: str, who: Identity) -> str:
    args = ["commit-tree", tree]
    if parent:
        args += ["-p", parent]
    out = repo.run(*args, "-F", "-", env=who.env(), stdin=message.encode())
    return str(out).strip()


@verb
def commit_chain(repo: Repo, base: str, commits: list[tuple[str, str, Identity]]) -> list[str]:
    """Write a first-parent chain of commits on `base`, one per (tree, message, identity),
    as `commit_tree` would one by one; returns their ids, oldest first.

    The commit objects are serialized here, as commit-tree does, and written together by
    `write_objects` (one `git unpack-objects --strict`: git format-checks each and writes it
    loose). Identities commit-tree would rewrite
    (ident.c strips "crud" and parses dates) go through commit-tree itself.
    """
    chain = chain_objects(base, commits)
    if chain is None:
        ids, parent = [], base
        for tree, message, who in commits:
            parent = commit_tree(repo, tree, parent, message, who)
            ids.append(parent)
        return ids
    ids, bodies = [oid for oid, _ in chain], [body for _, body in chain]
    write_objects(repo, "commit", bodies, ids)
    return ids


def chain_objects(
    base: str, commits: list[tuple[str, str, Identity]]
) -> list[tuple[str, bytes]] | None:
    """(id, bytes) of each commit of the chain `commit_chain` writes on `base`, serialized
    as commit-tree does; None when an identity is one commit-tree would rewrite."""
    if not all(_plain_identity(who) for _, _, who in commits):
        return None
    algorithm = _algorithm_of(base)
    out, parent = [], base
    for tree, message, who in commits:
        ident = f"{who.name} <{who.email}> {who.date}"
        body = (
            f"tree {tree}\nparent {parent}\nauthor {ident}\ncommitter {ident}\n\n{message}"
        ).encode()
        parent = hashlib.new(algorithm, b"commit %d\0" % len(body) + body).hexdigest()
        out.append((parent, body))
    return out


@verb
def write_objects(repo: Repo, kind: str, bodies: list[bytes], ids: list[str]) -> None:
    """Write objects of one kind, serialized here (`ids` their computed ids), as loose
    objects: one `git unpack-objects --strict` reads them as one undeltified pack stream
    from stdin (no file per object), hashes each, checks its format (fsck: a tree sorted,
    modes valid) and that every object it names exists, and writes it loose (the stream is
    never kept as a pack). Objects the repository has are skipped."""
    if not bodies:
        return
    algorithm = _algorithm_of(ids[0])
    for oid, body in zip(ids, bodies, strict=True):
        if (
            hashlib.new(algorithm, b"%s %d\0" % (kind.encode(), len(body)) + body).hexdigest()
            != oid
        ):
            raise GitError(["unpack-objects"], 0, f"a {kind} id does not name its bytes")
    type_code = _PACK_TYPES[kind]
    # stored (level 0) streams: git inflates them and compresses what it writes
    objects = [(type_code, len(body), zlib.compress(body, 0)) for body in bodies]
    stream = pack_of(objects, algorithm)
    repo.run("unpack-objects", "-q", "--strict", stdin=stream)


_PACK_TYPES = {"commit": 1, "tree": 2, "blob": 3, "tag": 4}


def pack_of(objects: list[tuple[int, int, bytes]], algorithm: str) -> bytes:
    """A version 2 pack of whole (undeltified) objects, each (type, size, zlib stream), as
    git's pack format writes them: per object a size-and-type header and the stream, then
    the pack's hash."""
    out = bytearray(b"PACK" + (2).to_bytes(4, "big") + len(objects).to_bytes(4, "big"))
    for type_code, size, stream in objects:
        byte = (type_code << 4) | (size & 0x0F)
        size >>= 4
        while size:
            out.append(byte | 0x80)
            byte = size & 0x7F
            size >>= 7
        out.append(byte)
        out += stream
    out += hashlib.new(algorithm, bytes(out)).digest()
    return bytes(out)


# ident.c's crud(): characters commit-tree strips from both ends of a name or an email.
_IDENT_CRUD = frozenset(".,:;<>\"\\'")


_PLAIN_DATE_RE = re.compile(r"^[1-9][0-9]{8,9} [+-](?:[01][0-9]|2[0-3])[0-5][0-9]$")


def _plain_identity(who: Identity) -> bool:
    """True when commit-tree would write `who` exactly as given: a name and an email with no
    crud at either end and no delimiter inside, a date in seconds since 1970 (9 or 10
    digits, which git reads as such) and a valid offset."""
    for part in (who.name, who.email):
        if not part or part[0] in _IDENT_CRUD or part[-1] in _IDENT_CRUD:
            return False
        if ord(part[0]) <= 32 or ord(part[-1]) <= 32 or any(c in part for c in "<>\n"):
            return False
    return bool(_PLAIN_DATE_RE.match(who.date)) and not who.date.endswith(" -0000")


SYMLINK_MODE = "120000"


def _entry_modes(repo: Repo, commit: str, paths: list[str]) -> dict[str, str]:
    """path -> mode of the tree entry (file, link or folder) each of `paths` names in
    `commit`, taken literally; paths it lacks are left out."""
    modes: dict[str, str] = {}
    # In chunks: the paths of a long series would overflow one command line.
    for start in range(0, len(paths), _PATHS_PER_CALL):
        chunk = paths[start : start + _PATHS_PER_CALL]
        out = str(repo.run("ls-tree", "-z", "--full-tree", commit, "--", *chunk, env=_LITERAL))
        for entry in out.split("\0"):
            meta, _, name = entry.partition("\t")
            if name:
                modes[name] = meta.split(" ", 1)[0]
    return modes


@verb
def blob_ids(repo: Repo, commit: str, paths: list[str]) -> dict[str, str]:
    """path -> the blob id each of `paths` has in `commit` (paths it lacks are left out)."""
    ids: dict[str, str] = {}
    for start in range(0, len(paths), _PATHS_PER_CALL):
        chunk = paths[start : start + _PATHS_PER_CALL]
        # --full-tree: paths from the root whatever the caller's folder; literal pathspecs.
        out = str(repo.run("ls-tree", "-z", "--full-tree", commit, "--", *chunk, env=_LITERAL))
        for entry in out.split("\0"):
            meta, _, name = entry.partition("\t")
            fields = meta.split(" ")
            if name and len(fields) == 3 and fields[1] == "blob":
                ids[name] = fields[2]
    return ids


@verb
def symlinks_along(repo: Repo, commit: str, paths: list[str]) -> dict[str, str]:
    """For each path, the first component (a parent, or the path itself) that is a symlink
    in `commit`; paths with none are left out."""
    prefixes: dict[str, list[str]] = {}
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            prefixes.setdefault("/".join(parts[:i]), []).append(path)
    if not prefixes:
        return {}
    links: dict[str, str] = {}
    for name, mode in _entry_modes(repo, commit, sorted(prefixes)).items():
        if mode != SYMLINK_MODE:
            continue
        for path in prefixes.get(name, []):
            if path not in links or len(name) < len(links[path]):
                links[path] = name
    return links


@verb
def tree_with_files(repo: Repo, commit: str, files: dict[str, bytes]) -> str:
    """The tree of `commit` with each path of `files` holding those bytes (mode kept; new
    files 100644); written to the object store, no work tree or ref touched."""
    modes = _entry_modes(repo, commit, sorted(files)) if files else {}
    with scratch_index(repo, commit) as env:
        for path, data in sorted(files.items()):
            blob = str(repo.run("hash-object", "-w", "--stdin", stdin=data)).strip()
            mode = modes.get(path, "100644")
            entry = f"{mode},{blob},{path}"
            repo.run("update-index", "--add", "--cacheinfo", entry, env=env)
        return write_tree(repo, env)


@verb
def empty_tree(repo: Repo) -> str:
    """The id of the empty tree in `repo`'s hash (what an unborn branch's checkout starts
    from)."""
    return str(repo.run("hash-object", "-t", "tree", "-w", "--stdin", stdin=b"")).strip()
