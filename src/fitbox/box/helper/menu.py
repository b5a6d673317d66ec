"""The helper's menu: its actions, and the one grammar that reads a choice.

A choice is a number or a command word, with its arguments (``why smollm2``, ``2 smollm2``,
``set window 8192``, ``set window 8192 for smollm2``, ``config aider smollm2``). ``parse()``
is the only way text becomes an ``Action``: what the user typed, and what an assist model
answered (box/helper/assist.py), go through it alike, so nothing but a menu action is ever
run. Pure: no box, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

HELPER = "fitbox-helper"  # the helper's model name: listed by /v1/models, never weights

# number, word, arguments, what it does: the menu as the helper prints it
ENTRIES: tuple[tuple[str, str, str, str], ...] = (
    ("1", "residents", "", "what is loaded now, and why"),
    ("2", "why", "MODEL", "why a model is refused (or where it would go): the plan's reasons"),
    ("3", "settings", "[MODEL]", "the box's settings, or one model's, with their values"),
    ("4", "set", "SETTING VALUE [for MODEL]", "change a setting (admin key, or the box itself)"),
    ("5", "config", "TOOL [MODEL]", "the block that points TOOL at this box"),
    ("0", "menu", "", "this menu"),
)
WORDS = {word: word for _, word, _, _ in ENTRIES} | {number: word for number, word, _, _ in ENTRIES}
WORDS |= {"help": "menu", "?": "menu", "resident": "residents", "setting": "settings"}
# the actions that change the box: never run from what an assist model answered
CHANGES = frozenset({"set"})


@dataclass(frozen=True)
class Action:
    """One menu action: its word and its arguments (as typed, unchecked against the box)."""

    name: str
    args: tuple[str, ...] = ()

    def text(self) -> str:
        return " ".join((self.name, *self.args))


def parse(text: str) -> Action | None:
    """The menu action ``text`` chooses; None when it chooses none (a sentence). An empty
    message is the menu. Words are matched without case; arguments keep theirs."""
    tokens = text.strip().strip("`").split()
    if not tokens:
        return Action("menu")
    name = WORDS.get(tokens[0].lower().rstrip(".:)"))
    if name is None:
        return None
    args = tuple(tokens[1:])
    if name in ("menu", "residents") and args:
        return None  # "residents are…": a sentence that happens to start with a word
    if name in ("why", "settings") and len(args) > 1:
        return None
    if name == "config" and len(args) > 2:
        return None
    if name == "set" and not _set_args(args):
        return None
    return Action(name, args)


def _set_args(args: tuple[str, ...]) -> bool:
    """``SETTING VALUE`` or ``SETTING VALUE for MODEL``; none: the usage is shown."""
    return len(args) in (0, 2) or (len(args) == 4 and args[2].lower() == "for")


def menu_text() -> str:
    rows = [f"  {n}. {' '.join(filter(None, (w, a)))}  — {what}" for n, w, a, what in ENTRIES]
    return "\n".join(
        (
            "fitbox helper: choose by number or word (arguments after it, e.g. `2 MODEL`).",
            *rows,
        )
    )
