"""Task runners behind the engine seam: one ``TaskEngine`` per runner (task_runners.py).

Each child is ``<env python> -c BOOT <engines folder> --runner MODULE --model PATH …``: the
generic task child (``engines/task_child/``) loads the runner's module, which imports its
own packages from its environment (task_envs.py); nothing of fitbox's venv is on its path
but the folder holding ``task_child``, appended last. The child answers ``/health`` (503
while loading), ``/props`` (what the load made the process hold: its RSS after the load
less its RSS before, the runner's measured footprint) and its routes, in OpenAI's shapes.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from fitbox.core.repack import CpuFeatures
from fitbox.engines.child import Child
from fitbox.engines.http1 import EngineConnectionError, EnginePool
from fitbox.engines.llama_server import parse_timings
from fitbox.engines.seam import (
    Abilities,
    CallTimings,
    EngineNotFound,
    Held,
    LaunchIntent,
    LaunchSpec,
)
from fitbox.engines.task_envs import (
    PROBE_S,
    RETRY_AFTER_S,
    EnvState,
    probe_code,
    start_build,
    state_of,
)
from fitbox.engines.task_runners import RunnerSpec
from fitbox.errors import EngineEnvBuilding, EngineEnvFailed, FitboxError

BOOT = (
    "import sys; sys.path.append(sys.argv[1]); "
    "from task_child.__main__ import main; main(sys.argv[2:])"
)
INSTALL_COMMAND = "fitbox install --tasks"
_OOM = ("std::bad_alloc", "MemoryError", "Failed to allocate memory", "out of memory")


def child_env() -> dict[str, str]:
    """The runner's own packages only: fitbox's PYTHONPATH is not passed on, nothing is
    fetched (the model is the folder or file), and no GPU is touched by a RAM placement."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def build_argv(python: Path, spec: RunnerSpec, intent: LaunchIntent) -> list[str]:
    argv = [
        str(python),
        "-c",
        BOOT,
        str(Path(__file__).resolve().parent),
        "--runner",
        spec.module,
        "--model",
        str(intent.model_path),
        "--alias",
        intent.alias,
        "--host",
        intent.host,
        "--port",
        str(intent.port),
        "--device",
        "cuda" if intent.gpu_layers and intent.gpus else "cpu",
    ]
    if intent.threads:
        argv += ["--threads", str(intent.threads)]
    return argv


def held_from_props(props: dict[str, object]) -> Held | None:
    """The load's measured footprint: what the process holds after it less before it."""
    held = props.get("held_bytes")
    if not isinstance(held, int) or isinstance(held, bool) or held < 0:
        return None
    return Held(weights=held, kv=0, compute=0, output=0)


class TaskEngine:
    """One task runner behind the engine seam (engines/seam.py)."""

    def __init__(self, spec: RunnerSpec, engines_dir: Path | None) -> None:
        self.spec = spec
        self.name = spec.name
        self.engines_dir = engines_dir
        self._python: Path | None = None  # the environment's interpreter, once it imported
        self._probing = threading.Lock()

    def serves(self, artifact_format: str) -> bool:
        return artifact_format == self.spec.format

    def routes(self) -> frozenset[str]:
        return self.spec.routes

    def state(self) -> EnvState:
        if self.engines_dir is None:
            return EnvState(self.name, Path(), "missing", "fitbox has no engine dir")
        return state_of(self.engines_dir, self.spec)

    def unavailable(self) -> FitboxError | None:
        """None once its environment is built; else its build started (once, in a thread)
        and the call refused with Retry-After, or the failed build's reason."""
        if self._python is not None:
            return None
        found = self.state()
        if found.state == "ready":
            return None
        if found.state == "failed":
            return EngineEnvFailed(
                f"The {self.name} engine's environment ({found.path}) failed to build: "
                f"{found.reason}. Calls do not build it again; run '{INSTALL_COMMAND}'.",
                runner=self.name,
            )
        if found.state == "missing" and self.engines_dir is not None:
            start_build(self.engines_dir, self.spec)
        return EngineEnvBuilding(
            f"The {self.name} engine's environment is being built at {found.path} (its "
            f"packages: fitbox's '{self.spec.extra}' extra); retry in a minute or two. "
            "`fitbox engines` shows its state.",
            retry_after=RETRY_AFTER_S,
            runner=self.name,
        )

    def locate(self) -> None:
        if self._python is not None:
            return
        with self._probing:
            found = self.state()
            if found.state != "ready":
                raise EngineNotFound(
                    f"The {self.name} engine's environment at {found.path} is {found.state}"
                    f" ({found.reason or 'no reason given'}); build it with '{INSTALL_COMMAND}'."
                )
            run = subprocess.run(
                [str(found.python), "-c", probe_code(self.spec)],
                capture_output=True,
                text=True,
                timeout=PROBE_S,
                check=False,
                env=child_env(),
            )
            if run.returncode != 0:
                last = (run.stderr.strip().splitlines() or ["no output"])[-1]
                raise EngineNotFound(
                    f"{found.python} cannot import {', '.join(self.spec.modules)}: {last}; "
                    f"rebuild it with '{INSTALL_COMMAND}'."
                )
            self._python = found.python

    async def prepare(self) -> None:
        """Nothing: its environment is checked by each call (``unavailable``)."""

    def cpu_features(self) -> CpuFeatures | None:
        return None

    def abilities(self) -> Abilities:
        # the runners place their weights whole, in RAM (no GPU build is installed)
        return Abilities(four_bit_in_place=False, partial_offload=False, gpus=False)

    def launch(self, intent: LaunchIntent) -> LaunchSpec:
        assert self._python is not None, "located before launch"
        env = child_env()
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in intent.gpus)
        return LaunchSpec(tuple(build_argv(self._python, self.spec, intent)), intent.port, env)

    def slots(self, parallel: int) -> int:
        return 1  # one task at a time; more calls wait at fitbox's door

    def slots_for(self, n: int) -> int:
        return 1  # a call's n (images) is one batch in the runner

    async def held(self, child: Child) -> Held | None:
        props = await self._props(child)
        return held_from_props(props) if props is not None else None

    async def held_now(self, child: Child) -> int | None:
        return None  # what the load held is held as long as it runs

    async def _props(self, child: Child) -> dict[str, object] | None:
        try:
            status, body = await child.pool.get("/props")
            props = json.loads(body) if status == 200 else None
        except (EngineConnectionError, OSError, json.JSONDecodeError):
            return None
        return props if isinstance(props, dict) else None

    def timings(self, tail: bytes) -> CallTimings | None:
        """llama-server's ``timings`` object where a runner writes one (diffusers: its
        images as the "tokens", so the speed book holds ms an image and the queue's ETA
        reads images per second); a task's other figures are its row's own columns."""
        return parse_timings(tail)

    def out_of_memory(self, lines: Sequence[str]) -> str | None:
        return next((ln for ln in reversed(lines) if any(s in ln for s in _OOM)), None)

    def shape(self, path: str, body: bytes) -> tuple[str, bytes]:
        return path, body  # the door wrote the child's JSON (server/inference/tasks.py)

    async def count_prompt(self, pool: EnginePool, path: str, body: bytes) -> int | None:
        return None

    def sends_on_bound(self, path: str) -> bool:
        return True  # no window to overflow: a task is sent as it is

    def refused_prompt(self, status: int, body: bytes) -> int | None:
        return None

    def metrics_path(self) -> str | None:
        return None
