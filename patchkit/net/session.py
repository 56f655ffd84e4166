"""The session every request of a run goes through (pip's `PipSession`), on urllib3.

It owns: the credentials of each origin (`auth.Credentials`: never sent to another origin,
on a redirect or otherwise); the scheme policy (http and https only, `file:` only for a run
whose index is itself a `file:` URL; a redirect from https to http is refused); a per-read
timeout, a deadline per transfer and one for the whole run, enforced by closing the socket
when they pass (a server that sends one byte a second cannot hold a run); a size cap per
transfer that says so when it cuts; and the `Content-Length` a server announced, checked
against what it sent.  A request whose connection the server dropped before answering, or
whose answer says "try again later" (429, 500, 502, 503, 504), is sent again after 0.5, 1
and 2 s ($PATCHKIT_NET_RETRIES times, 3 by default) while its deadline leaves the time, as
pip does; a server that refuses the connection or a name that does not resolve is not asked
again, nor is a transfer cut mid-body.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from patchkit.errors import FetchError
from patchkit.net.auth import Credentials, split_credentials

MAX_REDIRECTS = 10
CHUNK = 1 << 20
REDIRECTS = (301, 302, 303, 307, 308)
TRANSIENT = frozenset((429, 500, 502, 503, 504))
WEB = ("http", "https")


def _seconds(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


@dataclass(frozen=True)
class Limits:
    """Seconds: a read waits at most `read`; a page transfer ends within `page`, a file's
    within `file`; every transfer of the run within `run` of the session's start."""

    read: float = 60.0
    page: float = 120.0
    file: float = 1800.0
    run: float = 3600.0
    retries: int = 3  # how many times a request is sent again after a transient failure

    @classmethod
    def from_environment(cls) -> Limits:
        """$PATCHKIT_NET_TIMEOUT (per read), $PATCHKIT_NET_DEADLINE (per file transfer; a page
        gets the smaller of it and 120 s), $PATCHKIT_NET_BUDGET (the run's),
        $PATCHKIT_NET_RETRIES (0 sends each request once)."""
        read = _seconds("PATCHKIT_NET_TIMEOUT", cls.read)
        file = _seconds("PATCHKIT_NET_DEADLINE", cls.file)
        run = _seconds("PATCHKIT_NET_BUDGET", cls.run)
        try:
            retries = max(0, int(os.environ.get("PATCHKIT_NET_RETRIES", cls.retries)))
        except ValueError:
            retries = cls.retries
        return cls(read=read, page=min(cls.page, file), file=file, run=run, retries=retries)


class _Watch:
    """Closes the sockets of one transfer when its deadline passes (what a per-read timeout
    cannot do against a server that trickles)."""

    local = threading.local()

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._ends = time.monotonic() + seconds
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(seconds, 0.0), self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Watch:
        _Watch.local.current = self
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        _Watch.local.current = None

    def leaves(self, pause: float) -> bool:
        """Whether the deadline is more than `pause` seconds away."""
        return not self.expired and time.monotonic() + pause < self._ends

    def add(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            self._close(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            self._close(sock)

    @staticmethod
    def _close(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _watched_pools():
    """urllib3 pool classes whose connections hand their socket to the transfer's `_Watch`
    before waiting for the response's headers."""
    import urllib3
    from urllib3.connection import HTTPConnection, HTTPSConnection

    def watched(base):
        class Watched(base):
            def getresponse(self):
                watch = getattr(_Watch.local, "current", None)
                if watch is not None:
                    watch.add(self.sock)
                return super().getresponse()

        return Watched

    class HTTPPool(urllib3.HTTPConnectionPool):
        ConnectionCls = watched(HTTPConnection)

    class HTTPSPool(urllib3.HTTPSConnectionPool):
        ConnectionCls = watched(HTTPSConnection)

    return {"http": HTTPPool, "https": HTTPSPool}


@dataclass
class Transfer:
    """One answered request: its final URL (after redirects), type and length."""

    url: str
    content_type: str
    length: int | None
    _chunks: Iterator[bytes]

    def chunks(self) -> Iterator[bytes]:
        return self._chunks


class Session:
    """Every request of a run: made where a run first talks to the package index."""

    def __init__(self, index_url: str, limits: Limits | None = None) -> None:
        self.credentials = Credentials()
        self.index = self.credentials.add_index(index_url).rstrip("/")
        self.limits = limits or Limits.from_environment()
        self._started = time.monotonic()
        self._managers: dict[str | None, object] = {}
        self.local = urllib.parse.urlsplit(self.index).scheme.lower() == "file"

    # -- policy ---------------------------------------------------------------------------

    def check_scheme(self, url: str) -> None:
        """Refuse a URL the run must not open: http(s) only; `file:` only when the index is a
        `file:` URL (a remote index cannot make patchkit read the local disk)."""
        scheme = urllib.parse.urlsplit(url).scheme.lower()
        if scheme in WEB or (scheme == "file" and self.local):
            return
        where = "a file: index" if self.local else f"the index {self.index}"
        raise FetchError(
            f"{_shown(url)}: a {scheme or 'relative'}: URL from {where}; refusing "
            "(only http and https" + (", and file: from a file: index)" if not self.local else ")")
        )

    def _deadline(self, kind: str) -> float:
        per = self.limits.page if kind == "page" else self.limits.file
        left = self.limits.run - (time.monotonic() - self._started)
        if left <= 0:
            raise FetchError(
                f"the run's network deadline ({self.limits.run:g} s) has passed; refusing "
                "further downloads",
                hint="set PATCHKIT_NET_BUDGET for a slower index",
            )
        return min(per, left)

    # -- transfers ------------------------------------------------------------------------

    @contextlib.contextmanager
    def open(
        self, url: str, *, limit: int, kind: str = "file", accept: str | None = None
    ) -> Iterator[Transfer]:
        """GET `url`: a Transfer whose chunks stop with a FetchError past `limit` bytes, past the
        deadline, or short of the announced Content-Length."""
        self.check_scheme(url)
        seconds = self._deadline(kind)
        if urllib.parse.urlsplit(url).scheme.lower() == "file":
            yield _local(url, limit)
            return
        with _Watch(seconds) as watch:
            response, final = self._follow(url, accept, watch, seconds)
            try:
                length = _length(response, final, limit)
                chunks = _read(response, final, limit, length, watch, seconds)
                kind_ = response.headers.get("Content-Type", "")
                yield Transfer(final, kind_, length, chunks)
            finally:
                _discard(response)

    def read(self, url: str, *, limit: int, accept: str | None = None) -> Transfer:
        """A page, read whole (at most `limit` bytes); `chunks()` yields it once."""
        with self.open(url, limit=limit, kind="page", accept=accept) as transfer:
            body = b"".join(transfer.chunks())
        return Transfer(transfer.url, transfer.content_type, len(body), iter((body,)))

    def _follow(self, url: str, accept: str | None, watch: _Watch, seconds: float):
        """The first answer that is no redirect; credentials only where `header_for` allows."""
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            headers = {"Accept-Encoding": "identity", "User-Agent": "patchkit"}
            if accept:
                headers["Accept"] = accept
            auth = self.credentials.header_for(current)
            if auth:
                headers["Authorization"] = auth
            response = self._get(current, headers, watch, seconds)
            if response.status == 401 and "Authorization" not in headers:
                retry = self.credentials.from_keyring(self.index, current)
                if retry:
                    _discard(response)
                    headers["Authorization"] = retry
                    response = self._get(current, headers, watch, seconds)
            if response.status not in REDIRECTS:
                if response.status >= 400:
                    _discard(response)
                    raise FetchError(
                        f"cannot download {_shown(current)}: HTTP {response.status} "
                        f"{response.reason or ''}".rstrip()
                    )
                return response, current
            location = response.headers.get("Location", "")
            _discard(response)
            current = self._redirect(current, location)
        raise FetchError(f"{_shown(url)}: more than {MAX_REDIRECTS} redirects; refusing")

    def _redirect(self, current: str, location: str) -> str:
        target = urllib.parse.urljoin(current, location)
        old = urllib.parse.urlsplit(current).scheme.lower()
        new = urllib.parse.urlsplit(target).scheme.lower()
        if new not in WEB:
            raise FetchError(f"{_shown(current)} redirects to a {new}: URL; refusing")
        if old == "https" and new == "http":
            raise FetchError(
                f"{_shown(current)} redirects from https to http ({_shown(target)}); refusing"
            )
        return target

    def _get(self, url: str, headers: dict, watch: _Watch, seconds: float):
        """One answer to GET `url`, sent again after a transient failure (module docstring)
        while the transfer's deadline leaves time for the pause."""
        import urllib3

        for attempt in range(self.limits.retries + 1):
            pause = 0.5 * 2**attempt
            last = attempt == self.limits.retries or not watch.leaves(pause)
            try:
                response = self._send(url, headers)
            except urllib3.exceptions.HTTPError as exc:
                dropped = isinstance(exc, urllib3.exceptions.ProtocolError)
                if last or watch.expired or not dropped:
                    raise _failure(url, exc, watch, seconds) from None
            else:
                if response.status not in TRANSIENT or last:
                    return response
                _discard(response)
            time.sleep(pause)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _send(self, url: str, headers: dict):
        import urllib3

        timeout = urllib3.Timeout(connect=self.limits.read, read=self.limits.read)
        return self._manager(url).request(
            "GET",
            url,
            headers=headers,
            redirect=False,
            retries=False,
            preload_content=False,
            decode_content=False,
            timeout=timeout,
        )

    def _manager(self, url: str):
        """The pool manager for `url`: through the proxy the environment names for it
        (http_proxy, https_proxy, no_proxy, as pip and urllib honour them), else direct."""
        import urllib3

        parts = urllib.parse.urlsplit(url)
        proxy = urllib.request.getproxies().get(parts.scheme.lower())
        if proxy and urllib.request.proxy_bypass(parts.hostname or ""):
            proxy = None
        if proxy not in self._managers:
            if proxy:
                clean, given = split_credentials(proxy)
                headers = (
                    urllib3.make_headers(proxy_basic_auth=f"{given[0]}:{given[1] or ''}")
                    if given
                    else None
                )
                manager = urllib3.ProxyManager(clean, proxy_headers=headers)
            else:
                manager = urllib3.PoolManager()
            manager.pool_classes_by_scheme = _watched_pools()
            self._managers[proxy] = manager
        return self._managers[proxy]


def _discard(response) -> None:
    """Close an answer's connection, read or not (a body left unread, perhaps endless, must
    not be read by the next request on a kept-alive connection)."""
    response.close()
    response.release_conn()


def _length(response, url: str, limit: int) -> int | None:
    declared = response.headers.get("Content-Length")
    if declared is None:
        return None
    try:
        length = int(declared)
    except ValueError:
        raise FetchError(f"{_shown(url)}: Content-Length {declared!r} is no number") from None
    if length > limit:
        raise FetchError(
            f"{_shown(url)}: announces {length} bytes, over the {_size(limit)} cap; refusing"
        )
    encoding = response.headers.get("Content-Encoding", "identity").lower()
    if encoding not in ("identity", ""):
        raise FetchError(f"{_shown(url)}: sent as Content-Encoding {encoding}, not asked for")
    return length


def _read(response, url: str, limit: int, length: int | None, watch: _Watch, seconds: float):
    import urllib3

    total = 0
    try:
        while chunk := response.read1(CHUNK):
            total += len(chunk)
            if total > limit:
                raise FetchError(f"{_shown(url)}: larger than the {_size(limit)} cap; refusing")
            yield chunk
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        if not watch.expired and length is not None and total < length:
            raise _short(url, total, length) from None
        raise _failure(url, exc, watch, seconds) from None
    if watch.expired:
        raise _failure(url, TimeoutError(), watch, seconds)
    if length is not None and total != length:
        raise _short(url, total, length)


def _short(url: str, total: int, length: int) -> FetchError:
    return FetchError(
        f"{_shown(url)}: the transfer ended after {total} of the {length} bytes its "
        "Content-Length announced; refusing"
    )


def _failure(url: str, exc: BaseException, watch: _Watch, seconds: float) -> FetchError:
    if watch.expired:
        return FetchError(
            f"{_shown(url)}: not complete within its {seconds:.3g} s deadline; refusing",
            hint="set PATCHKIT_NET_DEADLINE (one transfer) or PATCHKIT_NET_BUDGET (the run) "
            "for a slower index",
        )
    reason = getattr(exc, "reason", None) or exc
    text = str(reason).splitlines()[0] if str(reason) else type(reason).__name__
    if "IncompleteRead" in type(exc).__name__ or "IncompleteRead" in text:
        text = f"the transfer ended early ({text})"
    return FetchError(f"cannot download {_shown(url)}: {text[:200]}")


def _local(url: str, limit: int) -> Transfer:
    """A file of a `file:` index: a regular file, read to `limit`."""
    from patchkit.archives import SpecialFileError, open_regular

    path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
    try:
        fh = open_regular(path)
    except (OSError, SpecialFileError) as exc:
        raise FetchError(f"cannot download {url}: {exc.strerror or exc}") from None

    def chunks() -> Iterator[bytes]:
        total = 0
        with fh:
            while chunk := fh.read(CHUNK):
                total += len(chunk)
                if total > limit:
                    raise FetchError(f"{url}: larger than the {_size(limit)} cap; refusing")
                yield chunk

    return Transfer(url, "", None, chunks())


def _shown(url: str) -> str:
    """A URL as messages show it: without credentials."""
    return split_credentials(url)[0]


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
