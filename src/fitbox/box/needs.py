"""What a call needs before it is placed: its prompt's tokens, its slots, and the cells of
a shared pool it may come to hold (core/slots.py ``Demand``, FORMULAS.md §KV cells).

A prompt is sized by a bound that is never below its tokens (core/prompts.py). When the
bound overflows the slot of the model it goes to, the prompt is counted by the model's own
chat template and tokenizer (the engine seam's ``count_prompt``), before it is placed when
the model is ready, else once placed; unless the engine refuses a prompt too long for its
slot with the prompt's count (``sends_on_bound``, llama-server): then the call is sent on
its bound, and placed again by the count only when it is refused (box/serving.py
``Served.answer``): no counting round trip before a long-prompt call, unless its bound
would hold more than a slot's share of a shared pool of cells or more than is free, where
a bound of bytes (several times the tokens) would keep calls that fit waiting (the count
of a 2,330-token chat: 11.6 ms median here, against 47 s for the call). The window asked
for holds the prompt, one more token for the engine to write into (llama-server refuses a
prompt that fills its slot), and the reply, capped at the largest slot the model can load:
a reply longer than that is cut by the engine, as llama-server does. A prompt that fills
the largest slot is refused with both numbers, in llama-server's own error shape.

An image in the prompt is bounded by the tokens the model's projector or processor makes
of it (core/image_tokens.py); a model whose kind is not covered bounds it by its bytes, and
says so in the log once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fitbox.core.image_tokens import ImageTokens
from fitbox.core.prompts import image_payloads, prompt_bound
from fitbox.core.slots import Demand, choose
from fitbox.core.types import ResidentState
from fitbox.engines.http1 import EngineConnectionError
from fitbox.engines.seam import Engine
from fitbox.errors import ContextExceeded, InvalidRequest
from fitbox.models.catalog import Artifact
from fitbox.models.templates import chat_template_bytes
from fitbox.models.vision import image_tokens

from .admit import Admission
from .asks import Asks, Named
from .resident import Resident

COUNT_S = 10.0  # the longest a call waits for its engine to count its prompt
# the routes whose calls write a reply into the engine's cells, beside their prompt's
GENERATES = frozenset(
    ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/infill")
)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptSize:
    tokens: int
    exact: bool  # counted by the model's tokenizer; else a bound never below that count
    largest: int  # the longest prompt + reply one slot of this model can hold (0: unknown)
    claimed: bool = False  # a bound its loaded model could not count: it stands for the prompt

    def need(self, max_tokens: int) -> int:
        """Tokens of window one call needs: prompt, the engine's next cell, the reply."""
        need = self.tokens + 1 + max_tokens
        return min(need, self.largest) if self.largest else need

    def split(self, max_tokens: int) -> tuple[int, int]:
        """(need, the reply's part of it) as admission reads them: need minus reply is
        the prompt a loaded window must hold, which reloads a model whose slot is smaller
        (box/admit.py _outgrown). A bound claims one token of it (a loose bound never
        reloads a model; the engine's count does, once placed), unless the loaded model
        could not count it (stopped, hung: the call then waits for a larger window as it
        would for a counted prompt); a reply cut by the largest slot claims what is left."""
        need = self.need(max_tokens)
        prompt = min(self.tokens + 1, need) if self.exact or self.claimed else 1
        return need, need - prompt

    def refuse_if_too_long(self, param: str) -> None:
        """A counted prompt no window holds is refused before it reaches an engine."""
        if self.exact and self.largest and self.tokens >= self.largest:
            raise ContextExceeded(
                f"request ({self.tokens} tokens) exceeds the available context size "
                f"({self.largest} tokens), the largest window this model loads; shorten "
                "the prompt",
                param=param,
                n_prompt_tokens=self.tokens,
                n_ctx=self.largest,
            )


class Needs:
    def __init__(self, parallel: int, asks: Asks, admission: Admission) -> None:
        self.slots = choose(parallel)  # what every child gets (core/slots.py)
        self.asks, self.admission = asks, admission
        self.uncounted: set[str] = set()  # models logged as bounding images by their bytes

    @staticmethod
    def asked(body: dict[str, Any]) -> int:
        """The choices a call asks for (``n``, 1 when left out)."""
        n = body.get("n", 1)
        if n is None:
            return 1
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidRequest(
                f"'n' must be a whole number of at least 1 (got {n!r}).",
                param="n",
                code="invalid_n",
            )
        return n

    def choices(self, body: dict[str, Any], engine: Engine) -> int:
        """The slots a call takes: its ``n`` on an engine that runs each choice on a slot
        of its own (``slots_for``). More than a child has is refused here."""
        n = self.asked(body)
        taken = engine.slots_for(n)
        if taken > self.slots.count:
            raise InvalidRequest(
                f"'n' is {n}; a model on this box serves at most {self.slots.count} choices "
                f"at once (its slots, FITBOX_PARALLEL={self.slots.count}). Ask for fewer, "
                "or raise FITBOX_PARALLEL.",
                param="n",
                code="n_above_slots",
            )
        return taken

    async def prompt(
        self, named: Named, path: str, raw: bytes, body: dict[str, Any], reply: int = 0
    ) -> PromptSize:
        """The prompt's size before placement: the bound when it already fits the slot of
        a loaded model, or when the loaded model's engine refuses a prompt too long for
        its slot with the prompt's count (no engine round trip before the call is sent),
        and the cells the bound would hold of a shared pool are no more than a slot's
        share nor than what is free (``reply``: its max tokens, 0 for none); else the
        loaded model's own count, else the bound."""
        trained = named.first.facts.shape.n_ctx_train
        largest = self.slots.window_each(trained) if trained > 0 else 0
        bound = PromptSize(
            self.bounded(body, chat_template_bytes(named.first.path), named.artifacts),
            False,
            largest,
        )
        resident = self.admission.joinable(named)
        if resident is None:
            return bound
        on_bound = fits(bound, resident) or resident.engine.sends_on_bound(path)
        if on_bound and not self.holds_much(bound, resident, path, body, reply):
            return bound
        counted = await self.counted(resident, path, raw)
        if counted is None:  # counted for its cells only: the bound stands, as it was sent
            return bound if on_bound else PromptSize(bound.tokens, False, largest, claimed=True)
        return PromptSize(counted, True, largest)

    def demand(
        self, path: str, size: PromptSize, body: dict[str, Any], reply: int
    ) -> Demand | None:
        """What a call may hold of a shared pool of cells: its prompt (counted, or its
        bound), its reply budget (``reply``; 0: none asked, up to the window) and its
        choices; None for a call that writes no reply (embeddings, tokenize)."""
        if path not in GENERATES:
            return None
        return Demand(size.tokens, reply or None, self.asked(body))

    def holds_much(
        self, bound: PromptSize, resident: Resident, path: str, body: dict[str, Any], reply: int
    ) -> bool:
        """Whether the cells a prompt's bound would hold of ``resident``'s shared pool are
        more than a slot's share of it or than its calls leave free: then its count is worth
        a round trip to the engine (a bound of bytes, several times the tokens, would hold
        calls back that fit). A call with no reply budget holds the pool whatever its count;
        one with images keeps its bound (the engine's text count leaves their tokens out)."""
        pool = resident.slots.pool(resident.window)
        demand = self.demand(path, bound, body, reply)
        if pool is None or demand is None or demand.reply is None:
            return False
        if next(image_payloads(body.get("messages", body.get("input"))), None) is not None:
            return False
        share = pool // max(resident.slots.count, 1)
        return demand.cells(pool) > min(share, pool - resident.cells_taken)

    def bounded(
        self, body: dict[str, Any], template_bytes: int, artifacts: Sequence[Artifact]
    ) -> int:
        """The prompt bound over every variant the call may be placed on: the largest, each
        variant's images counted by its own projector or processor."""
        chat = body.get("messages", body.get("input"))
        if not artifacts or next(image_payloads(chat), None) is None:  # no image it counts
            return prompt_bound(body, template_bytes)
        return max(prompt_bound(body, template_bytes, self.per_image(a)) for a in artifacts)

    def per_image(self, artifact: Artifact) -> ImageTokens | None:
        """What one image becomes in ``artifact``'s engine; None (logged once a model) when
        its projector or processor is a kind fitbox does not count."""
        tokens = image_tokens(artifact.path, artifact.projector)
        if tokens is None and artifact.name not in self.uncounted:
            self.uncounted.add(artifact.name)
            kind = (
                f"projector type {artifact.projector.projector_type!r}"
                if artifact.projector
                else "its processor"
            )
            log.info(
                "%s: no image token count for %s (%s); its images are bounded by "
                "their bytes as tokens",
                artifact.name,
                kind,
                artifact.mmproj or artifact.path,
            )
        return tokens

    async def counted(self, resident: Resident, path: str, raw: bytes) -> int | None:
        """The prompt's tokens by a ready resident's own engine; None when it cannot say
        (within ``COUNT_S``: a stopped or hung engine leaves the bound standing, and the
        call then meets the hang watchdog like any other)."""
        if resident.state is not ResidentState.READY or resident.child is None:
            return None
        counting = resident.engine.count_prompt(resident.child.pool, path, raw)
        try:
            async with asyncio.timeout(COUNT_S):  # not wait_for: on 3.11 it can lose a cancel
                return await counting
        except (EngineConnectionError, TimeoutError):
            return None  # it is going away, or busy: the bound stands, the engine checks


def fits(size: PromptSize, resident: Resident) -> bool:
    """Whether the prompt surely fits a slot of ``resident`` (a bound is never below)."""
    return size.tokens < resident.slots.window_each(resident.window)
