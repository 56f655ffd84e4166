"""Obtaining upstream trees: bare mirrors, git fetch of pinned commits, and imports of pinned
sdists or wheels from the package index.

- `acquire`: the one source chain (`--upstream` -> git exact commit -> index) for every verb;
- `mirror`: the per-target bare repositories in the cache;
- `index`: the package index client (hash-checked downloads);
- `sdist`, `wheel`: importing a release's sdist or pinned wheel as a deterministic commit.
"""

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
from patchkit.upstream.index import file_sha256, index_url
from patchkit.upstream.mirror import Mirror
from patchkit.upstream.newbase import NewPin
from patchkit.upstream.sdist import (
    COMMIT_ID_RES,
    IMPORT_IDENTITY_EMAIL,
    IMPORT_IDENTITY_NAME,
    MAX_SDIST_BYTES,
    SDIST_REF,
    check_sdist_hash,
    download_sdist,
    import_fields,
    import_sdist,
    release_commit_id,
    safe_extract_sdist,
    sdist_identity,
    sdist_path,
)
from patchkit.upstream.wheel import (
    WHEEL_REF,
    download_wheel,
    import_wheel,
    wheel_fields,
    wheel_path,
)

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
