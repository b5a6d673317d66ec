"""Model paths in the command lines of running engines (llama-server, Ollama, vLLM,
KoboldCpp): live use, read from /proc through psutil, never by signalling anything."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil

from .findings import Hint

ENGINES = ("llama-server", "llama-cli", "ollama", "vllm", "koboldcpp")
_MODEL_FLAGS = ("-m", "--model", "--model-path", "--mmproj")


def engine_of(argv: list[str], name: str) -> str | None:
    """Which engine a process is, from its name or its command line (``python -m vllm``)."""
    words = [Path(a).name.lower() for a in argv[:3]] + [name.lower()]
    for engine in ENGINES:
        if any(w == engine or w.startswith(engine) for w in words):
            return engine
    return None


def model_args(argv: list[str]) -> list[str]:
    """The paths a command line names as models: after a model flag, or a positional .gguf."""
    found = []
    for i, arg in enumerate(argv[1:], 1):
        flag, eq, value = arg.partition("=")
        if eq and flag in _MODEL_FLAGS:
            found.append(value)
        elif arg in _MODEL_FLAGS and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif arg.lower().endswith(".gguf") and argv[i - 1] not in _MODEL_FLAGS:
            found.append(arg)
    return found


def process_hints(pid: int | None = None) -> Iterator[Hint]:
    if pid is None:
        procs: Iterable[psutil.Process] = psutil.process_iter()
    else:
        try:
            procs = [psutil.Process(pid)]
        except psutil.Error:
            return  # gone already: nothing to say
    for proc in procs:
        try:
            argv, name, cwd = proc.cmdline(), proc.name(), proc.cwd()
        except (psutil.Error, OSError):
            continue
        engine = engine_of(argv, name)
        if engine is None or not argv:
            continue
        if engine == "ollama":  # its models are in its store; places.py reads that
            continue
        for arg in model_args(argv):
            path = Path(arg) if Path(arg).is_absolute() else Path(cwd) / arg
            if path.is_file():
                yield Hint(
                    path,
                    "process",
                    f"pid {proc.pid} ({engine}) runs with {' '.join([*argv[:1], arg])}",
                )
