"""A hostile package index, as data: real HTTP servers on 127.0.0.1 whose routes a case sets
(pages, files, redirects, bodies cut short or sent one byte at a time), real wheels and sdists
built here (crafted ones included), and a toy project whose target publishes wheels only.

`test_hostile_index.py` runs each case through the real CLI against it.
"""

from __future__ import annotations

import bz2
import hashlib
import http.server
import io
import json
import lzma
import os
import socket
import struct
import subprocess
import tarfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from helpers import TOY_TOML, record_hash
from reliability_support import GIT_ENV

# -- archives ------------------------------------------------------------------------------


def toy_sources(version: str) -> dict[str, bytes]:
    return {
        "toy/__init__.py": f'__version__ = "{version}"\n'.encode(),
        "toy/core.py": b"def answer():\n    return 41\n",
    }


def wheel_bytes(
    version: str,
    *,
    name: str = "toy",
    dist_info: str | None = None,
    meta_name: str | None = None,
    meta_version: str | None = None,
    files: dict[str, bytes] | None = None,
) -> bytes:
    """A real wheel (METADATA, WHEEL, RECORD); `dist_info`, `meta_name` and `meta_version`
    may name another project or version than the file name will."""
    info = dist_info or f"{name}-{version}.dist-info"
    members = dict(files if files is not None else toy_sources(version))
    members[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {meta_name or name}\nVersion: {meta_version or version}\n\n"
    ).encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d in members.items())
    members[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            zi = zipfile.ZipInfo(member, date_time=(2026, 1, 2, 3, 4, 6))
            zi.external_attr = 0o100644 << 16
            zf.writestr(zi, data)
    return out.getvalue()


def bomb_stream(
    method: int, total: int, head: bytes = b"Metadata-Version: 2.1\nName: toy\nVersion: 3.0\n\n"
) -> bytes:
    """`head`, then `total` bytes of 'A', as a zip member of `method` (bzip2 or lzma) stores
    them."""
    block = b"A" * (16 << 20)
    if method == zipfile.ZIP_BZIP2:
        c = bz2.BZ2Compressor(9)
        prefix = b""
    else:
        lzma1 = {"id": lzma.FILTER_LZMA1}
        c = lzma.LZMACompressor(format=lzma.FORMAT_RAW, filters=[lzma1])
        props = lzma._encode_filter_properties(lzma1)
        prefix = struct.pack("<BBH", 9, 4, len(props)) + props
    out = [prefix, c.compress(head)]
    out += [c.compress(block) for _ in range(total // len(block))]
    return b"".join(out) + c.flush()


def lying_wheel(version: str, member: str, method: int, stream: bytes, claim: int = 200) -> bytes:
    """A toy wheel whose `member` holds `stream` (compressed by `method`) while its headers
    claim `claim` bytes uncompressed."""
    good = zipfile.ZipFile(io.BytesIO(wheel_bytes(version)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for info in good.infolist():
            if info.filename != member:
                zf.writestr(info, good.read(info))
        add_lying_member(zf, member, method, stream, claim)
    return out.getvalue()


def add_lying_member(zf: zipfile.ZipFile, member: str, method: int, stream: bytes, claim: int):
    """Append `member` to `zf` as `stream` compressed by `method`, its local header and
    central directory entry claiming `claim` bytes uncompressed (and a CRC of 0)."""
    info = zipfile.ZipInfo(member, date_time=(2026, 1, 2, 3, 4, 6))
    info.compress_type, info.file_size, info.compress_size = method, claim, len(stream)
    info.CRC = 0
    info.header_offset = zf.fp.tell()
    zf.fp.write(info.FileHeader(False) + stream)
    zf.start_dir = zf.fp.tell()
    zf.filelist.append(info)
    zf.NameToInfo[member] = info
    zf._didModify = True


def bad_crc_wheel(version: str) -> bytes:
    """A toy wheel with one byte of a stored source member flipped (its CRC-32 no longer
    matches)."""
    good = zipfile.ZipFile(io.BytesIO(wheel_bytes(version)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for info in good.infolist():
            zf.writestr(info.filename, good.read(info), zipfile.ZIP_STORED)
    data = bytearray(out.getvalue())
    at = data.index(b"return 41")
    data[at] ^= 0x20
    return bytes(data)


def sdist_bytes(version: str, members: dict[str, bytes] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for rel, data in (members or toy_sources(version)).items():
            info = tarfile.TarInfo(f"toy-{version}/{rel}")
            info.size, info.mtime = len(data), 1700000000
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def huge_member_sdist(version: str, size: int, cache: Path) -> bytes:
    """An sdist whose one member holds `size` zero bytes (gzip makes it about 1000x
    smaller), made once and kept in `cache`."""
    path = cache / f"toy-{version}-{size}.tar.gz"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
            info = tarfile.TarInfo(f"toy-{version}/toy/big.py")
            info.size, info.mtime = size, 1700000000
            tar.addfile(info, _Zeros(size))
        os.replace(tmp, path)
    return path.read_bytes()


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- servers -------------------------------------------------------------------------------


@dataclass
class Answer:
    """What a route answers: a body (cut to `send` bytes while announcing its whole length,
    or sent one byte every `trickle` seconds), or a redirect; after `busy` 503s and `dropped`
    connections closed unanswered."""

    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    send: int | None = None
    trickle: float | None = None
    location: str | None = None
    needs: str | None = None  # the one Authorization value answered; 401 without it
    busy: int = 0  # the first `busy` requests get 503 Service Unavailable
    dropped: int = 0  # the first `dropped` requests: the connection closed, no answer


@dataclass
class Seen:
    server: str
    path: str
    authorization: str | None
    host: str | None


class Server:
    """One HTTP server on 127.0.0.1 in a thread, answering its `routes`, recording each request."""

    def __init__(self, name: str, log: list[Seen]) -> None:
        self.name = name
        self.routes: dict[str, Answer] = {}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 - http.server's name
                path = self.path
                if "://" in path:  # asked as a proxy: the absolute URL's path
                    path = "/" + path.split("://", 1)[1].split("/", 1)[1]
                log.append(
                    Seen(owner.name, path, self.headers.get("Authorization"), self.headers["Host"])
                )
                owner.answer(self, path)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, handler, path: str) -> None:
        found = self.routes.get(path) or self.routes.get(path.rstrip("/"))
        if found is None:
            handler.send_error(404)
            return
        if found.needs and handler.headers.get("Authorization") != found.needs:
            handler.send_error(401)
            return
        if found.busy:
            found.busy -= 1
            handler.send_error(503)
            return
        if found.dropped:
            found.dropped -= 1
            handler.close_connection = True
            return
        handler.send_response(found.status)
        if found.location:
            handler.send_header("Location", found.location)
        for key, value in found.headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(found.body)))
        handler.end_headers()
        body = found.body if found.send is None else found.body[: found.send]
        try:
            if found.trickle:
                for i in range(len(body)):
                    handler.wfile.write(body[i : i + 1])
                    handler.wfile.flush()
                    time.sleep(found.trickle)
            else:
                handler.wfile.write(body)
            if found.send is not None:
                handler.close_connection = True
        except OSError:
            pass

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Listener:
    """A bare TCP port that records whether anything connected (an ftp: server stand-in)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def page(files: list[tuple[str, str, str | None]]) -> Answer:
    """A PEP 691 JSON simple page listing (filename, url, sha256 or None)."""
    body = json.dumps(
        {
            "meta": {"api-version": "1.0"},
            "name": "toy",
            "files": [
                {"filename": n, "url": u, "hashes": {"sha256": h} if h else {}} for n, u, h in files
            ],
        }
    ).encode()
    return Answer(body, headers={"Content-Type": "application/vnd.pypi.simple.v1+json"})


# -- the project ---------------------------------------------------------------------------


def _answer_patch(work: Path) -> bytes:
    """A real `git format-patch` of one edit of toy 1.0's sources (laid out under python/)."""
    env = {**os.environ, **GIT_ENV}
    work.mkdir()

    def git(*args: str) -> bytes:
        return subprocess.run(
            ["git", *args], cwd=work, env=env, check=True, capture_output=True
        ).stdout

    git("init", "-q")
    for name, data in toy_sources("1.0").items():
        (work / "python" / name).parent.mkdir(parents=True, exist_ok=True)
        (work / "python" / name).write_bytes(data)
    git("add", "-A")
    git("commit", "-qm", "base")
    core = work / "python" / "toy" / "core.py"
    core.write_bytes(core.read_bytes().replace(b"return 41", b"return 42"))
    git("commit", "-qam", "Answer 42")
    return git("format-patch", "-1", "--stdout", "--zero-commit", "HEAD")


def make_project(root: Path) -> dict[str, str]:
    """A project whose target `toy` publishes wheels only (release 1.0 pinned, its wheel in
    a private cache, an empty line); returns the environment a run needs."""
    cache = root / "cache"
    (cache / "wheels").mkdir(parents=True)
    wheel = wheel_bytes("1.0")
    name = "toy-1.0-py3-none-any.whl"
    (cache / "wheels" / name).write_bytes(wheel)
    project = root / "project"
    line = project / "patches" / "toy" / "1.0"
    line.mkdir(parents=True)
    (line / "answer-42.patch").write_bytes(_answer_patch(root / "patch-work"))
    (line / "series").write_text("answer-42.patch\n")
    (project / "patches" / "targets.toml").write_text(
        TOY_TOML + f'\n[[targets.toy.releases]]\nversion = "1.0"\n'
        f'wheels = [{{ file = "{name}", sha256 = "{sha256(wheel)}" }}]\n'
    )
    (root / "home").mkdir()
    (root / "netrc").write_text("")
    (root / "netrc").chmod(0o600)
    return {
        "PATCHKIT_PROJECT": str(project),
        "PATCHKIT_CACHE": str(cache),
        "PATCHKIT_OFFLINE_GIT": "1",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "",
        "NETRC": str(root / "netrc"),
        "HOME": str(root / "home"),
        "http_proxy": "",
        "https_proxy": "",
        "HTTP_PROXY": "",
        "HTTPS_PROXY": "",
        "no_proxy": "",
        "NO_PROXY": "",
    }
