"""The decode loop's pieces as OpenAI's chat replies: one whole body, or stream events.

Each choice's text becomes its message; when the call gave tools (and did not say
``tool_choice: none``) its ``<tool_call>`` blocks become ``tool_calls`` and its finish
reason ``tool_calls``. A stream with tools holds each choice's text until it ends, then
sends its content and calls as deltas: a block half made is never shown as content.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .chat import Piece, Request, Timings
from .tools import parsed


def uses_tools(request: Request) -> bool:
    return request.tools is not None and request.tool_choice != "none"


def usage(timings: Timings) -> dict[str, int]:
    return {
        "prompt_tokens": timings.prompt_n,
        "completion_tokens": timings.predicted_n,
        "total_tokens": timings.prompt_n + timings.predicted_n,
    }


def _message(request: Request, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
    if not uses_tools(request):
        return {"role": "assistant", "content": text}, finish
    content, calls = parsed(text)
    if not calls:
        return {"role": "assistant", "content": text}, finish
    return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"


def whole(
    request: Request, pieces: Iterable[Piece], base: dict[str, Any], timings: Timings
) -> dict[str, Any]:
    n = request.n
    texts = [""] * n
    finishes: list[str | None] = [None] * n
    logprobs: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for piece in pieces:
        texts[piece.index] += piece.text
        logprobs[piece.index] += piece.logprobs
        finishes[piece.index] = piece.finish_reason or finishes[piece.index]
    choices = []
    for i in range(n):
        message, finish = _message(request, texts[i], finishes[i])
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": {"content": logprobs[i]} if request.logprobs else None,
                "finish_reason": finish,
            }
        )
    return {
        **base,
        "object": "chat.completion",
        "choices": choices,
        "usage": usage(timings),
        "timings": timings.as_dict(),
    }


def events(
    request: Request, pieces: Iterable[Piece], base: dict[str, Any], timings: Timings
) -> Iterator[dict[str, Any]]:
    """The stream's events after the first (each choice's role); the last carries the usage
    and timings."""
    chunk = {**base, "object": "chat.completion.chunk"}
    held = [""] * request.n
    ended = 0
    for piece in pieces:
        if uses_tools(request):
            held[piece.index] += piece.text
            if piece.finish_reason is None:
                continue
            deltas = _tool_deltas(request, held[piece.index], piece.finish_reason)
        else:
            deltas = [({"content": piece.text} if piece.text else {}, piece.finish_reason)]
        for delta, finish in deltas:
            choice: dict[str, Any] = {"index": piece.index, "delta": delta, "finish_reason": finish}
            if request.logprobs:
                choice["logprobs"] = {"content": piece.logprobs}
                piece.logprobs = []
            event = {**chunk, "choices": [choice]}
            ended += finish is not None
            if ended == request.n and finish is not None:
                event |= {"usage": usage(timings), "timings": timings.as_dict()}
            yield event


def _tool_deltas(
    request: Request, text: str, finish: str
) -> list[tuple[dict[str, Any], str | None]]:
    message, finish_ = _message(request, text, finish)
    deltas: list[tuple[dict[str, Any], str | None]] = []
    if message.get("content"):
        deltas.append(({"content": message["content"]}, None))
    for i, call in enumerate(message.get("tool_calls", [])):
        deltas.append(({"tool_calls": [{"index": i, **call}]}, None))
    deltas.append(({}, finish_))
    return deltas
