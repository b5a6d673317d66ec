"""The name a client asked for, in the ``model`` field of its reply.

A child answers with the name it was launched under (the artifact's, ``--alias``); a client
that asked by an alias, a family name or a default model's stand-in gets its own name
back, and the artifact in ``x-fitbox-model``. The rewrite works on bytes, over whole events
(the pass, reshape.py, hands it no cut one), so a stream is not buffered. ``"model":"…"``
with bare quotes cannot occur inside a JSON string (its quotes would be escaped), so only
the field itself is rewritten; llama-server writes JSON without spaces.
"""

from __future__ import annotations

import functools
import json


class NameRewrite:
    def __init__(self, served: str, asked: str) -> None:
        self.find = b'"model":' + json.dumps(served, ensure_ascii=False).encode()
        self.put = b'"model":' + json.dumps(asked).encode()

    def whole(self, content: bytes) -> bytes:
        """``content`` (a whole reply, or whole events) with the asked name."""
        return content.replace(self.find, self.put)


@functools.lru_cache(maxsize=256)  # a box serves few names: each pair is encoded once
def rewrite_for(served: str, asked: str) -> NameRewrite | None:
    """None when the reply already carries the asked name."""
    return None if served == asked else NameRewrite(served, asked)
