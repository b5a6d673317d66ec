"""Stream and reply reshaping, bytes in and bytes out: one pass (reshape.py) over an
engine's reply, testable without a Box."""

from __future__ import annotations

from fitbox.server.streams.reshape import Reshape
from fitbox.server.streams.thinking import Thinking, request_body, target

__all__ = ["Reshape", "Thinking", "request_body", "target"]
