"""Shared fixtures: real upstream sdists from the package index (cached), a scratch project,
and a local bare git repository standing in for a remote.

Downloads and mirrors live in `.cache/test-patchkit` under the project (git-ignored), so a
second `make test` reuses them; each test that needs isolation copies what it needs.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# The payload and GPU tiers import torch; `make test-fast` runs without it.
if importlib.util.find_spec("torch") is None:
    collect_ignore = ["payload", "gpu"]

from helpers import ROOT as _ROOT  # noqa: E402
from timing import (  # noqa: E402,F401 - the run's hooks: long items first, figures, time by class
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_terminal_summary,
)

# Test data stays under the project's ignored .cache/, never in the user's ~/.cache/patchkit.
# The default is its own folder: the warm cache (.cache/test-patchkit) is only read through
# the fixtures that copy it, so no test can leave objects there that another test then finds.
os.environ.setdefault("PATCHKIT_CACHE", str(_ROOT / ".cache" / "test-default"))

# The project every test runs in unless it makes its own: a copy whose sglang default line is
# the seed line the tests speak of (helpers.SEED_LINE); removed when the run ends.
from helpers import seed_project  # noqa: E402

# (A copy of tests/ without patches/, as the GPU bundle carries, has no project to copy.)
SEED_PROJECT = _ROOT
if (_ROOT / "patches" / "targets.toml").is_file():
    _SEED = Path(tempfile.mkdtemp(prefix="patchkit-seed-"))
    atexit.register(shutil.rmtree, _SEED, ignore_errors=True)
    SEED_PROJECT = seed_project(_SEED / "project")
    os.environ["PATCHKIT_PROJECT"] = str(SEED_PROJECT)

from helpers import (  # noqa: E402,F401
    ROOT,
    TEST_CACHE,
    git,
    patchkit,
    private_cache,
    sha_of,
    snapshot,
)


@pytest.fixture(scope="session")
def shared_cache() -> Path:
    """The persistent test cache (sdists, mirrors): PATCHKIT_CACHE for tests that only read."""
    TEST_CACHE.mkdir(parents=True, exist_ok=True)
    return TEST_CACHE


@pytest.fixture(scope="session")
def workspace():
    from patchkit.workspace import Workspace

    return Workspace.load(SEED_PROJECT)


@pytest.fixture(scope="session")
def sglang_sdist(shared_cache, workspace) -> Path:
    """The real sglang 0.5.9 sdist from the package index, sha256-checked (cached)."""
    from patchkit.upstream import download_sdist

    return download_sdist(workspace.target("sglang").pinned, shared_cache)


@pytest.fixture(scope="session")
def flashinfer_sdist(shared_cache, workspace) -> Path:
    """The real flashinfer-python 0.6.3 sdist from the package index, sha256-checked (cached)."""
    from patchkit.upstream import download_sdist

    return download_sdist(workspace.target("flashinfer").pinned, shared_cache)


def _release_wheels(workspace, cache: Path, version: str) -> dict[str, Path]:
    from patchkit.upstream import download_wheel

    release = workspace.target("sglang").release(version)
    return {pin.python_tag: download_wheel(pin, cache) for pin in release.wheels}


@pytest.fixture(scope="session")
def sglang_wheels(shared_cache, workspace) -> dict[str, Path]:
    """The real pinned wheels (cp311, cp312) of the sglang 0.5.17 line, the line on a wheel
    base, from the package index, sha256-checked and cached: python tag -> path."""
    pinned = workspace.targets.get("sglang", "0.5.17").pin
    return _release_wheels(workspace, shared_cache, pinned)


@pytest.fixture(scope="session")
def sglang_0512_wheels(shared_cache, workspace) -> dict[str, Path]:
    """The real sglang 0.5.12 wheels: a pinned release no carried line is pinned to (its line
    is retired), the base the 0.5.9 line is rebased onto in the rebase and outlook tests."""
    return _release_wheels(workspace, shared_cache, "0.5.12")


@pytest.fixture(scope="session")
def sglang_0523_wheels(shared_cache, workspace) -> dict[str, Path]:
    """The real pinned sglang 0.5.23 wheels: the release where the fusion gate moved into
    another module under another name and upstream met the aux-capture fix differently."""
    return _release_wheels(workspace, shared_cache, "0.5.23")


@pytest.fixture(scope="session")
def warm_mirrors(shared_cache, sglang_sdist, flashinfer_sdist, workspace) -> Path:
    """Mirrors with both pinned sdists imported; returns the cache root."""
    from patchkit.upstream import acquire

    for name in ("sglang", "flashinfer"):
        acquire(workspace.target(name), None, offline_git=True, cache=shared_cache)
    return shared_cache


@pytest.fixture
def cache(tmp_path, warm_mirrors, monkeypatch) -> Path:
    """A private PATCHKIT_CACHE seeded from the warm one (mirrors cloned, sdists linked)."""
    dest = private_cache(warm_mirrors, tmp_path / "cache")
    monkeypatch.setenv("PATCHKIT_CACHE", str(dest))
    monkeypatch.setenv("PATCHKIT_OFFLINE_GIT", "1")
    return dest


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A scratch copy of this project's patches/ and build/ (safe to edit), as PATCHKIT_PROJECT."""
    dest = seed_project(tmp_path / "project")
    monkeypatch.setenv("PATCHKIT_PROJECT", str(dest))
    return dest


@pytest.fixture(scope="session")
def upstream_remote(tmp_path_factory, sglang_sdist) -> Path:
    """A bare git repository standing in for the SGLang remote: the sdist's tree under
    python/ as a real commit tagged v0.5.9, plus a later commit tagged v0.5.9.1."""
    work = tmp_path_factory.mktemp("upstream-work")
    git(work, "init", "-q", "-b", "main")
    (work / "python").mkdir()
    subprocess.run(
        ["tar", "xzf", str(sglang_sdist), "--strip-components=1", "-C", str(work / "python")],
        check=True,
    )
    git(work, "add", "-A", "-f")
    git(work, "commit", "-qm", "v0.5.9")
    git(work, "tag", "v0.5.9")
    readme = work / "python" / "README.md"
    readme.write_text(readme.read_text() + "\nA later upstream change.\n")
    git(work, "commit", "-qam", "later change")
    git(work, "tag", "v0.5.9.1")
    bare = tmp_path_factory.mktemp("upstream") / "sglang.git"
    git(work, "clone", "-q", "--bare", str(work), str(bare))
    return bare
