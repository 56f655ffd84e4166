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
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import pytest
import tomllib

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


def _series(target: str) -> list[Path]:
    lines = (PATCHES / target / "series").read_text().splitlines()
    names = [line.split("#", 1)[0].strip() for line in lines]
    return [PATCHES / target / name for name in names if name]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fetch_sdist(name: str, version: str, sha256: str, cache: Path) -> bytes:
    """The sdist bytes from the cache, or from the package index (simple JSON API)."""
    filename = f"{name.replace('-', '_')}-{version}.tar.gz"
    cached = cache / filename
    if cached.exists():
        data = cached.read_bytes()
        if _sha256(data) == sha256:
            return data
    request = urllib.request.Request(
        f"https://pypi.org/simple/{name}/", headers={"Accept": SIMPLE_JSON}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        files = json.load(response)["files"]
    matches = [f for f in files if f["filename"].lower() == filename.lower()]
    if not matches:
        raise RuntimeError(f"{filename} is not on the package index")
    with urllib.request.urlopen(matches[0]["url"], timeout=300) as response:
        data = response.read()
    if _sha256(data) != sha256:
        raise RuntimeError(f"{filename}: sha256 {_sha256(data)} != pinned {sha256}")
    cache.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(data)
    return data


def _extract(sdist: bytes, dest: Path) -> None:
    """Unpack the sdist without its top directory into ``dest``."""
    with tarfile.open(fileobj=io.BytesIO(sdist), mode="r:gz") as tar:
        members = []
        for member in tar.getmembers():
            parts = Path(member.name).parts[1:]
            if not parts:
                continue
            member.name = str(Path(*parts))
            members.append(member)
        tar.extractall(dest, members=members, filter="data")


def prepare_tree(target: str, patched: bool) -> Path:
    """Return the root of the pinned ``target`` tree, laid out like the upstream repository.

    The sdist comes from the package index (sha256-checked against ``patches/targets.toml``);
    with ``patched`` every patch of ``patches/<target>/series`` is applied in order with
    ``git apply`` (zero fuzz).  Prepared trees are cached, keyed by the sdist hash and the
    series content, and built in a temporary directory renamed into place when complete.
    """
    pins = tomllib.loads((PATCHES / "targets.toml").read_text())["targets"][target]
    release = next(r for r in pins["releases"] if r["version"] == pins["pin"])
    name, version = release["sdist"].split("==")
    patches = _series(target) if patched else []
    key = hashlib.sha256(release["sdist_sha256"].encode())
    for patch in patches:
        key.update(patch.name.encode() + b"\0" + patch.read_bytes())
    cache = _cache_root()
    kind = "patched" if patched else "base"
    tree = cache / "trees" / f"{target}-{version}-{kind}-{key.hexdigest()[:16]}"
    if (tree / ".complete").exists():
        return tree

    sdist = _fetch_sdist(name, version, release["sdist_sha256"], cache / "sdists")
    tree.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{tree.name}-", dir=tree.parent))
    try:
        _extract(sdist, work / pins.get("subdir", ""))
        # Stop git at the scratch directory: inside an enclosing repository (a cache under a
        # checkout) `git apply` would silently skip every path outside the current directory.
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(work.parent)}
        for patch in patches:
            for check in ([], ["--check", "--reverse"]):  # apply, then prove it is applied
                subprocess.run(
                    ["git", "apply", "--whitespace=nowarn", *check, str(patch)],
                    cwd=work,
                    env=env,
                    check=True,
                    capture_output=True,
                    text=True,
                )
        (work / ".complete").write_text(f"{release['sdist']} {kind}\n")
        try:
            work.rename(tree)
        except OSError:
            if not (tree / ".complete").exists():  # not a concurrent builder that won
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
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
