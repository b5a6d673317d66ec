"""What the tool table (harness/tools.py) is made of: the box a tool is pointed at
(``Target``), a file of a tool's config (``ConfigFile``), how a tool is run pointed here
(``Launch``) and a tool's entry (``Tool``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from fitbox.harness.limits import ModelLimits

Format = Literal["json", "yaml", "toml", "text"]
NO_KEY = "fitbox"  # what a tool that insists on a key is given on the box itself
KEY_ENV = "FITBOX_API_KEY"  # where a tool that reads its key from the environment finds it
PROVIDER = "fitbox"  # the provider id fitbox's entries go under
# the variables fitbox sets for a tool (never reads: they are no settings of fitbox's)
HANDED_ENV = (KEY_ENV, "FITBOX_MODEL", "FITBOX_MODEL_WINDOW", "FITBOX_MODEL_OUTPUT")


@dataclass(frozen=True)
class Target:
    """What every tool is told: the box's address, the key (None on the box itself) and the
    models, each with its window and output limit (the first is the default)."""

    base: str  # the box's root, http://HOST:PORT (no /v1)
    key: str | None
    models: tuple[ModelLimits, ...]

    @property
    def v1(self) -> str:
        return f"{self.base.rstrip('/')}/v1"

    @property
    def key_or_placeholder(self) -> str:
        return self.key or NO_KEY

    @property
    def default(self) -> ModelLimits:
        return self.models[0]


@dataclass(frozen=True)
class ConfigFile:
    """One file of a tool's config: where it lives by default (``~`` is the home), its
    format, what fitbox puts in it, and how the merge finds fitbox's entries there.

    ``entries`` (YAML only): the top-level key whose list holds one entry per model ("" for
    a file that is itself a list), each named by its ``identity`` field. ``soft``: top-level
    keys that are the user's choice (a default model, a schema name): written where the file
    has none, else the user's value is kept and said, unless forced."""

    path: str
    format: Format
    data: Any
    use: str = ""  # one line: how the tool picks it up
    entries: str | None = None
    identity: str | None = None
    soft: tuple[str, ...] = ()


@dataclass(frozen=True)
class Launch:
    """How ``fitbox launch`` runs the tool: its argv before the user's own arguments, the
    environment it adds (and the variables it removes), and files written into a fresh
    directory for this run only (``{dir}`` in argv and env names that directory)."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    install: str  # where it comes from
    files: Callable[[Target], tuple[ConfigFile, ...]]
    launch: Callable[[Target], Launch]
    note: str = ""  # what a person should know (a limit of the tool, how the key is read)
    unsupported: str | None = None  # why it cannot be pointed at a box at all
