"""The thinking moved in a stream of choices, event by event: chat (``delta.content`` into
the field setting's ``delta`` field) and text completions (``text``, its thinking beside it
on the choice); and a chat stream's opening (``ChatOpening``: each choice opens with its role, see
reshape.py on openings). An event that holds no ``<`` while no splitter is inside or holding a tag
is not parsed (the fast path: most events need no change)."""

from __future__ import annotations

import json
from typing import Any

from fitbox.server.streams.events import dumps, event_data, frame
from fitbox.server.streams.thinking import ENGINE_FIELD, ThinkSplitter, split_into


class _ChoiceShaper:
    def __init__(self, field: str) -> None:
        self.field = field
        self.splitters: dict[int, ThinkSplitter] = {}

    def _idle(self) -> bool:
        return not self.splitters or all(s.idle for s in self.splitters.values())

    def _splitter(self, choice: dict[str, Any]) -> ThinkSplitter:
        return self.splitters.setdefault(int(choice.get("index") or 0), ThinkSplitter())

    def _fed(self, choice: dict[str, Any], text: object) -> tuple[str, str]:
        """The (thinking, text) this piece of the choice completes, its end's at its end."""
        splitter = self._splitter(choice)
        thought, rest = splitter.feed(text) if isinstance(text, str) else ("", "")
        if choice.get("finish_reason") is not None:
            tail_thought, tail_rest = splitter.finish()
            thought, rest = thought + tail_thought, rest + tail_rest
        return thought, rest


class ChatShaper(_ChoiceShaper):
    """A chat stream: each choice's ``delta.content`` split, the thinking (the engine's
    ``reasoning_content`` first) in ``field``."""

    def passes(self, chunk: bytes) -> bool:
        """No splitter is inside or holding, no tag may start here, and nothing to rename."""
        return (
            b"<" not in chunk
            and self._idle()
            and (self.field == ENGINE_FIELD or b'"reasoning_content"' not in chunk)
        )

    def event(self, event: bytes) -> list[bytes]:
        if not event.startswith(b"data: {") or self.passes(event):
            return [event]
        try:
            body = json.loads(event[6:])
        except ValueError:
            return [event]
        for choice in body.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            text = delta.get("content")
            reasoning, content = self._fed(choice, text)
            split_into(
                delta, reasoning, content, self.field, isinstance(text, str) or bool(content)
            )
        return [b"data: " + dumps(body)]


class CompletionShaper(_ChoiceShaper):
    """``/v1/completions`` streamed: each choice's ``text`` split, its thinking beside it."""

    def passes(self, chunk: bytes) -> bool:
        return b"<" not in chunk and self._idle()

    def event(self, event: bytes) -> list[bytes]:
        data = None if self.passes(event) else event_data(event)
        if data is None:
            return [event]
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            text = choice.get("text")
            thought, rest = self._fed(choice, text)
            if isinstance(text, str) or rest:
                choice["text"] = rest
            if thought:
                choice[self.field] = thought
        return [frame(data)]


class ChatOpening:
    """Each choice of a chat stream opens with a chunk whose delta is the role; one is made
    (from the choice's first chunk, its text left out) for a choice that opens without."""

    def __init__(self, choices: int) -> None:
        self.waiting = set(range(choices))  # the choices whose first chunk has not come

    def passes(self, chunk: bytes) -> bool:
        return not self.waiting

    def event(self, event: bytes) -> list[bytes]:
        if not self.waiting:
            return [event]
        if self.waiting == {0} and b'"role":' in event:
            # one choice, and its delta has the role (a bare ``"role":`` is no text's: its
            # quotes would be escaped): opened, unparsed
            self.waiting.clear()
            return [event]
        data = event_data(event)
        choices = data.get("choices") if data is not None else None
        if data is None or not isinstance(choices, list):
            return [event]
        openings = []
        for choice in choices:
            index = choice.get("index", 0) if isinstance(choice, dict) else None
            if index not in self.waiting:
                continue
            self.waiting.discard(index)
            delta = choice.get("delta")
            if isinstance(delta, dict) and "role" not in delta:
                role = {
                    "index": index,
                    "delta": {"role": "assistant", "content": None},
                    "finish_reason": None,
                }
                openings.append(frame({**_without_figures(data), "choices": [role]}))
        return [*openings, event]


def _without_figures(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in ("timings", "usage", "choices")}
