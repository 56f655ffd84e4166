"""The one funnel every git process of patchkit goes through: the sealed environment, the
pinned settings, and `Repo`, which knows its path and whether it is bare.

Every verb of this package takes a `Repo`, made once where a repository enters the code:
`Repo.bare_at(path)` for a mirror, `Repo.checkout(path)` for a work tree.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from patchkit import scratch
from patchkit.gitops.faults import GitError, GitFaultError, raise_for
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


# ls-remote needs no repository; running it in a bare "repository" that cannot exist keeps
# git from discovering and reading the configuration of whatever the cwd is inside.
_NOWHERE = "/dev/null/no-repository"


_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}

GIT_TIMEOUT = 3600.0
STOP_GRACE = 10.0


HEX_ID_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})\Z")  # a full object id (sha1, sha256)


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
        keys = Repo.bare_at(_NOWHERE).run(
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

    @classmethod
    def bare_at(cls, path: Path | str) -> Repo:
        """The bare repository at `path` (a mirror of the cache)."""
        return cls(path, bare=True)

    @classmethod
    def checkout(cls, path: Path | str) -> Repo:
        """The work tree at `path` (a user's checkout, a rebase's scratch clone)."""
        return cls(path)

    def __repr__(self) -> str:
        kind = "bare_at" if self.bare else "checkout"
        return f"Repo.{kind}({str(self.path)!r})"

    def __str__(self) -> str:  # in messages and hints: the folder a user can go to
        return str(self.path)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Repo) and (self.path, self.bare) == (other.path, other.bare)

    def __hash__(self) -> int:  # a key of the per-process caches of what an id names
        return hash((self.path, self.bare))

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
            out, err = proc.communicate(stdin, timeout=child_timeout())
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise _timed_out(args) from None
        except BaseException:
            _stop(proc)
            raise
        finally:
            if self.bare:
                scratch.empty_cwd()
        if proc.returncode != 0:
            raise_for(self, list(args), proc.returncode, err, check)
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
                proc.wait(child_timeout())
            except subprocess.TimeoutExpired:
                _stop(proc)
                raise _timed_out(args) from None
            except BaseException:
                _stop(proc)
                raise
            finally:
                if self.bare:
                    scratch.empty_cwd()
            if proc.returncode != 0:
                err.seek(0)
                raise_for(self, list(args), proc.returncode, err.read())

    def _start(self, args, env, **streams) -> subprocess.Popen:
        """The one place a git process is started (the sealed environment, the held locks).

        Interrupts are held while git starts: one that landed inside `Popen` left a git
        running unwatched, still writing into a folder the clean-up was removing. Delivered
        once `Popen` returns, it stops that git and waits for it like any later one."""
        cwd = scratch.cwd() if self.bare else str(self.path)
        proc = None
        try:
            with scratch.signals_held():
                proc = subprocess.Popen(
                    self.command(*args),
                    cwd=cwd,
                    env=self.env(env),
                    pass_fds=held_lock_fds(),
                    **streams,
                )
        except BaseException:
            if proc is not None:
                _stop(proc)
            raise
        return proc

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
    try:
        proc.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:  # a git (or a program named git) that ignores SIGTERM
        proc.kill()
        proc.wait()


def child_timeout() -> float:
    """How long one git child may run: $PATCHKIT_GIT_TIMEOUT seconds, else an hour (a fetch
    of a large history on a slow link fits; a git that hangs does not hold a run for ever)."""
    try:
        seconds = float(os.environ.get("PATCHKIT_GIT_TIMEOUT", ""))
    except ValueError:
        return GIT_TIMEOUT
    return seconds if seconds > 0 else GIT_TIMEOUT


def _timed_out(args) -> GitFaultError:
    shown = " ".join(str(a) for a in args[:6]) + (" ..." if len(args) > 6 else "")
    seconds = child_timeout()
    return GitFaultError(
        list(args),
        -1,
        "",
        f"git {shown} did not finish within {seconds:g} s; it was stopped",
        "check the git on PATH and the network, or set PATCHKIT_GIT_TIMEOUT for a slower one",
    )


def verb(func: Callable) -> Callable:
    """Mark a verb: it takes a `Repo` (made where the repository enters the code, with
    `Repo.bare_at` or `Repo.checkout`), never a path; a path is refused at once, since a
    guessed bareness would run git in the wrong place."""

    @functools.wraps(func)
    def call(repo: Repo, *args, **kwargs):
        if not isinstance(repo, Repo):
            raise TypeError(
                f"gitops.{func.__name__} takes a Repo (Repo.bare_at or Repo.checkout), "
                f"not {type(repo).__name__}"
            )
        return func(repo, *args, **kwargs)

    return call


def _algorithm_of(oid: str) -> str:
    """The hash an object id of this length is made with."""
    return "sha256" if len(oid) == 64 else "sha1"


def _hash_name(repo: Repo) -> str:
    """The hash `repo`'s object ids are made with."""
    fmt = str(repo.run("rev-parse", "--show-object-format", check=False)).strip()
    return "sha256" if fmt == "sha256" else "sha1"
