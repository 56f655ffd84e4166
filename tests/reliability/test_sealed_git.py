"""git runs sealed: a hostile ~/.gitconfig, a checkout's own hostile .git/config and a hostile
GIT_* environment (what a git hook that runs patchkit sets) change no result, run no program
and write into no other repository. Real git, real repositories, the real CLI."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from reliability_support import cli, git, make_project, one_or_two_lines, record, rev, snapshot

SECTION = "sealed git (tests/reliability/test_sealed_git.py)"


def _marker_script(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho ran "$0" >> {marker}\nexit 0\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _hostile_hooks(root: Path, marker: Path) -> Path:
    hooks = root / "hooks"
    for name in (
        "post-checkout",
        "pre-commit",
        "post-commit",
        "reference-transaction",
        "post-rewrite",
        "pre-auto-gc",
        "post-index-change",
        "pre-rebase",
    ):
        _marker_script(hooks / name, marker)
    return hooks


def _hostile_config(root: Path, marker: Path) -> str:
    hooks = _hostile_hooks(root, marker)
    fsmonitor = _marker_script(root / "fsmonitor", marker)
    gpg = _marker_script(root / "gpg", marker)
    return f"""\
[apply]
    ignoreWhitespace = change
    whitespace = fix
[i18n]
    commitEncoding = ISO-8859-1
    logOutputEncoding = ISO-8859-1
[commit]
    gpgsign = true
[gpg]
    program = {gpg}
[core]
    hooksPath = {hooks}
    fsmonitor = {fsmonitor}
    autocrlf = true
    quotePath = true
[diff]
    noprefix = true
    mnemonicPrefix = true
    external = {fsmonitor}
[color]
    ui = always
[format]
    signOff = true
    coverLetter = true
[log]
    showSignature = true
[rerere]
    enabled = true
[submodule]
    recurse = true
"""


def _exported(tree: Path, env: dict, out: Path, strip: bool = False) -> dict:
    """The series `export --out` writes from `tree` (strip: with its hostile config removed)."""
    if strip:
        config = tree / ".git" / "config"
        text = config.read_text()
        config.write_text(text[: text.index("[apply]")])
    done = cli("export", str(tree), "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr
    return snapshot(out)


@pytest.fixture
def clean_export(toy, clean_results):
    """What export writes from the clean checkout (a function of a scratch directory)."""
    return lambda root: _exported(root / "clean", toy.env, root / "clean-export")


@pytest.fixture
def clean_results(toy, tmp_path):
    """Result commit and exported series of the toy target with nothing hostile around."""
    into = tmp_path / "clean"
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert done.returncode == 0, done.stderr
    return rev(into, "HEAD")


def test_hostile_home_gitconfig_changes_nothing(toy, tmp_path, clean_results, clean_export):
    marker = tmp_path / "RAN"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(_hostile_config(tmp_path / "h", marker))
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".config" / "git" / "config").write_text(_hostile_config(tmp_path / "x", marker))
    env = {
        **toy.env,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"),
    }
    into = tmp_path / "wt"
    done = cli("apply", "--target", "toy", "--into", str(into), env=env)
    assert done.returncode == 0, done.stderr
    assert rev(into, "HEAD") == clean_results  # same commit ids: encoding, signing not used
    assert _exported(into, env, tmp_path / "e1") == clean_export(tmp_path)
    assert not marker.exists(), marker.read_text()
    record(
        SECTION,
        "hostile ~/.gitconfig and XDG config (hooks, fsmonitor, gpg, "
        "ignoreWhitespace, commitEncoding, noprefix, color): same commit ids, same export "
        "bytes, 0 programs run",
    )


def test_zero_fuzz_stays_zero_under_ignore_whitespace(toy, tmp_path):
    """A patch whose context differs from the base only in whitespace must not apply, even
    when the user's configuration asks git to ignore whitespace."""
    marker = tmp_path / "RAN"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(_hostile_config(tmp_path / "h", marker))
    name, raw = next(iter(toy.patches.items()))
    lines = raw.decode().split("\n")
    i = next(n for n, ln in enumerate(lines) if ln.startswith(" line "))
    lines[i] = lines[i].replace(" of ", "   of ", 1)  # more blanks inside a context line
    toy.write_series({name: "\n".join(lines).encode()})
    done = cli(
        "apply",
        "--target",
        "toy",
        "--into",
        str(tmp_path / "wt"),
        env={**toy.env, "HOME": str(home)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "does not apply" in done.stdout + done.stderr
    assert not (tmp_path / "wt").exists()


def test_checkout_own_config_runs_nothing(toy, tmp_path):
    """A checkout's .git/config with core.fsmonitor, hooks and a gpg program: apply onto it
    runs none of them."""
    older = tmp_path / "project-v1"
    make_project(older, toy.upstream, toy.base, dict(list(toy.patches.items())[:2]))
    into = tmp_path / "wt"
    assert (
        cli(
            "apply",
            "--target",
            "toy",
            "--into",
            str(into),
            env={**toy.env, "PATCHKIT_PROJECT": str(older)},
        ).returncode
        == 0
    )
    marker = tmp_path / "RAN"
    with (into / ".git" / "config").open("a") as fh:
        fh.write(_hostile_config(tmp_path / "h", marker))
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert done.returncode == 0, done.stderr
    assert cli("status", str(into), env=toy.env).returncode in (0, 1)
    assert _exported(into, toy.env, tmp_path / "e1") == _exported(
        into, {**toy.env, "HOME": "/nonexistent"}, tmp_path / "e2", strip=True
    )
    assert not marker.exists(), marker.read_text()
    record(
        SECTION,
        "a checkout's own .git/config with fsmonitor, hooks, gpg: apply, status "
        "and export ran 0 of its programs",
    )


def test_hostile_git_environment_writes_nowhere_else(toy, tmp_path, clean_results, clean_export):
    """GIT_DIR, GIT_INDEX_FILE, GIT_WORK_TREE, GIT_OBJECT_DIRECTORY and GIT_CONFIG_* as a git
    hook sets them: patchkit's git calls ignore them, the other repository is untouched."""
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    (other / "f.txt").write_text("mine\n")
    git(other, "add", "f.txt")
    git(other, "commit", "-qm", "mine")
    (other / "f.txt").write_text("staged later\n")
    git(other, "add", "f.txt")
    marker = tmp_path / "RAN"
    hooks = _hostile_hooks(tmp_path / "h", marker)
    before = snapshot(other)
    env = {
        **toy.env,
        "GIT_DIR": str(other / ".git"),
        "GIT_INDEX_FILE": str(other / ".git" / "index"),
        "GIT_WORK_TREE": str(other),
        "GIT_OBJECT_DIRECTORY": str(other / ".git" / "objects"),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(other / ".git" / "objects"),
        "GIT_NAMESPACE": "hostile",
        "GIT_CONFIG_COUNT": "2",
        "GIT_CONFIG_KEY_0": "core.hooksPath",
        "GIT_CONFIG_VALUE_0": str(hooks),
        "GIT_CONFIG_KEY_1": "i18n.commitEncoding",
        "GIT_CONFIG_VALUE_1": "ISO-8859-1",
        "GIT_CONFIG_PARAMETERS": f"'core.fsmonitor={hooks / 'post-checkout'}'",
        "GIT_EXEC_PATH": str(tmp_path / "nowhere"),
    }
    into = tmp_path / "wt"
    done = cli("apply", "--target", "toy", "--into", str(into), env=env)
    assert done.returncode == 0, done.stderr
    assert rev(into, "HEAD") == clean_results
    assert _exported(into, env, tmp_path / "e1") == clean_export(tmp_path)
    assert snapshot(other) == before, "patchkit wrote into the repository of GIT_DIR"
    assert not marker.exists()
    record(
        SECTION,
        "GIT_DIR/GIT_INDEX_FILE/GIT_WORK_TREE/GIT_OBJECT_DIRECTORY/GIT_CONFIG_* "
        "of another repository set: 0 bytes of it changed, same commit ids, 0 programs run",
    )


@pytest.mark.parametrize(
    "source",
    [
        "--upload-pack=touch {marker}",
        "-u touch {marker}",
        "ext::sh -c touch% {marker}",
        "fd::3",
        "gopher://example.invalid/x",
    ],
)
def test_hostile_upstream_source_refused(toy, tmp_path, source):
    marker = tmp_path / "RAN"
    source = source.format(marker=marker)
    done = cli(
        "apply",
        "--target",
        "toy",
        "--into",
        str(tmp_path / "wt"),
        "--upstream",
        source,
        env=toy.env,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert one_or_two_lines(done.stderr) and "not allowed" in done.stderr, done.stderr
    assert not marker.exists()
    assert not (tmp_path / "wt").exists()


def test_hostile_git_url_in_targets_refused(toy, tmp_path):
    """`git = "--upload-pack=..."` in targets.toml runs nothing (under apply and fetch)."""
    marker = tmp_path / "RAN"
    targets = toy.project / "patches" / "targets.toml"
    text = targets.read_text().replace(
        f'git = "{toy.upstream}"', f'git = "--upload-pack=touch {marker}"'
    )
    targets.write_text(text)
    for args in (
        ("fetch", "--target", "toy"),
        ("apply", "--target", "toy", "--into", str(tmp_path / "wt")),
    ):
        done = cli(*args, env=toy.env)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert not marker.exists(), args
    record(
        SECTION,
        "5 hostile --upstream sources and a hostile targets.toml git URL: refused "
        "with one line, 0 commands run",
    )


def test_ls_remote_outside_any_repository_reads_no_config(tmp_path, monkeypatch):
    """Listing a remote runs in no repository: the cwd's config (an fsmonitor) is not read."""
    from patchkit import gitops

    marker = tmp_path / "RAN"
    repo = tmp_path / "cwd"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "commit", "-q", "--allow-empty", "-m", "x")
    with (repo / ".git" / "config").open("a") as fh:
        fh.write(f"[core]\n    fsmonitor = {_marker_script(tmp_path / 'fsm', marker)}\n")
    monkeypatch.chdir(repo)
    assert "HEAD" in gitops.list_remote(str(repo))
    assert not marker.exists()
    assert os.environ.get("GIT_DIR") is None


def test_a_call_on_a_bare_mirror_writes_nothing_where_patchkit_runs(tmp_path, monkeypatch):
    """git takes the working directory for a work tree even with --git-dir on a bare mirror:
    `apply --cached --3way` of a patch creating a file the index already has writes that file
    there (git 2.39).  Bare calls run in a scratch folder of patchkit's own, emptied after
    each call, so the user's folder is untouched."""
    from patchkit import gitops, scratch

    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    (work / "kept.txt").write_text("base\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "base")
    (work / "new_module.py").write_text("added = True\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "add a module")
    patch = tmp_path / "add.patch"
    patch.write_text(git(work, "format-patch", "-1", "--full-index", "--stdout"))
    mirror = tmp_path / "mirror.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(mirror))
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine\n")
    before = snapshot(user)
    monkeypatch.chdir(user)
    env = {"GIT_INDEX_FILE": str(tmp_path / "scratch.index")}
    repo = gitops.Repo.bare_at(mirror)
    repo.run("read-tree", "HEAD", env=env)
    assert gitops.apply_three_way(repo, env, patch)[0] == "applied"
    assert snapshot(user) == before
    assert os.listdir(scratch.cwd()) == []


def test_relative_upstream_and_cache_paths_mean_where_patchkit_was_run(toy):
    """Bare calls run in patchkit's scratch folder, so a relative `--upstream`, `--into` and
    `PATCHKIT_CACHE` must still be read from the folder the user ran patchkit in."""
    targets = toy.project / "patches" / "targets.toml"
    targets.write_text(
        targets.read_text().replace(f'git = "{toy.upstream}"', 'git = "/nonexistent/toy.git"')
    )
    upstream = os.path.relpath(toy.upstream, toy.root)
    env = {**toy.env, "PATCHKIT_CACHE": "relative-cache"}
    done = cli(
        "apply", "--target", "toy", "--into", "wt", "--upstream", upstream, env=env, cwd=toy.root
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (toy.root / "wt" / "pkg").is_dir() and (toy.root / "relative-cache").is_dir()


def test_a_killed_runs_scratch_folder_is_swept_and_a_live_ones_kept(tmp_path):
    """Each process's scratch folder (the bare calls' working directory, scratch indexes) is
    removed at exit; after a SIGKILL the next patchkit removes it, never one still held."""
    import signal
    import subprocess
    import sys

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    code = "from patchkit import scratch; print(scratch.root(), flush=True); "

    def start(tail: str) -> tuple[subprocess.Popen, Path]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code + tail], env=env, stdout=subprocess.PIPE, text=True
        )
        return proc, Path(proc.stdout.readline().strip())

    killed, dead = start("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.wait() == -signal.SIGKILL and (dead / "cwd").is_dir()
    live_proc, live = start("import time; time.sleep(60)")
    try:
        done, own = start("")
        assert done.wait() == 0
        assert not dead.exists(), "the killed run's scratch folder was left"
        assert (live / "cwd").is_dir(), "a live run's scratch folder was removed"
        assert not own.exists(), "a run's own scratch folder outlived it"
    finally:
        live_proc.kill()
        live_proc.wait()
