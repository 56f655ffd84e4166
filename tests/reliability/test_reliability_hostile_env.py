"""A hostile or unusual environment around an otherwise ordinary run: filter drivers in a
checkout's own config, git variables that name programs, templates and trace files, umask
077, a read-only cache, a symlinked cache folder, a cache path with a space and a newline,
and two exports racing into one folder.  Each case either works exactly as in a plain
environment or is refused in one line that names what to change, with nothing changed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_support import (
    ROOT,
    cache_problems,
    checkout_problems,
    cli,
    git,
    make_project,
    one_or_two_lines,
    record,
    rev,
    snapshot,
)
from test_reliability_build import build_args, make_buildable_toy

SECTION = "hostile environment (tests/reliability/test_reliability_hostile_env.py)"


def marker_script(path: Path, marker: Path) -> Path:
    """A program that records that it ran (and passes its input through, as a filter)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{path.name} $*" >> "{marker}"\ncat\n')
    path.chmod(0o755)
    return path


def work_files(tree: Path) -> dict:
    return {k: v for k, v in snapshot(tree).items() if k != ".git" and not k.startswith(".git/")}


def older_checkout(toy, tmp_path: Path, into: Path) -> None:
    older = tmp_path / "project-v1"
    make_project(older, toy.upstream, toy.base, dict(list(toy.patches.items())[:2]))
    done = cli("apply", "--target", "toy", "--into", str(into),
               env={**toy.env, "PATCHKIT_PROJECT": str(older)})  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_checkout_filter_drivers_never_run(toy, tmp_path):
    """clean/smudge/process filters in the checkout's .git/config, selected for every path by
    .git/info/attributes: apply, status and export run none of them, and the checkout holds
    the series' bytes.  The same through a linked worktree (its config is the common one)."""
    into = tmp_path / "wt"
    older_checkout(toy, tmp_path, into)
    marker = tmp_path / "RAN"
    h = tmp_path / "h"
    with (into / ".git" / "config").open("a") as fh:
        fh.write(
            f'[filter "x"]\n\tclean = {marker_script(h / "clean", marker)}\n'
            f"\tsmudge = {marker_script(h / 'smudge', marker)}\n\trequired = true\n"
            f'[filter "y"]\n\tprocess = {marker_script(h / "process", marker)}\n'
        )
    (into / ".git" / "info").mkdir(exist_ok=True)
    (into / ".git" / "info" / "attributes").write_text("* filter=x\n*.md filter=y\n")
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert done.returncode == 0, done.stderr
    assert cli("status", str(into), env=toy.env).returncode == 0
    assert cli("export", str(into), "--out", str(tmp_path / "e"), env=toy.env).returncode == 0
    assert not marker.exists(), marker.read_text()
    plain = tmp_path / "plain"
    assert cli("apply", "--target", "toy", "--into", str(plain), env=toy.env).returncode == 0
    assert work_files(into) == work_files(plain)
    # a filter that only an included file defines
    (h / "more.config").write_text(f'[filter "z"]\n\tsmudge = {marker_script(h / "z", marker)}\n')
    with (into / ".git" / "config").open("a") as fh:
        fh.write(f"[include]\n\tpath = {h / 'more.config'}\n")
    (into / ".git" / "info" / "attributes").write_text("* filter=z\n")
    git(into, "checkout", "-q", "--detach", toy.base)
    marker.unlink(missing_ok=True)
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), marker.read_text()
    assert work_files(into) == work_files(plain)
    # a linked worktree of the checkout: .git is a file; the filters live in the common config
    linked = tmp_path / "linked"
    git(into, "worktree", "add", "-q", "--detach", str(linked), toy.base)
    marker.unlink(missing_ok=True)
    done = cli("apply", "--target", "toy", "--into", str(linked), env=toy.env)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), marker.read_text()
    record(
        SECTION,
        "filter drivers (clean, smudge, process; required) in a checkout's config, in a file "
        "it includes and in a linked worktree's common config: apply, status, export ran 0 of "
        "them; same bytes as a plain checkout",
    )


def test_git_variables_that_name_programs_change_nothing(toy, tmp_path):
    """GIT_EXEC_PATH, GIT_TEMPLATE_DIR (with hooks), GIT_TRACE* files, GIT_SSH_COMMAND,
    GIT_ASKPASS, GIT_PAGER, GIT_EDITOR, GIT_ALTERNATE_OBJECT_DIRECTORIES, GIT_NAMESPACE:
    nothing runs, no trace file appears, a new checkout holds no hook and the same commits."""
    marker = tmp_path / "RAN"
    evil = tmp_path / "evil"
    for name in ("git-checkout", "git-init", "git-apply", "ssh", "askpass", "pager", "editor"):
        marker_script(evil / "bin" / name, marker)
    templates = tmp_path / "templates"
    marker_script(templates / "hooks" / "post-checkout", marker)
    marker_script(templates / "hooks" / "pre-commit", marker)
    traces = tmp_path / "traces"
    traces.mkdir()
    other = tmp_path / "other.git"
    git(tmp_path, "init", "-q", "--bare", str(other))
    env = {
        **toy.env,
        "GIT_EXEC_PATH": str(evil / "bin"),
        "GIT_TEMPLATE_DIR": str(templates),
        "GIT_TRACE": str(traces / "trace"),
        "GIT_TRACE_PACKET": str(traces / "packet"),
        "GIT_TRACE2_EVENT": str(traces / "trace2"),
        "GIT_SSH_COMMAND": str(evil / "bin" / "ssh"),
        "GIT_ASKPASS": str(evil / "bin" / "askpass"),
        "GIT_PAGER": str(evil / "bin" / "pager"),
        "GIT_EDITOR": str(evil / "bin" / "editor"),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(other / "objects"),
        "GIT_NAMESPACE": "evil",
    }
    into = tmp_path / "wt"
    done = cli("apply", "--target", "toy", "--into", str(into), env=env)
    assert done.returncode == 0, done.stderr
    plain = tmp_path / "plain"
    assert cli("apply", "--target", "toy", "--into", str(plain), env=toy.env).returncode == 0
    assert rev(into, "HEAD") == rev(plain, "HEAD")
    assert not [p.name for p in (into / ".git" / "hooks").glob("*") if "sample" not in p.name]
    assert cli("export", str(into), "--out", str(tmp_path / "e"), env=env).returncode == 0
    assert not marker.exists(), marker.read_text()
    assert not list(traces.iterdir())
    record(
        SECTION,
        "GIT_EXEC_PATH, GIT_TEMPLATE_DIR with hooks, GIT_TRACE/TRACE_PACKET/TRACE2_EVENT files, "
        "GIT_SSH_COMMAND, GIT_ASKPASS, GIT_PAGER, GIT_EDITOR, GIT_ALTERNATE_OBJECT_DIRECTORIES, "
        "GIT_NAMESPACE: 0 programs run, 0 trace files, 0 hooks copied, same commit ids",
    )


UMASK_RUN = """
import os, sys
os.umask(0o077)
from patchkit import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def run_with_umask(args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", UMASK_RUN, *args], cwd=ROOT,
                          env={**os.environ, **env}, capture_output=True, text=True)  # fmt: skip


def test_umask_077(tmp_path):
    """umask 077: apply, export, a second apply and a build all work; what they create keeps
    the user's umask (no group or other bits on the checkout or the exported files)."""
    toy = make_buildable_toy(tmp_path / "toy")
    env = toy["env"]
    into = tmp_path / "wt"
    done = run_with_umask(("apply", "--target", "toy", "--into", str(into)), env)
    assert done.returncode == 0, done.stderr
    assert not checkout_problems(into, {rev(into, "HEAD")})
    again = run_with_umask(("apply", "--target", "toy", "--into", str(into)), env)
    assert again.returncode == 3, again.stderr
    out = tmp_path / "exported"
    done = run_with_umask(("export", str(into), "--out", str(out)), env)
    assert done.returncode == 0, done.stderr
    loose = [p for p in [into / "toy" / "added.py", *out.iterdir()] if p.stat().st_mode & 0o077]
    assert not loose, [(str(p), oct(p.stat().st_mode)) for p in loose]
    built = run_with_umask(build_args(tmp_path / "dist"), env)
    assert built.returncode == 0, built.stderr
    assert len(list((tmp_path / "dist").glob("*.whl"))) == 1
    record(SECTION, "umask 077: apply, apply again (exit 3), export, build: all worked; 0 "
                    "files created with group/other bits")  # fmt: skip


@pytest.fixture
def read_only_view(tmp_path):
    """A read-only bind mount of a folder (root only; skips where mount is refused)."""
    mounts = []

    def make(source: Path) -> Path:
        view = tmp_path / f"ro-{source.name}"
        view.mkdir()
        done = subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot bind-mount here: {done.stderr.decode().strip()}")
        mounts.append(view)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        return view

    yield make
    for view in mounts:
        subprocess.run(["umount", "-l", str(view)], capture_output=True)


def test_read_only_cache_is_refused_in_one_line(toy, tmp_path, read_only_view):
    """A warm cache mounted read-only: apply and fetch refuse in one line naming the folder and
    what to change, create no checkout and change no cache byte; status still works."""
    into = tmp_path / "wt"
    assert cli("apply", "--target", "toy", "--into", str(into), env=toy.env).returncode == 0
    before = snapshot(toy.cache)
    ro = read_only_view(toy.cache)
    env = {**toy.env, "PATCHKIT_CACHE": str(ro)}
    for args in (("apply", "--target", "toy", "--into", str(tmp_path / "new")),
                 ("fetch", "--target", "toy")):  # fmt: skip
        done = cli(*args, env=env)
        assert done.returncode == 2 and one_or_two_lines(done.stderr), done.stderr
        assert str(ro) in done.stderr and "PATCHKIT_CACHE" in done.stderr, done.stderr
    assert not (tmp_path / "new").exists()
    assert cli("status", str(into), env=env).returncode == 0
    shown = cli("cache", env=env)
    assert shown.returncode == 0 and "toy: " in shown.stdout, shown.stderr
    pruned = cli("cache", "--prune", env=env)
    assert pruned.returncode == 2 and one_or_two_lines(pruned.stderr), pruned.stderr
    assert snapshot(toy.cache) == before
    record(SECTION, "read-only cache: apply, fetch and cache --prune refused in one line "
                    "naming it (exit 2), 0 bytes changed, no checkout made; status and cache "
                    "work")  # fmt: skip


def test_read_only_out_folder_for_build(tmp_path, read_only_view):
    toy = make_buildable_toy(tmp_path / "toy")
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "mine.txt").write_text("mine\n")
    ro = read_only_view(dist)
    done = cli(*build_args(ro), env=toy["env"])
    assert done.returncode != 70 and one_or_two_lines(done.stderr), done.stderr
    assert str(ro) in done.stderr, done.stderr
    assert sorted(p.name for p in dist.iterdir()) == ["mine.txt"]
    record(SECTION, "read-only --out for build: refused in one line naming it, nothing written")


@pytest.mark.parametrize(
    "kind",
    [
        "symlinked folder",
        "space and newline in the path",
        "quote, backslash, tab and bytes that are not UTF-8 in the path",
    ],
)
def test_unusual_cache_paths(toy, tmp_path, kind):
    if kind == "symlinked folder":
        real = tmp_path / "real-cache"
        real.mkdir()
        cache = tmp_path / "cache-link"
        cache.symlink_to(real)
    elif kind.startswith("space"):
        real = cache = tmp_path / "my cache\nfolder"
    else:
        real = cache = tmp_path / os.fsdecode(b'my "c\\ache\t\xff\xfe')
    env = {**toy.env, "PATCHKIT_CACHE": str(cache)}
    first, second = tmp_path / "wt1", tmp_path / "wt 2"
    for into in (first, second):
        done = cli("apply", "--target", "toy", "--into", str(into), env=env)
        assert done.returncode == 0, done.stderr
    assert rev(first, "HEAD") == rev(second, "HEAD")
    assert cli("export", str(second), "--out", str(tmp_path / "e"), env=env).returncode == 0
    assert (real / "mirrors" / "toy.git" / "HEAD").is_file()
    assert not cache_problems(real)
    assert cache.is_symlink() == (kind == "symlinked folder")
    record(SECTION, f"cache at a {kind}: two applies and an export worked, cache sound")


def test_two_exports_racing_into_one_folder(toy, tmp_path):
    """Two exports of different series into one folder at once: the folder ends with one
    complete series (its `series` lists exactly the patch files there, each whole). The
    shorter checkout's export into a folder the longer series reached first is refused (it
    would delete the patches that checkout lacks), never half-done; an export that finds
    under the lock that the other one wrote the folder since it started is refused too
    (exit 1, tests/reliability/test_racing_writers.py); one of them always writes."""
    long_, short = tmp_path / "long", tmp_path / "short"
    assert cli("apply", "--target", "toy", "--into", str(long_), env=toy.env).returncode == 0
    older_checkout(toy, tmp_path, short)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.patch").write_bytes(b"a user's own patch\n")
    expected = {}
    for tree in (long_, short):
        one = tmp_path / f"alone-{tree.name}"
        assert cli("export", str(tree), "--out", str(one), env=toy.env).returncode == 0
        expected[tree.name] = snapshot(one)
    for _ in range(3):
        procs = [
            subprocess.Popen([sys.executable, "-m", "patchkit", "export", str(tree), "--out",
                              str(out)], cwd=ROOT, env={**os.environ, **toy.env},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for tree in (long_, short)
        ]  # fmt: skip
        codes = [p.wait(timeout=120) for p in procs]
        errs = [p.stderr.read() for p in procs]
        overtaken = [
            c == 1 and "changed while the export ran" in e for c, e in zip(codes, errs, strict=True)
        ]
        assert codes[0] in (0, 3) or overtaken[0], (codes, errs)
        assert (
            codes[1] in (0, 3) or overtaken[1] or (codes[1] == 2 and "joined the series" in errs[1])
        ), (codes, errs)
        assert {0, 3} & set(codes), (codes, errs)
        now = snapshot(out)
        assert now.pop("mine.patch") == b"a user's own patch\n"
        assert now in expected.values(), sorted(now)
    shutil.rmtree(out)
    record(SECTION, "two exports racing into one folder (3 rounds): each ended with one "
                    "complete series; the user's own patch kept")  # fmt: skip
