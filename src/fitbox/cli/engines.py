"""``fitbox engines``: every engine candidate, the one selected and why."""

from __future__ import annotations

import argparse
import sys

from fitbox import config as settings

HELP = (
    "every engine fitbox can see (llama-server, transformers, the task runners), and the one "
    "of each kind it uses"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No flags: it reads the settings (engine_dir, home) as every command does."""


def run(config: settings.Config, args: argparse.Namespace) -> int:
    return list_engines(config)


def list_engines(config: settings.Config) -> int:
    from fitbox.engines.llama_server import candidates, find_binary, inspect

    print("llama-server (GGUF files):")
    try:
        chosen = find_binary(config.engine_dir).path
    except Exception as exc:
        chosen = None
        print(f"fitbox engines: {exc}", file=sys.stderr)
    for candidate in candidates(config.engine_dir):
        mark = "*" if candidate.path == chosen else " "
        try:
            info = inspect(candidate.path)
            detail = (
                f"version {info.version}, {len(info.flags)} flags, "
                f"--fit {'yes' if info.has('--fit') else 'no'}"
            )
        except OSError as exc:
            detail = f"not runnable: {exc}"
        print(f"{mark} {candidate.path}  ({candidate.source}; {detail})")
    list_tf_engines(config)
    list_task_engines(config)
    return 0 if chosen else 1


def list_tf_engines(config: settings.Config) -> bool:
    """The transformers engine's candidate interpreters, each probed; the first usable one
    (in discovery order) is selected. Returns whether one is."""
    from fitbox.engines.kinds import engines_home
    from fitbox.engines.tf import INSTALL_COMMAND, candidates, probe

    print("transformers (Hugging Face folders):")
    selected = False
    for candidate in candidates(engines_home(config.engine_dir, config.home)):
        found = probe(candidate.python)
        mark = "*" if found.usable and not selected else " "
        if found.usable:
            why = "selected: first usable in discovery order" if not selected else "usable"
            selected = True
            mods = found.modules
            detail = (
                f"{why}; torch {mods.get('torch')}, transformers {mods.get('transformers')}"
                f", 4-bit {'yes' if found.four_bit else 'no (no bitsandbytes with CUDA)'}"
                f", GPU {'yes' if found.cuda else 'no'}"
            )
        else:
            detail = str(found.problem)
        print(f"{mark} {candidate.python}  ({candidate.source}; {detail})")
    if not selected:
        print(f"  none usable: build one with '{INSTALL_COMMAND}' or set FITBOX_TF_PYTHON")
    return selected


def list_task_engines(config: settings.Config) -> None:
    """Each task runner's environment and its state: ready, building (by which process),
    failed (and why), or missing (a call builds it, or `fitbox install --tasks`)."""
    from fitbox.engines.kinds import engines_home
    from fitbox.engines.task_envs import state_of
    from fitbox.engines.task_runners import RUNNERS

    where = engines_home(config.engine_dir, config.home)
    assert where is not None  # a config always has a home
    print("task runners (speech, transcription):")
    for spec in RUNNERS:
        found = state_of(where, spec)
        why = f": {found.reason}" if found.reason else ""
        print(f"  {spec.name} ({spec.format}) {found.path}  {found.state}{why}")
