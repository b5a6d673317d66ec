"""What Server-Timing and the reasoning split add to a call, in one process, against the same
work without them (issue #17's budget: within 0.2 ms of the proxy before it).

    python bench/client_view.py [--calls 20000] [--streams 400] [--tokens 256]

Whole calls: an ASGI app answering a chat reply, bare and behind ServerTimingMiddleware,
with Reshape.whole() on the reply (no thinking: the common case; and with <think>).
Streams: a llama-server-shaped stream of --tokens events relayed bare, and through the one
pass, Reshape.stream() (no thinking, and all thinking split by fitbox; the figures' comment).
Blocks alternate between the two sides, timed in this process's CPU seconds (a shared machine
stretches wall time, not the work). Prints microseconds
added per call and per stream, and the ratio (with / without).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

from starlette.types import Message, Receive, Scope, Send

from fitbox.server.door import timing
from fitbox.server.streams import Reshape, Thinking
from fitbox.server.streams.thinking import CHAT

SPLIT = Thinking(CHAT, "reasoning_content")

REPLY = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Hi!"},
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3},
    }
).encode()
THINKING = REPLY.replace(b'"Hi!"', b'"<think>a short thought</think>Hi!"')


def _app(content: bytes) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        stamps = {
            "received_at": 1.0,
            "admitted_at": 1.001,
            "first_byte_at": 1.002,
            "last_byte_at": 1.002,
        }
        scope["state"][timing.STAMPS_STATE] = stamps
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": content})

    return app


def _reshaped(content: bytes) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    inner = _app(content)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        Reshape(CHAT, "m", "m", SPLIT).whole(content)
        await inner(scope, receive, send)

    return app


async def _calls(app: Callable[[Scope, Receive, Send], Awaitable[None]], n: int) -> float:
    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        return None

    start = time.process_time()
    for _ in range(n):
        scope = {"type": "http", "headers": [], "state": {}, "extensions": {}}
        await app(scope, receive, send)
    return time.process_time() - start


def _events(tokens: int, think: bool) -> list[bytes]:
    words = ["<think>", *["hm "] * (tokens - 3), "</think>", "Hi"] if think else ["w "] * tokens
    out = []
    for word in words:
        chunk = {
            "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
            "object": "chat.completion.chunk",
            "id": "chatcmpl-1",
            "created": 1,
            "model": "m",
        }
        out.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    return [*out, b"data: [DONE]\n\n"]


async def _source(
    events: list[bytes], stamps: dict[str, float | None]
) -> AsyncGenerator[bytes, None]:
    for event in events:
        if event.startswith(b"data: [DONE]"):
            stamps["last_byte_at"] = 2.0
        yield event


async def _streams(events: list[bytes], n: int, shaped: bool) -> float:
    start = time.process_time()
    for _ in range(n):
        stamps: dict[str, float | None] = {"received_at": 1.0, "admitted_at": 1.0}
        chunks: AsyncGenerator[bytes, None] = _source(events, stamps)
        if shaped:
            chunks = Reshape(CHAT, "m", "m", SPLIT, stamps=stamps).stream(chunks)
        async for _chunk in chunks:
            pass
    return time.process_time() - start


def _paired(run: Callable[[bool], Awaitable[float]], rounds: int = 10) -> tuple[float, float]:
    """Seconds without and with, summed over alternating blocks."""
    bare = timed = 0.0
    for _ in range(rounds):
        bare += asyncio.run(run(False))  # type: ignore[arg-type]
        timed += asyncio.run(run(True))  # type: ignore[arg-type]
    return bare, timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--streams", type=int, default=400)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    calls, streams = args.calls // 10, args.streams // 10
    for label, content in (("whole, no thinking", REPLY), ("whole, <think> split", THINKING)):
        bare, timed = _paired(
            lambda on, c=content: _calls(  # type: ignore[misc]
                timing.ServerTimingMiddleware(_reshaped(c)) if on else _app(c), calls
            )
        )
        added = (timed - bare) / args.calls * 1e6
        print(f"{label:28s} {added:8.1f} us added per call   ratio {timed / bare:5.2f}")
    for label, think in (("stream, no thinking", False), ("stream, all <think> split", True)):
        events = _events(args.tokens, think)
        bare, timed = _paired(lambda on, e=events: _streams(e, streams, on))  # type: ignore[misc]
        added = (timed - bare) / args.streams * 1e6
        print(
            f"{label:28s} {added:8.1f} us added per {args.tokens}-token stream   "
            f"ratio {timed / bare:5.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
