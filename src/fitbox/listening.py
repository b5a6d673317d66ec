"""The socket a serving fitbox (a box or a central) answers on, and the endpoint.json that
tells the CLI, the installer and the tests where that is."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any


def listen_socket(host: str, port: int | None) -> socket.socket:
    """Bound and listening before the app starts (port 0 or None: any free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP,
    # and without it Nagle + delayed ACK add ~40 ms to every response
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port or 0))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


LISTEN_FD_ENV = "FITBOX_LISTEN_FD"  # the socket a re-exec of `fitbox serve` hands itself
SD_LISTEN_FDS_START = 3  # systemd's first passed descriptor (sd_listen_fds(3))


def inherited_socket() -> socket.socket | None:
    """The listening socket this process was given, if any: the one an earlier image of
    this same `fitbox serve` handed over across its re-exec (``FITBOX_LISTEN_FD``), else
    systemd's socket activation (``LISTEN_FDS`` for this pid: fd 3). The variables are
    removed, as sd_listen_fds does, so no process started from here takes them for its own;
    the socket is not inherited by children."""
    handed = os.environ.pop(LISTEN_FD_ENV, "")
    listen_pid = os.environ.pop("LISTEN_PID", "")
    listen_fds = os.environ.pop("LISTEN_FDS", "")
    os.environ.pop("LISTEN_FDNAMES", None)
    fd = None
    if handed.isdigit():
        fd = int(handed)
    elif listen_pid == str(os.getpid()) and listen_fds.isdigit() and int(listen_fds) >= 1:
        fd = SD_LISTEN_FDS_START
    if fd is None:
        return None
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    return sock


def kept_for_reexec(sock: socket.socket) -> int:
    """A second descriptor of the listening socket, inheritable: the server closes its own
    when it stops, and this one keeps the socket listening (the kernel queues what arrives
    in its backlog) until the new image takes it (``FITBOX_LISTEN_FD``)."""
    fd = os.dup(sock.fileno())
    os.set_inheritable(fd, True)
    return fd


def endpoint_of(host: str, sock: socket.socket) -> dict[str, Any]:
    port = sock.getsockname()[1]
    url_host = f"[{host}]" if ":" in host else host
    return {"url": f"http://{url_host}:{port}", "host": host, "port": port, "pid": os.getpid()}


def published_url(path: Path) -> str | None:
    """The URL a serving fitbox published at ``path``; None when there is none to read."""
    try:
        url = json.loads(path.read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return url if isinstance(url, str) else None


def publish_endpoint(path: Path, endpoint: dict[str, Any]) -> None:
    """Written beside and renamed: a reader never sees half a file."""
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps(endpoint) + "\n")
    os.replace(partial, path)
