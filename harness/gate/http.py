"""A small GitHub REST client: no proxies from the environment, no cookie jar, redirects followed by hand.

The token goes only to the API's own origin ``(scheme, host, port)``. A redirect to another origin keeps the
ordinary API headers (``Accept``, ``User-Agent``, ``X-GitHub-Api-Version``) and drops ``Authorization``,
``Proxy-Authorization`` and ``Cookie``; once a hop has left the API origin the token is never sent again.

Time is bounded by wall clock, not per read: a server that sends one byte a second never trips a read timeout.
Each download (its redirect hops, headers and body) runs under a watchdog timer set to the smaller of its own
limit and what is left of the gate's; when it fires, every socket the client opened is shut down, the blocked
read returns, and the download fails as ``deadline`` (the gate's) or ``download_deadline`` (its own).
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from http.cookiejar import Cookie, DefaultCookiePolicy
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit
from urllib.request import Request

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from harness.core.errors import RecordError
from harness.core.jsonio import loads_strict
from harness.gate import GateError

API_VERSION = "2022-11-28"
ACCEPT = "application/vnd.github+json"
USER_AGENT = "miniverl-release-gate/1"
MAX_HOPS = 3
MAX_PAGES = 50
MAX_JSON_BYTES = 16 << 20
REDIRECTS = {301, 302, 303, 307, 308}
CHUNK = 1 << 16
TIMEOUT = (10.0, 60.0)  # per connect and per read; the watchdog bounds the whole download

Origin = tuple[str, str, int]


def origin(url: str) -> Origin:
    """``(scheme, host, port)`` with the default port filled in; refuses other schemes and userinfo."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise GateError(f"{scheme or 'a scheme-less'} URL is not http(s) with a host", check="url")
    if parts.username is not None or parts.password is not None:
        raise GateError("URLs with user:password@ are refused", check="url")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise GateError("URL has an invalid port", check="url") from None
    return scheme, parts.hostname.lower(), port


def origin_text(o: Origin) -> str:
    host = f"[{o[1]}]" if ":" in o[1] else o[1]
    return f"{o[0]}://{host}:{o[2]}"


class Deadline:
    """The gate's wall-clock limits (monotonic): ``total`` for the whole gate, ``per_download`` for each GET."""

    def __init__(self, total: float, per_download: float) -> None:
        self.total = total
        self.per_download = per_download
        self.end = time.monotonic() + total

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def expired(self, when: str) -> GateError:
        return GateError(
            f"the gate ran past its deadline of {self.total:g} s (--deadline-seconds) {when}", check="deadline"
        )

    def check(self, when: str) -> None:
        if self.remaining() <= 0:
            raise self.expired(when)


class _Sockets:
    """Every socket one client opened, so that its watchdog can cut them all from another thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: weakref.WeakSet[socket.socket] = weakref.WeakSet()

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def cut(self) -> None:
        with self._lock:
            held = list(self._open)
        for sock in held:
            # The plain socket's shutdown wakes a blocked read, TLS or not, without touching the TLS state;
            # a socket already closed refuses it.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


# The client whose request is being made on this thread; its connections register their sockets there.
_CURRENT: ContextVar[_Sockets | None] = ContextVar("gate_sockets", default=None)


def _register(sock: socket.socket | None) -> None:
    sockets = _CURRENT.get()
    if sockets is not None and sock is not None:
        sockets.add(sock)


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _register(sock)
        return sock


class _WatchedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # the plain socket: covers the TLS handshake
        _register(sock)
        return sock

    def connect(self) -> None:
        super().connect()
        _register(self.sock)  # the TLS socket that replaced it (wrapping detaches the plain one)


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class _WatchedAdapter(HTTPAdapter):
    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}


class _NoCookies(DefaultCookiePolicy):
    """Never store a cookie and never send one: the session has no usable cookie jar."""

    def set_ok(self, cookie: Cookie, request: Request) -> bool:
        return False

    def return_ok(self, cookie: Cookie, request: Request) -> bool:
        return False


class GitHubClient:
    def __init__(self, api_url: str, token: str, deadline: Deadline) -> None:
        self.api = api_url.rstrip("/")
        self.api_origin = origin(self.api)
        self._token = token
        self.deadline = deadline
        self._sockets = _Sockets()
        self.session = requests.Session()
        self.session.trust_env = False  # no proxies, netrc or CA bundles from the environment
        self.session.proxies = {}
        self.session.headers.clear()
        self.session.cookies.set_policy(_NoCookies())
        adapter = _WatchedAdapter(max_retries=0)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def close(self) -> None:
        self.session.close()

    def headers(self, with_token: bool) -> dict[str, str]:
        base = {
            "Accept": ACCEPT,
            "User-Agent": USER_AGENT,
            "X-GitHub-Api-Version": API_VERSION,
            "Accept-Encoding": "identity",
        }
        if with_token:
            base["Authorization"] = f"Bearer {self._token}"
        return base

    @contextlib.contextmanager
    def limited(self, url: str) -> Iterator[float]:
        """One download under a watchdog: its hops, headers and body; yields its budget in seconds."""
        what = f"GET {url_for_log(url)}"
        left = self.deadline.remaining()
        if left <= 0:
            raise self.deadline.expired(f"before {what}")
        budget = min(left, self.deadline.per_download)
        gate_wide = left <= self.deadline.per_download
        fired = threading.Event()

        def expire() -> None:
            fired.set()
            self._sockets.cut()

        def late() -> GateError:
            if gate_wide:
                return self.deadline.expired(f"during {what}")
            return GateError(
                f"{what} took longer than {self.deadline.per_download:g} s (--download-seconds)",
                check="download_deadline",
            )

        started = time.monotonic()
        timer = threading.Timer(budget, expire)
        timer.daemon = True
        token = _CURRENT.set(self._sockets)
        timer.start()
        try:
            yield budget
        except Exception:
            # A read the watchdog cut (or a socket timeout at the budget's end) is the deadline, whatever it broke.
            if fired.is_set() or time.monotonic() - started >= budget:
                raise late() from None
            raise
        finally:
            timer.cancel()
            _CURRENT.reset(token)
        if fired.is_set():  # a body read until close ends quietly when its socket is cut
            raise late()

    def open(self, url: str, check: str, budget: float) -> requests.Response:
        """GET ``url`` (streamed), following at most ``MAX_HOPS`` redirects by hand. Call inside ``limited``."""
        current, trusted = url, True
        # Socket timeouts a little past the budget, so that a silent server is the watchdog's, not a read error.
        timeout = (min(TIMEOUT[0], budget + 1.0), min(TIMEOUT[1], budget + 1.0))
        for _hop in range(MAX_HOPS + 1):
            here = origin(current)
            trusted = trusted and here == self.api_origin
            try:
                resp = self.session.get(
                    current, headers=self.headers(trusted), allow_redirects=False, stream=True, timeout=timeout
                )
            except requests.RequestException as exc:
                raise GateError(f"{origin_text(here)} did not answer: {exc.__class__.__name__}", check=check) from None
            if resp.status_code not in REDIRECTS:
                return resp
            location = resp.headers.get("Location")
            resp.close()
            if not location:
                raise GateError(f"{resp.status_code} redirect without a Location", check="redirect")
            current = urljoin(current, location)
        raise GateError(f"more than {MAX_HOPS} redirects (a loop?) from {url_for_log(url)}", check="redirect_limit")

    def get_json(self, url: str) -> tuple[Any, str | None]:
        """One API page: the parsed JSON and the ``Link: rel="next"`` URL, if any."""
        with self.limited(url) as budget, self.open(url, "api_connection", budget) as resp:
            _require_ok(resp, url, "api_status")
            data = _read_bounded(resp, MAX_JSON_BYTES, "api_response")
            nxt = resp.links.get("next", {}).get("url")
        try:
            return loads_strict(data, "the API response"), (urljoin(url, nxt) if nxt else None)
        except RecordError as exc:
            raise GateError(str(exc), check="api_response") from None

    def paginate(self, url: str, key: str) -> list[dict[str, Any]]:
        """Every item of ``key`` across ``Link`` pages; next pages must stay on the API origin."""
        items: list[dict[str, Any]] = []
        seen: set[str] = set()
        current: str | None = url
        while current is not None:
            if current in seen or len(seen) >= MAX_PAGES:
                raise GateError(f"pagination repeats or passes {MAX_PAGES} pages", check="pagination")
            if origin(current) != self.api_origin:
                raise GateError("a Link rel=next points to another origin", check="pagination")
            seen.add(current)
            value, current = self.get_json(current)
            page = value.get(key) if isinstance(value, dict) else None
            if not isinstance(page, list) or not all(isinstance(item, dict) for item in page):
                raise GateError(f"the API response has no list {key!r}", check="api_response")
            items.extend(page)
        return items

    def download(self, url: str, dest: Path, limit: int) -> tuple[int, str]:
        """Stream ``url`` into ``dest`` (at most ``limit`` bytes); returns (bytes, sha256)."""
        digest, size = hashlib.sha256(), 0
        with self.limited(url) as budget, self.open(url, "artifact_download", budget) as resp:
            _require_ok(resp, url, "artifact_download")
            declared = resp.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > limit:
                raise GateError(f"the download announces {declared} bytes, the bound is {limit}", check="artifact_size")
            with open(dest, "xb") as handle:
                for block in _blocks(resp, "artifact_download"):
                    size += len(block)
                    if size > limit:
                        raise GateError(f"the download passed its bound of {limit} bytes", check="artifact_size")
                    digest.update(block)
                    handle.write(block)
        return size, digest.hexdigest()


def url_for_log(url: str) -> str:
    """Origin and path only (no query, no fragment)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}"


def _require_ok(resp: requests.Response, url: str, check: str) -> None:
    if resp.status_code == 200:
        return
    hint = {401: " (GITHUB_TOKEN was refused)", 403: " (forbidden or rate-limited)", 404: " (not found)"}
    raise GateError(f"GET {url_for_log(url)} answered {resp.status_code}{hint.get(resp.status_code, '')}", check=check)


def _read_bounded(resp: requests.Response, limit: int, check: str) -> bytes:
    chunks, size = [], 0
    for block in _blocks(resp, check):
        size += len(block)
        if size > limit:
            raise GateError(f"the response passed {limit} bytes", check=check)
        chunks.append(block)
    return b"".join(chunks)


def _blocks(resp: requests.Response, check: str) -> Iterator[bytes]:
    try:
        yield from resp.iter_content(CHUNK)
    except requests.RequestException as exc:
        raise GateError(f"the transfer broke off: {exc.__class__.__name__}", check=check) from None
