"""Loopback HTTP for tests: a directory served (an index, a mirror), and stand-in peers that
answer JSON (``JsonHandler``, ``serve_handler``)."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def serve_directory(root: Path) -> Iterator[str]:
    """Yields the base URL; the server stops when the block ends."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    def handler(*args: Any) -> Quiet:
        return Quiet(*args, directory=str(root))

    with serve_handler(handler) as url:
        yield url


class JsonHandler(http.server.BaseHTTPRequestHandler):
    """A handler of a stand-in peer (a central, a box) that answers JSON and logs nothing."""

    def send_json(self, body: Any, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers["content-length"])) or b"null")

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve_handler(handler: Callable[..., http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` (a handler class, or what makes one) served on loopback in a thread;
    yields the base URL, stopped at the end."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
