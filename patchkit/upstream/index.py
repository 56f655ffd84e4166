"""The package index: finding a release's files and downloading them hash-checked.

Every request goes through the run's one `net.Session` (credentials per origin, schemes,
deadlines, caps). Downloads go through the index's simple API (PEP 691 JSON, or PEP 503 HTML
as static mirrors serve it) at $PATCHKIT_INDEX_URL (else the index pip is configured with,
`pipconf`; else PyPI), written beside their destination and renamed into place only once
their sha256 matches, so a mismatch leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from patchkit import net, ui
from patchkit.errors import FetchError, PinError
from patchkit.locks import locked_temp_file
from patchkit.upstream import pipconf

MAX_DOWNLOAD_BYTES = 512 * 1024 * 1024
MAX_PAGE_BYTES = 64 << 20
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"

_SESSIONS: dict[str, net.Session] = {}


def _configured() -> str:
    url = os.environ.get("PATCHKIT_INDEX_URL") or pipconf.configured_index_url()
    return url or "https://pypi.org/simple"


def index_url() -> str:
    """The package index: $PATCHKIT_INDEX_URL, else the one pip is configured with
    ($PIP_INDEX_URL or pip.conf), else PyPI; without credentials (the session keeps them)."""
    return net.split_credentials(_configured())[0].rstrip("/")


def session() -> net.Session:
    """The run's one network session, made on its first request to the configured index
    (every page and download of the run goes through it)."""
    url = _configured()
    key = f"{url}\0{os.environ.get('NETRC', '')}"  # a library caller may change either
    if key not in _SESSIONS:
        _SESSIONS[key] = net.Session(url)
    return _SESSIONS[key]


def normalize_name(name: str) -> str:
    """A distribution name as wheel and sdist file names spell it (`flashinfer_python`)."""
    return re.sub(r"[-_.]+", "_", name.strip()).lower()


def project_name(name: str) -> str:
    """A distribution name as the simple API spells it (`flashinfer-python`)."""
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# url -> the files of its page, while `listings_kept` holds (None: not keeping): a cold
# outlook otherwise read the page again for every release it imports and downloads
_LISTED: dict[str, list[dict]] | None = None


@contextmanager
def listings_kept() -> Iterator[None]:
    """Within the block, each project's page is read from the index once."""
    global _LISTED
    outer = _LISTED
    _LISTED = {} if outer is None else outer
    try:
        yield
    finally:
        _LISTED = outer


def project_files(name: str) -> list[dict]:
    """The `files` of a project's simple-API page: PEP 691 JSON, or the PEP 503 HTML page
    that static mirrors (an air-gapped index on a file server) serve."""
    if _LISTED is None:
        return _read_project_files(name)
    key = f"{index_url()}/{project_name(name)}/"
    if key not in _LISTED:
        _LISTED[key] = _read_project_files(name)
    return [dict(entry) for entry in _LISTED[key]]


def _read_project_files(name: str) -> list[dict]:
    door = session()
    url = f"{door.index}/{project_name(name)}/"
    if door.local:
        url += "index.html"  # a mirror on disk: no server to pick the page
    page = door.read(url, limit=MAX_PAGE_BYTES, accept=f"{SIMPLE_JSON}, text/html;q=0.1")
    body, kind, url = b"".join(page.chunks()), page.content_type, page.url
    if "json" in kind or body.lstrip()[:1] == b"{":
        try:
            listing = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise FetchError(f"{url}: the index's JSON page is not valid JSON") from None
        files = listing.get("files", []) if isinstance(listing, dict) else []
        for entry in files:  # relative to the page as served (after any redirect), as pip does
            if isinstance(entry, dict) and isinstance(entry.get("url"), str):
                entry["url"] = urllib.parse.urljoin(url, entry["url"])
    else:
        files = _html_files(body.decode("utf-8", "replace"), url)
    return [f for f in files if isinstance(f, dict) and isinstance(f.get("filename"), str)]


def _html_files(text: str, page: str) -> list[dict]:
    """PEP 503 anchors -> the JSON API's file entries (filename, url, hashes)."""
    import html.parser  # only for an index without the JSON API: 6 ms of every other run

    class _Anchors(html.parser.HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.links: list[tuple[str, str]] = []
            self._href: str | None = None
            self._text: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag == "a":
                self._href = dict(attrs).get("href")
                self._text = []

        def handle_data(self, data):
            if self._href is not None:
                self._text.append(data)

        def handle_endtag(self, tag):
            if tag == "a" and self._href is not None:
                self.links.append((self._href, "".join(self._text).strip()))
                self._href = None

    parser = _Anchors()
    parser.feed(text)
    files = []
    for href, label in parser.links:
        link, _, fragment = href.partition("#")
        algo, _, digest = fragment.partition("=")
        filename = label or urllib.parse.unquote(link.rsplit("/", 1)[-1])
        files.append(
            {
                "filename": filename,
                "url": urllib.parse.urljoin(page, link),
                "hashes": {algo: digest} if algo == "sha256" and digest else {},
            }
        )
    return files


def find_file(name: str, filenames: set[str], what: str) -> tuple[str, str | None]:
    """(url, index sha256) of the first of `filenames` the index lists for `name`."""
    for entry in project_files(name):
        if entry["filename"] in filenames and isinstance(entry.get("url"), str):
            url = entry["url"]  # absolute (_read_project_files); its scheme checked on open
            sha256 = (entry.get("hashes") or {}).get("sha256")
            return url, sha256 if isinstance(sha256, str) else None
    raise FetchError(f"{what}: not on {index_url()}")


def download(
    url: str,
    dest: Path,
    *,
    expected_sha256: str | None,
    label: str,
) -> Path:
    """Download `url` to `dest` (write-then-rename); refuse a sha256 other than expected."""
    ui.progress(f"downloading {url.rsplit('/', 1)[-1]}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    # flocked until renamed: a mirror's sweep removes only the partial downloads of dead runs
    fd, tmp = locked_temp_file(dest.parent, prefix=f".{dest.name}.download-")
    try:
        digest = hashlib.sha256()
        door = session()
        with (
            os.fdopen(os.dup(fd), "wb") as out,
            door.open(url, limit=MAX_DOWNLOAD_BYTES) as transfer,
        ):
            for chunk in transfer.chunks():
                digest.update(chunk)
                out.write(chunk)
        check_sha256(label, digest.hexdigest(), expected_sha256)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        os.close(fd)
    return dest


def check_sha256(label: str, got: str, expected: str | None) -> None:
    """Refuse a download whose sha256 differs from the pin (nothing is kept)."""
    if expected and got != expected:
        raise PinError(
            f"{label}: sha256 {got} does not match the pin {expected}; refusing "
            "(nothing was written)",
            hint="if upstream re-published on purpose, re-pin with `patchkit rebase --write`",
        )
