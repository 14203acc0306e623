"""A Hugging Face hub stand-in on 127.0.0.1, serving what ``hf_hub_download`` requests (nothing downloaded).

``huggingface_hub`` (1.x) asks ``HEAD {endpoint}/{repo_id}/resolve/{revision}/{filename}`` for the file's metadata
and needs ``X-Repo-Commit`` (the commit it files the download under), an ``ETag`` and a ``Content-Length``; then
``GET`` of the same URL for the bytes. An unknown revision is a 404 with ``X-Error-Code: RevisionNotFound``, an
unknown file ``EntryNotFound``, an unknown repository ``RepoNotFound`` (the codes ``hf_raise_for_status`` maps to
its errors). ``answer_commit`` makes the hub answer every request from another commit (a hub that moved a ref).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote


@dataclass
class FakeHub:
    repos: dict[tuple[str, str], dict[str, bytes]] = field(default_factory=dict)  # (repo_id, commit) -> files
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    answer_commit: str | None = None
    endpoint: str = ""

    def add_dir(self, repo_id: str, commit: str, directory: Path) -> dict[str, str]:
        """Serve every file of ``directory`` as ``repo_id`` at ``commit``; returns ``{name: sha256}``."""
        files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}
        self.repos[(repo_id, commit)] = files
        return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _error(self, code: str) -> None:
            self.send_response(404)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _answer(self, *, body: bool) -> None:
            path = unquote(self.path.split("?", 1)[0])
            hub.requests.append((self.command, path))
            parts = path.strip("/").split("/")
            if len(parts) < 5 or parts[2] != "resolve":
                return self._error("RepoNotFound")
            repo_id, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if not any(repo == repo_id for repo, _ in hub.repos):
                return self._error("RepoNotFound")
            files = hub.repos.get((repo_id, revision))
            if files is None:
                return self._error("RevisionNotFound")
            if filename not in files:
                return self._error("EntryNotFound")
            data = files[filename]
            self.send_response(200)
            self.send_header("X-Repo-Commit", hub.answer_commit or revision)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler


@contextmanager
def serve(hub: FakeHub) -> Iterator[FakeHub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
