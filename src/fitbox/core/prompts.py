"""A bound on a call's prompt tokens that is never below what the model's own tokenizer
and chat template count, from the request alone (FORMULAS.md §Prompt tokens).

Every token of a byte-level BPE or an SPM vocabulary with byte fallback covers at least
one byte of the text it was cut from, so a text of B bytes is at most B tokens, plus the
specials the tokenizer adds (BOS, EOS; SPM's leading space is one more). The rendered
prompt is the chat template's own text, repeated at most once per message, per tool and
once more (its loops run over those), plus every value the request carries, which the
JSON body holds at no fewer bytes than it renders (escapes only lengthen).
"""

from __future__ import annotations

import json
from typing import Any

ADDED_TOKENS = 3  # BOS, EOS and SPM's dummy-prefix space, whichever the tokenizer adds
# A GGUF without a chat template is rendered with llama.cpp's chatml fallback:
# "<|im_start|>{role}\n{content}<|im_end|>\n" per message, "<|im_start|>assistant\n" once
CHATML_BYTES = 64
TOJSON_GROWTH = 3


def _bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", errors="surrogatepass"))
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8", errors="surrogatepass"))


def prompt_bound(body: dict[str, Any], template_bytes: int) -> int:
    """Tokens a body's prompt may take at most; 0 when it has none. A chat (``messages``,
    or a Responses ``input``) is rendered by the template from any of the body's values
    (a ``system``, ``instructions``, tools): the whole body's bytes count."""
    chat = body.get("messages", body.get("input"))
    if chat is not None and "prompt" not in body:
        tools = body.get("tools")
        items = (len(chat) if isinstance(chat, list) else 1) + (
            len(tools) if isinstance(tools, list) else 0)  # fmt: skip
        template = template_bytes or CHATML_BYTES
        # a template may render tools with tojson, which can escape a character into
        # \uXXXX: six bytes for every two or more the body holds
        values = _bytes(body) + ((TOJSON_GROWTH - 1) * _bytes(tools) if tools is not None else 0)
        return (items + 1) * template + values + ADDED_TOKENS
    prompt = body.get("prompt")
    if prompt is None:
        return 0
    return _bytes(prompt) + ADDED_TOKENS
