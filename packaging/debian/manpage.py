#!/usr/bin/env python3
"""fitbox(1), written from the command line's own parser (every command, its usage and
options, as `fitbox COMMAND --help` shows them) and the settings table (ENVIRONMENT), so
the page cannot drift from the program: the build runs this against the wheel it packages.

    PYTHONPATH=<unpacked fitbox wheel> python packaging/debian/manpage.py > fitbox.1
"""

from __future__ import annotations

import argparse
import os
import re
import time


def roff(text: str) -> str:
    """Text safe in a roff line: backslashes and hyphens escaped, no line opening with a
    control character."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        "\\&" + line if line.startswith((".", "'")) else line for line in text.splitlines()
    )


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    return " ".join(formatter._expand_help(action).split()) if action.help else ""


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _options(parser: argparse.ArgumentParser) -> list[str]:
    lines: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.option_strings:
            metavar = parser._get_formatter()._format_args(action, action.dest.upper())
            names = ", ".join(f"\\fB{roff(o)}\\fR" for o in action.option_strings)
            head = f"{names} \\fI{roff(metavar)}\\fR" if action.nargs != 0 else names
        else:
            head = f"\\fI{roff(action.metavar or action.dest)}\\fR"
        lines += [".TP", head, roff(_help(parser, action)) or "\\&"]
    return lines


def _usage(parser: argparse.ArgumentParser) -> list[str]:
    """argparse's own usage, wrapped at COLUMNS (main sets 78), kept as its lines."""
    usage = parser.format_usage().removeprefix("usage: ").rstrip("\n")
    return [".PP", ".nf", roff(usage), ".fi"]


def _command(name: str, help_text: str, parser: argparse.ArgumentParser) -> list[str]:
    lines = [f'.SS "{roff(name)}"', roff(help_text) or "\\&", *_usage(parser), *_options(parser)]
    for sub, sub_help, sub_parser in _subcommands(parser):
        lines += _command(f"{name} {sub}", sub_help, sub_parser)
    return lines


FILES = (
    ("/etc/fitbox/fitbox.env", "the service's settings (root's, mode 0600)"),
    ("/etc/systemd/system/fitbox.service", "the unit fitbox install --system writes"),
    ("/var/lib/fitbox", "the service's home: its SQLite store, box key, logs, models"),
    (
        "/usr/lib/fitbox-llama-server/llama-server",
        "the engine the fitbox-llama-server package installs, found by fitbox without any setting",
    ),
)


def page(top: argparse.ArgumentParser, settings: list[tuple[str, str, str]], version: str) -> str:
    """The whole page; ``settings`` are (variable, help, default) from the settings table."""
    date = time.strftime(
        "%Y-%m-%d", time.gmtime(float(os.environ.get("SOURCE_DATE_EPOCH", 0)) or time.time())
    )
    summary = (top.description or "").removeprefix("fitbox:").strip().rstrip(".")
    lines = [
        f'.TH FITBOX 1 "{date}" "fitbox {roff(version)}" "User Commands"',
        ".SH NAME",
        f"fitbox \\- {roff(summary)}",
        ".SH SYNOPSIS",
        ".B fitbox",
        ".I command",
        ".RI [ options ]",
        ".SH DESCRIPTION",
        roff(
            "fitbox resolves model names to weights on disk, works out whether a model fits "
            "beside what is loaded (evicting idle models, never one serving a call), "
            "launches a llama-server child for it and forwards OpenAI-compatible calls to it. "
            "Installed by the Debian package, /usr/bin/fitbox works on the service's own "
            "home: it reads /etc/fitbox/fitbox.env and, run as root, runs every command but "
            "install, uninstall and update as the fitbox user."
        ),
        ".SH COMMANDS",
    ]
    for name, help_text, parser in _subcommands(top):
        lines += _command(f"fitbox {name}", help_text, parser)
    lines.append(".SH ENVIRONMENT")
    for variable, help_text, default in settings:
        # a list default (trusted networks) may break after each comma: \\: marks where
        said = roff(help_text) + (f" (default: {roff(default)})" if default else "")
        lines += [".TP", f"\\fB{roff(variable)}\\fR", said.replace(",", ",\\:")]
    lines.append(".SH FILES")
    for path, what in FILES:
        lines += [".TP", f"\\fI{roff(path)}\\fR", roff(what)]
    lines += [".SH SEE ALSO", ".BR systemctl (1),", ".BR journalctl (1)"]
    return "\n".join(lines) + "\n"


def main() -> int:
    os.environ["COLUMNS"] = "78"  # argparse wraps usage lines at this width
    import fitbox
    from fitbox.cli import parser
    from fitbox.config import SETTINGS

    settings = [(s.env, s.help, re.sub(r"\s+", " ", str(s.default))) for s in SETTINGS if s.env]
    print(page(parser(), settings, fitbox.__version__), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
