"""`fitbox central boxes list|remove|drain|undrain|rename`: a person's say over the boxes,
through the running central (it follows them, so it is the one to stop following one), from
the central's own host without a key or from anywhere with an admin key (--key)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fitbox.home import CentralHome
from fitbox.listening import published_url


def add_box_arguments(verbs: Any) -> None:
    boxes = verbs.add_parser("boxes", help="the boxes: list, remove, drain, undrain, rename")
    box_verbs = boxes.add_subparsers(dest="boxes_command", required=True)
    listing = box_verbs.add_parser("list", help="every box: id, name, address, state")
    remove = box_verbs.add_parser(
        "remove", help="forget a box (its key, proof and cursors; its mirrored rows stay)"
    )
    drain = box_verbs.add_parser("drain", help="send bare-name calls to the other boxes")
    undrain = box_verbs.add_parser("undrain", help="take bare-name calls again")
    rename = box_verbs.add_parser("rename", help="a name of your own for a box ('' clears it)")
    for verb in (remove, drain, undrain, rename):
        verb.add_argument("box", help="its id, or a name only it has")
    rename.add_argument("name")
    for verb in (listing, remove, drain, undrain, rename):
        verb.add_argument("--home", metavar="DIR", help="the central's data dir (FITBOX_HOME)")
        verb.add_argument("--url", help="the central (default: the one this home runs)")
        verb.add_argument("--key", help="an admin key of the central (none on its own host)")
        verb.add_argument("--json", action="store_true")


def _ask(url: str, key: str | None, method: str, path: str, body: Any = None) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.request(method, f"{url}{path}", json=body, headers=headers, timeout=30)
    try:
        data = response.json()
    except ValueError:
        data = {"error": {"message": response.text[:300]}}
    if response.status_code >= 400:
        raise RuntimeError(data.get("error", {}).get("message", response.text[:300]))
    return data


def run_boxes(home: CentralHome, args: argparse.Namespace) -> int:
    import httpx

    url = (args.url or published_url(home.endpoint) or "").rstrip("/")
    if not url:
        print(
            f"fitbox central boxes: no running central publishes {home.endpoint}; "
            "start it (fitbox central serve) or name it with --url",
            file=sys.stderr,
        )
        return 1
    box = getattr(args, "box", "")
    verb = args.boxes_command
    calls = {
        "list": ("GET", "/v1/fleet", None),
        "remove": ("DELETE", f"/v1/fleet/boxes/{box}", None),
        "drain": ("PATCH", f"/v1/fleet/boxes/{box}", {"draining": True}),
        "undrain": ("PATCH", f"/v1/fleet/boxes/{box}", {"draining": False}),
        "rename": ("PATCH", f"/v1/fleet/boxes/{box}", {"name": getattr(args, "name", "") or None}),
    }
    method, path, body = calls[verb]
    try:
        data = _ask(url, args.key, method, path, body)
    except (httpx.HTTPError, RuntimeError) as exc:
        print(f"fitbox central boxes {verb}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
    elif verb == "remove":
        print(f"removed {data['box_id']}")
    else:
        for entry in data.get("data", [data]):
            drained = "  draining" if entry.get("draining") else ""
            print(
                f"{entry['box_id']}  {entry.get('state', '?'):<11} {entry['name']:<20} "
                f"{entry['url']}{drained}"
            )
    return 0
