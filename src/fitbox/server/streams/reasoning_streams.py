"""The thinking moved in a stream, event by event, in each route's shape (the shapes are
reasoning_routes.py's; chat's stream is reasoning.py's ``StreamShaper``).

Responses: the engine's message item is held back (its ``output_item.added`` and
``content_part.added``) until its first text, so a reasoning item opened by the thinking
before it comes first in ``output``; every item is numbered (``output_index``) in the order
it is sent. The reasoning item stays open until the message's text is done, so thinking
that comes after text still lands in it. Messages: each engine text block becomes a
thinking block and a text block, as the thinking and the text come; every block after is
numbered on (``index``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from fitbox.server.streams import reasoning
from fitbox.server.streams.reasoning import ThinkSplitter
from fitbox.server.streams.reasoning_routes import (
    COMPLETIONS,
    MESSAGES,
    RESPONSES,
    Thinking,
    dumps,
    field_of,
    message_text,
    reasoning_id,
    reasoning_item,
    set_message_text,
    split,
    thinking_block,
)
from fitbox.server.streams.sse_events import EventCutter, event_data, relay


class EventShaper(EventCutter):
    """A route's event stream, event by event (held until its ``\\n\\n``): subclasses say
    what becomes of one parsed event (a list of events to send in its place)."""

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._one(e) for e in self.whole(chunk))

    def _one(self, event: bytes) -> bytes:
        data = event_data(event)
        if data is None:
            return event + b"\n\n"
        out = self.shape(data)
        if out is None:
            return event + b"\n\n"
        return b"".join(self.frame(e) for e in out)

    def frame(self, data: dict[str, Any]) -> bytes:
        return b"data: " + dumps(data) + b"\n\n"

    def shape(self, data: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The events to send for ``data``; None sends the event as it came."""
        raise NotImplementedError


class NamedEventShaper(EventShaper):
    """Responses and Messages streams name each event (``event: <type>``) before its data."""

    def frame(self, data: dict[str, Any]) -> bytes:
        return b"event: " + str(data.get("type", "")).encode() + b"\n" + super().frame(data)


class CompletionShaper(EventShaper):
    """``/v1/completions`` streamed: each choice's ``text`` split, its thinking beside it."""

    def __init__(self, field: str) -> None:
        super().__init__()
        self.field = field
        self.splitters: dict[int, ThinkSplitter] = {}

    def _one(self, event: bytes) -> bytes:
        if b"<" not in event and all(s.idle for s in self.splitters.values()):
            return event + b"\n\n"  # the fast path: no tag here and none begun
        return super()._one(event)

    def shape(self, data: dict[str, Any]) -> list[dict[str, Any]] | None:
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            splitter = self.splitters.setdefault(int(choice.get("index") or 0), ThinkSplitter())
            text = choice.get("text")
            thought, rest = splitter.feed(text) if isinstance(text, str) else ("", "")
            if choice.get("finish_reason") is not None:
                tail_thought, tail_rest = splitter.finish()
                thought, rest = thought + tail_thought, rest + tail_rest
            if isinstance(text, str) or rest:
                choice["text"] = rest
            if thought:
                choice[self.field] = thought
        return [data]


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


class ResponsesShaper(NamedEventShaper):
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

    def _one(self, event: bytes) -> bytes:
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
            return super()._one(event)
        numbers = f',"output_index":{message.index},"content_index":0,"sequence_number":'
        self.sequence += 1
        return event[:-1] + f"{numbers}{self.sequence - 1}}}\n\n".encode()

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


class _TextBlock:
    """One engine text block of a Messages stream: it becomes a thinking block and a text
    block (as many as the thinking and the text alternate), numbered as they are sent."""

    def __init__(self, start: dict[str, Any]) -> None:
        self.start = start  # the engine's own text block (its fields kept)
        self.splitter = ThinkSplitter()
        self.open: str | None = None  # "thinking" or "text": the block sent and not closed
        self.index = 0
        self.sent = False


class MessagesShaper(NamedEventShaper):
    def __init__(self) -> None:
        super().__init__()
        self.texts: dict[int, _TextBlock] = {}
        self.indexes: dict[int, int] = {}  # the engine's other blocks: the index sent
        self.sent = 0
        self.thought = False  # a thinking block was sent: the blocks after it are renumbered

    def _one(self, event: bytes) -> bytes:
        """The fast path: with no thinking block sent, a delta with no tag in it, while no
        block is held or inside a tag, passes as it came (its index is the engine's)."""
        if (
            self.thought
            or b"<" in event
            or not event.startswith(b"event: content_block_delta\n")
            or not all(
                b.splitter.idle and (b.sent or b.open is not None) for b in self.texts.values()
            )
        ):
            return super()._one(event)
        return event + b"\n\n"

    def shape(self, data: dict[str, Any]) -> list[dict[str, Any]] | None:
        kind = data.get("type")
        index = data.get("index")
        if not kind or not str(kind).startswith("content_block_") or not isinstance(index, int):
            return None
        block = data.get("content_block")
        if kind == "content_block_start" and isinstance(block, dict):
            if block.get("type") == "text":
                self.texts[index] = _TextBlock(block)
                thought, text = self.texts[index].splitter.feed(str(block.get("text") or ""))
                return self._pieces(self.texts[index], thought, text)
            self.indexes[index] = self.sent
            self.sent += 1
        text_block = self.texts.get(index)
        if text_block is None:
            data["index"] = self.indexes.get(index, index)
            return [data]
        delta = data.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        if kind == "content_block_delta" and delta.get("type") == "text_delta":
            thought, text = text_block.splitter.feed(str(delta.get("text") or ""))
            return self._pieces(text_block, thought, text)
        if kind == "content_block_stop":
            thought, text = text_block.splitter.finish()
            out = self._pieces(text_block, thought, text)
            if not text_block.sent:  # a block with no text at all: sent as it came
                out += self._switch(text_block, "text")
            return out + self._switch(text_block, None)
        data["index"] = text_block.index
        return [data]

    def _pieces(self, block: _TextBlock, thought: str, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if thought:
            out += self._switch(block, "thinking")
            out.append(
                {
                    "type": "content_block_delta",
                    "index": block.index,
                    "delta": {"type": "thinking_delta", "thinking": thought},
                }
            )
        if text:
            out += self._switch(block, "text")
            out.append(
                {
                    "type": "content_block_delta",
                    "index": block.index,
                    "delta": {"type": "text_delta", "text": text},
                }
            )
        return out

    def _switch(self, block: _TextBlock, kind: str | None) -> list[dict[str, Any]]:
        """Close the block being sent unless it is of ``kind``; open one of ``kind``."""
        if block.open == kind:
            return []
        out: list[dict[str, Any]] = []
        if block.open is not None:
            out.append({"type": "content_block_stop", "index": block.index})
        block.open = kind
        if kind is None:
            return out
        block.index, block.sent = self.sent, True
        self.sent += 1
        self.thought = self.thought or kind == "thinking"
        start = thinking_block("") if kind == "thinking" else {**block.start, "text": ""}
        out.append({"type": "content_block_start", "index": block.index, "content_block": start})
        return out


def shaper_for(thinking: Thinking) -> EventShaper | reasoning.StreamShaper:
    if thinking.path == COMPLETIONS:
        return CompletionShaper(thinking.field)
    if thinking.path == RESPONSES:
        return ResponsesShaper()
    if thinking.path == MESSAGES:
        return MessagesShaper()
    return reasoning.StreamShaper(thinking.field)


def shaped(
    chunks: AsyncGenerator[bytes, None], thinking: Thinking | None
) -> AsyncGenerator[bytes, None]:
    """``chunks`` (an engine's event stream) with the thinking in its route's shape; chat
    (and a call that splits nothing) goes to reasoning.py as it is, no layer added."""
    if thinking is None or thinking.path == reasoning.CHAT or not thinking.splits:
        return reasoning.shaped(chunks, field_of(thinking))
    return relay(chunks, shaper_for(thinking))
