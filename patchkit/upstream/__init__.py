"""Obtaining upstream trees: bare mirrors, git fetch of pinned commits, and imports of pinned
sdists or wheels from the package index.

- `acquire`: the one source chain (`--upstream` -> git exact commit -> index) for every verb;
- `mirror`: the per-target bare repositories in the cache;
- `index`: the package index client (hash-checked downloads);
- `sdist`, `wheel`: importing a release's sdist or pinned wheel as a deterministic commit.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from patchkit.upstream.acquire import (
    GIT_REF,
    Attempt,
    Base,
    BaseUnavailable,
    acquire,
    error_document,
    remove_tree,
    resolve_new_base,
)
from patchkit.upstream.mirror import SDIST_REF, WHEEL_REF, Mirror, import_fields, wheel_fields

# The names of the modules that download and import a new base, loaded on first use (a run
# on a base the mirror holds needs none of them).
_LAZY = {
    "file_sha256": "index",
    "index_url": "index",
    "NewPin": "newbase",
    "COMMIT_ID_RES": "sdist",
    "IMPORT_IDENTITY_EMAIL": "sdist",
    "IMPORT_IDENTITY_NAME": "sdist",
    "MAX_SDIST_BYTES": "sdist",
    "check_sdist_hash": "sdist",
    "download_sdist": "sdist",
    "import_sdist": "sdist",
    "release_commit_id": "sdist",
    "safe_extract_sdist": "sdist",
    "sdist_identity": "sdist",
    "sdist_path": "sdist",
    "download_wheel": "wheel",
    "import_wheel": "wheel",
    "wheel_path": "wheel",
}

if TYPE_CHECKING:
    from patchkit.upstream.index import file_sha256, index_url
    from patchkit.upstream.newbase import NewPin
    from patchkit.upstream.sdist import (
        COMMIT_ID_RES,
        IMPORT_IDENTITY_EMAIL,
        IMPORT_IDENTITY_NAME,
        MAX_SDIST_BYTES,
        check_sdist_hash,
        download_sdist,
        import_sdist,
        release_commit_id,
        safe_extract_sdist,
        sdist_identity,
        sdist_path,
    )
    from patchkit.upstream.wheel import download_wheel, import_wheel, wheel_path


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "COMMIT_ID_RES",
    "GIT_REF",
    "IMPORT_IDENTITY_EMAIL",
    "IMPORT_IDENTITY_NAME",
    "MAX_SDIST_BYTES",
    "SDIST_REF",
    "WHEEL_REF",
    "Attempt",
    "Base",
    "BaseUnavailable",
    "Mirror",
    "acquire",
    "error_document",
    "resolve_new_base",
    "NewPin",
    "check_sdist_hash",
    "download_sdist",
    "download_wheel",
    "file_sha256",
    "import_fields",
    "import_sdist",
    "import_wheel",
    "index_url",
    "release_commit_id",
    "remove_tree",
    "safe_extract_sdist",
    "sdist_identity",
    "sdist_path",
    "wheel_fields",
    "wheel_path",
]
