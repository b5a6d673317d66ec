"""`fitbox keys`: through the running service (as the box itself), else straight against
the store, so keys can be made before the first start and while the service is down."""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
import time
from typing import Any

from fitbox.cli.command import add_catalog_options
from fitbox.config import Config
from fitbox.listening import published_url
from fitbox.store import keys as keydb

HELP = "API keys: create, list, show, revoke, rotate-box"


def add_arguments(keys: argparse.ArgumentParser) -> None:
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="make a key; its secret is printed once")
    create.add_argument("--name", default="unnamed")
    create.add_argument(
        "--scope",
        action="append",
        choices=["admin", "inference", "read"],
        help="repeatable; default inference",
    )
    create.add_argument(
        "--model", action="append", help="limit an inference key to a model (repeatable)"
    )
    create.add_argument("--expires-in", help="e.g. 3600s, 90m, 12h, 30d")
    listing = keys_sub.add_parser("list", help="every key, without secrets")
    rotate = keys_sub.add_parser(
        "rotate-box",
        help="mint a new box key, write it to the box key file, retire the old one",
    )
    verbs = [create, listing, rotate]
    for verb in ("show", "revoke"):
        one = keys_sub.add_parser(verb)
        one.add_argument("key_id")
        verbs.append(one)
    for parser_ in verbs:
        parser_.add_argument("--json", action="store_true")
        add_catalog_options(parser_)


_DURATION = re.compile(r"^(\d+)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration: write it like 3600s, 90m, 12h or 30d")
    return int(match.group(1)) * _SECONDS[match.group(2)]


def _service(config: Config) -> str | None:
    import httpx

    url = published_url(config.endpoint_file)
    if url is None:
        return None
    try:
        httpx.get(f"{url}/health", timeout=2).raise_for_status()
    except (OSError, ValueError, KeyError, httpx.HTTPError):
        return None
    return url


def _offline(config: Config, args: argparse.Namespace, body: dict[str, Any]) -> Any:
    from fitbox.store.db import Store

    if not config.store_path.exists():
        Store(config.store_path).close()  # make and migrate it; no service is running
    with sqlite3.connect(config.store_path) as conn:
        conn.execute("PRAGMA busy_timeout = 5000")
        if args.keys_command == "create":
            key, secret = keydb.create_key(
                conn,
                body["name"],
                tuple(body["scopes"]),
                tuple(body["models"]) if body["models"] else None,
                time.time() + body["expires_in_s"] if body["expires_in_s"] else None,
            )
            return {**key.public(), "key": secret}
        if args.keys_command == "list":
            return {"data": [k.public() for k in keydb.list_keys(conn)]}
        if args.keys_command == "revoke":
            return keydb.revoke_key(conn, args.key_id).public()
        found = keydb.find_key(conn, args.key_id)
        if found is None:
            raise keydb.KeyError_(f"no key with id {args.key_id!r}")
        return found.public()


def _online(url: str, args: argparse.Namespace, body: dict[str, Any]) -> Any:
    import httpx

    calls = {
        "create": lambda: httpx.post(f"{url}/v1/keys", json=body, timeout=10),
        "list": lambda: httpx.get(f"{url}/v1/keys", timeout=10),
        "show": lambda: httpx.get(f"{url}/v1/keys/{args.key_id}", timeout=10),
        "revoke": lambda: httpx.delete(f"{url}/v1/keys/{args.key_id}", timeout=10),
    }
    response = calls[args.keys_command]()
    data = response.json()
    if response.status_code >= 400:
        raise keydb.KeyError_(data["error"]["message"])
    return data


def rotate_box(config: Config) -> dict[str, Any]:
    """The box key rotated straight in the store, also with the service running (each
    request's key is read fresh): the new key and the retirement of the old one commit
    together, and only once the key file holds the new secret."""
    from fitbox.store.box_key import write_secret
    from fitbox.store.db import Store

    if not config.store_path.exists():
        Store(config.store_path).close()  # make and migrate it; no service is running
    with sqlite3.connect(config.store_path) as conn:
        conn.execute("PRAGMA busy_timeout = 5000")
        key, secret, retired = keydb.rotate_box_key(conn)
        write_secret(config.box_key_file, secret)  # raises before the commit: nothing changed
    return {**key.public(), "key_file": str(config.box_key_file), "retired": retired}


def run(config: Config, args: argparse.Namespace) -> int:
    import httpx  # here, not above: every fitbox command imports this module to parse

    if args.keys_command == "rotate-box":
        return _rotated(config, args.json)

    body: dict[str, Any] = {}
    if args.keys_command == "create":
        try:
            expires = parse_duration(args.expires_in) if args.expires_in else None
        except ValueError as exc:
            print(f"fitbox keys: {exc}", file=sys.stderr)
            return 2
        body = {
            "name": args.name,
            "scopes": args.scope or ["inference"],
            "models": args.model,
            "expires_in_s": expires,
        }
    url = _service(config)
    try:
        result = _online(url, args, body) if url else _offline(config, args, body)
    except (keydb.KeyError_, sqlite3.Error, httpx.HTTPError) as exc:
        print(f"fitbox keys: {exc}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
    elif args.keys_command == "create":
        print(result["key"])
        print(
            f"(id {result['id']}, scopes {', '.join(result['scopes'])}: the secret is shown "
            "this once)",
            file=sys.stderr,
        )
    else:
        for key in result.get("data", [result]):
            expires = key["expires_at"]
            state = (
                "revoked"
                if key["revoked_at"] is not None
                else ("expired" if expires is not None and expires < time.time() else "active")
            )
            models = f" models {','.join(key['models'])}" if key["models"] else ""
            print(f"{key['id']}  {state:<7} {','.join(key['scopes']):<16} {key['name']}{models}")
    return 0


def _rotated(config: Config, as_json: bool) -> int:
    try:
        result = rotate_box(config)
    except (sqlite3.Error, OSError) as exc:
        print(f"fitbox keys rotate-box: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(result, indent=2))
        return 0
    retired = ", ".join(result["retired"]) or "none"
    print(
        f"new box key {result['id']} written to {result['key_file']}; retired: {retired}. "
        "A central this box registers with gets the new key at fitbox's next start."
    )
    return 0
