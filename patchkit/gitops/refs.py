"""Refs, commits and history: resolving names, reading commits, messages, trailers and
files at a revision."""

from __future__ import annotations

from patchkit.gitops.faults import GitError
from patchkit.gitops.repo import HEX_ID_RE, Repo, verb


@verb
def resolve(repo: Repo, ref: str) -> str | None:
    """The commit id `ref` names in `repo`, or None."""
    if not ref or ref.startswith("-"):
        return None  # never an option
    try:
        out = repo.run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except GitError:
        return None
    return str(out).strip() or None


@verb
def has_commit(repo: Repo, sha: str) -> bool:
    return repo.ok("cat-file", "-e", f"{sha}^{{commit}}")


@verb
def update_ref(repo: Repo, ref: str, sha: str) -> None:
    repo.run("update-ref", ref, sha)


@verb
def update_refs(repo: Repo, refs: dict[str, str]) -> None:
    """Point every ref of `refs` at its commit, all or none (one transaction)."""
    lines = "".join(f"update {ref} {sha}\n" for ref, sha in refs.items())
    repo.run("update-ref", "--stdin", stdin=lines.encode())


@verb
def delete_ref(repo: Repo, ref: str) -> None:
    repo.run("update-ref", "-d", ref, check=False)


@verb
def refs(repo: Repo, prefix: str) -> dict[str, str]:
    out = repo.run("for-each-ref", "--format=%(refname) %(objectname)", prefix)
    result = {}
    for line in str(out).splitlines():
        name, _, sha = line.partition(" ")
        result[name] = sha
    return result


@verb
def head(repo: Repo) -> str | None:
    return resolve(repo, "HEAD")


@verb
def current_branch(repo: Repo) -> str | None:
    try:
        out = str(repo.run("symbolic-ref", "--quiet", "--short", "HEAD")).strip()
    except GitError:
        return None
    return out or None


@verb
def is_ancestor(repo: Repo, ancestor: str, descendant: str) -> bool:
    return repo.ok("merge-base", "--is-ancestor", ancestor, descendant)


@verb
def tree_of(repo: Repo, commit: str) -> str:
    return str(repo.run("rev-parse", f"{commit}^{{tree}}")).strip()


@verb
def commit_date(repo: Repo, commit: str) -> int:
    return int(str(repo.run("show", "-s", "--format=%ct", commit)).strip())


@verb
def commit_message(repo: Repo, commit: str) -> str:
    # A commit id names its bytes, so the message of a full id is read once per process.
    if HEX_ID_RE.match(commit):
        return _message_of_id(commit, repo)
    return str(repo.run("show", "-s", "--format=%B", commit))


# (commit id, repository, bare) -> its message as `show -s --format=%B` prints it
_MESSAGES: dict[tuple[str, str, bool], str] = {}


def _message_of_id(commit: str, repo: Repo) -> str:
    key = (commit, str(repo.path), repo.bare)
    if key not in _MESSAGES:
        _MESSAGES[key] = str(repo.run("show", "-s", "--format=%B", commit))
    return _MESSAGES[key]


@verb
def read_commits(repo: Repo, names: list[str]) -> dict[str, str | None]:
    """name -> the commit it names (peeled), or None, for every one of `names` (commit ids
    or refs), by one `cat-file --batch`; each commit's message is kept for
    `commit_message`."""
    asked = [n for n in dict.fromkeys(names) if n and "\n" not in n and not n.startswith("-")]
    found: dict[str, str | None] = dict.fromkeys(names)
    objects = _read_batch(repo, [f"{name}^{{commit}}" for name in asked])
    for name, obj in zip(asked, objects, strict=True):
        if obj is None or obj[1] != b"commit":
            continue  # missing (or ambiguous): no such commit
        oid, _, body = obj
        head, _, message = body.partition(b"\n\n")
        if b"\nencoding " not in b"\n" + head:  # else `show` re-encodes it: read it there
            # as `show --format=%B` prints it: the message and one newline after it
            _MESSAGES[(oid, str(repo.path), repo.bare)] = message.decode("utf-8", "replace") + "\n"
        found[name] = oid
    return found


def _read_batch(repo: Repo, names: list[str]) -> list[tuple[str, bytes, bytes] | None]:
    """(id, type, bytes) of the object each of `names` names, or None where git has none,
    by one `cat-file --batch`."""
    if not names:
        return []
    lines = "".join(f"{name}\n" for name in names).encode()
    data = bytes(repo.run("cat-file", "--batch", stdin=lines, binary=True))
    out: list[tuple[str, bytes, bytes] | None] = []
    pos = 0
    for _ in names:
        end = data.index(b"\n", pos)
        header = data[pos:end].split(b" ")
        pos = end + 1
        if len(header) != 3 or header[1] in (b"missing", b"ambiguous"):
            out.append(None)
            continue
        size = int(header[2])
        out.append((header[0].decode("ascii"), header[1], data[pos : pos + size]))
        pos += size + 1
    return out


@verb
def rev_list(repo: Repo, base: str, tip: str, *, first_parent: bool = False) -> list[str]:
    """Commits in base..tip, oldest first (with `first_parent`, along first parents only)."""
    walk = ["--first-parent"] if first_parent else []
    out = str(repo.run("rev-list", "--reverse", *walk, f"{base}..{tip}"))
    return out.split()


_TRAILERS = "%(trailers:only,unfold)"


@verb
def trailers_of(repo: Repo, commit: str) -> dict[str, str]:
    return _trailer_fields(str(repo.run("show", "-s", f"--format={_TRAILERS}", commit)))


@verb
def trailers_in_range(repo: Repo, base: str, tip: str) -> list[tuple[str, dict[str, str]]]:
    """Each commit of base..tip, oldest first (as `rev_list`), with its trailers (as
    `trailers_of`), read by one git process instead of one per commit."""
    out = str(repo.run("log", "--reverse", f"--format=%x00%H%x00{_TRAILERS}", f"{base}..{tip}"))
    fields = out.split("\0")[1:]
    shas = fields[0::2]
    if len(fields) % 2 or not all(HEX_ID_RE.match(sha) for sha in shas):
        # A NUL inside a commit message shifted the fields: read commit by commit.
        return [(sha, trailers_of(repo, sha)) for sha in rev_list(repo, base, tip)]
    return [(sha, _trailer_fields(text)) for sha, text in zip(shas, fields[1::2], strict=True)]


def _trailer_fields(out: str) -> dict[str, str]:
    result = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            result[key.strip()] = value.strip()
    return result


@verb
def diff_trees(repo: Repo, a: str, b: str, *, stat: bool = False) -> str:
    args = ["diff", "--full-index", "--no-color"]
    if stat:
        args.append("--stat=100")
    return str(repo.run(*args, a, b))


@verb
def show_file(repo: Repo, rev: str, path: str) -> bytes | None:
    try:
        return bytes(repo.run("show", f"{rev}:{path}", binary=True))
    except GitError:
        return None


@verb
def files_matching(repo: Repo, treeish: str, pattern: str, pathspecs: list[str]) -> list[str]:
    """The paths under `pathspecs` in `treeish` with a line matching the extended regular
    expression `pattern`."""
    # -l: names only; -E: extended regex; exit status 1 means no file matched
    out = repo.run("grep", "-l", "-I", "-E", "-e", pattern, treeish, "--", *pathspecs, check=False)
    prefix = f"{treeish}:"
    return [p.removeprefix(prefix) for p in str(out).splitlines() if p]


@verb
def tree_paths(repo: Repo, treeish: str) -> list[str]:
    """Every file path in a tree."""
    out = str(repo.run("ls-tree", "-r", "-z", "--name-only", treeish))
    return [p for p in out.split("\0") if p]
