"""A call's life, from its row to its measured speeds: the only writer of a call row.
A served call is driven through these steps by box/serving.py (``Served.serve``):

    call = box.calls.open("/v1/chat/completions", model, stream, request_id)   # row: pending
    await call.place(need, max_tokens, prompt_tokens)   # a lease on a ready resident; placed
    response = await call.send(body, accept)            # under the hang watchdog
    await call.refused_prompt(response)                 # its count, if its slot was short
    await call.written()                                # the row exists: a first byte may go
    content = await call.read(response)  |  async for chunk in call.relay(response): ...
    call.answered(status, content)       # ok, usage, timings → a measured speed
    call.failed(error) / call.interrupted()
    await call.finished()                               # the end is stored: the last byte may go

Every way out releases the lease once. Engine failures arrive as ``FitboxError``s
(``engine_failed``, ``engine_timeout``); the caller frames them for HTTP.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from fitbox.core.slots import Demand
from fitbox.engines.http1 import EngineConnectionError, EngineResponse
from fitbox.errors import EngineFailed, EngineTimeout, FitboxError
from fitbox.store.db import CallStart, CentralKey, Store
from fitbox.store.waits import writing

from .asks import Named
from .lease import Lease
from .resident import Resident
from .speeds import SpeedBook
from .supervision import Watchdog

_USAGE = re.compile(rb'"usage"\s*:\s*(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})')
KEEP_TAIL = 16 * 1024  # the end of a reply kept for its usage and timings
ROW_WAIT_S = 5.0  # the longest a response waits for its row to be committed
Acquire = Callable[
    [str | Named, int | None, int, int, int, Demand | None, float | None], Awaitable[Lease]
]


# The last event of the streams that end without ``data: [DONE]``: the Responses API's and
# the Anthropic Messages API's (llama-server server-context.cpp sends none after them)
_LAST_EVENTS = (b"event: response.completed", b"event: message_stop")


_BLANK = b" \t\n\r\x0b\x0c"  # what bytes.rstrip() strips
_DONE = b"data: [DONE]"


def stream_ended(tail: bytes | bytearray) -> bool:
    """Whether an OpenAI (or Responses, or Anthropic) event stream has sent its last event.
    Read in place, from the end (it runs once a piece, on up to 2 x ``KEEP_TAIL`` bytes)."""
    end = len(tail)
    while end and tail[end - 1] in _BLANK:
        end -= 1
    if tail.endswith(_DONE, 0, end):
        return True
    if not tail.endswith(b"\n\n"):  # an event is whole once its blank line has come
        return False
    start = tail.rfind(b"\n\n", 0, end)  # the last event begins after the one before it
    return tail.startswith(_LAST_EVENTS, start + 2 if start >= 0 else 0)


def stream_error(tail: bytes) -> tuple[int, str] | None:
    """(status, code) when a stream's last event is the engine's error: llama-server ends a
    stream it cannot go on with one (``data: {"error": {...}}``, or an Anthropic ``event:
    error``) and no ``[DONE]``, its HTTP status long sent as 200."""
    events = [e for e in bytes(tail).split(b"\n\n") if e.strip()]
    if not events:
        return None
    lines = events[-1].strip().split(b"\n")
    named = any(line == b"event: error" for line in lines)
    data = next((line[5:].strip() for line in lines if line.startswith(b"data:")), b"")
    try:
        found = json.loads(data)
    except ValueError:
        return None
    error = found.get("error", found if named else None) if isinstance(found, dict) else None
    if not isinstance(error, dict):
        return None
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    return status, str(error.get("type") or "engine_error")


def usage_of(tail: bytes) -> dict[str, Any]:
    matches = _USAGE.findall(tail)
    if not matches:
        return {}
    try:
        usage = json.loads(matches[-1])
    except json.JSONDecodeError:
        return {}
    if not isinstance(usage, dict):
        return {}
    # the Responses and Anthropic APIs name them input and output tokens
    usage.setdefault("prompt_tokens", usage.get("input_tokens"))
    usage.setdefault("completion_tokens", usage.get("output_tokens"))
    return usage


def _counted(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }


@dataclass
class CallDesk:
    """Opens calls; holds what every call needs from the box."""

    store: Store
    speeds: SpeedBook
    watchdog: Watchdog
    acquire: Acquire

    def open(
        self,
        endpoint: str,
        model: str,
        stream: bool,
        request_id: str,
        central_key: CentralKey | None = None,
    ) -> Call:
        return Call(self, endpoint, model, stream, request_id, central_key)


class Call:
    def __init__(
        self,
        desk: CallDesk,
        endpoint: str,
        model: str,
        stream: bool,
        request_id: str,
        central_key: CentralKey | None = None,
    ) -> None:
        self.desk, self.endpoint, self.model, self.stream = desk, endpoint, model, stream
        received = time.time()
        # the row's stamps as recorded, for figures a response carries (Server-Timing)
        self.stamps: dict[str, float | None] = {"received_at": received}
        self.id = desk.store.call_started(
            CallStart(
                request_id=request_id[:128],
                endpoint=endpoint,
                model_asked=model[:256],  # a client chooses it: keep rows bounded
                stream=stream,
                received_at=received,
                central_key=central_key.key_id if central_key else None,
                central_key_name=central_key.name if central_key else None,
            )
        )
        self._row = desk.store.barrier()  # set once the row above is committed
        self.lease: Lease | None = None
        self.prompt_tokens: int | None = None  # the prompt's tokens, once counted exactly
        self.work: float | None = None  # a task call's units of work (box/task_speeds.py)

    async def written(self) -> None:
        """Wait until the call's row exists in the store file. The response's first byte
        leaves after this, so a fitbox killed after it leaves the row (closed as
        interrupted at the next start), never a call answered and forgotten."""
        await self._committed(self._row)

    async def finished(self) -> None:
        """Wait until what the call recorded so far (its end) is committed: its last byte
        leaves after this, so a call a client got whole is never stored as interrupted."""
        self._row = self.desk.store.barrier()
        await self._committed(self._row)

    async def _committed(self, row: Future[Any]) -> None:
        """A store that cannot commit within ``ROW_WAIT_S`` is not waited for longer: its
        failures are counted, and the call goes on. One whose writes are being refused now
        (a full drive, a lock held outside) is not waited for at all: the row waits in
        memory, and the wait would only delay the answer."""
        if writing(self.desk.store):
            await self.desk.store.committed(row, ROW_WAIT_S)

    def _record(self, **values: Any) -> None:
        self.stamps.update((k, v) for k, v in values.items() if k.endswith("_at"))
        self.desk.store.call_updated(self.id, **values)

    @property
    def resident(self) -> Resident:
        assert self.lease is not None, "the call is not placed yet"
        return self.lease.resident

    def _release(self) -> None:
        if self.lease is not None:
            self.lease.release()

    # -- placing and sending -----------------------------------------------------------

    async def place(
        self,
        need: int,
        max_tokens: int,
        prompt_tokens: int,
        slots: int = 1,
        named: Named | None = None,
        counted: bool = False,
        demand: Demand | None = None,
    ) -> Resident:
        """Hold ``slots`` slots of a ready resident for this call (loading, evicting or
        waiting as decided); ``named``: the name as the call resolved it when it opened
        (box/serving.py; a default model's when that serves), else the one asked;
        ``counted``: ``prompt_tokens`` is the model's own count, not a bound; ``demand``:
        what a generating call may hold of a shared pool of cells (core/slots.py)."""
        self.prompt_tokens = prompt_tokens if counted else None
        self.lease = lease = await self.desk.acquire(
            named or self.model, self.id, need, max_tokens, slots, demand, self.work
        )
        r = lease.resident
        if self.work is not None:
            lease.expect_in(self.desk.speeds.tasks.seconds(r.artifact, self.work))
        else:
            lease.expect(self.desk.speeds.of(r.artifact, r.rung.value), prompt_tokens, max_tokens)
        self._record(
            artifact=str(r.artifact.path),
            admitted_at=time.time(),
            device=r.device,
            window=r.window,
            evicted=lease.evicted,
            load_start_at=r.load_started_at if lease.loaded else None,
            load_ready_at=r.ready_at if lease.loaded else None,
            rung=r.rung.value,
            type_k=r.type_k,
            type_v=r.type_v,
            devices=r.holdings(),
            cores=list(r.cores),
            tensor_split=list(r.place.tensor_split) if r.place else [],
        )
        return r

    def unplace(self) -> None:
        """Give the lease back before anything was sent (the call is placed again, with
        what its engine counted, or refused)."""
        self._release()

    def _watched(self, awaitable: Awaitable[Any]) -> Awaitable[Any]:
        return self.desk.watchdog.watched(self.resident, awaitable)

    def _engine_failed(self, exc: Exception) -> EngineFailed:
        r = self.resident
        return EngineFailed(
            f"{r.engine.name} serving '{r.artifact.name}' failed mid-call ({exc})",
            log_tail=r.child.tail() if r.child else [],
        )

    async def send(
        self, body: bytes, accept: str, method: str = "POST", query: str = ""
    ) -> EngineResponse:
        """Send the call to its engine; its response headers are back when this returns.
        ``query``: the client's query string, passed on (``GET /slots?fail_on_no_slot=1``)."""
        path, shaped = self.resident.engine.shape(self.endpoint, body)
        assert self.lease is not None
        headers = {"Content-Type": "application/json", "Accept": accept}
        target = f"{path}?{query}" if query else path
        try:
            response: EngineResponse = await self._watched(
                self.lease.pool.request(method, target, shaped, headers)
            )
        except EngineConnectionError as exc:
            raise self._engine_failed(exc) from None
        return response

    async def refused_prompt(self, response: EngineResponse) -> int | None:
        """The prompt's tokens when the engine refused this call because its slot cannot
        hold the prompt (a call sent on its bound, box/needs.py); None: any other answer.
        An error body read here is kept for whoever reads the response next."""
        if response.status < 400:
            return None
        try:
            content = await self._watched(response.kept())
        except EngineConnectionError as exc:
            response.close()
            raise self._engine_failed(exc) from None
        return self.resident.engine.refused_prompt(response.status, content)

    # -- the reply -------------------------------------------------------------------------

    async def read(self, response: EngineResponse) -> bytes:
        """A whole reply; the lease is released once it is read (or fails)."""
        try:
            content: bytes = await self._watched(response.read())
        except EngineConnectionError as exc:
            raise self._engine_failed(exc) from None
        finally:
            response.close()
            self._release()
        return content

    async def relay(self, response: EngineResponse) -> AsyncGenerator[bytes, None]:
        """A streamed reply, piece by piece as the engine writes it. It is recorded as
        finished (and committed) when its end (``data: [DONE]``) arrives, before that
        piece is handed on: what happens after (the client leaving, the engine dropping
        its framing's end, fitbox killed) changes nothing."""
        first_byte_at: float | None = None
        tail = bytearray()  # its end: trimmed to KEEP_TAIL once it doubles (no copy a piece)
        outcome, error_code, status = "ok", None, response.status
        whole = False  # the stream's end came: the row says ok, whatever comes next
        watched = self.desk.watchdog.stream(self.resident, response.iter_bytes())
        try:
            async for chunk in watched:
                if first_byte_at is None:
                    first_byte_at = time.time()
                tail += chunk
                if len(tail) > 2 * KEEP_TAIL:
                    del tail[: len(tail) - KEEP_TAIL]
                if not whole and stream_ended(tail):  # the engine's last event is here
                    whole = True
                    self._ended("ok", status, None, first_byte_at, bytes(tail[-KEEP_TAIL:]))
                    await self.finished()
                yield chunk  # after the end, the rest of the body is read for the connection
        except (EngineConnectionError, EngineTimeout) as exc:
            if whole:
                return  # after the end: the client has all it asked for
            error = self._engine_failed(exc) if isinstance(exc, EngineConnectionError) else exc
            outcome, error_code, status = "error", error.code, error.status
            raise error from None
        except BaseException:  # the client went away, or fitbox is stopping
            outcome = "interrupted"
            raise
        finally:
            await watched.aclose()
            response.close()
            self._release()
            if not whole:
                self._ended(outcome, status, error_code, first_byte_at, bytes(tail[-KEEP_TAIL:]))

    def _ended(
        self,
        outcome: str,
        status: int,
        error_code: str | None,
        first_byte_at: float | None,
        tail: bytes,
    ) -> None:
        usage = usage_of(tail)
        failed = stream_error(tail) if outcome == "ok" else None
        if failed is not None:  # the engine ended it with an error event: that is its end
            outcome, (status, error_code) = "error", failed
        self._record(
            outcome=outcome,
            http_status=status,
            error_code=error_code,
            first_byte_at=first_byte_at,
            last_byte_at=time.time(),
            **(self._measured(tail, usage) if outcome == "ok" else _counted(usage)),
        )

    def answered(self, status: int, content: bytes) -> None:
        """A whole reply the engine gave: its usage and timings go into the row."""
        done, tail = time.time(), content[-KEEP_TAIL:]
        usage = usage_of(tail) or usage_of(content)
        self._record(
            outcome="ok",
            http_status=status,
            first_byte_at=done,
            last_byte_at=done,
            **self._measured(tail, usage),
        )

    def helped(self, status: int = 200) -> None:
        """A reply the box wrote itself (the helper, box/helper/): no engine, no speed."""
        done = time.time()
        self._record(outcome="ok", http_status=status, first_byte_at=done, last_byte_at=done)

    def refused_by_engine(self, status: int, error_code: str) -> None:
        """The engine answered with an error body of its own."""
        done = time.time()
        self._record(
            outcome="error",
            http_status=status,
            error_code=error_code,
            first_byte_at=done,
            last_byte_at=done,
        )

    def _measured(self, tail: bytes, usage: dict[str, Any]) -> dict[str, Any]:
        """The reply's token counts and the engine's timings as call-log columns; the
        timings also become a measured speed. A stream whose client did not ask for usage
        (``stream_options.include_usage``, which most chat UIs leave off) carries none,
        so its counts come from the engine's own timings: every stream is counted."""
        tokens = _counted(usage)
        timings = self.resident.engine.timings(tail)
        if timings is None:
            return tokens
        if tokens["prompt_tokens"] is None and timings.prompt_ms is not None:
            tokens["prompt_tokens"] = (timings.cache_n or 0) + timings.prompt_n
        if tokens["completion_tokens"] is None and timings.decode_ms is not None:
            tokens["completion_tokens"] = timings.decode_n
        self.desk.speeds.record(self.resident, timings, self.id)
        return {
            **tokens,
            "cache_tokens": timings.cache_n,
            "prompt_ms": timings.prompt_ms,
            "prompt_per_token_ms": timings.prompt_per_token_ms,
            "decode_ms": timings.decode_ms,
            "decode_per_token_ms": timings.decode_per_token_ms,
        }

    def files_recorded(self, files: list[dict[str, Any]], figures: dict[str, float]) -> None:
        """A task call's files (role, name, bytes, sha256: never their content) and what
        its runner measured (``audio_in_s``, ``audio_out_s``, ``pixels``), on its row."""
        known = {k: v for k, v in figures.items() if k in ("audio_in_s", "audio_out_s")}
        if "pixels" in figures:
            known["image_pixels"] = int(figures["pixels"])
        self._record(files=files, **known)

    def worked(self, units: float | None) -> None:
        """A task call that ended whole did ``units`` of work (its own measure, else the
        work it opened with): over its engine's seconds since it was admitted, a measured
        speed of its file (box/task_speeds.py)."""
        units = self.work if units is None else units
        admitted = self.stamps.get("admitted_at")
        if units is None or admitted is None or self.lease is None:
            return
        self.desk.speeds.tasks.record(self.resident.artifact, units, time.time() - admitted)

    # -- other ends ------------------------------------------------------------------------

    def failed(self, error: FitboxError) -> None:
        self._release()
        self._record(
            outcome="error",
            http_status=error.status,
            error_code=error.code,
            last_byte_at=time.time(),
        )

    def abandoned(self) -> None:
        """Its client left before its whole reply; the engine was told (its connection
        closed). Recorded after whatever the cancelled work recorded, so this stands."""
        self._release()
        self._record(outcome="abandoned", http_status=499, last_byte_at=time.time())

    def interrupted(self) -> None:
        self._release()
        self._record(outcome="interrupted", last_byte_at=time.time())
