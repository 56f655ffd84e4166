"""`patchkit apply`: real sdist bases, real git, the CLI's exit codes and atomicity."""

from __future__ import annotations

import pytest
from helpers import git, patchkit, result_of, sha_of, snapshot
from series_fixtures import make_patch, tree_from_mirror, write_series

PIN = "bbe9c7eeb520b0a67e92d133dfc137a3688dc7f2"
SERVER_ARGS = "python/sglang/srt/server_args.py"
COMMUNICATOR = "python/sglang/srt/layers/communicator.py"


@pytest.fixture
def sglang_base(cache):
    mirror = cache / "mirrors" / "sglang.git"
    return mirror, sha_of(mirror, "refs/patchkit/sdist/0.5.9")


@pytest.fixture
def small_series(tmp_path, project, sglang_base):
    """Two real patches against the real sglang 0.5.9 tree."""
    mirror, base = sglang_base
    repo = tree_from_mirror(mirror, base, tmp_path / "author")
    one = make_patch(
        repo, SERVER_ARGS, "import argparse", "import argparse  # patched-one", "Mark server_args"
    )
    two = make_patch(
        repo, COMMUNICATOR, "import logging", "import logging  # patched-two", "Mark communicator"
    )
    write_series(project, "sglang", {"mark-server-args.patch": one, "mark-communicator.patch": two})
    return {"mark-server-args.patch": one, "mark-communicator.patch": two}


def apply_json(*args, **kw):
    result = patchkit("apply", *args, "--json", **kw)
    return result, result_of(result.stdout) if result.stdout.strip() else None


def commits_since_base(tree):
    base = sha_of(tree, "refs/patchkit/sglang/base")
    return git(
        tree,
        "log",
        "--format=%s%n%(trailers:key=Patchkit-Patch,valueonly)",
        "--reverse",
        f"{base}..HEAD",
    ).split()


@pytest.mark.parametrize("ref", ["v0.5.9", "0.5.9", PIN, PIN[:10]])
def test_apply_pinned_ref_forms(tmp_path, small_series, ref):
    into = tmp_path / f"tree-{ref}"
    result, doc = apply_json("--target", f"sglang@{ref}", "--into", str(into))
    assert result.returncode == 0, result.stderr
    report = doc["reports"][0]
    assert report["base"]["upstream_commit"] == PIN
    assert report["base"]["sdist_sha256"].startswith("11b1445b")
    assert [p["status"] for p in report["patches"]] == ["applied", "applied"]
    assert sha_of(into, "HEAD") == report["result"]
    assert git(into, "rev-parse", "--abbrev-ref", "HEAD").strip() == "patchkit/sglang"
    # one commit per patch, each naming its patch file; the base is the sdist import
    assert commits_since_base(into) == [
        "Mark",
        "server_args",
        "mark-server-args.patch",
        "Mark",
        "communicator",
        "mark-communicator.patch",
    ]
    base_msg = git(into, "show", "-s", "--format=%B", "refs/patchkit/sglang/base")
    assert f"Patchkit-Upstream-Commit: {PIN}" in base_msg
    assert "# patched-two" in (into / COMMUNICATOR).read_text()
    assert not git(into, "status", "--porcelain")


def test_same_series_gives_same_commit_ids(tmp_path, small_series):
    a, b = tmp_path / "a", tmp_path / "b"
    _, doc_a = apply_json("--target", "sglang@v0.5.9", "--into", str(a))
    _, doc_b = apply_json("--target", f"sglang@{PIN}", "--into", str(b))
    assert doc_a["reports"][0]["result"] == doc_b["reports"][0]["result"]


def test_second_apply_exits_3_and_changes_nothing(tmp_path, small_series):
    into = tmp_path / "tree"
    assert patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into)).returncode == 0
    before = snapshot(into)
    again = patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into))
    assert again.returncode == 3, again.stderr
    assert "nothing to do" in again.stdout
    assert snapshot(into) == before


def _broken(small_series) -> bytes:
    """mark-communicator.patch against a context line the base does not have."""
    bad = small_series["mark-communicator.patch"].replace(b"-import logging", b"-import lumber")
    return bad.replace(b" import logging\n", b" import lumber\n")


def test_failing_patch_leaves_new_dir_absent(tmp_path, project, small_series):
    bad = _broken(small_series)
    write_series(
        project,
        "sglang",
        {"mark-server-args.patch": small_series["mark-server-args.patch"], "broken.patch": bad},
    )
    into = tmp_path / "tree"
    result = patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into))
    assert result.returncode == 1
    assert "broken.patch does not apply" in result.stdout + result.stderr
    assert COMMUNICATOR in result.stdout and "@@ -" in result.stdout
    # the next step names the real ref and line, something a user can paste
    assert "next: retry with --3way" in result.stdout, result.stdout
    assert "`patchkit rebase --target sglang@0.5.9 --line 0.5.9`" in result.stdout
    assert "<ref>" not in result.stdout + result.stderr
    assert not into.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tree.patchkit-")]


def test_failed_apply_counts_the_whole_series(tmp_path, project, small_series):
    bad = _broken(small_series)
    write_series(
        project,
        "sglang",
        {"broken.patch": bad, "mark-server-args.patch": small_series["mark-server-args.patch"]},
    )
    result = patchkit("apply", "--target", "sglang", "--into", str(tmp_path / "tree"))
    assert result.returncode == 1
    assert "2 patch(es) ->" in result.stdout, result.stdout


def test_failing_patch_leaves_existing_checkout_byte_identical(tmp_path, project, small_series):
    into = tmp_path / "tree"
    write_series(
        project, "sglang", {"mark-server-args.patch": small_series["mark-server-args.patch"]}
    )
    assert patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into)).returncode == 0
    (into / "untracked.txt").write_text("mine")
    (into / "python" / "build").mkdir()
    (into / "python" / "build" / "ignored.o").write_text("ignored")
    bad = small_series["mark-communicator.patch"].replace(b"import logging", b"import lumber")
    write_series(
        project,
        "sglang",
        {"mark-server-args.patch": small_series["mark-server-args.patch"], "broken.patch": bad},
    )
    before = snapshot(into)
    result = patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into))
    assert result.returncode == 1
    assert snapshot(into) == before


def test_dirty_checkout_refused_with_changes_intact(tmp_path, small_series):
    into = tmp_path / "tree"
    assert patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into)).returncode == 0
    target = into / SERVER_ARGS
    target.write_text(target.read_text() + "\n# my local edit\n")
    before = snapshot(into)
    result = patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into))
    assert result.returncode == 1
    assert "uncommitted changes" in result.stderr and SERVER_ARGS in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2
    assert snapshot(into) == before


def test_wrong_sdist_hash_refused(tmp_path, project, shared_cache, monkeypatch):
    targets = project / "patches" / "targets.toml"
    text = targets.read_text().replace("11b1445bfb039c20", "00000000000000aa")
    targets.write_text(text)
    empty = tmp_path / "empty-cache"
    (empty / "sdists").mkdir(parents=True)
    for sdist in (shared_cache / "sdists").glob("sglang-*.tar.gz"):
        (empty / "sdists" / sdist.name).write_bytes(sdist.read_bytes())
    before = snapshot(empty / "sdists")
    into = tmp_path / "tree"
    result = patchkit(
        "apply",
        "--target",
        "sglang@v0.5.9",
        "--into",
        str(into),
        env={"PATCHKIT_CACHE": str(empty)},
    )
    assert result.returncode == 1
    assert "does not match the pin" in result.stderr
    assert "Traceback" not in result.stderr
    assert not into.exists()
    assert snapshot(empty / "sdists") == before
    assert not (empty / "mirrors" / "sglang.git" / "refs" / "patchkit").exists()


def test_already_applied_patch_is_reported_not_failed(tmp_path, project, small_series):
    into = tmp_path / "tree"
    write_series(
        project, "sglang", {"mark-server-args.patch": small_series["mark-server-args.patch"]}
    )
    assert patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into)).returncode == 0
    # The same change again under another name: the tree already has it.
    write_series(
        project,
        "sglang",
        {
            "mark-server-args.patch": small_series["mark-server-args.patch"],
            "again.patch": small_series["mark-server-args.patch"],
        },
    )
    result, doc = apply_json("--target", "sglang@v0.5.9", "--into", str(tmp_path / "t2"))
    assert result.returncode == 0
    assert [p["status"] for p in doc["reports"][0]["patches"]] == ["applied", "already-applied"]


def test_fuzz_is_opt_in_and_reported(tmp_path, project, small_series):
    raw = small_series["mark-communicator.patch"].decode()
    lines = raw.split("\n")
    # damage the first context line of the hunk so it only applies with reduced context
    first_ctx = next(i for i, ln in enumerate(lines) if ln.startswith("@@")) + 1
    lines[first_ctx] = " " + lines[first_ctx][1:] + "  # drifted"
    write_series(project, "sglang", {"drift.patch": "\n".join(lines).encode()})
    strict = patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(tmp_path / "a"))
    assert strict.returncode == 1
    result, doc = apply_json(
        "--target", "sglang@v0.5.9", "--into", str(tmp_path / "b"), "--fuzz", "1"
    )
    assert result.returncode == 0, result.stderr
    patch = doc["reports"][0]["patches"][0]
    assert patch["status"] == "fuzzed"
    assert patch["fuzzed_hunks"][0]["path"] == COMMUNICATOR
    text = patchkit(
        "apply", "--target", "sglang@v0.5.9", "--into", str(tmp_path / "c"), "--fuzz", "1"
    ).stdout
    assert "FUZZED" in text


def test_threeway_merges_on_recorded_blobs(tmp_path, project, sglang_base, cache):
    mirror, base = sglang_base
    repo = tree_from_mirror(mirror, base, tmp_path / "author")
    first = make_patch(repo, SERVER_ARGS, "import argparse", "import argparse  # one", "One")
    git(repo, "reset", "-q", "--hard", base)
    # A second patch written against the base, touching lines next to the first one's change.
    text = (repo / SERVER_ARGS).read_text()
    second = make_patch(repo, SERVER_ARGS, "import importlib\n", "import importlib  # two\n", "Two")
    # one unchanged line apart: plain apply fails on context, a 3-way merge resolves it
    assert "import argparse\nimport dataclasses\nimport importlib\n" in text
    write_series(project, "sglang", {"one.patch": first, "two.patch": second})
    plain = patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(tmp_path / "a"))
    assert plain.returncode == 1
    result, doc = apply_json("--target", "sglang@v0.5.9", "--into", str(tmp_path / "b"), "--3way")
    assert result.returncode == 0, result.stderr
    assert [p["status"] for p in doc["reports"][0]["patches"]] == ["applied", "merged"]
    merged = (tmp_path / "b" / SERVER_ARGS).read_text()
    assert "import argparse  # one\nimport dataclasses\nimport importlib  # two" in merged


def test_existing_checkout_moves_to_result_keeping_untracked(tmp_path, small_series, project):
    into = tmp_path / "tree"
    write_series(
        project, "sglang", {"mark-server-args.patch": small_series["mark-server-args.patch"]}
    )
    assert patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into)).returncode == 0
    (into / "notes.txt").write_text("keep me")
    write_series(project, "sglang", small_series)
    result = patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into))
    assert result.returncode == 0, result.stderr
    assert (into / "notes.txt").read_text() == "keep me"
    assert "# patched-two" in (into / COMMUNICATOR).read_text()


def test_user_commits_on_the_branch_are_kept(tmp_path, small_series):
    into = tmp_path / "tree"
    assert patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into)).returncode == 0
    (into / "mine.txt").write_text("x")
    git(into, "add", "mine.txt")
    git(into, "commit", "-qm", "my work")
    mine = sha_of(into, "HEAD")
    assert patchkit("apply", "--target", "sglang@v0.5.9", "--into", str(into)).returncode == 0
    assert sha_of(into, f"patchkit/sglang-{mine[:12]}") == mine


def test_upstream_local_bare_repository(tmp_path, project, upstream_remote, small_series):
    commit = sha_of(upstream_remote, "v0.5.9")
    targets = project / "patches" / "targets.toml"
    targets.write_text(targets.read_text().replace(PIN, commit))
    into = tmp_path / "tree"
    result, doc = apply_json(
        "--target", "sglang@v0.5.9", "--into", str(into), "--upstream", str(upstream_remote)
    )
    assert result.returncode == 0, result.stderr
    report = doc["reports"][0]
    assert report["base"]["source"] == "upstream"
    assert report["base"]["commit"] == commit
    assert sha_of(into, "refs/patchkit/sglang/base") == commit


def test_upstream_ref_that_moved_is_refused(tmp_path, project, upstream_remote):
    # The pin says v0.5.9 is the first commit; the remote's v0.5.9.1 is another commit.
    later = sha_of(upstream_remote, "v0.5.9.1")
    result = patchkit(
        "apply",
        "--target",
        f"sglang@{later}",
        "--into",
        str(tmp_path / "t"),
        "--upstream",
        str(upstream_remote),
    )
    assert result.returncode == 1
    assert "no pin" in result.stderr and "--allow-unpinned" in result.stderr
    loud = patchkit(
        "apply",
        "--target",
        f"sglang@{later}",
        "--into",
        str(tmp_path / "t"),
        "--upstream",
        str(upstream_remote),
        "--allow-unpinned",
    )
    assert "not pinned" in loud.stdout


def test_unknown_ref_names_sources(tmp_path):
    result = patchkit("apply", "--target", "sglang@v9.9.9", "--into", str(tmp_path / "t"))
    assert result.returncode == 1
    assert "cannot resolve sglang@v9.9.9" in result.stderr
    assert "Traceback" not in result.stderr


def test_unresolvable_sha_names_sources_tried(tmp_path):
    result = patchkit(
        "apply",
        "--target",
        "sglang@" + "ab" * 20,
        "--into",
        str(tmp_path / "t"),
        "--allow-unpinned",
        env={"PATCHKIT_OFFLINE_GIT": "0"},
    )
    assert result.returncode == 2  # cannot obtain the base
    assert "tried" in result.stderr and "git:" in result.stderr and "index:" in result.stderr
    assert "--upstream" in result.stderr


def test_apply_real_series_all_targets(tmp_path, cache):
    """The project's own series applies at the pins with zero fuzz, one commit per patch."""
    from patchkit.workspace import Workspace

    ws = Workspace.load()
    result, doc = apply_json("--target", "all", "--into", str(tmp_path / "all"))
    assert result.returncode == 0, result.stdout + result.stderr
    for report in doc["reports"]:
        names = ws.series(report["target"]).names
        assert [p["name"] for p in report["patches"]] == names
        assert all(p["status"] == "applied" for p in report["patches"])
        tree = tmp_path / "all" / report["target"]
        base = sha_of(tree, f"refs/patchkit/{report['target']}/base")
        count = git(tree, "rev-list", "--count", f"{base}..HEAD").strip()
        assert int(count) == len(names)


def test_json_is_one_document(tmp_path, small_series):
    out, doc = apply_json("--target", "sglang", "--into", str(tmp_path / "t"))
    assert set(doc) == {"reports"}
    assert doc["reports"][0]["series"]["version"]


def test_a_mistyped_upstream_path_is_refused_not_skipped(tmp_path, cache):
    into = tmp_path / "sg"
    r = patchkit("apply", "--target", "flashinfer", "--into", str(into),
                 "--upstream", str(tmp_path / "no-such-clone"))  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no-such-clone: no such file or directory" in r.stderr
    assert not into.exists()
