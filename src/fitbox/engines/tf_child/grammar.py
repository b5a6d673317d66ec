"""Constrained decoding: each step's logits masked to the tokens a grammar allows.

llguidance (guidance-ai's Rust parser; vLLM and SGLang use it as a backend) compiles a
JSON schema, or a Lark grammar with JSON schemas inside it, against the folder's own fast
tokenizer, and gives one bitmask per step in about a millisecond with no warm-up per
schema; it has no dependencies and ships wheels for CPU torch. A matcher per choice follows
the tokens drawn; a drawn token it refuses cannot happen (the mask allowed only its own).

Two grammars are made: ``response_format`` (json_object: any object; json_schema: that
schema), and a forced tool call (``tool_choice`` required or named: one ``<tool_call>``
block whose JSON is a call of one of the tools, tools.py). Both are written compact
(``", "`` and ``": "`` with no other whitespace) so a small model cannot pad forever.
"""

from __future__ import annotations

import json
from typing import Any

from .request import BadRequest, Request
from .tools import CLOSE, OPEN, call_schema

COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_of(request: Request) -> tuple[str, str] | None:
    """The grammar the call's reply must follow and the field it comes from, or None."""
    import llguidance

    if request.tools and request.tool_choice != "auto" and request.tool_choice != "none":
        schema = call_schema(request.tools, request.forced_tool) | {"x-guidance": COMPACT}
        lark = f"start: {json.dumps(OPEN + chr(10))} call {json.dumps(chr(10) + CLOSE)}\n"
        lark += f"call: %json {json.dumps(schema)}\n"
        return llguidance.LLMatcher.grammar_from_lark(lark), "tools"
    if request.response_format is not None:
        schema = request.response_format
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT), (
            "response_format"
        )
    return None


class Grammars:
    """The folder's tokenizer as llguidance reads it (built once, ~1 s), and matchers."""

    def __init__(self, tokenizer: Any, vocab: int, eos: set[int]) -> None:
        self.tokenizer, self.vocab, self.eos = tokenizer, vocab, sorted(eos)
        self._lltok: Any = None

    def lltok(self) -> Any:
        if self._lltok is None:
            import llguidance.hf

            self._lltok = llguidance.hf.from_tokenizer(
                self.tokenizer, n_vocab=self.vocab, eos_token=self.eos or None
            )
        return self._lltok

    def matchers(self, request: Request) -> list[Any] | None:
        """One matcher per choice, or None when the reply is free; a schema llguidance
        cannot compile is refused naming the field it came from."""
        try:
            found = grammar_of(request)
        except ValueError as exc:
            raise BadRequest(f"the JSON schema cannot be read: {exc}", "response_format") from None
        if found is None:
            return None
        import llguidance

        grammar, field = found
        error = llguidance.LLMatcher.validate_grammar(grammar, self.lltok())
        if error:
            raise BadRequest(f"this engine cannot enforce that schema: {error}", field)
        return [llguidance.LLMatcher(self.lltok(), grammar, log_level=0) for _ in range(request.n)]

    def mask(self, matchers: list[Any], logits: Any, rows: list[int]) -> None:
        """Set every token the matcher of each row in ``rows`` refuses to -inf in place.
        The bits are unpacked here, not by ``llguidance.torch``'s kernel: that one is
        ``torch.compile``d, which needs a C compiler and seconds on a CPU box."""
        import llguidance.torch
        import torch

        bitmask = llguidance.torch.allocate_token_bitmask(len(rows), self.vocab)
        for at, row in enumerate(rows):
            llguidance.torch.fill_next_token_bitmask(matchers[row], bitmask, at)
        shifts = torch.arange(32, dtype=torch.int32)
        allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(len(rows), -1).bool()
        allowed = allowed[:, : logits.shape[-1]].to(logits.device)
        picked = logits[rows]
        logits[rows] = picked.masked_fill(~allowed, float("-inf"))
