"""Every git command patchkit runs, as named domain verbs.

Plain `git` processes: GitPython would cost 0.2 s of import on every invocation and cannot
stop a running git on an interrupt, which the lock and rollback guarantees need.
Callers never spell git options; they ask for `import_directory`, `apply_to_index`,
`commit_tree`, `clone_local` and so on.

A `Repo` (a path, bare or not) owns the one command funnel, `Repo.run`: every git process
gets an environment built from scratch and the pinned settings (see BASE_ENV, SETTINGS), so
no user or system configuration and no inherited GIT_* variable changes a result. The
module-level verbs keep their `(repo, ..., bare=False)` signatures and go through the same
funnel; newer verbs take a `Repo`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from patchkit import scratch
from patchkit.errors import PatchkitError, UsageError
from patchkit.locks import held_lock_fds

# The sealed environment: every git process gets exactly these variables (plus the few a verb
# passes, see CALLER_VARIABLES, and PASS_THROUGH from the user's environment). Nothing else of
# the caller's environment reaches git: a GIT_DIR, GIT_INDEX_FILE or GIT_WORK_TREE set by a
# git hook that runs patchkit would otherwise redirect its writes into another repository.
BASE_ENV = {
    "LC_ALL": "C",
    "LANG": "C",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_CONFIG_NOSYSTEM": "1",  # no /etc/gitconfig
    "GIT_CONFIG_GLOBAL": "/dev/null",  # no ~/.gitconfig nor $XDG_CONFIG_HOME/git/config
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_NO_REPLACE_OBJECTS": "1",  # refs/replace/* would change what a commit id reads as
    # No file can ever exist below /dev/null: git's per-user files (attributes, ignore,
    # credentials) are never found, and git treats ENOTDIR there as "absent".
    "HOME": "/dev/null",
    "XDG_CONFIG_HOME": "/dev/null",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_EDITOR": "true",
    "GIT_SEQUENCE_EDITOR": "true",
    "GIT_ASKPASS": "true",
    "SSH_ASKPASS": "true",
    "GIT_OPTIONAL_LOCKS": "0",
}
# Variables of the user's environment that reach git: how to find programs and a network.
PASS_THROUGH = (
    "PATH",
    "TMPDIR",
    "SSH_AUTH_SOCK",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    *(f"{n}_proxy" for n in ("http", "https", "no", "all")),
    *(f"{n.upper()}_PROXY" for n in ("http", "https", "no", "all")),
)
# The only variables a verb of this module may set for one call.
CALLER_VARIABLES = frozenset(
    {
        "GIT_INDEX_FILE",
        "GIT_WORK_TREE",
        "GIT_EDITOR",
        "GIT_SEQUENCE_EDITOR",
        "GIT_LITERAL_PATHSPECS",
        *(
            f"GIT_{who}_{what}"
            for who in ("AUTHOR", "COMMITTER")
            for what in ("NAME", "EMAIL", "DATE")
        ),
    }
)
# Transports git may use, in one place: local paths and these URL schemes. `ext::` and every
# other remote helper (which run commands) are refused by git itself through protocol.allow.
ALLOWED_SCHEMES = ("https", "http", "ssh", "git", "file")
# Settings that results depend on, pinned for every call; they win over a repository's own
# .git/config (command-line -c has the highest precedence).
SETTINGS = {
    "core.autocrlf": "false",
    "core.safecrlf": "false",
    "core.hooksPath": "/dev/null",  # no hook can exist there
    "core.fsmonitor": "false",  # a checkout's fsmonitor is a program git would run
    "core.untrackedCache": "false",
    "core.quotePath": "false",
    "core.commentChar": "#",
    "core.editor": "true",
    "core.pager": "cat",
    "gc.auto": "0",
    "maintenance.auto": "false",
    "advice.detachedHead": "false",
    "apply.ignoreWhitespace": "no",  # zero fuzz means zero: context must match byte for byte
    "apply.whitespace": "nowarn",
    "i18n.commitEncoding": "UTF-8",  # another encoding changes commit ids, so wheel bytes
    "i18n.logOutputEncoding": "UTF-8",
    "commit.gpgsign": "false",  # a signing prompt loops `rebase --continue`
    "tag.gpgsign": "false",
    "log.showSignature": "false",
    "color.ui": "false",
    "diff.noprefix": "false",
    "diff.mnemonicPrefix": "false",
    "diff.relative": "false",
    "diff.algorithm": "myers",
    "merge.conflictStyle": "merge",
    "rerere.enabled": "false",  # recorded resolutions would resolve conflicts silently
    "rerere.autoUpdate": "false",
    "rebase.autoSquash": "false",
    "rebase.autoStash": "false",
    "rebase.updateRefs": "false",
    "submodule.recurse": "false",
    "checkout.workers": "0",  # parallel checkout, a worker per core: the same files, sooner
    "format.signOff": "false",
    "format.coverLetter": "false",
    "format.useAutoBase": "false",
    "format.notes": "false",
    "format.from": "false",
    "protocol.allow": "never",
    **{f"protocol.{scheme}.allow": "always" for scheme in ALLOWED_SCHEMES},
}
CONFIG = tuple(arg for key, value in SETTINGS.items() for arg in ("-c", f"{key}={value}"))
_LOCK_RE = re.compile(r"Unable to create '([^']+\.lock)': File exists")


# ls-remote needs no repository; running it in a bare "repository" that cannot exist keeps
# git from discovering and reading the configuration of whatever the cwd is inside.
_NOWHERE = "/dev/null/no-repository"
_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}
HEX_ID_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})\Z")  # a full object id (sha1, sha256)
_TRAILERS = "%(trailers:only,unfold)"


class GitError(Exception):
    """A git command failed; `stderr` holds git's words."""

    def __init__(self, args: list[str], status: int, stderr: str) -> None:
        super().__init__(stderr.strip() or f"git {' '.join(args)} exited {status}")
        self.args_ = args
        self.status = status
        self.stderr = stderr


class DamagedObjectError(GitError):
    """A loose object's file does not inflate to bytes that hash to its id."""

    def __init__(self, path: Path) -> None:
        super().__init__(["copy"], 1, f"the object file {path} does not hash to its id")
        self.path = path


class GitLockError(GitError, PatchkitError):
    """git found its own lock file in place: another git is running there, or one was killed."""

    exit_code = 1

    def __init__(self, args: list[str], status: int, stderr: str, lock: str) -> None:
        GitError.__init__(self, args, status, stderr)
        self.lock = lock
        self.message = (
            f"git's lock file {lock} exists: a git process is working in that repository, or "
            "one was killed there; nothing was changed"
        )
        self.hint = f"if no git process is running there, remove {lock} and run again"


class GitFaultError(PatchkitError):
    """git could not do its work for a reason outside the command: a damaged repository,
    another user's repository, a full disk, a path too long. Not a GitError: no caller takes
    it for git's answer ("no such ref", "does not apply"); `ok` and `check=False` calls raise
    it too, and it ends the command in one line naming the file and the repair."""

    exit_code = 1

    def __init__(self, args: list[str], status: int, stderr: str, message: str, hint: str):
        super().__init__(message, hint)
        self.args_ = args
        self.status = status
        self.stderr = stderr


class DamagedRepositoryError(GitFaultError):
    """A repository's own files (config, packed-refs, a pack or its index) cannot be read."""


class MissingObjectsError(GitError, PatchkitError):
    """Objects a command had to read are missing or unreadable. A GitError (callers that ask
    whether an object is there take it as "no"); uncaught, it names the repository's objects
    and the repair."""

    exit_code = 1

    def __init__(self, args: list[str], status: int, stderr: str, message: str, hint: str):
        GitError.__init__(self, args, status, stderr)
        self.message = message
        self.hint = hint


class OwnershipError(GitFaultError):
    """git's ownership check (`safe.directory`) refuses a repository another user owns."""

    exit_code = 2


class NoSpaceError(GitFaultError):
    """git could not write: no space (or quota) left on the file system."""


class PathTooLongError(GitFaultError):
    """A path is longer than the file system (or git) takes."""


# git's words for each fault (git runs under LC_ALL=C): (pattern, kind); a kind's message and
# hint are made by `_fault`. The file a pattern captures is the one named to the user.
_FAULTS = (
    (re.compile(r"detected dubious ownership in repository at '([^']+)'"), "owner"),
    (re.compile(r"unexpected line in (\S*packed-refs)"), "file"),
    (re.compile(r"bad config line \d+ in (?:file|blob) (.+?)\s*$", re.M), "file"),
    (re.compile(r"packfile (\S+) cannot be accessed"), "file"),
    (re.compile(r"index file (\S+) is too small"), "file"),
    (re.compile(r"packfile (\S+) does not match index"), "file"),
    (re.compile(r"non-monotonic index (\S+)"), "file"),
    (re.compile(r"No space left on device|Disk quota exceeded"), "space"),
    (re.compile(r"File name too long|Filename too long"), "long"),
)
# Objects a ref or a walk needs and the repository lacks: damage when a command had to read
# them, but an answer ("not there") to a question asked with `ok` or `check=False`.
_MISSING_OBJECT = re.compile(
    r"missing object|unable to parse object|bad object [0-9a-f]{7}|invalid object [0-9a-f]{7}|"
    r"(?:could not|unable to) read [0-9a-f]{40}|object (?:file )?\S+ is (?:empty|corrupt)",
    re.I,
)


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


class UnsafeSourceError(UsageError):
    """An upstream source that could make git run a command or read an option."""


def check_source(source: str) -> str:
    """`source` as given when it is a local path or a URL of an allowed scheme, else refuse.

    A leading '-' would be read as an option (`--upload-pack=...` runs a command) and
    `transport::address` selects a remote helper, a program.
    """
    allowed = ", ".join(ALLOWED_SCHEMES)
    if not source or source.startswith("-") or "\0" in source or "\n" in source:
        raise UnsafeSourceError(
            f"upstream source {source!r} is not allowed (it would be read as a git option)",
            hint=f"pass a local path or a URL ({allowed})",
        )
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", source)
    helper = re.match(r"^([A-Za-z0-9+.-]+)::", source)
    if helper or (scheme and scheme.group(1).lower() not in ALLOWED_SCHEMES):
        name = (helper or scheme).group(1)
        raise UnsafeSourceError(
            f"upstream source {source!r} uses the transport {name!r}, which is not allowed",
            hint=f"pass a local path or a URL ({allowed})",
        )
    return source


def _source_argument(source: str) -> str:
    """`source` checked, a local path made absolute: git runs in patchkit's scratch folder
    when it fetches into a bare mirror, not where the path was given."""
    source = check_source(source)
    head = source.split(":", 1)[0]
    if "://" in source or (":" in source and "/" not in head):  # a URL, or scp-like host:path
        return source
    return os.path.abspath(os.path.expanduser(source))


_FILTER_RE = re.compile(rb'^\s*\[\s*filter\s+"((?:[^"\\\n]|\\.)*)"\s*\]', re.M | re.I)


def filter_overrides(work_tree: Path) -> list[str]:
    """`-c` settings that switch off every filter driver a checkout's own config defines:
    git would run their clean/smudge programs on checkout and status (attributes, including
    .git/info/attributes, cannot be overridden), and a tree must hold the series' bytes."""
    try:
        config, raw = _checkout_config(work_tree / ".git")
    except (OSError, ValueError):
        return []
    lowered = raw.lower()
    if b"filter" not in lowered and b"include" not in lowered:
        return []
    names = {
        re.sub(rb"\\(.)", rb"\1", m.group(1)).decode("utf-8", "replace")
        for m in _FILTER_RE.finditer(raw)
    }
    if b"include" in lowered:  # included files may define more: ask git for every key
        keys = Repo(_NOWHERE, bare=True).run(
            "config", "--file", str(config), "--includes", "--name-only", "--get-regexp",
            r"^filter\.", check=False,
        )  # fmt: skip
        names |= {k.split(".", 1)[1].rsplit(".", 1)[0] for k in str(keys).split() if "." in k}
    args = []
    for name in sorted(names):
        for key, value in (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")):
            args += ["-c", f"filter.{name}.{key}={value}"]
    return args


def _checkout_config(dot_git: Path) -> tuple[Path, bytes]:
    """The config file of a checkout, also of a linked worktree or submodule (`.git` a file
    naming the git directory; its `commondir` holds the config)."""
    if dot_git.is_file():
        text = dot_git.read_text(encoding="utf-8")
        if not text.startswith("gitdir: "):
            raise ValueError(dot_git)
        dot_git = (dot_git.parent / text[len("gitdir: ") :].strip()).resolve()
        common = dot_git / "commondir"
        if common.is_file():
            dot_git = (dot_git / common.read_text(encoding="utf-8").strip()).resolve()
    return dot_git / "config", (dot_git / "config").read_bytes()


def sealed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The complete environment of one git process (built from scratch, see BASE_ENV)."""
    extra = extra or {}
    unknown = set(extra) - CALLER_VARIABLES
    if unknown:
        raise ValueError(f"gitops: variables {sorted(unknown)} may not be passed to git")
    env = {name: os.environ[name] for name in PASS_THROUGH if name in os.environ}
    env.setdefault("PATH", os.defpath)
    return {**env, **BASE_ENV, **extra}


def program_identity() -> str:
    """The git program every call runs, as its resolved path and file identity (size, mtime,
    inode: an upgrade replaces the file): what a recorded result of git's work depends on."""
    found = shutil.which("git", path=sealed_env()["PATH"])
    if found is None:
        return "no git"
    real = os.path.realpath(found)
    st = os.stat(real)
    return f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"


class Repo:
    """One repository: its path, whether it is bare, and the one funnel every git call of it
    goes through."""

    def __init__(self, path: Path | str, bare: bool = False) -> None:
        # absolute: a bare repository's git runs in patchkit's scratch folder (scratch.cwd)
        self.path = Path(os.path.abspath(path)) if bare else Path(path)
        self.bare = bare

    def __repr__(self) -> str:
        return f"Repo({str(self.path)!r}, bare={self.bare})"

    def command(self, *args: str) -> list[str]:
        cmd = ["git", *CONFIG]
        if self.bare:
            cmd += ["--git-dir", str(self.path)]
        else:
            cmd += filter_overrides(self.path)
        return cmd + list(args)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = sealed_env(extra)
        if not self.bare:
            # Repository discovery stops at `path`: a missing .git never finds an enclosing one.
            env["GIT_CEILING_DIRECTORIES"] = str(self.path.absolute().parent)
        return env

    def run(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        binary: bool = False,
        check: bool = True,
    ) -> str | bytes:
        """Run one git command and return its stdout (raises GitError on failure).

        On an interrupt (SIGINT, or SIGTERM mapped to KeyboardInterrupt) git is stopped and
        waited for before the exception goes on. git inherits patchkit's held lock files, so
        a git that outlives a killed patchkit keeps the lock until it exits: the next run
        waits for it instead of sweeping a repository that git is still writing.
        """
        proc = self._start(
            args,
            env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = proc.communicate(stdin)
        except BaseException:
            _stop(proc)
            raise
        finally:
            if self.bare:
                scratch.empty_cwd()
        if proc.returncode != 0:
            _raise_for(self, list(args), proc.returncode, err, check)
        return out if binary else out.decode("utf-8", "replace")

    @contextmanager
    def running(self, *args: str) -> Iterator[None]:
        """Run one git command while the with-body runs; leaving the body waits for it and
        raises GitError if it failed. An exception in the body (an interrupt) stops git and
        waits for it before going on."""
        with tempfile.TemporaryFile() as err:
            # stderr in a file: a pipe nobody reads could fill and stall git
            proc = self._start(
                args, None, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
            )
            try:
                yield
                proc.wait()
            except BaseException:
                _stop(proc)
                raise
            finally:
                if self.bare:
                    scratch.empty_cwd()
            if proc.returncode != 0:
                err.seek(0)
                _raise_for(self, list(args), proc.returncode, err.read())

    def _start(self, args, env, **streams) -> subprocess.Popen:
        """The one place a git process is started (the sealed environment, the held locks)."""
        return subprocess.Popen(
            self.command(*args),
            cwd=scratch.cwd() if self.bare else str(self.path),
            env=self.env(env),
            pass_fds=held_lock_fds(),
            **streams,
        )

    def ok(self, *args: str, env: dict[str, str] | None = None) -> bool:
        """True when the git command exits 0."""
        try:
            self.run(*args, env=env)
        except GitError:
            return False
        return True

    def git_dir(self) -> Path:
        if self.bare:
            return self.path
        return Path(str(self.run("rev-parse", "--absolute-git-dir")).strip())


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()  # git removes its own lock files on SIGTERM
    proc.wait()


def _raise_for(repo: Repo, args: list[str], status: int, err: bytes, check: bool = True) -> None:
    """The one mapping of a failed git call to an exception: a fault (see _FAULTS) always, a
    lock or a missing object only where the caller asked git to succeed (`check`)."""
    text = err.decode("utf-8", "replace")
    fault = _fault(repo, args, status, text)
    if fault is not None:
        raise fault
    if not check:
        return
    lock = _LOCK_RE.search(text)
    if lock:
        raise GitLockError(args, status, text, lock.group(1))
    if _MISSING_OBJECT.search(text):
        objects = f"{repo.path if repo.bare else repo.path / '.git'}/objects"
        raise MissingObjectsError(
            args, status, text, _damaged(repo, objects, text), _repair_hint(repo, objects)
        )
    raise GitError(args, status, text)


def _fault(repo: Repo, args: list[str], status: int, text: str) -> GitFaultError | None:
    for pattern, kind in _FAULTS:
        found = pattern.search(text)
        if found is None:
            continue
        named = found.group(1) if pattern.groups else str(repo.path)
        if kind == "owner":
            return OwnershipError(args, status, text, *_ownership(named))
        if kind == "file":
            return DamagedRepositoryError(
                args, status, text, _damaged(repo, named, text), _repair_hint(repo, named)
            )
        if kind == "space":
            return NoSpaceError(args, status, text, *_no_space(repo, text))
        return PathTooLongError(args, status, text, *_too_long(repo, text))
    return None


def _git_words(text: str) -> str:
    """git's first line of complaint, without its `fatal:`/`error:` prefix."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return re.sub(r"^(?:fatal|error): ", "", line)[:300]


def _damaged(repo: Repo, named: str, text: str) -> str:
    words = _git_words(text)
    if named in words:
        return f"the git repository {repo.path} is damaged: {words}"
    return f"the git repository {repo.path} is damaged: {named} cannot be read ({words})"


def _repair_hint(repo: Repo, named: str) -> str:
    """A mirror (`<cache>/mirrors/<target>.git`) patchkit makes again; anything else is the
    user's: patchkit names the file and never removes it."""
    if repo.bare and repo.path.parent.name == "mirrors" and repo.path.suffix == ".git":
        target = repo.path.stem
        return (
            f"remove the mirror ({repo.path}); the next run fetches or imports it again "
            f"(`patchkit fetch --target {target}`)"
        )
    return f"repair {named} (`git fsck` in {repo.path} names what is wrong), then run again"


def _ownership(where: str) -> tuple[str, str]:
    return (
        f"git refuses {where}: it belongs to another user (git's ownership check, "
        "safe.directory: 'dubious ownership'); nothing was changed",
        "run patchkit as the user who owns it, or give it to yourself (chown); patchkit reads "
        "no global git config, so a safe.directory entry there does not apply",
    )


def _no_space(repo: Repo, text: str) -> tuple[str, str]:
    tmp = os.environ.get("TMPDIR") or tempfile.gettempdir()
    return (
        f"git ran out of disk space working in {repo.path} ({_git_words(text)})",
        f"free space on the file systems of {repo.path} and of TMPDIR ({tmp}), or point "
        "TMPDIR or PATCHKIT_CACHE at one with room, then run again",
    )


def _too_long(repo: Repo, text: str) -> tuple[str, str]:
    return (
        f"a path is too long for git or the file system in {repo.path} ({_git_words(text)})",
        "use a shorter folder (--into, PATCHKIT_CACHE, TMPDIR), then run again",
    )


def run(
    repo: Path | str,
    *args: str,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    binary: bool = False,
    check: bool = True,
    bare: bool = False,
) -> str | bytes:
    """Run one git command in `repo` (see Repo.run)."""
    return Repo(repo, bare).run(*args, env=env, stdin=stdin, binary=binary, check=check)


def ok(repo: Path | str, *args: str, env: dict[str, str] | None = None, bare: bool = False) -> bool:
    """True when the git command exits 0."""
    return Repo(repo, bare).ok(*args, env=env)


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

    `dest` shares no file with the mirror, so damage to one never reaches the other, and the
    two may live on different file systems: the mirror's packs are copied (a reflink where the
    file system offers one), and the loose objects reachable from `tips` (default: every ref)
    are streamed as one pack that `git index-pack` writes inside `dest`. Nothing is written
    into the mirror.
    """
    run(dest.parent, "init", "--quiet", "--", str(dest))
    _copy_objects(mirror, dest, tips)


def clone_checked_out(
    mirror: Path,
    dest: Path,
    tips: list[str],
    refs: dict[str, str],
    branch: str,
    sha: str,
    base: str | None = None,
) -> None:
    """`clone_local(mirror, dest, tips)` with `refs` set and `branch` at `sha` checked out.

    The files are written while the objects are copied in (packs and loose objects): until
    the copy is complete the checkout reads the mirror's objects through an alternates
    entry, removed then, so the clone ends sharing no file with the mirror, as clone_local's
    does. With `base` (a commit every tip descends from), the loose objects are found from
    the base's object list and those the tips add to it, not by walking every tip's tree,
    and the clone ends at the base: a base with parents is named in its `shallow` file.
    """
    run(dest.parent, "init", "--quiet", "--", str(dest))
    alternates = dest / ".git" / "objects" / "info" / "alternates"
    alternates.parent.mkdir(parents=True, exist_ok=True)
    alternates.write_bytes(_quoted_path(mirror.resolve() / "objects") + b"\n")
    with Repo(dest).running("checkout", "--quiet", "-B", branch, sha):
        _copy_objects(mirror, dest, tips, base)
        update_refs(dest, refs)
    alternates.unlink()
    # Every object of the result is the clone's own (a mirror missing some would otherwise
    # have lent them through the entry just removed): one walk, about 4 ms for sglang.
    run(dest, "rev-list", "--objects", "--quiet", *tips)


def _quoted_path(path: Path) -> bytes:
    """A path as git's alternates file reads it quoted (any byte but NUL may be in it)."""
    raw = os.fsencode(path)
    for byte, escaped in ((b"\\", b"\\\\"), (b'"', b'\\"'), (b"\n", b"\\n"), (b"\t", b"\\t")):
        raw = raw.replace(byte, escaped)
    return b'"' + raw + b'"'


def _copy_objects(
    mirror: Path, dest: Path, tips: list[str] | None, base: str | None = None
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
        rest = _copy_loose(mirror, dest / ".git", list(dict.fromkeys(named)))
        if rest:
            _stream_objects(mirror, dest, [], rest)
        copy_packs(mirror / "objects" / "pack", dest / ".git" / "objects" / "pack")
        # shallow at the base: its history is named by no copy, read by no verb, slow to walk
        if parents_of(mirror, base, bare=True) or base in _shallow_commits(mirror):
            _write_shallow(dest / ".git", [base])
        return
    _stream_objects(
        mirror, dest, ["--revs", "--incremental", *([] if tips else ["--all"])], tips or []
    )
    copy_packs(mirror / "objects" / "pack", dest / ".git" / "objects" / "pack")
    if (mirror / "shallow").is_file():  # a shallow fetch: the clone ends where the mirror does
        _copy_file(mirror / "shallow", dest / ".git" / "shallow")


def _shallow_commits(repo: Path) -> set[str]:
    """The commits the bare `repo`'s `shallow` file names (a fetch with --depth cut their
    parents off)."""
    try:
        return set((repo / "shallow").read_text(encoding="ascii").split())
    except FileNotFoundError:
        return set()


def _write_shallow(git_dir: Path, commits: list[str]) -> None:
    """`git_dir`'s `shallow` file naming `commits`: git reads each as a commit without
    parents, so neither a walk nor a fetch goes past it (written whole, then renamed)."""
    tmp = git_dir / "shallow.patchkit-tmp"
    tmp.write_text("".join(f"{c}\n" for c in sorted(commits)), encoding="ascii")
    os.replace(tmp, git_dir / "shallow")


def _stream_objects(mirror: Path, dest: Path, args: list[str], lines: list[str]) -> None:
    """`pack-objects` of the mirror into `index-pack` of `dest` (`lines`: its input)."""
    # No delta search (--window=0) and zlib's fastest level: git am writes these objects
    # loose, undeltified and at that level (core.looseCompression); the search was a third
    # of a 1,000-patch apply, the default level two thirds of this stream's time.
    stream = bytes(
        run(
            mirror,
            *("-c", "pack.compression=1", "pack-objects", "--quiet", "--window=0", "--stdout"),
            *args,
            stdin="".join(f"{line}\n" for line in lines).encode(),
            binary=True,
            bare=True,
        )
    )
    if len(stream) > 32:  # header and trailer only: no object was missing
        run(dest, "index-pack", "--stdin", stdin=stream)


def _copy_loose(mirror: Path, git_dir: Path, oids: list[str]) -> list[str]:
    """Copy those of `oids` that are loose in the bare `mirror` into `git_dir`'s objects as
    files (each written whole, then renamed), after checking that each inflates to bytes
    that hash to its id; return the others (packed, or packed meanwhile)."""
    source, target = mirror / "objects", git_dir / "objects"
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


def resolve(repo: Path, ref: str, bare: bool = False) -> str | None:
    """The commit id `ref` names in `repo`, or None."""
    if not ref or ref.startswith("-"):
        return None  # never an option
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
    run(repo, *args, "--", _source_argument(source), *refspecs, bare=bare)


def list_remote(source: str) -> dict[str, str]:
    """ref name -> sha of a remote (tags peeled)."""
    out = Repo(_NOWHERE, bare=True).run("ls-remote", "--", _source_argument(source))
    refs = {}
    for line in str(out).splitlines():
        sha, _, name = line.partition("\t")
        refs[name.removesuffix("^{}")] = sha
    return refs


def update_ref(repo: Path, ref: str, sha: str, bare: bool = False) -> None:
    run(repo, "update-ref", ref, sha, bare=bare)


def update_refs(repo: Path, refs: dict[str, str], bare: bool = False) -> None:
    """Point every ref of `refs` at its commit, all or none (one transaction)."""
    lines = "".join(f"update {ref} {sha}\n" for ref, sha in refs.items())
    run(repo, "update-ref", "--stdin", stdin=lines.encode(), bare=bare)


def unreachable_loose_objects(repo: Path) -> list[str]:
    """The loose objects of a bare repository that no ref reaches (whatever their age)."""
    out = str(run(repo, "prune", "--dry-run", "--expire=now", bare=True))
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def prune_unreachable(repo: Path, older_than: float) -> None:
    """Remove the loose objects no ref reaches whose files are older than `older_than` (a
    Unix time); git keeps any object a younger unreachable object needs."""
    run(repo, "prune", f"--expire=@{int(older_than)}", bare=True)


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
    path = scratch.new_path("index-")
    env = {"GIT_INDEX_FILE": path}
    try:
        read_tree_into(repo, env, tree, bare=bare)
        yield env
    finally:
        for leftover in (path, path + ".lock"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def import_directory(repo: Path, source: Path, message: str, who: Identity) -> str:
    """Commit every file under `source` (ignore rules off) as a parentless commit."""
    index = scratch.new_path("import-index-")
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
    return _apply_cached(repo, env, [*args, str(patch_file)], bare)


def _apply_cached(repo: Path, env: dict[str, str], args: list[str], bare: bool) -> tuple[bool, str]:
    try:
        run(repo, *args, env=env, bare=bare)
    except GitError as exc:
        return False, exc.stderr
    return True, ""


def apply_all_to_index(
    repo: Path, env: dict[str, str], patch_files: list[Path], bare: bool = False
) -> bool:
    """One `git apply --cached` of several patches, in order, into the scratch index. git
    checks every patch before it writes the index: when one does not apply, the index is
    left as it was and False is returned."""
    args = ["apply", "--cached", "--whitespace=nowarn", *map(str, patch_files)]
    return _apply_cached(repo, env, args, bare)[0]


def patch_file_paths(repo: Path, patch_files: list[Path], bare: bool = False) -> list[str]:
    """The path of every file section of `patch_files`, in order, as `git apply` reads them
    (its new name, or the old one for a deletion); one `git apply --numstat -z`, which
    applies nothing."""
    out = bytes(
        run(repo, "apply", "--numstat", "-z", *map(str, patch_files), binary=True, bare=bare)
    )
    fields = out.split(b"\0")
    paths = []
    i = 0
    while i < len(fields):
        parts = fields[i].split(b"\t", 2)
        i += 1
        if len(parts) != 3:
            continue
        name = parts[2]
        if not name and i + 1 < len(fields):  # "added\tdeleted\t\0old\0new": the new name
            name = fields[i + 1]
            i += 2
        paths.append(name.decode("utf-8", "surrogateescape"))
    return paths


def index_entries(
    repo: Path, env: dict[str, str], paths: list[str], bare: bool = False
) -> dict[str, tuple[str, str]] | None:
    """path -> (mode, blob id) of the scratch index's entries at exactly `paths` (paths it
    lacks are left out); None when one of them is unmerged."""
    found: dict[str, tuple[str, str]] = {}
    for start in range(0, len(paths), _PATHS_PER_CALL):
        chunk = paths[start : start + _PATHS_PER_CALL]
        out = bytes(
            run(
                repo, "ls-files", "-s", "-z", "--", *chunk, env={**env, **_LITERAL}, binary=True,
                bare=bare,
            )
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
    def read(cls, repo: Path, treeish: str, bare: bool = False) -> TreeModel:
        """Every folder of `treeish`, read by one `ls-tree -r -t`."""
        out = bytes(
            run(repo, "ls-tree", "-r", "-t", "-z", "--full-tree", treeish, binary=True, bare=bare)
        )
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


def commit_chain(
    repo: Path, base: str, commits: list[tuple[str, str, Identity]], bare: bool = False
) -> list[str]:
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
            parent = commit_tree(repo, tree, parent, message, who, bare=bare)
            ids.append(parent)
        return ids
    ids, bodies = [oid for oid, _ in chain], [body for _, body in chain]
    write_objects(repo, "commit", bodies, ids, bare=bare)
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


def write_objects(
    repo: Path, kind: str, bodies: list[bytes], ids: list[str], bare: bool = False
) -> None:
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
    stream = _pack_stream(_PACK_TYPES[kind], bodies, algorithm)
    run(repo, "unpack-objects", "-q", "--strict", stdin=stream, bare=bare)


_PACK_TYPES = {"commit": 1, "tree": 2, "blob": 3, "tag": 4}


def _pack_stream(type_code: int, bodies: list[bytes], algorithm: str) -> bytes:
    """A version 2 pack of whole (undeltified) objects of one type, as git's pack format
    writes them: a size-and-type header, the zlib stream, and the stream's hash at the end."""
    out = bytearray(b"PACK" + (2).to_bytes(4, "big") + len(bodies).to_bytes(4, "big"))
    for body in bodies:
        size = len(body)
        byte = (type_code << 4) | (size & 0x0F)
        size >>= 4
        while size:
            out.append(byte | 0x80)
            byte = size & 0x7F
            size >>= 7
        out.append(byte)
        out += zlib.compress(body, 0)  # stored: git inflates it and compresses what it writes
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


def tree_of(repo: Path, commit: str, bare: bool = False) -> str:
    return str(run(repo, "rev-parse", f"{commit}^{{tree}}", bare=bare)).strip()


def commit_date(repo: Path, commit: str, bare: bool = False) -> int:
    return int(str(run(repo, "show", "-s", "--format=%ct", commit, bare=bare)).strip())


def commit_message(repo: Path, commit: str, bare: bool = False) -> str:
    # A commit id names its bytes, so the message of a full id is read once per process.
    if HEX_ID_RE.match(commit):
        return _message_of_id(commit, str(repo), bare)
    return str(run(repo, "show", "-s", "--format=%B", commit, bare=bare))


# (commit id, repository, bare) -> its message as `show -s --format=%B` prints it
_MESSAGES: dict[tuple[str, str, bool], str] = {}


def _message_of_id(commit: str, repo: str, bare: bool) -> str:
    key = (commit, repo, bare)
    if key not in _MESSAGES:
        _MESSAGES[key] = str(run(repo, "show", "-s", "--format=%B", commit, bare=bare))
    return _MESSAGES[key]


def read_commits(repo: Path, names: list[str], bare: bool = False) -> dict[str, str | None]:
    """name -> the commit it names (peeled), or None, for every one of `names` (commit ids
    or refs), by one `cat-file --batch`; each commit's message is kept for
    `commit_message`."""
    asked = [n for n in dict.fromkeys(names) if n and "\n" not in n and not n.startswith("-")]
    found: dict[str, str | None] = dict.fromkeys(names)
    objects = _read_batch(repo, [f"{name}^{{commit}}" for name in asked], bare)
    for name, obj in zip(asked, objects, strict=True):
        if obj is None or obj[1] != b"commit":
            continue  # missing (or ambiguous): no such commit
        oid, _, body = obj
        head, _, message = body.partition(b"\n\n")
        if b"\nencoding " not in b"\n" + head:  # else `show` re-encodes it: read it there
            # as `show --format=%B` prints it: the message and one newline after it
            _MESSAGES[(oid, str(repo), bare)] = message.decode("utf-8", "replace") + "\n"
        found[name] = oid
    return found


def _read_batch(repo: Path, names: list[str], bare: bool) -> list[tuple[str, bytes, bytes] | None]:
    """(id, type, bytes) of the object each of `names` names, or None where git has none,
    by one `cat-file --batch`."""
    if not names:
        return []
    lines = "".join(f"{name}\n" for name in names).encode()
    data = bytes(run(repo, "cat-file", "--batch", stdin=lines, binary=True, bare=bare))
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
    """Bring one commit (and its history) from another local repository. Where the source
    is shallow (a mirror's `--depth=1` fetch) and `repo` lacks what it cut off, the cut is
    added to `repo`'s `shallow` file (`--update-shallow`): else git takes the objects, says
    nothing, and `repo` names parents it does not hold."""
    run(
        repo, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--update-shallow",
        "--", str(source), sha,
    )  # fmt: skip


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
    return _trailer_fields(str(run(repo, "show", "-s", f"--format={_TRAILERS}", commit)))


def trailers_in_range(repo: Path, base: str, tip: str) -> list[tuple[str, dict[str, str]]]:
    """Each commit of base..tip, oldest first (as `rev_list`), with its trailers (as
    `trailers_of`), read by one git process instead of one per commit."""
    out = str(run(repo, "log", "--reverse", f"--format=%x00%H%x00{_TRAILERS}", f"{base}..{tip}"))
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
    # The sealed environment (no user or system configuration, pinned settings): the bytes
    # depend on the commits and git only.
    return bytes(
        run(repo, "-c", "diff.renames=true", *EXPORT_ARGS, f"{base}..{tip}", binary=True, bare=bare)
    )


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


def _entry_modes(repo: Path, commit: str, paths: list[str], bare: bool = False) -> dict[str, str]:
    """path -> mode of the tree entry (file, link or folder) each of `paths` names in
    `commit`, taken literally; paths it lacks are left out."""
    modes: dict[str, str] = {}
    # In chunks: the paths of a long series would overflow one command line.
    for start in range(0, len(paths), _PATHS_PER_CALL):
        chunk = paths[start : start + _PATHS_PER_CALL]
        out = str(
            run(repo, "ls-tree", "-z", "--full-tree", commit, "--", *chunk, env=_LITERAL, bare=bare)
        )
        for entry in out.split("\0"):
            meta, _, name = entry.partition("\t")
            if name:
                modes[name] = meta.split(" ", 1)[0]
    return modes


_PATHS_PER_CALL = 2000


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
    links: dict[str, str] = {}
    for name, mode in _entry_modes(repo, commit, sorted(prefixes), bare=bare).items():
        if mode != SYMLINK_MODE:
            continue
        for path in prefixes.get(name, []):
            if path not in links or len(name) < len(links[path]):
                links[path] = name
    return links


def loose_objects_of(repo: Path, commit: str) -> tuple[str, ...]:
    """`commit`'s objects (itself, its trees and blobs) that are loose in the bare `repo`.

    Read once per process for each set of packs: an object is loosened only out of a pack
    that is then removed (`unpack-objects` and a deleted pack), which changes the set; one
    loose when read and packed since is still found by its id, and skipped where its file
    is looked at."""
    try:
        packs = tuple(
            sorted(n for n in os.listdir(repo / "objects" / "pack") if n.endswith(".pack"))
        )
    except FileNotFoundError:
        packs = ()
    return _loose_objects_of(Path(repo), commit, packs)


@functools.lru_cache(maxsize=32)
def _loose_objects_of(repo: Path, commit: str, packs: tuple[str, ...]) -> tuple[str, ...]:
    root = os.fspath(repo / "objects")  # one `stat` per object
    ids = object_ids(repo, commit, bare=True)
    return tuple(oid for oid in ids if os.path.exists(f"{root}/{oid[:2]}/{oid[2:]}"))


# (repository, tip, base) -> objects_since's lines, as last read
_SINCE: dict[tuple[str, str, str], tuple[str, ...]] = {}


def objects_since(repo: Path, tip: str, base: str, fresh: bool = False) -> tuple[str, ...]:
    """`rev-list --objects --parents tip --not base` of the bare `repo`, as lines: the
    commits first (each with its parents), then every tree and blob they add to the base's
    (`<id> <path>`); a missing object fails it (GitError). Ids name their bytes, so the list
    for two ids never changes and is read once per process; `fresh` reads it again, for a
    caller that needs the objects to be there now."""
    key = (str(repo), tip, base)
    if fresh or key not in _SINCE:
        out = run(repo, "rev-list", "--objects", "--parents", tip, "--not", base, bare=True)
        _SINCE[key] = tuple(str(out).splitlines())
    return _SINCE[key]


def chain_present(repo: Path, base: str, commits: list[str]) -> bool:
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
    root = repo / "objects"
    for oid in [*commits, *(line.split(" ", 1)[0] for line in lines[len(want) :])]:
        # packed (`prune` keeps packs), or another user's file: as for git's own freshening,
        # one that cannot be touched stays as it is (a prune may take it; then a build)
        with contextlib.suppress(OSError):
            os.utime(root / oid[:2] / oid[2:])
    return True


def object_ids(repo: Path, commit: str, bare: bool = False) -> list[str]:
    """The ids of `commit` and every tree and blob of its tree (read once per process for a
    repository and commit: an id names its bytes)."""
    return list(_object_ids(Path(repo), commit, bare))


def parents_of(repo: Path, commit: str, bare: bool = False) -> tuple[str, ...]:
    """The parents of `commit` as `repo` reads them (none for a root commit, nor for one
    its `shallow` file names), from the one `rev-list` that `object_ids` reads."""
    return _object_listing(Path(repo), commit, bare)[1]


def _object_ids(repo: Path, commit: str, bare: bool) -> tuple[str, ...]:
    return _object_listing(repo, commit, bare)[0]


@functools.lru_cache(maxsize=32)
def _object_listing(repo: Path, commit: str, bare: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the ids of `commit`, its trees and blobs; its parents): one `rev-list`, whose first
    line is the commit's id followed by its parents' (`--parents`)."""
    listing = str(run(repo, "rev-list", "--objects", "--parents", "--no-walk", commit, bare=bare))
    lines = [line for line in listing.splitlines() if line]
    parents = tuple(lines[0].split(" ")[1:]) if lines else ()
    return tuple(line.split(" ", 1)[0] for line in lines), parents


def corrupt_objects(repo: Path, commit: str, bare: bool = False) -> list[str]:
    """Objects of `commit` and its tree whose bytes no longer hash to their id (a damaged or
    tampered mirror); git itself does not re-hash objects when it reads them."""
    ids = object_ids(repo, commit, bare=bare)
    algorithm = _hash_name(repo, bare)
    bad = []
    for oid, obj in zip(ids, _read_batch(repo, ids, bare), strict=True):
        if obj is None:
            bad.append(oid)
            continue
        _, kind, body = obj
        if hashlib.new(algorithm, kind + b" %d\0" % len(body) + body).hexdigest() != oid:
            bad.append(oid)
    return bad


def _algorithm_of(oid: str) -> str:
    """The hash an object id of this length is made with."""
    return "sha256" if len(oid) == 64 else "sha1"


def _hash_name(repo: Path, bare: bool) -> str:
    fmt = str(run(repo, "rev-parse", "--show-object-format", bare=bare, check=False)).strip()
    return "sha256" if fmt == "sha256" else "sha1"


def stale_lock_files(git_dir: Path, loose_temporaries: bool = True) -> list[Path]:
    """What a git killed with SIGKILL leaves in a repository: its `*.lock` files and its
    temporary packs and objects (`tmp_pack_*`, `tmp_idx_*`, `tmp_obj_*`, `incoming-*`).
    `loose_temporaries=False` leaves out the `tmp_obj_*` files of the loose-object folders
    (listing those reads every loose object's name: 10 ms at 15,000 of them).

    Only for a repository whose writers all hold a patchkit lock (the mirrors), or in a
    checkout whose journal proves patchkit's git was the one killed there.
    """
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


def empty_tree(repo: Path) -> str:
    """The id of the empty tree in `repo`'s hash (what an unborn branch's checkout starts
    from)."""
    return str(run(repo, "hash-object", "-t", "tree", "-w", "--stdin", stdin=b"")).strip()


def unborn_checkout(repo: Path, branch: str) -> None:
    """Put `repo` back on the unborn `branch`: every tracked file removed, the index emptied
    (the caller has checked that each tracked file is one the interrupted checkout wrote)."""
    for name in _names(run(repo, "ls-files", "-z", env=_LITERAL)):
        with contextlib.suppress(FileNotFoundError):
            (repo / name).unlink()
        for folder in (repo / name).parents:  # the folders the checkout made, once empty
            if folder == repo or not folder.is_relative_to(repo):
                break
            try:
                folder.rmdir()
            except OSError:
                break
    run(repo, "read-tree", "--empty")
    run(repo, "symbolic-ref", "HEAD", f"refs/heads/{branch}")


def force_checkout(repo: Path, sha: str, branch: str | None) -> None:
    """Check out `sha` (on `branch`, else detached), overwriting tracked files and index."""
    if branch:
        run(repo, "checkout", "--quiet", "--force", "-B", branch, sha)
    else:
        run(repo, "checkout", "--quiet", "--force", "--detach", sha)


def remote_tag(source: str, tag: str) -> str | None:
    """The commit the tag `tag` names in a remote (peeled), or None when it has no such tag."""
    out = str(
        Repo(_NOWHERE, bare=True).run(
            "ls-remote",
            "--tags",
            "--",
            _source_argument(source),
            f"refs/tags/{tag}",
            f"refs/tags/{tag}^{{}}",
        )
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


def tree_with_files(repo: Path, commit: str, files: dict[str, bytes], bare: bool = False) -> str:
    """The tree of `commit` with each path of `files` holding those bytes (mode kept; new
    files 100644); written to the object store, no work tree or ref touched."""
    modes = _entry_modes(repo, commit, sorted(files), bare=bare) if files else {}
    with scratch_index(repo, commit, bare=bare) as env:
        for path, data in sorted(files.items()):
            blob = str(run(repo, "hash-object", "-w", "--stdin", stdin=data, bare=bare)).strip()
            mode = modes.get(path, "100644")
            entry = f"{mode},{blob},{path}"
            run(repo, "update-index", "--add", "--cacheinfo", entry, env=env, bare=bare)
        return write_tree(repo, env, bare=bare)


def status_entries(repo: Path) -> list[str]:
    """`XY path` for every changed, unmerged or untracked path of a work tree."""
    out = str(run(repo, "status", "--porcelain=v1", "--untracked-files=all", "-z"))
    return [entry for entry in out.split("\0") if len(entry) > 3]


# --- the state of a user's checkout ---------------------------------------------------------

# What an unfinished git operation leaves in the git directory, and how a user finishes it.
OPERATIONS = (
    ("rebase-merge", "rebase", "git rebase --continue, or git rebase --abort"),
    ("rebase-apply/applying", "git am", "git am --continue, or git am --abort"),
    ("rebase-apply", "rebase", "git rebase --continue, or git rebase --abort"),
    ("MERGE_HEAD", "merge", "git merge --continue, or git merge --abort"),
    ("CHERRY_PICK_HEAD", "cherry-pick", "git cherry-pick --continue, or git cherry-pick --abort"),
    ("REVERT_HEAD", "revert", "git revert --continue, or git revert --abort"),
    ("sequencer", "cherry-pick or revert", "git cherry-pick --continue, or --abort"),
    ("BISECT_LOG", "bisect", "git bisect reset"),
)


def operation_in_progress(repo: Repo) -> tuple[str, str, str] | None:
    """(what, the file that says so, how to finish it) for an unfinished git operation."""
    git_dir = repo.git_dir()
    for marker, what, finish in OPERATIONS:
        if (git_dir / marker).exists():
            return what, str(git_dir / marker), finish
    return None


def contained_in_refs(repo: Repo, sha: str) -> bool:
    """True when a branch, tag or remote-tracking ref contains `sha`."""
    out = str(
        repo.run(
            "for-each-ref", "--count=1", "--contains", sha, "refs/heads", "refs/tags",
            "refs/remotes",
        )
    )  # fmt: skip
    return bool(out.strip())


def _names(out: str | bytes) -> list[str]:
    return [p for p in str(out).split("\0") if p]


def _blobs(repo: Repo, commit: str | None, paths: list[str]) -> dict[str, str]:
    """path -> blob id in `commit` for those of `paths` it holds."""
    if not commit or not paths:
        return {}
    out = str(
        repo.run(
            "ls-tree", "-r", "-z", "--full-tree", commit, "--", *paths,
            env={"GIT_LITERAL_PATHSPECS": "1"},
        )
    )  # fmt: skip
    found = {}
    for entry in out.split("\0"):
        meta, _, name = entry.partition("\t")
        if name:
            found[name] = meta.split(" ")[2]
    return found


def _worktree_blob(repo: Repo, path: str, algorithm: str) -> str | None:
    full = repo.path / path
    if full.is_symlink():
        data = os.readlink(full).encode()
    elif full.is_file():
        data = full.read_bytes()
    else:
        return None
    return hashlib.new(algorithm, b"blob %d\0" % len(data) + data).hexdigest()


def untracked_in_the_way(repo: Repo, source: Repo, result: str) -> list[str]:
    """Untracked files (ignored or not) of the checkout `repo` where `result` (a commit of
    `source`) has a file, or at a parent directory of one: what `git checkout` would
    overwrite (ignored files) or refuse. Reads nothing into `repo`."""
    wanted = _names(source.run("ls-tree", "-r", "-z", "--name-only", "--full-tree", result))
    tracked = set(_names(repo.run("ls-files", "-z")))
    blocked: list[str] = []
    seen: set[str] = set()
    for path in wanted:
        if path in tracked:
            continue
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            full = repo.path / prefix
            if prefix in seen or not os.path.lexists(full):
                break
            last = i == len(parts)
            if (last or full.is_symlink() or not full.is_dir()) and prefix not in tracked:
                blocked.append(prefix)
                seen.add(prefix)
                break
    return sorted(blocked)


def interrupted_checkout_state(
    repo: Repo, head: str | None, branch: str | None, result: str, result_branch: str
) -> tuple[str, list[str]]:
    """Where a checkout from `head` (on `branch`) to `result` stopped, judged from the files.

    "finished": HEAD is the result on its branch (git moves HEAD last). "interrupted": HEAD
    is still where it was and every difference from it is a path the checkout changes, holding
    either the old bytes, the new bytes or nothing. Anything else is "changed", with a line
    for each thing that differs from what the interrupted checkout could have left.
    """
    now_head, now_branch = resolve(repo.path, "HEAD"), current_branch(repo.path)
    if now_head == result and now_branch == result_branch:
        return "finished", []
    if now_head != head or now_branch != branch:
        was = f"{(head or '?')[:12]} on {branch or 'a detached HEAD'}"
        now = f"{(now_head or '?')[:12]} on {now_branch or 'a detached HEAD'}"
        return "changed", [f"HEAD is now {now}; the interrupted apply left it at {was}"]
    if head is None:  # an unborn branch: the checkout started from nothing
        head = empty_tree(repo.path)
    moving = _names(repo.run("diff", "--name-only", "-z", "--no-renames", head, result))
    moving_set = set(moving)
    problems = []
    differs = set(_names(repo.run("diff", "--name-only", "-z", "--no-renames", head)))
    differs |= set(_names(repo.run("diff", "--cached", "--name-only", "-z", "--no-renames", head)))
    for path in sorted(differs - moving_set):
        problems.append(f"{path} was changed")
    old, new = _blobs(repo, head, moving), _blobs(repo, result, moving)
    algorithm = _hash_name(repo.path, False)
    staged = {}
    for entry in _names(
        repo.run("ls-files", "-s", "-z", "--", *moving, env=_LITERAL) if moving else ""
    ):
        meta, _, name = entry.partition("\t")
        staged[name] = meta.split(" ")[1]
    for path in moving:
        allowed = {old.get(path), new.get(path), None}
        if _worktree_blob(repo, path, algorithm) not in allowed:
            problems.append(f"{path} was edited")
        elif staged.get(path) not in allowed:
            problems.append(f"{path} was staged with other content")
    return ("changed", problems) if problems else ("interrupted", [])
