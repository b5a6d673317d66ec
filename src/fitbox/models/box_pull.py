"""Pull a model from another fitbox (``box://HOST:PORT/MODEL``), trusting no byte unchecked.

For each file the source's manifest lists: its chunksums are fetched; a ``.part`` left by an
earlier pull is kept up to its last chunk that still verifies (those bytes are not fetched
again); the rest is fetched with one ranged GET, each chunk checked against its sha256 as it
lands (a chunk that does not match is cut off and fetched again, a bounded number of times);
a cut connection resumes at the last verified chunk; the whole file's sha256 is checked;
then the ``.part`` is renamed into place. Nothing the source names is trusted as a path:
each name must be a plain file name (models/transfer.py ``refuse_name``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import http.client
import json
import os
import re
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlencode

import httpx

from fitbox.models.pull import PullError
from fitbox.models.transfer import PathRefused, refuse_name

_SPEC = re.compile(
    r"^box://(?P<host>\[[0-9A-Fa-f:.]+\]|[^/:\[\]]+):(?P<port>\d{1,5})/(?P<model>[^/]+)$"
)
RETRY_AFTER_AT_MOST_S = 10.0
CHECK_AHEAD = 2  # chunks read past the oldest one still being checked

# (kind, file name, chunk index): "chunk_ok", "chunk_bad", "reused", "cut"
Events = Callable[[str, str, int], None]


class PullRefused(PullError):
    """The pull was not started: the bytes are already here, or there is no room."""


@dataclass(frozen=True)
class BoxSource:
    host: str
    port: int
    model: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"box://{self.host}:{self.port}/{self.model}"


def parse_box_spec(spec: str) -> BoxSource:
    found = _SPEC.match(spec)
    if not found or not 0 < int(found.group("port")) < 65536:
        raise PullError(f"{spec!r} is not box://HOST:PORT/MODEL")
    return BoxSource(found.group("host"), int(found.group("port")), found.group("model"))


@dataclass
class FileOutcome:
    """One file's pull, as the ``pulls`` row records it."""

    name: str
    path: Path
    size: int
    sha256: str
    fetched_bytes: int = 0  # body bytes read from the network
    reused_chunks: int = 0  # verified in a .part left by an earlier pull: not fetched
    refetched_chunks: int = 0  # refused (sha256 mismatch) and fetched again
    cuts: int = 0  # connections lost mid-file, resumed
    seconds: float = 0.0
    error: str | None = None
    chunk_bytes: int = 0
    chunks: tuple[str, ...] = ()


@dataclass
class BoxPull:
    """One pull of one model from one box into ``dest_dir``."""

    source: BoxSource
    dest_dir: Path
    key: str | None = None
    attempts: int = 5  # connections lost in a row (no chunk verified between) before giving up
    chunk_retries: int = 3  # times one chunk may fail its sha256 before the pull gives up
    events: Events | None = None
    # the path of a file here with this sha256 (the store's kept hashes), if any
    already_here: Callable[[str], Path | None] = lambda sha256: None
    # why ``needed`` more bytes do not fit on the destination (None: they fit)
    no_room: Callable[[int], str | None] = lambda needed: None
    # asked to free ``needed`` bytes when they do not fit (the reap_to_fit mover), if set
    make_room: Callable[[int], None] | None = None
    timeout_s: float = 60.0
    http: httpx.Client | None = None
    outcomes: list[FileOutcome] = field(default_factory=list)

    def _client(self) -> httpx.Client:
        if self.http is None:
            headers = {"authorization": f"Bearer {self.key}"} if self.key else {}
            timeout = httpx.Timeout(self.timeout_s, connect=10.0)
            self.http = httpx.Client(base_url=self.source.url, headers=headers, timeout=timeout)
        return self.http

    def close(self) -> None:
        if self.http is not None:
            self.http.close()

    def _event(self, kind: str, name: str, index: int) -> None:
        if self.events:
            self.events(kind, name, index)

    def _get_json(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        for _ in range(3):
            try:
                response = self._client().get(path, params=params)
            except httpx.HTTPError as exc:
                raise PullError(f"{self.source}: {path} could not be fetched: {exc}") from exc
            if response.status_code == 429:
                _wait_retry_after(response)
                continue
            if response.status_code != 200:
                raise PullError(f"{self.source} answered {path} with HTTP "
                                f"{response.status_code}: {_reason(response)}")  # fmt: skip
            body: dict[str, Any] = response.json()
            return body
        raise PullError(f"{self.source} is busy sending other transfers; try again later")

    def manifest(self) -> dict[str, Any]:
        return self._get_json(f"{self._route}/manifest")

    @property
    def _route(self) -> str:
        return f"/v1/transfer/{quote(self.source.model, safe='')}"

    def run(self) -> list[FileOutcome]:
        """Pull every file of the model; raises :class:`PullError` on the first that fails
        (its outcome, with the error, is in ``outcomes``)."""
        manifest = self.manifest()
        files = manifest.get("files") or []
        if not files:
            raise PullError(f"{self.source} offers no file of {self.source.model} (a model "
                            "whose GGUF links out of its directory is never offered)")  # fmt: skip
        for f in files:
            try:
                refuse_name(str(f["path"]))
            except PathRefused as exc:
                raise PullError(f"{self.source} offered an unsafe path: {exc.reason}") from None
        self._refuse_if_here(files)
        self.dest_dir.mkdir(parents=True, exist_ok=True)
        needed = sum(int(f["bytes"]) - _size(self.dest_dir / f"{f['path']}.part") for f in files)
        reason = self.no_room(max(0, needed))
        if reason and self.make_room is not None:
            self.make_room(max(0, needed))
            reason = self.no_room(max(0, needed))
        if reason:
            raise PullRefused(reason)
        for f in files:
            outcome = FileOutcome(f["path"], self.dest_dir / f["path"], int(f["bytes"]),
                                  str(f["sha256"]))  # fmt: skip
            self.outcomes.append(outcome)
            started = time.monotonic()
            try:
                self._pull_file(outcome)
            except PullError as exc:
                outcome.error = str(exc)
                raise
            finally:
                outcome.seconds = time.monotonic() - started
        return self.outcomes

    def _refuse_if_here(self, files: list[dict[str, Any]]) -> None:
        for f in files:
            here = self.already_here(str(f["sha256"]))
            if here is not None:
                raise PullRefused(f"{f['path']} is already here, the same bytes (sha256 "
                                  f"{f['sha256'][:12]}…) at {here}")  # fmt: skip
            if (self.dest_dir / f["path"]).exists():
                raise PullRefused(f"{self.dest_dir / f['path']} exists with other bytes than "
                                  f"{self.source}'s; move it away to pull this one")  # fmt: skip

    def _pull_file(self, outcome: FileOutcome) -> None:
        sums = self._get_json(f"{self._route}/chunksums",
                              {"path": outcome.name})  # fmt: skip
        chunk_bytes, chunks = int(sums["chunk_bytes"]), [str(c) for c in sums["chunks"]]
        if sums.get("sha256") != outcome.sha256 or len(chunks) != -(-outcome.size // chunk_bytes):
            raise PullError(f"{self.source}: the chunksums of {outcome.name} do not match its "
                            "manifest (did the file change?); pull again")  # fmt: skip
        outcome.chunk_bytes, outcome.chunks = chunk_bytes, tuple(chunks)
        part = outcome.path.with_name(outcome.path.name + ".part")
        with part.open("r+b" if part.exists() else "wb") as out, Landing(out, part) as land:
            done = _reuse_part(part, chunks, chunk_bytes, outcome.size, land)
            outcome.reused_chunks = done
            for index in range(done):
                self._event("reused", outcome.name, index)
            failures = {index: 0 for index in range(len(chunks))}
            lost_in_a_row = 0
            out.truncate(done * chunk_bytes)
            while done < len(chunks):
                before = done
                done, cut = self._fetch_from(outcome, out, chunks, done, land, failures)
                if not cut:
                    continue
                outcome.cuts += 1
                lost_in_a_row = 0 if done > before else lost_in_a_row + 1
                self._event("cut", outcome.name, done)
                if lost_in_a_row >= self.attempts:
                    raise PullError(f"{self.source}: the connection was lost {lost_in_a_row}"
                                    f" times at chunk {done} of {outcome.name}; {done} of "
                                    f"{len(chunks)} chunks are kept in {part} and a new "
                                    "pull resumes there")  # fmt: skip
            digest = land.finish()  # every write landed, then one fsync
        if digest != outcome.sha256:
            part.unlink()
            raise PullError(f"{outcome.name}: every chunk verified but the whole file's sha256 "
                            f"is {digest}, not {outcome.sha256}; nothing was kept")  # fmt: skip
        os.replace(part, outcome.path)
        _sync_dir(outcome.path.parent)

    def _fetch_from(
        self, outcome: FileOutcome, out: Any, chunks: list[str], done: int, land: Landing,
        failures: dict[int, int],
    ) -> tuple[int, bool]:  # fmt: skip
        """Stream from chunk ``done`` on, each chunk read whole into its own buffer, checked
        on ``land``'s checking thread while the next is read, and only then handed to
        ``land`` (written and fed to the whole file's sha256 on its landing thread): (chunks
        done, whether the connection was cut). The bulk bytes go through
        http.client's ``readinto``, straight from the socket into the chunk's buffer
        (httpx's per-block parsing cost most of a core here)."""
        chunk_bytes = outcome.chunk_bytes
        start = done * chunk_bytes
        conn = http.client.HTTPConnection(self.source.host.strip("[]"), self.source.port,
                                          timeout=self.timeout_s)  # fmt: skip
        path = f"{self._route}/file?{urlencode({'path': outcome.name})}"
        headers = {"range": f"bytes={start}-"}
        if self.key:
            headers["authorization"] = f"Bearer {self.key}"
        # chunks read and being checked on their thread, in order: the socket is read on
        checking: deque[tuple[bytearray, Future[str]]] = deque()

        def settle(keep: int) -> bool:
            """Land the checked chunks beyond the ``keep`` newest; False at a bad one."""
            nonlocal done
            while len(checking) > keep:
                buffer, digest = checking.popleft()
                if digest.result() != chunks[done]:
                    checking.clear()
                    failures[done] += 1
                    outcome.refetched_chunks += 1
                    self._event("chunk_bad", outcome.name, done)
                    if failures[done] > self.chunk_retries:
                        raise PullError(f"{self.source}: chunk {done} of {outcome.name} failed "
                                        f"its sha256 {failures[done]} times; the source's file "
                                        "may be damaged or changing")  # fmt: skip
                    return False
                land.write(buffer)
                self._event("chunk_ok", outcome.name, done)
                done += 1
            return True

        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            if response.status == 429:  # counted as a lost connection
                _wait(response.getheader("retry-after"))
                return done, True
            if response.status not in (200, 206) or (response.status == 200 and start):
                raise PullError(f"{self.source} answered the file {outcome.name} with HTTP "
                                f"{response.status}: {_reason_of(response.read())}")  # fmt: skip
            land.drain()  # nothing of an earlier connection is still being written
            out.seek(start)
            cut = False
            read = done
            while read < len(chunks):
                want = min(chunk_bytes, outcome.size - read * chunk_bytes)
                buffer = bytearray(want)
                view, filled = memoryview(buffer), 0
                while filled < want:
                    got = response.readinto(view[filled:])
                    if not got:
                        break
                    filled += got
                    outcome.fetched_bytes += got
                if filled < want:
                    cut = True  # the body ended short
                    break
                checking.append((buffer, land.check(buffer)))
                read += 1
                if not settle(CHECK_AHEAD):
                    return done, False  # fetched again from the bad chunk, on a new connection
            all_good = settle(0)
            return done, cut and all_good
        except (OSError, http.client.HTTPException):
            all_good = settle(0)  # the whole chunks read before the cut still land
            return done, all_good  # a bad one among them: fetched again, not a cut
        finally:
            conn.close()
            land.drain()


class Landing:
    """Verified chunks, landed in order on a thread of their own: written to the staging
    file and fed to the whole file's sha256 from the same buffer (both let go of the GIL,
    so the network, each chunk's check, the disk and the whole hash overlap), the
    write-back of each 32 MiB started as it lands (``sync_file_range``, not waited for);
    ``finish`` waits for the last write and fsyncs once."""

    IN_FLIGHT = 4  # chunks handed over and not yet landed, at most (16 MiB)

    def __init__(self, out: BinaryIO, part: Path) -> None:
        self._out, self._part, self._fd = out, part, out.fileno()
        self._digest = hashlib.sha256()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="pull-landing")
        self._checker = ThreadPoolExecutor(1, thread_name_prefix="pull-check")
        self._pending: deque[Future[None]] = deque()
        self._unsynced_from: int | None = None

    def _land(self, data: bytes | bytearray, write: bool) -> None:
        if write:
            try:
                at = self._out.tell()
                self._out.write(data)
                self._out.flush()
            except OSError as exc:  # a full or failing disk: no cut, no retry helps
                raise PullError(f"could not write {self._part}: {exc}") from exc
            if self._unsynced_from is None:
                self._unsynced_from = at
            if at + len(data) - self._unsynced_from >= WRITE_BACK_BYTES:
                start_write_back(self._fd, self._unsynced_from, at + len(data))
                self._unsynced_from = None
        self._digest.update(data)

    def _hand(self, data: bytes | bytearray, write: bool) -> None:
        while len(self._pending) >= self.IN_FLIGHT:
            self._pending.popleft().result()
        self._pending.append(self._worker.submit(self._land, data, write))

    def check(self, data: bytes | bytearray) -> Future[str]:
        """A chunk's sha256 (hex), computed on the checking thread."""
        return self._checker.submit(_sha256_hex, data)

    def write(self, data: bytes | bytearray) -> None:
        """A verified chunk: written at the file's position, then hashed."""
        self._hand(data, True)

    def feed(self, data: bytes | bytearray) -> None:
        """A chunk already in the file (a resumed ``.part``): hashed only."""
        self._hand(data, False)

    def drain(self) -> None:
        """Wait for every chunk handed over (a write error is raised here)."""
        while self._pending:
            self._pending.popleft().result()

    def finish(self) -> str:
        """The whole file's sha256, once every chunk landed and the file is on the disk."""
        self.drain()
        os.fsync(self._fd)
        return self._digest.hexdigest()

    def __enter__(self) -> Landing:
        return self

    def __exit__(self, *_: object) -> None:
        self._checker.shutdown(wait=True)
        self._worker.shutdown(wait=True)


def _sha256_hex(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


def _sync_file_range() -> Callable[[int, int, int], None] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]

    def start(fd: int, offset: int, count: int) -> None:
        call(fd, offset, count, SYNC_FILE_RANGE_WRITE)  # a failure only costs the overlap

    return start


SYNC_FILE_RANGE_WRITE = 2  # start write-back of dirty pages in the range; do not wait
WRITE_BACK_BYTES = 32 << 20
_START_WRITE_BACK = _sync_file_range()


def start_write_back(fd: int, start: int, end: int) -> None:
    """Start writing ``[start, end)`` of ``fd`` back to the disk without waiting, so the
    final fsync has little left to do (Linux; elsewhere the fsync does it all)."""
    if _START_WRITE_BACK is not None:
        _START_WRITE_BACK(fd, start, end - start)


def _reuse_part(
    part: Path, chunks: list[str], chunk_bytes: int, size: int, land: Landing
) -> int:
    """How many leading chunks of ``part`` verify (fed to ``land``'s whole sha256); the rest
    is cut off by the caller."""
    if not part.exists():
        return 0
    done = 0
    with part.open("rb") as f:
        while done < len(chunks):
            want = min(chunk_bytes, size - done * chunk_bytes)
            block = f.read(want)
            if len(block) != want or hashlib.sha256(block).hexdigest() != chunks[done]:
                break
            land.feed(block)
            done += 1
    return done


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reason(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200] or response.reason_phrase


def _reason_of(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


def _wait_retry_after(response: httpx.Response) -> None:
    _wait(response.headers.get("retry-after"))


def _wait(retry_after: str | None) -> None:
    try:
        wait = float(retry_after or "1")
    except ValueError:
        wait = 1.0
    time.sleep(min(max(wait, 0.1), RETRY_AFTER_AT_MOST_S))
