"""server/manage/zerocopy.py: ``http.response.zerocopysend`` under a real uvicorn on loopback (a
file's range sent with sendfile, in windows; a file shorter than its Content-Length ends
the connection and the server serves on), and the transfer route's streamed path where the
extension is not offered (an in-process client)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from fitbox import config
from fitbox.server.manage.zerocopy import WINDOW, ZEROCOPY, ZeroCopyHttpToolsProtocol

from .support.clients import app_client
from .support.ggufs import write_tiny_llama
from .support.holds import until


class FileApp:
    """``/BYTES?offset=&count=&length=``: the file's ``count`` bytes from ``offset`` sent
    with zerocopysend under a Content-Length of ``length``; records each scope's extensions."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offered: list[bool] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.offered.append(ZEROCOPY in scope.get("extensions", {}))
        q = dict(p.split("=") for p in scope["query_string"].decode().split("&"))
        offset, count = int(q["offset"]), int(q["count"])
        length = int(q.get("length", count))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(length).encode())],
            }
        )
        with self.path.open("rb") as f:
            if not self.offered[-1]:  # as the transfer route does: the bytes through Python
                f.seek(offset)
                await send({"type": "http.response.body", "body": f.read(count)})
                return
            await send(
                {"type": ZEROCOPY, "file": f, "offset": offset, "count": count, "more_body": True}
            )
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@contextlib.contextmanager
def served(app: Any, http: Any) -> Iterator[str]:
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=http, lifespan="off", log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        until(lambda: server.started, "uvicorn listening")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture
def big(tmp_path: Path) -> Path:
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(2 * WINDOW + 12345))
    return path


def test_a_range_goes_out_by_sendfile_in_windows(
    big: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.sendfile

    def counted(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        calls.append(count)  # a spy: the kernel still sends every byte
        return real(out_fd, in_fd, offset, count)

    monkeypatch.setattr(os, "sendfile", counted)
    app = FileApp(big)
    data = big.read_bytes()
    offset, count = 1000, len(data) - 2000  # a range across three windows
    with served(app, ZeroCopyHttpToolsProtocol) as url:
        got = httpx.get(f"{url}/x?offset={offset}&count={count}", timeout=60)
        again = httpx.get(f"{url}/x?offset=0&count=10", timeout=60)  # the server serves on
    assert got.status_code == 200 and got.content == data[offset : offset + count]
    assert again.content == data[:10]
    assert app.offered == [True, True]
    assert calls and max(calls) <= WINDOW


def test_a_file_shorter_than_its_length_ends_the_connection(big: Path) -> None:
    """A file that shrank (or a range past its end): the client sees a short body, as a
    cut, and resumes; the server closes that connection and serves the next."""
    size = big.stat().st_size
    with served(FileApp(big), ZeroCopyHttpToolsProtocol) as url:
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(f"{url}/x?offset={size - 100}&count=500&length=500", timeout=60)
        after = httpx.get(f"{url}/x?offset=5&count=5", timeout=60)
    assert after.content == big.read_bytes()[5:10]


def test_a_head_sends_no_body_and_the_connection_serves_on(big: Path) -> None:
    with served(FileApp(big), ZeroCopyHttpToolsProtocol) as url, httpx.Client() as client:
        head = client.head(f"{url}/x?offset=0&count=1000", timeout=60)
        after = client.get(f"{url}/x?offset=3&count=4", timeout=60)  # the same connection
    assert head.status_code == 200 and head.headers["content-length"] == "1000"
    assert head.content == b"" and after.content == big.read_bytes()[3:7]


def test_uvicorns_own_protocol_offers_no_zerocopy(big: Path) -> None:
    app = FileApp(big)
    with served(app, "httptools") as url:
        got = httpx.get(f"{url}/x?offset=0&count=10", timeout=60)
    assert app.offered == [False] and got.content == big.read_bytes()[:10]


def test_without_the_extension_the_transfer_route_streams_the_file(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")
    data = (models / "tiny.gguf").read_bytes()
    cfg = config.load(
        {"home": str(tmp_path / "home"), "models": str(models)}, env={"FITBOX_SIMULATED_GPUS": ""}
    )
    with app_client(cfg) as client:
        whole = client.get("/v1/transfer/tiny/file", params={"path": "tiny.gguf"})
        part = client.get(
            "/v1/transfer/tiny/file", params={"path": "tiny.gguf"}, headers={"range": "bytes=7-99"}
        )
    assert whole.status_code == 200 and whole.content == data
    assert part.status_code == 206 and part.content == data[7:100]
    assert part.headers["content-range"] == f"bytes 7-99/{len(data)}"
