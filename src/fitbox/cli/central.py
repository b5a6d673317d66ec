"""`fitbox central serve | keys create|list|revoke | boxes list|remove|drain|undrain|rename`:
the central's commands. The central's rooms are
imported when one of them runs, not when any command parses."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import fitbox
from fitbox.cli.central_boxes import add_box_arguments, run_boxes
from fitbox.cli.command import add_log_level, add_setting_flags
from fitbox.cli.keys import parse_duration
from fitbox.config import Config
from fitbox.home import CentralHome, default_home, make_private
from fitbox.listening import endpoint_of, listen_socket, publish_endpoint, published_url
from fitbox.store.keys import SCOPES, KeyError_, create_key, list_keys, revoke_key

if TYPE_CHECKING:
    from fitbox.central.backend import StoreTarget

CENTRAL_SCOPES = (*SCOPES, "worker")
HELP = "the central: many boxes behind one address"


def central_home(args: argparse.Namespace, env: dict[str, str] | None = None) -> CentralHome:
    """--home, else FITBOX_HOME (like a box), else a folder of its own in the data dir (a
    box and a central on one host never share a store)."""
    env = dict(os.environ) if env is None else env
    chosen = getattr(args, "home", None) or env.get("FITBOX_HOME")
    return CentralHome(
        Path(chosen).expanduser().absolute() if chosen else default_home() / "central"
    )


def add_arguments(central: argparse.ArgumentParser) -> None:
    verbs = central.add_subparsers(dest="central_command", required=True)
    serve = verbs.add_parser("serve", help="run the central")
    add_setting_flags(serve, "host", "port")
    serve.add_argument("--home", metavar="DIR", help="its data dir (FITBOX_HOME)")
    add_log_level(serve)
    keys = verbs.add_parser("keys", help="the central's keys")
    key_verbs = keys.add_subparsers(dest="keys_command", required=True)
    create = key_verbs.add_parser("create", help="make a key; its secret is printed once")
    create.add_argument(
        "--scope",
        action="append",
        choices=list(CENTRAL_SCOPES),
        help="repeatable; worker keys can only register a box",
    )
    create.add_argument("--name", default="unnamed")
    create.add_argument("--expires-in", help="e.g. 3600s, 90m, 12h, 30d")
    create.add_argument(
        "--model", action="append", help="limit the key to a model, on any box (repeatable)"
    )
    listing = key_verbs.add_parser("list", help="every key, without secrets")
    revoke = key_verbs.add_parser("revoke", help="revoke a key: refused from the next request")
    revoke.add_argument("key_id")
    for verb in (create, listing, revoke):
        verb.add_argument("--home", metavar="DIR", help="its data dir (FITBOX_HOME)")
        verb.add_argument("--json", action="store_true")
    add_box_arguments(verbs)


def run(config: Config, args: argparse.Namespace) -> int:
    home = central_home(args)
    store = store_target(config, home)
    if args.central_command == "keys":
        if args.keys_command == "create":
            return _create_key(home, store, args)
        return _keys(store, args)
    if args.central_command == "boxes":
        return run_boxes(home, args)
    return _serve(config, home, store, args.log_level)


def store_target(config: Config, home: CentralHome) -> StoreTarget:
    """FITBOX_CENTRAL_DB's PostgreSQL URL, else the SQLite file in the central's home."""
    return config.central_db or home.store


def _create_key(home: CentralHome, target: StoreTarget, args: argparse.Namespace) -> int:
    from fitbox.central.backend import StoreUnavailable
    from fitbox.central.store import CentralStore

    make_private(home.path)
    scopes = tuple(args.scope or ["inference"])
    try:
        expires_at = time.time() + parse_duration(args.expires_in) if args.expires_in else None
    except ValueError as exc:
        print(f"fitbox central keys: {exc}", file=sys.stderr)
        return 1
    try:
        store = CentralStore(target)
    except (StoreUnavailable, RuntimeError) as exc:  # SchemaTooNew too; no password in them
        print(f"fitbox central keys: {exc}", file=sys.stderr)
        return 1
    try:
        key, secret = store.run(
            lambda conn: create_key(
                conn,
                args.name,
                scopes,
                tuple(args.model) if args.model else None,
                expires_at=expires_at,
                known=CENTRAL_SCOPES,
            )
        )
    except KeyError_ as exc:
        print(f"fitbox central keys: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if args.json:
        print(json.dumps({**key.public(), "key": secret}, indent=2))
        return 0
    print(secret)
    print(
        f"(id {key.key_id}, scopes {', '.join(scopes)}: the secret is shown this once)",
        file=sys.stderr,
    )
    if "worker" in scopes:
        url = published_url(home.endpoint) or "http://THIS-CENTRAL:PORT"
        print(
            f"a new box joins with: fitbox serve --host 0.0.0.0 --central {url} "
            f"--central-key {secret}",
            file=sys.stderr,
        )
    return 0


def _keys(target: StoreTarget, args: argparse.Namespace) -> int:
    """``keys list`` and ``keys revoke``, on the store itself: a running central reads each
    key from it at every request, so a revoked key is refused from the next one."""
    from fitbox.central.backend import StoreUnavailable
    from fitbox.central.store import CentralStore

    try:
        store = CentralStore(target)
    except (StoreUnavailable, RuntimeError) as exc:
        print(f"fitbox central keys: {exc}", file=sys.stderr)
        return 1
    try:
        if args.keys_command == "revoke":
            keys = [store.run(lambda conn: revoke_key(conn, args.key_id))]
        else:
            keys = store.run(list_keys)
    except KeyError_ as exc:
        print(f"fitbox central keys: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if args.json:
        shown = [k.public() for k in keys]
        print(json.dumps(shown[0] if args.keys_command == "revoke" else shown, indent=2))
        return 0
    now = time.time()
    for key in keys:
        expired = key.expires_at is not None and key.expires_at < now
        state = "revoked" if key.revoked_at is not None else "expired" if expired else "active"
        models = f" models {','.join(key.models)}" if key.models else ""
        print(f"{key.key_id}  {state:<7} {','.join(key.scopes):<16} {key.name}{models}")
    return 0


def _serve(config: Config, home: CentralHome, target: StoreTarget, log_level: str) -> int:
    import uvicorn

    from fitbox.central.app import create_central_app
    from fitbox.central.backend import StoreUnavailable
    from fitbox.central.store import CentralStore
    from fitbox.cli.serve import http_protocol_for
    from fitbox.quiet_server import QuietServer
    from fitbox.server.door.limits import raise_open_files

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    make_private(home.path)
    open_files = raise_open_files()  # before anything is opened or listens
    try:
        store = CentralStore(target)  # made and migrated before anything listens
        where = store.where
        store.close()
        sock = listen_socket(config.host, config.port)
        endpoint = endpoint_of(config.host, sock)
        publish_endpoint(home.endpoint, endpoint)
    except (OSError, RuntimeError, StoreUnavailable) as exc:
        print(f"fitbox central: cannot start: {exc}", file=sys.stderr)
        return 1
    print(
        f"fitbox central {fitbox.__version__} listening on {endpoint['url']} (store: {where})",
        flush=True,
    )
    app = create_central_app(config, target)
    server = QuietServer(
        uvicorn.Config(
            app,
            log_level=log_level,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
            proxy_headers=False,  # the door judges forwarding (server/door/auth.py), not uvicorn
            http=http_protocol_for(config, open_files, zerocopy=False),
        )
    )
    server.run(sockets=[sock])
    return 0
