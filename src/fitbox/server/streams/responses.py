"""The thinking moved in a Responses stream, event by event (the shapes are thinking.py's).

The engine's message item is held back (its ``output_item.added`` and
``content_part.added``) until its first text, so a reasoning item opened by the thinking
before it comes first in ``output``; every item is numbered (``output_index``) in the order
it is sent. The reasoning item stays open until the message's text is done, so thinking
that comes after text still lands in it.
"""

from __future__ import annotations

from typing import Any

from fitbox.server.streams.events import NamedShaper
from fitbox.server.streams.thinking import (
    ThinkSplitter,
    message_text,
    reasoning_id,
    reasoning_item,
    set_message_text,
    split,
)


class _Message:
    """One engine message item of a Responses stream, as fitbox sends it on."""

    def __init__(self, item_id: str) -> None:
        self.item_id = item_id
        self.splitter = ThinkSplitter()
        self.held: list[dict[str, Any]] = []  # its added events, until its first text
        self.index: int | None = None  # its output_index, once sent
        self.reasoning_index: int | None = None  # its reasoning item's, once opened
        self.thought = ""
        self.fed = False  # a delta (or its done text) went through the splitter


_PART_EVENTS = frozenset(
    {
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
    }
)


class ResponsesShaper(NamedShaper):
    def __init__(self) -> None:
        super().__init__()
        self.messages: dict[str, _Message] = {}
        self.indexes: dict[str, int] = {}  # every item sent: its output_index
        self.sent = 0
        self.sequence = 0  # every event sent is numbered, as the SDK's stream helper reads
        self.current: _Message | None = None  # the message the engine's deltas are for

    def frame(self, data: dict[str, Any]) -> bytes:
        data["sequence_number"], self.sequence = self.sequence, self.sequence + 1
        return super().frame(data)

    def event(self, event: bytes) -> list[bytes]:
        """The fast path: a text delta of the current message, no tag in it or begun, once
        the message is sent: its numbers put on its end, unparsed (the done events' texts
        are split whole again: splitting gives the same however the text was cut)."""
        message = self.current
        if (
            message is None
            or message.index is None
            or not message.fed
            or not message.splitter.idle
            or b"<" in event
            or b'_index"' in event
            or b'"sequence_number"' in event
            or not event.endswith(b"}")
            or not event.startswith(b"event: response.output_text.delta\n")
            or message.item_id.encode() not in event
        ):
            return super().event(event)
        numbers = f',"output_index":{message.index},"content_index":0,"sequence_number":'
        self.sequence += 1
        return [event[:-1] + f"{numbers}{self.sequence - 1}}}".encode()]

    def _number(self, item_id: str) -> int:
        self.indexes[item_id] = self.sent
        self.sent += 1
        return self.indexes[item_id]

    def shape(self, data: dict[str, Any]) -> list[dict[str, Any]] | None:
        kind = data.get("type")
        item = data.get("item") if isinstance(data.get("item"), dict) else None
        item_id = str(item.get("id", "")) if item else str(data.get("item_id", ""))
        if kind == "response.output_item.added" and item is not None:
            if item.get("type") == "message":
                self.messages[item_id] = self.current = _Message(item_id)
                self.messages[item_id].held.append(data)
                return []
            data["output_index"] = self._number(item_id)
            return [data]
        if kind in ("response.created", "response.in_progress"):
            response = data.get("response")
            if isinstance(response, dict):  # llama-server's has none; OpenAI's SDK stream
                response.setdefault("output", [])  # helpers append each item to it
            return [data]
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            response = data.get("response")
            if isinstance(response, dict):
                _finished_output(response, self.messages, self.indexes)
            return [data]
        message = self.messages.get(item_id)
        if message is not None and "content_index" not in data and kind in _PART_EVENTS:
            data["content_index"] = 0  # llama-server sends none: its message has one part
        if message is None:
            if item_id in self.indexes:
                data["output_index"] = self.indexes[item_id]
            return [data]
        if kind == "response.content_part.added" and message.index is None:
            message.held.append(data)
            return []
        if kind == "response.output_text.delta":
            message.fed = True
            thought, text = message.splitter.feed(str(data.get("delta") or ""))
            return self._pieces(message, thought, text, data)
        out: list[dict[str, Any]] = []
        if kind == "response.output_text.done":
            if not message.fed:  # a text sent whole, with no deltas: split as one
                message.fed = True
                out += self._pieces(
                    message, *message.splitter.feed(str(data.get("text") or "")), None
                )
            thought, text = message.splitter.finish()
            out += self._pieces(message, thought, text, None)
            out += self._close_reasoning(message) + self._release(message)
            if isinstance(data.get("text"), str):  # the whole text (its deltas may be unread)
                data["text"] = split(data["text"])[1]
        elif kind == "response.content_part.done" and isinstance(data.get("part"), dict):
            text = data["part"].get("text")
            if data["part"].get("type") == "output_text" and isinstance(text, str):
                data["part"]["text"] = split(text)[1]
        elif kind == "response.output_item.done" and item is not None:
            out += self._close_reasoning(message) + self._release(message)
            set_message_text(item, split(message_text(item))[1])
        out += self._release(message)
        data["output_index"] = message.index
        return [*out, data]

    def _pieces(
        self, message: _Message, thought: str, text: str, delta: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        """The events for one piece: its thinking to the reasoning item (opened at the
        first), its text to the message (sent at its first), as ``delta`` was shaped."""
        out: list[dict[str, Any]] = []
        if thought:
            rs = reasoning_id(message.item_id)
            if message.reasoning_index is None:
                message.reasoning_index = self._number(rs)
                at = message.reasoning_index
                out += [
                    {
                        "type": "response.output_item.added",
                        "output_index": at,
                        "item": reasoning_item(message.item_id, "", "in_progress"),
                    },
                    {
                        "type": "response.content_part.added",
                        "item_id": rs,
                        "output_index": at,
                        "content_index": 0,
                        "part": {"type": "reasoning_text", "text": ""},
                    },
                ]
            message.thought += thought
            out.append(
                {
                    "type": "response.reasoning_text.delta",
                    "item_id": rs,
                    "output_index": message.reasoning_index,
                    "content_index": 0,
                    "delta": thought,
                }
            )
        if text:
            out += self._release(message)
            new = {"type": "response.output_text.delta", "item_id": message.item_id}
            event = dict(delta) if delta else {**new, "content_index": 0}
            out.append({**event, "delta": text, "output_index": message.index})
        return out

    def _release(self, message: _Message) -> list[dict[str, Any]]:
        """The message's held events, numbered, the first time it is asked for."""
        if message.index is not None:
            return []
        message.index = self._number(message.item_id)
        held, message.held = message.held, []
        return [{**event, "output_index": message.index} for event in held]

    def _close_reasoning(self, message: _Message) -> list[dict[str, Any]]:
        """The reasoning item's end (once): its text done, its part done, the item done."""
        at, message.reasoning_index = message.reasoning_index, None
        if at is None:
            return []
        rs, text = reasoning_id(message.item_id), message.thought
        part = {"type": "reasoning_text", "text": text}
        return [
            {
                "type": "response.reasoning_text.done",
                "item_id": rs,
                "output_index": at,
                "content_index": 0,
                "text": text,
            },
            {
                "type": "response.content_part.done",
                "item_id": rs,
                "output_index": at,
                "content_index": 0,
                "part": part,
            },
            {
                "type": "response.output_item.done",
                "output_index": at,
                "item": reasoning_item(message.item_id, text),
            },
        ]


def _finished_output(
    response: dict[str, Any], messages: dict[str, _Message], indexes: dict[str, int]
) -> None:
    """The final response's ``output`` as the stream sent it: each message's text without
    its thinking, and its reasoning item where the stream numbered it (before it, unless
    its text came first)."""
    output = response.get("output")
    if not isinstance(output, list):
        return
    items: list[Any] = []
    for item in output:
        message = messages.get(str(item.get("id", ""))) if isinstance(item, dict) else None
        if message is None or not message.fed:
            items.append(item)
            continue
        set_message_text(item, split(message_text(item))[1])
        pair = [item]
        if message.thought:
            rs = reasoning_id(message.item_id)
            after = indexes.get(rs, -1) > indexes.get(message.item_id, len(indexes))
            thinking = reasoning_item(message.item_id, message.thought)
            pair = [item, thinking] if after else [thinking, item]
        items += pair
    response["output"] = items


_RESPONSE_OPENINGS = (b"event: response.created\n", b"event: response.in_progress\n")


class ResponsesOpening:
    """A Responses stream says ``response.created`` and ``response.in_progress`` once."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()

    def passes(self, chunk: bytes) -> bool:
        return not any(o in chunk for o in _RESPONSE_OPENINGS)

    def event(self, event: bytes) -> list[bytes]:
        opening = next((o for o in _RESPONSE_OPENINGS if event.startswith(o)), None)
        if opening is None:
            return [event]
        if opening in self.seen:
            return []
        self.seen.add(opening)
        return [event]
