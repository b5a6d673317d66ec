"""Box-to-box transfer, the source's side (management: an admin key or the box itself,
server/door/auth.py). ``GET /v1/transfer/{model}/manifest`` lists the model's files with sizes
and sha256; ``…/chunksums?path=`` the sha256 of each fixed chunk; ``…/file?path=`` streams
a file, with ``Range: bytes=…`` answered 206. Paths are jailed (models/transfer.py); at most
``transfer_max`` files are sent at once, one more is answered 429 with Retry-After.
``GET /v1/hashes`` lists every hash this box keeps."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from fitbox.box.box import Box
from fitbox.box.transfers import HashKeeper
from fitbox.errors import PathNotOffered, RangeNotSatisfiable, RouteNotFound, TooManyTransfers
from fitbox.models.transfer import READ_BLOCK, OfferedFile, PathRefused, model_files, offered
from fitbox.store import hashes
from fitbox.store.db import Store
from fitbox.store.waits import read

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
RETRY_AFTER_S = 2.0
# ASGI's extension for a file sent by the server (server/manage/zerocopy.py offers it under uvicorn)
ZEROCOPY = "http.response.zerocopysend"


class Transfers:
    """The box's transfer slots and hash keeper, on ``app.state.transfers``."""

    def __init__(self, store: Store, limit: int) -> None:
        self.keeper = HashKeeper(store)
        self.limit = limit
        self.active = 0  # changed on the event loop only

    def take(self) -> Callable[[], None]:
        if self.active >= self.limit:
            raise TooManyTransfers(
                f"This box is sending {self.active} files, its cap (transfer_max "
                f"{self.limit}); try again shortly.",
                retry_after=RETRY_AFTER_S,
            )
        self.active += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.active -= 1

        return release


def hash_keeper(request: Request) -> HashKeeper:
    """The box's one keeper of hashes (hashed once, whoever asks)."""
    return _transfers(request).keeper


def _transfers(request: Request) -> Transfers:
    found: Transfers | None = getattr(request.app.state, "transfers", None)
    if found is None:
        store: Store = request.app.state.store
        found = Transfers(store, request.app.state.config.transfer_max)
        request.app.state.transfers = found
    return found


def _offered(request: Request) -> OfferedFile:
    """The file ``?path=`` names, of the model the route names; refused with the reason."""
    box: Box = request.app.state.box
    artifact = box.catalog.resolve(request.path_params["model"])
    try:
        return offered(artifact.path, request.query_params.get("path", ""))
    except PathRefused as exc:
        if exc.outside:
            raise PathNotOffered(f"Path refused: {exc.reason}.", param="path") from None
        raise RouteNotFound(
            f"{exc.reason}; GET /v1/transfer/{artifact.name}/manifest lists them.", param="path"
        ) from None


async def manifest(request: Request) -> Response:
    box: Box = request.app.state.box
    artifact = box.catalog.resolve(request.path_params["model"])
    keeper = _transfers(request).keeper
    files = []
    for f in model_files(artifact.path):
        kept = await anyio.to_thread.run_sync(keeper.kept, f)
        files.append({"path": f.name, "bytes": f.size, "sha256": kept.sha256})
    return JSONResponse({"model": artifact.name, "files": files})


async def chunksums(request: Request) -> Response:
    f = _offered(request)
    kept = await anyio.to_thread.run_sync(_transfers(request).keeper.kept, f)
    return JSONResponse(
        {
            "path": f.name,
            "bytes": f.size,
            "sha256": kept.sha256,
            "chunk_bytes": kept.chunk_bytes,
            "chunks": list(kept.chunks),
        }
    )


def _range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a single ``bytes=`` range, or None for the whole file."""
    if not header:
        return None
    found = _RANGE.match(header.strip())
    if not found or found.groups() == ("", ""):
        raise RangeNotSatisfiable(
            f"Range {header!r} is not one 'bytes=FIRST-[LAST]' range.", param="range"
        )
    first, last = found.groups()
    if first == "":  # the last N bytes
        start, end = max(0, size - int(last)), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    if start >= size or start > end:
        raise RangeNotSatisfiable(
            f"Range {header!r} is outside the file's {size} bytes.",
            param="range",
            content_range=f"bytes */{size}",
        )
    return start, end


class _Sending(StreamingResponse):
    """A streamed file that gives its transfer slot back however the stream ends."""

    def __init__(
        self,
        body: AsyncIterator[bytes],
        release: Callable[[], None],
        status: int,
        headers: dict[str, str],
    ) -> None:
        super().__init__(
            body, status_code=status, headers=headers, media_type="application/octet-stream"
        )
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def _read(f: OfferedFile, start: int, end: int) -> AsyncIterator[bytes]:
    """The bytes start..end of the file, a block at a time (never the whole file)."""
    handle = await anyio.open_file(f.real, "rb")
    try:
        await handle.seek(start)
        left = end - start + 1
        while left > 0:
            block = await handle.read(min(READ_BLOCK, left))
            if not block:
                return  # the file shrank: the client sees a short body and resumes
            left -= len(block)
            yield block
    finally:
        await handle.aclose()


class _SendingFile(Response):
    """The file's bytes start..end sent by the server with ``sendfile`` (the
    ``http.response.zerocopysend`` extension of server/manage/zerocopy.py: page cache to socket,
    no block through Python); the transfer slot given back however it ends."""

    def __init__(
        self,
        f: OfferedFile,
        start: int,
        end: int,
        release: Callable[[], None],
        status: int,
        headers: dict[str, str],
    ) -> None:
        super().__init__(status_code=status, headers=headers, media_type="application/octet-stream")
        self._file, self._start, self._end, self._release = f, start, end, release
        self._given = headers  # for the streamed path, should the file be gone

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            handle = await anyio.to_thread.run_sync(open, self._file.real, "rb")
        except OSError:  # gone since it was offered: streamed, it ends as it always did
            streamed = _read(self._file, self._start, self._end)
            gone = _Sending(streamed, self._release, self.status_code, self._given)
            await gone(scope, receive, send)
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            await send(
                {
                    "type": ZEROCOPY,
                    "file": handle,
                    "offset": self._start,
                    "count": self._end - self._start + 1,
                    "more_body": True,
                }
            )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            handle.close()
            self._release()


async def file(request: Request) -> Response:
    f = _offered(request)
    wanted = _range(request.headers.get("range"), f.size)
    start, end = wanted or (0, f.size - 1)
    headers = {"accept-ranges": "bytes", "content-length": str(max(0, end - start + 1))}
    if wanted:
        headers["content-range"] = f"bytes {start}-{end}/{f.size}"
    release = _transfers(request).take()
    status = 206 if wanted else 200
    if ZEROCOPY in request.scope.get("extensions", {}):
        return _SendingFile(f, start, end, release, status, headers)
    return _Sending(_read(f, start, end), release, status, headers)


async def kept_hashes(request: Request) -> Response:
    """Every kept hash; ``?artifact=PATH`` (a model file of this box's catalog, as its own
    telemetry names it, nothing else) hashes that one once and lists it alone."""
    store: Store = request.app.state.store
    wanted = request.query_params.get("artifact")
    if wanted is None:
        found = await read(store.path, hashes.every, "list the kept hashes")
        return JSONResponse({"object": "list", "data": [k.public() for k in found]})
    box: Box = request.app.state.box
    artifact = next((a for a in box.catalog.artifacts() if a.key == wanted), None)
    if artifact is None:
        raise RouteNotFound(
            "No model file of this box is at that path; GET /v1/models lists the models.",
            param="artifact",
        )
    try:
        identity = artifact.identity()
        real = artifact.path.resolve()
    except OSError:
        raise RouteNotFound(
            "That model file is gone since the catalog saw it.", param="artifact"
        ) from None
    f = OfferedFile(artifact.path.name, artifact.path, real, identity.size, identity.mtime_ns)
    kept = await anyio.to_thread.run_sync(hash_keeper(request).kept, f)
    return JSONResponse({"object": "list", "data": [kept.public()]})
