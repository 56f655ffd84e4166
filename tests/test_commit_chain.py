"""gitops.commit_chain writes the same commits `git commit-tree` writes one by one."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import git

from patchkit import gitops
from patchkit.gitops.trees import _plain_identity

IDENTITIES = [
    gitops.Identity("Ada Lovelace", "ada@example.invalid", "1700000000 +0000"),
    gitops.Identity("Zoë Ünïcode", "zoe@example.invalid", "1700000123 +0530"),
    gitops.Identity("West", "west@example.invalid", "1700000456 -0800"),
    # commit-tree rewrites these (crud at the ends, delimiters, dates it parses): the chain
    # must hand them to commit-tree.
    gitops.Identity(" Dot. ", "<dot@example.invalid>", "1700000000 +0000"),
    gitops.Identity("A <b> c", "x@example.invalid", "1700000000 +0000"),
    gitops.Identity("Rfc", "rfc@example.invalid", "Tue, 14 Nov 2023 22:13:20 +0000"),
    gitops.Identity("Minus zero", "mz@example.invalid", "1700000000 -0000"),
]
MESSAGES = [
    "Subject\n\nBody.\n\nPatchkit-Patch: a.patch\n",
    "No trailing newline",
    "Ünïcode subject\n\n\n\nblank lines kept\n",
]


def _repo(tmp_path: Path, bare: bool) -> tuple[Path, str, list[str]]:
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    trees = []
    for i in range(3):
        (work / "f.txt").write_text(f"{i}\n")
        git(work, "add", "f.txt")
        trees.append(git(work, "write-tree").strip())
    git(work, "commit", "-qm", "base")
    base = git(work, "rev-parse", "HEAD").strip()
    if not bare:
        return work, base, trees
    mirror = tmp_path / "mirror.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(mirror))
    return mirror, base, trees


@pytest.mark.parametrize("bare", [True, False], ids=["bare", "work-tree"])
@pytest.mark.parametrize("who", IDENTITIES, ids=lambda w: f"{w.name!r}/{w.date}")
def test_chain_matches_commit_tree(tmp_path, who, bare):
    path, base, trees = _repo(tmp_path, bare)
    repo = gitops.Repo.bare_at(path) if bare else gitops.Repo.checkout(path)
    commits = [(tree, MESSAGES[i % len(MESSAGES)], who) for i, tree in enumerate(trees)]
    expected, parent = [], base
    for tree, message, ident in commits:
        parent = gitops.commit_tree(repo, tree, parent, message, ident)
        expected.append(parent)
    # Remove the commit-tree objects so the chain has to write its own.
    for sha in expected:
        loose = Path(repo.git_dir()) / "objects" / sha[:2] / sha[2:]
        loose.unlink()
    assert gitops.commit_chain(repo, base, commits) == expected
    for sha in expected:
        assert gitops.has_commit(repo, sha)
    git(path, "fsck", "--strict", "--no-dangling")


def test_plain_identity_is_only_what_commit_tree_keeps():
    plain = [_plain_identity(who) for who in IDENTITIES]
    assert plain == [True, True, True, False, False, False, False]


def test_empty_chain_is_the_base(tmp_path):
    path, base, _ = _repo(tmp_path, True)
    assert gitops.commit_chain(gitops.Repo.bare_at(path), base, []) == []


def test_a_verb_takes_a_repo_never_a_path(tmp_path):
    path, base, _ = _repo(tmp_path, True)
    with pytest.raises(TypeError, match="takes a Repo"):
        gitops.has_commit(path, base)  # a guessed bareness would run git in the wrong place
    assert gitops.has_commit(gitops.Repo.bare_at(path), base)


def test_a_repo_reads_as_its_folder_in_messages(tmp_path):
    """Messages and hints interpolate repositories: they must show the folder, not the object
    (an export refusal's hint read `--into 'Repo.checkout(...)'`)."""
    assert str(gitops.Repo.checkout(tmp_path)) == str(tmp_path)
    assert f"{gitops.Repo.bare_at(tmp_path / 'm.git')}" == str(tmp_path / "m.git")
