"""`fitbox install --tasks [RUNNER]`: the task runners' environments, built now.

The same build a call starts when it finds an environment missing (engines/task_envs.py),
run in the foreground: one already built from today's requirement list is kept, one that
failed is built again (calls never retry a failed build; this is how an operator does).
"""

from __future__ import annotations

import sys
from pathlib import Path

from fitbox.engines.task_envs import EnvBuildFailed, build, state_of
from fitbox.engines.task_runners import RUNNERS, runner_named


def install_tasks(engines: Path, which: str = "all") -> int:
    try:
        specs = RUNNERS if which == "all" else (runner_named(which),)
    except KeyError as exc:
        print(f"fitbox install --tasks: {exc.args[0]}", file=sys.stderr)
        return 2
    failed = 0
    for spec in specs:
        found = state_of(engines, spec)
        if found.state == "ready":
            print(f"kept {found.path}: built from the same requirements")
            continue
        print(f"building {found.path} ({spec.name}: fitbox's '{spec.extra}' extra)", flush=True)
        try:
            build(engines, spec)
        except EnvBuildFailed as exc:
            print(f"fitbox install --tasks: {spec.name}: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"built {found.path}")
    return 1 if failed else 0
