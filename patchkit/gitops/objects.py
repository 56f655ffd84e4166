"""The object store: mirrors' packs and loose objects, clones that share no file with their
mirror, and the integrity checks (object listings, re-hashing, a killed git's leftovers)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import zlib
from collections.abc import Iterable
from pathlib import Path

from patchkit.gitops.faults import DamagedObjectError, GitError
from patchkit.gitops.refs import _read_batch, update_refs
from patchkit.gitops.repo import Repo, _algorithm_of, _hash_name, verb


def init_bare(path: Path) -> Repo:
    """Create a bare mirror repository (no-op when it exists); returns it."""
    repo = Repo.bare_at(path)
    if not (path / "HEAD").is_file():
        path.mkdir(parents=True, exist_ok=True)
        repo.run("init", "--bare", "--quiet", str(repo.path))
    return repo


def is_repository(repo: Repo) -> bool:
    """True when a repository of `repo`'s kind is at its path (git reads it as one)."""
    marker = repo.path / ("HEAD" if repo.bare else ".git")
    return marker.exists() and repo.ok("rev-parse", "--git-dir")


def _init_checkout(dest: Path) -> Repo:
    """An empty work tree at `dest` (its parent folder exists)."""
    Repo.checkout(dest.parent).run("init", "--quiet", "--", str(dest))
    return Repo.checkout(dest)


def clone_local(mirror: Repo, dest: Path, tips: list[str] | None = None) -> Repo:
    """A new repository at `dest` holding the mirror's objects (no checkout, no remote).

    `dest` shares no file with the mirror, so damage to one never reaches the other, and the
    two may live on different file systems: the mirror's packs are copied (a reflink where the
    file system offers one), and the loose objects reachable from `tips` (default: every ref)
    are streamed as one pack that `git index-pack` writes inside `dest`. Nothing is written
    into the mirror. Returns the new checkout.
    """
    clone = _init_checkout(dest)
    _copy_objects(mirror, clone, tips)
    return clone


def clone_checked_out(
    mirror: Repo,
    dest: Path,
    tips: list[str],
    refs: dict[str, str],
    branch: str,
    sha: str,
    base: str | None = None,
) -> Repo:
    """`clone_local(mirror, dest, tips)` with `refs` set and `branch` at `sha` checked out.

    The files are written while the objects are copied in (packs and loose objects): until
    the copy is complete the checkout reads the mirror's objects through an alternates
    entry, removed then, so the clone ends sharing no file with the mirror, as clone_local's
    does. With `base` (a commit every tip descends from), the loose objects are found from
    the base's object list and those the tips add to it, not by walking every tip's tree,
    and the clone ends at the base: a base with parents is named in its `shallow` file.
    """
    clone = _init_checkout(dest)
    alternates = dest / ".git" / "objects" / "info" / "alternates"
    alternates.parent.mkdir(parents=True, exist_ok=True)
    alternates.write_bytes(_quoted_path(mirror.path.resolve() / "objects") + b"\n")
    with clone.running("checkout", "--quiet", "-B", branch, sha):
        _copy_objects(mirror, clone, tips, base)
        update_refs(clone, refs)
    alternates.unlink()
    # Every object of the result is the clone's own (a mirror missing some would otherwise
    # have lent them through the entry just removed): one walk, about 4 ms for sglang.
    clone.run("rev-list", "--objects", "--quiet", *tips)
    return clone


def _quoted_path(path: Path) -> bytes:
    """A path as git's alternates file reads it quoted (any byte but NUL may be in it)."""
    raw = os.fsencode(path)
    for byte, escaped in ((b"\\", b"\\\\"), (b'"', b'\\"'), (b"\n", b"\\n"), (b"\t", b"\\t")):
        raw = raw.replace(byte, escaped)
    return b'"' + raw + b'"'


def _copy_objects(
    mirror: Repo, dest: Repo, tips: list[str] | None, base: str | None = None
) -> None:
    """The loose objects reachable from `tips` copied first, then the packs: a repack of
    the mirror in between (an import) packs those objects into a pack copied after, or
    removes a pack while it is copied (an error), never leaves one out.

    With `base`, the objects are named: those of the base that are loose (its object list,
    as the mirror's integrity check reads it) and every one the tips add to the base (one
    `rev-list`); each that is loose is copied as its file, inflated and hashed first (one
    whose bytes do not hash to its id is refused), the rest streamed by `pack-objects`.
    Else `pack-objects` walks every tip's trees for the loose ones. The clone's
    completeness walk checks both; with `base` it ends there (the clone's `shallow` file
    names a base that has parents, whose history nothing copies by name).
    """
    if base is not None and tips:
        named = list(loose_objects_of(mirror, base))
        for tip in tips:
            if tip != base:
                named += [line.split(" ", 1)[0] for line in objects_since(mirror, tip, base)]
        rest = _copy_loose(mirror, dest.path / ".git", list(dict.fromkeys(named)))
        if rest:
            _stream_objects(mirror, dest, [], rest)
        copy_packs(mirror.path / "objects" / "pack", dest.path / ".git" / "objects" / "pack")
        # shallow at the base: its history is named by no copy, read by no verb, slow to walk
        if parents_of(mirror, base) or base in _shallow_commits(mirror):
            _write_shallow(dest.path / ".git", [base])
        return
    _stream_objects(
        mirror, dest, ["--revs", "--incremental", *([] if tips else ["--all"])], tips or []
    )
    copy_packs(mirror.path / "objects" / "pack", dest.path / ".git" / "objects" / "pack")
    shallow = mirror.path / "shallow"
    if shallow.is_file():  # a shallow fetch: the clone ends where the mirror does
        _copy_file(shallow, dest.path / ".git" / "shallow")


def _shallow_commits(repo: Repo) -> set[str]:
    """The commits the bare `repo`'s `shallow` file names (a fetch with --depth cut their
    parents off)."""
    try:
        return set((repo.path / "shallow").read_text(encoding="ascii").split())
    except FileNotFoundError:
        return set()


def _write_shallow(git_dir: Path, commits: list[str]) -> None:
    """`git_dir`'s `shallow` file naming `commits`: git reads each as a commit without
    parents, so neither a walk nor a fetch goes past it (written whole, then renamed)."""
    tmp = git_dir / "shallow.patchkit-tmp"
    tmp.write_text("".join(f"{c}\n" for c in sorted(commits)), encoding="ascii")
    os.replace(tmp, git_dir / "shallow")


def _stream_objects(mirror: Repo, dest: Repo, args: list[str], lines: list[str]) -> None:
    """`pack-objects` of the mirror into `index-pack` of `dest` (`lines`: its input)."""
    # No delta search (--window=0) and zlib's fastest level: git am writes these objects
    # loose, undeltified and at that level (core.looseCompression); the search was a third
    # of a 1,000-patch apply, the default level two thirds of this stream's time.
    stream = bytes(
        mirror.run(
            *("-c", "pack.compression=1", "pack-objects", "--quiet", "--window=0", "--stdout"),
            *args,
            stdin="".join(f"{line}\n" for line in lines).encode(),
            binary=True,
        )
    )
    if len(stream) > 32:  # header and trailer only: no object was missing
        dest.run("index-pack", "--stdin", stdin=stream)


def _copy_loose(mirror: Repo, git_dir: Path, oids: list[str]) -> list[str]:
    """Copy those of `oids` that are loose in the bare `mirror` into `git_dir`'s objects as
    files (each written whole, then renamed), after checking that each inflates to bytes
    that hash to its id; return the others (packed, or packed meanwhile)."""
    source, target = mirror.path / "objects", git_dir / "objects"
    rest, folders = [], set()
    for oid in oids:
        try:
            data = (source / oid[:2] / oid[2:]).read_bytes()
        except FileNotFoundError:
            rest.append(oid)
            continue
        digest = hashlib.new(_algorithm_of(oid))
        try:
            digest.update(zlib.decompress(data))
        except zlib.error:
            digest = None
        if digest is None or digest.hexdigest() != oid:
            raise DamagedObjectError(source / oid[:2] / oid[2:])
        folder = target / oid[:2]
        if oid[:2] not in folders:
            folder.mkdir(exist_ok=True)
            folders.add(oid[:2])
        tmp = folder / f"tmp_obj_{oid[2:]}"
        tmp.write_bytes(data)
        os.chmod(tmp, 0o444)
        os.replace(tmp, folder / oid[2:])
    return rest


FICLONE = 0x40049409  # linux/fs.h: share the blocks copy-on-write (btrfs, xfs, bcachefs)


def copy_packs(source: Path, dest: Path) -> list[Path]:
    """Copy every pack of `source` into `dest` (never a hard link; write then rename)."""
    copied = []
    names = sorted(p.name for p in source.glob("pack-*") if not p.name.endswith(".keep"))
    # .pack before .idx: git only looks at packs with an index, so a reader never sees half.
    for name in sorted(names, key=lambda n: (not n.endswith(".pack"), n)):
        target = dest / name
        tmp = dest / f"tmp_copy_{name}"
        _copy_file(source / name, tmp)
        os.chmod(tmp, 0o444)
        os.replace(tmp, target)
        copied.append(target)
    return copied


def _copy_file(source: Path, dest: Path) -> None:
    with open(source, "rb") as src, open(dest, "wb") as out:
        try:
            fcntl.ioctl(out.fileno(), FICLONE, src.fileno())
            return
        except OSError:
            pass
        shutil.copyfileobj(src, out, 1 << 20)


@verb
def unreachable_loose_objects(repo: Repo) -> list[str]:
    """The loose objects of a bare repository that no ref reaches (whatever their age)."""
    out = str(repo.run("prune", "--dry-run", "--expire=now"))
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@verb
def prune_unreachable(repo: Repo, older_than: float) -> None:
    """Remove the loose objects no ref reaches whose files are older than `older_than` (a
    Unix time); git keeps any object a younger unreachable object needs."""
    repo.run("prune", f"--expire=@{int(older_than)}")


@verb
def verify_commit_object(repo: Repo, sha: str) -> bool:
    """Re-hash the commit, its tree and blobs reachable from it (detects a tampered mirror)."""
    return repo.ok(
        "fsck", "--no-dangling", "--no-progress", "--connectivity-only", sha
    ) and repo.ok("cat-file", "-e", f"{sha}^{{tree}}")


@verb
def loose_objects_of(repo: Repo, commit: str) -> tuple[str, ...]:
    """`commit`'s objects (itself, its trees and blobs) that are loose in the bare `repo`.

    Read once per process for each set of packs: an object is loosened only out of a pack
    that is then removed (`unpack-objects` and a deleted pack), which changes the set; one
    loose when read and packed since is still found by its id, and skipped where its file
    is looked at."""
    try:
        packs = tuple(
            sorted(n for n in os.listdir(repo.path / "objects" / "pack") if n.endswith(".pack"))
        )
    except FileNotFoundError:
        packs = ()
    return _loose_objects_of(repo, commit, packs)


@functools.lru_cache(maxsize=32)
def _loose_objects_of(repo: Repo, commit: str, packs: tuple[str, ...]) -> tuple[str, ...]:
    # The loose folders listed once (a few hundred files where series were built), not one
    # `stat` per object of the commit (thousands for a release's tree).
    loose: set[str] = set()
    with os.scandir(repo.path / "objects") as folders:
        for folder in folders:
            if len(folder.name) == 2 and folder.is_dir():
                try:
                    with os.scandir(folder.path) as names:
                        loose.update(folder.name + n.name for n in names)
                except FileNotFoundError:  # emptied and removed meanwhile (prune-packed)
                    continue
    return tuple(oid for oid in object_ids(repo, commit) if oid in loose)


# (repository, tip, base) -> objects_since's lines, as last read
_SINCE: dict[tuple[str, str, str], tuple[str, ...]] = {}


@verb
def objects_since(repo: Repo, tip: str, base: str, fresh: bool = False) -> tuple[str, ...]:
    """`rev-list --objects --parents tip --not base` of the bare `repo`, as lines: the
    commits first (each with its parents), then every tree and blob they add to the base's
    (`<id> <path>`); a missing object fails it (GitError). Ids name their bytes, so the list
    for two ids never changes and is read once per process; `fresh` reads it again, for a
    caller that needs the objects to be there now."""
    key = (str(repo.path), tip, base)
    if fresh or key not in _SINCE:
        out = repo.run("rev-list", "--objects", "--parents", tip, "--not", base)
        _SINCE[key] = tuple(str(out).splitlines())
    return _SINCE[key]


@verb
def chain_present(repo: Repo, base: str, commits: list[str]) -> bool:
    """True when `commits` (oldest first) are a chain on `base`, each the one parent of the
    next, and every object they bring beside the base's is in the bare `repo` now
    (`objects_since`, read afresh, fails on a missing one). Their loose files are freshened,
    as git does when it writes an object that exists: a `git prune --expire` that runs next
    keeps them."""
    if not commits:
        return True
    try:
        lines = objects_since(repo, commits[-1], base, fresh=True)
    except GitError:
        return False
    parents = [base, *commits]
    want = tuple(f"{commits[i]} {parents[i]}" for i in reversed(range(len(commits))))
    # a commit's id names its parents, so a chain that ends on `base` holds no other commit
    if lines[: len(want)] != want:
        return False
    root = repo.path / "objects"
    for oid in [*commits, *(line.split(" ", 1)[0] for line in lines[len(want) :])]:
        # packed (`prune` keeps packs), or another user's file: as for git's own freshening,
        # one that cannot be touched stays as it is (a prune may take it; then a build)
        with contextlib.suppress(OSError):
            os.utime(root / oid[:2] / oid[2:])
    return True


@verb
def object_ids(repo: Repo, commit: str) -> list[str]:
    """The ids of `commit` and every tree and blob of its tree (read once per process for a
    repository and commit: an id names its bytes)."""
    return list(_object_listing(repo, commit)[0])


@verb
def parents_of(repo: Repo, commit: str) -> tuple[str, ...]:
    """The parents of `commit` as `repo` reads them (none for a root commit, nor for one
    its `shallow` file names), from the one `rev-list` that `object_ids` reads."""
    return _object_listing(repo, commit)[1]


@functools.lru_cache(maxsize=32)
def _object_listing(repo: Repo, commit: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the ids of `commit`, its trees and blobs; its parents): one `rev-list`, whose first
    line is the commit's id followed by its parents' (`--parents`)."""
    listing = str(repo.run("rev-list", "--objects", "--parents", "--no-walk", commit))
    lines = [line for line in listing.splitlines() if line]
    parents = tuple(lines[0].split(" ")[1:]) if lines else ()
    return tuple(line.split(" ", 1)[0] for line in lines), parents


# Per repository, the ids whose bytes this process has seen hash to them: those a check
# found clean and those `index-pack --strict` wrote (it hashes every object it indexes).
_HASHED: dict[Repo, set[str]] = {}


@verb
def hashed(repo: Repo, ids: Iterable[str]) -> None:
    """Record `ids` as hashed to their bytes in this process (objects just written by a
    strict `index-pack`), so that `corrupt_objects` does not read them again."""
    _HASHED.setdefault(repo, set()).update(ids)


@verb
def corrupt_objects(repo: Repo, commit: str) -> list[str]:
    """Objects of `commit` and its tree whose bytes no longer hash to their id (a damaged or
    tampered mirror); git itself does not re-hash objects when it reads them. Objects this
    process already hashed (a clean check before, or its own import) are not read again: a
    release shares most of its objects with the one before."""
    seen = _HASHED.setdefault(repo, set())
    ids = [oid for oid in object_ids(repo, commit) if oid not in seen]
    algorithm = _hash_name(repo)
    bad = []
    for oid, obj in zip(ids, _read_batch(repo, ids), strict=True):
        if obj is None:
            bad.append(oid)
            continue
        _, kind, body = obj
        if hashlib.new(algorithm, kind + b" %d\0" % len(body) + body).hexdigest() != oid:
            bad.append(oid)
    if not bad:
        seen.update(ids)
    return bad


@verb
def stale_lock_files(repo: Repo, loose_temporaries: bool = True) -> list[Path]:
    """What a git killed with SIGKILL leaves in a repository: its `*.lock` files and its
    temporary packs and objects (`tmp_pack_*`, `tmp_idx_*`, `tmp_obj_*`, `incoming-*`).
    `loose_temporaries=False` leaves out the `tmp_obj_*` files of the loose-object folders
    (listing those reads every loose object's name: 10 ms at 15,000 of them).

    Only for a repository whose writers all hold a patchkit lock (the mirrors), or in a
    checkout whose journal proves patchkit's git was the one killed there.
    """
    git_dir = repo.git_dir()
    found = [
        p
        for p in (
            git_dir / name
            for name in (
                "index.lock",
                "HEAD.lock",
                "config.lock",
                "packed-refs.lock",
                "shallow.lock",
            )
        )
        if p.exists()
    ]
    refs_dir = git_dir / "refs"
    if refs_dir.is_dir():
        found += sorted(refs_dir.rglob("*.lock"))
    objects = git_dir / "objects"
    for pattern in ("pack/tmp_pack_*", "pack/tmp_idx_*", "pack/tmp_rev_*", "pack/tmp_copy_*"):
        found += sorted(objects.glob(pattern))
    if loose_temporaries:
        found += sorted(objects.glob("??/tmp_obj_*"))
        found += sorted(objects.glob("tmp_obj_*"))
    return found


def remove_leftovers(paths: list[Path]) -> None:
    """Remove files (and `incoming-*` object directories) listed by stale_lock_files."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
