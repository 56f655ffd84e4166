"""Fixtures of the payload tests: the real SGLang / FlashInfer sources with the series applied.

The tests import the patched upstream modules from a prepared tree (nothing is installed):
``sglang_tree`` (importable directory ``<root>/python``) and ``flashinfer_tree`` (importable
directory ``<root>``).  With ``PATCHKIT_PAYLOAD_TREE=base`` the same fixtures give the
unpatched trees, and every payload test must then fail (``tests/test_payload_base_fails.py``).

Trees are cached under ``$PATCHKIT_CACHE/payload`` (default ``~/.cache/patchkit/payload``),
keyed by the sdist hash and the content of the applied patches.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
STANDINS = Path(__file__).resolve().parent / "standins"
TREE_ENV = "PATCHKIT_PAYLOAD_TREE"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def payload_tree_kind() -> str:
    """``patched`` (default) or ``base``, from ``PATCHKIT_PAYLOAD_TREE``."""
    kind = os.environ.get(TREE_ENV, "patched")
    if kind not in ("patched", "base"):
        raise pytest.UsageError(f"{TREE_ENV} must be 'patched' or 'base', not {kind!r}")
    return kind


def _cache_root() -> Path:
    base = os.environ.get("PATCHKIT_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "patchkit"
    return root / "payload"


def prepare_tree(target: str, patched: bool, line: str | None = None) -> Path:
    """Return the root of the pinned ``target`` tree, laid out like the upstream repository.

    Made by patchkit's own `apply` code: the base is acquired as `patchkit apply` does (the
    pinned sdist or wheel from the package index, sha256-checked, imported into the mirror)
    and, with ``patched``, every patch of the line (``patches/<target>/<line>/series``; the
    default line when ``line`` is None) is applied at zero fuzz as one commit.  Trees are
    cached under ``$PATCHKIT_CACHE/payload``, keyed by the pin and the series hash; a tree
    appears only complete (apply publishes by rename).
    """
    from patchkit.apply import apply_series
    from patchkit.errors import NothingToDo
    from patchkit.lines import line_series
    from patchkit.series import Series
    from patchkit.upstream import Mirror, acquire
    from patchkit.workspace import Workspace

    ws = Workspace.load(REPO)
    spec = ws.targets.get(target, line)  # `line` None: the target's default line
    empty = Series(target, ws.project.series_dir(target, line))
    series = line_series(ws.project, spec) if patched else empty
    base = acquire(spec, None, offline_git=True)
    kind = "patched" if patched else "base"
    tree = _cache_root() / "trees" / f"{target}-{spec.pin}-{kind}-{series.hash()[:16]}"
    try:
        apply_series(
            Mirror(spec).path, base, series, tree, series_version=ws.targets.series_version
        )
    except NothingToDo:
        pass
    return tree


def _put_first_on_path(directory: Path) -> None:
    path = str(directory)
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)


@pytest.fixture(scope="session")
def payload_kind() -> str:
    """Which tree the payload fixtures give: ``patched`` or ``base``."""
    return payload_tree_kind()


@pytest.fixture(scope="session")
def standins() -> Path:
    """Put the documented stand-ins (``standins/``: ``sgl_kernel``) first on ``sys.path``.

    Only what cannot run without a CUDA driver is stood in for: importing the real
    ``sgl_kernel`` loads its CUDA extension, so the stand-in goes first even where the wheel
    is installed.  Nothing under test is stood in for.
    """
    _put_first_on_path(STANDINS)
    return STANDINS


@pytest.fixture(scope="session")
def sglang_tree(payload_kind: str, standins: Path) -> Path:
    """Root of the SGLang 0.5.9 tree (patched unless PATCHKIT_PAYLOAD_TREE=base)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("payload tests need torch==2.9.1 (build/constraints/payload-test.txt)")
    root = prepare_tree("sglang", payload_kind == "patched")
    _put_first_on_path(root / "python")
    return root


@pytest.fixture(scope="session")
def flashinfer_tree(payload_kind: str) -> Path:
    """Root of the FlashInfer 0.6.3 tree (patched unless PATCHKIT_PAYLOAD_TREE=base)."""
    root = prepare_tree("flashinfer", payload_kind == "patched")
    _put_first_on_path(root)
    return root


@pytest.fixture(scope="session")
def server_args(sglang_tree: Path):
    """A real default ``ServerArgs`` installed as SGLang's global server args.

    ``__post_init__`` is skipped: it probes GPUs and model files; the tests set the few
    fields they need.
    """
    from sglang.srt import server_args as server_args_module

    args = object.__new__(server_args_module.ServerArgs)
    for field in dataclasses.fields(server_args_module.ServerArgs):
        if field.default is not dataclasses.MISSING:
            setattr(args, field.name, field.default)
        elif field.default_factory is not dataclasses.MISSING:
            setattr(args, field.name, field.default_factory())
    args.model_path = "patchkit/payload-test-model"
    server_args_module.set_global_server_args_for_scheduler(args)
    return args
