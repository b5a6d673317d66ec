"""A directory served over HTTP on loopback, for tests that need an index or a mirror."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
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

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
