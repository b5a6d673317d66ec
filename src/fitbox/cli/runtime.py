"""The running box's own commands: ``fitbox ps``, ``load``/``unload``/``pin``/``unpin MODEL``,
``logs [MODEL] [-f]`` and ``status``. Each asks the box's HTTP API: the box this home
published (its endpoint.json), or ``--url`` with ``--key`` (or ``FITBOX_KEY``) for another one. A
refusal exits 1 with the box's own reason; no box answering exits 3."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

import httpx

from fitbox import config as settings
from fitbox.cli.command import add_setting_flags
from fitbox.listening import published_url
from fitbox.units import format_bytes

PS_HELP = "the models the running box holds: state, bytes, window, idle time, calls"
ACTION_HELPS = {
    "load": "load a model on the running box and leave it resident",
    "unload": "stop a model on the running box (never one serving a call)",
    "pin": "load a model on the running box and never evict it",
    "unpin": "let a pinned model on the running box be evicted again",
}
LOGS_HELP = "an engine child's log from the running box (the newest, or MODEL's); -f follows"
STATUS_HELP = "the running box: version, uptime, problems, limits"
FOLLOW_EVERY_S = 1.0
NO_BOX = 3


class NoBox(Exception):
    """No box answers where the command looked."""


def add_box_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the box's address (default: the one this home serves)")
    add_setting_flags(parser, "home", "admin_key")


def add_ps_arguments(parser: argparse.ArgumentParser) -> None:
    add_box_options(parser)
    parser.add_argument("--json", action="store_true")


def add_action_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model")
    add_box_options(parser)


def add_logs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="a resident's name (default: the newest log)")
    parser.add_argument("-n", "--lines", type=int, default=50, help="lines to show first (50)")
    parser.add_argument("-f", "--follow", action="store_true", help="print lines as they come")
    add_box_options(parser)


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    add_box_options(parser)
    parser.add_argument("--json", action="store_true")


class Box:
    """The running box's API, as an admin (on the box itself, no key is needed)."""

    def __init__(self, config: settings.Config, args: argparse.Namespace) -> None:
        url = args.url or published_url(config.endpoint_file)
        if url is None:
            raise NoBox(f"no running fitbox published its address under {config.home}")
        key = config.admin_key
        self.url = url.rstrip("/")
        self.client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=httpx.Timeout(30.0, read=600.0),  # a load may take minutes
        )

    def get(self, path: str, **params: Any) -> httpx.Response:
        return self._sent(lambda: self.client.get(path, params=params))

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return self._sent(lambda: self.client.post(path, json=body))

    def _sent(self, send: Any) -> httpx.Response:
        try:
            response: httpx.Response = send()
        except httpx.TransportError as exc:
            raise NoBox(f"no fitbox answers at {self.url} ({exc})") from None
        return response


def _refused(response: httpx.Response) -> int | None:
    """Exit 1 with the box's reason (and each rejected rung's) when it refused."""
    if response.is_success:
        return None
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = {"message": response.text.strip() or response.reason_phrase}
    print(f"fitbox: {error.get('message')}", file=sys.stderr)
    for rung in error.get("rejected") or []:
        detail = f" ({rung['detail']})" if rung.get("detail") else ""
        line = f"  - {rung.get('rung')} {rung.get('artifact')}: {rung.get('reason')}{detail}"
        print(line, file=sys.stderr)
    return 1


def _run(work: Any, config: settings.Config, args: argparse.Namespace) -> int:
    try:
        found: int = work(Box(config, args), args)
    except NoBox as exc:
        print(f"fitbox: {exc}", file=sys.stderr)
        return NO_BOX
    return found


def run_ps(config: settings.Config, args: argparse.Namespace) -> int:
    return _run(_ps, config, args)


def _ps(box: Box, args: argparse.Namespace) -> int:
    answer = box.get("/v1/residents")
    refused = _refused(answer)
    if refused is not None:
        return refused
    residents = answer.json()["data"]
    if args.json:
        print(answer.text)
        return 0
    rows: list[tuple[str, ...]] = [("MODEL", "STATE", "BYTES", "WHERE", "WINDOW", "IDLE", "CALLS")]
    for r in residents:
        idle = "-" if r["calls"] else f"{r['idle_for_s']:.0f}s"
        state = r["state"] + (" pinned" if r["pinned"] else "")
        window = f"{r['window']}x{r['parallel']}"
        bytes_held = format_bytes(r["bytes"])
        rows.append((r["model"], state, bytes_held, r["device"], window, idle, str(r["calls"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    if not residents:
        print("(nothing resident)")
    return 0


def run_action(action: str) -> Any:
    def run(config: settings.Config, args: argparse.Namespace) -> int:
        return _run(lambda box, a: _act(box, action, a.model), config, args)

    return run


def _act(box: Box, action: str, model: str) -> int:
    answer = box.post(f"/v1/operator/{action}", {"model": model})
    refused = _refused(answer)
    if refused is not None:
        return refused
    print(f"{model}: {action} done")
    return 0


def run_logs(config: settings.Config, args: argparse.Namespace) -> int:
    return _run(_logs, config, args)


def _logs(box: Box, args: argparse.Namespace) -> int:
    listed = box.get("/v1/logs")
    refused = _refused(listed)
    if refused is not None:
        return refused
    files = [f for f in listed.json()["data"] if not f["name"].endswith(".1")]
    if args.model:
        wanted = re.sub(r"[^A-Za-z0-9._-]+", "_", _resident_name(box, args.model))
        files = [f for f in files if f["model"] == wanted]
    if not files:
        print(f"fitbox: no engine log{f' of {args.model}' if args.model else ''}", file=sys.stderr)
        return 1
    name = files[0]["name"]  # the newest
    answer = box.get(f"/v1/logs/{name}", tail=max(args.lines, 1))
    refused = _refused(answer)
    if refused is not None:
        return refused
    sys.stdout.write(answer.text)
    offset = int(answer.headers["x-fitbox-log-offset"])
    while args.follow:
        sys.stdout.flush()
        time.sleep(FOLLOW_EVERY_S)
        answer = box.get(f"/v1/logs/{name}", offset=offset)
        if answer.status_code == 404:
            return 0  # pruned or gone: its child is long over
        sys.stdout.write(answer.text)
        offset = int(answer.headers["x-fitbox-log-offset"])
    return 0


def _resident_name(box: Box, model: str) -> str:
    """The file name a model's logs carry: the resident's (an alias or family name named it),
    else the catalog's name for it, else the name as given."""
    answer = box.get(f"/v1/models/{model}")
    return answer.headers.get("x-fitbox-model", model) if answer.is_success else model


def run_status(config: settings.Config, args: argparse.Namespace) -> int:
    return _run(_status, config, args)


def _status(box: Box, args: argparse.Namespace) -> int:
    health = box.get("/health")
    limits = box.get("/v1/limits")
    refused = _refused(limits)
    if refused is not None:
        return refused
    found, tiers = health.json(), limits.json()["data"]
    if args.json:
        print(json.dumps({"health": found, "limits": tiers}, indent=2))
        return 0
    print(f"fitbox {found['version']} at {box.url}: {found['status']}")
    print(f"  up {_duration(found.get('uptime_s', 0))}, box {found.get('box_id', '-')}")
    for problem in found.get("problems", []):
        print(f"  problem: {problem}")
    for tier in tiers:
        unit = format_bytes if tier["resource"] != "cores" else str
        print(f"  {tier['resource']}: {unit(tier['effective'])} of {unit(tier['device'])}")
    return 0 if found["status"] == "ok" else 1


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return (
        f"{days}d {hours}h" if days else f"{hours}h {minutes}m" if hours else f"{minutes}m {secs}s"
    )
