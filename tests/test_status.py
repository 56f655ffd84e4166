"""`patchkit status` on work trees made by `apply` from the real series."""

from __future__ import annotations

import pytest
from helpers import git, patchkit, result_of, sha_of
from series_fixtures import make_patch, tree_from_mirror, write_series


@pytest.fixture
def applied(tmp_path, cache):
    into = tmp_path / "sglang"
    result = patchkit("apply", "--target", "sglang", "--into", str(into))
    assert result.returncode == 0, result.stderr
    return into


def states(into):
    result = patchkit("status", str(into), "--json")
    doc = result_of(result.stdout)["status"][0]
    return result.returncode, doc, {p["name"]: p["state"] for p in doc["patches"]}


def test_fresh_tree_is_applied(applied, workspace):
    rc, doc, by_name = states(applied)
    assert rc == 0
    assert set(by_name.values()) == {"applied"}
    assert list(by_name) == workspace.series("sglang").names
    assert doc["upstream_commit"] == workspace.target("sglang").pinned.commit
    assert "sdist sglang-0.5.9.tar.gz" in doc["stands_for"]
    text = patchkit("status", str(applied)).stdout
    assert "series   0.1" in text or "series" in text
    assert "(= series result)" in text


def test_edit_after_apply_is_modified(applied, workspace):
    patch = workspace.series("sglang").patches[0]
    path = applied / patch.files[0].path
    path.write_text(path.read_text() + "\n# local edit\n")
    rc, _, by_name = states(applied)
    assert rc == 1
    assert by_name[patch.name] == "modified"
    touching = [
        p.name
        for p in workspace.series("sglang").patches
        if patch.files[0].path in {f.path for f in p.files}
    ]
    # the edit is drift of the last patch that touches the file; earlier ones stay intact
    assert {n for n, s in by_name.items() if s == "modified"} == {touching[-1]}


def test_a_later_patch_on_the_same_file_leaves_the_earlier_one_applied(tmp_path, project, cache):
    mirror = cache / "mirrors" / "sglang.git"
    base = sha_of(mirror, "refs/patchkit/sdist/0.5.9")
    repo = tree_from_mirror(mirror, base, tmp_path / "author")
    path = "python/sglang/srt/server_args.py"
    one = make_patch(repo, path, "import argparse", "import argparse  # one", "First edit")
    two = make_patch(repo, path, "import dataclasses", "import dataclasses  # two", "Second edit")
    write_series(project, "sglang", {"first.patch": one, "second.patch": two})
    into = tmp_path / "sg"
    assert patchkit("apply", "--target", "sglang", "--into", str(into)).returncode == 0
    rc, _, by_name = states(into)
    assert rc == 0 and by_name == {"first.patch": "applied", "second.patch": "applied"}
    (into / path).write_text((into / path).read_text() + "# local\n")
    rc, doc, by_name = states(into)
    assert rc == 1 and by_name == {"first.patch": "applied", "second.patch": "modified"}


def test_dropped_commit_is_missing(applied, workspace):
    last = workspace.series("sglang").names[-1]
    git(applied, "reset", "-q", "--hard", "HEAD~1")
    rc, _, by_name = states(applied)
    assert rc == 1
    assert by_name[last] == "missing"


def test_status_outside_a_work_tree_is_one_line(tmp_path):
    result = patchkit("status", str(tmp_path))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) <= 2
    assert "Traceback" not in result.stderr
