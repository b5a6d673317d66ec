"""The thinking moved in a Messages stream, event by event (the shapes are thinking.py's):
each engine text block becomes a thinking block and a text block, as the thinking and the
text come; every block after is numbered on (``index``)."""

from __future__ import annotations

import secrets
from typing import Any

from fitbox.server.streams.events import NamedShaper, event_data, frame
from fitbox.server.streams.thinking import ThinkSplitter, thinking_block


class _TextBlock:
    """One engine text block of a Messages stream: it becomes a thinking block and a text
    block (as many as the thinking and the text alternate), numbered as they are sent."""

    def __init__(self, start: dict[str, Any]) -> None:
        self.start = start  # the engine's own text block (its fields kept)
        self.splitter = ThinkSplitter()
        self.open: str | None = None  # "thinking" or "text": the block sent and not closed
        self.index = 0
        self.sent = False


class MessagesShaper(NamedShaper):
    def __init__(self) -> None:
        super().__init__()
        self.texts: dict[int, _TextBlock] = {}
        self.indexes: dict[int, int] = {}  # the engine's other blocks: the index sent
        self.sent = 0
        self.thought = False  # a thinking block was sent: the blocks after it are renumbered

    def passes(self, chunk: bytes) -> bool:
        """One event (whole) that the fast path below lets through."""
        return chunk.find(b"\n\n") == len(chunk) - 2 and self._plain(chunk)

    def event(self, event: bytes) -> list[bytes]:
        return [event] if self._plain(event) else super().event(event)

    def _plain(self, event: bytes) -> bool:
        """The fast path: with no thinking block sent, a delta with no tag in it, while no
        block is held or inside a tag, passes as it came (its index is the engine's)."""
        return (
            not self.thought
            and b"<" not in event
            and event.startswith(b"event: content_block_delta\n")
            and all(b.splitter.idle and (b.sent or b.open is not None) for b in self.texts.values())
        )

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


def message_start(model: str, prompt_tokens: int | None) -> bytes:
    """A Messages stream's opening event (with its ``\\n\\n``): its model the served name
    (put back as the asked one after), its input tokens the prompt as the engine counts it
    (0 when it cannot say within its time)."""
    usage = {"input_tokens": prompt_tokens or 0, "output_tokens": 0}
    message: dict[str, Any] = {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return frame({"type": "message_start", "message": message}, "message_start") + b"\n\n"


class MessagesOpening:
    """A Messages stream opens with ``message_start``: ``missing`` says its first event is
    another (the pass makes one)."""

    def __init__(self) -> None:
        self.first = True
        self.missing = False

    def passes(self, chunk: bytes) -> bool:
        return not self.first

    def event(self, event: bytes) -> list[bytes]:
        if self.first:
            self.first = False
            data = event_data(event)
            self.missing = data is not None and data.get("type") != "message_start"
        return [event]
