"""The engine seam: what every engine kind gives the box, so the box names none of them.

An engine kind (llama-server today; the transformers child and task runners next, see
DESIGN.md §Engines) is one object with this shape. The box hands it a ``LaunchIntent``
(what the core decided, in the core's words) and gets back how to run it; after readiness
it asks what the child really holds; after each call it asks what the call measured.
Nothing in ``box/`` looks inside an argv, a load log or a response body.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fitbox.core.repack import CpuFeatures
from fitbox.engines.child import Child
from fitbox.engines.http1 import EnginePool
from fitbox.errors import FitboxError


class EngineNotFound(RuntimeError):
    """No runnable engine of a kind; the message names the command that installs one."""


@dataclass(frozen=True)
class LaunchIntent:
    """What the box wants running; each engine kind turns it into its own launch spec."""

    model_path: Path
    alias: str
    window: int
    parallel: int
    gpu_layers: int  # 0 on host; a large number means every layer on the GPU
    port: int
    embedding: bool = False
    reranking: bool = False  # a reranker's classifier head, served on /v1/rerank
    pooling: str = ""  # how token vectors become one embedding ("mean"); "": the model's
    host: str = "127.0.0.1"
    tensor_split: tuple[float, ...] = ()  # one share per GPU in ``gpus``; empty on one GPU
    gpus: tuple[int, ...] = ()  # the GPUs (NVML indices, in order) its layers go to
    experts_in_ram: bool = False  # MoE experts stay in RAM (--cpu-moe for llama-server)
    threads: int | None = None  # the cores the CPU claim holds
    type_k: str = "f16"
    type_v: str = "f16"
    no_repack: bool = False  # weights in RAM stay as the file has them (--no-repack)
    kv_unified: bool = False  # the slots share one KV cache: each may fill the window
    warmup: bool = True  # False: no empty warmup run; the call waiting for the load warms it
    load_in_4bit: bool = False  # quantize the weights to 4-bit as they load (Abilities)
    vision: bool = False  # it reads image inputs (a transformers child loads its processor)
    mmproj: Path | None = None  # the vision projector loaded beside a GGUF (--mmproj)


@dataclass(frozen=True)
class Abilities:
    """What an engine kind can do with an artifact beyond loading it whole as it is."""

    four_bit_in_place: bool = False  # quantizes full-precision weights to 4-bit as it loads
    four_bit_problem: str = ""  # why it cannot ("": it can, or the kind has no such thing)
    partial_offload: bool = True  # some layers on a GPU, the rest in RAM (-ngl N)
    # it can put weights on a GPU at all: a llama-server built without a GPU backend, or a
    # CPU-only torch, loads everything in RAM whatever -ngl or the device map asks
    gpus: bool = True


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one child: its argv, extra environment, and where it answers."""

    argv: tuple[str, ...]
    port: int
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Held:
    """What a loaded child reports it allocated, by kind of buffer (bytes)."""

    weights: int
    kv: int
    compute: int
    output: int
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    # of the above, what it occupies at this moment (a cache that grows with its tokens is
    # budgeted in ``kv`` but held only as far as it grew); None: all of it
    now: int | None = None


@dataclass(frozen=True)
class CallTimings:
    """What one call measured, in the engine's own figures (None: not reported)."""

    prompt_n: int = 0
    prompt_ms: float | None = None
    prompt_per_token_ms: float | None = None
    decode_n: int = 0
    decode_ms: float | None = None
    decode_per_token_ms: float | None = None
    cache_n: int | None = None


class Engine(Protocol):
    """One engine kind. Implementations: ``engines.llama_server.LlamaServer``,
    ``engines.tf.Transformers``, ``engines.tasks.TaskEngine`` (one per task runner)."""

    name: str  # what an operator calls it, in messages ("llama-server")

    def serves(self, artifact_format: str) -> bool:
        """Whether it can load an artifact of this format ("gguf", "transformers", …)."""
        ...

    def routes(self) -> frozenset[str]:
        """The OpenAI paths its children answer."""
        ...

    def locate(self) -> None:
        """Find a runnable engine now (cached); raises ``EngineNotFound`` with the fix."""
        ...

    def unavailable(self) -> FitboxError | None:
        """Why no call can be placed on this kind now, at once and without blocking (its
        environment is being built, or its build failed); None: place it. Asked before a
        call is placed, so nothing is evicted for a child that cannot start."""
        ...

    async def prepare(self) -> None:
        """Do what ``locate`` does off the event loop, where it costs more than a moment
        (probes of the binary); never raises: a load says what is missing."""
        ...

    def cpu_features(self) -> CpuFeatures | None:
        """What the engine's CPU backend does with weights in RAM (the repack rule's input,
        read once per binary); None: unknown, or nothing is repacked."""
        ...

    def abilities(self) -> Abilities:
        """What the 4bit and partial-offload rungs may ask of it (the 4-bit probe is read
        once per interpreter); an engine not installed can do nothing more."""
        ...

    def launch(self, intent: LaunchIntent) -> LaunchSpec:
        """The launch spec of a child for this intent (only flags the engine has)."""
        ...

    def slots(self, parallel: int) -> int:
        """How many calls a child given ``parallel`` slots (FITBOX_PARALLEL) truly runs at
        once: fitbox admits no more, so a call beyond them waits in its queue, seen."""
        ...

    def slots_for(self, n: int) -> int:
        """How many of those one call asking for ``n`` choices takes."""
        ...

    async def held(self, child: Child) -> Held | None:
        """What a ready child allocated (a load log, a ``/props`` body); None: unknown."""
        ...

    async def held_now(self, child: Child) -> int | None:
        """What a ready child occupies now of what ``held`` reported (weights included);
        None: all of it, for as long as it runs (nothing grows)."""
        ...

    def timings(self, tail: bytes) -> CallTimings | None:
        """A call's measured speeds from the end of its response body; None: none."""
        ...

    def out_of_memory(self, lines: Sequence[str]) -> str | None:
        """The line of a failed load that says it ran out of memory, if one does."""
        ...

    def shape(self, path: str, body: bytes) -> tuple[str, bytes]:
        """The path and body to send to a child for a client's call on ``path``."""
        ...

    async def count_prompt(self, pool: EnginePool, path: str, body: bytes) -> int | None:
        """The tokens a call's prompt takes in a ready child, as its model's own chat
        template and tokenizer make them; None: this engine or call cannot say."""
        ...

    def sends_on_bound(self, path: str) -> bool:
        """Whether a call on ``path`` whose prompt bound overflows a ready child's slot
        is sent as it is, uncounted: the child refuses a prompt its slot cannot hold and
        says the prompt's tokens (``refused_prompt``), so the call is placed again only
        then, and the common call costs no counting round trips."""
        ...

    def refused_prompt(self, status: int, body: bytes) -> int | None:
        """The prompt's tokens when ``body`` is a child's refusal of a call because its
        slot cannot hold the prompt; None: any other answer."""
        ...

    def metrics_path(self) -> str | None:
        """Where a child serves its own Prometheus metrics (re-exported by fitbox's
        ``/metrics`` with a ``model`` label); None: it serves none."""
        ...
