"""A model's window and output limit, as the box would place it now.

The window is the plan's (``/v1/plan``: the window one call may hold in the child the box
would load; its slots share one unified KV cache, so each call can hold the whole window).
The output limit is a quarter of it: a tool that asks for that many tokens of reply still
leaves three quarters of the window to its prompt, so its calls fit the placed window and
never make the box move the model to a larger one. A plan that refuses names its reason and
numbers; such a model is not written into any config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OUTPUT_SHARE = 4  # the output limit is window // OUTPUT_SHARE
OUTPUT_MAX = 32768  # never more than this, however large the window


@dataclass(frozen=True)
class ModelLimits:
    """One model as a tool is told it: the name to send, its window and output limit."""

    name: str  # as the catalog names it (an alias, a family name or a pin is kept as asked)
    window: int
    output: int
    variants: tuple[str, ...] = ()  # the artifacts the name may resolve to (a key's models)


@dataclass(frozen=True)
class Unplaceable:
    """A model the box would not place now, and why (the plan's own words)."""

    name: str
    reason: str


def output_limit(window: int) -> int:
    return max(1, min(window // OUTPUT_SHARE, OUTPUT_MAX))


def from_plan(name: str, plan: Mapping[str, Any]) -> ModelLimits | Unplaceable:
    """``plan`` is ``/v1/plan``'s answer for ``name`` (or its error body)."""
    if "error" in plan:
        error = plan["error"]
        return Unplaceable(
            name, str(error.get("message", error)) if isinstance(error, dict) else str(error)
        )
    decision = plan.get("decision")
    if decision == "refuse":
        detail = plan.get("detail") or ""
        needed, available = plan.get("needed_bytes"), plan.get("available_bytes")
        numbers = (
            f": needs {needed} bytes on {plan.get('device')}, which holds {available}"
            if needed is not None and available is not None
            else ""
        )
        why = f"{plan.get('reason', 'refused')}{numbers}"
        return Unplaceable(name, f"{why} ({detail})" if detail else why)
    window = plan.get("window")
    if not isinstance(window, int) or window <= 0:
        return Unplaceable(name, f"the plan names no window (decision {decision!r})")
    variants = tuple(str(v) for v in plan.get("variants") or ()) or (str(plan.get("model", name)),)
    return ModelLimits(name, window, output_limit(window), variants)


def from_catalog_entry(name: str, entry: Mapping[str, Any]) -> ModelLimits | Unplaceable:
    """Through a central (no ``/v1/plan`` there): the window a box holds the model at now
    (``meta.n_ctx``), else its trained window; the central picks the box at call time."""
    meta = entry.get("meta") or {}
    window = meta.get("n_ctx") or meta.get("n_ctx_train")
    if not isinstance(window, int) or window <= 0:
        return Unplaceable(name, "the central's catalog names no window for it")
    return ModelLimits(name, window, output_limit(window), (name,))
