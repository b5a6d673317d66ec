"""The command line: every ``fitbox`` command is registered once, in ``COMMANDS`` below (its
name, help, flags and what it runs, each from its module here); ``main`` parses, reads the
settings and runs the one named. Thin: the work is in the rooms below."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

import fitbox
from fitbox import config
from fitbox.cli import (
    central,
    engines,
    install,
    keys,
    launch,
    models,
    plan,
    pull,
    runtime,
    scout,
    serve,
)
from fitbox.cli import (
    settings as settings_command,
)
from fitbox.cli.command import Command, overrides

COMMANDS: tuple[Command, ...] = (
    Command("serve", serve.HELP, serve.add_arguments, serve.run),
    Command("models", models.HELP, models.add_arguments, models.run),
    Command("plan", plan.HELP, plan.add_arguments, plan.run),
    Command("keys", keys.HELP, keys.add_arguments, keys.run),
    Command("install", install.INSTALL_HELP, install.add_install_arguments, install.run),
    Command("uninstall", install.UNINSTALL_HELP, install.add_uninstall_arguments, install.run),
    Command("engines", engines.HELP, engines.add_arguments, engines.run),
    Command("update", install.UPDATE_HELP, install.add_update_arguments, install.run_update),
    Command("pull", pull.HELP, pull.add_arguments, pull.run),
    Command("scout", scout.HELP, scout.add_arguments, scout.run),
    Command("central", central.HELP, central.add_arguments, central.run),
    Command("ps", runtime.PS_HELP, runtime.add_ps_arguments, runtime.run_ps),
    *(
        Command(action, help, runtime.add_action_arguments, runtime.run_action(action))
        for action, help in runtime.ACTION_HELPS.items()
    ),
    Command("logs", runtime.LOGS_HELP, runtime.add_logs_arguments, runtime.run_logs),
    Command("status", runtime.STATUS_HELP, runtime.add_status_arguments, runtime.run_status),
    Command("launch", launch.LAUNCH_HELP, launch.add_launch_arguments, launch.run_launch, True),
    Command("config", launch.CONFIG_HELP, launch.add_config_arguments, launch.run_config),
    Command(
        "settings",
        settings_command.HELP,
        settings_command.add_arguments,
        lambda config, args: settings_command.run(config, args, parser()),
    ),
)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="fitbox", description=fitbox.__doc__)
    top.add_argument("--version", action="version", version=f"fitbox {fitbox.__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    return top


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    handed_on: list[str] = []
    passing = {c.name for c in COMMANDS if c.passthrough}
    if words[:1] and words[0] in passing and "--" in words:
        at = words.index("--")
        words, handed_on = words[:at], words[at + 1 :]
    args = parser().parse_args(words)
    if args.command in passing:
        args.args = handed_on
    try:
        settings = config.load(overrides(args))
    except config.ConfigError as exc:
        print(f"fitbox: {exc}", file=sys.stderr)
        return 2
    by_name = {command.name: command for command in COMMANDS}
    try:
        return by_name[args.command].run(settings, args)
    except BrokenPipeError:
        # the reader of its output left (`fitbox models --json | head -1`): not fitbox's
        # error; stdout goes to /dev/null so Python's own flush at exit cannot raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE  # what a shell reports for a tool a closed pipe stopped
