"""``fitbox serve``: check the box's limits, open the home and store, listen, then run the
app until a signal; children never outlive it.

SIGHUP (``systemctl reload fitbox``, ``fitbox update --apply``, the package's upgrade)
re-executes it in place: the server stops accepting (the socket stays open, the kernel
queues new connections in its backlog), the calls in flight finish, the ready engines are
left running, then the same pid execs the program again, handing itself the socket
(``FITBOX_LISTEN_FD``) and the engines' output pipes; the new image adopts the engines
(box/supervision/adoption.py) and serves what waited."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import signal
import socket
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fitbox
from fitbox import config as settings
from fitbox.cli.command import add_log_level, add_setting_flags
from fitbox.listening import (
    LISTEN_FD_ENV,
    endpoint_of,
    inherited_socket,
    kept_for_reexec,
    listen_socket,
    publish_endpoint,
)

HELP = "run the OpenAI-compatible front door"
# a re-exec waits this long for the calls in flight (a stop waits uvicorn's 5 s): a long
# generation finishes whole; past it what is left is cut, as a stop cuts it
RELOAD_DRAIN_S = 600
STOP_DRAIN_S = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_setting_flags(
        parser, "models", "home", "host", "port", "ram_max", "central_url", "central_key"
    )
    add_log_level(parser)


def run(config: settings.Config, args: argparse.Namespace) -> int:
    return serve(config, args.log_level)


def serve(config: settings.Config, log_level: str) -> int:
    import uvicorn

    from fitbox.server.app import create_app
    from fitbox.server.door.limits import raise_open_files

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per proxied call is noise
    open_files = raise_open_files()  # before anything is opened or listens
    started = _start(config)
    if isinstance(started, int):
        return started
    store, sock, endpoint = started
    print(f"fitbox {fitbox.__version__} listening on {endpoint['url']}", flush=True)

    app = create_app(config, store, endpoint["url"])

    server = _server_class(app, sock)(
        uvicorn.Config(
            app,
            log_level=log_level,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=STOP_DRAIN_S,
            http=http_protocol_for(config, open_files, zerocopy=True),
            # forwarding headers are the door's to judge (server/door/auth.py, with
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
    if server.reexec is not None:
        return _reexec(server.reexec, getattr(app.state, "box", None))
    return 0


def _server_class(app: Any, sock: socket.socket) -> Any:
    """uvicorn's server (quiet), ended by SIGINT/SIGTERM as uvicorn ends, or by SIGHUP for
    a re-exec: ``reexec`` is then the socket's kept descriptor."""
    from fitbox.quiet_server import QuietServer

    class Server(QuietServer):
        reexec: int | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:  # QuietServer says leaving
            if self.reexec is not None:  # a stop overrides a re-exec under way: once the
                box = getattr(app.state, "box", None)  # drain ends, it stops, engines too
                if box is not None and not box.handing_over:
                    box.handing_over = None  # (those already handed over die with it)
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = signal.signal(signal.SIGHUP, self.reload)
            try:
                with super().capture_signals():
                    yield
            finally:
                signal.signal(signal.SIGHUP, previous)

        def reload(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                return  # already stopping (or re-executing)
            box = getattr(app.state, "box", None)
            if box is None or not self.started:  # its engines are not all known yet
                logging.getLogger("fitbox.serve").warning(
                    "SIGHUP while starting: ignored; send it again once /health answers"
                )
                return
            box.handing_over = {}
            self.reexec = kept_for_reexec(sock)
            self.config.timeout_graceful_shutdown = RELOAD_DRAIN_S
            logging.getLogger("fitbox.serve").info(
                "SIGHUP: re-executing once the calls in flight finish; new connections "
                "wait in the socket's backlog"
            )
            _leave_now(app)
            self.should_exit = True

    return Server


def _leave_now(app: Any) -> None:
    leaving = getattr(app.state, "leaving", None)
    if leaving is not None:
        leaving.now()


def _reexec(listen_fd: int, box: Any) -> int:
    """The same pid runs the program again (the new code, after an upgrade), handed the
    listening socket and the ready engines' output pipes; they are adopted there. Returns
    only if the exec failed (1: the engines then die with this process)."""
    from fitbox.box.supervision.adoption import PIPES_ENV

    pipes = dict(getattr(box, "handing_over", None) or {})
    os.environ[LISTEN_FD_ENV] = str(listen_fd)
    os.environ[PIPES_ENV] = ",".join(f"{pid}:{fd}" for pid, fd in pipes.items() if fd >= 0)
    argv = [sys.executable, *sys.orig_argv[1:]]
    logging.getLogger("fitbox.serve").info(
        "re-executing %s, %d engine(s) kept running", " ".join(argv), len(pipes)
    )
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, argv)  # noqa: S606 - this very program, argv as it started
    except OSError as exc:
        logging.getLogger("fitbox.serve").error("cannot re-execute %s: %s", argv[0], exc)
    return 1


def http_protocol_for(config: settings.Config, open_files: int, zerocopy: bool) -> Any:
    """uvicorn's httptools protocol guarded by the connection limits (server/door/connections.py),
    with ``sendfile`` for transfers when ``zerocopy``; uvicorn's h11 protocol where httptools
    is missing (unguarded: h11 bounds only an incomplete event's size). Either answers a
    request it cannot parse with an OpenAI error body (server/door/framing.py)."""
    from fitbox.server.door.limits import limits_of

    try:
        from fitbox.server.door.connections import http_protocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        from fitbox.server.door.framing import JsonFramingErrors

        class H11(JsonFramingErrors, H11Protocol):
            pass

        return H11
    return http_protocol(limits_of(config, open_files), zerocopy=zerocopy)


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
        sock = inherited_socket() or listen_socket(config.host, config.port)
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
