"""The helper's reply to a conversation: the last user message read as a menu choice
(box/helper/menu.py), else mapped onto the menu by the box's ``assist_model``
(box/helper/assist.py), then answered: a reading menu from the box (box/helper/answers.py),
a change through the ``Changer`` the edge hands in (the management API's own route, admitted
for the caller's key and scope: server/inference/helper.py).

    reply = await box.helper.reply(messages, caller, change)   # no placement, no engine
                                                              # unless a sentence asks the
                                                              # assist model
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fitbox.errors import FitboxError

from . import answers
from .answers import Caller, ConfigBlocks, plain_env_block
from .assist import mapped
from .menu import Action, menu_text, parse

if TYPE_CHECKING:
    from ..box import Box


class Changer(Protocol):
    """A settings change as ``POST /v1/settings/box`` (``scope`` "box") or
    ``POST /v1/settings/pair`` (``scope`` "pair", ``model`` named) makes it, with the
    caller's key and scope: raises the route's own refusal (403, 401) or its parser's error
    (400, naming the knob); returns the values it set."""

    async def __call__(self, scope: str, model: str, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Reply:
    text: str
    action: str  # the menu action answered ("" for not understood): for the log


NOT_UNDERSTOOD = "I did not understand that."


class Helper:
    """The menu over one box; ``blocks`` renders a tool's config block (the one call site of
    ``fitbox config``'s renderer)."""

    def __init__(self, box: Box, blocks: ConfigBlocks = plain_env_block) -> None:
        self.box, self.blocks = box, blocks

    async def reply(self, messages: list[Any], caller: Caller, change: Changer) -> Reply:
        text = last_user_text(messages)
        action = parse(text)
        lead = ""
        if action is None:
            model = str(self.box.prefs.effective().get("assist_model") or "")
            if not model:
                return Reply(f"{NOT_UNDERSTOOD}\n\n{menu_text()}", "")
            found = await mapped(self.box, model, text, caller)
            if found.action is None:
                return Reply(f"{NOT_UNDERSTOOD} ({found.problem})\n\n{menu_text()}", "")
            if found.action.name == "menu":  # the assist model's "anything else"
                return Reply(f"{NOT_UNDERSTOOD}\n\n{menu_text()}", "")
            action = found.action
            lead = f"(read as `{action.text()}` by the assist model {model})\n\n"
        return Reply(lead + await self.answer(action, caller, change), action.name)

    async def answer(self, action: Action, caller: Caller, change: Changer) -> str:
        box, args = self.box, action.args
        first = args[0] if args else None
        if action.name == "residents":
            return answers.residents(box, caller)
        if action.name == "why":
            return answers.why(box, caller, first)
        if action.name == "settings":
            return answers.settings(box, caller, first)
        if action.name == "config":
            second = args[1] if len(args) > 1 else None
            return answers.config(box, caller, self.blocks, first, second)
        if action.name == "set":
            return await self._set(args, change)
        return menu_text()

    async def _set(self, args: tuple[str, ...], change: Changer) -> str:
        if not args:
            return (
                "Write `set SETTING VALUE` (box-wide) or `set SETTING VALUE for MODEL`; "
                "`null` clears one. `settings` lists them."
            )
        name, text = args[0], args[1]
        model = args[3] if len(args) == 4 else ""
        value = answers.setting_value(text, self.box.prefs.defaults().get(name))
        try:
            done = await change("pair" if model else "box", model, {name: value})
        except FitboxError as refused:
            return f"Not changed: {refused.message} ({refused.status} {refused.code})"
        where = f"for {model}" if model else "box-wide"
        shown = ", ".join(f"{k} = {answers.shown(v)}" for k, v in done.items())
        return f"Changed {where}: {shown}."


def last_user_text(messages: list[Any]) -> str:
    """The text of the last user message (its text parts joined); "" when there is none."""
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return " ".join(
                str(part.get("text", ""))
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            )
        return ""
    return ""
