"""`fitbox central serve | keys create`: the central's commands. The central's rooms are
imported when one of them runs, not when any command parses."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import fitbox
from fitbox.cli.command import add_log_level, add_setting_flags
from fitbox.config import Config
from fitbox.home import CentralHome, default_home, make_private
from fitbox.listening import endpoint_of, listen_socket, publish_endpoint, published_url
from fitbox.store.keys import SCOPES, KeyError_, create_key

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
    create.add_argument("--home", metavar="DIR", help="its data dir (FITBOX_HOME)")
    create.add_argument("--json", action="store_true")


def run(config: Config, args: argparse.Namespace) -> int:
    home = central_home(args)
    store = store_target(config, home)
    if args.central_command == "keys":
        return _create_key(home, store, args)
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
        store = CentralStore(target)
    except (StoreUnavailable, RuntimeError) as exc:  # SchemaTooNew too; no password in them
        print(f"fitbox central keys: {exc}", file=sys.stderr)
        return 1
    try:
        key, secret = store.run(
            lambda conn: create_key(conn, args.name, scopes, known=CENTRAL_SCOPES)
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
