"""Kill patchkit at random (seeded) points of apply and of the upstream import; check that no
partial work tree, torn mirror or half-written cache entry is left, and that the next run of
the same command succeeds without any manual clean-up.

`build` is interrupted at each of its steps in test_reliability_build.py (a small real
setuptools target), the conflict tree of `rebase` in test_reliability_conflict_tree.py.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest
from reliability_support import (
    ROOT,
    cache_problems,
    checkout_problems,
    cli,
    git,
    leftovers,
    make_project,
    make_toy,
    one_or_two_lines,
    record,
    rev,
    sha256,
    snapshot,
    start_cli,
    tally_kill,
    toy_sdist,
    toy_sdist_project,
)
from sampling import exhaustive, rotating, seed

from patchkit.files import TMP_MARK

# `make test` kills at KILLS_SAMPLED random points per scenario, seeded by the commit so that
# each landing tries other points; `make test-reliability` (PATCHKIT_SAMPLE=all) runs the whole
# plan from the fixed seed (tests/sampling.py).
KILLS_SAMPLED = 3
SEED = int(os.environ.get("PATCHKIT_KILL_SEED") or (20260815 if exhaustive() else seed() % 10**8))
SIGNALS = [signal.SIGKILL] * 7 + [signal.SIGTERM] * 2 + [signal.SIGINT] * 2
# (scenario, number of kills): 47, and two kills per file rebase --write writes (5: 57 in all).
PLAN = [
    ("apply into a new directory", 12),
    ("apply onto an existing checkout", 10),
    ("git import into the mirror", 4),
    ("sdist import (small sdist)", 6),
    ("sdist import (real sglang 0.5.9)", 2),
    ("SIGKILL inside the in-place git checkout", 5),
    ("rebase --write onto a new release", 8),
    ("SIGKILL between and inside rebase --write's file writes", None),  # counted from its files
]

# Runs the CLI with the in-place checkout replaced by one that writes part of the new tree,
# leaves git's index.lock behind and SIGKILLs the process: the worst moment to die.
MID_CHECKOUT = """
import os, random, signal, subprocess, sys
from patchkit import cli, gitops
def partial(repo, branch, sha):
    rng = random.Random(int(os.environ["KILL_SEED"]))
    changed = repo.run("diff", "--no-renames", "--name-status", "-z", "HEAD", sha)
    changed = changed.split("\\0")
    pairs = [(changed[i], changed[i + 1]) for i in range(0, len(changed) - 1, 2)]
    for status, path in pairs:
        if rng.random() < 0.5:
            continue
        if status == "D":
            os.unlink(os.path.join(repo.path, path))
        else:
            repo.run("checkout", sha, "--", path)
    open(os.path.join(repo.path, ".git", "index.lock"), "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
gitops.checkout_branch = partial
sys.exit(cli.main(sys.argv[1:]))
"""


@dataclass
class Tally:
    kills: int = 0
    corrupt: int = 0  # partial or corrupted states found right after a kill
    journaled: int = 0  # an in-place checkout stopped mid-way; the journal says how to undo it
    next_ok: int = 0
    clean_interrupts: int = 0  # SIGINT/SIGTERM answered with one line and exit 130
    interrupts: int = 0
    problems: list[str] = field(default_factory=list)


def _kill_at_random(
    args: tuple[str, ...], env: dict[str, str], delay: float, signum: int, tally: Tally
) -> None:
    proc = start_cli(*args, env=env)
    time.sleep(delay)
    if proc.poll() is None:
        proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    tally.kills += 1
    tally_kill()
    if signum != signal.SIGKILL and proc.returncode == 130:
        tally.interrupts += 1
        if one_or_two_lines(stderr) and "interrupted" in stderr:
            tally.clean_interrupts += 1
        else:
            tally.problems.append(f"interrupt output: {stderr[-300:]!r}")


def _next_run(args, env, check_final, tally: Tally) -> None:
    done = cli(*args, env=env)
    problems = check_final()
    if done.returncode in (0, 3) and not problems:
        tally.next_ok += 1
    else:
        tally.problems.append(f"next run rc={done.returncode} {done.stderr[-300:]!r} {problems}")


def _calibrate(args, env, reset) -> float:
    reset()
    start = time.monotonic()
    done = cli(*args, env=env)
    assert done.returncode == 0, done.stderr
    return time.monotonic() - start


@pytest.fixture(scope="module")
def tallies():
    result: dict[str, Tally] = {}
    yield result
    total = Tally()
    for name, t in result.items():
        record(
            "kill test (tests/reliability/test_kill.py)",
            f"{name}: {t.kills} kills, {t.corrupt} partial/corrupted, "
            f"{t.journaled} mid-checkout (journaled, rolled back by the next run), "
            f"{t.next_ok}/{t.kills} next runs succeeded, "
            f"{t.clean_interrupts}/{t.interrupts} SIGINT/SIGTERM exits were one line + 130",
        )
        for attr in ("kills", "corrupt", "journaled", "next_ok", "clean_interrupts", "interrupts"):
            setattr(total, attr, getattr(total, attr) + getattr(t, attr))
    record(
        "kill test (tests/reliability/test_kill.py)",
        f"TOTAL: {total.kills} kills (seed {SEED}) -> partial or corrupted states: "
        f"{total.corrupt} (goal 0); next runs that succeeded: {total.next_ok}/{total.kills} "
        f"(goal {total.kills}); build and the conflict tree: see their own sections",
    )


def _run_plan(
    name: str, count: int, args, env, reset, check_after_kill, check_final, tallies, rng
) -> Tally:
    tally = tallies.setdefault(name, Tally())
    duration = _calibrate(args, env, reset)
    for _ in range(count if exhaustive() else min(count, KILLS_SAMPLED)):
        reset()
        signum = rng.choice(SIGNALS)
        _kill_at_random(args, env, rng.uniform(0.0, duration * 1.1), signum, tally)
        verdict = check_after_kill()
        if verdict == "journaled":
            tally.journaled += 1
        elif verdict:
            tally.corrupt += 1
            tally.problems.append(f"after {signal.Signals(signum).name}: {verdict}")
        _next_run(args, env, check_final, tally)
    return tally


def test_kill_apply_new_directory(tmp_path, tallies):
    rng = random.Random(SEED)
    toy = make_toy(tmp_path / "toy")
    into = tmp_path / "wt"
    args = ("apply", "--target", "toy", "--into", str(into))
    result = {}

    def reset():
        shutil.rmtree(into, ignore_errors=True)
        if rng.random() < 0.3:
            shutil.rmtree(toy.cache, ignore_errors=True)  # sometimes cold: fetch + apply

    def after_kill():
        problems = checkout_problems(into, {result["sha"]}) + cache_problems(toy.cache)
        return "; ".join(problems)

    def final():
        problems = checkout_problems(into, {result["sha"]}) + cache_problems(toy.cache)
        if rev(into, "HEAD") != result["sha"]:
            problems.append("not at the result")
        return problems + leftovers(tmp_path, "wt", toy.cache)

    shutil.rmtree(into, ignore_errors=True)
    assert cli(*args, env=toy.env).returncode == 0
    result["sha"] = rev(into, "HEAD")
    tally = _run_plan(PLAN[0][0], PLAN[0][1], args, toy.env, reset, after_kill, final, tallies, rng)
    assert tally.corrupt == 0 and tally.next_ok == tally.kills, tally.problems


def test_kill_apply_existing_checkout(tmp_path, tallies):
    rng = random.Random(SEED + 1)
    toy = make_toy(tmp_path / "toy")
    older = tmp_path / "project-v1"
    make_project(older, toy.upstream, toy.base, dict(list(toy.patches.items())[:2]))
    pristine = tmp_path / "pristine"
    assert (
        cli(
            "apply",
            "--target",
            "toy",
            "--into",
            str(pristine),
            env={**toy.env, "PATCHKIT_PROJECT": str(older)},
        ).returncode
        == 0
    )
    old_sha = rev(pristine, "HEAD")
    into = tmp_path / "wt"
    args = ("apply", "--target", "toy", "--into", str(into))
    journal = tmp_path / ".wt.patchkit.journal"

    def reset():
        shutil.rmtree(into, ignore_errors=True)
        journal.unlink(missing_ok=True)
        shutil.copytree(pristine, into, symlinks=True)

    new = {}

    def after_kill():
        if journal.exists():
            return "journaled"
        return "; ".join(checkout_problems(into, {old_sha, new["sha"]}) + cache_problems(toy.cache))

    def final():
        problems = checkout_problems(into, {new["sha"]}) + cache_problems(toy.cache)
        return problems + leftovers(tmp_path, "wt", toy.cache)

    reset()
    assert cli(*args, env=toy.env).returncode == 0
    new["sha"] = rev(into, "HEAD")
    assert new["sha"] != old_sha
    tally = _run_plan(PLAN[1][0], PLAN[1][1], args, toy.env, reset, after_kill, final, tallies, rng)
    assert tally.corrupt == 0 and tally.next_ok == tally.kills, tally.problems


def test_kill_inside_in_place_checkout(tmp_path, tallies):
    rng = random.Random(SEED + 5)
    name, count = PLAN[5]
    tally = tallies.setdefault(name, Tally())
    toy = make_toy(tmp_path / "toy")
    older = tmp_path / "project-v1"
    make_project(older, toy.upstream, toy.base, dict(list(toy.patches.items())[:1]))
    pristine = tmp_path / "pristine"
    assert (
        cli(
            "apply",
            "--target",
            "toy",
            "--into",
            str(pristine),
            env={**toy.env, "PATCHKIT_PROJECT": str(older)},
        ).returncode
        == 0
    )
    into = tmp_path / "wt"
    args = ("apply", "--target", "toy", "--into", str(into))
    journal = tmp_path / ".wt.patchkit.journal"
    expected = None
    for _ in range(count if exhaustive() else min(count, KILLS_SAMPLED)):
        shutil.rmtree(into, ignore_errors=True)
        shutil.copytree(pristine, into, symlinks=True)
        seed = str(rng.randrange(1 << 30))
        tally_kill()
        killed = subprocess.run(
            [sys.executable, "-c", MID_CHECKOUT, *args],
            cwd=ROOT,
            env={**os.environ, **toy.env, "KILL_SEED": seed},
            capture_output=True,
            text=True,
        )
        tally.kills += 1
        if killed.returncode != -signal.SIGKILL:
            tally.problems.append(f"the planted kill did not happen: {killed.stderr[-300:]}")
        if journal.exists():
            tally.journaled += 1
        else:
            tally.corrupt += 1
            tally.problems.append("no journal after a kill inside the checkout")
        done = cli(*args, env=toy.env)
        expected = expected or rev(into, "HEAD")
        problems = (
            checkout_problems(into, {expected})
            + cache_problems(toy.cache)
            + leftovers(tmp_path, "wt", toy.cache)
        )
        if done.returncode == 0 and not problems and not (into / ".git/index.lock").exists():
            tally.next_ok += 1
        else:
            tally.problems.append(f"next run rc={done.returncode} {done.stderr[-300:]} {problems}")
    assert not tally.problems and tally.next_ok == tally.kills, tally.problems


def test_kill_git_import(tmp_path, tallies):
    rng = random.Random(SEED + 2)
    toy = make_toy(tmp_path / "toy")
    args = ("fetch", "--target", "toy")

    def reset():
        shutil.rmtree(toy.cache, ignore_errors=True)

    def after_kill():
        return "; ".join(cache_problems(toy.cache))

    def final():
        problems = cache_problems(toy.cache) + leftovers(tmp_path, "none", toy.cache)
        if rev(toy.cache / "mirrors" / "toy.git", toy.base, bare=True) != toy.base:
            problems.append("the pinned commit is not in the mirror")
        return problems

    tally = _run_plan(PLAN[2][0], PLAN[2][1], args, toy.env, reset, after_kill, final, tallies, rng)
    assert tally.corrupt == 0 and tally.next_ok == tally.kills, tally.problems


def test_kill_sdist_import_small(tmp_path, tallies):
    rng = random.Random(SEED + 3)
    commit = "ab" * 20
    sdist = toy_sdist(commit_id=commit, files=400)
    toy = toy_sdist_project(tmp_path / "toy", sdist, commit)
    pins = {"toy-1.0.tar.gz": sha256(sdist)}
    args = ("fetch", "--target", "toy")

    def reset():
        shutil.rmtree(toy.cache / "mirrors", ignore_errors=True)
        shutil.rmtree(toy.cache / "tmp", ignore_errors=True)

    def after_kill():
        return "; ".join(cache_problems(toy.cache, pins))

    def final():
        mirror = toy.cache / "mirrors" / "toy.git"
        problems = cache_problems(toy.cache, pins) + leftovers(tmp_path, "none", toy.cache)
        if rev(mirror, "refs/patchkit/sdist/1.0", bare=True) is None:
            problems.append("no import ref")
        return problems

    env = {**toy.env, "PATCHKIT_OFFLINE_GIT": "1"}
    tally = _run_plan(PLAN[3][0], PLAN[3][1], args, env, reset, after_kill, final, tallies, rng)
    assert tally.corrupt == 0 and tally.next_ok == tally.kills, tally.problems


@pytest.mark.long
def test_kill_sdist_import_sglang(tmp_path, tallies, sglang_sdist, workspace):
    rng = random.Random(SEED + 4)
    cache = tmp_path / "cache"
    pins = {sglang_sdist.name: workspace.target("sglang").pinned.sdist_sha256}
    env = {
        "PATCHKIT_PROJECT": os.environ["PATCHKIT_PROJECT"],  # the seed-line copy (conftest)
        "PATCHKIT_CACHE": str(cache),
        "PATCHKIT_OFFLINE_GIT": "1",
        "PATCHKIT_INDEX_URL": "http://127.0.0.1:9/simple",
    }
    args = ("fetch", "--target", "sglang")

    def reset():
        shutil.rmtree(cache, ignore_errors=True)
        (cache / "sdists").mkdir(parents=True)
        os.link(sglang_sdist, cache / "sdists" / sglang_sdist.name)

    def after_kill():
        return "; ".join(cache_problems(cache, pins))

    def final():
        problems = cache_problems(cache, pins) + leftovers(tmp_path, "none", cache)
        if rev(cache / "mirrors" / "sglang.git", "refs/patchkit/sdist/0.5.9", bare=True) is None:
            problems.append("no import ref")
        return problems

    tally = _run_plan(PLAN[4][0], PLAN[4][1], args, env, reset, after_kill, final, tallies, rng)
    assert tally.corrupt == 0 and tally.next_ok == tally.kills, tally.problems


# Runs the CLI with the file writer of export and pins (patch files, series, targets.toml)
# replaced by one that SIGKILLs the process after KILL_AFTER complete files: rebase --write
# stopped between two of its writes; with KILL_MID, inside the next write, its temp file
# written and not yet renamed over the old file.
BETWEEN_WRITES = """
import os, signal, sys, types
from patchkit import cli, export, files, pins
real = files.replace_file
count = [0]
def kill(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
def write(path, data, **kwargs):
    if count[0] == int(os.environ["KILL_AFTER"]):
        if not os.environ.get("KILL_MID"):
            kill()
        files.os = types.SimpleNamespace(**{**vars(os), "replace": kill})
    count[0] += 1
    real(path, data, **kwargs)
export.replace_file = pins.replace_file = write
sys.exit(cli.main(sys.argv[1:]))
"""


def _toy_with_new_release(root):
    toy = make_toy(root)
    work = root / "upstream-work"
    git(work, "checkout", "-q", "main")
    for f in ("pkg/mod00/file00.py", "pkg/mod01/file03.py", "pkg/mod05/file01.py"):
        path = work / f
        path.write_text("# a new first line\n" + path.read_text())
    git(work, "commit", "-qam", "v1.1")
    git(work, "tag", "v1.1")
    git(work, "push", "-q", str(toy.upstream), "main", "v1.1")
    return toy


def _rebase_states(toy):
    patches = toy.project / "patches"
    pristine = toy.root / "patches-before"
    shutil.copytree(patches, pristine)
    args = ("rebase", "--target", "toy@v1.1", "--write")
    assert cli(*args, env=toy.env).returncode == 0
    after = snapshot(patches)
    before = snapshot(pristine)

    def reset():
        shutil.rmtree(patches)
        shutil.copytree(pristine, patches)

    def after_kill():
        now = snapshot(patches)
        problems = []
        for name, data in now.items():
            if name not in before and name not in after:
                if TMP_MARK not in name:  # a killed write's temp file
                    problems.append(f"stray file patches/{name}")  # is the next run's to sweep
            elif data not in (before.get(name), after.get(name)):
                problems.append(f"patches/{name} is neither the old nor the new file")
        return "; ".join(problems)

    def final():
        problems = [] if snapshot(patches) == after else ["patches/ differs from a clean run"]
        return problems + cache_problems(toy.cache)

    writes = len([name for name, data in after.items() if before.get(name) != data])
    return args, reset, after_kill, final, writes


def test_kill_rebase_write(tmp_path, tallies):
    rng = random.Random(SEED + 6)
    toy = _toy_with_new_release(tmp_path / "toy")
    args, reset, after_kill, final, _ = _rebase_states(toy)
    name, count = PLAN[6]
    tally = _run_plan(name, count, args, toy.env, reset, after_kill, final, tallies, rng)
    assert tally.corrupt == 0 and tally.next_ok == tally.kills, tally.problems


def test_kill_between_rebase_writes(tmp_path, tallies):
    toy = _toy_with_new_release(tmp_path / "toy")
    args, reset, after_kill, final, writes = _rebase_states(toy)
    name, _ = PLAN[7]
    tally = tallies.setdefault(name, Tally())
    assert writes >= 3, writes  # the toy release changes several patch files and the series
    planted = [(k, mid) for k in range(writes) for mid in ("", "1")]
    for k, mid in rotating(planted, 2 * KILLS_SAMPLED, salt=7):
        reset()
        tally_kill()
        killed = subprocess.run(
            [sys.executable, "-c", BETWEEN_WRITES, *args],
            cwd=ROOT,
            env={**os.environ, **toy.env, "KILL_AFTER": str(k), "KILL_MID": mid},
            capture_output=True,
            text=True,
        )
        tally.kills += 1
        if killed.returncode != -signal.SIGKILL:
            tally.problems.append(
                f"the planted kill ({k}, {mid!r}) did not happen: {killed.stderr[-300:]}"
            )
        left = [n for n in snapshot(toy.project / "patches") if TMP_MARK in n]
        if bool(left) != bool(mid):
            tally.problems.append(
                f"kill {'inside' if mid else 'after'} write {k}: temp files {left}"
            )
        verdict = after_kill()
        if verdict:
            tally.corrupt += 1
            tally.problems.append(f"after the kill after {k} files: {verdict}")
        _next_run(args, toy.env, final, tally)  # final: the temp file swept, as a clean run
    assert not tally.problems and tally.next_ok == tally.kills, tally.problems


def test_refused_checkout_keeps_user_files(tmp_path):
    """git refuses to overwrite an untracked file: the user's file survives, refs and HEAD are
    as before, and no journal is left."""
    toy = make_toy(tmp_path / "toy")
    older = tmp_path / "project-v1"
    make_project(older, toy.upstream, toy.base, dict(list(toy.patches.items())[:1]))
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
    before = rev(into, "HEAD")
    mine = into / "pkg" / "mod03" / "new_module.py"  # a path the full series adds
    mine.write_text("my own work\n")
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert mine.read_text() == "my own work\n"
    assert rev(into, "HEAD") == before
    assert not (tmp_path / ".wt.patchkit.journal").exists()


# A patchkit SIGKILLed while its git runs: the git lives on (here: an alias that sleeps). It
# inherited the lock, so the next patchkit waits for it instead of sweeping or hashing files
# that git is still writing (the race behind a flaky sdist-import kill: a killed run's
# `git prune-packed` removing loose-object folders while the next run listed them).
HOLD_LOCK_THEN_GIT = """
import os, sys
from pathlib import Path
from patchkit import gitops
from patchkit.locks import locked
with locked(Path(sys.argv[1]), "a test lock"):
    print("locked", flush=True)
    gitops.Repo.checkout(Path(sys.argv[2])).run("-c", "alias.nap=!sleep 3", "nap")
"""


def test_a_killed_patchkits_git_keeps_the_lock(tmp_path):
    import fcntl

    lock = tmp_path / "mirror.lock"
    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", str(repo))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK_THEN_GIT, str(lock), str(repo)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "locked"
    time.sleep(0.5)  # git (and its sleep) started
    proc.kill()
    proc.wait()
    with lock.open() as fh:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the orphaned git holds it
        start = time.monotonic()
        fcntl.flock(fh, fcntl.LOCK_EX)  # ... until it exits
        assert 0.5 < time.monotonic() - start < 10


def test_rebase_write_removes_only_what_the_series_named(tmp_path):
    """rebase --write drops an upstreamed or renamed patch only if the series listed it: a
    user's unlisted patch and an editor's swap file in patches/<target>/ stay."""
    toy = _toy_with_new_release(tmp_path / "toy")
    d = toy.project / "patches" / "toy"
    (d / "not-in-the-series.patch").write_bytes(b"a user's draft\n")
    (d / ".toy-01.patch.swp").write_bytes(b"swap\n")
    done = cli("rebase", "--target", "toy@v1.1", "--write", env=toy.env)
    assert done.returncode == 0, done.stderr
    assert (d / "not-in-the-series.patch").read_bytes() == b"a user's draft\n"
    assert (d / ".toy-01.patch.swp").read_bytes() == b"swap\n"
