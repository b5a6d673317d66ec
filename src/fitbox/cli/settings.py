"""``fitbox settings``: every setting and the value it has here (environment and defaults);
``--markdown``: the settings reference, docs/reference/settings.md, written from the settings
table (fitbox.setting_table) and the commands' flags (a test keeps the file current)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from fitbox.config import SETTINGS, Config
from fitbox.setting_values import Setting

HELP = "every setting, its environment variable and value here; --markdown: the reference"
WHERE = {
    "env": "environment",
    "flag": "command line",
    "box": "box settings (POST /v1/settings/box)",
    "pair": "pair settings (POST /v1/settings/pair)",
    "key": "key settings (POST /v1/settings/key)",
    "limits": "limits (POST /v1/limits)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--markdown", action="store_true", help="the reference, in Markdown")


def run(config: Config, args: argparse.Namespace, top: argparse.ArgumentParser) -> int:
    """``top``: the whole command line's parser, whose flags the reference lists."""
    if args.markdown:
        print(reference(top), end="")
        return 0
    for setting in (s for s in SETTINGS if s.env):
        value = getattr(config, setting.name)
        shown = ("(set)" if value else "(unset)") if setting.secret else repr(value)
        print(f"{setting.name} = {shown}  ({setting.env})")
    return 0


def _dests(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str]]:
    """(where the flag is, the setting it sets) for every option under ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _dests(sub, f"{path} {name}")
        elif action.option_strings:
            yield path, action.dest


def commands_by_setting(top: argparse.ArgumentParser) -> dict[str, list[str]]:
    """The commands whose flag sets each setting (``fitbox keys`` for all its verbs), read
    from the parser itself."""
    found: dict[str, list[str]] = {}
    for path, dest in _dests(top, "fitbox"):
        command = " ".join(path.split()[:2])
        if command not in found.setdefault(dest, []):
            found[dest].append(command)
    return found


def _cell(text: Any) -> str:
    """Table-safe text: no pipe or line break splits the row, no <name> reads as a tag."""
    return str(text).replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")


def _row(setting: Setting, commands: dict[str, list[str]]) -> str:
    flag = "-"
    if setting.flag:
        where = ", ".join(f"`{c}`" for c in commands.get(setting.name, []))
        flag = f"`{setting.flag}` ({where})"
    default = f"`{setting.default}`" if setting.default else "-"
    cells = [
        f"`{setting.name}`",
        f"`{setting.env}`" if setting.env else "-",
        flag,
        _cell(setting.type),
        default,
        ", ".join(WHERE[w] for w in setting.where),
        _cell(setting.help),
    ]
    return "| " + " | ".join(cells) + " |"


def reference(top: argparse.ArgumentParser) -> str:
    """docs/reference/settings.md: one row per setting of the table, with the commands of
    ``top`` (fitbox.cli.parser()) whose flags set it."""
    commands = commands_by_setting(top)
    lines = [
        "---",
        "hide: [toc]  # the user guide's theme: the table takes the page's width",
        "---",
        "",
        "# Settings",
        "",
        "Every setting fitbox has, generated from its settings table "
        "(`src/fitbox/setting_table.py`) by `fitbox settings --markdown`; "
        "`tests/test_config.py` fails when this file differs from what that writes.",
        "",
        "A setting is read once at start: a command-line flag wins over the environment "
        "variable, which wins over the default. A knob the settings API sets (box, pair, key "
        "or limits) overrides the start-up value while fitbox runs and is kept in its store; "
        "a model's own (pair) wins over the box's. A knob without an environment variable is "
        "set only through that API.",
        "",
        "| name | environment | flag | type | default | where it can be set | what it does |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [_row(setting, commands) for setting in SETTINGS]
    return "\n".join(lines) + "\n"
