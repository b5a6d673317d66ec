"""``fitbox launch TOOL`` and ``fitbox config TOOL``: a coding agent or chat tool pointed at
the running box. The box is asked (its catalog, a plan per model, a key when the tool runs
elsewhere); the tool table and the blocks are fitbox.harness's."""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fitbox.cli.command import add_setting_flags
from fitbox.config import Config
from fitbox.harness import blocks, merge
from fitbox.harness.shapes import Target, Tool
from fitbox.harness.tools import TOOLS, UnknownTool, tool
from fitbox.listening import published_url

LAUNCH_HELP = "run a coding agent or chat tool pointed at this box (nothing of yours changed)"
CONFIG_HELP = "print (or merge into the tool's own file) the config that points a tool here"


class Refused(Exception):
    """Said to the person as it is, exit 1."""


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tool", nargs="?", help=f"one of: {', '.join(t.name for t in TOOLS)}")
    parser.add_argument(
        "--model",
        action="append",
        help="a model of the box's catalog (repeatable; default: "
        "one it holds now, else the first it lists)",
    )
    parser.add_argument("--url", help="the box (or a central) to point at (default: this home's)")
    parser.add_argument(
        "--remote",
        action="store_true",
        help="the tool runs off the box: mint an inference key for it (implied by a --url "
        "that is not loopback)",
    )
    parser.add_argument("--tool-key", help="a key to give the tool instead of minting one")
    add_setting_flags(parser, "home", "admin_key")  # --key: an admin key of a box elsewhere


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.epilog = "Arguments after -- go to the tool as they are."


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument(
        "--write",
        nargs="?",
        const="",
        metavar="FILE",
        help="merge into the tool's own files (or FILE: its first file, the others beside "
        "it), keeping yours, with a backup",
    )
    parser.add_argument("--force", action="store_true", help="replace entries that differ")


@dataclass
class Pointed:
    tool: Tool
    target: Target
    left_out: tuple[Any, ...]
    minted: dict[str, Any] | None


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _ask(config: Config, args: argparse.Namespace, chosen: Tool) -> Pointed:
    import httpx

    url = (args.url or published_url(config.endpoint_file) or "").rstrip("/")
    if not url:
        raise Refused("no fitbox is answering here: start it (fitbox serve) or name it with --url")
    admin = {"authorization": f"Bearer {config.admin_key}"} if config.admin_key else {}
    reader = admin or ({"authorization": f"Bearer {args.tool_key}"} if args.tool_key else {})
    try:
        listing = httpx.get(f"{url}/v1/models", headers=reader, timeout=15)
        catalog: dict[str, Any] = listing.json()
        if listing.status_code >= 400:
            raise Refused(f"{url} refused its catalog: {_message(catalog)}")
        names = list(args.model or [])
        if not names:
            names = [n for n in [blocks.default_model(catalog)] if n]
        if not names:
            raise Refused(f"the box at {url} lists no model it can serve")
        plans: dict[str, dict[str, Any]] = {}
        for name in names:
            answer = httpx.get(f"{url}/v1/plan", params={"model": name}, headers=admin, timeout=30)
            body = _json(answer)
            if answer.status_code == 404 and _code(body) != "model_not_found":
                continue  # a central: it plans nothing, its catalog says the windows
            if answer.status_code in (401, 403):
                raise Refused(f"{url} refused its plan for {name}: {_message(body)} (--key)")
            plans[name] = body
    except httpx.HTTPError as exc:
        raise Refused(f"cannot reach {url}: {exc}") from None
    found = blocks.models_from(names, plans, catalog)
    if not found.placed:
        said = "; ".join(f"{m.name}: {m.reason}" for m in found.left_out)
        raise Refused(f"no model to point {chosen.name} at: {said}")
    key, minted = args.tool_key, None
    if key is None and (args.remote or not _loopback(url)):
        variants = sorted({v for m in found.placed for v in (m.name, *m.variants)})
        minted = _mint(url, admin, chosen.name, variants)
        key = minted["key"]
    return Pointed(chosen, Target(url, key, found.placed), found.left_out, minted)


def _json(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _code(body: dict[str, Any]) -> str | None:
    error = body.get("error")
    return str(error.get("code")) if isinstance(error, dict) else None


def _message(body: dict[str, Any]) -> str:
    error = body.get("error")
    return str(error.get("message")) if isinstance(error, dict) else str(body or "no answer")


def _mint(url: str, admin: dict[str, str], tool_name: str, models: list[str]) -> dict[str, Any]:
    """An inference key limited to ``models``, made by the running service."""
    import httpx

    body = {"name": f"fitbox {tool_name}", "scopes": ["inference"], "models": models}
    answer = httpx.post(f"{url}/v1/keys", json=body, headers=admin, timeout=15)
    data = _json(answer)
    if answer.status_code >= 400 or "key" not in data:
        raise Refused(
            f"{url} did not make a key for {tool_name}: {_message(data)} "
            "(an admin key with --key, or give the tool one with --tool-key)"
        )
    return data


def _chosen(args: argparse.Namespace) -> Tool:
    if not args.tool:
        raise UnknownTool("")
    found = tool(args.tool)
    if found.unsupported:
        raise Refused(f"{found.title}: {found.unsupported}")
    return found


def _said_minted(pointed: Pointed) -> None:
    if pointed.minted:
        m = pointed.minted
        print(
            f"fitbox: made inference key {m['id']} for {pointed.tool.name}, limited to "
            f"{', '.join(m.get('models') or [])}; its secret is in the config and shown "
            f"this once: {m['key']}",
            file=sys.stderr,
        )


def run_config(config: Config, args: argparse.Namespace) -> int:
    try:
        chosen = _chosen(args)
        pointed = _ask(config, args, chosen)
    except (UnknownTool, Refused) as exc:
        print(f"fitbox config: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UnknownTool) else 1
    _said_minted(pointed)
    if args.write is None:
        print(blocks.block_text(chosen, pointed.target, pointed.left_out), end="")
        return 0
    return _write(chosen, pointed, args.write, args.force)


def _write(chosen: Tool, pointed: Pointed, where: str, force: bool) -> int:
    files = chosen.files(pointed.target)
    paths = [Path(os.path.expanduser(cf.path)) for cf in files]
    if where:  # FILE names the first file; the others go beside it, under their own names
        first = Path(where)
        paths = [first, *(first.parent / p.name for p in paths[1:])]
    results = []
    for cf, path in zip(files, paths, strict=True):
        existing = path.read_text() if path.exists() else None
        try:
            results.append((path, merge.merge(cf, existing, force)))
        except merge.MergeError as exc:
            print(f"fitbox config: {path}: {exc}", file=sys.stderr)
            return 1
    conflicts = [(p, c) for p, r in results for c in r.conflicts]
    if conflicts:
        for path, conflict in conflicts:
            print(f"fitbox config: {path}: {conflict}", file=sys.stderr)
        print("fitbox config: nothing written; --force replaces them", file=sys.stderr)
        return 1
    for path, result in results:
        for kept in result.kept:
            print(f"{path}: kept yours: {kept}")
        if result.text is None:
            print(f"{path}: already points here, unchanged")
            continue
        backup = merge.write(path, result.text)
        saved = f" (backup: {backup})" if backup else ""
        print(f"{path}: wrote {', '.join(result.added + result.replaced)}{saved}")
        if result.note:
            print(f"{path}: {result.note}")
    for miss in pointed.left_out:
        print(f"not written: {miss.name}: {miss.reason}")
    return 0


def run_launch(config: Config, args: argparse.Namespace) -> int:
    try:
        chosen = _chosen(args)
        pointed = _ask(config, args, chosen)
    except (UnknownTool, Refused) as exc:
        print(f"fitbox launch: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UnknownTool) else 1
    _said_minted(pointed)
    for miss in pointed.left_out:
        print(f"fitbox launch: left out {miss.name}: {miss.reason}", file=sys.stderr)
    plan = chosen.launch(pointed.target)
    extra = list(getattr(args, "args", None) or [])
    if shutil.which(plan.argv[0]) is None:
        print(f"fitbox launch: {plan.argv[0]} is not installed ({chosen.install})", file=sys.stderr)
        return 127
    with tempfile.TemporaryDirectory(prefix=f"fitbox-{chosen.name}-") as scratch:
        for name, text in plan.files.items():
            (Path(scratch) / name).write_text(text)
        argv = [a.replace("{dir}", scratch) for a in plan.argv] + extra
        env = {k: v for k, v in os.environ.items() if k not in plan.unset}
        env.update({k: v.replace("{dir}", scratch) for k, v in plan.env.items()})
        return subprocess.run(argv, env=env, check=False).returncode
