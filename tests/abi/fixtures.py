"""Fixtures for the verify tests: compiled artefacts (cached) and small site-packages trees."""

from __future__ import annotations

import os
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
