"""`apply`'s build record: an unchanged series on the same base is read, not built again.

Real series, real mirror, real git. What is counted is git's work: each run goes through a
logging `git` first on PATH, and a build shows as `git apply --cached` calls.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers import git, patchkit, result_of, sha_of
from test_lint import builds, logging_git

from patchkit import gitops

BASE_REF = "refs/patchkit/sdist/0.5.9"


@pytest.fixture
def run(cache, project, tmp_path):
    env, log = logging_git(tmp_path)
    counter = iter(range(1000))

    def apply(*extra: str) -> tuple[dict, int, Path]:
        into = tmp_path / f"tree-{next(counter)}"
        r = patchkit("apply", "--target", "sglang", "--into", str(into), "--json", *extra, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        return result_of(r.stdout)["reports"][0], builds(log), into

    apply.cache, apply.project = cache, project  # type: ignore[attr-defined]
    return apply


def record_of(cache: Path) -> Path:
    mirror = cache / "mirrors" / "sglang.git"
    return cache / "verified" / f"build-sglang-{sha_of(mirror, BASE_REF)}"


def patches_of(report: dict) -> list[tuple[str, str, str]]:
    return [(p["name"], p["status"], p["commit"]) for p in report["patches"]]


def test_an_unchanged_series_is_read_and_gives_the_same_checkout(run):
    first, built, tree = run()
    assert built > 0 and record_of(run.cache).is_file()
    again, built_again, tree_again = run()
    assert built_again == 0, "the same series on the same base is not applied again"
    assert patches_of(again) == patches_of(first) and again["result"] == first["result"]
    assert sha_of(tree_again, "HEAD") == first["result"]
    assert git(tree_again, "rev-parse", "HEAD^{tree}") == git(tree, "rev-parse", "HEAD^{tree}")
    gitops.Repo.checkout(tree_again).run("fsck", "--strict", "--no-dangling")
    assert not git(tree_again, "status", "--porcelain").strip()


def test_a_changed_patch_or_option_is_built_again(run):
    first, built, _ = run()
    assert built > 0
    patch = run.project / "patches" / "sglang" / "0.5.9" / first["patches"][-1]["name"]
    raw = patch.read_bytes()
    # the diff alone: the same message and identity, another tree
    lines = raw.split(b"\n")
    at = next(i for i, ln in enumerate(lines) if ln.startswith(b"+ ") and len(ln) > 8)
    lines[at] += b"  # changed"
    patch.write_bytes(b"\n".join(lines))
    changed, built, _ = run()
    assert built > 0 and changed["result"] != first["result"]
    patch.write_bytes(raw.replace(b"\n\n", b"\n\nA changed first line.\n\n", 1))
    changed, built, _ = run()
    assert built > 0 and changed["result"] != first["result"]
    patch.write_bytes(raw)
    _, built, _ = run("--fuzz", "1")  # another option: another key
    assert built > 0
    back, built, _ = run("--fuzz", "1")
    assert built == 0 and back["result"] == first["result"]


def test_a_record_whose_objects_are_gone_is_built_again(run):
    first, _, _ = run()
    mirror = run.cache / "mirrors" / "sglang.git"
    built = json.loads(record_of(run.cache).read_text().split("\n", 1)[1])["built"]
    tree = built[3][0]
    (mirror / "objects" / tree[:2] / tree[2:]).unlink()  # a tree of the fourth commit
    again, count, checkout = run()
    assert count > 0 and again["result"] == first["result"]
    gitops.Repo.checkout(checkout).run("fsck", "--strict", "--no-dangling")
    assert (mirror / "objects" / tree[:2] / tree[2:]).is_file(), "the build wrote it again"


def crafted(cache: Path, payload: str) -> None:
    path = record_of(cache)
    key = path.read_text().split("\n", 1)[0]
    path.write_text(f"{key}\n{payload}")


def test_a_crafted_record_is_never_followed(run):
    """A record with the right key and a payload that is not this build's (another chain
    that is in the mirror, trees swapped, a consistent chain whose objects are missing,
    malformed data) is a miss: the series is built, the checkout is the real result."""
    first, _, _ = run()
    mirror = run.cache / "mirrors" / "sglang.git"
    base = sha_of(mirror, BASE_REF)
    real = json.loads(record_of(run.cache).read_text().split("\n", 1)[1])["built"]
    n = len(real)
    base_tree = git(mirror, "rev-parse", f"{base}^{{tree}}").strip()
    # a chain whose ids match the patches' messages and identities over the base's tree:
    # consistent, but its commits were never written
    from patchkit.apply import _commit_specs
    from patchkit.lines import line_series
    from patchkit.workspace import Workspace

    ws = Workspace.load()  # the project fixture's copy (PATCHKIT_PROJECT)
    series = line_series(ws.project, ws.target("sglang").on_line("0.5.9"))
    forged = gitops.chain_objects(base, _commit_specs(series.patches, [base_tree] * n))
    assert forged is not None
    payloads = [
        json.dumps({"built": [[t, base] for t, _ in real]}),  # another existing commit
        json.dumps({"built": [[real[0][0], c] for _, c in real]}),  # trees swapped
        json.dumps({"built": [[base_tree, oid] for oid, _ in forged]}),  # never written
        json.dumps({"built": real[:-1]}),  # one short
        json.dumps({"built": [[t, c.upper()] for t, c in real]}),
        json.dumps({"built": "x"}),
        json.dumps([1, 2]),
        "{not json",
        "",
    ]
    for payload in payloads:
        crafted(run.cache, payload)
        report, count, checkout = run()
        assert count > 0, payload
        assert report["result"] == first["result"] == sha_of(checkout, "HEAD")
        assert git(checkout, "rev-parse", "HEAD^{tree}").strip() != base_tree


def test_reading_a_record_keeps_its_objects_from_a_prune(run):
    """`cache --prune` removes unreferenced loose objects older than its cut-off: the series'
    commits are such objects. An apply that reads the record freshens them, as git does when
    it writes an object that exists, so a prune after it keeps them; a prune before it
    removes them and the next apply builds the series again."""
    first, _, _ = run()
    mirror = run.cache / "mirrors" / "sglang.git"
    built = json.loads(record_of(run.cache).read_text().split("\n", 1)[1])["built"]
    lines = gitops.objects_since(
        gitops.Repo.bare_at(mirror), built[-1][1], sha_of(mirror, BASE_REF)
    )
    ids = [line.split(" ", 1)[0] for line in lines]
    files = [mirror / "objects" / i[:2] / i[2:] for i in ids]
    month_ago = time.time() - 30 * 86400

    def age() -> None:
        for f in mirror.glob("objects/??/*"):
            os.utime(f, (month_ago, month_ago))

    env = {"PATCHKIT_CACHE": str(run.cache)}
    age()
    _, count, _ = run()
    assert count == 0 and all(f.stat().st_mtime > month_ago + 86400 for f in files if f.exists())
    assert patchkit("cache", "--prune", "--older-than", "7", env=env).returncode == 0
    _, count, _ = run()
    assert count == 0, "the objects the record names survived the prune"
    age()
    assert patchkit("cache", "--prune", "--older-than", "7", env=env).returncode == 0
    assert not any(f.exists() for f in files)
    report, count, checkout = run()
    assert count > 0 and report["result"] == first["result"]
    gitops.Repo.checkout(checkout).run("fsck", "--strict", "--no-dangling")
