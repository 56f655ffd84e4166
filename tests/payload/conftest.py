"""Fixtures of the payload tests: the real SGLang / FlashInfer sources with the series applied.

The tests import the patched upstream modules from a prepared tree (nothing is installed):
``sglang_tree`` (importable directory ``<root>/python``) and ``flashinfer_tree`` (importable
directory ``<root>``: the FlashInfer line the SGLang line goes ``with`` in targets.toml).
With ``PATCHKIT_PAYLOAD_TREE=base`` the same fixtures give the unpatched trees, and every
payload test must then fail (``tests/test_payload_base_fails.py``).

``PATCHKIT_PAYLOAD_LINE`` picks the SGLang series line (default: the target's default line);
each line needs its own interpreter (``build/constraints/payload-test*.txt``: 0.5.9 runs on
torch 2.9.1, 0.5.17 on torch 2.11.0).  A test marked ``sglang_lines("0.5.9", ...)`` belongs to
those lines only and is not collected on the others (its patch is not carried there).
``PATCHKIT_PAYLOAD_SGLANG_ROOT`` imports SGLang from an existing tree instead (a checkout
laid out like the upstream repository, e.g. ``work/sglang`` after ``patchkit apply``).

Trees are cached under ``$PATCHKIT_CACHE/payload`` (default: ``.cache/test-default/payload``
under the project),
keyed by the sdist hash and the content of the applied patches.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
STANDINS = Path(__file__).resolve().parent / "standins"
TREE_ENV = "PATCHKIT_PAYLOAD_TREE"
LINE_ENV = "PATCHKIT_PAYLOAD_LINE"
ROOT_ENV = "PATCHKIT_PAYLOAD_SGLANG_ROOT"
CONSTRAINTS = REPO / "build" / "constraints"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def payload_tree_kind() -> str:
    """``patched`` (default) or ``base``, from ``PATCHKIT_PAYLOAD_TREE``."""
    kind = os.environ.get(TREE_ENV, "patched")
    if kind not in ("patched", "base"):
        raise pytest.UsageError(f"{TREE_ENV} must be 'patched' or 'base', not {kind!r}")
    return kind


def payload_line() -> str | None:
    """The SGLang line under test (``PATCHKIT_PAYLOAD_LINE``); None: the default line."""
    return os.environ.get(LINE_ENV) or None


def line_constraints(line: str | None) -> Path:
    """The payload venv's requirements of a line: ``payload-test-<line>.txt``, else the
    default line's ``payload-test.txt``."""
    own = CONSTRAINTS / f"payload-test-{line}.txt"
    return own if line is not None and own.is_file() else CONSTRAINTS / "payload-test.txt"


def _pinned_torch(line: str | None) -> str | None:
    for raw in line_constraints(line).read_text().splitlines():
        name, sep, version = raw.split("#", 1)[0].strip().partition("==")
        if sep and name.strip().lower() == "torch":
            return version.strip()
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sglang_lines(*lines): payload test of a patch carried only on these lines"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests of patches the line under test does not carry."""
    line = payload_line() or _default_line()
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("sglang_lines")
        (drop if marker is not None and line not in marker.args else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _default_line() -> str:
    from patchkit.workspace import Workspace

    return Workspace.load(REPO).target("sglang").current_line.name


def _cache_root() -> Path:
    base = os.environ.get("PATCHKIT_CACHE")
    root = Path(base) if base else Path(__file__).resolve().parents[2] / ".cache" / "test-default"
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
            Mirror(spec).repo, base, series, tree, series_version=ws.targets.series_version
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
    """Root of the SGLang tree of the line under test (patched unless
    PATCHKIT_PAYLOAD_TREE=base)."""
    line = payload_line()
    wanted = _pinned_torch(line)
    hint = f"build/constraints/{line_constraints(line).name}"
    try:
        import torch
    except ImportError:
        pytest.skip(f"payload tests need torch=={wanted} ({hint})")
    if wanted and torch.__version__.split("+")[0] != wanted:
        pytest.exit(
            f"SGLang line {line or _default_line()} needs torch=={wanted} ({hint}); this "
            f"interpreter has {torch.__version__}",
            returncode=4,
        )
    override = os.environ.get(ROOT_ENV)
    root = Path(override) if override else prepare_tree("sglang", payload_kind == "patched", line)
    _put_first_on_path(root / "python")
    return root


def flashinfer_line() -> str | None:
    """The FlashInfer line the SGLang line under test goes `with` (targets.toml); None: the
    SGLang line uses FlashInfer as released."""
    from patchkit.workspace import Workspace

    sglang = Workspace.load(REPO).target("sglang")
    return sglang.companion(payload_line() or sglang.current_line.name, "flashinfer")


@pytest.fixture(scope="session")
def flashinfer_tree(payload_kind: str) -> Path:
    """Root of the FlashInfer tree of the SGLang line under test: 0.6.3 for 0.5.9,
    0.6.15.post1 for 0.5.17 (patched unless PATCHKIT_PAYLOAD_TREE=base)."""
    line = flashinfer_line()
    if line is None:
        pytest.skip("the SGLang line under test carries no FlashInfer line")
    root = prepare_tree("flashinfer", payload_kind == "patched", line)
    _put_first_on_path(root)
    return root


@pytest.fixture(scope="session")
def flashinfer_wheel_version(flashinfer_tree: Path, tmp_path_factory) -> tuple[str, str]:
    """(release, the ``__version__`` patchkit's build writes into the tree's wheel): the
    build's own version step (docs/wheels.md, step 3) run on a copy of the version files."""
    from patchkit.lines import line_series
    from patchkit.wheels.build import pin_version, wheel_version
    from patchkit.workspace import Workspace

    ws = Workspace.load(REPO)
    spec = ws.targets.get("flashinfer", flashinfer_line())
    version = wheel_version(spec.pin, "cu130", line_series(ws.project, spec).hash())
    copy = tmp_path_factory.mktemp("flashinfer-version")
    (copy / "flashinfer").mkdir()
    for name in ("pyproject.toml", "flashinfer/_build_meta.py"):
        shutil.copyfile(flashinfer_tree / name, copy / name)
    pin_version(copy, version, None)
    written: dict[str, str] = {}
    exec((copy / "flashinfer" / "_build_meta.py").read_text(), written)  # noqa: S102
    return spec.pin, written["__version__"]


@pytest.fixture
def server_args(sglang_tree: Path, tmp_path: Path):
    """A real default ``ServerArgs`` installed as SGLang's global server args, for this test
    (made again for each: another test may have installed its own as the global, and a
    shared one would carry a test's settings into the next).

    ``__post_init__`` is skipped: it probes GPUs and model files; the tests set the few
    fields they need.
    """
    from sglang.srt import server_args as server_args_module
    from spec_fixtures import default_server_args, write_model_dir

    return default_server_args(server_args_module, write_model_dir(tmp_path))
