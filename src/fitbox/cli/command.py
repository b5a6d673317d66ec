"""What every command module hands the registry (``fitbox.cli.COMMANDS``): its name, its
help line, the flags it takes and what it runs; and the flags of settings, which come from
the settings table (fitbox.setting_table: a setting's ``flag``), never written by hand."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

from fitbox import setting_values
from fitbox.config import SETTINGS, Config

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[Config, argparse.Namespace], int]
_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class Command:
    """One ``fitbox NAME``: ``add_arguments`` fills its parser, ``run`` carries it out with
    the settings read (command line > environment > defaults) and returns the exit code."""

    name: str
    help: str
    add_arguments: AddArguments
    run: Run
    passthrough: bool = False  # what follows ``--`` is not parsed: it is handed on as ``args``


def add_setting_flags(parser: argparse.ArgumentParser, *names: str) -> None:
    """The flags of these settings, as the table declares them (``--flag METAVAR``); what is
    given overrides the setting's environment variable (``overrides``)."""
    for name in names:
        setting = _BY_NAME[name]
        flag, _, metavar = setting.flag.partition(" ")
        repeats = setting.parse is setting_values.paths  # a list: the flag repeats
        parser.add_argument(
            flag,
            dest=setting.name,
            metavar=metavar or None,
            action="append" if repeats else "store",
            help=f"{setting.help}{' (repeatable)' if repeats else ''} ({setting.env})",
        )


def add_catalog_options(parser: argparse.ArgumentParser) -> None:
    add_setting_flags(parser, "models", "home")


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )


def overrides(args: argparse.Namespace) -> dict[str, str | None]:
    """The settings given on the command line, as text for ``config.load``: each setting
    with a flag, under its name (a command's own option of the same flag, such as install's
    --central for the service it writes, has another name and is not read here)."""
    found: dict[str, str | None] = {}
    for setting in SETTINGS:
        value = getattr(args, setting.name, None) if setting.flag else None
        if isinstance(value, list):
            value = os.pathsep.join(value)
        found[setting.name] = str(value) if value is not None else None
    return found
