"""Two and four simultaneous `apply` runs on one cache (cold, so they race on the fetch or the
sdist import too), into separate directories and into the same one: no corrupted outcome;
a process that has to wait says so."""

from __future__ import annotations

import os
import shutil

import pytest
from reliability_support import (
    cache_problems,
    checkout_problems,
    cli,
    leftovers,
    make_toy,
    record,
    rev,
    start_cli,
)

SECTION = "concurrency (tests/reliability/test_concurrency.py)"


def _run_all(arg_lists, env):
    procs = [start_cli(*args, env=env) for args in arg_lists]
    return [(p.wait(timeout=600), *p.communicate()) for p in procs]


@pytest.mark.parametrize("n", [2, 4])
def test_simultaneous_applies_one_cache(tmp_path, n):
    toy = make_toy(tmp_path / "toy")
    dirs = [tmp_path / f"wt{i}" for i in range(n)]
    results = _run_all([("apply", "--target", "toy", "--into", str(d)) for d in dirs], toy.env)
    heads = {rev(d, "HEAD") for d in dirs}
    corrupted = 0
    problems = []
    for d, (rc, _out, err) in zip(dirs, results, strict=True):
        issues = checkout_problems(d, heads) + leftovers(tmp_path, d.name, toy.cache)
        if rc != 0 or issues or not d.exists():
            corrupted += 1
            problems.append(f"{d.name}: rc={rc} {issues} {err[-300:]!r}")
    cache_issues = cache_problems(toy.cache)
    corrupted += bool(cache_issues)
    if len(heads) != 1:
        problems.append(f"different results: {heads}")
    record(
        SECTION,
        f"{n} simultaneous applies, one cold cache, separate directories: "
        f"{corrupted} corrupted outcomes (goal 0)",
    )
    assert corrupted == 0 and len(heads) == 1, problems + cache_issues


@pytest.mark.parametrize("n", [2, 4])
def test_simultaneous_applies_one_target(tmp_path, n):
    toy = make_toy(tmp_path / "toy")
    into = tmp_path / "wt"
    results = _run_all([("apply", "--target", "toy", "--into", str(into))] * n, toy.env)
    codes = sorted(rc for rc, _, _ in results)
    waited = sum("waiting for another patchkit process" in err for _, _, err in results)
    head = rev(into, "HEAD")
    issues = (
        checkout_problems(into, {head})
        + cache_problems(toy.cache)
        + leftovers(tmp_path, "wt", toy.cache)
    )
    # One applies (0); the rest waited for it and found nothing to do (3).
    corrupted = int(bool(issues)) + sum(rc not in (0, 3) for rc in codes)
    record(
        SECTION,
        f"{n} simultaneous applies into the same directory: exit codes {codes}, "
        f"{waited} said they were waiting, {corrupted} corrupted outcomes (goal 0)",
    )
    assert corrupted == 0 and codes.count(0) == 1, (codes, issues, [e for _, _, e in results])


def test_two_applies_racing_on_the_real_sglang_import(tmp_path, sglang_sdist):
    cache = tmp_path / "cache"
    (cache / "sdists").mkdir(parents=True)
    os.link(sglang_sdist, cache / "sdists" / sglang_sdist.name)
    env = {
        "PATCHKIT_PROJECT": os.environ["PATCHKIT_PROJECT"],  # the seed-line copy (conftest)
        "PATCHKIT_CACHE": str(cache),
        "PATCHKIT_OFFLINE_GIT": "1",
        "PATCHKIT_INDEX_URL": "http://127.0.0.1:9/simple",
    }
    dirs = [tmp_path / "a", tmp_path / "b"]
    results = _run_all([("apply", "--target", "sglang", "--into", str(d)) for d in dirs], env)
    heads = {rev(d, "HEAD") for d in dirs}
    waited = sum("waiting for another patchkit process" in err for _, _, err in results)
    issues = [f"rc={rc} {err[-300:]!r}" for rc, _, err in results if rc != 0]
    issues += cache_problems(cache) + [str(p) for p in (cache / "tmp").iterdir()]
    if len(heads) != 1 or None in heads:
        issues.append(f"results differ: {heads}")
    record(
        SECTION,
        f"2 simultaneous applies of sglang racing on the sdist import: "
        f"{waited} waited for the mirror, {len(issues)} corrupted outcomes (goal 0)",
    )
    assert not issues
    for d in dirs:
        shutil.rmtree(d)


def test_the_mirror_sweep_leaves_loose_objects_being_written(toy):
    """Applies build the series in the mirror without its lock; a process that takes the
    lock sweeps what a killed holder left. Sweeping `tmp_obj_*` too removed the loose object
    another apply was writing (`unable to write file .../objects/b2/...`, exit 70)."""
    assert cli("fetch", "--target", "toy", env=toy.env).returncode == 0
    objects = toy.cache / "mirrors" / "toy.git" / "objects"
    in_flight = objects / "b2" / "tmp_obj_Ab12Cd"
    in_flight.parent.mkdir(exist_ok=True)
    in_flight.write_bytes(b"x")
    stale_lock = objects.parent / "packed-refs.lock"
    stale_lock.write_bytes(b"")
    done = cli("fetch", "--target", "toy", env=toy.env)
    assert done.returncode == 0, done.stderr
    assert in_flight.exists()
    assert not stale_lock.exists()


def test_a_mirror_sweep_keeps_another_runs_download(tmp_path):
    """The sdist and wheel folders are shared by every target: one target's sweep (under its
    own mirror lock) must not take a partial download another run is still writing, and must
    still take a dead run's."""
    from patchkit.locks import locked_temp_file
    from patchkit.targets import Target
    from patchkit.upstream.mirror import Mirror

    sdists = tmp_path / "sdists"
    sdists.mkdir()
    fd, live = locked_temp_file(sdists, prefix=".other-1.0.tar.gz.download-")
    dead = sdists / ".other-0.9.tar.gz.download-x1y2z3"
    dead.write_bytes(b"partial")  # its writer died: nobody holds it
    target = Target(name="toy", git="https://example.invalid/t.git", subdir="", pin="", releases=())
    try:
        Mirror(target, root=tmp_path).sweep()
        assert os.path.exists(live) and not dead.exists()
    finally:
        os.close(fd)
    Mirror(target, root=tmp_path).sweep()
    assert not os.path.exists(live)
