"""What a call needs before it is placed: its prompt's tokens and its slots.

A prompt is counted by the model's own chat template and tokenizer when the model is
ready (the engine seam's ``count_prompt``); otherwise by a bound that is never below that
count (core/prompts.py), and counted again once placed. The window asked for holds the
prompt, one more token for the engine to write into (llama-server refuses a prompt that
fills its slot), and the reply, capped at the largest slot the model can load: a reply
longer than that is cut by the engine, as llama-server does. A prompt that fills the
largest slot is refused with both numbers, in llama-server's own error shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fitbox.core.prompts import prompt_bound
from fitbox.core.slots import choose
from fitbox.core.types import ResidentState
from fitbox.engines.http1 import EngineConnectionError
from fitbox.errors import ContextExceeded, InvalidRequest
from fitbox.models.templates import chat_template_bytes

from .admit import Admission
from .asks import Asks
from .resident import Resident


@dataclass(frozen=True)
class PromptSize:
    tokens: int
    exact: bool  # counted by the model's tokenizer; else a bound never below that count
    largest: int  # the longest prompt + reply one slot of this model can hold (0: unknown)

    def need(self, max_tokens: int) -> int:
        """Tokens of window one call needs: prompt, the engine's next cell, the reply."""
        need = self.tokens + 1 + max_tokens
        return min(need, self.largest) if self.largest else need

    def refuse_if_too_long(self, param: str) -> None:
        """A counted prompt no window holds is refused before it reaches an engine."""
        if self.exact and self.largest and self.tokens >= self.largest:
            raise ContextExceeded(
                f"request ({self.tokens} tokens) exceeds the available context size "
                f"({self.largest} tokens), the largest window this model loads; shorten "
                "the prompt", param=param, n_prompt_tokens=self.tokens, n_ctx=self.largest,
            )  # fmt: skip


class Needs:
    def __init__(self, parallel: int, asks: Asks, admission: Admission) -> None:
        self.slots = choose(parallel)  # what every child gets (core/slots.py)
        self.asks, self.admission = asks, admission

    def choices(self, body: dict[str, Any]) -> int:
        """The slots a call takes: its ``n``. More than a child has is refused here."""
        n = body.get("n", 1)
        if n is None:
            return 1
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidRequest(f"'n' must be a whole number of at least 1 (got {n!r}).",
                                 param="n", code="invalid_n")  # fmt: skip
        if n > self.slots.count:
            raise InvalidRequest(
                f"'n' is {n}; a model on this box serves at most {self.slots.count} choices "
                f"at once (its slots, FITBOX_PARALLEL={self.slots.count}). Ask for fewer, "
                "or raise FITBOX_PARALLEL.", param="n", code="n_above_slots",
            )  # fmt: skip
        return n

    async def prompt(self, name: str, path: str, raw: bytes, body: dict[str, Any]) -> PromptSize:
        named = self.asks.named(name)
        trained = named.first.facts.shape.n_ctx_train
        largest = self.slots.window_each(trained) if trained > 0 else 0
        resident = self.admission.joinable(named)
        if resident is not None:
            counted = await self.counted(resident, path, raw)
            if counted is not None:
                return PromptSize(counted, True, largest)
        bound = prompt_bound(body, chat_template_bytes(named.first.path))
        return PromptSize(bound, False, largest)

    async def counted(self, resident: Resident, path: str, raw: bytes) -> int | None:
        """The prompt's tokens by a ready resident's own engine; None when it cannot say."""
        if resident.state is not ResidentState.READY or resident.child is None:
            return None
        try:
            return await resident.engine.count_prompt(resident.child.pool, path, raw)
        except EngineConnectionError:
            return None  # it is going away: the bound stands, the engine still checks
