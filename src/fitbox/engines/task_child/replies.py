"""What a runner hands the generic child back: a whole reply or a stream, or a refusal.

A runner module defines ``load(model, device, threads) -> Runner``; a ``Runner`` has
``routes``: OpenAI paths to functions of the call's JSON body (what fitbox's door wrote:
the fields the client sent, ``file`` the spooled upload's path) returning a ``Whole`` or a
``Stream``, and ``measured``: what the last call measured (``audio_in_s``, ``audio_out_s``,
``pixels``…), read by fitbox once the call ended. Stdlib only: every environment has it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class BadRequest(ValueError):
    """The call cannot be served as asked; ``param`` names the field, ``code`` the why."""

    def __init__(self, message: str, param: str | None = None, code: str = "bad_request"):
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass
class Whole:
    content: bytes
    content_type: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Stream:
    chunks: Iterator[bytes]  # each written as one chunk as soon as it is made
    content_type: str
    headers: Mapping[str, str] = field(default_factory=dict)


Reply = Whole | Stream
Route = Callable[[dict[str, Any]], Reply]


class Runner(Protocol):
    routes: Mapping[str, Route]
    measured: dict[str, float]  # the last call's figures (its audio seconds…)

    def extra_props(self) -> dict[str, Any]:
        """What ``/props`` says beyond the memory figures (sample rate, voices…)."""
        ...
