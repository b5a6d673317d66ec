"""GGUF facts kept on disk between runs, keyed by (path, size, mtime).

Reading a header costs ~10 ms per real model (the vocabulary must be walked string by
string); with this cache a catalog of a hundred unchanged files is read in milliseconds
by every command, not only by a long-running service. A damaged cache file is ignored and
rewritten; a changed model file is simply read again.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fitbox.core.projector import ProjectorShape
from fitbox.core.repack import WeightTensor
from fitbox.core.sizing import ModelShape
from fitbox.core.split import Layout
from fitbox.models.gguf_facts import GGUFFacts, read_facts
from fitbox.models.identity import identity_of

# 4: a projector's n_merge, pinpoints; 3: n_params, is_reranker; 2: every tensor's layer,
# type, rows, op, offset
VERSION = 4
_TENSOR_FIELDS = ("layer", "type", "rows", "dims", "op", "offset", "n_bytes", "duplicate")


def _encode(facts: GGUFFacts) -> dict[str, Any]:
    data = asdict(facts)
    data["path"] = str(facts.path)
    data["shape"]["tensors"] = [
        [getattr(t, f) for f in _TENSOR_FIELDS] for t in facts.shape.tensors
    ]  # compact rows
    return data


def _decode(data: dict[str, Any]) -> GGUFFacts:
    shape = dict(data["shape"])  # a copy: the cache's entry stays JSON for the next save
    for key in ("kv_heads", "swa_layers", "recurrent_layers"):
        shape[key] = tuple(shape[key])
    shape["tensors"] = tuple(WeightTensor(*row) for row in shape.get("tensors", ()))
    projector = ProjectorShape(**data["projector"]) if data.get("projector") else None
    raw = data.get("layout")
    layout = (
        Layout(
            layer_bytes=tuple(raw["layer_bytes"]),
            routed_bytes=tuple(raw["routed_bytes"]),
            input_bytes=int(raw["input_bytes"]),
            output_bytes=int(raw["output_bytes"]),
            output_tied=bool(raw["output_tied"]),
        )
        if raw
        else None
    )
    return GGUFFacts(
        **{
            **data,
            "path": Path(data["path"]),
            "shape": ModelShape(**shape),
            "bytes_by_layer": tuple(data["bytes_by_layer"]),
            "layout": layout,
            "projector": projector,
        },
    )


class FactsCache:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] = {}
        self._dirty = False
        if path is not None and path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                if data.get("version") == VERSION:
                    self._entries = dict(data["entries"])
            except (OSError, ValueError, KeyError, TypeError):
                self._entries = {}  # damaged: start again, it is only a cache

    def facts(self, path: Path) -> GGUFFacts:
        found = identity_of(path)
        key = str(path)
        entry = self._entries.get(key)
        if entry and (entry["size"], entry["mtime_ns"]) == (found.size, found.mtime_ns):
            try:
                return _decode(entry["facts"])
            except (KeyError, TypeError, ValueError):
                pass
        facts = read_facts(path)
        self._entries[key] = {
            "size": found.size,
            "mtime_ns": found.mtime_ns,
            "facts": _encode(facts),
        }
        self._dirty = True
        return facts

    def save(self) -> None:
        """Write atomically; a read-only or full disk costs only the speed-up."""
        if self.path is None or not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".facts-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"version": VERSION, "entries": self._entries}, f)
            os.replace(tmp, self.path)
            self._dirty = False
        except OSError:
            return
