"""Bases that are git commits deep in a real history (many commits, tags, a merge).

Every sdist and wheel base is an imported root commit; here the base has parents, and the
history behind it is loose in the mirror (a fetch under git's unpack limit, or the commits a
later fetch adds to an earlier pack), so a checkout that copied only the base's own objects
and the series' would name parents it does not hold. Each verb that makes a checkout of a
base is run onto such a commit: apply into a new folder and into an existing checkout,
`rebase --write` then apply, and build; import, review and outlook work in the mirror.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import ROOT, git, patchkit, result_of, sha_of

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
"""

CORE = "".join(f"def f{i}():\n    return {i}\n\n\n" for i in range(12))


def _commit(work: Path, path: str, text: str, message: str) -> str:
    (work / path).parent.mkdir(parents=True, exist_ok=True)
    (work / path).write_text(text)
    git(work, "add", "-A")
    git(work, "commit", "-qm", message)
    return sha_of(work, "HEAD")


def _log(work: Path, line: str, message: str) -> str:
    text = (work / "log.txt").read_text() if (work / "log.txt").exists() else ""
    return _commit(work, "log.txt", text + line + "\n", message)


@pytest.fixture
def history(tmp_path, monkeypatch) -> dict:
    """A bare upstream whose v1.0 (the pin) has 20 commits behind it, two tags and a merge,
    v1.1 four commits on; a two-patch series on toy/core.py (which upstream never changes
    after its first commit); and a project pinned to v1.0 through the git URL (a local
    path: the whole history is fetched)."""
    work = tmp_path / "upstream-work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    (work / "pyproject.toml").write_text(PYPROJECT)
    (work / "toy").mkdir()
    (work / "toy" / "__init__.py").write_text('__version__ = "1.0"\n')
    _commit(work, "toy/core.py", CORE, "start")
    for i in range(1, 9):
        _log(work, f"main {i}", f"main {i}")
        if i == 3:
            git(work, "tag", "v0.1")
        if i == 6:
            git(work, "tag", "-a", "v0.2", "-m", "release 0.2")
    git(work, "checkout", "-q", "-b", "feature", "main~4")
    for i in range(1, 4):
        _commit(work, "toy/feature.py", f"FEATURE = {i}\n", f"feature {i}")
    git(work, "checkout", "-q", "main")
    git(work, "merge", "-q", "--no-ff", "-m", "merge feature", "feature")
    for i in range(9, 17):
        _log(work, f"main {i}", f"main {i}")
    git(work, "tag", "v1.0")
    base = sha_of(work, "v1.0")
    for i in range(17, 21):
        _log(work, f"main {i}", f"main {i}")
    git(work, "tag", "-a", "v1.1", "-m", "release 1.1")
    # the series, made on v1.0
    git(work, "checkout", "-q", "-b", "series", "v1.0")
    _commit(work, "toy/core.py", CORE.replace("return 2\n", "return 20\n"), "patch f2")
    _commit(work, "toy/core.py", CORE.replace("return 2\n", "return 20\n").replace(
        "return 9\n", "return 90\n"), "patch f9")  # fmt: skip
    out = tmp_path / "format-patch"
    git(work, "format-patch", "-q", "--zero-commit", "--no-signature", "--no-stat", "-o",
        str(out), "v1.0..series")  # fmt: skip
    git(work, "checkout", "-q", "main")
    bare = tmp_path / "upstream.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    project = tmp_path / "project"
    series = project / "patches" / "toy"
    series.mkdir(parents=True)
    (project / "patches" / "targets.toml").write_text(TARGETS.format(git=bare, commit=base))
    names = []
    for i, patch in enumerate(sorted(out.glob("*.patch")), 1):
        names.append(f"toy-{i:02d}.patch")
        shutil.copy(patch, series / names[-1])
    (series / "series").write_text("".join(f"{n}\n" for n in names))
    cache = tmp_path / "cache"
    monkeypatch.setenv("PATCHKIT_PROJECT", str(project))
    monkeypatch.setenv("PATCHKIT_CACHE", str(cache))
    monkeypatch.setenv("PATCHKIT_OFFLINE_GIT", "0")  # the pinned "remote" is a local path
    monkeypatch.setenv("PATCHKIT_INDEX_URL", "http://127.0.0.1:9/simple")
    assert git(work, "rev-list", "--count", "v1.0").strip() == "21"
    assert len(git(work, "rev-list", "--merges", "v1.0").split()) == 1
    return {
        "work": work,
        "bare": bare,
        "project": project,
        "mirror": cache / "mirrors" / "toy.git",
        "base": base,
        "v1.1": sha_of(work, "v1.1"),
    }


def _loose(mirror: Path, oid: str) -> bool:
    return (mirror / "objects" / oid[:2] / oid[2:]).is_file()


def _apply(*args: str) -> dict:
    r = patchkit("apply", *args, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return result_of(r.stdout)["reports"][0]


def assert_checkout_on(tree: Path, base: str, patches: int = 2) -> None:
    """`tree` is the series on `base`: its commits on the base, each object its own (no
    alternates), its history ending at the base, fsck clean, nothing changed."""
    assert sha_of(tree, "refs/patchkit/toy/base") == base
    assert sha_of(tree, f"HEAD~{patches}") == base
    assert git(tree, "rev-list", "--count", f"{base}..HEAD").strip() == str(patches)
    assert not (tree / ".git" / "objects" / "info" / "alternates").exists()
    git(tree, "rev-list", "--objects", "--quiet", "HEAD")  # a missing object fails it
    git(tree, "fsck", "--no-dangling", "--no-progress")
    assert "return 20\n" in (tree / "toy" / "core.py").read_text()
    assert not git(tree, "status", "--porcelain").strip()


@pytest.mark.parametrize("source", ["git-url", "upstream-bare", "upstream-clone", "file-url"])
def test_apply_into_a_new_folder_onto_a_base_with_history(history, tmp_path, source):
    base, mirror = history["base"], history["mirror"]
    extra = {
        "git-url": (),
        "upstream-bare": ("--upstream", str(history["bare"])),
        "upstream-clone": ("--upstream", str(history["work"])),
        "file-url": ("--upstream", f"file://{history['bare']}"),  # --depth=1: a shallow mirror
    }[source]
    tree = tmp_path / "tree"
    report = _apply("--target", "toy@v1.0", "--into", str(tree), *extra)
    assert report["base"]["commit"] == base
    assert [p["status"] for p in report["patches"]] == ["applied", "applied"]
    assert_checkout_on(tree, base)
    # the checkout ends at its base, as git's own shallow clone would
    assert (tree / ".git" / "shallow").read_text() == f"{base}\n"
    if source != "file-url":  # the whole history was fetched, and is loose in the mirror
        assert _loose(mirror, sha_of(history["work"], "v1.0~5"))
        assert git(mirror, "rev-list", "--count", base).strip() == "21"


def test_apply_onto_an_existing_checkout_after_a_new_upstream_commit(history, tmp_path):
    work, bare = history["work"], history["bare"]
    tree = tmp_path / "tree"
    _apply("--target", "toy@v1.0", "--into", str(tree))
    _log(work, "main 21", "main 21")  # a new upstream commit, on v1.1
    git(work, "push", "-q", str(bare), "main")
    new = sha_of(work, "main")
    report = _apply("--target", f"toy@{new}", "--allow-unpinned", "--into", str(tree),
                    "--upstream", str(bare))  # fmt: skip
    assert report["base"]["commit"] == new and not report["base"]["pinned"]
    assert_checkout_on(tree, new)
    assert git(tree, "branch", "--list", "patchkit/toy-*").strip()  # the first result, kept
    # the five commits between the bases came with the fetch: the history is whole to v1.0
    assert git(tree, "rev-list", "--count", f"{history['base']}..{new}").strip() == "5"
    r = patchkit("status", str(tree), "--json")
    assert r.returncode == 0, r.stdout + r.stderr


def test_apply_onto_an_existing_checkout_from_a_shallow_mirror(history, tmp_path):
    """The URL route (`--depth=1` fetches): the mirror is shallow at each base, and so is the
    checkout the second apply moves."""
    url = f"file://{history['bare']}"
    tree = tmp_path / "tree"
    _apply("--target", "toy@v1.0", "--into", str(tree), "--upstream", url)
    new = history["v1.1"]
    _apply("--target", f"toy@{new}", "--allow-unpinned", "--into", str(tree), "--upstream", url)
    assert_checkout_on(tree, new)


def test_rebase_write_onto_a_commit_with_parents_then_apply(history, tmp_path):
    tree = tmp_path / "tree"
    _apply("--target", "toy", "--into", str(tree))
    r = patchkit("rebase", "--target", "toy@v1.1", "--write", "--upstream", str(history["bare"]))
    assert r.returncode == 0, r.stdout + r.stderr
    targets = (history["project"] / "patches" / "targets.toml").read_text()
    assert f'commit = "{history["v1.1"]}"' in targets
    fresh = tmp_path / "fresh"
    report = _apply("--target", "toy", "--into", str(fresh))
    assert report["base"]["commit"] == history["v1.1"] and report["base"]["pinned"]
    assert_checkout_on(fresh, history["v1.1"])
    _apply("--target", "toy", "--into", str(tree))  # the checkout made on v1.0 moves too
    assert_checkout_on(tree, history["v1.1"])


def test_build_onto_a_base_with_history(history, tmp_path):
    pytest.importorskip("setuptools")
    shutil.copytree(ROOT / "build" / "profiles", history["project"] / "build" / "profiles")
    out = tmp_path / "dist"
    r = patchkit("build", "--target", "toy", "--no-isolation", "--out", str(out), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    [built] = result_of(r.stdout)["wheels"]
    [wheel] = out.glob("toy-*.whl")
    assert built["wheel"] == str(wheel)
    assert built["upstream"]["base_commit"] == history["base"]
    assert built["upstream"]["source"] == "git"


def test_import_and_review_against_a_base_with_history(history, tmp_path):
    """Both read the base in the mirror (no checkout): a base with parents is as good."""
    diff = tmp_path / "change.diff"
    work = history["work"]
    git(work, "checkout", "-q", "-b", "change", "v1.0")
    _commit(work, "toy/core.py", CORE.replace("return 5\n", "return 50\n"), "change f5")
    diff.write_text(git(work, "diff", "v1.0", "change"))
    r = patchkit("import", str(diff), "--target", "toy", "--dry-run", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    r = patchkit("fetch", "--target", "toy@v1.1", "--allow-unpinned")
    assert r.returncode == 0, r.stdout + r.stderr
    r = patchkit("review", "--target", "toy", "--against", f"toy@{history['v1.1']}", "--json")
    assert r.returncode == 0, r.stdout + r.stderr


def test_outlook_onto_releases_with_history(history, tmp_path, monkeypatch):
    """outlook takes its releases from the package index (the target names its package) and
    each release's base through the chain every verb uses, git first: the pin (v1.0) and a
    release pinned in targets.toml (1.1, tag v1.1, four commits on) are commits deep in the
    history, and both patches classify on 1.1.  (A release no [[releases]] entry pins is asked
    of git by its version, `1.1`, not its tag: a git-only upstream gets it from the index.)"""
    targets = history["project"] / "patches" / "targets.toml"
    targets.write_text(
        targets.read_text()
        + f'sdist = "toy==1.0"\nsdist_sha256 = "{"0" * 64}"\n\n[[targets.toy.releases]]\n'
        + f'version = "1.1"\ntag = "v1.1"\ncommit = "{history["v1.1"]}"\n'
    )
    index = tmp_path / "simple"  # a static index on disk: the release list only
    (index / "toy").mkdir(parents=True)
    (index / "toy" / "index.html").write_text(
        "".join(f'<a href="toy-{v}.tar.gz">toy-{v}.tar.gz</a>\n' for v in ("1.0", "1.1"))
    )
    monkeypatch.setenv("PATCHKIT_INDEX_URL", f"file://{index}")
    r = patchkit("outlook", "--target", "toy", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    [line] = result_of(r.stdout)["lines"]
    [release] = line["releases"]
    assert release["version"] == "1.1" and release["base"] == history["v1.1"], release
    assert release["source"] == "git", release
    states = [p["releases"]["1.1"]["state"] for p in line["patches"]]
    assert states == ["clean", "clean"], line["patches"]
