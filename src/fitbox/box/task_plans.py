"""What ``fitbox plan`` says of a task model (speech, transcription, images) beyond its
bytes: its runner, the state of the runner's environment, and its measured speed. A task
model has no window, slots, cache types or band: the report leaves them out rather than
show a chat model's defaults (box/planning.py ``lines`` prints what is left)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from fitbox.engines.seam import Engine
from fitbox.models.catalog import Artifact

from .task_speeds import TaskRates, work_units

CHAT_ONLY = frozenset(
    {"window", "parallel", "type_k", "type_v", "band", "gpu_layers", "tensor_split"}
    | {"experts_in_ram", "load_in_4bit", "repack", "no_repack", "device_counts"}
)


def task_plan(
    report: dict[str, Any], artifact: Artifact, engine: Engine, rates: TaskRates
) -> dict[str, Any]:
    """``report`` for a task model: the chat-only keys removed, its task's added."""
    task = artifact.task or ""
    state = getattr(engine, "state", None)  # a task runner's environment (engines/tasks.py)
    env = state() if callable(state) else None
    measured = rates.rates(artifact)
    trimmed = {k: v for k, v in report.items() if k not in CHAT_ONLY}
    return trimmed | {
        "task": task,
        "runner": engine.name,
        "engine_env": None if env is None else {"state": env.state, "reason": env.reason},
        "speed": {
            "units": work_units(task),
            "per_second": statistics.median(measured) if measured else None,
            "calls": len(measured),
        },
    }


def task_lines(report: Mapping[str, Any]) -> list[str]:
    """The task model's own lines of ``fitbox plan``, after its decision's."""
    env, speed = report.get("engine_env"), report["speed"]
    said = f"  task {report['task']}, runner {report['runner']}"
    if env is not None:
        said += f" (environment {env['state']}{': ' + env['reason'] if env['reason'] else ''})"
    rate = speed["per_second"]
    out = [said]
    if rate is None:
        out.append(f"  speed: not measured yet ({speed['units']} per second, from its calls)")
    else:
        out.append(
            f"  speed: {rate:.3g} {speed['units']} per second (median of its last "
            f"{speed['calls']} call(s))"
        )
    return out
