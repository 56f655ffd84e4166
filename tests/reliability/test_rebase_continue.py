"""What `rebase --continue` reports about each patch: a conflict resolved at an earlier stop is
`resolved` while the rebase stops again, a patch left out by hand is `dropped` (not claimed
upstream, no `Applied-Upstream:` trailer), and an upstreamed patch keeps its preview's
evidence."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import result_of
from reliability_support import cli, git, make_toy, tag_release

FILE_A = "pkg/mod00/file00.py"  # line 5: the first patch's edit
FILE_B = "pkg/mod01/file03.py"  # line 10: the second patch's edit
NEW_MODULE = "pkg/mod03/new_module.py"  # the file the third patch adds


def take_the_patch_side(tree: Path) -> list[str]:
    """Resolve every conflicted file with the replayed patch's version; the files resolved."""
    files = git(tree, "diff", "--name-only", "--diff-filter=U").split()
    for f in files:
        git(tree, "checkout", "--theirs", "--", f)
        git(tree, "add", "--", f)
    return files


def labels(stdout: str) -> dict[str, dict]:
    return {p["name"]: p for p in result_of(stdout)["patches"]}


def series_of(toy) -> list[str]:
    text = (toy.project / "patches" / "toy" / "series").read_text()
    return [ln for ln in text.split() if ln.endswith(".patch")]


def test_a_conflict_resolved_at_an_earlier_stop_is_resolved_at_the_next(tmp_path):
    toy = make_toy(tmp_path / "toy")
    first, second = series_of(toy)[:2]
    tag_release(
        toy, "v1.1", {FILE_A: (5, "upstream rewrote A"), FILE_B: (10, "upstream rewrote B")}
    )
    r = cli("rebase", "--target", "toy@v1.1", "--conflict-tree", "--json", env=toy.env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert labels(r.stdout)[first]["label"] == "conflict"
    tree = toy.project / "work" / "rebase" / "toy"
    assert take_the_patch_side(tree) == [FILE_A]

    r = cli("rebase", "--target", "toy", "--continue", env=toy.env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"  resolved  {first}" in r.stdout, r.stdout
    assert f"  CONFLICT  {second}  (conflicts in {FILE_B})" in r.stdout, r.stdout
    assert "1 resolved" in r.stdout and "1 conflict" in r.stdout

    assert take_the_patch_side(tree) == [FILE_B]
    r = cli("rebase", "--target", "toy", "--continue", "--write", "--json", env=toy.env)
    assert r.returncode == 0, r.stdout + r.stderr
    by = labels(r.stdout)
    assert by[first]["label"] == by[second]["label"] == "resolved"
    assert series_of(toy)[:2] == [first, second]
    assert "patched line A" in (toy.project / "patches" / "toy" / first).read_text()


def test_a_patch_left_out_by_hand_is_dropped_and_an_upstreamed_one_keeps_its_evidence(
    tmp_path,
):
    toy = make_toy(tmp_path / "toy")
    names = series_of(toy)
    first, third = names[0], names[2]  # the third patch adds pkg/mod03/new_module.py
    tag_release(toy, "v1.1", {FILE_A: (5, "upstream rewrote A")}, {NEW_MODULE: "added = True\n"})
    here = tmp_path / "where-the-user-is"  # the 3-way check of the third patch wrote its file
    here.mkdir()  # into the working directory (tests/reliability/test_sealed_git.py)
    r = cli("rebase", "--target", "toy@v1.1", "--conflict-tree", "--json", env=toy.env, cwd=here)
    assert r.returncode == 1, r.stdout + r.stderr
    assert list(here.iterdir()) == []
    preview = labels(r.stdout)
    assert preview[first]["label"] == "conflict"
    assert preview[third]["label"] == "upstreamed"
    tree = toy.project / "work" / "rebase" / "toy"
    subprocess.run(["git", "rebase", "--skip"], cwd=tree, check=True, capture_output=True)

    r = cli("rebase", "--target", "toy", "--continue", "--write", "--json", env=toy.env)
    assert r.returncode == 0, r.stdout + r.stderr
    result = result_of(r.stdout)
    by = labels(r.stdout)
    assert by[first]["label"] == "dropped" and by[first]["signals"] == []
    assert "no upstream evidence" in by[first]["note"]
    assert by[third]["label"] == "upstreamed"
    assert by[third]["signals"] == preview[third]["signals"]
    assert result["counts"]["dropped"] == 1
    trailers = [ln for ln in result["commit_message"].splitlines() if "Applied-Upstream" in ln]
    assert trailers and all(third in ln for ln in trailers), trailers
    assert f"Dropped {first} while resolving the rebase" in result["commit_message"]
    assert series_of(toy) == [n for n in names if n not in (first, third)]
    assert not (toy.project / "patches" / "toy" / first).exists()


def test_the_printed_commands_quote_every_path(tmp_path):
    """The steps printed at a conflict are pasted into a shell: a folder or a conflicted file
    whose name holds a space, `;` or `$(...)` must be a name there, never a command."""
    from patchkit import gitops
    from patchkit.rebase import conflict_steps

    tree = tmp_path / "my proj $(touch PWNED)"
    tree.mkdir()
    name = "odd name;touch PWNED2.py"
    git(tree, "init", "-q", "-b", "main")
    (tree / name).write_text("a\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "base")
    git(tree, "checkout", "-q", "-b", "other")
    (tree / name).write_text("b\n")
    git(tree, "commit", "-qam", "other")
    git(tree, "checkout", "-q", "main")
    (tree / name).write_text("c\n")
    git(tree, "commit", "-qam", "main")
    merge = subprocess.run(["git", "merge", "-q", "other"], cwd=tree, capture_output=True)
    assert merge.returncode != 0
    steps = conflict_steps(gitops.Repo.checkout(tree), "toy", False)
    (tree / name).write_text("resolved\n")
    script = "\n".join([steps[0], next(s for s in steps if s.startswith("git add"))])
    subprocess.run(["sh", "-ec", script], cwd=tmp_path, check=True, capture_output=True)
    assert not [p for p in tmp_path.rglob("PWNED*")], steps
    assert git(tree, "diff", "--name-only", "--diff-filter=U") == ""  # the file was added


def test_a_folder_patchkit_did_not_leave_is_named_in_the_way(tmp_path):
    """A `work/rebase/<target>` that is not patchkit's conflict tree is neither called a
    rebase in progress nor touched: the error says it is in the way and how to go on."""
    toy = make_toy(tmp_path / "toy")
    tag_release(toy, "v1.1", {FILE_A: (5, "upstream rewrote A")})
    mine = toy.project / "work" / "rebase" / "toy"
    mine.mkdir(parents=True)
    (mine / "mine.txt").write_text("mine\n")
    r = cli("rebase", "--target", "toy@v1.1", "--conflict-tree", env=toy.env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "is in the way" in r.stderr and "move it elsewhere or remove it" in r.stderr
    r = cli("rebase", "--target", "toy", "--abort", env=toy.env)
    assert r.returncode == 3 and "not a conflict work tree patchkit left" in r.stderr, r.stderr
    assert (mine / "mine.txt").read_text() == "mine\n"
