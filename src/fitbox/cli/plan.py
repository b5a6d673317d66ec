"""``fitbox plan``: the placement core's decision, from the running box or offline."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fitbox import config as settings
from fitbox.cli.command import add_catalog_options
from fitbox.listening import published_url

HELP = "what fitbox would load for a model, and where, without loading it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model")
    parser.add_argument("--ctx", type=int, help="window (default: the window setting)")
    parser.add_argument("--parallel", type=int, help="slots (default: the parallel setting)")
    parser.add_argument("--kv", help="K and V cache type (default: the kv_types setting)")
    parser.add_argument("--json", action="store_true")
    add_catalog_options(parser)


def _plan_from_service(config: settings.Config, args: argparse.Namespace) -> dict[str, Any] | None:
    """Ask the running fitbox (it knows what is resident); None when none answers."""
    import httpx

    url = published_url(config.endpoint_file)
    if url is None:
        return None
    try:
        params = {"model": args.model, **({"kv": args.kv} if args.kv else {})}
        params.update({k: str(v) for k, v in (("ctx", args.ctx), ("parallel", args.parallel)) if v})
        response = httpx.get(f"{url}/v1/plan", params=params, timeout=10)
    except (OSError, ValueError, KeyError, httpx.HTTPError):
        return None
    body: dict[str, Any] = response.json()
    body["source"] = f"the running fitbox at {url}"
    return body


def run(config: settings.Config, args: argparse.Namespace) -> int:
    from fitbox.box.box import Box
    from fitbox.errors import FitboxError
    from fitbox.models.catalog import Catalog
    from fitbox.probe.gpus import open_gpu_probe
    from fitbox.store.db import read_measured

    report = _plan_from_service(config, args)
    if report is None:
        box = Box(
            config,
            Catalog(config.models, config.aliases, config.facts_cache, config.tf_support),
            open_gpu_probe(config.simulated_gpus),
            measured=read_measured(config.store_path),
        )
        try:
            report = box.plan_for(args.model, args.ctx, args.parallel, args.kv)
        except FitboxError as exc:
            report = exc.body()
        report["source"] = "offline: no fitbox answering, so nothing counts as resident"
    if "error" in report:
        print(f"fitbox plan: {report['error']['message']}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_plan(report)
    return 1 if report["decision"] == "refuse" else 0  # a script can tell it would not load


def _print_plan(report: dict[str, Any]) -> None:
    """``fitbox plan`` in words (box/planning.py ``lines``: the helper's ``why`` says the
    same), and where the plan came from."""
    from fitbox.box.planning import lines

    for line in lines(report):
        print(line)
    print(f"  ({report['source']})")
