"""A call served: from the name it asked for to its engine's answer, its row kept throughout.

    served = box.serving.open(Order(endpoint, body, raw, request_id, allowed, images))
    answer = await served.serve()   # admitted, placed, sent; placed again on a counted prompt

Opening writes the call's row (box/calls.py) and resolves the name once (``Named``): the
key's model limit, the box's default model (``FITBOX_DEFAULT_MODEL``, said in
``served.headers``), the route the model's engine kind serves, images on a model that reads
them, the slots its ``n`` takes, and whether a stream waits for a load (``waits``: its 200
goes first, server/inference/progress.py). A refusal there is recorded on the row at once
and raised by ``serve()``, once its end is stored. The name travels with the call: needs,
admission and the lease get the ``Named``, never the name again.

``serve()`` places the call by its prompt's size (box/needs.py) and sends it. A bound that
overflows the slot it got is counted once placed, and placed again with a larger window
(or refused with both numbers) when the count outgrows it; unless the engine says so itself
when it is sent (``sends_on_bound``): then the call goes on its bound, and is placed again
only when the engine refuses it with the prompt's count. A streamed answer's row is stored
before it is handed back (its status line is its first byte). ``server/`` frames the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fitbox.core.types import ResidentState
from fitbox.engines.http1 import EngineResponse
from fitbox.engines.kinds import EngineKinds
from fitbox.errors import (
    FitboxError,
    InvalidRequest,
    ModelNotFound,
    ModelNotServable,
    PermissionDenied,
    RouteNotServed,
)
from fitbox.models.catalog import Artifact, Catalog
from fitbox.store.db import CentralKey

from .asks import Asks, Named
from .calls import Call, CallDesk
from .helper.menu import HELPER
from .needs import Needs, PromptSize, fits
from .resident import Resident
from .residents import Registry
from .supervision.crashes import CrashLedger

log = logging.getLogger(__name__)


@dataclass(slots=True)  # not frozen: a frozen init costs ~1 us a call on the hot path
class Order:
    """A call as the edge parsed it: what the box needs to open it and serve it."""

    endpoint: str
    body: dict[str, Any]
    raw: bytes  # the body as the engine gets it
    request_id: str
    allowed: tuple[str, ...] | None = None  # the models the caller's key may use; None: any
    images: int = 0  # images in the body (checked by the edge: server/door/bodies.py)
    accept: str = "*/*"
    method: str = "POST"
    query: str = ""  # the client's query string, passed on
    central_key: CentralKey | None = None  # the central's key the call came through with
    work: float | None = None  # a task call's units of work, its ETA (box/task_speeds.py)


@dataclass(slots=True)
class Answer:
    """The engine's answer to a placed call: its status line and headers are in."""

    resident: Resident
    response: EngineResponse


class Serving:
    """Opens calls that are served (``CallDesk`` opens their rows)."""

    def __init__(
        self,
        desk: CallDesk | None,
        catalog: Catalog,
        asks: Asks,
        needs: Needs,
        engines: EngineKinds,
        registry: Registry,
        crashes: CrashLedger,
        default_model: str,
    ) -> None:
        self.desk, self.catalog, self.asks, self.needs = desk, catalog, asks, needs
        self.engines, self.registry, self.crashes = engines, registry, crashes
        self.default_model = default_model

    def open(self, order: Order) -> Served:
        """The call's row, and every check that needs no engine: a call refused here keeps
        its error (recorded now) for ``serve()``."""
        assert self.desk is not None, "calls are recorded: a box that serves has a store"
        asked = order.body["model"]
        call = self.desk.open(
            order.endpoint,
            asked,
            bool(order.body.get("stream")),
            order.request_id,
            order.central_key,
        )
        call.work = order.work
        served = Served(self, call, order)
        try:
            served.named, served.headers = self._routed(order, asked)
            check_conversation(order)
            engine = self.engines.for_artifact(served.named.first)
            served.slots = self.needs.choices(order.body, engine)  # an n no child gives: now
            served.waits = call.stream and self.must_load(served.named)
        except FitboxError as refusal:
            call.failed(refusal)
            served.refusal = refusal
        except BaseException:
            call.interrupted()
            raise
        return served

    def _routed(self, order: Order, asked: str) -> tuple[Named, dict[str, str]]:
        """The name the call is placed under, resolved once, with the headers that say so;
        refused when the key may not use it or no variant serves the route."""
        if asked == HELPER:  # a chat naming it never comes here (server/inference/helper.py)
            raise InvalidRequest(
                f"'{HELPER}' is fitbox's helper menu, not weights: it answers "
                f"/v1/chat/completions only, not {order.endpoint}.",
                param="model",
                code="helper_chat_only",
            )
        self.check_allowed(order.allowed, asked)
        named, headers = self.routed(asked)
        named = self.loadable(named)
        if named.asked != asked:
            self.check_allowed(order.allowed, named.asked)  # a key's limit holds for what serves
        embeds = bool(self.asks.knobs(named)["embeddings"])
        check_served(named, order.endpoint, self.engines, order.images, embeds)
        return named, headers

    def check_allowed(self, allowed: tuple[str, ...] | None, name: str) -> None:
        if allowed is None or name in allowed:
            return
        if self.catalog.resolve(name).name not in allowed:
            raise PermissionDenied(
                f"This key may not use the model '{name}'.", param="model", code="model_not_allowed"
            )

    def routed(self, asked: str) -> tuple[Named, dict[str, str]]:
        """The name a call is placed under: the one asked, or the box's default model when
        the box has no model of that name (``FITBOX_DEFAULT_MODEL``), said in a header."""
        default = self.default_model
        if not default or default == asked:
            return self.asks.named(asked), {}
        try:
            return self.asks.named(asked), {}
        except ModelNotFound as missing:
            try:
                named = self.asks.named(default)
            except ModelNotFound:
                raise ModelNotFound(
                    f"{missing.message} Its stand-in, FITBOX_DEFAULT_MODEL '{default}', is not "
                    "on this box either.",
                    param="model",
                ) from None
            return named, {"x-fitbox-default-model": default}

    def loadable(self, named: Named) -> Named:
        """``named`` without the variants whose file fitbox can no longer read, unless a
        child holds one (it serves on); refused with the reason when none is left."""
        usable = tuple(
            a
            for a in named.artifacts
            if self.catalog.problem(a.name) is None or self.registry.get(a.key) is not None
        )
        if usable == named.artifacts:
            return named
        if not usable:
            reason = self.catalog.problem(named.first.name) or "its file cannot be read"
            raise ModelNotServable.because(named.asked, reason, unreadable=True)
        return replace(named, artifacts=usable)

    def must_load(self, named: Named) -> bool:
        """Whether a call on ``named`` would wait for a load: none of its variants is ready,
        and none has failed (a failed model is refused at once, with its status). Asked
        before the call is placed; a call for a resident model is served as any."""
        for artifact in named.artifacts:
            resident = self.registry.get(artifact.key)
            if resident is not None and resident.state is ResidentState.READY:
                return False
        return not any(self.crashes.failed(a.key) for a in named.artifacts)


CONVERSATIONS = ("/v1/chat/completions", "/v1/messages")  # routes whose messages a reply answers


def check_conversation(order: Order) -> None:
    """A conversation with no message is refused, as OpenAI and Anthropic refuse it:
    llama-server renders it as a bare generation prompt and, without max_tokens, writes
    until the window is full, a reply to nothing. Checked once the name resolved, so an
    unknown model is still a 404 first."""
    if order.endpoint in CONVERSATIONS and order.body.get("messages") == []:
        raise InvalidRequest(
            "'messages' is empty: send at least one message.",
            param="messages",
            code="empty_array",
        )


def check_served(
    named: Named, path: str, engines: EngineKinds, images: int = 0, embeddings: bool = False
) -> None:
    """Refuse, before anything is loaded (or evicted for it), a route no variant of
    ``named`` can serve: its engine kind has no such route, a task its files say it cannot
    do (text from an embedding model, embeddings from a decoder whose ``embeddings``
    setting is off), ``/v1/rerank`` on a model that is not a reranker, or images for a
    model that reads none."""
    name, artifacts = named.asked, named.artifacts
    kinds = [engines.for_artifact(a) for a in artifacts]
    if not any(path in kind.routes() for kind in kinds):
        served_by = ", ".join(sorted({kind.name for kind in kinds}))
        raise RouteNotServed(
            f"'{name}' runs on {served_by}, which does not serve {path}.", param="model"
        )
    check_task(name, artifacts, path, embeddings)
    serving = [kind for kind in kinds if path in kind.routes()]
    waits = [kind.unavailable() for kind in serving]
    if all(waits) and waits[0] is not None:  # nothing is placed for a child that cannot start
        raise waits[0]
    if path == "/v1/rerank" and not any(a.facts.is_reranker for a in artifacts):
        raise InvalidRequest(
            f"'{name}' is not a reranker (its GGUF's pooling type is not rank), so it cannot "
            "serve /v1/rerank; name a reranker model (GET /v1/models lists them).",
            param="model",
            code="not_a_reranker",
        )
    check_vision(name, artifacts, path, images)


# Routes whose answer is text the model writes: an embedding model (or a reranker) has none.
WRITING = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/infill",
    }
)
# no double quotes: an SDK that shows the body's repr would escape the model's quotes
EMBEDDINGS_FIX = (
    " Turn its embeddings setting on (POST /v1/settings/pair with model {model} and "
    "embeddings true): a decoder then serves mean-pooled embeddings, loaded again as soon "
    "as it is idle."
)


def check_task(name: str, artifacts: Sequence[Artifact], path: str, embeddings: bool) -> None:
    """A task its files say the model cannot do, refused by name (the codes the engine's own
    refusal gets, server/inference/engine_errors.py) before a load that would evict."""
    if path in WRITING and all(a.facts.is_embedding for a in artifacts):
        ranks = all(a.facts.is_reranker for a in artifacts)
        what, serves = ("a reranker", "/v1/rerank") if ranks else ("an embedding model", "")
        raise InvalidRequest(
            f"'{name}' is {what} (its files say so): it serves {serves or '/v1/embeddings'}, "
            f"not {path}. Name a chat model (GET /v1/models lists them).",
            param="model",
            code="not_a_chat_model",
        )
    if (
        path == "/v1/embeddings"
        and not embeddings
        and not any(a.facts.is_embedding for a in artifacts)
    ):
        raise InvalidRequest(
            f"'{name}' is not an embeddings model on this box, so it does not serve "
            f"{path}; its embeddings setting is off.{EMBEDDINGS_FIX.format(model=name)}",
            param="model",
            code="not_an_embeddings_model",
        )


def check_vision(name: str, artifacts: Sequence[Artifact], path: str, images: int) -> None:
    """A call with ``images`` on a model that cannot read them: refused, saying how a model
    comes to read images. A family some of whose variants read images and some not is
    refused too (the placement could choose a blind one), naming the variants to pin."""
    if not images or all(a.vision for a in artifacts):
        return
    param = "input" if path == "/v1/responses" else "messages"
    seeing = [a.name for a in artifacts if a.vision]
    if seeing:
        raise InvalidRequest(
            f"Of the variants '{name}' stands for, only {', '.join(seeing)} read "
            "images (a vision projector beside them); name one of those.",
            param=param,
            code="model_not_vision_capable",
        )
    raise InvalidRequest(
        f"'{name}' does not read images: it is neither a vision-language transformers "
        "folder nor a GGUF with a vision projector (mmproj*.gguf) beside it. Send text "
        'only, or name a vision model (GET /v1/models marks them "vision": true).',
        param=param,
        code="model_not_vision_capable",
    )


@dataclass(slots=True)
class Served:
    """One call the box serves: opened, then ``serve()``d (once)."""

    serving: Serving
    call: Call
    order: Order
    named: Named | None = None  # the name resolved (after the default model); None: refused
    headers: dict[str, str] = field(default_factory=dict)  # what the answer says of its model
    slots: int = 1  # the slots it takes: its n
    waits: bool = False  # a stream whose model must load first: its 200 goes now
    refusal: FitboxError | None = None  # refused when it was opened

    async def serve(self) -> Answer:
        """The engine's answer: placed, sent, placed again when its engine counted a prompt
        its slot cannot hold. Its row ends on any failure here (stored before the error is
        raised: an error is a first and last byte); a streamed answer's row is stored before
        it is handed back. A stream that ``waits`` is not served here but by ``answer()``."""
        call = self.call
        try:
            if self.refusal is not None:
                raise self.refusal
            answer = await self.answer()
        except FitboxError as exc:
            if exc is not self.refusal:
                call.failed(exc)
            await call.finished()
            raise
        except BaseException:
            call.interrupted()
            raise
        if call.stream and answer.response.status < 400:
            await call.written()  # the status line is the first byte: the row is stored first
        return answer

    async def answer(self) -> Answer:
        """Place the call and send it. A call sent on its prompt's bound that the engine
        refuses because the slot it got cannot hold the prompt is placed again by the count
        the refusal carries (a larger window, or refused with both numbers), and sent once
        more: the common long prompt costs no counting round trips before it is sent."""
        assert self.named is not None, "a refused call is not served"
        call = self.call
        resident, size = await self._placed(self.named)
        response = await self._send()
        if call.prompt_tokens is not None:  # counted before it went: the engine's answer stands
            return Answer(resident, response)
        counted = await call.refused_prompt(response)
        if counted is None:
            return Answer(resident, response)
        response.close()
        call.unplace()
        log.info(
            "%s: its engine counted the prompt at %d tokens, more than the %d-token slot "
            "it was sent to; placed again by that count",
            call.model,
            counted,
            resident.slots.window_each(resident.window),
        )
        resident = await self._placed_by_count(self.named, counted, size.largest)
        return Answer(resident, await self._send())

    async def _send(self) -> EngineResponse:
        order = self.order
        return await self.call.send(order.raw, order.accept, order.method, order.query)

    async def _placed(self, named: Named) -> tuple[Resident, PromptSize]:
        """Place the call by its prompt's tokens (box/needs.py): counted by the model when it
        is ready and its engine cannot say a prompt is too long, else bounded. Returns the
        size it was first placed by."""
        needs, order, call = self.serving.needs, self.order, self.call
        asked = max_tokens(order.body)
        size = await needs.prompt(named, order.endpoint, order.raw, order.body, asked)
        size.refuse_if_too_long(prompt_param(order.body))
        need, reply = size.split(asked)
        demand = needs.demand(order.endpoint, size, order.body, asked)
        resident = await call.place(need, reply, size.tokens, self.slots, named, size.exact, demand)
        if size.exact or fits(size, resident) or resident.engine.sends_on_bound(order.endpoint):
            return resident, size
        counted = await needs.counted(resident, order.endpoint, order.raw)
        if counted is None or fits(PromptSize(counted, True, size.largest), resident):
            return resident, size
        call.unplace()
        return await self._placed_by_count(named, counted, size.largest), size

    async def _placed_by_count(self, named: Named, counted: int, largest: int) -> Resident:
        """Place again a call whose prompt its engine counted at ``counted`` tokens, more
        than the slot it had: a window that holds it, or refused with both numbers."""
        order = self.order
        size = PromptSize(counted, True, largest)
        size.refuse_if_too_long(prompt_param(order.body))
        asked = max_tokens(order.body)
        need, reply = size.split(asked)
        demand = self.serving.needs.demand(order.endpoint, size, order.body, asked)
        return await self.call.place(need, reply, counted, self.slots, named, True, demand)

    async def prompt_count(self) -> int | None:
        """The call's prompt tokens: as counted before placing, else by its engine now."""
        call = self.call
        if call.prompt_tokens is not None:
            return call.prompt_tokens
        return await self.serving.needs.counted(call.resident, self.order.endpoint, self.order.raw)


def max_tokens(body: dict[str, Any]) -> int:
    """What the call asks its engine to make, in the unit its speed is measured in: tokens,
    or images for an image call (``n_images``, written by server/inference/images.py: the
    diffusers runner's timings count images, so the ETA is images over images a second)."""
    for key in (
        "max_completion_tokens",
        "max_tokens",
        "max_output_tokens",
        "n_predict",
        "n_images",
    ):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def prompt_param(body: dict[str, Any]) -> str:
    """The field a too-long prompt came in: chat's and Anthropic's ``messages``, the
    Responses API's and embeddings' ``input``, a completion's ``prompt``."""
    return next((field for field in ("messages", "input") if field in body), "prompt")
