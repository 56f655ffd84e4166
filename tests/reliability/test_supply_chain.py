"""Supply chain: every mismatch with a pin is refused before anything is applied or imported.

sdist sha256 mismatch, a release tag that a remote moved to another commit, an sdist whose
recorded commit id disagrees with the pin, a tampered mirror object, and an unpinned ref that
needs --allow-unpinned (and says what it did not verify).
"""

from __future__ import annotations

import http.server
import io
import json
import os
import re
import subprocess
import tarfile
import threading
import time
import zlib
from pathlib import Path

import pytest
from helpers import loosen_packs, seeded_targets
from reliability_support import (
    ROOT,
    cli,
    git,
    one_or_two_lines,
    record,
    rev,
    sha256,
    snapshot,
    toy_sdist,
    toy_sdist_project,
)

SECTION = "supply chain (tests/reliability/test_supply_chain.py)"


class _Index(http.server.BaseHTTPRequestHandler):
    """A package index speaking the simple JSON API for one file."""

    files: dict[str, bytes] = {}
    listed_sha: dict[str, str] = {}

    def do_GET(self):  # noqa: N802 - http.server API
        if self.path.startswith("/simple/"):
            project = self.path.split("/")[2]
            entries = [
                {
                    "filename": name,
                    "url": f"http://{self.headers['Host']}/files/{name}",
                    "hashes": {"sha256": self.listed_sha.get(name, sha256(data))},
                }
                for name, data in self.files.items()
                if name.startswith(project)
            ]
            body = json.dumps({"files": entries}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        elif self.path.startswith("/files/") and self.path[7:] in self.files:
            body = self.files[self.path[7:]]
            self.send_response(200)
        else:
            body = b""
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def index_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Index.files, _Index.listed_sha = {}, {}
    yield f"http://127.0.0.1:{server.server_port}/simple", _Index
    server.shutdown()


def _refused(done, *words: str) -> list[str]:
    problems = []
    if done.returncode in (0, 3):
        problems.append(f"accepted (exit {done.returncode})")
    if not one_or_two_lines(done.stderr):
        problems.append(f"not a one- or two-line error: {done.stderr[-400:]!r}")
    for word in words:
        if word not in done.stderr:
            problems.append(f"the error does not say {word!r}: {done.stderr[-300:]!r}")
    return problems


def test_sdist_hash_mismatch_refused_nothing_written(tmp_path, index_server):
    url, index = index_server
    commit = "cd" * 20
    good, evil = toy_sdist(commit), toy_sdist(commit, files=61)
    index.files["toy-1.0.tar.gz"] = evil  # the index serves other bytes than were pinned
    toy = toy_sdist_project(tmp_path / "toy", good, commit, seed_cache=False)
    env = {**toy.env, "PATCHKIT_OFFLINE_GIT": "1", "PATCHKIT_INDEX_URL": url}
    done = cli("apply", "--target", "toy", "--into", str(tmp_path / "wt"), env=env)
    problems = _refused(done, "sha256", "does not match the pin")
    if (tmp_path / "wt").exists():
        problems.append("a work tree was created")
    written = [
        k
        for k in snapshot(toy.cache)
        if "sdists/" in k or k.startswith("mirrors/toy.git/refs/patchkit")
    ]
    if written:
        problems.append(f"cache entries written: {written}")
    verdict = "refused, nothing written" if not problems else problems
    record(SECTION, f"sdist sha256 mismatch: {verdict}")
    assert not problems


def test_sdist_recorded_commit_disagrees_with_pin(tmp_path, sglang_sdist):
    """The real sglang 0.5.9 sdist with its _version.py commit id changed, pinned by its new
    sha256 in a scratch project: the import must refuse it."""
    out = io.BytesIO()
    with tarfile.open(sglang_sdist, "r:gz") as src, tarfile.open(fileobj=out, mode="w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None
            if member.name.endswith("sglang/_version.py"):
                data = data.replace(b"'gbbe9c7eeb'", b"'g0123456789'")
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    forged = out.getvalue()
    project = tmp_path / "project"
    (project / "patches").mkdir(parents=True)
    targets = seeded_targets((ROOT / "patches" / "targets.toml").read_text())
    pinned = "11b1445bfb039c20217783850fda66a71b814391b2cf313f4e6cadc3b9fea41b"
    assert pinned in targets
    (project / "patches" / "targets.toml").write_text(targets.replace(pinned, sha256(forged)))
    (project / "patches" / "sglang").mkdir()
    (project / "patches" / "sglang" / "series").write_text("")
    cache = tmp_path / "cache"
    (cache / "sdists").mkdir(parents=True)
    (cache / "sdists" / sglang_sdist.name).write_bytes(forged)
    env = {
        "PATCHKIT_PROJECT": str(project),
        "PATCHKIT_CACHE": str(cache),
        "PATCHKIT_OFFLINE_GIT": "1",
        "PATCHKIT_INDEX_URL": "http://127.0.0.1:9/simple",
    }
    done = cli("fetch", "--target", "sglang", env=env)
    problems = _refused(done, "records upstream commit 0123456789", "refusing")
    mirror = cache / "mirrors" / "sglang.git"
    if mirror.exists() and rev(mirror, "refs/patchkit/sdist/0.5.9", bare=True):
        problems.append("imported anyway")
    if (cache / "tmp").exists() and any((cache / "tmp").iterdir()):
        problems.append("scratch left in the cache")
    record(
        SECTION,
        "sdist whose recorded commit disagrees with the pin: "
        f"{'refused, nothing imported' if not problems else problems}",
    )
    assert not problems


def _project_with_pin(tmp_path: Path, commit: str) -> Path:
    project = tmp_path / "project"
    (project / "patches" / "sglang").mkdir(parents=True)
    targets = seeded_targets((ROOT / "patches" / "targets.toml").read_text())
    pinned = "bbe9c7eeb520b0a67e92d133dfc137a3688dc7f2"
    assert pinned in targets
    (project / "patches" / "targets.toml").write_text(targets.replace(pinned, commit))
    (project / "patches" / "sglang" / "series").write_text("")
    return project


def test_moved_release_tag_refused(tmp_path, upstream_remote):
    """The pin says v0.5.9 is commit X; the remote's v0.5.9 is another commit: refused."""
    later = git(upstream_remote, "rev-parse", "v0.5.9.1^{commit}").strip()
    project = _project_with_pin(tmp_path, later)
    cache = tmp_path / "cache"
    env = {
        "PATCHKIT_PROJECT": str(project),
        "PATCHKIT_CACHE": str(cache),
        "PATCHKIT_OFFLINE_GIT": "1",
        "PATCHKIT_INDEX_URL": "http://127.0.0.1:9/simple",
    }
    done = cli(
        "apply",
        "--target",
        "sglang@v0.5.9",
        "--upstream",
        str(upstream_remote),
        "--into",
        str(tmp_path / "wt"),
        env=env,
    )
    problems = _refused(done, "tag v0.5.9", "the pin says", "refusing")
    if (tmp_path / "wt").exists():
        problems.append("a work tree was created")
    mirror = cache / "mirrors" / "sglang.git"
    if (
        mirror.exists()
        and subprocess.run(
            ["git", "--git-dir", str(mirror), "for-each-ref"], capture_output=True, text=True
        ).stdout.strip()
    ):
        problems.append("something was fetched")
    record(
        SECTION,
        "release tag moved on the remote (git ref != pin): "
        f"{'refused, nothing fetched' if not problems else problems}",
    )
    assert not problems


def test_unpinned_ref_needs_flag_and_says_so(tmp_path, upstream_remote):
    cache = tmp_path / "cache"
    project = _project_with_pin(tmp_path, "bbe9c7eeb520b0a67e92d133dfc137a3688dc7f2")
    env = {
        "PATCHKIT_PROJECT": str(project),
        "PATCHKIT_CACHE": str(cache),
        "PATCHKIT_OFFLINE_GIT": "1",
        "PATCHKIT_INDEX_URL": "http://127.0.0.1:9/simple",
    }
    args = (
        "apply",
        "--target",
        "sglang@v0.5.9.1",
        "--upstream",
        str(upstream_remote),
        "--into",
        str(tmp_path / "wt"),
    )
    refused = cli(*args, env=env)
    problems = _refused(refused, "--allow-unpinned")
    if (tmp_path / "wt").exists():
        problems.append("applied without --allow-unpinned")
    allowed = cli(*args, "--allow-unpinned", env=env)
    if allowed.returncode != 0:
        problems.append(f"--allow-unpinned failed: {allowed.stderr[-300:]}")
    if not re.search(r"WARNING: .*not pinned.*not\s+verified", allowed.stdout, re.S):
        problems.append(f"no loud warning: {allowed.stdout[-300:]!r}")
    verdict = (
        "refused without --allow-unpinned; with it, applied with a WARNING"
        if not problems
        else problems
    )
    record(SECTION, f"unpinned ref: {verdict}")
    assert not problems


def _tamper(mirror: Path, sha: str) -> None:
    """Rewrite one loose object's content (breaking the hard link the private cache shares)."""
    path = mirror / "objects" / sha[:2] / sha[2:]
    if not path.exists():  # packed mirror: turn its packs into loose objects first
        loosen_packs(mirror)
    raw = zlib.decompress(path.read_bytes())
    header, body = raw.split(b"\0", 1)
    evil = body.replace(b"SGLang", b"EVILng", 1)
    assert evil != body
    path.unlink()
    path.write_bytes(zlib.compress(b"blob %d\0" % len(evil) + evil))


def test_tampered_mirror_object_refused(tmp_path, cache):
    mirror = cache / "mirrors" / "sglang.git"
    base = rev(mirror, "refs/patchkit/sdist/0.5.9", bare=True)
    from patchkit import gitops

    start = time.monotonic()
    assert gitops.corrupt_objects(gitops.Repo.bare_at(mirror), base) == []
    seconds = time.monotonic() - start
    objects = len(git(mirror, "rev-list", "--objects", "--no-walk", base).splitlines())
    blob = git(mirror, "rev-parse", f"{base}:python/README.md").strip()
    _tamper(mirror, blob)
    env = {
        "PATCHKIT_PROJECT": os.environ["PATCHKIT_PROJECT"],  # the seed-line copy (conftest)
        "PATCHKIT_CACHE": str(cache),
        "PATCHKIT_OFFLINE_GIT": "1",
    }
    done = cli("apply", "--target", "sglang", "--into", str(tmp_path / "wt"), env=env)
    problems = _refused(done, "damaged or tampered", blob[:12])
    if (tmp_path / "wt").exists():
        problems.append("a work tree was created")
    record(
        SECTION,
        "tampered mirror object: "
        f"{'refused before applying' if not problems else problems}; the check "
        f"re-hashes {objects} objects of the sglang 0.5.9 base in {seconds:.2f}s",
    )
    assert not problems
    assert os.path.exists(mirror)
