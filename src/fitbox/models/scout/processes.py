"""Model paths in the command lines of running engines (llama-server, Ollama, vLLM,
KoboldCpp), and the store of a running Ollama from its environment (``OLLAMA_MODELS``, else
its ``HOME``'s default store): live use, read from /proc through psutil, never by
signalling anything. An environment fitbox may not read (another user's process, without
root) is skipped: the default stores are still read."""

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


def _processes(pid: int | None) -> Iterable[psutil.Process]:
    if pid is None:
        return psutil.process_iter()
    try:
        return [psutil.Process(pid)]
    except psutil.Error:
        return []  # gone already: nothing to say


def running_ollama_stores(pid: int | None = None) -> list[tuple[Path, str]]:
    """(store, what led to it) for each running Ollama whose environment is readable."""
    found: list[tuple[Path, str]] = []
    for proc in _processes(pid):
        try:
            if engine_of(proc.cmdline(), proc.name()) != "ollama":
                continue
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("OLLAMA_MODELS"):
            found.append(
                (Path(env["OLLAMA_MODELS"]), f"OLLAMA_MODELS of the running ollama, pid {proc.pid}")
            )
        elif env.get("HOME"):
            found.append(
                (
                    Path(env["HOME"]) / ".ollama" / "models",
                    f"the default store of the running ollama, pid {proc.pid}",
                )
            )
    return found


def process_hints(pid: int | None = None) -> Iterator[Hint]:
    for proc in _processes(pid):
        try:
            argv, name, cwd = proc.cmdline(), proc.name(), proc.cwd()
        except (psutil.Error, OSError):
            continue
        engine = engine_of(argv, name)
        if engine is None or not argv:
            continue
        if engine == "ollama":  # its models are in its store (running_ollama_stores)
            continue
        for arg in model_args(argv):
            path = Path(arg) if Path(arg).is_absolute() else Path(cwd) / arg
            if path.is_file():
                yield Hint(
                    path,
                    "process",
                    f"pid {proc.pid} ({engine}) runs with {' '.join([*argv[:1], arg])}",
                )
