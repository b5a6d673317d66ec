"""A tool's config block merged into the file the tool reads, keeping what the user has.

Every key and entry of the user's stays. A key or entry fitbox writes that the file already
has with another value is a conflict: nothing is written unless forced, and then fitbox's
value replaces it. A ``soft`` key (the user's default model, a schema name) keeps the
user's value, said, unless forced. Before any change the file is copied beside itself
(``NAME.fitbox-backup-STAMP``); the new text is written beside and renamed into place.

JSON and TOML are read whole (json, tomllib) and written whole (a TOML file loses its
comments: the backup keeps them). YAML is merged as text, without a YAML library: fitbox's
keys are top-level keys, and its entries are items of one top-level list (a file that is a
list, or a key such as Continue's ``models``) named by one field; the lines of the user's
other keys and items are never touched, comments included.
"""

from __future__ import annotations

import json
import os
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fitbox.harness import render
from fitbox.harness.shapes import ConfigFile


class MergeError(ValueError):
    """The file cannot be merged (not plain JSON, YAML in a shape fitbox does not edit)."""


@dataclass
class Merged:
    text: str | None  # the file's new text; None when nothing would change
    added: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # the user's values kept (soft keys)
    replaced: list[str] = field(default_factory=list)  # forced
    conflicts: list[str] = field(default_factory=list)  # refused without force
    note: str = ""


# --- JSON and TOML: whole documents ----------------------------------------------------


def _deep(
    mine: dict[str, Any],
    ours: dict[str, Any],
    prefix: str,
    soft: tuple[str, ...],
    force: bool,
    m: Merged,
) -> dict[str, Any]:
    out = dict(mine)
    for key, value in ours.items():
        where = f"{prefix}{key}"
        if key not in mine:
            out[key] = value
            m.added.append(where)
        elif isinstance(mine[key], dict) and isinstance(value, dict):
            out[key] = _deep(mine[key], value, f"{where}.", (), force, m)
        elif mine[key] == value:
            continue
        elif force:
            out[key] = value
            m.replaced.append(where)
        elif not prefix and key in soft:
            m.kept.append(
                f"{where} (yours: {json.dumps(mine[key])}; fitbox's: {json.dumps(value)})"
            )
        else:
            m.conflicts.append(
                f"{where} (yours: {json.dumps(mine[key])}; fitbox's: {json.dumps(value)})"
            )
    return out


def _merge_whole(cf: ConfigFile, existing: str | None, force: bool) -> Merged:
    m = Merged(None)
    if existing is None or not existing.strip():
        mine: dict[str, Any] = {}
    else:
        try:
            loaded = json.loads(existing) if cf.format == "json" else tomllib.loads(existing)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            kind = "plain JSON (comments or trailing commas?)" if cf.format == "json" else "TOML"
            raise MergeError(f"the file is not {kind}: {exc}") from None
        if not isinstance(loaded, dict):
            raise MergeError("the file does not hold an object at its top")
        mine = loaded
    merged = _deep(mine, cf.data, "", cf.soft, force, m)
    if m.conflicts or not (m.added or m.replaced):
        return m
    m.text = render.to_json(merged) if cf.format == "json" else render.to_toml(merged)
    if cf.format == "toml" and existing and "#" in existing:
        m.note = "the file's comments are not kept (the backup has them)"
    return m


# --- YAML: text ------------------------------------------------------------------------

_TOP_KEY = re.compile(r"""^(?P<key>"[^"]*"|'[^']*'|[^\s#'"-][^:#]*?)\s*:(?:\s|$)""")


def _unquote(text: str) -> str:
    text = text.strip()
    if text.startswith('"'):
        try:
            return str(json.loads(text))
        except ValueError:
            return text.strip('"')
    if text.startswith("'") and text.endswith("'") and len(text) > 1:
        return text[1:-1].replace("''", "'")
    return text


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _significant(lines: list[str]) -> list[str]:
    return [ln.rstrip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _top_blocks(lines: list[str]) -> dict[str, tuple[int, int]]:
    """Each top-level key's lines [start, end)."""
    starts = [
        (i, _unquote(m.group("key"))) for i, ln in enumerate(lines) if (m := _TOP_KEY.match(ln))
    ]
    blocks = {}
    for n, (i, key) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(lines)
        while end > i + 1 and not lines[end - 1].strip():
            end -= 1
        blocks[key] = (i, end)
    return blocks


def _same_value(block: list[str], key: str, value: Any) -> bool:
    """Whether the user's lines for ``key`` say ``value``: one line compared by its scalar
    (quoted or not), a nested value by its lines as fitbox would write them."""
    ours = render.yaml_lines({key: value})
    if len(_significant(block)) == 1 and len(ours) == 1:
        text = block[0].split(":", 1)[1]
        text = re.sub(r"\s+#.*$", "", text)
        return _unquote(text) == _scalar_text(value)
    return _significant(block) == ours


def _items(lines: list[str], start: int, end: int) -> tuple[int, list[tuple[int, int]]]:
    """The items of the list in lines[start:end]: their indent and [start, end) each."""
    first = next((i for i in range(start, end) if re.match(r"^\s*- ", lines[i])), None)
    if first is None:
        return -1, []
    indent = len(lines[first]) - len(lines[first].lstrip())
    at = [i for i in range(first, end) if re.match(rf"^ {{{indent}}}- ", lines[i])]
    items = []
    for n, i in enumerate(at):
        stop = at[n + 1] if n + 1 < len(at) else end
        while stop > i + 1 and not lines[stop - 1].strip():
            stop -= 1
        items.append((i, stop))
    return indent, items


def _identity(lines: list[str], field_name: str) -> str | None:
    for ln in lines:
        found = re.match(rf"^\s*(?:-\s+)?{re.escape(field_name)}\s*:\s*(.*)$", ln)
        if found:
            return _unquote(re.sub(r"\s+#.*$", "", found.group(1)))
    return None


def _merge_entries(
    lines: list[str], ours: list[dict[str, Any]], cf: ConfigFile, force: bool, m: Merged
) -> list[str]:
    """fitbox's entries into the list under ``cf.entries`` (the file itself when "")."""
    assert cf.identity is not None
    key = cf.entries or ""
    if key:
        blocks = _top_blocks(lines)
        if key not in blocks:
            return [*lines, *render.yaml_lines({key: ours})]
        start, end = blocks[key]
        head = re.sub(r"\s+#.*$", "", lines[start].split(":", 1)[1]).strip()
        if head in ("[]", "null", "~"):
            return [*lines[:start], *render.yaml_lines({key: ours}), *lines[end:]]
        if head:
            raise MergeError(
                f"'{key}' is written inline (flow style): fitbox edits block lists only"
            )
        start += 1
    else:
        start, end = 0, len(lines)
        if any(_TOP_KEY.match(ln) for ln in lines):
            raise MergeError("the file is a mapping; fitbox expected a list of entries")
    indent, items = _items(lines, start, end)
    indent = indent if indent >= 0 else (2 if key else 0)
    by_name = {_identity(lines[a:b], cf.identity): (a, b) for a, b in items}
    replace: dict[int, tuple[int, list[str]]] = {}
    appended: list[str] = []
    for entry in ours:
        name = str(entry[cf.identity])
        text = render.yaml_lines([entry], indent)
        where = f"{key + ': ' if key else ''}{cf.identity} {name}"
        if name not in by_name:
            appended += text
            m.added.append(where)
            continue
        a, b = by_name[name]
        if _significant(lines[a:b]) == text:
            continue
        if force:
            replace[a] = (b, text)
            m.replaced.append(where)
        else:
            m.conflicts.append(
                f"{where} (an entry of that name is there already, with other values)"
            )
    return _spliced(lines, replace, items[-1][1] if items else end, appended)


def _spliced(
    lines: list[str], replace: dict[int, tuple[int, list[str]]], at: int, appended: list[str]
) -> list[str]:
    """``lines`` with each replaced item's lines swapped for fitbox's, and ``appended`` put
    in at line ``at`` (after the list's last item)."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if i in replace:
            stop, text = replace[i]
            out += text
            i = stop
            continue
        if i == at:
            out += appended
            appended = []
        out.append(lines[i])
        i += 1
    return out + appended


def _merge_yaml(cf: ConfigFile, existing: str | None, force: bool) -> Merged:
    m = Merged(None)
    if existing is None or not existing.strip():
        m.text = render.to_yaml(cf.data)
        m.added.append("the whole file")
        return m
    lines = existing.splitlines()
    if cf.entries == "":
        lines = _merge_entries(lines, cf.data, cf, force, m)
    else:
        blocks = _top_blocks(lines)
        for key, value in cf.data.items():
            if key == cf.entries:
                continue
            if key not in blocks:
                lines.extend(render.yaml_lines({key: value}))
                m.added.append(key)
                continue
            start, end = blocks[key]
            if _same_value(lines[start:end], key, value):
                continue
            mine = " ".join(ln.strip() for ln in _significant(lines[start:end]))
            said = f"{key} (yours: {mine}; fitbox's: {json.dumps(value)})"
            if force:
                m.replaced.append(key)
                lines[start:end] = render.yaml_lines({key: value})
                blocks = _top_blocks(lines)
            elif key in cf.soft:
                m.kept.append(said)
            else:
                m.conflicts.append(said)
        if cf.entries:
            lines = _merge_entries(lines, cf.data[cf.entries], cf, force, m)
    if m.conflicts or not (m.added or m.replaced):
        return m
    m.text = "\n".join(lines) + "\n"
    return m


def merge(cf: ConfigFile, existing: str | None, force: bool = False) -> Merged:
    """What ``cf`` makes of a file holding ``existing`` (None: no file yet)."""
    if cf.format in ("json", "toml"):
        return _merge_whole(cf, existing, force)
    if cf.format == "yaml":
        return _merge_yaml(cf, existing, force)
    if existing is not None and existing != cf.data and not force:
        return Merged(None, conflicts=["the file is there already, with other text"])
    return Merged(None if existing == cf.data else str(cf.data), added=["the whole file"])


def backup_path(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = path.with_name(f"{path.name}.fitbox-backup-{stamp}")
    n = 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.fitbox-backup-{stamp}-{n}")
    return candidate


def write(path: Path, text: str) -> Path | None:
    """``text`` into ``path``, the old file copied beside it first; the copy's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    mode = 0o600
    if path.exists():
        old = path.read_bytes()
        mode = path.stat().st_mode & 0o777
        backup = backup_path(path)
        backup.write_bytes(old)
        os.chmod(backup, mode)
    partial = path.with_name(path.name + ".fitbox-part")
    partial.write_text(text)
    os.chmod(partial, mode)
    os.replace(partial, path)
    return backup
