"""What every command module hands the registry (``fitbox.cli.COMMANDS``): its name, its
help line, the flags it takes and what it runs; and the flags several commands share."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

from fitbox.config import Config

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[Config, argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """One ``fitbox NAME``: ``add_arguments`` fills its parser, ``run`` carries it out with
    the settings read (command line > environment > defaults) and returns the exit code."""

    name: str
    help: str
    add_arguments: AddArguments
    run: Run


def add_catalog_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models",
        action="append",
        metavar="DIR",
        help="a model root (repeatable); default FITBOX_MODELS or <data dir>/models",
    )
    parser.add_argument("--home", metavar="DIR", help="data dir (FITBOX_HOME)")


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )


def overrides(args: argparse.Namespace) -> dict[str, str | None]:
    """The settings given on the command line, as text for ``config.load``."""
    values: dict[str, str | None] = {
        "models": os.pathsep.join(args.models) if getattr(args, "models", None) else None,
        "home": getattr(args, "home", None),
    }
    for name in ("host", "port", "ram_max"):
        value = getattr(args, name, None)
        values[name] = str(value) if value is not None else None
    if getattr(args, "command", None) == "serve":  # install's --central goes to the service
        values["central_url"] = args.central
        values["central_key"] = args.central_key
    return values
