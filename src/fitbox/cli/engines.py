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


# What each module of the engine environment gives (``fitbox engines`` imports each one).
CAPABILITIES = (
    ("torch", "runs every model"),
    ("transformers", "loads the folders"),
    ("safetensors", "reads their weights"),
    ("accelerate", "splits a model over GPUs, experts in RAM"),
    ("peft", "LoRA adapters (fitbox.json adapter_dir)"),
    ("sentence_transformers", "embedding folders with modules.json"),
    ("PIL", "images for vision-language folders"),
    ("bitsandbytes", "the 4bit rung (@4bit), on CUDA and on the CPU"),
)


def list_tf_engines(config: settings.Config) -> bool:
    """The transformers engine's candidate interpreters, each probed; the first usable one
    (in discovery order) is selected, every capability imported in it and reported, and
    what its transformers loads recorded for the catalog. Returns whether one is."""
    from fitbox.engines.kinds import engines_home
    from fitbox.engines.tf import INSTALL_COMMAND, candidates, probe, write_support

    print("transformers (Hugging Face folders):")
    selected = False
    for candidate in candidates(engines_home(config.engine_dir, config.home)):
        found = probe(candidate.python, full=not selected)
        mark = "*" if found.usable and not selected else " "
        if found.usable and not selected:
            print(
                f"{mark} {candidate.python}  ({candidate.source}; selected: first usable "
                f"in discovery order; GPU {'yes' if found.cuda else 'no'})"
            )
            for module, gives in CAPABILITIES:
                version = found.modules.get(module)
                said = found.failed.get(module) or ("not installed" if not version else "")
                state = f"ok {version}" if version else f"NO ({said})"
                print(f"    {module:<22} {state}: {gives}")
            if not found.four_bit:
                print(f"    4bit rung not offered: {found.four_bit_problem()}")
            write_support(config.tf_support, found)
            selected = True
            continue
        detail = "usable" if found.usable else str(found.problem)
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
