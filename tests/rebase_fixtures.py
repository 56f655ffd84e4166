"""Fixtures for the rebase / export / lint / review tests.

- `sglang_0510`: the real sglang 0.5.10 sdist from the package index (sha256-checked against
  the value recorded here) imported into the shared test mirror, so `cache` copies carry it.
- `git_upstream`: a local bare repository standing in for the SGLang remote with real history:
  v0.5.9 (the sdist tree), v0.5.9.2 (upstream merged the SM120 symm-mem change, exactly),
  v0.5.9.3 (upstream also edited the line the post-all-reduce capture patch sits on).
- `git_project`: a scratch project whose targets.toml pins sglang v0.5.9 of `git_upstream`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, git, series_folder

SGLANG_0510_SHA256 = "db78367f41a1f385f8624a10e9506b671e788f9943978df6a37a486867c1edc7"
SYMM_MEM = "sm120-torch-symm-mem-allreduce.patch"
AUX_POST = "eagle3-aux-capture-post-allreduce.patch"
DEEPSEEK = "python/sglang/srt/models/deepseek_v2.py"
A2A_LINE = "if self.enable_a2a_moe and i > self.first_k_dense_replace:"
SYMM_SIZES = "python/sglang/srt/distributed/device_communicators/all_reduce_utils.py"
SIZE_LINE = "        6: 128 * MiB,  # 128 MB\n"
SIZE_LINE_EDITED = "        6: 96 * MiB,  # 96 MB\n"


@pytest.fixture(scope="session")
def sglang_0510(shared_cache, warm_mirrors, workspace) -> str:
    """Import sglang 0.5.10 into the shared mirror (once); returns the import commit."""
    from patchkit import gitops
    from patchkit.locks import locked
    from patchkit.targets import Release
    from patchkit.upstream import SDIST_REF, Mirror, download_sdist, import_sdist

    target = workspace.target("sglang")
    mirror = Mirror(target, shared_cache)
    release = Release(
        version="0.5.10", commit="0" * 40, sdist="sglang==0.5.10", sdist_sha256=SGLANG_0510_SHA256
    )
    with locked(mirror.lock_path, "the sglang mirror"):
        sha = gitops.resolve(mirror.repo, SDIST_REF.format(version="0.5.10"))
        if sha is None:
            archive = download_sdist(release, shared_cache)
            sha = import_sdist(mirror, target, release, archive)
    return sha


@pytest.fixture
def cache_0510(sglang_0510, cache) -> Path:
    """A private cache whose sglang mirror already holds the 0.5.10 import."""
    return cache


def set_series(project: Path, target: str, names: list[str]) -> None:
    """Keep only `names` (in this order) in a scratch project's series of `target`."""
    directory = series_folder(project, target)
    for path in directory.glob("*.patch"):
        if path.name not in names:
            path.unlink()
    (directory / "series").write_text(
        "# test subset of the real series\n" + "".join(f"{n}\n" for n in names)
    )


@pytest.fixture(scope="session")
def git_upstream(tmp_path_factory, upstream_remote) -> dict[str, object]:
    """A bare repository with v0.5.9 -> v0.5.9.2 (symm-mem upstreamed) -> v0.5.9.3 (the a2a
    line next to the aux-capture patch rewritten), and v0.5.9.4 on a branch from v0.5.9 (lines
    moved; symm-mem merged after a nearby edit); returns path and commit ids."""
    work = tmp_path_factory.mktemp("git-upstream-work") / "sglang"
    git(work.parent, "clone", "-q", str(upstream_remote), str(work))
    git(work, "checkout", "-q", "-B", "main", "v0.5.9")
    base = git(work, "rev-parse", "HEAD").strip()
    patch = ROOT / "patches" / "sglang" / "0.5.9" / SYMM_MEM
    git(work, "apply", "--index", str(patch))
    git(work, "commit", "-qm", "Support SM120 in the torch symmetric-memory all-reduce")
    git(work, "tag", "v0.5.9.2")
    path = work / DEEPSEEK
    text = path.read_text()
    assert text.count(A2A_LINE) == 1
    path.write_text(text.replace(A2A_LINE, A2A_LINE.replace(" > ", " >= ")))
    git(work, "commit", "-qam", "Gather aux states from the first MoE layer on")
    git(work, "tag", "v0.5.9.3")
    # v0.5.9.4, from v0.5.9: three lines on top of deepseek_v2.py (the aux-capture patch only
    # moves: offset), an unrelated edit in the first context line of the symm-mem hunk, then
    # the symm-mem change itself (git's "merged after a nearby edit" case).
    git(work, "checkout", "-q", "-B", "edited", "v0.5.9")
    path.write_text("# upstream header\n# one\n# two\n" + text)
    sizes = work / SYMM_SIZES
    sizes_text = sizes.read_text()
    assert sizes_text.count(SIZE_LINE) == 2
    sizes.write_text(sizes_text[::-1].replace(SIZE_LINE[::-1], SIZE_LINE_EDITED[::-1], 1)[::-1])
    git(work, "commit", "-qam", "Tune the SM100 symm-mem sizes; header")
    git(work, "apply", "--index", "-C1", str(patch))
    git(work, "commit", "-qm", "Support SM120 in the torch symmetric-memory all-reduce")
    git(work, "tag", "v0.5.9.4")
    bare = tmp_path_factory.mktemp("git-upstream") / "sglang.git"
    git(work, "clone", "-q", "--bare", str(work), str(bare))
    return {
        "path": bare,
        "base": base,
        "v0.5.9.2": git(work, "rev-parse", "v0.5.9.2").strip(),
        "v0.5.9.3": git(work, "rev-parse", "v0.5.9.3").strip(),
        "v0.5.9.4": git(work, "rev-parse", "v0.5.9.4").strip(),
    }


@pytest.fixture
def git_project(project, git_upstream, cache, monkeypatch) -> Path:
    """The scratch project pinned to v0.5.9 of `git_upstream` (a git base, not an sdist), with
    the series cut to the symm-mem and post-all-reduce capture patches.  The release is named
    0.5.9.0 so the mirror's 0.5.9 sdist import is not taken for it."""
    monkeypatch.setenv("PATCHKIT_OFFLINE_GIT", "0")  # the "remote" is a local path
    toml = project / "patches" / "targets.toml"
    text = toml.read_text()
    head, sep, rest = text.partition("[targets.sglang]")
    sglang, sep2, tail = rest.partition("[targets.flashinfer]")
    sglang = (
        "\n"
        f'git = "{git_upstream["path"]}"\n'
        'subdir = "python"\n'
        'default_line = "0.5.9"\n\n'
        '[targets.sglang.lines."0.5.9"]\n'
        'pin = "0.5.9.0"\n'
        'series = "sglang/0.5.9"\n\n'
        "[[targets.sglang.releases]]\n"
        'version = "0.5.9.0"\n'
        'tag = "v0.5.9"\n'
        f'commit = "{git_upstream["base"]}"\n\n'
    )
    toml.write_text(head + sep + sglang + sep2 + tail)
    set_series(project, "sglang", [SYMM_MEM, AUX_POST])
    return project


def resolve_conflict_with_patch_side(tree: Path) -> list[str]:
    """Resolve every conflicted file of a stopped rebase by taking the replayed patch's side
    and re-applying upstream's a2a edit on top; returns the files resolved."""
    files = [
        f
        for f in subprocess.run(
            ["git", "diff", "--name-only", "--diff-filter=U"],
            cwd=tree,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        if f
    ]
    for name in files:
        git(tree, "checkout", "--theirs", "--", name)
        path = tree / name
        path.write_text(path.read_text().replace(A2A_LINE, A2A_LINE.replace(" > ", " >= ")))
        git(tree, "add", name)
    return files
