"""What moving a model's thinking costs on the routes beyond chat, per streamed token, in
one process: llama-server-shaped streams of ``--tokens`` events for text completions,
Responses and Messages, each relayed bare and through the one pass (``Reshape.stream``:
its opening, its thinking), against the same for a chat stream (the baseline this issue
set), with no thinking (the common case) and all of it thinking.

    python bench/reasoning_routes.py [--streams 200] [--tokens 256]

Blocks alternate between bare and shaped, timed in this process's CPU seconds (a shared
machine stretches wall time, not the work). Prints microseconds added per token for each
route and its ratio to chat's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from fitbox.server.streams import Reshape, Thinking
from fitbox.server.streams.thinking import CHAT, COMPLETIONS, MESSAGES, RESPONSES

Event = Callable[[str], dict[str, Any]]
SHAPES: dict[str, tuple[list[dict[str, Any]], Event, list[dict[str, Any]]]] = {
    CHAT: (
        [],
        lambda w: {"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]},
        [],
    ),
    COMPLETIONS: ([], lambda w: {"choices": [{"index": 0, "text": w, "finish_reason": None}]}, []),
    RESPONSES: (
        [
            {"type": "response.created", "response": {"id": "resp_1"}},
            {
                "type": "response.output_item.added",
                "item": {"type": "message", "id": "msg_1", "content": []},
            },
            {
                "type": "response.content_part.added",
                "item_id": "msg_1",
                "part": {"type": "output_text", "text": ""},
            },
        ],
        lambda w: {"type": "response.output_text.delta", "item_id": "msg_1", "delta": w},
        [
            {"type": "response.output_text.done", "item_id": "msg_1", "text": ""},
            {"type": "response.completed", "response": {"output": []}},
        ],
    ),
    MESSAGES: (
        [
            {"type": "message_start", "message": {"id": "m", "content": []}},
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ],
        lambda w: {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": w},
        },
        [{"type": "content_block_stop", "index": 0}, {"type": "message_stop"}],
    ),
}


def _events(path: str, tokens: int, think: bool) -> list[bytes]:
    head, event, tail = SHAPES[path]
    words = ["<think>", *["hm "] * (tokens - 3), "</think>", "Hi"] if think else ["w "] * tokens
    named = path in (RESPONSES, MESSAGES)
    out = []
    for data in [*head, *(event(w) for w in words), *tail]:
        name = b"event: " + data["type"].encode() + b"\n" if named else b""
        out.append(name + b"data: " + json.dumps(data).encode() + b"\n\n")
    return out if named else [*out, b"data: [DONE]\n\n"]


async def _source(events: list[bytes]) -> AsyncGenerator[bytes, None]:
    for event in events:
        yield event


async def _streams(path: str, events: list[bytes], n: int, on: bool) -> float:
    start = time.process_time()
    for _ in range(n):
        chunks = _source(events)
        if on:
            chunks = Reshape(path, "m", "m", Thinking(path, "reasoning_content")).stream(chunks)
        async for _chunk in chunks:
            pass
    return time.process_time() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    per = args.streams // 10
    for think in (False, True):
        added: dict[str, float] = {}
        for path in SHAPES:
            events = _events(path, args.tokens, think)
            bare = timed = 0.0
            for _ in range(10):
                bare += asyncio.run(_streams(path, events, per, False))
                timed += asyncio.run(_streams(path, events, per, True))
            added[path] = (timed - bare) / (per * 10) / args.tokens * 1e6
        for path, us in added.items():
            label = f"{path}, {'all thinking' if think else 'no thinking'}"
            print(
                f"{label:40s} {us:7.2f} us added per token   "
                f"{us / max(added[CHAT], 1e-9):6.2f}x chat's"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
