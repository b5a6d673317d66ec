"""Operator knobs: box-wide, per model (a "pair": this box and that model), and limits.

Each knob is parsed here, once, with an error that names it; values live in the store's
``settings`` table (store/settings.py) so they outlive a restart. What a call gets is the
effective value: the model's own, else the box's, else the setting fitbox was started with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from fitbox.config import Config
from fitbox.core.sizing import KV_TYPES
from fitbox.core.types import Goal, Rung
from fitbox.errors import InvalidRequest
from fitbox.store.settings import StoredSetting
from fitbox.units import parse_size


def _rungs(value: Any) -> list[str]:
    names = [str(v) for v in value] if isinstance(value, list) else None
    known = [r.value for r in Rung]
    if not names or any(n not in known for n in names):
        raise ValueError(f"a list of rungs from {', '.join(known)}")
    return [r for r in known if r in names]  # ladder order, whatever order they came in


def _goal(value: Any) -> str:
    if value not in [g.value for g in Goal]:
        raise ValueError(f"one of {', '.join(g.value for g in Goal)}")
    return str(value)


def _kv(value: Any) -> list[str]:
    if not isinstance(value, list) or not value or any(v not in KV_TYPES for v in value):
        raise ValueError(f"a list of cache types from {', '.join(KV_TYPES)}")
    return [str(v) for v in value]


def _number(low: float, high: float, integer: bool = False) -> Callable[[Any], float | int]:
    def parse(value: Any) -> float | int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("a number")
        if not low <= value <= high:
            raise ValueError(f"between {low:g} and {high:g}")
        if integer and value != int(value):
            raise ValueError("a whole number")
        return int(value) if integer else float(value)

    return parse


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("true or false")
    return value


def _quant(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 32:
        raise ValueError("a quant name such as Q4_K_M")
    return value.upper()


def _admission(value: Any) -> str:
    if value not in ("eta", "smart", "fifo"):
        raise ValueError("one of eta, smart, fifo")
    return str(value)


PAIR_KNOBS: dict[str, Callable[[Any], Any]] = {
    "rungs": _rungs,  # the rungs this model may use
    "quant": _quant,  # only this variant
    "goal": _goal,
    "band": _number(1, 100, integer=True),  # priority band: eviction cost multiplier
    "max_wait": _number(0.1, 3600),  # seconds a call may wait for room
    "window": _number(256, 1 << 24, integer=True),  # the preferred window
    "kv_types": _kv,
    "preload": _flag,  # load at start
    "pinned": _flag,  # never evicted; loaded at start
    "idle_ttl": _number(0, 7 * 86400),  # unload after this many idle seconds (0: never)
    "embeddings": _flag,  # a decoder serves mean-pooled embeddings too, from its next load
}
REASONING_FIELDS = ("reasoning_content", "reasoning", "none")


def _reasoning_field(value: Any) -> str:
    if value not in REASONING_FIELDS:
        raise ValueError(f"one of {', '.join(REASONING_FIELDS)}")
    return str(value)


# what a client sees: where a model's thinking goes, and loading progress in a stream
KEY_KNOBS: dict[str, Callable[[Any], Any]] = {
    "reasoning_field": _reasoning_field,  # reasoning_content | reasoning | none (in content)
    "progress": _flag,  # a streamed call that waits for a load sees progress chunks
}
BOX_KNOBS: dict[str, Callable[[Any], Any]] = (
    KEY_KNOBS
    | {
        name: PAIR_KNOBS[name]
        for name in ("goal", "max_wait", "window", "kv_types", "idle_ttl", "embeddings")
    }
    | {"admission": _admission, "cpu_floor": _number(1, 1024, integer=True)}
)


def _size(value: Any) -> int:
    if isinstance(value, str):
        return parse_size(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError("a size such as 8GiB, or a byte count")


LIMIT_KNOBS: dict[str, Callable[[Any], Any]] = {
    "ram_max": _size,
    "vram_max": _size,
    "cpu_max": _number(1, 4096, integer=True),
    "storage_max": _size,
}
# the central tier of each limit (what a central allots this box: POST /v1/limits with
# {"tier": "central"}) is kept beside the box's own under this prefix
CENTRAL_TIER = "central_"


def parse(knobs: dict[str, Callable[[Any], Any]], body: Any) -> dict[str, Any]:
    """Parsed values of a settings body; ``None`` clears a knob. Every error names it."""
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object of settings.")
    parsed: dict[str, Any] = {}
    for name, value in body.items():
        if name not in knobs:
            raise InvalidRequest(
                f"Unknown setting {name!r}; known: {', '.join(knobs)}.", param=name
            )
        if value is None:
            parsed[name] = None
            continue
        try:
            parsed[name] = knobs[name](value)
        except ValueError as exc:
            raise InvalidRequest(
                f"Setting {name!r} must be {exc}; got {value!r}.", param=name
            ) from None
    return parsed


@dataclass
class Preferences:
    config: Config
    box: dict[str, Any] = field(default_factory=dict)
    pairs: dict[str, dict[str, Any]] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)  # by key id: KEY_KNOBS
    # what effective() and for_key() merged, by model / key id: a call asks 3-4 times and
    # the knobs change only through apply(), which forgets them
    _merged: dict[tuple[str, str | None], Mapping[str, Any]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def defaults(self) -> dict[str, Any]:
        c = self.config
        return {
            "goal": c.goal,
            "max_wait": c.wait_timeout,
            "window": c.ctx,
            "kv_types": list(c.kv_types),
            "idle_ttl": 0.0,
            "admission": c.admission,
            "cpu_floor": c.cpu_floor,
            "rungs": [r.value for r in Rung],
            "quant": None,
            "band": 1,
            "preload": False,
            "pinned": False,
            "embeddings": False,
            "reasoning_field": "reasoning_content",
            "progress": False,
        }

    def effective(self, model: str | None = None) -> Mapping[str, Any]:
        """The knobs a call on ``model`` gets (read-only: one merge serves every call)."""
        found = self._merged.get(("model", model))
        if found is None:
            merged = self.defaults() | self.box
            if model is not None:
                merged |= self.pairs.get(model, {})
            found = self._merged["model", model] = MappingProxyType(merged)
        return found

    def for_key(self, key_id: str | None) -> Mapping[str, Any]:
        """What a call under the key ``key_id`` sees (KEY_KNOBS): its own, else the box's."""
        found = self._merged.get(("key", key_id))
        if found is None:
            merged = {
                k: v
                for k, v in (dict(self.effective()) | self.keys.get(key_id or "", {})).items()
                if k in KEY_KNOBS
            }
            found = self._merged["key", key_id] = MappingProxyType(merged)
        return found

    def limit(self, name: str) -> Any:
        """The box tier of a limit: set here, else the start-up setting, else None."""
        if name in self.limits:
            return self.limits[name]
        return getattr(self.config, name, None)

    def central_limit(self, name: str) -> Any:
        """The central tier of a limit (what a central allotted), else None."""
        return self.limits.get(CENTRAL_TIER + name)

    def cap(self, name: str) -> Any:
        """The lower of the box and central tiers: what fitbox may use (None: no cap)."""
        found = [v for v in (self.limit(name), self.central_limit(name)) if v is not None]
        return min(found, default=None)

    def apply(self, scope: str, model: str, values: dict[str, Any]) -> None:
        self._merged.clear()
        target = {"box": self.box, "limits": self.limits}.get(scope)
        owners = self.keys if scope == "key" else self.pairs  # key: ``model`` is the key id
        if target is None:
            target = owners.setdefault(model, {})
        for name, value in values.items():
            if value is None:
                target.pop(name, None)
            else:
                target[name] = value
        if scope in ("pair", "key") and not target:
            owners.pop(model, None)

    def restore(self, stored: Iterable[StoredSetting]) -> None:
        """Apply the knobs the store kept from an earlier run (store/settings.py)."""
        for setting in stored:
            self.apply(setting.scope, setting.model, {setting.name: setting.value})
