"""A task call's multipart form, read as it streams: its files spooled to disk, never held.

An upload over ``FITBOX_UPLOAD_MAX`` is refused before it is read whole: at once when the
request's Content-Length says so, else as soon as the file's bytes pass the limit (the
connection is closed: its body was not read). Each file is hashed (sha256) and counted as
it is written, so the call row can say what came in without the box reading it again.
A body that ends before its closing boundary is refused as truncated; the spooled files
are removed on every way out (``Form.remove``, called by the route after its call).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from starlette.requests import ClientDisconnect, Request

from fitbox.errors import InvalidRequest, UploadTooLarge
from fitbox.units import format_bytes

FIELD_MAX = 64 << 10  # a text field (a prompt, a language): far above any real one
HEAD_MAX = 16 << 10  # one part's headers
FORM_SLACK = 1 << 20  # what a form may add around its file (boundaries, headers, fields)
_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)
_PARAM = re.compile(r';\s*([a-zA-Z*]+)="((?:[^"\\]|\\.)*)"')


@dataclass
class Upload:
    """One file of the form, spooled: where, how large, its sha256, and what the client
    called it (its ``filename``, used only for its extension)."""

    field: str
    filename: str
    content_type: str
    path: Path
    size: int = 0
    sha256: str = ""


@dataclass
class Form:
    fields: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, Upload] = field(default_factory=dict)

    def value(self, name: str) -> str | None:
        found = self.fields.get(name)
        return found[-1] if found else None

    def remove(self) -> None:
        """Every spooled file gone (a route calls this when its call ended, however)."""
        for upload in self.files.values():
            upload.path.unlink(missing_ok=True)


def boundary_of(request: Request) -> bytes:
    content_type = request.headers.get("content-type", "")
    found = _BOUNDARY.search(content_type)
    if not content_type.lower().startswith("multipart/form-data") or found is None:
        raise InvalidRequest(
            "This route takes a multipart/form-data body (a file field and text fields), "
            f"not '{content_type or 'no content type'}'.",
            code="not_multipart",
        )
    return found.group(1).encode()


def _too_large(said: str, limit: int) -> UploadTooLarge:
    return UploadTooLarge(
        f"The upload {said}; this box takes uploads of at most {format_bytes(limit)} "
        "(FITBOX_UPLOAD_MAX).",
        param="file",
    )


class _Parser:
    """The states of a multipart body: preamble, a part's headers, its data, the end."""

    def __init__(self, boundary: bytes, spool: Path, limit: int) -> None:
        self.delimiter = b"\r\n--" + boundary
        self.buffer = b"\r\n"  # the first delimiter has no CRLF before it: lend it one
        self.state = "preamble"
        self.form = Form()
        self.spool, self.limit = spool, limit
        self.part: Upload | None = None
        self.sink: IO[bytes] | None = None
        self.digest = hashlib.sha256()
        self.text = b""
        self.name = ""

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        while self._step():
            pass

    def _step(self) -> bool:
        if self.state == "preamble":
            at = self.buffer.find(self.delimiter)
            if at < 0:
                self.buffer = self.buffer[-len(self.delimiter) :]
                return False
            self.buffer, self.state = self.buffer[at + len(self.delimiter) :], "after"
            return True
        if self.state == "after":
            if len(self.buffer) < 2:
                return False
            end, self.buffer = self.buffer[:2], self.buffer[2:]
            self.state = "done" if end == b"--" else "head"
            if end not in (b"--", b"\r\n"):
                raise InvalidRequest("The multipart body is malformed after a boundary.")
            return self.state == "head"
        if self.state == "head":
            at = self.buffer.find(b"\r\n\r\n")
            if at < 0:
                if len(self.buffer) > HEAD_MAX:
                    raise InvalidRequest("A multipart part's headers are too long.")
                return False
            self._begin(self.buffer[:at].decode("utf-8", "replace"))
            self.buffer, self.state = self.buffer[at + 4 :], "data"
            return True
        if self.state == "data":
            at = self.buffer.find(self.delimiter)
            keep = len(self.delimiter) - 1 if at < 0 else 0
            upto = at if at >= 0 else max(len(self.buffer) - keep, 0)
            self._data(self.buffer[:upto])
            self.buffer = self.buffer[upto:]
            if at < 0:
                return False
            self._end()
            self.buffer, self.state = self.buffer[len(self.delimiter) :], "after"
            return True
        return False  # done: an epilogue is ignored

    def _begin(self, head: str) -> None:
        headers = {}
        for line in head.split("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        params = dict(_PARAM.findall(headers.get("content-disposition", "")))
        self.name = params.get("name", "")
        if "filename" in params:
            suffix = Path(params["filename"]).suffix[:16]
            path = self.spool / f"{secrets.token_hex(8)}{suffix if suffix.isascii() else ''}"
            self.part = Upload(self.name, params["filename"], headers.get("content-type", ""), path)
            self.sink = path.open("xb")
            self.digest = hashlib.sha256()
        else:
            self.part, self.text = None, b""

    def _data(self, data: bytes) -> None:
        if not data:
            return
        if self.part is None:
            self.text += data
            if len(self.text) > FIELD_MAX:
                raise InvalidRequest(f"The form field '{self.name}' is too long.", param=self.name)
            return
        assert self.sink is not None
        self.part.size += len(data)
        if self.part.size > self.limit:
            raise _too_large("grew past the limit while it was read", self.limit)
        self.sink.write(data)
        self.digest.update(data)

    def _end(self) -> None:
        if self.part is None:
            text = self.text.decode("utf-8", "replace")
            self.form.fields.setdefault(self.name, []).append(text)
            return
        assert self.sink is not None
        self.sink.close()
        self.sink = None
        self.part.sha256 = self.digest.hexdigest()
        self.form.files[self.part.field] = self.part
        self.part = None

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
            if self.part is not None:
                self.part.path.unlink(missing_ok=True)


async def read_form(request: Request, spool: Path, limit: int) -> Form:
    """The form, its files spooled under ``spool``; raises (every file removed) when the
    body is not a form, is over the limit, or ends before its closing boundary."""
    boundary = boundary_of(request)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > 18 or int(declared) > limit + FORM_SLACK):
        raise _too_large(f"is {declared} bytes (Content-Length)", limit)
    await asyncio.to_thread(spool.mkdir, mode=0o700, parents=True, exist_ok=True)
    parser = _Parser(boundary, spool, limit)
    try:
        async for chunk in request.stream():
            parser.feed(chunk)
        if parser.state != "done":
            raise InvalidRequest(
                "The multipart body ended before its closing boundary (truncated): send the "
                "whole form.",
                code="truncated_body",
            )
    except ClientDisconnect:
        parser.close()
        parser.form.remove()
        raise InvalidRequest("The client went away mid-upload.", code="truncated_body") from None
    except BaseException:
        parser.close()
        parser.form.remove()
        raise
    return parser.form


def spool_empty(spool: Path) -> bool:
    """Whether no upload is spooled now (tests and /health read it)."""
    try:
        return not any(os.scandir(spool))
    except FileNotFoundError:
        return True
