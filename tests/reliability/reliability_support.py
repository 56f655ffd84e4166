"""Synthetic upstreams, scratch projects and state checks for the reliability tests.

A "toy" target is a small local git repository (a few hundred files, a symlink pointing out of
the tree, one pinned tag) with a series of five patches made by `git format-patch`; it applies
in about a second, so many kills and hostile inputs fit in a CI run.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from helpers import snapshot  # noqa: F401 - re-exported for the reliability tests
from timing import FIGURES_ENV  # set by tests/timing.py for pytest-xdist's workers

ROOT = Path(__file__).resolve().parents[2]
FIGURES: dict[str, list[str]] = {}


def record(section: str, line: str) -> None:
    """Add one figure line under `section` (printed at the end of the pytest run): into the
    run's figures file where pytest-xdist's workers share one, else kept here."""
    shared = os.environ.get(FIGURES_ENV)
    if shared:
        with open(shared, "a", encoding="utf-8") as fh:  # one short line: one append
            fh.write(json.dumps([section, line]) + "\n")
    else:
        FIGURES.setdefault(section, []).append(line)


TALLY_ENV = "PATCHKIT_KILL_TALLY"  # make test-reliability: where kill points are counted


def tally_kill(count: int = 1) -> None:
    """Count `count` kill or interrupt points tried by the running test, under its file, for
    the table `make test-reliability` prints (tests/reliability/summary.py)."""
    path = os.environ.get(TALLY_ENV)
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[0]
        with open(path, "a", encoding="utf-8") as fh:  # one short line: one append
            fh.write(json.dumps([test, count]) + "\n")


GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_AUTHOR_DATE": "1700000000 +0000",
    "GIT_COMMITTER_DATE": "1700000000 +0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        env={**os.environ, **GIT_ENV},
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def cli(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "patchkit", *args],
        cwd=cwd or ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_cli(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "patchkit", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@dataclass
class Toy:
    """A synthetic upstream, its scratch project and a private cache."""

    root: Path
    upstream: Path  # bare repository standing in for the remote
    project: Path
    cache: Path
    sentinel: Path  # a directory outside every tree; nothing may ever change in it
    base: str  # pinned commit
    patches: dict[str, bytes]

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATCHKIT_PROJECT": str(self.project),
            "PATCHKIT_CACHE": str(self.cache),
            "PATCHKIT_OFFLINE_GIT": "0",
            "PATCHKIT_INDEX_URL": "http://127.0.0.1:9/simple",
        }

    def write_series(self, patches: dict[str, bytes], order: list[str] | None = None) -> None:
        d = self.project / "patches" / "toy"
        for old in d.glob("*.patch"):
            old.unlink()
        for name, raw in patches.items():
            (d / name).write_bytes(raw)
        (d / "series").write_text("".join(f"{n}\n" for n in (order or list(patches))))


def _toy_files(rng: random.Random) -> dict[str, str]:
    files = {}
    for d in range(12):
        for f in range(20):
            lines = [f"line {i} of module {d}/{f}: {rng.random():.6f}" for i in range(40)]
            files[f"pkg/mod{d:02d}/file{f:02d}.py"] = "\n".join(lines) + "\n"
    files["README.md"] = "toy upstream\n"
    return files


def make_upstream(root: Path, seed: int = 0) -> tuple[Path, str, dict[str, bytes], Path]:
    """A bare upstream with a pinned tag v1.0, a five-patch series and a sentinel directory.

    The tree holds `escape` -> the sentinel (absolute) and `pkg/up` -> `../..` (relative),
    both symlinks that lead out of the tree once checked out.
    """
    rng = random.Random(seed)
    sentinel = root / "sentinel"
    (sentinel / "sub").mkdir(parents=True)
    (sentinel / "precious.txt").write_text("do not touch\n")
    (sentinel / "sub" / "deep.txt").write_text("nor this\n")
    work = root / "upstream-work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    for path, text in _toy_files(rng).items():
        p = work / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    os.symlink(str(sentinel), work / "escape")
    os.symlink("../..", work / "pkg" / "up")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "v1.0")
    git(work, "tag", "v1.0")
    base = git(work, "rev-parse", "HEAD").strip()
    # The series: edits, an added file, a deletion, a rename.
    git(work, "checkout", "-q", "-b", "series")
    edits = [
        ("edit module 0", lambda: _edit(work / "pkg/mod00/file00.py", 5, "patched line A")),
        (
            "edit modules 1 and 2",
            lambda: (
                _edit(work / "pkg/mod01/file03.py", 10, "patched B"),
                _edit(work / "pkg/mod02/file07.py", 20, "patched C"),
            ),
        ),
        ("add a new module", lambda: _write(work / "pkg/mod03/new_module.py", "added = True\n")),
        ("delete a file", lambda: (work / "pkg/mod04/file09.py").unlink()),
        (
            "rename a file",
            lambda: (work / "pkg/mod05/file01.py").rename(work / "pkg/mod05/renamed.py"),
        ),
    ]
    for subject, change in edits:
        change()
        git(work, "add", "-A")
        git(work, "commit", "-qm", subject)
    out = root / "format-patch"
    git(
        work,
        "format-patch",
        "-q",
        "--zero-commit",
        "--no-signature",
        "--no-stat",
        "-o",
        str(out),
        f"{base}..series",
    )
    patches = {}
    for i, p in enumerate(sorted(out.glob("*.patch")), 1):
        patches[f"toy-{i:02d}.patch"] = p.read_bytes()
    bare = root / "upstream.git"
    git(root, "clone", "-q", "--bare", str(work), str(bare))
    return bare, base, patches, sentinel


def _edit(path: Path, line: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[line] = text
    path.write_text("\n".join(lines) + "\n")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


TARGETS = """\
[series]
version = "1.0.0"

[targets.toy]
git = "{git}"
subdir = ""
commit_id_file = "toy/_version.py"
pin = "1.0"

[[targets.toy.releases]]
version = "1.0"
tag = "v1.0"
commit = "{commit}"
{sdist}"""


def make_project(
    project: Path,
    upstream: Path,
    base: str,
    patches: dict[str, bytes],
    sdist_sha256: str | None = None,
) -> None:
    d = project / "patches" / "toy"
    d.mkdir(parents=True)
    sdist = ""
    if sdist_sha256:
        sdist = f'sdist = "toy==1.0"\nsdist_sha256 = "{sdist_sha256}"\n'
    (project / "patches" / "targets.toml").write_text(
        TARGETS.format(git=upstream, commit=base, sdist=sdist)
    )
    for name, raw in patches.items():
        (d / name).write_bytes(raw)
    (d / "series").write_text("".join(f"{n}\n" for n in patches))


def make_toy(root: Path, seed: int = 0) -> Toy:
    root.mkdir(parents=True, exist_ok=True)
    upstream, base, patches, sentinel = make_upstream(root, seed)
    project = root / "project"
    make_project(project, upstream, base, patches)
    return Toy(root, upstream, project, root / "cache", sentinel, base, patches)


def tag_release(
    toy: Toy,
    tag: str,
    lines: dict[str, tuple[int, str]] | None = None,
    files: dict[str, str] | None = None,
) -> None:
    """Tag `tag` on the toy upstream's main branch: `lines` rewrites line N of a file,
    `files` writes whole files."""
    work = toy.root / "upstream-work"
    git(work, "checkout", "-q", "main")
    for path, (index, text) in (lines or {}).items():
        rows = (work / path).read_text().splitlines()
        rows[index] = text
        (work / path).write_text("\n".join(rows) + "\n")
    for path, text in (files or {}).items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    git(work, "add", "-A")
    git(work, "commit", "-qm", tag)
    git(work, "tag", tag)
    git(work, "push", "-q", str(toy.upstream), "main", tag)


# --- sdists ----------------------------------------------------------------------------------


def make_sdist(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def file_member(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 1700000000
    return info, data


def toy_sdist(commit_id: str | None = None, files: int = 60) -> bytes:
    """A small, valid sdist `toy-1.0/` (recording `commit_id` in toy/_version.py if given)."""
    members = [file_member("toy-1.0/PKG-INFO", b"Metadata-Version: 2.1\nName: toy\nVersion: 1.0\n")]
    for i in range(files):
        members.append(file_member(f"toy-1.0/toy/m{i:03d}.py", f"value = {i}\n".encode() * 30))
    if commit_id:
        members.append(
            file_member(
                "toy-1.0/toy/_version.py",
                f"__version__ = '1.0'\ncommit_id = 'g{commit_id}'\n".encode(),
            )
        )
    return make_sdist(members)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def toy_sdist_project(
    root: Path, sdist: bytes, commit: str, pin_sha256: str | None = None, seed_cache: bool = True
) -> Toy:
    """A project whose only source for toy 1.0 is an sdist already in the cache."""
    root.mkdir(parents=True, exist_ok=True)
    project = root / "project"
    upstream = root / "no-such-upstream.git"
    make_project(project, upstream, commit, {}, sdist_sha256=pin_sha256 or sha256(sdist))
    cache = root / "cache"
    if seed_cache:
        (cache / "sdists").mkdir(parents=True)
        (cache / "sdists" / "toy-1.0.tar.gz").write_bytes(sdist)
    sentinel = root / "sentinel"
    sentinel.mkdir(exist_ok=True)
    (sentinel / "precious.txt").write_text("do not touch\n")
    return Toy(root, upstream, project, cache, sentinel, commit, {})


# --- state checks ----------------------------------------------------------------------------


def git_ok(repo: Path, *args: str, bare: bool = False) -> bool:
    cmd = ["git", *(["--git-dir", str(repo)] if bare else []), *args]
    return (
        subprocess.run(
            cmd, cwd=None if bare else repo, capture_output=True, env={**os.environ, **GIT_ENV}
        ).returncode
        == 0
    )


def rev(repo: Path, ref: str, bare: bool = False) -> str | None:
    cmd = [
        "git",
        *(["--git-dir", str(repo)] if bare else []),
        "rev-parse",
        "--verify",
        "-q",
        f"{ref}^{{commit}}",
    ]
    out = subprocess.run(cmd, cwd=None if bare else repo, capture_output=True, text=True)
    return out.stdout.strip() or None


def checkout_problems(tree: Path, allowed_heads: set[str]) -> list[str]:
    """Why `tree` is not a complete, clean checkout at one of `allowed_heads` (empty if it is)."""
    if not tree.exists():
        return []
    if not (tree / ".git").is_dir():
        return [f"{tree} exists but is not a checkout"]
    problems = []
    head = rev(tree, "HEAD")
    if head not in allowed_heads:
        problems.append(f"HEAD {head} is neither the old nor the new state")
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if status.returncode != 0 or status.stdout.strip():
        problems.append(f"not clean: {status.stdout.strip()[:200] or status.stderr.strip()}")
    if (tree / ".git" / "objects" / "info" / "alternates").exists():
        problems.append("it reads objects of another repository (objects/info/alternates)")
    if not git_ok(tree, "fsck", "--no-dangling", "--no-progress"):
        problems.append("git fsck fails")
    return problems


def wait_for_orphans(cache: Path) -> None:
    """A git that outlived a SIGKILLed patchkit (a repack, a prune-packed) holds the cache's
    locks until it exits, and may be moving objects meanwhile: what the next run sees is the
    cache once they are free, so that is what is checked."""
    for lock in sorted((cache / "locks").glob("*.lock")) if (cache / "locks").is_dir() else ():
        try:
            fh = lock.open()
        except FileNotFoundError:
            continue  # its holder let go and removed it
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)


def cache_problems(cache: Path, sdist_pins: dict[str, str] | None = None) -> list[str]:
    """A cache is sound when every mirror passes fsck and every sdist has its pinned hash
    (checked once no orphaned git holds a lock)."""
    wait_for_orphans(cache)
    problems = []
    for mirror in sorted((cache / "mirrors").glob("*.git")) if (cache / "mirrors").exists() else []:
        if not (mirror / "HEAD").is_file():
            problems.append(f"{mirror.name}: torn repository")
        elif not git_ok(mirror, "fsck", "--no-dangling", "--no-progress", bare=True):
            problems.append(f"{mirror.name}: fsck fails")
        else:
            refs = subprocess.run(
                ["git", "--git-dir", str(mirror), "for-each-ref", "--format=%(objectname)"],
                capture_output=True,
                text=True,
            )
            for sha in refs.stdout.split():
                if not git_ok(mirror, "cat-file", "-e", f"{sha}^{{commit}}", bare=True):
                    problems.append(f"{mirror.name}: a ref names missing {sha}")
    for name, pin in (sdist_pins or {}).items():
        path = cache / "sdists" / name
        if path.exists() and sha256(path.read_bytes()) != pin:
            problems.append(f"sdists/{name} does not match its pin (half-written?)")
    return problems


def leftovers(parent: Path, name: str, cache: Path) -> list[str]:
    """Scratch files a finished run must not leave behind."""
    found = [str(p) for p in parent.glob(f".{name}.patchkit-*")]
    found += [str(p) for p in parent.glob(f".{name}.patchkit.journal*")]
    tmp = cache / "tmp"
    if tmp.exists():
        found += [str(p) for p in tmp.iterdir()]
    sdists = cache / "sdists"
    if sdists.exists():
        found += [str(p) for p in sdists.glob(".*download-*")]
    return found


def one_or_two_lines(stderr: str) -> bool:
    """A user-facing failure: one or two `patchkit:` lines, no traceback."""
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("  [")]
    return (
        1 <= len(lines) <= 2
        and all(ln.startswith("patchkit: ") for ln in lines)
        and "Traceback" not in stderr
    )


def dedent(text: str) -> bytes:
    return textwrap.dedent(text).lstrip("\n").encode()


# --- fault injection at git-call granularity -------------------------------------------------

GIT_WRAPPER = """#!/bin/sh
# Counts the git calls patchkit makes (not those git makes of itself: their parent is git)
# and, at call number $(cat at), sends $(cat signal) to patchkit, then runs the real git as
# if nothing had happened. Shell builtins only, so it costs no extra process per call.
here={here}
read -r parent < /proc/$PPID/comm
case "$parent" in
python*)
    # A call's number is its line in `calls` (appends are atomic; patchkit runs some git
    # processes side by side, which a read-increment-write counter would number twice).
    echo "$$ $*" >> "$here/calls"
    n=0
    while read -r pid rest; do
        n=$((n + 1))
        [ "$pid" = "$$" ] && break
    done < "$here/calls"
    read -r at < "$here/at"
    if [ "$n" = "$at" ]; then
        read -r sig < "$here/signal"
        kill -"$sig" "$PPID"
    fi
    ;;
esac
exec {git} "$@"
"""


@dataclass
class GitFaults:
    """A `git` on PATH that interrupts patchkit at its Nth git call (SIGINT, SIGTERM or
    SIGKILL), the way a user's Ctrl-C, a CI timeout or the OOM killer would."""

    where: Path

    @classmethod
    def install(cls, where: Path) -> GitFaults:
        import shutil

        where.mkdir(parents=True, exist_ok=True)
        real = shutil.which("git")
        assert real, "git is needed"
        script = where / "git"
        script.write_text(GIT_WRAPPER.format(here=where, git=real))
        script.chmod(0o755)
        return cls(where)

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.where}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}

    def arm(self, at: int, signal_name: str) -> None:
        """Interrupt at call `at` (0: never) with signal `signal_name` (KILL, TERM, INT)."""
        (self.where / "calls").unlink(missing_ok=True)
        if at:
            tally_kill()
        (self.where / "at").write_text(str(at))
        (self.where / "signal").write_text(signal_name)

    def calls(self) -> list[str]:
        path = self.where / "calls"
        return path.read_text().splitlines() if path.exists() else []
