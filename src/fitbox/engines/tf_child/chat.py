"""Chat completions: the model's own chat template, then a token-by-token decode loop.

The loop is written out (not ``generate``) so that each token can be sent as it is made,
stop strings cut the text where they begin, a client that went away ends the work, and the
cache it holds can be counted while it runs (``/props``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any


class BadRequest(ValueError):
    """A call this child cannot serve as asked; the message says what to change."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class Piece:
    """One step of a generation: new text, and at the end why it stopped."""

    text: str
    finish_reason: str | None = None


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
class Generation:
    """What one call asked for, read from its body."""

    messages: list[dict[str, Any]]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    timings: Timings = field(default_factory=Timings)


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


def parse(
    body: dict[str, Any], window: int, content: Callable[[Any], Any] = _text_content
) -> Generation:
    """``content`` reads one message's content: text only, or (vision.py) text and images."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    plain = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("every message needs a 'role'", "messages")
        plain.append({"role": m["role"], "content": content(m.get("content"))})
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or window
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop if s)
    temperature = body.get("temperature")
    seed = body.get("seed")
    return Generation(
        messages=plain,
        max_tokens=int(max_tokens),
        temperature=1.0 if temperature is None else float(temperature),
        top_p=float(body.get("top_p") or 1.0),
        seed=int(seed) if seed is not None else None,
        stop=stop,
    )


def _first_stop(text: str, stops: tuple[str, ...], start: int) -> int | None:
    """Where the earliest stop string begins in ``text`` (searched from ``start``)."""
    found = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(found) if found else None


class Chat:
    """One causal LM and its tokenizer; one generation at a time (the caller holds a lock)."""

    def content(self, content: Any) -> Any:
        """How one message's content is read (parse()): text only."""
        return _text_content(content)

    def __init__(self, model: Any, tokenizer: Any, window: int) -> None:
        import torch

        self.torch = torch
        self.model, self.tokenizer, self.window = model, tokenizer, window
        self.device = next(model.parameters()).device
        eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        import inspect

        named = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in named else "past_key_values"  # renamed in 5.x
        self.cache: Any = None  # the cache of the generation running now (for /props)
        self.cancelled = threading.Event()

    def prompt_ids(self, gen: Generation) -> Any:
        if not getattr(self.tokenizer, "chat_template", None):
            raise BadRequest(
                "this model's folder has no chat template; use "
                "/v1/completions-style models through another engine"
            )
        text = self.tokenizer.apply_chat_template(
            gen.messages, tokenize=False, add_generation_prompt=True
        )
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        return self.bounded(ids)

    def bounded(self, ids: Any) -> Any:
        if ids.shape[1] >= self.window:
            raise BadRequest(
                f"the prompt is {ids.shape[1]} tokens; this model was loaded "
                f"with a {self.window}-token window",
                "messages",
            )
        return ids.to(self.device)

    def prompt(self, gen: Generation) -> tuple[Any, dict[str, Any]]:
        """The prompt's token ids, and what else the first forward pass takes (images)."""
        return self.prompt_ids(gen), {}

    def _next_token(self, logits: Any, gen: Generation, rng: Any) -> int:
        torch = self.torch
        if gen.temperature <= 0:
            return int(torch.argmax(logits).item())
        probs = torch.softmax(logits.float() / gen.temperature, dim=-1)
        if gen.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < gen.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        return int(torch.multinomial(probs.cpu(), 1, generator=rng).item())

    def run(self, gen: Generation) -> Generator[Piece, None, None]:
        """Text pieces as tokens are made; the last piece carries the finish reason."""
        torch = self.torch
        from transformers import DynamicCache

        ids, extra = self.prompt(gen)
        rng = torch.Generator()
        rng.manual_seed(gen.seed if gen.seed is not None else int(time.time_ns() % 2**63))
        budget = min(gen.max_tokens, self.window - ids.shape[1])
        made: list[int] = []
        sent = 0
        hold = max((len(s) for s in gen.stop), default=1) - 1  # a stop string may be arriving
        self.cache, self.cancelled = DynamicCache(), threading.Event()
        started = time.perf_counter()
        gen.timings.prompt_n = int(ids.shape[1])
        step_input = ids
        finish, text = "length", ""
        try:
            with torch.inference_mode():
                while len(made) < budget and not self.cancelled.is_set():
                    out = self.model(
                        input_ids=step_input,
                        use_cache=True,
                        **{self.cache_arg: self.cache},
                        **extra,
                    )
                    extra = {}  # the images are in the cache after the first pass
                    if not made:
                        gen.timings.prompt_ms = (time.perf_counter() - started) * 1000
                        started = time.perf_counter()
                    token = self._next_token(out.logits[0, -1], gen, rng)
                    if token in self.eos:
                        finish = "stop"
                        break
                    made.append(token)
                    gen.timings.predicted_n = len(made)
                    step_input = torch.tensor([[token]], device=self.device)
                    text = self.tokenizer.decode(made, skip_special_tokens=True)
                    cut = _first_stop(text, gen.stop, max(sent - hold, 0))
                    if cut is not None:
                        text, finish = text[:cut], "stop"
                        break
                    ready = len(text) - hold if gen.stop else len(text)
                    if text.endswith("\ufffd"):  # half a character: wait for its other bytes
                        ready = min(ready, len(text) - 1)
                    if ready > sent:
                        yield Piece(text[sent:ready])
                        sent = ready
            if len(text) > sent:  # what was held back for a stop string that never came
                yield Piece(text[sent:])
        finally:
            gen.timings.predicted_ms = (time.perf_counter() - started) * 1000
            self.cache = None
        yield Piece("", finish)
