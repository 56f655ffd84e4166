"""Fixtures that build the real patched sglang wheel once per session and install it.

The wheel is built by the real CLI from the pinned sdist and the series, in a scratch project
and a private cache; a fresh virtual environment gets it with `pip install --no-deps`.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import patchkit, private_cache, result_of, seed_project


@dataclass
class BuiltWheel:
    path: Path
    report: dict
    project: Path
    env: dict[str, str]


def scratch_project(dest: Path) -> Path:
    """A copy of this project's patches/ and build/ (profiles), usable as PATCHKIT_PROJECT
    (sglang's default line the seed line, as the tests expect)."""
    return seed_project(dest)


def build_in_scratch(
    root: Path, warm: Path, target: str, *extra: str
) -> tuple[subprocess.CompletedProcess, dict]:
    """Run `patchkit build --target TARGET` in a fresh project + cache under `root`."""
    project = scratch_project(root / "project")
    env = {
        "PATCHKIT_PROJECT": str(project),
        "PATCHKIT_CACHE": str(private_cache(warm, root / "cache")),
        "PATCHKIT_OFFLINE_GIT": "1",
    }
    result = patchkit(
        "build", "--target", target, "--out", str(root / "dist"), *extra, cwd=project, env=env
    )
    assert result.returncode == 0, result.stderr
    return result, env


@pytest.fixture(scope="session")
def sglang_wheel(tmp_path_factory, warm_mirrors) -> BuiltWheel:
    """The patched sglang wheel, built once per session (`patchkit build --json`)."""
    root = tmp_path_factory.mktemp("build-a")
    result, env = build_in_scratch(root, warm_mirrors, "sglang", "--json")
    report = result_of(result.stdout)
    [wheel] = report["wheels"]
    return BuiltWheel(Path(wheel["wheel"]), report, root / "project", env)


@pytest.fixture
def build_flashinfer(warm_mirrors, tmp_path) -> BuiltWheel:
    """The patched flashinfer-python wheel (`patchkit build --target flashinfer --json`)."""
    result, env = build_in_scratch(tmp_path, warm_mirrors, "flashinfer", "--json")
    report = result_of(result.stdout)
    [wheel] = report["wheels"]
    return BuiltWheel(Path(wheel["wheel"]), report, tmp_path / "project", env)


@pytest.fixture
def rebuild_sglang(warm_mirrors):
    """Build the sglang wheel again from scratch under a given directory (text output)."""

    def rebuild(root: Path) -> subprocess.CompletedProcess:
        return build_in_scratch(root, warm_mirrors, "sglang")[0]

    return rebuild


@pytest.fixture(scope="session")
def sglang_site(tmp_path_factory, sglang_wheel) -> Path:
    """site-packages of a fresh virtual environment with the wheel pip-installed (--no-deps)."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-compile",
            "--no-index",
            str(sglang_wheel.path),
        ],
        check=True,
    )
    [site] = (venv / "lib").glob("python3*/site-packages")
    return site
