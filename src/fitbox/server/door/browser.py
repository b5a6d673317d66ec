"""What a web page in a browser could send to the box without a key, and the door's answer
(the rules are server/door/auth.py's module text): a Host that does not name the box (DNS
rebinding) and a state-changing call from another page's Origin are refused."""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Mapping
from urllib.parse import urlsplit

from fitbox.errors import PermissionDenied
from fitbox.server.door.trust import TrustSettings, parse_address, within

CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# the box's own name names it: a rebinding page sends the attacker's name, never this one
_OWN_NAME = socket.gethostname().lower().rstrip(".")


def _host_name(host: str) -> str:
    """The name in a Host header (or an Origin's netloc), without its port or brackets."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or "]" in host else host
    return name.strip().strip("[]").lower().rstrip(".")


def address_host(host: str) -> bool:
    """Whether a Host header names an address or localhost (not a name DNS could rebind)."""
    name = _host_name(host)
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def box_host(host: str, settings: TrustSettings) -> bool:
    """Whether a Host header names this box: an address (a browser sends the one in its
    address bar, which no DNS answer can change), localhost or ``*.localhost`` (browsers
    resolve those to loopback themselves), FITBOX_HOST, or a name in FITBOX_HOST_NAMES."""
    name = _host_name(host)
    return (
        address_host(host)
        or name.endswith(".localhost")
        or name == _OWN_NAME
        or name == _host_name(settings.listen_host)
        or name in settings.host_names
    )


def check_browser(
    headers: Mapping[str, str], method: str, settings: TrustSettings, scheme: str = "http"
) -> None:
    """Refuse a keyless call from the box itself that a web page could have made (see the
    module's rule on DNS rebinding); a call with no Host or Origin (curl, a script) passes."""
    host = headers.get("host")
    if not names_box(headers, settings):
        raise PermissionDenied(
            f"The Host header {host!r} does not name this box: without a key, a call from "
            "the box itself is served only to an address, localhost, FITBOX_HOST or a name "
            "in FITBOX_HOST_NAMES (a web page whose name was rebound to this box would send "
            "its own). Use http://127.0.0.1:PORT, add the name to FITBOX_HOST_NAMES, or send "
            "an admin key.",
            code="host_not_allowed",
            param="host",
        )
    check_origin(headers, method, settings, scheme)


def check_origin(
    headers: Mapping[str, str], method: str, settings: TrustSettings, scheme: str = "http"
) -> None:
    """Refuse a keyless state-changing call sent by another page than the box's own (see the
    module's rule); one without an Origin (curl, a script, a same-origin GET) passes."""
    origin = headers.get("origin")
    if method.upper() not in CHANGES or origin is None:
        return
    host = headers.get("host")
    own = _origin_parts(f"{scheme}://{host}") if host else None
    sent = _origin_parts(origin)
    if sent is not None and (sent == own or sent in _listed(settings.allowed_origins)):
        return
    where = f"{scheme}://{host}" if host else "no Host was sent"
    raise PermissionDenied(
        f"A {method.upper()} without a key from the page at {origin!r} is refused: only the "
        f"box's own pages ({where}: scheme, host and port) may send one without a key, so "
        "that another page open in a browser cannot load models or change the box. Send a "
        "key, or list the page's origin in FITBOX_CORS_ORIGINS.",
        code="origin_not_allowed",
        param="origin",
    )


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_parts(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, the default port filled in; None if it is not an
    http(s) origin (``null``, a file page, garbage)."""
    try:
        parts = urlsplit(url.strip())
        scheme, name, port = parts.scheme.lower(), parts.hostname, parts.port
    except ValueError:  # a port that is no number, a bracket left open
        return None
    if scheme not in _DEFAULT_PORTS or not name:
        return None
    return scheme, name.rstrip("."), port or _DEFAULT_PORTS[scheme]


@functools.lru_cache(maxsize=16)
def _listed(origins: tuple[str, ...]) -> frozenset[tuple[str, str, int]]:
    found = (_origin_parts(o) for o in origins if o != "*")
    return frozenset(o for o in found if o is not None)


def served_scheme(
    scheme: str, peer: str | None, headers: Mapping[str, str], settings: TrustSettings
) -> str:
    """The scheme a browser reached the box on: the server's own, or what a trusted proxy
    says it was (X-Forwarded-Proto's first hop), as the door believes a trusted proxy's
    X-Forwarded-For and nobody else's."""
    proto = headers.get("x-forwarded-proto", "").split(",", 1)[0].strip().lower()
    if proto in _DEFAULT_PORTS and within(parse_address(peer), settings.trusted_proxies):
        return proto
    return scheme


def names_box(headers: Mapping[str, str], settings: TrustSettings) -> bool:
    """Whether the request's Host (if it sent one: curl over HTTP/1.0 may not) names the box."""
    host = headers.get("host")
    return host is None or box_host(host, settings)
