"""A plain sentence onto the menu, by the box's ``assist_model``: a chat call placed like any
call (box/serving.py: its own row, the caller's key limit, admission, eviction), asked at
temperature 0 for one command of a closed list, with that list as a JSON schema
(``response_format``; llama-server turns it into a grammar, so the answer is one of them by
construction). What comes back is read only through ``menu.parse`` and only if it is one of
the commands offered; anything else is no action. The commands offered read the box
(``residents``, ``why``, ``settings``, ``config``, ``menu``): a change (``set``) is never
offered, so no sentence changes the box through a model's answer."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fitbox.errors import FitboxError

from ..serving import Order
from .answers import Caller
from .menu import CHANGES, Action, parse

if TYPE_CHECKING:
    from ..box import Box

log = logging.getLogger(__name__)
ENDPOINT = "/v1/chat/completions"
MAX_MODELS = 40  # models named in the commands offered (the schema's enum stays small)
TOOLS = ("aider", "continue", "opencode", "codex", "claude", "pi", "qwen", "gemini", "llm", "env")


@dataclass(frozen=True)
class Mapped:
    """What the assist model made of a sentence: an action of the menu, or none and why."""

    action: Action | None
    said: str  # what it answered (for the reply: what it was read as)
    problem: str = ""  # why there is no action: its answer, or its call failed


def commands(models: list[str]) -> list[str]:
    """Every command the assist model may answer with: the reading actions, each with every
    model it may name."""
    named = models[:MAX_MODELS]
    return [
        "menu",
        "residents",
        "settings",
        *(f"why {m}" for m in named),
        *(f"settings {m}" for m in named),
        *(f"config {t}" for t in TOOLS),
    ]


PROMPT = (
    "You route a request to one command of a menu. Answer with JSON "
    '{{"command": "..."}} naming exactly one of these commands:\n{listing}\n'
    "The commands mean: residents = which models are loaded now; why MODEL = why MODEL "
    "cannot be loaded, or where it would go; settings = the box's settings; settings MODEL = "
    "one model's settings; config TOOL = configuration pointing TOOL at the box; "
    "menu = anything else."
)


def request_body(model: str, sentence: str, offered: list[str]) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {"command": {"type": "string", "enum": offered}},
        "required": ["command"],
    }
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": PROMPT.format(listing="\n".join(offered))},
            {"role": "user", "content": sentence},
        ],
        "temperature": 0,
        "max_tokens": 48,
        "stream": False,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "menu_command", "strict": True, "schema": schema},
        },
    }


def read_answer(content: bytes, offered: list[str]) -> Mapped:
    """The action in the assist model's reply, if it is one of ``offered`` and reads as a
    menu action that changes nothing; else none, with what it said."""
    try:
        reply = json.loads(content)
        said = reply["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError):
        return Mapped(None, "", "its reply was not a chat completion")
    try:
        command = json.loads(said).get("command")
    except (ValueError, AttributeError):
        command = None
    if not isinstance(command, str) or command not in offered:
        return Mapped(None, said, "its answer is not one of the menu's commands")
    action = parse(command)
    if action is None or action.name in CHANGES:
        return Mapped(None, said, "its answer is not a menu action")
    return Mapped(action, said)


async def mapped(box: Box, model: str, sentence: str, caller: Caller) -> Mapped:
    """Ask ``model`` (through the box's serving path: a call like any) which command
    ``sentence`` means."""
    names = [
        a.name
        for a in box.catalog.artifacts()
        if caller.allowed is None or a.name in caller.allowed
    ]
    offered = commands(names)
    body = request_body(model, sentence[:2000], offered)
    raw = json.dumps(body).encode()
    order = Order(ENDPOINT, body, raw, f"{caller.request_id}-assist", caller.allowed)
    served = box.serving.open(order)
    try:
        answer = await served.serve()  # a refusal here has ended its row already
    except FitboxError as error:
        return Mapped(None, "", f"{model} could not answer: {error.message}")
    try:
        content = await served.call.read(answer.response)
    except FitboxError as error:
        served.call.failed(error)
        await served.call.finished()
        return Mapped(None, "", f"{model} could not answer: {error.message}")
    except BaseException:  # the helper's caller left: this call ends with it
        served.call.interrupted()
        raise
    if answer.response.status >= 400:
        served.call.refused_by_engine(answer.response.status, "assist_refused")
        await served.call.finished()
        return Mapped(None, "", f"{model} refused the call ({answer.response.status})")
    served.call.answered(answer.response.status, content)
    await served.call.finished()
    found = read_answer(content, offered)
    log.info("assist %s read %r as %r", model, sentence[:80], found.action)
    return found
