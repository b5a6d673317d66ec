"""Chat completions: the model's own chat template, then a token-by-token decode loop.

The loop is written out (not ``generate``) so that each token can be sent as it is made,
stop strings cut the text where they begin, a client that went away ends the work at the
next token (``cancelled``, set by the handler when the connection closes), and the cache it
holds can be counted while it runs (``/props``). ``n`` choices are rows of one batch: the
prompt is read once and its cache repeated per row. Each step's logits go through the
call's penalties, logit bias and grammar (sampling.py, grammar.py) before a token is drawn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .grammar import Grammars
from .refusal import NonFinite
from .request import BadRequest, Request, folder_defaults, read
from .sampling import Penalties, choose, entry
from .tools import check_template

__all__ = ["BadRequest", "Chat", "Piece", "Request"]


@dataclass
class Piece:
    """One step of one choice: new text, its tokens' logprobs, and at the end why it
    stopped."""

    index: int
    text: str
    finish_reason: str | None = None
    logprobs: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Timings:
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / max(self.prompt_n, 1),
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_ms / max(self.predicted_n, 1),
        }


@dataclass
class Row:
    """One choice as it is made."""

    index: int
    made: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0
    finish: str | None = None
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # not yet sent


def _text_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                parts.append(str(part.get("text", "")))
            elif kind == "image_url":
                url = str((part.get("image_url") or {}).get("url", ""))
                if not url.startswith("data:"):
                    raise BadRequest(
                        "image URLs are never fetched by the engine; send the "
                        "image inline as a data: URL",
                        "messages",
                    )
                raise BadRequest(
                    "this model reads text only; send the message without "
                    "image_url parts, or ask a vision model",
                    "messages",
                )
            else:
                raise BadRequest(
                    f"a message part of type {kind!r} is not understood; use text parts", "messages"
                )
        return "".join(parts)
    if content is None:
        return ""
    raise BadRequest("message content must be a string or a list of text parts", "messages")


def _first_stop(text: str, stops: tuple[str, ...], start: int) -> int | None:
    """Where the earliest stop string begins in ``text`` (searched from ``start``)."""
    found = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(found) if found else None


class Chat:
    """One causal LM and its tokenizer; one generation at a time (the caller holds a lock)."""

    def content(self, content: Any) -> Any:
        """How one message's content is read (request.read()): text only."""
        return _text_content(content)

    def __init__(self, model: Any, tokenizer: Any, window: int, folder: Path | None = None):
        import inspect

        import torch

        self.torch = torch
        self.model, self.tokenizer, self.window = model, tokenizer, window
        self.device = next(model.parameters()).device
        eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        named = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in named else "past_key_values"  # renamed in 5.x
        self.cache: Any = None  # the cache of the generation running now (for /props)
        self.defaults = folder_defaults(folder) if folder is not None else {}
        head = model.get_output_embeddings()  # the logits' width (a padded vocabulary)
        vocab = head.weight.shape[0] if head is not None else len(tokenizer)
        self.grammars = Grammars(tokenizer, vocab, self.eos)
        self.made_total = 0  # tokens made since the child started (/props: a report)
        self.generating = False

    def template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    def request(self, body: dict[str, Any]) -> Request:
        """The call as asked, every field checked (a refusal names the field)."""
        request = read(body, self.content, self.defaults)
        if request.tools is not None and request.tool_choice != "none":
            check_template(self.template())
        return request

    def count(self, body: dict[str, Any]) -> int:
        """The tokens the call's prompt is, as this child will read it (fitbox places a
        long prompt by it; one longer than the window is counted all the same)."""
        return int(self.unbounded_ids(self.request(body)).shape[1])

    def prompt_ids(self, request: Request) -> Any:
        return self.bounded(self.unbounded_ids(request))

    def unbounded_ids(self, request: Request) -> Any:
        if not self.template():
            raise BadRequest(
                "this model's folder has no chat template; use "
                "/v1/completions-style models through another engine"
            )
        from jinja2 import TemplateError

        try:
            text = self.tokenizer.apply_chat_template(
                request.messages, tools=request.tools, tokenize=False, add_generation_prompt=True
            )
        except TemplateError as exc:  # the template's own raise_exception says why
            raise BadRequest(
                f"the model's chat template refused the messages: {exc}", "messages"
            ) from None

        return self.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]

    def bounded(self, ids: Any) -> Any:
        if ids.shape[1] >= self.window:
            raise BadRequest(
                f"the prompt is {ids.shape[1]} tokens; this model was loaded "
                f"with a {self.window}-token window",
                "messages",
            )
        return ids.to(self.device)

    def prompt(self, request: Request) -> tuple[Any, dict[str, Any]]:
        """The prompt's token ids, and what else the first forward pass takes (images)."""
        return self.prompt_ids(request), {}

    def _forward(self, step: Any, extra: dict[str, Any]) -> Any:
        out = self.model(input_ids=step, use_cache=True, **{self.cache_arg: self.cache}, **extra)
        logits = out.logits[:, -1, :].float()
        if not bool(self.torch.isfinite(logits).all()):
            raise NonFinite("logits")  # corrupt weights: never a token drawn from NaN
        return logits

    def run(
        self, request: Request, timings: Timings, cancelled: threading.Event
    ) -> Generator[Piece, None, None]:
        """Pieces as tokens are made; each choice's last piece carries its finish reason."""
        torch = self.torch
        from transformers import DynamicCache

        ids, extra = self.prompt(request)
        matchers = self.grammars.matchers(request)  # a schema it cannot enforce: before work
        rng = torch.Generator()
        seed = request.sampling.seed
        rng.manual_seed(seed % 2**63 if seed is not None else int(time.time_ns() % 2**63))
        room = self.window - ids.shape[1]
        budget = room if request.max_tokens < 0 else min(request.max_tokens, room)
        rows = [Row(i) for i in range(request.n)]
        penalties = Penalties(request.sampling, ids, request.n, torch)
        self.cache, self.generating = DynamicCache(), True
        timings.prompt_n = int(ids.shape[1])
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                logits = self._forward(ids, extra)
                timings.prompt_ms = (time.perf_counter() - started) * 1000
                started = time.perf_counter()
                if request.n > 1:  # the prompt is read once; each choice is a row of its cache
                    self.cache.batch_repeat_interleave(request.n)
                    logits = logits.expand(request.n, -1)
                step = 0
                while step < budget and not cancelled.is_set():
                    live = [r.index for r in rows if r.finish is None]
                    if not live:
                        break
                    tokens, entries = self._draw(request, logits, live, penalties, matchers, rng)
                    step += 1
                    timings.predicted_n += len(live)
                    self.made_total += len(live)
                    yield from self._advance(request, rows, tokens, entries, matchers)
                    if all(r.finish is not None for r in rows) or step >= budget:
                        break
                    step_ids = torch.tensor([[t] for t in tokens], device=self.device)
                    logits = self._forward(step_ids, {})
        finally:
            timings.predicted_ms = (time.perf_counter() - started) * 1000
            self.cache, self.generating = None, False
        yield from self._ends(rows, request, "length")

    def _draw(
        self,
        request: Request,
        logits: Any,
        live: list[int],
        penalties: Penalties,
        matchers: list[Any] | None,
        rng: Any,
    ) -> tuple[list[int], dict[int, list[dict[str, Any]]]]:
        """One token per row (a row already finished gets one it never shows), and each live
        row's logprobs entry when they were asked for (of the model's own distribution)."""
        scores = penalties.apply(logits.clone())
        if matchers is not None:
            self.grammars.mask(matchers, scores, live)
        tokens = choose(scores, request.sampling, rng)
        entries: dict[int, list[dict[str, Any]]] = {i: [] for i in live}
        if request.logprobs:
            logprobs = self.torch.log_softmax(logits, dim=-1)
            for i in live:
                entries[i].append(
                    entry(self.tokenizer, logprobs[i], tokens[i], request.top_logprobs)
                )
        penalties.saw(tokens, live)
        return tokens, entries

    def _advance(
        self,
        request: Request,
        rows: list[Row],
        tokens: list[int],
        entries: dict[int, list[dict[str, Any]]],
        matchers: list[Any] | None,
    ) -> Generator[Piece, None, None]:
        """Each live row takes its token: its text grows, a stop string or the grammar's
        end finishes it, and what is ready to show goes out."""
        for i, made in entries.items():
            row, token = rows[i], tokens[i]
            row.logprobs += made
            if matchers is not None:
                matchers[i].consume_token(token)
            if token in self.eos:
                row.finish = "stop"
                continue
            row.made.append(token)
            piece = self._shown(row, request.stop)
            if matchers is not None and matchers[i].is_stopped():
                row.finish = "stop"  # the grammar is complete: nothing more may follow
            if piece is not None:
                yield piece

    def _shown(self, row: Row, stops: tuple[str, ...]) -> Piece | None:
        """The row's new text that is ready (a stop string's start is held back)."""
        hold = max((len(s) for s in stops), default=1) - 1
        row.text = self.tokenizer.decode(row.made, skip_special_tokens=True)
        cut = _first_stop(row.text, stops, max(row.sent - hold, 0))
        if cut is not None:
            row.text, row.finish = row.text[:cut], "stop"
            return None
        ready = len(row.text) - hold if stops else len(row.text)
        if row.text.endswith("\ufffd"):  # half a character: wait for its other bytes
            ready = min(ready, len(row.text) - 1)
        if ready <= row.sent and not row.logprobs:
            return None
        piece = Piece(row.index, row.text[row.sent : max(ready, row.sent)], logprobs=row.logprobs)
        row.sent, row.logprobs = max(ready, row.sent), []
        return piece

    def _ends(
        self, rows: list[Row], request: Request, cut_short: str
    ) -> Generator[Piece, None, None]:
        """What each row held back, and its finish reason (``length`` for one the budget
        or a cancel ended)."""
        for row in rows:
            yield Piece(row.index, row.text[row.sent :], row.finish or cut_short, row.logprobs)
