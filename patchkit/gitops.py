"""Every git command patchkit runs, as named domain verbs.

Plain `git` processes: GitPython would cost 0.2 s of import on every invocation and cannot
stop a running git on an interrupt, which the lock and rollback guarantees need.
Callers never spell git options; they ask for `import_directory`, `apply_to_index`,
`commit_tree`, `clone_local` and so on.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# Fixed, locale-free behaviour for every call: no pager, no prompts, no user hooks or config.
BASE_ENV = {
    "LC_ALL": "C",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_PAGER": "cat",
    "GIT_ASKPASS": "true",
    "GIT_OPTIONAL_LOCKS": "0",
}
CONFIG = (
    "-c",
    "core.autocrlf=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "gc.auto=0",
    "-c",
    "advice.detachedHead=false",
    "-c",
    "core.quotePath=false",
)


class GitError(Exception):
    """A git command failed; `stderr` holds git's words."""

    def __init__(self, args: list[str], status: int, stderr: str) -> None:
        super().__init__(stderr.strip() or f"git {' '.join(args)} exited {status}")
        self.args_ = args
        self.status = status
        self.stderr = stderr


@dataclass(frozen=True)
class Identity:
    """Who and when a commit is made: fixed values make commit ids reproducible."""

    name: str
    email: str
    date: str  # anything git accepts, e.g. "1700000000 +0000" or an RFC 2822 date

    def env(self) -> dict[str, str]:
        return {
            "GIT_AUTHOR_NAME": self.name,
            "GIT_AUTHOR_EMAIL": self.email,
            "GIT_AUTHOR_DATE": self.date,
            "GIT_COMMITTER_NAME": self.name,
            "GIT_COMMITTER_EMAIL": self.email,
            "GIT_COMMITTER_DATE": self.date,
        }


def run(
    repo: Path | str,
    *args: str,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    binary: bool = False,
    check: bool = True,
    bare: bool = False,
) -> str | bytes:
    """Run one git command in `repo` and return its stdout (raises GitError on failure).

    On an interrupt (SIGINT, or SIGTERM mapped to KeyboardInterrupt) git is stopped and
    waited for before the exception goes on, so no git process outlives patchkit's locks.
    """
    cmd = ["git", *CONFIG]
    if bare:
        cmd += ["--git-dir", str(repo)]
    cmd += list(args)
    full_env = {**os.environ, **BASE_ENV, **(env or {})}
    proc = subprocess.Popen(
        cmd,
        cwd=None if bare else str(repo),
        env=full_env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(stdin)
    except BaseException:
        proc.terminate()  # git removes its own lock files on SIGTERM
        proc.wait()
        raise
    if check and proc.returncode != 0:
        raise GitError(list(args), proc.returncode, err.decode("utf-8", "replace"))
    return out if binary else out.decode("utf-8", "replace")


def ok(repo: Path | str, *args: str, env: dict[str, str] | None = None, bare: bool = False) -> bool:
    """True when the git command exits 0."""
    try:
        run(repo, *args, env=env, bare=bare)
    except GitError:
        return False
    return True


# --- repositories ---------------------------------------------------------------------------


def init_bare(path: Path) -> None:
    """Create a bare mirror repository (no-op when it exists)."""
    if (path / "HEAD").is_file():
        return
    path.mkdir(parents=True, exist_ok=True)
    run(path, "init", "--bare", "--quiet", str(path))


def pack_objects(repo: Path, bare: bool = True) -> None:
    """Pack loose objects without deltas: clones hard-link one file and checkouts read fast."""
    run(repo, "repack", "-a", "-d", "-q", "--window=0", bare=bare)
    run(repo, "prune-packed", bare=bare)


def is_repository(path: Path) -> bool:
    return (path / ".git").exists() and ok(path, "rev-parse", "--git-dir")


def clone_local(mirror: Path, dest: Path, tips: list[str] | None = None) -> None:
    """A new repository at `dest` holding the mirror's objects (no checkout, no remote).

    With `tips`, the mirror's packs are hard-linked and the objects of `tips` that are not in
    any pack go into one new pack: the thousands of loose objects the mirror collects are
    never copied. Without, a plain `git clone --local`.
    """
    if not tips:
        run(dest.parent, "clone", "--quiet", "--local", "--no-checkout", str(mirror), str(dest))
        run(dest, "remote", "remove", "origin")
        return
    run(dest.parent, "init", "--quiet", str(dest))
    pack_dir = dest / ".git" / "objects" / "pack"
    for source in sorted((mirror / "objects" / "pack").glob("pack-*")):
        try:
            os.link(source, pack_dir / source.name)
        except OSError:  # another file system: copy instead
            shutil.copy2(source, pack_dir / source.name)
    run(
        mirror,
        "pack-objects",
        "--quiet",
        "--revs",
        "--incremental",
        str(pack_dir / "pack"),
        stdin="".join(f"{tip}\n" for tip in tips).encode(),
        bare=True,
    )


def resolve(repo: Path, ref: str, bare: bool = False) -> str | None:
    """The commit id `ref` names in `repo`, or None."""
    try:
        out = run(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", bare=bare)
    except GitError:
        return None
    return str(out).strip() or None


def has_commit(repo: Path, sha: str, bare: bool = False) -> bool:
    return ok(repo, "cat-file", "-e", f"{sha}^{{commit}}", bare=bare)


def fetch(
    repo: Path, source: str, refspecs: list[str], *, depth: int | None = None, bare: bool = False
) -> None:
    """Fetch `refspecs` from `source` (a URL or a path) into `repo`."""
    args = ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head"]
    if depth:
        args.append(f"--depth={depth}")
    run(repo, *args, source, *refspecs, bare=bare)


def list_remote(source: str) -> dict[str, str]:
    """ref name -> sha of a remote (tags peeled)."""
    out = run(Path.cwd(), "ls-remote", source)
    refs = {}
    for line in str(out).splitlines():
        sha, _, name = line.partition("\t")
        refs[name.removesuffix("^{}")] = sha
    return refs


def update_ref(repo: Path, ref: str, sha: str, bare: bool = False) -> None:
    run(repo, "update-ref", ref, sha, bare=bare)


def delete_ref(repo: Path, ref: str, bare: bool = False) -> None:
    run(repo, "update-ref", "-d", ref, bare=bare, check=False)


def refs(repo: Path, prefix: str, bare: bool = False) -> dict[str, str]:
    out = run(repo, "for-each-ref", "--format=%(refname) %(objectname)", prefix, bare=bare)
    result = {}
    for line in str(out).splitlines():
        name, _, sha = line.partition(" ")
        result[name] = sha
    return result


def verify_commit_object(repo: Path, sha: str, bare: bool = False) -> bool:
    """Re-hash the commit, its tree and blobs reachable from it (detects a tampered mirror)."""
    return ok(
        repo, "fsck", "--no-dangling", "--no-progress", "--connectivity-only", sha, bare=bare
    ) and ok(repo, "cat-file", "-e", f"{sha}^{{tree}}", bare=bare)


# --- building commits without a work tree ---------------------------------------------------


@contextmanager
def scratch_index(repo: Path, tree: str, bare: bool = False) -> Iterator[dict[str, str]]:
    """A private index holding `tree`; yields the env that selects it."""
    fd, path = tempfile.mkstemp(prefix="patchkit-index-")
    os.close(fd)
    os.unlink(path)
    env = {"GIT_INDEX_FILE": path}
    try:
        run(repo, "read-tree", tree, env=env, bare=bare)
        yield env
    finally:
        for leftover in (path, path + ".lock"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def import_directory(repo: Path, source: Path, message: str, who: Identity) -> str:
    """Commit every file under `source` (ignore rules off) as a parentless commit."""
    fd, index = tempfile.mkstemp(prefix="patchkit-import-index-")
    os.close(fd)
    os.unlink(index)
    env = {"GIT_INDEX_FILE": index, "GIT_WORK_TREE": str(source), **who.env()}
    try:
        run(repo, "add", "--all", "--force", ".", env=env, bare=True)
        tree = str(run(repo, "write-tree", env=env, bare=True)).strip()
        return str(run(repo, "commit-tree", tree, "-m", message, env=env, bare=True)).strip()
    finally:
        if os.path.exists(index):
            os.unlink(index)


def apply_to_index(
    repo: Path,
    env: dict[str, str],
    patch_file: Path,
    *,
    reverse: bool = False,
    check: bool = False,
    context: int | None = None,
    threeway: bool = False,
    include: str | None = None,
    bare: bool = False,
) -> tuple[bool, str]:
    """`git apply --cached` into the scratch index; returns (applied, git's messages)."""
    args = ["apply", "--cached", "--whitespace=nowarn"]
    if reverse:
        args.append("--reverse")
    if check:
        args.append("--check")
    if context is not None:
        args.append(f"-C{context}")
    if threeway:
        args.append("--3way")
    if include:
        args.append(f"--include={include}")
    args.append(str(patch_file))
    try:
        run(repo, *args, env=env, bare=bare)
    except GitError as exc:
        return False, exc.stderr
    return True, ""


def write_tree(repo: Path, env: dict[str, str], bare: bool = False) -> str:
    return str(run(repo, "write-tree", env=env, bare=bare)).strip()


def commit_tree(
    repo: Path, tree: str, parent: str | None, message: str, who: Identity, bare: bool = False
) -> str:
    args = ["commit-tree", tree]
    if parent:
        args += ["-p", parent]
    out = run(repo, *args, "-F", "-", env=who.env(), stdin=message.encode(), bare=bare)
    return str(out).strip()


def tree_of(repo: Path, commit: str, bare: bool = False) -> str:
    return str(run(repo, "rev-parse", f"{commit}^{{tree}}", bare=bare)).strip()


def commit_date(repo: Path, commit: str, bare: bool = False) -> int:
    return int(str(run(repo, "show", "-s", "--format=%ct", commit, bare=bare)).strip())


def commit_message(repo: Path, commit: str, bare: bool = False) -> str:
    return str(run(repo, "show", "-s", "--format=%B", commit, bare=bare))


# --- work trees ---------------------------------------------------------------------------


def head(repo: Path) -> str | None:
    return resolve(repo, "HEAD")


def current_branch(repo: Path) -> str | None:
    try:
        out = str(run(repo, "symbolic-ref", "--quiet", "--short", "HEAD")).strip()
    except GitError:
        return None
    return out or None


def dirty_files(repo: Path) -> list[str]:
    """Tracked files with uncommitted changes (staged or not)."""
    out = str(run(repo, "status", "--porcelain=v1", "--untracked-files=no", "-z"))
    return [entry[3:] for entry in out.split("\0") if entry]


def fetch_commit_from(repo: Path, source: Path, sha: str) -> None:
    """Bring one commit (and its history) from another local repository."""
    run(repo, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", str(source), sha)


def checkout_branch(repo: Path, branch: str, sha: str) -> None:
    """Point `branch` at `sha` and check it out (git refuses to clobber untracked files)."""
    run(repo, "checkout", "--quiet", "-B", branch, sha)


def reset_hard(repo: Path, sha: str) -> None:
    run(repo, "reset", "--quiet", "--hard", sha)


def restore_head(repo: Path, branch: str | None, sha: str) -> None:
    """Put HEAD back where it was (a branch at sha, or detached at sha)."""
    if branch:
        run(repo, "checkout", "--quiet", "-B", branch, sha)
    else:
        run(repo, "checkout", "--quiet", "--detach", sha)


def rev_list(repo: Path, base: str, tip: str) -> list[str]:
    """Commits in base..tip, oldest first."""
    out = str(run(repo, "rev-list", "--reverse", f"{base}..{tip}"))
    return out.split()


def trailers_of(repo: Path, commit: str) -> dict[str, str]:
    out = str(run(repo, "show", "-s", "--format=%(trailers:only,unfold)", commit))
    result = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            result[key.strip()] = value.strip()
    return result


def patch_id_of_commit(repo: Path, commit: str) -> str | None:
    diff = run(repo, "diff-tree", "-p", "--full-index", commit, binary=True)
    return patch_id(repo, bytes(diff))


def patch_id(repo: Path, diff: bytes) -> str | None:
    """git's stable patch id of a diff (None for an empty diff)."""
    out = str(run(repo, "patch-id", "--stable", stdin=diff)).strip()
    return out.split()[0] if out else None


def changed_paths(repo: Path, tree: str) -> list[str]:
    """Paths whose work-tree content differs from `tree` (tracked files only)."""
    out = str(run(repo, "diff", "--name-only", "-z", tree))
    return [p for p in out.split("\0") if p]


def diff_trees(repo: Path, a: str, b: str, *, stat: bool = False, bare: bool = False) -> str:
    args = ["diff", "--full-index", "--no-color"]
    if stat:
        args.append("--stat=100")
    return str(run(repo, *args, a, b, bare=bare))


def show_file(repo: Path, rev: str, path: str, bare: bool = False) -> bytes | None:
    try:
        return bytes(run(repo, "show", f"{rev}:{path}", binary=True, bare=bare))
    except GitError:
        return None


# === rebase / export / lint / review ========================================================
# Verbs used by patchkit.rebase, patchkit.export, patchkit.lint and patchkit.review.

# Electron's export: renames detected, no stat, no signature, zeroed commit id, full index lines
# (so `git apply --3way` keeps working on the exported files), subject kept as written.
EXPORT_ARGS = (
    "format-patch",
    "--keep-subject",
    "--no-stat",
    "--no-signature",
    "--zero-commit",
    "--full-index",
    "--stdout",
    "--no-color",
    "--no-attach",
    "--no-numbered",
    "--no-thread",
    "--no-cover-letter",
    "--encode-email-headers",
)


def format_patches(repo: Path, base: str, tip: str, bare: bool = False) -> bytes:
    """`git format-patch` of base..tip in the series' canonical form, as one mbox stream."""
    # No user or system configuration: the bytes depend on the commits and git only.
    return bytes(
        run(
            repo,
            "-c",
            "diff.renames=true",
            *EXPORT_ARGS,
            f"{base}..{tip}",
            env={"GIT_CONFIG_GLOBAL": "/dev/null"},
            binary=True,
            bare=bare,
        )
    )


def commit_parents(repo: Path, commit: str, bare: bool = False) -> list[str]:
    out = str(run(repo, "rev-list", "--parents", "-n", "1", commit, bare=bare)).split()
    return out[1:]


def rev_list_bare(repo: Path, base: str, tip: str, bare: bool = False) -> list[str]:
    """Commits in base..tip, oldest first (first-parent), in a bare or non-bare repository."""
    out = str(run(repo, "rev-list", "--reverse", "--first-parent", f"{base}..{tip}", bare=bare))
    return out.split()


def is_ancestor(repo: Path, ancestor: str, descendant: str, bare: bool = False) -> bool:
    return ok(repo, "merge-base", "--is-ancestor", ancestor, descendant, bare=bare)


def apply_three_way(
    repo: Path, env: dict[str, str], patch_file: Path, bare: bool = False
) -> tuple[str, list[str], str]:
    """`git apply --cached --3way` into a scratch index.

    Returns (outcome, conflicted paths, git's messages); outcome is "applied", "conflict" or
    "failed" (the recorded pre-image blobs are missing or the patch is unusable).
    """
    try:
        run(
            repo,
            "apply",
            "--cached",
            "--3way",
            "--whitespace=nowarn",
            str(patch_file),
            env=env,
            bare=bare,
        )
    except GitError as exc:
        conflicted = unmerged_paths(repo, env, bare=bare)
        if conflicted:
            return "conflict", conflicted, exc.stderr
        return "failed", [], exc.stderr
    return "applied", [], ""


def unmerged_paths(repo: Path, env: dict[str, str], bare: bool = False) -> list[str]:
    out = str(run(repo, "ls-files", "--unmerged", "-z", env=env, bare=bare, check=False))
    paths = []
    for entry in out.split("\0"):
        if "\t" in entry:
            path = entry.split("\t", 1)[1]
            if path not in paths:
                paths.append(path)
    return paths


def patch_ids_in_range(
    repo: Path, base: str, tip: str, paths: list[str], bare: bool = False
) -> dict[str, str]:
    """patch-id -> commit for the non-merge commits of base..tip that touch `paths`."""
    log = bytes(
        run(
            repo,
            "log",
            "--no-merges",
            "-p",
            "--full-index",
            "--no-color",
            "--format=commit %H",
            f"{base}..{tip}",
            "--",
            *paths,
            binary=True,
            bare=bare,
        )
    )
    if not log.strip():
        return {}
    out = str(run(repo, "patch-id", "--stable", stdin=log, bare=bare))
    ids = {}
    for line in out.splitlines():
        pid, _, commit = line.partition(" ")
        ids.setdefault(pid, commit)
    return ids


def patch_id_bare(repo: Path, diff: bytes, bare: bool = False) -> str | None:
    """git's stable patch id of a diff in a bare repository (None for an empty diff)."""
    out = str(run(repo, "patch-id", "--stable", stdin=diff, bare=bare)).strip()
    return out.split()[0] if out else None


def rebase_onto(
    repo: Path, onto: str, upstream: str, tip: str, branch: str, who: Identity
) -> tuple[bool, str]:
    """`git rebase --onto` in a work tree (empty results dropped); (finished, git's messages)."""
    run(repo, "checkout", "--quiet", "-B", branch, tip)
    env = {**_committer_env(who), "GIT_EDITOR": "true", "GIT_SEQUENCE_EDITOR": "true"}
    try:
        out = run(
            repo,
            "rebase",
            "--empty=drop",
            "--no-autosquash",
            "--onto",
            onto,
            upstream,
            branch,
            env=env,
        )
    except GitError as exc:
        return False, exc.stderr
    return True, str(out)


def rebase_continue(repo: Path, who: Identity) -> tuple[bool, str]:
    """`git rebase --continue` (message kept); (finished, git's messages)."""
    env = {**_committer_env(who), "GIT_EDITOR": "true"}
    try:
        out = run(repo, "rebase", "--continue", env=env)
    except GitError as exc:
        return False, exc.stderr
    return True, str(out)


def rebase_in_progress(repo: Path) -> bool:
    git_dir = Path(str(run(repo, "rev-parse", "--absolute-git-dir")).strip())
    return (git_dir / "rebase-merge").is_dir() or (git_dir / "rebase-apply").is_dir()


def rebase_stopped_at(repo: Path) -> str | None:
    """The commit a stopped rebase is replaying (REBASE_HEAD), if any."""
    return resolve(repo, "REBASE_HEAD")


def conflicted_files(repo: Path) -> list[str]:
    out = str(run(repo, "diff", "--name-only", "--diff-filter=U", "-z"))
    return [p for p in out.split("\0") if p]


def _committer_env(who: Identity) -> dict[str, str]:
    return {
        "GIT_COMMITTER_NAME": who.name,
        "GIT_COMMITTER_EMAIL": who.email,
        "GIT_COMMITTER_DATE": who.date,
    }


def project_file_at(repo: Path, rev: str, path: str) -> bytes | None:
    """A file of this project's own repository at `rev` (None when absent)."""
    return show_file(repo, rev, path)


def resolve_project_rev(repo: Path, rev: str) -> str | None:
    return resolve(repo, rev)


def tree_paths(repo: Path, treeish: str, bare: bool = False) -> list[str]:
    """Every file path in a tree."""
    out = str(run(repo, "ls-tree", "-r", "-z", "--name-only", treeish, bare=bare))
    return [p for p in out.split("\0") if p]


def read_tree_into(repo: Path, env: dict[str, str], treeish: str, bare: bool = False) -> None:
    """Reset a scratch index (from scratch_index) to `treeish`."""
    run(repo, "read-tree", treeish, env=env, bare=bare)


# --- integrity checks -----------------------------------------------------------------------

SYMLINK_MODE = "120000"


def symlinks_along(repo: Path, commit: str, paths: list[str], bare: bool = False) -> dict[str, str]:
    """For each path, the first component (a parent, or the path itself) that is a symlink
    in `commit`; paths with none are left out."""
    prefixes: dict[str, list[str]] = {}
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            prefixes.setdefault("/".join(parts[:i]), []).append(path)
    if not prefixes:
        return {}
    out = str(
        run(
            repo,
            "ls-tree",
            "-z",
            "--full-tree",
            commit,
            "--",
            *sorted(prefixes),
            env={"GIT_LITERAL_PATHSPECS": "1"},
            bare=bare,
        )
    )
    links: dict[str, str] = {}
    for entry in out.split("\0"):
        meta, _, name = entry.partition("\t")
        if meta.split(" ", 1)[0] != SYMLINK_MODE:
            continue
        for path in prefixes.get(name, []):
            if path not in links or len(name) < len(links[path]):
                links[path] = name
    return links


def object_ids(repo: Path, commit: str, bare: bool = False) -> list[str]:
    """The ids of `commit` and every tree and blob of its tree."""
    listing = str(run(repo, "rev-list", "--objects", "--no-walk", commit, bare=bare))
    return [line.split(" ", 1)[0] for line in listing.splitlines() if line]


def corrupt_objects(repo: Path, commit: str, bare: bool = False) -> list[str]:
    """Objects of `commit` and its tree whose bytes no longer hash to their id (a damaged or
    tampered mirror); git itself does not re-hash objects when it reads them."""
    ids = object_ids(repo, commit, bare=bare)
    data = bytes(
        run(
            repo,
            "cat-file",
            "--batch",
            stdin=("\n".join(ids) + "\n").encode(),
            binary=True,
            bare=bare,
        )
    )
    algorithm = _hash_name(repo, bare)
    bad = []
    pos = 0
    for oid in ids:
        end = data.index(b"\n", pos)
        header = data[pos:end].split()
        if len(header) != 3 or header[1] == b"missing":
            bad.append(oid)
            pos = end + 1
            continue
        kind, size = header[1], int(header[2])
        body = data[end + 1 : end + 1 + size]
        pos = end + 1 + size + 1
        digest = hashlib.new(algorithm, kind + b" %d\0" % size + body).hexdigest()
        if digest != oid:
            bad.append(oid)
    return bad


def _hash_name(repo: Path, bare: bool) -> str:
    fmt = str(run(repo, "rev-parse", "--show-object-format", bare=bare, check=False)).strip()
    return "sha256" if fmt == "sha256" else "sha1"


def stale_lock_files(git_dir: Path) -> list[Path]:
    """git's own `*.lock` files in a repository (left by a git killed with SIGKILL)."""
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
    return found


def force_checkout(repo: Path, sha: str, branch: str | None) -> None:
    """Check out `sha` (on `branch`, else detached), overwriting tracked files and index."""
    if branch:
        run(repo, "checkout", "--quiet", "--force", "-B", branch, sha)
    else:
        run(repo, "checkout", "--quiet", "--force", "--detach", sha)


def remote_tag(source: str, tag: str) -> str | None:
    """The commit the tag `tag` names in a remote (peeled), or None when it has no such tag."""
    out = str(
        run(Path.cwd(), "ls-remote", "--tags", source, f"refs/tags/{tag}", f"refs/tags/{tag}^{{}}")
    )
    found: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        found[name] = sha
    return found.get(f"refs/tags/{tag}^{{}}") or found.get(f"refs/tags/{tag}")


def files_written_by_checkout(repo: Path, old: str, new: str) -> list[str]:
    """Untracked files holding exactly what `new` adds over `old`: what an interrupted
    checkout of `new` left behind (a user's own file at such a path has other bytes)."""
    added = [
        p
        for p in str(
            run(repo, "diff", "--name-only", "-z", "--no-renames", "--diff-filter=A", old, new)
        ).split("\0")
        if p
    ]
    if not added:
        return []
    blobs = {}
    for entry in str(run(repo, "ls-tree", "-r", "-z", "--full-tree", new)).split("\0"):
        meta, _, name = entry.partition("\t")
        if name:
            blobs[name] = meta.split(" ")[2]
    tracked = set(str(run(repo, "ls-files", "-z")).split("\0"))
    algorithm = _hash_name(repo, False)
    found = []
    for path in added:
        full = repo / path
        if path in tracked or path not in blobs or not (full.is_file() or full.is_symlink()):
            continue
        data = os.readlink(full).encode() if full.is_symlink() else full.read_bytes()
        if hashlib.new(algorithm, b"blob %d\0" % len(data) + data).hexdigest() == blobs[path]:
            found.append(path)
    return found


def status_entries(repo: Path) -> list[str]:
    """`XY path` for every changed, unmerged or untracked path of a work tree."""
    out = str(run(repo, "status", "--porcelain=v1", "--untracked-files=all", "-z"))
    return [entry for entry in out.split("\0") if len(entry) > 3]
