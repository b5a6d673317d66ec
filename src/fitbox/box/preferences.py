"""Operator knobs: box-wide, per model (a "pair": this box and that model), per key, and limits.

Which knobs each scope has, their JSON parsers and defaults come from the settings table
(fitbox.setting_table), under the names the table gives them; each value is parsed once, with
an error that names it; values live in the store's
``settings`` table (store/settings.py) so they outlive a restart. What a call gets is the
effective value: the model's own, else the box's, else the setting fitbox was started with.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from fitbox.config import SETTINGS, Config
from fitbox.errors import InvalidRequest
from fitbox.setting_values import BOX, KEY, LIMITS, PAIR
from fitbox.store.settings import StoredSetting


def _knobs(scope: str) -> dict[str, Callable[[Any], Any]]:
    """The knobs the settings table lets the API set in ``scope``, each with its JSON parser."""
    return {s.name: s.api for s in SETTINGS if scope in s.scopes and s.api is not None}


PAIR_KNOBS = _knobs(PAIR)  # this box and that model
KEY_KNOBS = _knobs(KEY)  # what a client sees: where a model's thinking goes, load progress
BOX_KNOBS = _knobs(BOX)
LIMIT_KNOBS = _knobs(LIMITS)
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
        """Each knob's value before the API sets one: the setting fitbox started with, or
        for a knob only the API sets, the table's default (JSON)."""
        return {
            s.name: _json_value(getattr(self.config, s.name)) if s.env else json.loads(s.default)
            for s in SETTINGS
            if set(s.scopes) & {BOX, PAIR, KEY}
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


def _json_value(value: Any) -> Any:
    """A start-up setting as the API shows it (a tuple of cache types as a list)."""
    return list(value) if isinstance(value, tuple) else value
