"""Whether a resident still runs as its settings say: the launch its knobs would give now,
compared with the one it was launched with.

A setting that changes a launch (``embeddings``; the ``rungs``, ``kv_types`` and ``quant``
that placed it) takes effect on the resident's next load; the box does not wait for a
manual unload: an idle resident whose launch no longer matches is loaded again
(box/admit.py ``settings_changed``, asked by each call that would join it and every second
by box/warmth.py), never one that is serving a call. A relaunch (a thread change, a setting
change) takes its launch from the settings as they are then, never from the one recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .resident import Resident


def embeddings_wanted(resident: Resident, knobs: Mapping[str, Any]) -> bool:
    """Whether its settings ask a decoder to serve embeddings too (an embedding model
    serves them whatever the setting says)."""
    return bool(knobs["embeddings"]) and not resident.artifact.facts.is_embedding


def launched_embeddings(resident: Resident) -> bool:
    return resident.embeddings and not resident.artifact.facts.is_embedding


def in_place(resident: Resident, knobs: Mapping[str, Any]) -> str | None:
    """What changed that a relaunch of the same placement applies (the engine's flags);
    None: nothing."""
    wanted = embeddings_wanted(resident, knobs)
    if wanted == launched_embeddings(resident):
        return None
    return f"its embeddings setting was turned {'on' if wanted else 'off'}"


def placed(resident: Resident, knobs: Mapping[str, Any]) -> str | None:
    """What changed that only a new placement applies (it leaves; the next call places it
    again); None: nothing."""
    if resident.place is None:
        return None
    if resident.rung.value not in knobs["rungs"]:
        return f"its rung {resident.rung.value} is no longer among its rungs setting"
    if resident.type_k not in knobs["kv_types"] or resident.type_v not in knobs["kv_types"]:
        return f"its K/V cache {resident.type_k} is no longer in its kv_types setting"
    quant = knobs["quant"]
    if quant and resident.artifact.facts.quant.upper() != str(quant).upper():
        return f"its variant {resident.artifact.facts.quant} is not its quant setting {quant}"
    return None
