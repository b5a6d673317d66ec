"""``fitbox plan``: the placement core's decision, from the running box or offline."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fitbox import config as settings
from fitbox.cli.command import add_catalog_options
from fitbox.listening import published_url
from fitbox.units import format_bytes

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
            Catalog(config.models, config.aliases, config.facts_cache),
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
    """``fitbox plan`` in words: the decision, its window, bytes per device, and why not."""
    simulated = {d["device"] for d in report["box"] if d["simulated"]}
    label = f"{report['decision']} on {report['device']}"
    if report.get("rung"):
        label += f" ({report['rung']})"
    print(
        f"{report['model']} ({report['architecture']}, {report['quant']}): {label}, "
        f"{report['basis']}"
    )
    band = report.get("band")
    band_text = f", band {band['kind']} {band['min']}..{band['max']}" if band else ""
    print(
        f"  window {report['window']} x {report['parallel']} slot(s), "
        f"K {report['type_k']} / V {report['type_v']}{band_text}"
    )
    if report.get("device_counts"):  # the window each GPU count would have given
        counts = [
            f"{c['count']} -> {c['window'] or 'none'} ({c['reason']})"
            for c in report["device_counts"]
        ]
        print(f"  by GPU count: {', '.join(counts)}")
    if report.get("repack") in ("on", "ram_bound"):
        print(
            "  weights in RAM: repacked (faster)"
            if report["repack"] == "on"
            else "  weights in RAM: --no-repack (ram_bound: the repacked copy does not fit)"
        )
    for row in report["devices"]:
        tag = " (SIMULATED)" if row["device"] in simulated else ""
        b = {k: format_bytes(v) for k, v in row.items() if k.endswith("_bytes")}
        print(
            f"  {row['device']}{tag}: weights {b['weights_bytes']} + kv {b['kv_bytes']} + "
            f"compute {b['compute_bytes']} + output {b['output_bytes']} = "
            f"{b['total_bytes']}"
        )
    if report.get("cores"):
        layers = f", {report['gpu_layers']} layers on GPU" if report.get("gpu_layers") else ""
        print(f"  cores {', '.join(map(str, report['cores']))}{layers}")
    for key in ("victims", "blockers"):
        if report.get(key):
            print(f"  {key}: {', '.join(report[key])}")
    if report["decision"] == "refuse" and report.get("needed_bytes"):
        needed, held = format_bytes(report["needed_bytes"]), format_bytes(report["available_bytes"])
        print(f"  {report['reason']}: needs {needed} on {report['device']}, which holds {held}")
    elif report["decision"] == "refuse":  # no rung was ever sized: their reasons say why
        print(f"  {report['reason']}: no rung of it can be placed on this box, because:")
    for r in report.get("rejected", []):
        print(f"  - {r['rung']} {r['artifact']}: {r['reason']} ({r['detail']})")
    print(f"  ({report['source']})")
