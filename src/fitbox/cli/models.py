"""``fitbox models``: the models fitbox can serve, and the files it cannot, with why."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from fitbox import config as settings
from fitbox.cli.command import add_catalog_options
from fitbox.units import format_bytes

HELP = "list the models fitbox can serve"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_catalog_options(parser)
    parser.add_argument("--json", action="store_true")


def run(config: settings.Config, args: argparse.Namespace) -> int:
    return list_models(config, args.json)


def list_models(config: settings.Config, as_json: bool) -> int:
    from fitbox.models.catalog import Catalog

    catalog = Catalog(config.models, config.aliases, config.facts_cache, config.tf_support)
    rows: list[dict[str, Any]] = [
        {
            "name": a.name,
            "aliases": catalog.aliases_of(a.name),
            "path": str(a.path),
            "architecture": a.facts.architecture,
            "format": a.format,  # which engine kind serves it (gguf: llama-server)
            "weights_bytes": a.facts.shape.weights_bytes,
            "context_length": a.facts.shape.n_ctx_train,
            "vision": a.vision,  # reads images: a vision-language folder, or an mmproj beside
            "task": a.task,  # transcription, speech…: a task model (models/task_models.py)
            "mmproj": str(a.mmproj) if a.mmproj else None,
        }
        for a in catalog.artifacts()
    ]
    rejected: list[dict[str, Any]] = [
        {"name": r.name, "path": str(r.path), "rejected": r.reason} for r in catalog.rejected
    ]
    if as_json:
        print(json.dumps(rows + rejected, indent=2))
        return 0
    for bad in rejected:
        print(f"not servable: {bad['path']}: {bad['rejected']}", file=sys.stderr)
    if not rows:
        roots = os.pathsep.join(map(str, config.models))
        print(f"no models under {roots}; run 'fitbox pull' to fetch one")
        return 0
    for row in rows:
        aliases = f" (aka {', '.join(row['aliases'])})" if row["aliases"] else ""
        vision = " vision" if row["vision"] else ""
        vision += f" task {row['task']}" if row["task"] else ""
        print(
            f"{row['name']}{aliases}  {row['architecture']} ({row['format']}){vision}  "
            f"{format_bytes(int(row['weights_bytes']))}  ctx {row['context_length']}  "
            f"{row['path']}"
        )
    return 0
