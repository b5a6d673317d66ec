"""The bounds a connection lives within (server/door/connections.py enforces them), read
from the settings, and the open-file limit they are sized by."""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from fitbox.config import Config

log = logging.getLogger("fitbox.connections")

FD_RESERVE = 128  # files kept for the store, logs, engine pipes, whatever the box opens
_NR_OPEN_DEFAULT = 1 << 20  # Linux's fs.nr_open: no soft limit may exceed it


@dataclass(frozen=True)
class ConnectionLimits:
    head_bytes: int = 64 << 10
    header_count: int = 100
    head_timeout: float = 30.0
    body_timeout: float = 300.0
    send_stall_timeout: float = 120.0
    connections: int | None = None  # None: no cap (tests' own servers)


def limits_of(config: Config, open_files: int) -> ConnectionLimits:
    """The limits ``config`` sets; the cap on connections from the
    open-file limit in force when it sets none."""
    return ConnectionLimits(
        head_bytes=config.request_head_max,
        header_count=config.request_headers_max,
        head_timeout=config.request_head_timeout,
        body_timeout=config.request_body_timeout,
        send_stall_timeout=config.send_stall_timeout,
        connections=config.connections_max or max(16, (open_files - FD_RESERVE) // 2),
    )


def raise_open_files() -> int:
    """The soft limit on open files raised to the hard one (a service's usual 1,024 lets a
    thousand idle sockets take the box offline); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _NR_OPEN_DEFAULT if hard == resource.RLIM_INFINITY else hard
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, wanted, exc)
    return soft
