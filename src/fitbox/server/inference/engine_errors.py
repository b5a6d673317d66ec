"""An engine's own error, in the OpenAI envelope, keeping what the engine said.

llama-server answers a context overflow with
``{"error": {"code": 400, "type": "exceed_context_size_error", "message": …,
"n_prompt_tokens": 431, "n_ctx": 256}}``: clients trim their history by those two numbers,
so the engine's ``type`` and every plain field it added stay; only ``code`` becomes the
string OpenAI's envelope has (OpenAI's own name where one exists), and ``param`` is added.
"""

from __future__ import annotations

import json
from typing import Any

# The engine's error type -> the code OpenAI gives the same refusal
OPENAI_CODES = {"exceed_context_size_error": "context_length_exceeded"}
ENVELOPE = ("message", "type", "code", "param")
# What llama-server tells its own operator ("Start it with `--embeddings`"): fitbox starts
# the engine, so the reason a client needs is which model does not serve the route. The
# engine says 501 (it lacks the feature); the client named a model for a route it does not
# serve, a mistake of the call: 400 invalid_request_error, with a code naming the mismatch
NOT_SERVED = {  # a word of the engine's message -> what the model is not, its code, the fix
    "embeddings": (
        "an embeddings model",
        "not_an_embeddings_model",
        ' POST /v1/settings/pair {"model": "{model}", '
        '"embeddings": true} makes a decoder serve mean-pooled embeddings from its '
        "next load.",
    ),
    "reranking": ("a reranker", "not_a_reranker", ""),
    "infill": ("a model with fill-in-the-middle tokens", "no_fill_in_the_middle_tokens", ""),
}
MISMATCHES = frozenset(code for _, code, _ in NOT_SERVED.values())


def retry_cannot_help(status: int) -> bool:
    """Whether a retry of the same call cannot change the answer (OpenAI SDKs retry 408,
    409, 429 and 5xx unless told ``x-should-retry: false``): a 4xx other than a timeout,
    a conflict or a rate limit; a route the engine does not implement (501)."""
    return (400 <= status < 500 and status not in (408, 409, 429)) or status == 501


def retry_headers(status: int) -> dict[str, str]:
    return {"x-should-retry": "false"} if retry_cannot_help(status) else {}


def client_status(status: int, error: dict[str, Any]) -> int:
    """The status the client gets for the engine's ``status`` and its reshaped ``error``
    body: 400 for a route the named model does not serve (the engine's 501), else the
    engine's own."""
    return 400 if status == 501 and error["error"]["code"] in MISMATCHES else status


def _scalar(value: object) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def engine_error_body(status: int, content: bytes, model: str) -> dict[str, Any]:
    """The engine's error body reshaped into the envelope; a body that is not JSON becomes
    its first 500 bytes as the message."""
    said: dict[str, Any] = {}
    try:
        parsed = json.loads(content)
        found = parsed.get("error", parsed) if isinstance(parsed, dict) else None
        said = dict(found) if isinstance(found, dict) else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        said = {"message": content[:500].decode("utf-8", errors="replace")}
    message = str(said.get("message") or f"the engine answered HTTP {status}")
    kind = said.get("type") if isinstance(said.get("type"), str) and said.get("type") else None
    code = said.get("code")
    if not isinstance(code, str) or not code:
        code = OPENAI_CODES.get(kind or "", kind or f"engine_http_{status}")
    param = said.get("param") if isinstance(said.get("param"), str) else None
    if status == 501:
        message, mismatch = _not_served(message, model)
        if mismatch is not None:  # the model named is what does not fit the route
            kind, code, param = "invalid_request_error", mismatch, "model"
    extra = {k: v for k, v in said.items() if k not in ENVELOPE and _scalar(v)}
    return {
        "error": {
            "message": message,
            "type": kind
            or ("invalid_request_error" if retry_cannot_help(status) else "server_error"),
            "code": code,
            "param": param,
            **extra,
        }
    }


def _not_served(message: str, model: str) -> tuple[str, str | None]:
    """The engine's 501 said of the model, and the code of the mismatch (None when the
    message names no known one)."""
    lowered = message.lower()
    for word, (what, code, fix) in NOT_SERVED.items():
        if word in lowered:
            said = (
                f"'{model}' is not {what} on this box, so it does not serve this route "
                f"(engine: {message}).{fix.replace('{model}', model)}"
            )
            return said, code
    return f"'{model}' does not serve this route on this box (engine: {message})", None


def _refuse_constant(name: str) -> float:
    raise ValueError(name)


def non_finite(content: bytes) -> bool:
    """Whether an engine's JSON body holds a bare NaN or Infinity (Python's json writes
    them; strict parsers refuse the whole body): corrupt weights, seen as they run. A
    search of the bytes first, so a body without the words costs no parse."""
    if b"NaN" not in content and b"Infinity" not in content:
        return False
    try:
        json.loads(content, parse_constant=_refuse_constant)
    except ValueError as exc:
        return str(exc) in ("NaN", "Infinity", "-Infinity")
    return False
