"""flashinfer cubin-version-local-label.patch: a local build accepts the cubins of its release.

patchkit's FlashInfer wheels carry the series in a PEP 440 local label
(``0.6.3+cu130.pk<hash>``, docs/wheels.md), and the SGLang 0.5.9 line installs PyPI's
``flashinfer_cubin==0.6.3`` beside it. ``flashinfer/jit/env.py`` checks the two versions when
it is imported (``import flashinfer`` imports it); unpatched, it compares them whole and
raises ``RuntimeError: flashinfer-cubin version (0.6.3) does not match flashinfer version
(0.6.3+cu130.pk...)``.

flashinfer-cubin's wheel is 150 MB of cubins; what FlashInfer reads of it is its two Python
files (``__version__`` from ``_build_meta``, ``get_cubin_dir()``), kept verbatim under
``tests/fixtures/flashinfer_cubin-0.6.3`` and checked against that wheel's RECORD here.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.payload, pytest.mark.sglang_lines("0.5.9", "0.5.17")]

CUBIN_063 = Path(__file__).resolve().parents[1] / "fixtures" / "flashinfer_cubin-0.6.3"
# RECORD of flashinfer_cubin-0.6.3-py3-none-any.whl (PyPI, sha256 64ecd1e3084c78bf...)
CUBIN_063_RECORD = {
    "__init__.py": "QIOBlmdmHFb6Bb14OdpfYdNVh-C7Uv3NUlM-7EpDRlI",
    "_build_meta.py": "CU6_PK_akSpKJuBNJlU6_6U4ycRDHbKxHZ7ZKZD4TvI",
}
STANDIN_MODULES = ("flashinfer_cubin", "flashinfer_cubin._build_meta", "flashinfer_jit_cache")


def _record_hash(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@pytest.fixture
def site(tmp_path, monkeypatch, flashinfer_tree):
    """A site directory first on sys.path; what the test imports from it is forgotten after."""
    import flashinfer.jit  # noqa: F401 - imported before the stand-ins exist, as installed

    directory = tmp_path / "site"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.delenv("FLASHINFER_DISABLE_VERSION_CHECK", raising=False)
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    yield directory
    for name in STANDIN_MODULES:
        sys.modules.pop(name, None)


def _install_cubin(site: Path, release: str) -> Path:
    """flashinfer-cubin of ``release``: the 0.6.3 wheel's files, its build's ``_build_meta``
    version moved to ``release`` for another line."""
    package = shutil.copytree(CUBIN_063 / "flashinfer_cubin", site / "flashinfer_cubin")
    meta = package / "_build_meta.py"
    meta.write_text(meta.read_text().replace('"0.6.3"', f'"{release}"'))
    for name in STANDIN_MODULES:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
    return package


def _install_jit_cache(site: Path, version: str) -> Path:
    """flashinfer-jit-cache's version contract (``__version__``, ``get_jit_cache_dir()``);
    its wheels are gigabytes of compiled modules."""
    package = site / "flashinfer_jit_cache"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text(
        "from pathlib import Path\n"
        f"__version__ = {version!r}\n"
        "def get_jit_cache_dir():\n"
        "    return str(Path(__file__).parent / 'jit_cache')\n"
    )
    sys.modules.pop("flashinfer_jit_cache", None)
    importlib.invalidate_caches()
    return package


def _import_env(monkeypatch, version: str):
    """Run the tree's ``flashinfer/jit/env.py`` as ``import flashinfer`` does, in a FlashInfer
    whose ``__version__`` is ``version`` (a fresh module: the imported one stays as it was)."""
    import flashinfer.jit
    import flashinfer.version

    monkeypatch.setattr(flashinfer.version, "__version__", version)
    path = Path(flashinfer.jit.__file__).parent / "env.py"
    spec = importlib.util.spec_from_file_location("flashinfer.jit.env", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_local_build_accepts_the_cubins_of_its_release(
    flashinfer_wheel_version, site, monkeypatch
):
    for name, expected in CUBIN_063_RECORD.items():
        assert _record_hash(CUBIN_063 / "flashinfer_cubin" / name) == expected, name
    release, version = flashinfer_wheel_version
    assert version.startswith(f"{release}+cu130.pk")
    cubin = _install_cubin(site, release)

    # The local build with the release's cubins: they are FlashInfer's cubin directory.
    env = _import_env(monkeypatch, version)
    assert env.FLASHINFER_CUBIN_DIR == cubin / "cubins"

    # Another release whose version starts with the cubins' (0.6.31, 0.6.15.post11) is refused.
    with pytest.raises(RuntimeError, match="flashinfer-cubin version"):
        _import_env(monkeypatch, version.replace("+", "1+", 1))

    # The jit-cache holds modules compiled from FlashInfer's own sources: upstream's build of
    # the release is refused by the local build, the local build's own is used.
    _install_jit_cache(site, f"{release}+cu130")
    with pytest.raises(RuntimeError, match="flashinfer-jit-cache version"):
        _import_env(monkeypatch, version)
    own = _install_jit_cache(site, version)
    assert _import_env(monkeypatch, version).FLASHINFER_AOT_DIR == own / "jit_cache"
