"""Interrupt `patchkit build` at every step: at each of its git calls (the `git` wrapper on
PATH) and at each step of its own (a planted signal at the start of each build step, and in
the middle of writing the wheel), with SIGKILL, SIGTERM and SIGINT.

The target is a small real setuptools project in a real git upstream, built by the real PyPA
frontend (`--no-isolation`, with this interpreter's setuptools), so a build takes seconds.

After every interrupt: the out directory holds no wheel that is not complete (every `*.whl`
there is a valid zip whose RECORD matches and is byte-identical to a clean build's, or is the
user's own file, untouched), the cache is sound, SIGINT/SIGTERM answer one line and exit 130
saying what was left, and the same command run again builds the same bytes and leaves no temp
file, no moved-aside build and no scratch clone behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from reliability_support import (
    ROOT,
    GitFaults,
    cache_problems,
    cli,
    git,
    make_project,
    one_or_two_lines,
    record,
    tally_kill,
)
from sampling import exhaustive, rotating

from patchkit.wheels.reproducible import check_record

SECTION = "build interrupted (tests/reliability/test_reliability_build.py)"
ALL = os.environ.get("PATCHKIT_BUILD_FAULTS_ALL") == "1"  # every point x every signal
SAMPLED = 12  # interrupts `make test` tries (rotating by commit); PATCHKIT_SAMPLE=all: every one
MEMBER_STRIDE = 25

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "toy"
dynamic = ["version"]

[tool.setuptools]
packages = ["toy"]

[tool.setuptools.dynamic]
version = {attr = "toy.__version__"}
"""


# A build backend that starts a child and waits, writing nothing (a compiler it runs, say).
SLOW_BACKEND = """\
import subprocess, time
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    subprocess.Popen(["sleep", "300"])
    time.sleep(300)
"""


def make_buildable_toy(root: Path, *, slow_backend: bool = False) -> dict:
    """A real upstream (setuptools project, tag v1.0), a two-patch series and a project;
    `slow_backend`: built by SLOW_BACKEND instead."""
    work = root / "upstream-work"
    (work / "toy").mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    pyproject = PYPROJECT
    if slow_backend:
        (work / "slow_backend.py").write_text(SLOW_BACKEND)
        pyproject = pyproject.replace('requires = ["setuptools>=61"]', "requires = []")
        pyproject = pyproject.replace(
            '"setuptools.build_meta"', '"slow_backend"\nbackend-path = ["."]'
        )
    (work / "pyproject.toml").write_text(pyproject)
    (work / "toy" / "__init__.py").write_text('__version__ = "1.0"\n')
    for i in range(110):  # over git's unpack limit: the mirror holds a pack, as a real one does
        (work / "toy" / f"m{i:03d}.py").write_text(f"VALUE = {i}\n" * 50)
    git(work, "add", "-A")
    git(work, "commit", "-qm", "v1.0")
    git(work, "tag", "v1.0")
    base = git(work, "rev-parse", "HEAD").strip()
    git(work, "checkout", "-q", "-b", "series")
    (work / "toy" / "m003.py").write_text("VALUE = 'patched'\n")
    git(work, "commit", "-qam", "patch module 3")
    (work / "toy" / "added.py").write_text("ADDED = True\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "add a module")
    out = root / "format-patch"
    git(work, "format-patch", "-q", "--zero-commit", "--no-signature", "--no-stat", "-o",
        str(out), f"{base}..series")  # fmt: skip
    patches = {f"toy-{i:02d}.patch": p.read_bytes() for i, p in
               enumerate(sorted(out.glob("*.patch")), 1)}  # fmt: skip
    bare = root / "upstream.git"
    git(root, "clone", "-q", "--bare", str(work), str(bare))
    project = root / "project"
    make_project(project, bare, base, patches)
    shutil.copytree(ROOT / "build" / "profiles", project / "build" / "profiles")
    cache = root / "cache"
    env = {
        "PATCHKIT_PROJECT": str(project),
        "PATCHKIT_CACHE": str(cache),
        "PATCHKIT_OFFLINE_GIT": "0",
        "PATCHKIT_INDEX_URL": "http://127.0.0.1:9/simple",
    }
    return {"project": project, "cache": cache, "env": env}


def build_args(out: Path) -> tuple[str, ...]:
    """`build --no-isolation`: this interpreter's setuptools builds it (skip where none)."""
    pytest.importorskip("setuptools")
    return ("build", "--target", "toy", "--no-isolation", "--out", str(out))


# Runs the CLI with a signal planted at the start of the Nth call of a build step (or, for
# `write-member`, before the Nth member of the wheel being written): the moments between
# git calls that the wrapper cannot reach.
PLANTED = """
import os, signal, sys
from patchkit import cli
from patchkit.wheels import build, reproducible
at, sig = int(os.environ["PK_FAULT_AT"]), getattr(signal, "SIG" + os.environ["PK_FAULT_SIG"])
step = [0]
def planted(module, name):
    real = getattr(module, name)
    def wrapper(*args, **kwargs):
        step[0] += 1
        if step[0] == at:
            os.kill(os.getpid(), sig)
        return real(*args, **kwargs)
    setattr(module, name, wrapper)
for name in ("_move_aside", "apply_series", "_sweep", "_check_submodules", "pin_version",
             "run_backend", "_wheel_metadata", "make_provenance", "make_sbom",
             "normalize_wheel"):
    planted(build, name)
planted(reproducible, "_copy_compressed")
sys.exit(cli.main(sys.argv[1:]))
"""


def planted_run(args, env, at: int, sig: str) -> subprocess.CompletedProcess:
    tally_kill()
    return subprocess.run(
        [sys.executable, "-c", PLANTED, *args],
        cwd=ROOT,
        env={**os.environ, **env, "PK_FAULT_AT": str(at), "PK_FAULT_SIG": sig},
        capture_output=True,
        text=True,
        timeout=300,
    )


def wheels_in(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def out_problems(out: Path, clean: dict[str, bytes], mine: dict[str, bytes]) -> list[str]:
    """Anything in `out` a user could take for a finished wheel that is not one."""
    problems = []
    for name, data in wheels_in(out).items():
        if name in mine:
            if data != mine[name]:
                problems.append(f"the user's {name} changed")
        elif name.endswith(".whl"):
            if data != clean.get(name):
                path = out / name
                try:
                    bad = check_record(path)
                except (zipfile.BadZipFile, KeyError, ValueError) as exc:
                    bad = [str(exc)]
                problems.append(f"{name} is not the complete wheel ({bad[:3]})")
        elif not (name.startswith(".") and name.endswith(".tmp")):
            problems.append(f"unexpected file {name}")
    return problems


def after_run_problems(toy: dict, out: Path) -> list[str]:
    work = toy["project"] / "work" / "build"
    found = [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    found += [p.name for p in work.glob(".trash-*")] if work.exists() else []
    found += [p.name for p in work.glob(".toy.patchkit-*")] if work.exists() else []
    tmp = toy["cache"] / "tmp"
    found += [p.name for p in tmp.iterdir()] if tmp.exists() else []
    return found


def _interrupt_plan(git_calls: int) -> tuple[list, list]:
    """Where the build is interrupted: each git call, the ten named steps, then every
    MEMBER_STRIDE-th member written (ALL=1: every one); each point with SIGKILL and with one
    of SIGTERM / SIGINT in turn (ALL=1: both)."""
    points = [("git", at) for at in range(1, git_calls + 1)]
    steps = [at for at in range(1, 200) if at <= 10 or ALL or at % MEMBER_STRIDE == 1]
    points += [("step", at) for at in steps]
    runs = [(kind, at, "KILL") for kind, at in points]
    runs += [(kind, at, sig) for i, (kind, at) in enumerate(points)
             for sig in (("TERM", "INT") if ALL else (("TERM", "INT")[i % 2],))]  # fmt: skip
    return points, runs


def _check_interrupted(where, done, sig, toy, args, out, clean, mine) -> None:
    """After one interrupted build: no incomplete wheel, no user file changed, a SIGINT /
    SIGTERM exit of one line and 130; the next build gives the same bytes, leaves nothing."""
    problems = out_problems(out, clean, mine) + cache_problems(toy["cache"])
    assert not problems, f"{where}: {problems}"
    if sig != "KILL":
        assert done.returncode == 130, (where, done.returncode, done.stderr)
        assert one_or_two_lines(done.stderr) and "interrupted" in done.stderr, where
    else:
        assert done.returncode in (0, -signal.SIGKILL), (where, done.stderr)
    again = cli(*args, env=toy["env"])
    assert again.returncode == 0, (where, again.stderr)
    assert wheels_in(out) == {**mine, **clean}, f"{where}: the next build differs"
    left = after_run_problems(toy, out)
    assert not left, f"{where}: left behind after the next build: {left}"


@pytest.mark.long
def test_build_interrupted_at_every_step(tmp_path):
    toy = make_buildable_toy(tmp_path / "toy")
    env = toy["env"]
    out = tmp_path / "dist"
    out.mkdir()
    mine = {"other-2.0-py3-none-any.whl": b"a user's own wheel\n", "NOTES.txt": b"mine\n"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    args = build_args(out)
    first = cli(*args, env=env)
    assert first.returncode == 0, first.stderr
    clean = {n: d for n, d in wheels_in(out).items() if n not in mine}
    [wheel] = clean
    assert not check_record(out / wheel)
    with zipfile.ZipFile(out / wheel) as zf:
        members = len(zf.namelist())
    faults = GitFaults.install(tmp_path / "faults")
    faults.arm(0, "KILL")
    assert cli(*args, env={**env, **faults.env()}).returncode == 0
    git_calls = len(faults.calls())
    # Every interrupted run below follows a plain one (the build record names the git program,
    # so a run through the wrapper after a plain one rebuilds, making the calls counted here).
    assert cli(*args, env=env).returncode == 0

    def reset() -> None:
        (out / wheel).unlink(missing_ok=True)

    tried = clean_exits = seen_steps = 0
    points, runs = _interrupt_plan(git_calls)
    stop_after = {}
    for kind, at, sig in rotating(runs, SAMPLED, salt=3):
        if kind == "step" and at > stop_after.get(sig, 1 << 30):
            continue
        reset()
        if kind == "git":
            faults.arm(at, sig)
            done = cli(*args, env={**env, **faults.env()})
            assert len(faults.calls()) >= at, f"git call {at} was never made"
        else:
            done = planted_run(args, env, at, sig)
            if done.returncode == 0:  # past the last step: every step was tried
                assert at > 10, f"the planted interrupt at named step {at} never fired"
                seen_steps = max(seen_steps, at - 1)
                stop_after[sig] = at
                continue
        tried += 1
        _check_interrupted(f"{kind} {at} {sig}", done, sig, toy, args, out, clean, mine)
        clean_exits += sig != "KILL"
    assert seen_steps >= 10 or not exhaustive(), seen_steps
    record(
        SECTION,
        f"{tried} interrupts at {len(points)} points ({git_calls} git calls, the 10 build steps, "
        f"{'every' if ALL else f'every {MEMBER_STRIDE}th'} of the wheel's {members} members "
        "as written; "
        f"SIGKILL and {'both' if ALL else 'one'} of SIGTERM/SIGINT at each): 0 incomplete "
        f"wheels in the out directory, 0 user files changed; {clean_exits}/{clean_exits} "
        f"SIGINT/SIGTERM exits were one line + 130; {tried}/{tried} next builds gave the "
        "same bytes and left no temp file",
    )


def test_interrupt_message_says_what_was_left(tmp_path):
    """SIGINT during the backend: the message names the out directory as unchanged and the
    build tree as the incomplete scratch the next build replaces."""
    toy = make_buildable_toy(tmp_path / "toy")
    out = tmp_path / "dist"
    done = planted_run(build_args(out), toy["env"], 6, "INT")  # 6th step: run_backend
    assert done.returncode == 130, done.stderr
    assert one_or_two_lines(done.stderr), done.stderr
    assert "no wheel was written" in done.stderr and str(out) in done.stderr, done.stderr


def _processes_under(tmp: Path) -> dict[int, str]:
    """Live processes whose $TMPDIR is `tmp` or a folder in it: pid -> command line."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        dirs = [e[len(b"TMPDIR=") :].decode() for e in env if e.startswith(b"TMPDIR=")]
        if dirs and (dirs[0] + "/").startswith(f"{tmp}/"):
            found[int(name)] = cmd
    return found


def _wait_for(predicate, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return predicate()


@pytest.mark.parametrize("sig", ["KILL", "TERM"])
@pytest.mark.parametrize("inside", ["pip", "backend"])
def test_a_killed_builds_children_go_with_it_and_leave_nothing_in_tmpdir(tmp_path, inside, sig):
    """A build killed while pip installs its requirements (an isolated build; pip waits on an
    index that never answers) or while its backend runs (a backend that started a child and
    waits, writing nothing): every process the build started ends with it, and $TMPDIR holds
    nothing but the run's scratch folder, which the next run sweeps.  Before, the backend and
    its child ran on after a SIGKILL and its child after a SIGTERM; build-env-*,
    build-requirements-*.txt and pip's temp folders were left in $TMPDIR; after a SIGTERM
    the build waited for pip to give up before it stopped."""
    toy = make_buildable_toy(tmp_path / "toy", slow_backend=inside == "backend")
    args = ["build", "--target", "toy", "--out", str(tmp_path / "dist")]
    args += ["--no-isolation"] if inside == "backend" else []
    wanted = "build-requirements-" if inside == "pip" else "sleep 300"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    index = socket.socket()  # listens and never answers: pip hangs in its first request
    index.bind(("127.0.0.1", 0))
    index.listen(8)
    env = {
        **os.environ,
        **toy["env"],
        "TMPDIR": str(tmp),
        "PIP_INDEX_URL": f"http://127.0.0.1:{index.getsockname()[1]}/simple",
        "PIP_TIMEOUT": "120",
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    stderr = tmp_path / "stderr"  # a file: a pipe would stay open as long as any child lives
    with stderr.open("w") as fh:
        run = subprocess.Popen(
            [sys.executable, "-m", "patchkit", *args],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=fh,
        )  # fmt: skip
    try:
        started = _wait_for(
            lambda: {p: c for p, c in _processes_under(tmp).items() if wanted in c}, 120
        )
        assert started, f"{wanted} never started: {run.poll()} {stderr.read_text()}"
        started = time.monotonic()
        run.send_signal(getattr(signal, f"SIG{sig}"))
        run.wait(timeout=120)
        err = stderr.read_text()
        if sig == "TERM":
            assert run.returncode == 130 and one_or_two_lines(err), (run.returncode, err)
            assert time.monotonic() - started < 20, "the build waited for pip to finish"
        left = _wait_for(lambda: not _processes_under(tmp), 10) or _processes_under(tmp)
        assert left is True, f"outlived the build: {left}"
        found = sorted(p.name for p in tmp.iterdir())
        assert all(n.startswith("patchkit-run-") for n in found), found
        again = cli("fetch", "--target", "toy", env={**toy["env"], "TMPDIR": str(tmp)})
        assert again.returncode == 0, again.stderr
        assert not list(tmp.iterdir()), list(tmp.iterdir())
        during = "pip" if inside == "pip" else "the backend"
        record(SECTION, f"{sig} during {during}: 0 processes outlived the build, nothing "
               "but its scratch folder in TMPDIR")  # fmt: skip
    finally:
        index.close()
        if run.poll() is None:
            run.kill()
        for pid in _processes_under(tmp):
            os.kill(pid, signal.SIGKILL)
