"""Fixtures of the speculation tests: the line's SGLang tree and a default ``ServerArgs``.

Two lines: 0.5.9 (torch 2.9 venv; its tree is the payload conftest's ``sglang_tree``, made by
patchkit's own apply) and 0.5.12 (torch 2.11 venv; a wheel base, since 0.5.11+ ship no sdist,
unpacked to the repository layout with ``patches/sglang/0.5.12/series`` applied at zero fuzz).
``PATCHKIT_SPEC_TREE`` names a ready tree instead (the mutation check's planted copies).
What stands in for the GPU parts is in ``standins/spec_runtime.py``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

SPEC_TREE_ENV = "PATCHKIT_SPEC_TREE"
PATCHES = Path(__file__).resolve().parents[2] / "patches"
STANDINS = Path(__file__).resolve().parent / "standins"


def _put_first_on_path(directory: Path) -> None:
    path = str(directory)
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)


LINE_TORCH = {"0.5.12": "2.11.", "0.5.9": "2.9."}


def running_line() -> str:
    """The SGLang line the running torch belongs to (each line has its own venv)."""
    try:
        import torch
    except ImportError:
        return "0.5.9"
    for line, prefix in LINE_TORCH.items():
        if torch.__version__.startswith(prefix):
            return line
    return "0.5.9"


def line_tree() -> Path:
    """The tree ``PATCHKIT_SPEC_TREE`` names (the mutation check's planted copies)."""
    return Path(os.environ[SPEC_TREE_ENV])


def use_line_tree(line: str) -> Path | None:
    """Put the line's tree first on ``sys.path`` (with the stand-ins); skip unless the
    running torch is the line's. The 0.5.9 tree comes from the payload conftest's
    ``sglang_tree`` (patchkit's apply of the series) unless ``PATCHKIT_SPEC_TREE`` names one."""
    torch = pytest.importorskip("torch")
    if not torch.__version__.startswith(LINE_TORCH[line]):
        pytest.skip(f"the {line} line runs under torch {LINE_TORCH[line]}x")
    _put_first_on_path(STANDINS)
    if not os.environ.get(SPEC_TREE_ENV):
        return None  # the payload conftest's tree (patchkit's own apply of the line) is in use
    loaded = sys.modules.get("sglang")
    root = line_tree()
    if loaded is not None and not str(loaded.__file__).startswith(str(root)):
        pytest.skip(f"another sglang tree is already imported: {loaded.__file__}")
    _put_first_on_path(root / "python")
    return root


def spec_tree(request, line: str) -> Path | None:
    """The line's tree for a test (see ``use_line_tree``): the payload conftest's
    ``sglang_tree`` of the line under test, unless ``PATCHKIT_SPEC_TREE`` names a tree."""
    if not os.environ.get(SPEC_TREE_ENV):
        under_test = os.environ.get("PATCHKIT_PAYLOAD_LINE") or "0.5.9"  # conftest's LINE_ENV
        if under_test != line:
            pytest.skip(f"the payload tier runs line {under_test}, not {line}")
        request.getfixturevalue("sglang_tree")
    return use_line_tree(line)


def default_server_args(server_args_module):
    """A real default ``ServerArgs`` (``__post_init__`` skipped: it probes GPUs and model
    files), installed as SGLang's global server args."""
    args = object.__new__(server_args_module.ServerArgs)
    for field in dataclasses.fields(server_args_module.ServerArgs):
        if field.default is not dataclasses.MISSING:
            setattr(args, field.name, field.default)
        elif field.default_factory is not dataclasses.MISSING:
            setattr(args, field.name, field.default_factory())
    args.model_path = "patchkit/payload-test-model"
    server_args_module.set_global_server_args_for_scheduler(args)
    return args
