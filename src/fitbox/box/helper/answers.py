"""What the helper's reading menus say: the residents, a model's plan, the settings, a tool's
config block. Each reads the box as the HTTP API reads it (``Box.plan_for`` is ``/v1/plan``'s
and ``fitbox plan``'s, and ``planning.lines`` is ``fitbox plan``'s own words); none changes it.
A key limited to some models sees only those (as ``/v1/models`` shows it only those)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fitbox.config import SETTINGS
from fitbox.errors import FitboxError
from fitbox.harness.blocks import NothingToWrite, config_block_text
from fitbox.harness.tools import UnknownTool
from fitbox.units import format_bytes

from ..planning import lines
from ..preferences import BOX_KNOBS, PAIR_KNOBS

if TYPE_CHECKING:
    from ..box import Box


@dataclass(frozen=True)
class Caller:
    """Who is chatting with the helper, as the door saw them."""

    allowed: tuple[str, ...] | None = None  # the key's models; None: any
    keyed: bool = False  # a key was presented (a tool off the box needs one)
    base_url: str = "http://127.0.0.1:8484/v1"  # the box as the caller reached it
    request_id: str = ""


@dataclass(frozen=True)
class ConfigTarget:
    """What a tool's config block says: where the box is, which model, its real limits."""

    tool: str
    model: str
    base_url: str
    window: int  # the window the box would place the model at now (its plan)
    output_limit: int  # tokens a reply may take: the window (prompt and reply share it)
    keyed: bool  # the caller sent a key: the tool needs one too


# The one call site of a tool's config block: ``tool_block`` (``fitbox config``'s own
# renderer) in the app, ``plain_env_block`` where no renderer is handed in.
ConfigBlocks = Callable[[ConfigTarget], str]
KEY_PLACEHOLDER = "<an inference key: fitbox keys create --scope inference>"


def tool_block(target: ConfigTarget) -> str:
    """The block ``fitbox config TOOL --model MODEL`` prints for this box and window
    (fitbox.harness.blocks ``config_block_text``); a caller with a key is shown where the
    tool's key goes, never a key."""
    plan = {"decision": "place", "model": target.model, "window": target.window}
    base = target.base_url.removesuffix("/").removesuffix("/v1")
    key = KEY_PLACEHOLDER if target.keyed else None
    try:
        return config_block_text(target.tool, [target.model], {target.model: plan}, base, key)
    except (UnknownTool, NothingToWrite) as exc:
        return str(exc)


def plain_env_block(target: ConfigTarget) -> str:
    """The base URL, model and limits as shell variables (any OpenAI-compatible tool)."""
    key = (
        "export OPENAI_API_KEY=<your fitbox key>  # fitbox keys create --scope inference"
        if target.keyed
        else "export OPENAI_API_KEY=unused  # no key needed from the box itself"
    )
    return "\n".join(
        (
            f"# {target.tool} -> fitbox (plain environment; the tool's own block comes with "
            "fitbox config)",
            f"# {target.model}: context window {target.window} tokens, output up to "
            f"{target.output_limit} tokens (the box's plan now)",
            f"export OPENAI_BASE_URL={target.base_url}",
            f"export OPENAI_API_BASE={target.base_url}",
            key,
            f"export OPENAI_MODEL={target.model}",
        )
    )


def _may_see(caller: Caller, *names: str) -> bool:
    return caller.allowed is None or bool(set(names) & set(caller.allowed))


def residents(box: Box, caller: Caller) -> str:
    shown = [
        r for r in box.residents() if _may_see(caller, r.artifact.name, r.asked or r.artifact.name)
    ]
    if not shown:
        return "Nothing is resident: no model is loaded now. A call naming one loads it."
    now, out = time.monotonic(), [f"{len(shown)} resident model(s):"]
    for r in shown:
        idle = f"idle {now - r.last_used:.0f} s" if not r.calls else f"{r.calls} call(s) now"
        if r.pinned:
            why = "pinned (never evicted)"
        elif r.loaded_by_call is not None:
            why = f"loaded for call #{r.loaded_by_call}"
        else:
            why = "loaded at start or by an operator"
        ttl = box.prefs.effective(r.asked or r.artifact.name).get("idle_ttl") or 0
        out.append(
            f"- {r.artifact.name}: {r.state.value} on {r.device}, rung {r.rung.value}, "
            f"window {r.window} x {r.parallel} slot(s), {format_bytes(r.footprint.total)} "
            f"({r.basis}); {idle}; {why}" + (f"; unloaded after {ttl:g} s idle" if ttl else "")
        )
    return "\n".join(out)


def why(box: Box, caller: Caller, model: str | None) -> str:
    """The plan for ``model`` now, in ``fitbox plan``'s words, and a failed mark if any."""
    if not model:
        return "Which model? Write `why MODEL`; models here: " + _names(box, caller)
    try:
        box.serving.check_allowed(caller.allowed, model)
        report = box.plan_for(model)
    except FitboxError as error:
        return f"{model}: {error.message}"
    head = {
        "place": "would be placed now (it is not refused):",
        "wait": "would wait for room now (calls hold what it needs):",
        "refuse": "is refused now:",
    }[report["decision"]]
    out = [f"{model} {head}", *lines(report)]
    artifact = next((a for a in box.catalog.artifacts() if a.name == report["model"]), None)
    failed = artifact is not None and box.crashes.failed(artifact.key)
    if failed:
        out.append(f"  marked failed after crashing loads: {failed}")
    return "\n".join(out)


def settings(box: Box, caller: Caller, model: str | None) -> str:
    """Each knob with its value and where the value comes from; a model's pair knobs."""
    helps = {s.name: s.help for s in SETTINGS}
    defaults = box.prefs.defaults()
    if model:
        if not _may_see(caller, model):
            return f"This key may not use the model '{model}'."
        try:
            box.catalog.variants(model)
        except FitboxError as error:
            return f"{model}: {error.message}"
        own, effective = box.prefs.pairs.get(model, {}), box.prefs.effective(model)
        out = [f"Settings of {model} (set one: `set SETTING VALUE for {model}`):"]
        for name in PAIR_KNOBS:
            source = "its own" if name in own else ("box" if name in box.prefs.box else "default")
            out.append(f"- {name} = {shown(effective[name])} ({source}): {helps[name]}")
        return "\n".join(out)
    effective = box.prefs.effective()
    out = ["Box-wide settings (set one: `set SETTING VALUE`; `null` clears it):"]
    for name in BOX_KNOBS:
        source = "set" if name in box.prefs.box else "default"
        value = shown(effective.get(name, defaults.get(name)))
        out.append(f"- {name} = {value} ({source}): {helps[name]}")
    pairs = [m for m in box.prefs.pairs if _may_see(caller, m)]
    if pairs:
        out.append("Models with settings of their own: " + ", ".join(pairs))
    out.append("A model's settings: `settings MODEL`.")
    return "\n".join(out)


def config(
    box: Box, caller: Caller, blocks: ConfigBlocks, tool: str | None, model: str | None
) -> str:
    """The block that points ``tool`` at this box for ``model`` (or the box's default model,
    else the first resident, else the first in the catalog), its window from the plan."""
    if not tool:
        return "Which tool? Write `config TOOL [MODEL]` (aider, continue, opencode, codex, …)."
    model = model or _default_model(box, caller)
    if not model:
        return "No model here to point a tool at."
    try:
        box.serving.check_allowed(caller.allowed, model)
        report = box.plan_for(model)
    except FitboxError as error:
        return f"{model}: {error.message}"
    if report["decision"] == "refuse":
        return (
            f"Not written: {model} cannot be placed now ({report['reason']}: "
            f"{report.get('detail') or 'see `why ' + model + '`'})."
        )
    window = int(report["window"])
    target = ConfigTarget(tool, model, caller.base_url, window, window, caller.keyed)
    return blocks(target)


def _default_model(box: Box, caller: Caller) -> str:
    default = box.config.default_model
    if default and _may_see(caller, default):
        return default
    for r in box.residents():
        if _may_see(caller, r.artifact.name):
            return r.artifact.name
    return next((a.name for a in box.catalog.artifacts() if _may_see(caller, a.name)), "")


def _names(box: Box, caller: Caller) -> str:
    names = [a.name for a in box.catalog.artifacts() if _may_see(caller, a.name)]
    return ", ".join(names) or "(none)"


def shown(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value or '""'


def setting_value(text: str, default: Any) -> Any:
    """A value as typed, as the settings API's JSON takes it: JSON where it reads as JSON
    (``8192``, ``true``, ``null``, ``["f16"]``), a comma list for a knob whose value is a
    list (``f16,q8_0``), else the text. The knob's own parser (box/preferences.py ``parse``,
    through the management API) checks it."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    if isinstance(default, list):
        return [part.strip() for part in text.split(",") if part.strip()]
    return text
