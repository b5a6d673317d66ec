"""Pull a model from another fitbox (``box://HOST:PORT/MODEL``), trusting no byte unchecked.

For each file the source's manifest lists: its chunksums are fetched; a ``.part`` left by an
earlier pull is kept up to its last chunk that still verifies (those bytes are not fetched
again); the rest is fetched with one ranged GET, each chunk checked against its sha256 as it
lands (a chunk that does not match is cut off and fetched again, a bounded number of times);
a cut connection resumes at the last verified chunk; the whole file's sha256 is checked;
once every file of the model verified, the ``.part`` files are renamed into place (the
first last, so a split GGUF is never named with a shard missing). Nothing the source names
is trusted as a path: each name must be a plain file name (models/transfer.py
``refuse_name``).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fitbox.models.copying import sync_dir
from fitbox.models.landing import Landing
from fitbox.models.pull import PullError
from fitbox.models.transfer import FileHash, PathRefused, hash_file, missing_shards, refuse_name

_SPEC = re.compile(
    r"^box://(?P<host>\[[0-9A-Fa-f:.]+\]|[^/:\[\]]+):(?P<port>\d{1,5})/(?P<model>[^/]+)$"
)
RETRY_AFTER_AT_MOST_S = 10.0

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
    outcomes: list[FileOutcome] = field(default_factory=list)

    def _connect(self) -> http.client.HTTPConnection:
        """A connection of its own per request, plain http.client: an ``httpx.Client``
        took 90-190 ms to make (its TLS context) on a loaded box, for a plain-HTTP source."""
        return http.client.HTTPConnection(
            self.source.host.strip("[]"), self.source.port, timeout=self.timeout_s
        )

    def _headers(self, **more: str) -> dict[str, str]:
        return {**more, "authorization": f"Bearer {self.key}"} if self.key else more

    def _event(self, kind: str, name: str, index: int) -> None:
        if self.events:
            self.events(kind, name, index)

    def _get_json(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        target = f"{path}?{urlencode(params)}" if params else path
        for _ in range(3):
            conn = self._connect()
            try:
                conn.request("GET", target, headers=self._headers())
                response = conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as exc:
                raise PullError(f"{self.source}: {path} could not be fetched: {exc}") from exc
            finally:
                conn.close()
            if response.status == 429:
                _wait(response.getheader("retry-after"))
                continue
            if response.status != 200:
                raise PullError(
                    f"{self.source} answered {path} with HTTP {response.status}: {_reason_of(raw)}"
                )
            try:
                body: dict[str, Any] = json.loads(raw)
            except ValueError:
                raise PullError(
                    f"{self.source} answered {path} with what is not JSON: {raw[:200]!r}"
                ) from None
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
        files = self._offered_files()
        landed = self._landed_before(files)
        self._refuse_if_here([f for f in files if f["path"] not in landed])
        self.dest_dir.mkdir(parents=True, exist_ok=True)
        needed = sum(
            int(f["bytes"]) - _size(self.dest_dir / f"{f['path']}.part")
            for f in files
            if f["path"] not in landed
        )
        reason = self.no_room(max(0, needed))
        if reason and self.make_room is not None:
            self.make_room(max(0, needed))
            reason = self.no_room(max(0, needed))
        if reason:
            raise PullRefused(reason)
        for f in files:
            outcome = FileOutcome(
                f["path"], self.dest_dir / f["path"], int(f["bytes"]), str(f["sha256"])
            )
            self.outcomes.append(outcome)
            if outcome.name in landed:  # in place already, its sha256 checked here
                found = landed[outcome.name]
                outcome.chunk_bytes, outcome.chunks = found.chunk_bytes, found.chunks
                outcome.reused_chunks, outcome.seconds = len(found.chunks), found.seconds
                continue
            started = time.monotonic()
            try:
                self._pull_file(outcome)
            except PullError as exc:
                outcome.error = str(exc)
                raise
            finally:
                outcome.seconds = time.monotonic() - started
        # renamed only once every file verified, the first last: a split GGUF is named (the
        # catalog lists it by its first shard) only when all its shards are in place
        for outcome in reversed(self.outcomes):
            if outcome.name not in landed:
                os.replace(outcome.path.with_name(outcome.path.name + ".part"), outcome.path)
        for parent in dict.fromkeys(o.path.parent for o in self.outcomes):
            sync_dir(parent)
        return self.outcomes

    def _offered_files(self) -> list[dict[str, Any]]:
        """The manifest's files, refused unless every path is safe and a split GGUF comes
        whole."""
        manifest = self.manifest()
        files = manifest.get("files") or []
        if not files:
            raise PullError(
                f"{self.source} offers no file of {self.source.model} (a model "
                "whose GGUF links out of its directory is never offered)"
            )
        for f in files:
            try:
                refuse_name(str(f["path"]))
            except PathRefused as exc:
                raise PullError(f"{self.source} offered an unsafe path: {exc.reason}") from None
        missing = missing_shards([str(f["path"]) for f in files])
        if missing:
            raise PullError(
                f"{self.source} offers {self.source.model} without "
                f"{', '.join(missing)}: a split GGUF is pulled whole or not at all "
                "(the source could not offer those: missing, or linked out of the "
                "model's directory)"
            )
        return files

    def _landed_before(self, files: list[dict[str, Any]]) -> dict[str, FileHash]:
        """The files after the first already in place with the source's sha256, hashed
        here, while the first is not: a pull stopped between its renames (the first is
        renamed last) left them; they are kept, not fetched again. The first in place is
        the model here already (refused, as any file in the way is)."""
        if not files or (self.dest_dir / files[0]["path"]).exists():
            return {}
        landed = {}
        for f in files[1:]:
            path = self.dest_dir / f["path"]
            if path.is_file() and not path.is_symlink() and path.stat().st_size == f["bytes"]:
                hashed = hash_file(path)
                if hashed.sha256 == f["sha256"]:
                    landed[str(f["path"])] = hashed
        return landed

    def _refuse_if_here(self, files: list[dict[str, Any]]) -> None:
        for f in files:
            here = self.already_here(str(f["sha256"]))
            if here is not None:
                raise PullRefused(
                    f"{f['path']} is already here, the same bytes (sha256 "
                    f"{f['sha256'][:12]}…) at {here}"
                )
            if (self.dest_dir / f["path"]).exists():
                raise PullRefused(
                    f"{self.dest_dir / f['path']} exists with other bytes than "
                    f"{self.source}'s; move it away to pull this one"
                )

    def _pull_file(self, outcome: FileOutcome) -> None:
        sums = self._get_json(f"{self._route}/chunksums", {"path": outcome.name})
        chunk_bytes, chunks = int(sums["chunk_bytes"]), [str(c) for c in sums["chunks"]]
        if sums.get("sha256") != outcome.sha256 or len(chunks) != -(-outcome.size // chunk_bytes):
            raise PullError(
                f"{self.source}: the chunksums of {outcome.name} do not match its "
                "manifest (did the file change?); pull again"
            )
        outcome.chunk_bytes, outcome.chunks = chunk_bytes, tuple(chunks)
        part = outcome.path.with_name(outcome.path.name + ".part")
        staging = part.open("r+b" if part.exists() else "w+b")
        with staging as out, Landing(out.fileno(), part) as land:
            done = _reuse_part(land, chunks, chunk_bytes, outcome.size)
            outcome.reused_chunks = done
            for index in range(done):
                self._event("reused", outcome.name, index)
            failures = {index: 0 for index in range(len(chunks))}
            lost_in_a_row = 0
            while done < len(chunks):
                before = done
                done, cut = self._fetch_from(outcome, chunks, done, land, failures)
                if not cut:
                    continue
                outcome.cuts += 1
                lost_in_a_row = 0 if done > before else lost_in_a_row + 1
                self._event("cut", outcome.name, done)
                if lost_in_a_row >= self.attempts:
                    raise PullError(
                        f"{self.source}: the connection was lost {lost_in_a_row}"
                        f" times at chunk {done} of {outcome.name}; {done} of "
                        f"{len(chunks)} chunks are kept in {part} and a new "
                        "pull resumes there"
                    )
            digest = land.finish()  # every write landed, then one fsync
        if digest != outcome.sha256:
            part.unlink()
            raise PullError(
                f"{outcome.name}: every chunk verified but the whole file's sha256 "
                f"is {digest}, not {outcome.sha256}; nothing was kept"
            )

    def _fetch_from(
        self,
        outcome: FileOutcome,
        chunks: list[str],
        done: int,
        land: Landing,
        failures: dict[int, int],
    ) -> tuple[int, bool]:
        """Stream from chunk ``done`` on, a piece at a time: each piece read from the socket
        straight into one of ``land``'s buffers (http.client's ``readinto``; httpx's
        per-block parsing cost most of a core here), added to its chunk's sha256 here and
        handed to ``land`` (written and fed to the whole file's sha256 on its thread) while
        the next is read. A chunk is kept once its sha256 matches; one that does not, or
        that a cut broke, is thrown away (``land.rewind``). Returns (chunks done, whether
        the connection was cut)."""
        chunk_bytes = outcome.chunk_bytes
        start = done * chunk_bytes
        conn = self._connect()
        path = f"{self._route}/file?{urlencode({'path': outcome.name})}"
        try:
            conn.request("GET", path, headers=self._headers(range=f"bytes={start}-"))
            response = conn.getresponse()
            if response.status == 429:  # counted as a lost connection
                _wait(response.getheader("retry-after"))
                return done, True
            if response.status not in (200, 206) or (response.status == 200 and start):
                raise PullError(
                    f"{self.source} answered the file {outcome.name} with HTTP "
                    f"{response.status}: {_reason_of(response.read())}"
                )
            while done < len(chunks):
                want = min(chunk_bytes, outcome.size - done * chunk_bytes)
                digest = _read_chunk(response, outcome, land, want)
                if digest is None:
                    return done, True  # the body ended short; the broken chunk goes
                if digest != chunks[done]:
                    failures[done] += 1
                    outcome.refetched_chunks += 1
                    land.rewind()  # before the event: the bad bytes are gone when it is told
                    self._event("chunk_bad", outcome.name, done)
                    if failures[done] > self.chunk_retries:
                        raise PullError(
                            f"{self.source}: chunk {done} of {outcome.name} failed "
                            f"its sha256 {failures[done]} times; the source's file "
                            "may be damaged or changing"
                        )
                    return done, False  # fetched again from the bad chunk, on a new connection
                land.verified()
                self._event("chunk_ok", outcome.name, done)
                done += 1
            return done, False
        except (OSError, http.client.HTTPException):
            return done, True  # the whole chunks verified before the cut are kept
        finally:
            conn.close()
            land.rewind()  # whatever came after the last verified chunk goes


def _read_chunk(
    response: http.client.HTTPResponse, outcome: FileOutcome, land: Landing, want: int
) -> str | None:
    """One chunk's ``want`` bytes from the body into ``land``, a piece at a time, hashed as
    they pass; its sha256, or None where the body ended short."""
    check, got = hashlib.sha256(), 0
    while got < want:
        view = land.buffer()[: min(Landing.PIECE, want - got)]
        filled = _read_into(response, view)
        outcome.fetched_bytes += filled
        got += filled
        check.update(view[:filled])
        land.write(view[:filled])
        if filled < len(view):
            return None
    return check.hexdigest()


def _read_into(response: http.client.HTTPResponse, view: memoryview) -> int:
    """Fill ``view`` from the body; fewer bytes only where the body ended."""
    filled = 0
    while filled < len(view):
        got = response.readinto(view[filled:])
        if not got:
            break
        filled += got
    return filled


def _reuse_part(land: Landing, chunks: list[str], chunk_bytes: int, size: int) -> int:
    """How many leading chunks of the staging file verify (fed to ``land``'s whole sha256,
    a piece at a time as a fetch's are); the rest is cut off."""
    done = 0
    while done < len(chunks):
        start = done * chunk_bytes
        want = min(chunk_bytes, size - start)
        check, got = hashlib.sha256(), 0
        while got < want:
            view = land.buffer()[: min(Landing.PIECE, want - got)]
            filled = land.read_at(view, start + got)
            check.update(view[:filled])
            land.hash_only(view[:filled])
            got += filled
            if filled < len(view):
                break
        if got < want or check.hexdigest() != chunks[done]:
            break
        land.verified()
        done += 1
    land.rewind()
    return done


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _reason_of(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


def _wait(retry_after: str | None) -> None:
    try:
        wait = float(retry_after or "1")
    except ValueError:
        wait = 1.0
    time.sleep(min(max(wait, 0.1), RETRY_AFTER_AT_MOST_S))
