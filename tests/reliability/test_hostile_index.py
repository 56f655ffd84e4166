"""A hostile or broken package index, as data: each `Case` sets what two real HTTP servers on
127.0.0.1 answer (A, the configured index; B, another origin) and what the real CLI must say;
every case is also held to the same invariants: no credential reaches another origin, nothing
hostile lands in the cache or the mirror, one or two lines and never an internal error, at
most 600 MB of memory (the run's peak RSS, from wait4) and its deadline.

A new class of case is one more `Case(...)` in CASES.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hostile_index import (
    Answer,
    Listener,
    Seen,
    Server,
    bad_crc_wheel,
    bomb_stream,
    huge_member_sdist,
    lying_wheel,
    make_project,
    page,
    sdist_bytes,
    sha256,
    wheel_bytes,
)
from reliability_support import ROOT, record

SECTION = "hostile index (tests/reliability/test_hostile_index.py)"
WHEEL = "toy-3.0-py3-none-any.whl"
SDIST = "toy-3.0.tar.gz"
SECRET = "s3cret"
MAX_RSS_MB = 600
CRAFTED = Path(os.environ.get("PATCHKIT_TEST_CACHE", ROOT / ".cache" / "test-patchkit")) / (
    "hostile-index"
)


@dataclass
class Index:
    """The servers and files a case sets up."""

    a: Server
    b: Server
    root: Path
    ftp: Listener
    env: dict[str, str] = field(default_factory=dict)

    def serve_wheel(self, data: bytes, *, on=None, name: str = WHEEL, sha: str | None = "") -> None:
        """A's page lists `name` at `on` (A by default) with its sha256 (None: no hash)."""
        where = on or self.a
        where.routes[f"/f/{name}"] = Answer(data)
        digest = sha256(data) if sha == "" else sha
        self.a.routes["/simple/toy"] = page([(name, f"{where.url}/f/{name}", digest)])


@dataclass(frozen=True)
class Case:
    id: str
    serve: Callable[[Index], None]
    says: str = ""  # words the output holds ("" for a run that succeeds)
    unusable: bool = True  # the release is reported unusable and nothing of it kept
    credentials: str = ""  # "url" or "netrc": the index's credentials and where they come from
    env: dict[str, str] = field(default_factory=dict)
    seconds: float = 60


def _redirect(ix: Index, path: str, to: str) -> None:
    ix.a.routes[path] = Answer(status=302, location=to)


def _page_redirected(ix: Index) -> None:
    data = wheel_bytes("3.0")
    ix.b.routes[f"/f/{WHEEL}"] = Answer(data)
    ix.b.routes["/simple/toy"] = page([(WHEEL, f"{ix.b.url}/f/{WHEEL}", sha256(data))])
    _redirect(ix, "/simple/toy", f"{ix.b.url}/simple/toy/")


def _file_redirected(ix: Index) -> None:
    data = wheel_bytes("3.0")
    ix.b.routes[f"/f/{WHEEL}"] = Answer(data)
    ix.a.routes["/simple/toy"] = page([(WHEEL, f"{ix.a.url}/f/{WHEEL}", sha256(data))])
    _redirect(ix, f"/f/{WHEEL}", f"{ix.b.url}/f/{WHEEL}")


def _redirected_to(scheme_url: Callable[[Index, bytes], str], route: str):
    """The page or the file (`route`) answered with a 302 to what `scheme_url` gives."""

    def serve(ix: Index) -> None:
        _wheel()(ix)
        data = wheel_bytes("3.0")
        _redirect(ix, "/simple/toy" if route == "page" else f"/f/{WHEEL}", scheme_url(ix, data))

    return serve


def _link(scheme_url: Callable[[Index, bytes], str]) -> Callable[[Index], None]:
    def serve(ix: Index) -> None:
        data = wheel_bytes("3.0")
        ix.a.routes["/simple/toy"] = page([(WHEEL, scheme_url(ix, data), sha256(data))])

    return serve


def _local_file(ix: Index, data: bytes) -> str:
    secret = ix.root / "secret" / WHEEL
    secret.parent.mkdir(exist_ok=True)
    secret.write_bytes(data)
    return secret.as_uri()


def _ftp_url(ix: Index, data: bytes) -> str:
    return f"ftp://127.0.0.1:{ix.ftp.port}/{WHEEL}"


def _data_url(ix: Index, data: bytes) -> str:
    return "data:application/octet-stream;base64," + base64.b64encode(data).decode()


def _sdist_without_hash(ix: Index) -> None:
    data = sdist_bytes("3.0")
    ix.a.routes[f"/f/{SDIST}"] = Answer(data)
    ix.a.routes["/simple/toy"] = page([(SDIST, f"{ix.a.url}/f/{SDIST}", None)])


def _bomb(member: str, method: int) -> Callable[[Index], None]:
    def serve(ix: Index) -> None:
        name = f"{'bz2' if method == zipfile.ZIP_BZIP2 else 'lzma'}-{member.replace('/', '_')}"
        path = CRAFTED / f"{name}.whl"
        if not path.exists():  # 768 MiB of 'A' behind a 200-byte claim: 15 s to make, once
            CRAFTED.mkdir(parents=True, exist_ok=True)
            path.write_bytes(lying_wheel("3.0", member, method, bomb_stream(method, 768 << 20)))
        ix.serve_wheel(path.read_bytes())

    return serve


def _huge_sdist(ix: Index) -> None:
    data = huge_member_sdist("3.0", 1536 << 20, CRAFTED)
    ix.a.routes[f"/f/{SDIST}"] = Answer(data)
    ix.a.routes["/simple/toy"] = page([(SDIST, f"{ix.a.url}/f/{SDIST}", sha256(data))])


def _wheel(**kw) -> Callable[[Index], None]:
    return lambda ix: ix.serve_wheel(wheel_bytes("3.0", **kw))


def _bytes(make: Callable[[], bytes]) -> Callable[[Index], None]:
    return lambda ix: ix.serve_wheel(make())


def _keyring_only(ix: Index) -> None:
    """An index that answers only its keyring credential, a keyring package that holds it
    (none is configured anywhere else), and the file redirected to B."""
    found = ix.root / "keyring-site"
    found.mkdir()
    (found / "keyring.py").write_text(
        "import types\n"
        "def get_credential(url, user):\n"
        f"    return types.SimpleNamespace(username='deploy', password='{SECRET}')\n"
    )
    ix.env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{found}"
    _file_redirected(ix)
    needs = "Basic " + base64.b64encode(f"deploy:{SECRET}".encode()).decode()
    ix.a.routes["/simple/toy"].needs = needs
    ix.a.routes[f"/f/{WHEEL}"].needs = needs


def _trickled_page(ix: Index, every: float = 0.5) -> None:
    _wheel()(ix)
    ix.a.routes["/simple/toy"].trickle = every


def _trickled_file(ix: Index) -> None:
    _wheel()(ix)
    ix.a.routes[f"/f/{WHEEL}"].trickle = 0.5


def _unsteady(route: str, **first) -> Callable[[Index], None]:
    """The release served, its `route` ("page" or "file") after `first` transient failures."""

    def serve(ix: Index) -> None:
        _wheel()(ix)
        answer = ix.a.routes["/simple/toy" if route == "page" else f"/f/{WHEEL}"]
        for name, count in first.items():
            setattr(answer, name, count)

    return serve


def _busy_then_redirected(ix: Index) -> None:
    """The page answers 503 twice, then redirects to B: the retries carry the credentials to
    A alone, as the redirect does not."""
    _page_redirected(ix)
    ix.a.routes["/simple/toy"].busy = 2


def _big_page(ix: Index) -> None:
    ix.a.routes["/simple/toy"] = Answer(b'{"files": [' + b" " * (65 << 20) + b"]}")


def _short_page(ix: Index) -> None:
    _wheel()(ix)
    answer = ix.a.routes["/simple/toy"]
    answer.send = len(answer.body) // 2


def _short_file(ix: Index) -> None:
    _wheel()(ix)
    ix.a.routes[f"/f/{WHEEL}"].send = 100


def _truncated() -> bytes:
    data = wheel_bytes("3.0")
    return data[: len(data) - 40]


DEADLINES = {"PATCHKIT_NET_DEADLINE": "3", "PATCHKIT_NET_TIMEOUT": "2"}
BUDGET = {"PATCHKIT_NET_BUDGET": "4", "PATCHKIT_NET_TIMEOUT": "2"}  # the run's, not a transfer's

CASES = [
    # credentials stay with their origin
    Case("redirect-page-url-credentials", _page_redirected, unusable=False, credentials="url"),
    Case("redirect-file-netrc-credentials", _file_redirected, unusable=False, credentials="netrc"),
    Case("redirect-file-url-credentials", _file_redirected, unusable=False, credentials="url"),
    Case("keyring-credentials-redirected", _keyring_only, unusable=False),
    # schemes a remote index may not use
    Case("file-link", _link(_local_file), "file: URL"),
    Case("ftp-link", _link(_ftp_url), "ftp: URL"),
    Case("data-link", _link(_data_url), "data: URL"),
    Case("sdist-without-sha256", _sdist_without_hash, "without a sha256"),
    Case("page-redirected-to-file", _redirected_to(_local_file, "page"), "redirects to a file:"),
    Case("file-redirected-to-ftp", _redirected_to(_ftp_url, "file"), "redirects to a ftp:"),
    # hostile or broken content
    Case("bzip2-bomb-source", _bomb("toy/core.py", zipfile.ZIP_BZIP2), "inflates past"),
    Case("lzma-bomb-source", _bomb("toy/core.py", zipfile.ZIP_LZMA), "inflates past"),
    Case("bzip2-bomb-metadata", _bomb("toy-3.0.dist-info/METADATA", zipfile.ZIP_BZIP2), "inflates"),
    Case("lzma-bomb-metadata", _bomb("toy-3.0.dist-info/METADATA", zipfile.ZIP_LZMA), "inflates"),
    Case("sdist-1.5-GiB-member", _huge_sdist, "over 256 MiB"),
    Case("trickled-page", _trickled_page, "deadline", env=DEADLINES, seconds=30),
    Case(
        "page-a-byte-a-second",
        lambda ix: _trickled_page(ix, 1.0),
        "deadline",
        env=DEADLINES,
        seconds=30,
    ),  # fmt: skip
    Case("trickled-file", _trickled_file, "deadline", env=DEADLINES, seconds=30),
    Case("trickled-file-run-budget", _trickled_file, "deadline", env=BUDGET, seconds=30),
    Case("bad-crc", _bytes(lambda: bad_crc_wheel("3.0")), "Bad CRC-32"),
    Case("truncated-zip", _bytes(_truncated), "a damaged wheel"),
    Case("not-a-zip", _bytes(lambda: b"<html>not a wheel</html>\n"), "a damaged wheel"),
    Case("metadata-names-another-project", _wheel(meta_name="evil"), "names project 'evil'"),
    Case("metadata-another-version", _wheel(meta_version="9.9"), "says version '9.9'"),
    Case("dist-info-another-project", _wheel(dist_info="evil-3.0.dist-info"), "metadata folder"),
    Case("dist-info-another-version", _wheel(dist_info="toy-9.9.dist-info"), "metadata folder"),
    # transient failures: asked again (0.5, 1, 2 s apart), then given up with the answer
    Case("page-busy-twice", _unsteady("page", busy=2), unusable=False),
    Case("file-dropped-twice", _unsteady("file", dropped=2), unusable=False),
    Case("file-busy-for-ever", _unsteady("file", busy=10**6), "HTTP 503", seconds=30),
    Case("page-busy-then-redirected", _busy_then_redirected, unusable=False, credentials="url"),
    Case("page-over-64-MiB", _big_page, "over the 64 MiB cap"),
    Case("page-shorter-than-its-length", _short_page, "Content-Length"),
    Case("file-shorter-than-its-length", _short_file, "Content-Length"),
]


# Started by a small Python that reports its child's peak RSS: a child forked straight from
# pytest counts pytest's own pages (its servers hold every body a case serves).
MEASURE = """
import resource, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
try:
    rc = child.wait(float(sys.argv[1]))
except subprocess.TimeoutExpired:
    child.kill()
    child.wait()
    rc = -9
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
sys.stderr.write(f"\\nmeasured {rc} {peak}\\n")
"""


def _run(args: list[str], env: dict[str, str], seconds: float):
    """The real CLI: (exit code, stdout, stderr, peak RSS in MB, wall seconds). A run past
    `seconds` is killed (exit -9)."""
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", MEASURE, str(seconds), sys.executable, "-m", "patchkit", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
    )
    err, _, last = r.stderr.rstrip("\n").rpartition("\n")
    _, rc, peak = last.split()
    return int(rc), r.stdout, err, int(peak) / 1024, time.monotonic() - start


@pytest.fixture
def index(tmp_path):
    log: list[Seen] = []
    a, b, ftp = Server("A", log), Server("B", log), Listener()
    ix = Index(a, b, tmp_path, ftp, make_project(tmp_path))
    ix.log = log  # type: ignore[attr-defined]
    yield ix
    a.close()
    b.close()
    ftp.close()


def _credentials(ix: Index, how: str) -> None:
    if how == "url":
        user = f"deploy:{SECRET}@"
        ix.env["PATCHKIT_INDEX_URL"] = f"http://{user}127.0.0.1:{ix.a.port}/simple"
    else:
        ix.env["PATCHKIT_INDEX_URL"] = f"{ix.a.url}/simple"
    if how == "netrc":
        Path(ix.env["NETRC"]).write_text(f"machine 127.0.0.1 login deploy password {SECRET}\n")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_index(index, case):
    _credentials(index, case.credentials)
    case.serve(index)
    rc, out, err, rss, wall = _run(
        ["outlook", "--target", "toy"], {**index.env, **case.env}, case.seconds
    )
    said = out + err
    assert rc != -9, f"still running after {case.seconds} s: {err[-600:]}"
    assert "Traceback" not in said and "internal error" not in said, said[-2000:]
    assert SECRET not in said
    leaked = [s for s in index.log if s.server != "A" and s.authorization]
    assert not leaked, f"credentials reached another origin: {leaked}"
    assert rss < MAX_RSS_MB, f"{rss:.0f} MB"
    if case.says:
        assert case.says in said, said[-2000:]
    cache = Path(index.env["PATCHKIT_CACHE"])
    kept = sorted(p.name for p in cache.glob("*s/toy-3.0*"))
    if case.unusable:
        assert not kept, kept
        assert not (cache / "mirrors/toy.git/refs/patchkit/wheel/3.0").exists()
        assert rc in (0, 1, 2)
        if rc == 0:
            assert "3.0: unusable:" in out, out
    else:
        assert rc == 0, said[-2000:]
        assert "unusable" not in out, out
        assert (cache / "mirrors/toy.git/refs/patchkit/wheel/3.0").exists()  # imported
    assert index.ftp.connections == 0
    record(SECTION, f"{case.id}: exit {rc}, {rss:.0f} MB peak RSS, {wall:.1f} s")


def test_one_door_to_the_network_and_one_reader_for_members():
    """Nothing outside patchkit/net/ opens a connection, and nothing in upstream/ reads an
    archive member past the bounded reader (`archives.member_chunks`)."""
    network = re.compile(r"\b(urllib\.request|urllib3|http\.client|urlopen|socket\.create_conn)")
    unbounded = re.compile(r"\bzf\.(open|read)\(|ZipFile\([^)]*\)\.(open|read)\(")
    doors, readers = [], []
    for path in (ROOT / "patchkit").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith("patchkit/net/") and network.search(text):
            doors.append(rel)
        if rel.startswith("patchkit/upstream/") and unbounded.search(text):
            readers.append(rel)
    assert not doors, f"network requests outside patchkit/net/: {doors}"
    assert not readers, f"unbounded member reads: {readers}"


def test_help_and_a_run_that_downloads_nothing_never_import_urllib3(tmp_path):
    env = make_project(tmp_path)  # the pinned wheel is in the cache: nothing to download
    into = tmp_path / "tree"
    for argv in (["--help"], ["apply", "--target", "toy", "--into", str(into)]):
        code = (
            "import sys\nfrom patchkit.cli import main\n"
            f"rc = main({argv!r})\n"
            "print('LOADED', rc, 'urllib3' in sys.modules)\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
        )
        assert "LOADED 0 False" in r.stdout, r.stdout[-400:] + r.stderr[-400:]
    assert (into / "python/toy/core.py").read_text().endswith("return 42\n")
