"""The name a client asked for, in the ``model`` field of its reply.

A child answers with the name it was launched under (the artifact's, ``--alias``); a client
that asked by an alias, a family name or a default model's stand-in gets its own name
back, and the artifact in ``x-fitbox-model``. The rewrite works on bytes, line by line: an
SSE event is never held past its own end, so a stream is not buffered. ``"model":"…"`` with
bare quotes cannot occur inside a JSON string (its quotes would be escaped), so only the
field itself is rewritten; llama-server writes JSON without spaces.
"""

from __future__ import annotations

import json


class NameRewrite:
    def __init__(self, served: str, asked: str) -> None:
        self.find = b'"model":' + json.dumps(served, ensure_ascii=False).encode()
        self.put = b'"model":' + json.dumps(asked).encode()
        self._held = b""  # the start of a line whose end has not come yet

    def whole(self, content: bytes) -> bytes:
        return content.replace(self.find, self.put)

    def piece(self, chunk: bytes) -> bytes:
        """The complete lines so far, rewritten; a line cut by the chunk waits for its end."""
        data = self._held + chunk
        cut = data.rfind(b"\n") + 1
        self._held = data[cut:]
        return data[:cut].replace(self.find, self.put)

    def rest(self) -> bytes:
        """What was held when the stream ended (a stream whose last line has no newline)."""
        held, self._held = self._held, b""
        return held.replace(self.find, self.put)


def rewrite_for(served: str, asked: str) -> NameRewrite | None:
    """None when the reply already carries the asked name."""
    return None if served == asked else NameRewrite(served, asked)
