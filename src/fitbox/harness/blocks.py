"""The block ``fitbox config TOOL`` prints, made from what the box said (its catalog and
its plans), without asking it anything: ``config_block_text`` is pure, and the helper model
answers ``config TOOL [MODEL]`` with the same text.

A block is each of the tool's files under a ``# PATH`` line (how the tool picks it up
beside it), then the models that were left out and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fitbox.harness import render
from fitbox.harness.limits import ModelLimits, Unplaceable, from_catalog_entry, from_plan
from fitbox.harness.shapes import ConfigFile, Target, Tool
from fitbox.harness.tools import tool


class NothingToWrite(ValueError):
    """No model named could be placed (each with its reason), or the box has none."""


@dataclass(frozen=True)
class Models:
    placed: tuple[ModelLimits, ...]
    left_out: tuple[Unplaceable, ...]


def default_model(catalog: Mapping[str, Any]) -> str | None:
    """With no model named: one the box holds now, else the first it lists."""
    data = [m for m in catalog.get("data", []) if isinstance(m, dict) and m.get("id")]
    usable = [m for m in data if not m.get("problem")]
    for entry in usable:
        if entry.get("resident"):
            return str(entry["id"])
    return str(usable[0]["id"]) if usable else None


def models_from(
    names: Sequence[str],
    plans: Mapping[str, Mapping[str, Any]],
    catalog: Mapping[str, Any] | None = None,
) -> Models:
    """Each name's limits from its plan; a name with no plan (through a central, which
    plans nothing) from its catalog entry; a name in neither is left out, saying so."""
    entries = {str(m.get("id")): m for m in (catalog or {}).get("data", []) if isinstance(m, dict)}
    placed: list[ModelLimits] = []
    left_out: list[Unplaceable] = []
    for name in names:
        if name in plans:
            found = from_plan(name, plans[name])
        elif name in entries:  # a central's bare name: the window of a box that has it
            entry = entries[name]
            on_boxes = [e for k, e in entries.items() if k.endswith(f"/{name}") and e.get("meta")]
            found = from_catalog_entry(
                name, entry if entry.get("meta") else next(iter(on_boxes), entry)
            )
        else:
            found = Unplaceable(name, "the box's catalog has no such model")
        if isinstance(found, ModelLimits):
            placed.append(found)
        else:
            left_out.append(found)
    return Models(tuple(placed), tuple(left_out))


def file_text(cf: ConfigFile) -> str:
    if cf.format == "json":
        return render.to_json(cf.data)
    if cf.format == "yaml":
        return render.to_yaml(cf.data)
    if cf.format == "toml":
        return render.to_toml(cf.data)
    return str(cf.data)


def block_text(chosen: Tool, target: Target, left_out: Sequence[Unplaceable] = ()) -> str:
    """The files of ``chosen`` for ``target`` as one text, each under its ``# PATH`` line."""
    parts: list[str] = []
    for cf in chosen.files(target):
        use = f"  ({cf.use})" if cf.use else ""
        parts.append(f"# {cf.path}{use}\n{file_text(cf)}")
    if chosen.note:
        parts.append(f"# note: {chosen.note}\n")
    for miss in left_out:
        parts.append(f"# not written: {miss.name}: {miss.reason}\n")
    return "\n".join(parts)


def config_block_text(
    tool_name: str,
    models: Sequence[str],
    plans: Mapping[str, Mapping[str, Any]],
    base_url: str,
    key: str | None = None,
    catalog: Mapping[str, Any] | None = None,
) -> str:
    """The block ``fitbox config TOOL`` prints, from the box's answers: ``plans`` maps each
    model name to ``/v1/plan``'s answer for it (its error body included), ``catalog`` is
    ``/v1/models``'s answer (the default model when ``models`` is empty; the windows through
    a central, which has no plans). ``base_url`` is the box's root (no /v1); ``key`` the
    inference key a tool off the box uses (None on the box itself).

    Raises UnknownTool (its message lists the known ones), or NothingToWrite when no model
    named can be placed (the message names each with its reason)."""
    chosen = tool(tool_name)
    if chosen.unsupported:
        return f"# {chosen.title}: {chosen.unsupported}\n"
    names = list(models) or [n for n in [default_model(catalog or {})] if n]
    if not names:
        raise NothingToWrite("the box lists no model it can serve")
    found = models_from(names, plans, catalog)
    if not found.placed:
        raise NothingToWrite(
            "; ".join(f"{m.name}: {m.reason}" for m in found.left_out) or "no model named"
        )
    return block_text(chosen, Target(base_url, key, found.placed), found.left_out)
