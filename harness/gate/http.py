"""A small GitHub REST client: no proxies from the environment, no cookie jar, redirects followed by hand.

The token goes only to the API's own origin ``(scheme, host, port)``. A redirect to another origin keeps the
ordinary API headers (``Accept``, ``User-Agent``, ``X-GitHub-Api-Version``) and drops ``Authorization``,
``Proxy-Authorization`` and ``Cookie``; once a hop has left the API origin the token is never sent again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from http.cookiejar import Cookie, DefaultCookiePolicy
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit
from urllib.request import Request

import requests

from harness.errors import RecordError
from harness.gate import GateError
from harness.jsonio import loads_strict

API_VERSION = "2022-11-28"
ACCEPT = "application/vnd.github+json"
USER_AGENT = "miniverl-release-gate/1"
MAX_HOPS = 3
MAX_PAGES = 50
MAX_JSON_BYTES = 16 << 20
REDIRECTS = {301, 302, 303, 307, 308}
CHUNK = 1 << 16
TIMEOUT = (10.0, 60.0)

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


class _NoCookies(DefaultCookiePolicy):
    """Never store a cookie and never send one: the session has no usable cookie jar."""

    def set_ok(self, cookie: Cookie, request: Request) -> bool:
        return False

    def return_ok(self, cookie: Cookie, request: Request) -> bool:
        return False


class GitHubClient:
    def __init__(self, api_url: str, token: str) -> None:
        self.api = api_url.rstrip("/")
        self.api_origin = origin(self.api)
        self._token = token
        self.session = requests.Session()
        self.session.trust_env = False  # no proxies, netrc or CA bundles from the environment
        self.session.proxies = {}
        self.session.headers.clear()
        self.session.cookies.set_policy(_NoCookies())

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

    def open(self, url: str, check: str) -> requests.Response:
        """GET ``url`` (streamed), following at most ``MAX_HOPS`` redirects by hand."""
        current, trusted = url, True
        for _hop in range(MAX_HOPS + 1):
            here = origin(current)
            trusted = trusted and here == self.api_origin
            try:
                resp = self.session.get(
                    current, headers=self.headers(trusted), allow_redirects=False, stream=True, timeout=TIMEOUT
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
        resp = self.open(url, "api_connection")
        with resp:
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
        resp = self.open(url, "artifact_download")
        digest, size = hashlib.sha256(), 0
        with resp:
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
