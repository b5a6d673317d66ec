"""``fitbox scout``: print where models already are, record the findings in the store, and
``--attach PATH`` one of them into the model store as a link (the weights stay in place)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fitbox import config as settings
from fitbox.cli.command import add_catalog_options
from fitbox.listening import published_url
from fitbox.units import format_bytes

HELP = "find models already on this machine (read-only)"


def add_arguments(scout: argparse.ArgumentParser) -> None:
    scout.add_argument(
        "--root",
        action="append",
        metavar="DIR",
        help="walk this directory (repeatable); default: every mounted drive",
    )
    scout.add_argument("--pid", type=int, help="only the model paths of this running process")
    scout.add_argument("--json", action="store_true")
    scout.add_argument(
        "--attach",
        metavar="PATH",
        help="link this GGUF into the model store (its header is read first)",
    )
    scout.add_argument("--name", help="the attached model's name (default: the file's stem)")
    scout.add_argument("--max-depth", type=int, default=6)
    scout.add_argument("--max-dirs", type=int, default=20_000)
    scout.add_argument("--max-results", type=int, default=500)
    add_catalog_options(scout)


def refresh_running_box(config: settings.Config) -> bool:
    """Tell the fitbox serving this home to rescan its models; False when none answers."""
    import httpx

    url = published_url(config.endpoint_file)
    if url is None:
        return False
    try:
        return httpx.post(f"{url}/v1/operator/refresh-models", timeout=10).status_code == 200
    except (OSError, ValueError, KeyError, TypeError, httpx.HTTPError):
        return False


def run(config: settings.Config, args: argparse.Namespace) -> int:
    if args.attach:
        return attach(config, Path(args.attach).expanduser(), args.name)
    from fitbox.models.scout import Limits, scout
    from fitbox.store.db import Store
    from fitbox.store.past_paths import past_paths

    store = Store(config.store_path)
    try:
        past = [(Path(p), why) for p, why in store.run(past_paths)]
        limits = Limits(args.max_depth, args.max_dirs, args.max_results)
        roots = [Path(r).expanduser() for r in args.root] if args.root else None
        report = scout(roots, pid=args.pid, past=past, limits=limits)
        store.scouted(
            [
                (f.path, f.name, f.bytes, f.source, f.evidence, f.led_by, int(f.servable), f.detail)
                for f in report.findings
            ]
        )
        store.flush()
    finally:
        store.close()
    if args.json:
        print(
            json.dumps(
                {"findings": [f.public() for f in report.findings], "tally": report.tally.public()},
                indent=2,
            )
        )
        return 0
    for f in report.findings:
        mark = "servable" if f.servable else "not servable"
        size = format_bytes(f.bytes) if f.bytes is not None else "?"
        print(f"{mark:12}  {f.evidence:10}  {f.source:8}  {f.name or '-'}  {size}  {f.path}")
        print(f"{'':14}led by: {f.led_by}; {f.detail}")
    t = report.tally
    print(
        f"{len(report.findings)} findings; {t.dirs_visited} directories listed"
        + (", the directory limit was reached" if t.dirs_left else "")
        + (f", {t.beyond_depth} past the depth limit" if t.beyond_depth else "")
        + (
            f", {len(t.automounts_skipped)} automount points not entered"
            if t.automounts_skipped
            else ""
        ),
        file=sys.stderr,
    )
    return 0


def attach(config: settings.Config, path: Path, name: str | None) -> int:
    """A symlink in the first model root to ``path``, once its header says it is servable."""
    from fitbox.models.scout import Hint
    from fitbox.models.scout.findings import examine
    from fitbox.models.transfer import PathRefused, refuse_name

    found = examine(Hint(path, "attach", "--attach"))
    if not found.servable:
        print(f"fitbox scout: {path} is not attached: {found.detail}", file=sys.stderr)
        return 1
    link_name = f"{name or path.name.removesuffix('.gguf')}.gguf"
    try:
        refuse_name(link_name)
    except PathRefused as exc:
        print(f"fitbox scout: --name: {exc.reason}", file=sys.stderr)
        return 2
    root = config.models[0]
    root.mkdir(parents=True, exist_ok=True)
    link = root / link_name
    target = path.resolve()
    if link.is_symlink() and link.resolve() == target:
        print(f"{link} already links to {target}")
    elif link.exists() or link.is_symlink():
        print(f"fitbox scout: {link} exists; give another --name", file=sys.stderr)
        return 1
    else:
        link.symlink_to(target)
        print(f"{link} -> {target} ({found.detail}, weights stay in place)")
    if refresh_running_box(config):
        print("the running fitbox rescanned its models")
    return 0
