"""Fixtures for the verify tests: compiled artefacts (cached) and small site-packages trees."""

from __future__ import annotations

import glob
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.abi import builders


@pytest.fixture(scope="session")
def torch_dir() -> str:
    path = builders.torch_dir()
    if path is None:
        pytest.skip("needs an installed torch (the repository's .venv)")
    return path


@pytest.fixture(scope="session")
def cuda_objects() -> dict[str, str]:
    """Every CUDA_VARIANTS object, built in parallel on first use and cached afterwards."""
    if builders.nvcc() is None:
        pytest.skip("needs nvcc (CUDA 13)")
    with ThreadPoolExecutor(max_workers=2) as pool:
        paths = dict(
            zip(
                builders.CUDA_VARIANTS,
                pool.map(builders.cuda_object, builders.CUDA_VARIANTS),
                strict=True,
            )
        )
    return paths


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    """The per-file verify cache shared by the session (torch's libraries are read once)."""
    path = os.environ.get("PATCHKIT_TEST_CACHE") or os.path.join(builders.ARTIFACTS, "cache")
    os.makedirs(path, exist_ok=True)
    return path


def make_site(root: str, torch_dir: str | None, extras: dict[str, str] | None = None) -> str:
    """A site-packages folder: torch's libraries linked in (not copied) plus ``extras``."""
    site = os.path.join(root, "site-packages")
    os.makedirs(site, exist_ok=True)
    if torch_dir:
        real_site = os.path.dirname(torch_dir)
        os.makedirs(os.path.join(site, "torch", "lib"), exist_ok=True)
        shutil.copy(
            os.path.join(torch_dir, "version.py"), os.path.join(site, "torch", "version.py")
        )
        for lib in glob.glob(os.path.join(torch_dir, "lib", "*.so*")):
            os.symlink(lib, os.path.join(site, "torch", "lib", os.path.basename(lib)))
        for lib in glob.glob(os.path.join(torch_dir, "_C*.so")):
            os.symlink(lib, os.path.join(site, "torch", os.path.basename(lib)))
        for lib in glob.glob(os.path.join(real_site, "nvidia", "*", "lib", "*.so*")):
            rel = os.path.relpath(lib, real_site)
            os.makedirs(os.path.join(site, os.path.dirname(rel)), exist_ok=True)
            os.symlink(lib, os.path.join(site, rel))
    for rel, src in (extras or {}).items():
        dst = os.path.join(site, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if isinstance(src, bytes):
            with open(dst, "wb") as fh:
                fh.write(src)
        else:
            shutil.copy(src, dst)
    return site
