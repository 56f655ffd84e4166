"""`patchkit cache --prune`: old objects nothing refers to go; bases, packs, checkouts, the
mirror's integrity stamp and everything younger stay."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from reliability_support import cache_problems, checkout_problems, cli, git, make_toy, rev


def _loose(mirror):
    objects = mirror / "objects"
    return {
        d.name + f.name: f
        for d in objects.iterdir()
        if len(d.name) == 2 and d.is_dir()
        for f in d.iterdir()
    }


def _age(paths, days):
    when = time.time() - days * 86400
    for path in paths:
        os.utime(path, (when, when))


def test_prune_removes_old_unreferenced_objects_and_nothing_else(tmp_path):
    toy = make_toy(tmp_path / "toy")
    first = tmp_path / "wt"
    assert cli("apply", "--target", "toy", "--into", str(first), env=toy.env).returncode == 0
    mirror = toy.cache / "mirrors" / "toy.git"
    refs = git(mirror, "for-each-ref", "--format=%(objectname) %(refname)")
    reachable = set(git(mirror, "rev-list", "--objects", "--all").split()[::2])
    loose = _loose(mirror)
    built = {oid for oid in loose if oid not in reachable}
    assert built, "the series build wrote loose objects no ref names"

    shown = cli("cache", "--json", env=toy.env)
    assert shown.returncode == 0, shown.stderr
    (usage,) = json.loads(shown.stdout)["result"]["mirrors"]
    assert usage["unreferenced"] == len(built) and usage["prunable"] == 0

    # every loose object made old, the base's own included; one built blob kept young (a
    # blob: git also keeps whatever a young object names)
    _age(loose.values(), 30)
    young = next(o for o in sorted(built) if git(mirror, "cat-file", "-t", o).strip() == "blob")
    _age([loose[young]], 0)
    # (new mtimes for the base's loose objects: its integrity stamp is made again, once)
    assert cli("fetch", "--target", "toy", env=toy.env).returncode == 0
    stamps = sorted((toy.cache / "verified").glob("toy-*"))
    assert stamps
    stamp_state = [(p, p.read_bytes(), p.stat().st_mtime_ns) for p in stamps]
    pruned = cli("cache", "--prune", "--json", env=toy.env)
    assert pruned.returncode == 0, pruned.stderr
    (usage,) = json.loads(pruned.stdout)["result"]["mirrors"]
    assert usage["pruned"] == len(built) - 1 and usage["pruned_bytes"] > 0
    left = set(_loose(mirror))
    assert young in left and not (built - {young}) & left
    assert reachable <= set(git(mirror, "rev-list", "--objects", "--all").split()[::2])
    assert git(mirror, "for-each-ref", "--format=%(objectname) %(refname)") == refs
    assert not cache_problems(toy.cache)
    assert not checkout_problems(first, {rev(first, "HEAD")})

    # the next apply builds again, gives the same commits, and re-hashes nothing
    again = tmp_path / "wt2"
    done = cli("apply", "--target", "toy", "--into", str(again), env=toy.env)
    assert done.returncode == 0, done.stderr
    assert rev(again, "HEAD") == rev(first, "HEAD")
    assert [(p, p.read_bytes(), p.stat().st_mtime_ns) for p in stamps] == stamp_state


def test_a_cut_off_under_an_hour_is_refused_and_nothing_is_pruned(tmp_path):
    toy = make_toy(tmp_path / "toy")
    assert (
        cli("apply", "--target", "toy", "--into", str(tmp_path / "wt"), env=toy.env).returncode == 0
    )
    mirror = toy.cache / "mirrors" / "toy.git"
    before = set(_loose(mirror))
    r = cli("cache", "--prune", "--older-than", "0.01", env=toy.env)
    assert r.returncode == 2
    assert r.stderr.startswith("patchkit: error: --older-than 0.01 is under an hour")
    assert "Traceback" not in r.stderr
    assert set(_loose(mirror)) == before


def test_an_empty_cache_is_shown_not_created(tmp_path):
    cache = tmp_path / "nothing-here"
    r = cli("cache", "--prune", env={"PATCHKIT_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    assert "0 mirror(s)" in r.stdout and not cache.exists()


def test_a_linked_mirror_is_not_pruned(tmp_path):
    """A mirror folder that is a link (to a user's own repository) is left alone."""
    toy = make_toy(tmp_path / "toy")
    theirs = tmp_path / "theirs.git"
    git(tmp_path, "init", "--quiet", "--bare", str(theirs))
    made = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"],
        cwd=theirs, input="not referenced\n", capture_output=True, text=True, check=True,
    )  # fmt: skip
    blob = made.stdout.strip()
    path = theirs / "objects" / blob[:2] / blob[2:]
    _age([path], 30)
    (toy.cache / "mirrors").mkdir(parents=True)
    (toy.cache / "mirrors" / "theirs.git").symlink_to(theirs)
    r = cli("cache", "--prune", "--json", env=toy.env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["result"]["mirrors"] == [] and path.exists()
    # nor through a mirrors folder that is itself a link to the user's repositories
    (toy.cache / "mirrors" / "theirs.git").unlink()
    (toy.cache / "mirrors").rmdir()
    (toy.cache / "mirrors").symlink_to(tmp_path)
    r = cli("cache", "--prune", "--json", env=toy.env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["result"]["mirrors"] == [] and path.exists()


@pytest.mark.parametrize("days", ["nan", "inf", "-inf"])
def test_a_cut_off_that_is_no_number_of_days_is_refused(tmp_path, days):
    """`--older-than nan` was taken, and `--json` then printed NaN, which is not JSON."""
    r = cli("cache", "--older-than", days, "--json", env={"PATCHKIT_CACHE": str(tmp_path)})
    assert r.returncode == 2, r.stdout + r.stderr
    assert json.loads(r.stdout)["error"]["message"].startswith(f"--older-than {days}")
