"""A real loopback GitHub for the release-gate tests: the REST API on one port, blob storage on another.

Both are ``http.server.ThreadingHTTPServer`` instances on 127.0.0.1 (different ports, so a redirect from
one to the other crosses origins). Every request's headers are recorded. Nothing here is a mock: the gate
talks HTTP to these servers exactly as it would to api.github.com and its blob store.
"""

from __future__ import annotations

import hashlib
import io
import json
import stat
import threading
import time
import warnings
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

REPO = "acme/miniverl"
RUN_ID = 4242
WORKFLOW_PATH = ".github/workflows/gpu.yml"
COOKIE = "gh_sess=cookie-from-the-api"


def future(days: int = 20) -> str:
    return (datetime.now(UTC) + timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def zip_dir(src: Path) -> bytes:
    """A zip like actions/upload-artifact makes: regular files with Unix modes, paths relative to ``src``."""
    return zip_members([(p.relative_to(src).as_posix(), p.read_bytes()) for p in sorted(src.rglob("*")) if p.is_file()])


def zip_members(members: list[tuple[str, bytes]], links: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns on the duplicate member some tests write on purpose
        with zipfile.ZipFile(buf, "w") as zf:
            for name, data in members:
                info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
                info.create_system = 3
                kind = stat.S_IFLNK | 0o777 if name in links else stat.S_IFREG | 0o644
                info.external_attr = kind << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
    return buf.getvalue()


def unzip(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return [(i.filename, zf.read(i)) for i in zf.infolist()]


@dataclass
class World:
    """What the fake GitHub serves; tests edit it before running the gate."""

    token: str
    sha: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    artifacts: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    blobs: dict[int, bytes] = field(default_factory=dict)
    redirect: str = "cross"  # cross (API -> blob port), same (API -> API), loop (API -> itself)
    page_size: int = 100
    api_seen: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    blob_seen: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    api_url: str = ""
    blob_url: str = ""
    next_artifact: int = 700
    link_base: str | None = None  # where Link rel="next" points (default: the API itself)
    blob_length: bool = True  # False: the blob is sent without Content-Length, until the connection closes
    api_prefix: str = ""  # the API's path under its origin (GitHub Enterprise: /api/v3); see serve_under
    drip: str = ""  # "blob": each blob's body, "api": each API answer's headers, one byte every drip_every s
    drip_every: float = 2.0

    def serve_under(self, prefix: str) -> None:
        """Serve the API only under ``prefix`` (anything else is 404), as GitHub Enterprise does."""
        self.api_prefix = prefix
        self.api_url += prefix

    def run(self, run_id: int = RUN_ID, **over: Any) -> dict[str, Any]:
        value = {
            "id": run_id,
            "name": "gpu",
            "head_sha": self.sha,
            "head_branch": "main",
            "event": "workflow_dispatch",
            "status": "completed",
            "conclusion": "success",
            "run_attempt": 1,
            "run_number": 7,
            "workflow_id": 11,
            "path": WORKFLOW_PATH,
            "repository": {"id": 1, "full_name": REPO},
            "head_repository": {"id": 1, "full_name": REPO},
            "created_at": "2026-11-30T10:00:00Z",
        }
        value.update(over)
        self.runs.append(value)
        return value

    def drop(self, run_id: int, *names: str) -> None:
        """The run no longer lists its artifacts named ``names``."""
        self.artifacts[run_id] = [a for a in self.artifacts[run_id] if a["name"] not in names]

    def replace(self, run_id: int, name: str, blob: bytes) -> dict[str, Any]:
        """The run's artifact ``name`` is a new one holding ``blob``."""
        self.drop(run_id, name)
        return self.artifact(run_id, name, blob)

    def artifact(self, run_id: int, name: str, blob: bytes, **over: Any) -> dict[str, Any]:
        self.next_artifact += 1
        aid = self.next_artifact
        self.blobs[aid] = blob
        value = {
            "id": aid,
            "node_id": f"MDg6QXJ0aWZhY3Q{aid}",
            "name": name,
            "size_in_bytes": len(blob),
            "url": f"{self.api_url}/repos/{REPO}/actions/artifacts/{aid}",
            "archive_download_url": f"{self.api_url}/repos/{REPO}/actions/artifacts/{aid}/zip",
            "expired": False,
            "created_at": "2026-11-30T10:30:00Z",
            "updated_at": "2026-11-30T10:30:00Z",
            "expires_at": future(),
            "digest": "sha256:" + hashlib.sha256(blob).hexdigest(),
            "workflow_run": {
                "id": run_id,
                "repository_id": 1,
                "head_repository_id": 1,
                "head_branch": "main",
                "head_sha": self.sha,
            },
        }
        value.update(over)
        self.artifacts.setdefault(run_id, []).append(value)
        return value

    def headers_at(self, seen: list[tuple[str, list[tuple[str, str]]]], prefix: str) -> list[dict[str, str]]:
        return [{k.lower(): v for k, v in headers} for path, headers in seen if path.startswith(prefix)]


def _handler(world: World, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if role == "api":
                self.send_header("Set-Cookie", f"{COOKIE}; Path=/")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _drip(self, data: bytes) -> None:
            """One byte at a time, each flushed: every read the client makes returns before any read timeout."""
            try:
                for at in range(len(data)):
                    self.wfile.write(data[at : at + 1])
                    self.wfile.flush()
                    time.sleep(world.drip_every)
            except OSError:
                self.close_connection = True  # the client cut the connection: the point of the test

        def _json(self, value: Any, headers: dict[str, str] | None = None) -> None:
            self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})})

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            seen = world.api_seen if role == "api" else world.blob_seen
            seen.append((self.path, list(self.headers.items())))
            if role == "api" and world.drip == "api":
                self._drip(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                return
            path = parts.path
            if role == "api" and world.api_prefix:
                if not path.startswith(world.api_prefix + "/"):
                    self._send(404)
                    return
                path = path[len(world.api_prefix) :]
            segments = path.strip("/").split("/")
            if role == "blob" or segments[0] == "blob":
                self._blob(segments)
                return
            if self.headers.get("Authorization") != f"Bearer {world.token}":
                self._send(401, b'{"message":"Bad credentials"}')
                return
            self._api(segments, parse_qs(parts.query))

        def _blob(self, segments: list[str]) -> None:
            if role == "api" and self.headers.get("Authorization") != f"Bearer {world.token}":
                self._send(401)  # the API origin's own blob path needs the token (same-origin hop keeps it)
                return
            blob = world.blobs.get(int(segments[-1])) if segments[-1].isdigit() else None
            if blob is None:
                self._send(404)
                return
            if world.drip == "blob":
                self.send_response(200)
                self.send_header("Content-Type", "application/zip")
                self.send_header("Content-Length", str(len(blob)))
                self.end_headers()
                self._drip(blob)
                return
            if world.blob_length:
                self._send(200, blob, {"Content-Type": "application/zip"})
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/zip")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for at in range(0, len(blob), 1 << 16):
                self.wfile.write(blob[at : at + (1 << 16)])

        def _api(self, seg: list[str], query: dict[str, list[str]]) -> None:
            prefix = ["repos", *REPO.split("/"), "actions"]
            if seg[:4] != prefix:
                self._send(404)
                return
            rest = seg[4:]
            if len(rest) == 3 and rest[0] == "workflows" and rest[2] == "runs":
                self._runs(query)
            elif len(rest) == 3 and rest[0] == "runs" and rest[2] == "artifacts":
                arts = world.artifacts.get(int(rest[1]), [])
                self._json({"total_count": len(arts), "artifacts": arts})
            elif len(rest) == 3 and rest[0] == "artifacts" and rest[2] == "zip":
                aid = rest[1]
                target = {
                    "cross": f"{world.blob_url}/blob/{aid}?sig=signed",
                    "same": f"{world.api_prefix}/blob/{aid}",
                    "loop": f"{world.api_prefix}/repos/{REPO}/actions/artifacts/{aid}/zip",
                }[world.redirect]
                self._send(302, b"", {"Location": target})
            else:
                self._send(404)

        def _runs(self, query: dict[str, list[str]]) -> None:
            page = int(query.get("page", ["1"])[0])
            size = world.page_size
            chunk = world.runs[(page - 1) * size : page * size]
            headers = {}
            if page * size < len(world.runs):
                base = world.link_base or world.api_url.removesuffix(world.api_prefix)
                nxt = f"{base}{urlsplit(self.path).path}?head_sha={world.sha}&page={page + 1}"
                headers["Link"] = f'<{nxt}>; rel="next", <{nxt}>; rel="last"'
            self._json({"total_count": len(world.runs), "workflow_runs": chunk}, headers)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a client that stops reading (a refused oversize download) is expected, not an error


class Servers:
    """The API and blob servers for one test; ``close()`` stops both."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.api = _Server(("127.0.0.1", 0), _handler(world, "api"))
        self.blob = _Server(("127.0.0.1", 0), _handler(world, "blob"))
        world.api_url = f"http://127.0.0.1:{self.api.server_address[1]}"
        world.blob_url = f"http://127.0.0.1:{self.blob.server_address[1]}"
        self.threads = [
            threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            for s in (self.api, self.blob)
        ]
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        for server in (self.api, self.blob):
            server.shutdown()
            server.server_close()
