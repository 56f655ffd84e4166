"""build_series applies a run of patches whose paths do not meet with one `git apply --cached`
and computes the trees between (gitops.TreeModel): the commits must be exactly the ones the
patch-by-patch build writes, failures and already-applied patches reported the same way."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import git
from rebase_fixtures import cache_0510, sglang_0510  # noqa: F401 - fixtures
from series_fixtures import EXPORT

from patchkit import apply, gitops
from patchkit.apply import ApplyOptions, RunTrees, build_series
from patchkit.errors import ApplyError
from patchkit.series import Series, parse_patch


def _commit_all(repo: Path, subject: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"{subject}\n\nWhy.\n\nOrigin: vendor, t\n")


def _authored(tmp_path: Path) -> tuple[Path, str, list[tuple[str, bytes]]]:
    """A repository with nested folders and a series exercising every kind of change."""
    work = tmp_path / "work"
    (work / "pkg" / "sub").mkdir(parents=True)
    (work / "pkg" / "gone").mkdir()
    (work / "docs").mkdir()
    for path, text in {
        "pkg/a.py": "a\n" * 5,
        "pkg/a-b.py": "ab\n",
        "pkg/a.b": "a.b\n",
        "pkg/sub/deep.py": "deep\n" * 5,
        "pkg/gone/only.py": "only\n",
        "pkg/old_name.py": "renamed content\n" * 8,
        "pkg/tool.sh": "#!/bin/sh\necho\n",
        "docs/readme.txt": "readme\n" * 5,
        "top.txt": "top\n",
    }.items():
        (work / path).write_text(text)
    git(tmp_path, "init", "-q", str(work))
    (work / "link").symlink_to("top.txt")
    _commit_all(work, "base")
    base = git(work, "rev-parse", "HEAD").strip()
    steps = [
        ("modify-nested", lambda: _edit(work / "pkg/sub/deep.py")),
        ("new-folder", lambda: _write(work / "pkg" / "fresh" / "new" / "mod.py", "new\n")),
        ("delete-only-file", lambda: (work / "pkg/gone/only.py").unlink()),
        ("rename", lambda: (work / "pkg/old_name.py").rename(work / "pkg/new_name.py")),
        ("mode", lambda: (work / "pkg/tool.sh").chmod(0o755)),
        ("sort-order", lambda: _write(work / "pkg" / "a" / "inner.py", "inner\n")),
        ("docs", lambda: _edit(work / "docs/readme.txt")),
        ("nested-again", lambda: _edit(work / "pkg/sub/deep.py", "again")),  # meets the 1st
        ("top", lambda: _edit(work / "top.txt")),
    ]
    patches = []
    for name, change in steps:
        change()
        _commit_all(work, name)
        raw = subprocess.run(
            ["git", *EXPORT, "-1", "HEAD"], cwd=work, check=True, capture_output=True
        ).stdout
        patches.append((f"{name}.patch", raw))
    mirror = tmp_path / "mirror.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(mirror))
    return mirror, base, patches


def _edit(path: Path, word: str = "edited") -> None:
    path.write_text(path.read_text() + f"{word}\n")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _series(patches: list[tuple[str, bytes]]) -> Series:
    return Series("t", Path("."), patches=[parse_patch(n, raw) for n, raw in patches])


def _one_by_one(monkeypatch) -> None:
    monkeypatch.setattr(apply, "disjoint_runs", lambda patches: [[p] for p in patches])


def _build(mirror: Path, base: str, series: Series):
    tip, results = build_series(gitops.Repo.bare_at(mirror), base, series, ApplyOptions())
    return tip, [(r.name, r.status, r.commit) for r in results]


@pytest.fixture
def authored(tmp_path):
    return _authored(tmp_path)


def test_runs_break_where_paths_meet(authored):
    _, _, patches = authored
    runs = apply.disjoint_runs(_series(patches).patches)
    assert [[p.name for p in run] for run in runs] == [
        [n for n, _ in patches[:7]],
        [n for n, _ in patches[7:]],
    ]
    # A path below a file of the run, and a file where the run has a folder, start a new run.
    file_then_folder = [("f.patch", b"pkg/a.py"), ("g.patch", b"pkg/a.py/x")]
    assert _meets(file_then_folder) and _meets(list(reversed(file_then_folder)))
    assert not _meets([("f.patch", b"pkg/a.py"), ("g.patch", b"pkg/a.pyc")])


def _meets(pairs: list[tuple[str, bytes]]) -> bool:
    class Fake:
        def __init__(self, name: str, path: str) -> None:
            self.name, self.path = name, path

    fakes = [Fake(n, p.decode()) for n, p in pairs]
    original = apply.touched_paths
    apply.touched_paths = lambda patch: [patch.path]
    try:
        return len(apply.disjoint_runs(fakes)) == 2
    finally:
        apply.touched_paths = original


def test_runs_write_the_commits_patch_by_patch_writes(authored, monkeypatch):
    mirror, base, patches = authored
    calls = []
    real = gitops.apply_all_to_index
    monkeypatch.setattr(
        gitops, "apply_all_to_index", lambda *a, **k: calls.append(a) or real(*a, **k)
    )
    grouped = _build(mirror, base, _series(patches))
    assert [len(c[2]) for c in calls] == [7, 2]  # two runs, each one git apply
    _one_by_one(monkeypatch)
    assert _build(mirror, base, _series(patches)) == grouped
    tip = grouped[0]
    # Every object the chain names is in the mirror, and the tip's tree is the authored one.
    assert git(mirror, "rev-list", "--objects", f"{base}..{tip}", "--missing=print").count("?") == 0
    work_tip = git(mirror, "rev-parse", "HEAD^{tree}").strip()
    assert git(mirror, "rev-parse", f"{tip}^{{tree}}").strip() == work_tip


def test_a_failing_patch_in_a_run_is_found_and_named(authored, monkeypatch):
    mirror, base, patches = authored
    # Context that is not in the base: the run (the docs patch is left out so it stays one
    # run) does not apply as a whole, and the patch-by-patch build names the broken patch.
    broken = patches[6][1].replace(b" readme\n", b" README\n")
    assert broken != patches[6][1]
    bad = [*patches[:2], ("broken.patch", broken), *patches[2:6]]
    outcomes = []
    for split in (False, True):
        if split:
            _one_by_one(monkeypatch)
        with pytest.raises(ApplyError) as caught:
            build_series(gitops.Repo.bare_at(mirror), base, _series(bad))
        results = caught.value.results
        outcomes.append((caught.value.message, [(r.name, r.status, r.commit) for r in results]))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1][-1][:2] == ("broken.patch", "failed")
    assert all(commit for _, status, commit in outcomes[0][1][:-1])


def test_an_already_applied_patch_in_a_run_is_reported_as_before(authored, monkeypatch):
    mirror, base, patches = authored
    again = [*patches[:3], ("again.patch", patches[0][1]), *patches[3:7]]
    grouped = _build(mirror, base, _series(again))
    assert ("again.patch", "already-applied", None) in grouped[1]
    _one_by_one(monkeypatch)
    assert _build(mirror, base, _series(again)) == grouped


def test_a_model_that_disagrees_with_write_tree_falls_back(authored, monkeypatch):
    mirror, base, patches = authored
    expected = _build(mirror, base, _series(patches))
    real = gitops.TreeModel.change

    def off_by_one(self, changes):
        root, bodies, ids = real(self, changes)
        return "0" * len(root), bodies, ids

    monkeypatch.setattr(gitops.TreeModel, "change", off_by_one)
    assert _build(mirror, base, _series(patches)) == expected


CHANGES = [
    {"pkg/a.py": "x", "pkg/new/deeper/n.py": "y", "pkg/a/inner.py": "u"},  # "a/" > "a-b.py"
    {"pkg/gone/only.py": None},  # the folder goes with its last file
    {"pkg/a.py": None, "pkg/a.py/inside.py": "z"},  # a file gives way to a folder
    {"pkg/a.py/inside.py": None, "pkg/a.py": "w"},  # and back
    {"pkg/tool.sh": "exec", "pkg/a0": "v", "pkg/a-c": "u"},  # modes and sort order
    {"docs/readme.txt": None, "top.txt": None, "pkg/sub/deep.py": None},
]


def test_tree_model_matches_write_tree(authored, tmp_path):
    """Each change set, made by the model and by git's own index + write-tree, gives the
    same tree id; the bodies the model computes are what git writes."""
    mirror, base, _ = authored
    model = gitops.TreeModel.read(gitops.Repo.bare_at(mirror), base)
    blobs = {tag: _blob(mirror, tag) for tag in ("x", "y", "z", "w", "v", "u")}
    index = tmp_path / "index"
    env = {"GIT_INDEX_FILE": str(index)}
    git(mirror, "read-tree", base, env=env)
    for changes in CHANGES:
        resolved = {}
        for path, value in changes.items():
            if value is None:
                resolved[path] = None
            elif value == "exec":
                old = git(mirror, "ls-files", "-s", "--", path, env=env).split()[1]
                resolved[path] = ("100755", old)
            else:
                resolved[path] = ("100644", blobs[value])
        lines = "".join(f"0 {'0' * 40}\t{p}\n" for p, v in resolved.items() if v is None) + "".join(
            f"{v[0]} {v[1]}\t{p}\n" for p, v in resolved.items() if v is not None
        )
        subprocess.run(
            ["git", "--git-dir", str(mirror), "update-index", "--index-info"],
            input=lines.encode(),
            env={**os.environ, **env},
            check=True,
        )
        expected = git(mirror, "write-tree", env=env).strip()
        root, bodies, ids = model.change(resolved)
        assert root == expected
        for oid, body in zip(ids, bodies, strict=True):  # write-tree wrote the same trees
            assert _object(mirror, oid) == body


def _blob(repo: Path, text: str) -> str:
    return (
        subprocess.run(
            ["git", "--git-dir", str(repo), "hash-object", "-w", "--stdin"],
            input=text.encode(),
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .strip()
    )


def _object(repo: Path, oid: str) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", str(repo), "cat-file", "tree", oid], check=True, capture_output=True
    ).stdout


def _classify(workspace, ref: str):
    from patchkit.rebase import classify_rebase, resolve_new_base
    from patchkit.upstream import Mirror, acquire

    target = workspace.target("sglang")
    new, pin = resolve_new_base(target, ref)
    report = classify_rebase(
        Mirror(target).repo,
        target,
        workspace.series("sglang"),
        acquire(target, None),
        new,
        series_version=workspace.targets.series_version,
        ref=ref,
        pin=pin,
    )
    return report.tip, [
        (
            o.name,
            o.label,
            o.tree,
            o.commit,
            o.refreshed,
            o.note,
            o.provisional,
            o.conflicts,
            [(s.name, s.fired, s.detail) for s in o.signals],
        )
        for o in report.outcomes
    ]


@pytest.mark.usefixtures("cache_0510")
@pytest.mark.parametrize("ref", ["0.5.9", "0.5.10"])
def test_rebase_classification_is_the_same_run_by_run(workspace, monkeypatch, ref):
    """The real series on its own pin (every patch clean: one run carries seven) and onto
    0.5.10 (conflicts, a merge and an equivalent upstream: runs fall back patch by patch)
    is classified exactly as patch by patch."""
    from patchkit.classify import carry

    accepted = []
    real = RunTrees.accept
    monkeypatch.setattr(RunTrees, "accept", lambda self: accepted.append(1) or real(self))
    by_runs = _classify(workspace, ref)
    assert len(accepted) == (1 if ref == "0.5.9" else 0)  # 0.5.10: every run falls back
    monkeypatch.setattr(carry, "disjoint_runs", lambda patches: [[p] for p in patches])
    assert _classify(workspace, ref) == by_runs
    if ref == "0.5.9":
        assert {label for _, label, *_ in by_runs[1]} == {"clean"}


@pytest.mark.usefixtures("cache_0510")
def test_a_run_whose_patch_upstream_defines_falls_back(workspace, monkeypatch):
    """A patch of a run that applies but whose definitions the new base has is not carried:
    the run is classified patch by patch, and the later patches go on without it."""
    from patchkit.classify import Signal, carry

    real = carry.definitions_signal

    def fires_for_kimi(mirror, tip, old_base, patch):
        if patch.name.startswith("kimi-"):
            return Signal("definitions-present", True, "stand-in: upstream has them")
        return real(mirror, tip, old_base, patch)

    monkeypatch.setattr(carry, "definitions_signal", fires_for_kimi)
    by_runs = _classify(workspace, "0.5.9")
    labels = {name: label for name, label, *_ in by_runs[1]}
    assert labels["kimi-k25-eagle3-delegation.patch"] == "upstreamed"
    assert {label for name, label in labels.items() if not name.startswith("kimi-")} == {"clean"}
    monkeypatch.setattr(carry, "disjoint_runs", lambda patches: [[p] for p in patches])
    assert _classify(workspace, "0.5.9") == by_runs


def test_git_reads_the_file_sections_patchkit_reads(authored, tmp_path):
    mirror, _, patches = authored
    files = []
    for name, raw in patches:
        (tmp_path / name).write_bytes(raw)
        files.append(tmp_path / name)
    series = _series(patches)
    expected = [change.path for patch in series.patches for change in patch.files]
    assert gitops.patch_file_paths(gitops.Repo.bare_at(mirror), files) == expected
    assert "pkg/new_name.py" in expected and "pkg/gone/only.py" in expected


def test_a_run_git_reads_otherwise_is_built_patch_by_patch(authored, monkeypatch):
    mirror, base, patches = authored
    expected = _build(mirror, base, _series(patches))
    monkeypatch.setattr(gitops, "patch_file_paths", lambda repo, files: ["elsewhere"])
    monkeypatch.setattr(gitops, "apply_all_to_index", lambda *a, **k: pytest.fail("applied"))
    assert _build(mirror, base, _series(patches)) == expected
