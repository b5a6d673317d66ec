"""Keys and trust at the door, before any route runs.

Each route of the table (server/routes.py) names its access class (``Access``); the rules:

- Inference (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models`,
  `/v1/responses`, `/v1/messages`, the engine's `/tokenize`, `/props`…): a key
  with the inference or admin scope, or no key from the box itself or a trusted network
  (unless keys are required for inference).
- Telemetry (`/v1/telemetry*`, `/metrics`): a read or admin key, or the box itself.
- Everything else under `/v1`, and the dashboard (`/`, `/dashboard/events`), is management:
  the box itself, or an admin key. Never "any trusted network".
- MCP (`/mcp`): a valid key from anywhere, or no key from the box itself or a trusted
  network; each tool then needs what the HTTP route it mirrors needs.
- Without a key, trust in "the box itself" is trust in a loopback peer, which a web page in
  the operator's own browser is too: a page whose name was rebound by DNS to 127.0.0.1
  reaches this box under its own name. So a keyless call from the box itself to
  inference, management, the dashboard, telemetry or MCP must send a Host that names the
  box (``box_host()``: an address, localhost, the box's hostname, FITBOX_HOST or
  FITBOX_HOST_NAMES; a keyless caller on a trusted network keeps its names).
- A keyless state-changing call (POST, PUT, PATCH, DELETE) that carries an Origin, to any
  route and from anywhere, must come from the box's own origin: the scheme it was served on
  (a trusted proxy's X-Forwarded-Proto) and the Host it was sent to, port included; or from
  an origin the operator listed in FITBOX_CORS_ORIGINS. Another page's form or fetch (a
  CORS-simple ``text/plain`` POST needs no preflight) would otherwise load models and evict
  the operator's, or change the box.
- `/calls` is management too (the box itself, or an admin key, from anywhere).
- A browser signs in once at /login with a read or admin key and carries a session cookie
  after (server/door/sessions.py): on the routes the table gives a ``session`` class (the
  dashboard, /calls, and the operator actions and logs its buttons call) the cookie stands
  for that key, re-checked against the store on each use, and meets that class (READ on
  the dashboard's page and events: a read key's session views it; ADMIN elsewhere); a
  state-changing call with it must carry the session's CSRF token, and its Origin, if
  sent, must be the box's own. Elsewhere the cookie is no credential. A presented key wins
  over a cookie.
- `/health` is open. A presented fitbox key (``fb_…``) that is not valid is refused even
  where no key is needed: a client that sends a revoked key should hear about it. Any other
  bearer value (OpenAI SDKs insist on *some* api_key: "sk-no-key", "unused") is no key.
- Engine internals (an engine's log lines: paths, ports, slot state) are for insiders: an
  admin key (the box key is one), or no key from the box itself under a Host naming the box
  (a rebound page must not read ``/slots``: every caller's prompts). A key decides for
  itself wherever it comes from; a trusted network without a key is no insider. Routes and
  error handlers read ``request.state.insider``.

Who is calling is server/door/trust.py's to say; whether a browser page could have sent
a keyless call, server/door/browser.py's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from starlette.requests import Request
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from fitbox.errors import AuthenticationFailed, FitboxError, PermissionDenied
from fitbox.server.door.browser import (
    address_host,
    check_browser,
    check_origin,
    names_box,
    served_scheme,
)
from fitbox.server.door.errors import INSIDER, error_response
from fitbox.server.door.sessions import CSRF_HEADER, Session, Sessions, check_csrf, cookie_value
from fitbox.server.door.trust import Origin
from fitbox.server.door.trust import TrustSettings as TrustSettings  # where callers find it
from fitbox.server.door.trust import origin_of as origin_of
from fitbox.store.keys import ApiKey, KeyChecker
from fitbox.store.waits import bounded


class Access(StrEnum):
    """Who may call a route: each route of the table (server/routes.py) names one."""

    OPEN = "open"  # anyone (/health, /openapi.json)
    INFERENCE = "inference"  # an inference or admin key, or none from the box or a trusted net
    READ = "read"  # telemetry and metrics: a read or admin key, or none from the box itself
    ADMIN = "admin"  # management: an admin key, or none from the box itself
    MCP = "mcp"  # a key from anywhere, or none from the box or a trusted net; then per tool

    @property
    def who(self) -> str:
        """The rule in words (the OpenAPI operations say it)."""
        return _WHO[self]


_WHO = {
    Access.OPEN: "open",
    Access.INFERENCE: "a key with the inference scope, or none from the box itself or a "
    "trusted network",
    Access.READ: "the box itself, or a key with the read or admin scope",
    Access.ADMIN: "the box itself, or a key with the admin scope",
    Access.MCP: "a key, or none from the box itself or a trusted network",
}
# A path no route has still meets the door its family would (a read key probing an unknown
# telemetry path hears 404, not 403; an unknown /v1 path is management): only these two
# families are told by prefix, every route by the table.
_READ_FAMILIES = ("/v1/telemetry", "/metrics")


class AccessMap:
    """A path's access class, from the routes' own declarations: an exact path in one dict
    lookup (every call's route), a templated one (``/v1/models/{id}``) by the prefix before
    its first parameter; a path no route has by its family (``_READ_FAMILIES``, else ``/v1``
    is management); None for a path the door leaves to the router (its 404)."""

    def __init__(self, routes: Iterable[tuple[str, Access]]) -> None:
        self.exact: dict[str, Access] = {}
        prefixes: dict[str, Access] = {}
        for path, access in routes:
            if "{" in path:
                prefixes[path[: path.index("{")]] = access
            else:
                self.exact[path] = access
        self.prefixes = sorted(prefixes.items(), key=lambda item: -len(item[0]))

    def __call__(self, path: str) -> Access | None:
        found = self.exact.get(path)
        if found is not None:
            return found
        for prefix, access in self.prefixes:
            if path.startswith(prefix):
                return access
        if path.startswith(_READ_FAMILIES):
            return Access.READ
        return Access.ADMIN if path.startswith("/v1") else None


def _no_sessions(path: str) -> Access | None:
    return None


@dataclass
class Gate:
    settings: TrustSettings
    checker: KeyChecker
    require_keys: bool
    access: Callable[[str], Access | None]  # a path's access class (server/routes.py ACCESS)
    # the class a session's key meets on a path, None where a session cookie is no
    # credential (server/routes.py SESSION_ROUTES)
    session_routes: Callable[[str], Access | None] = _no_sessions
    sessions: Sessions = field(default_factory=Sessions)


def presented_key(headers: dict[str, str]) -> str | None:
    """The fitbox key the caller sent, if any."""
    auth = headers.get("authorization", "")
    value = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    value = value or headers.get("x-api-key", "").strip()
    return value if value.startswith("fb_") else None


Verify = Callable[[str, float], ApiKey | None]  # a presented key and the time: its record


async def verified(gate: Gate, path: str, headers: dict[str, str]) -> Verify:
    """The presented key checked against the store in a store reader thread, within the
    store's bound (store/waits.py), for ``admit`` to use: the event loop never waits on
    SQLite, so a hung drive answers a keyed request 503 and leaves every other one be."""
    presented = presented_key(headers)
    if presented is None or gate.access(path) in (None, Access.OPEN):
        return gate.checker.verify  # admit asks nothing of it
    check = functools.partial(gate.checker.verify, presented, time.time())
    found = await bounded(check, gate.checker.path, "check the API key")
    return lambda _presented, _now: found


async def signed_in(
    gate: Gate, path: str, headers: dict[str, str]
) -> tuple[Session, ApiKey] | None:
    """The session a browser's cookie names and its key, read again from the store (off the
    loop, within the store's bound), on a route that takes a cookie and when no key was
    presented; None otherwise. A session whose key is gone (revoked, expired) ends here."""
    if presented_key(headers) is not None or gate.session_routes(path) is None:
        return None
    session = gate.sessions.find(cookie_value(headers))
    if session is None:
        return None
    check = functools.partial(gate.checker.current, session.key_id, time.time())
    key = await bounded(check, gate.checker.path, "check the session's key")
    if key is None:
        gate.sessions.close(session.id)
        return None
    return session, key


def admit(
    path: str,
    peer: str | None,
    headers: dict[str, str],
    gate: Gate,
    method: str = "GET",
    origin: Origin | None = None,
    scheme: str = "http",
    verify: Verify | None = None,
    session_key: ApiKey | None = None,
) -> ApiKey | None:
    """The key the call runs under (None when trust alone admits it); raises if refused.
    ``origin``: the caller's, when the door has classified it already (once per request);
    ``scheme``: the one the request reached this server on (the ASGI scope's); ``verify``:
    the presented key's check, when it was made already (off the loop: ``verified``), else
    ``gate.checker.verify``; ``session_key``: a signed-in browser's key (``signed_in``; its
    CSRF token checked already), which meets the Origin rule as a keyless call does, and
    the route's session class."""
    access = gate.access(path)
    if access is None or access is Access.OPEN:
        return None
    presented = presented_key(headers)
    key = (verify or gate.checker.verify)(presented, time.time()) if presented else None
    if presented and key is None:
        raise AuthenticationFailed("The API key is not valid: unknown, revoked or expired.")
    served = served_scheme(scheme, peer, headers, gate.settings)
    if key is None and session_key is not None:
        check_origin(headers, method, gate.settings, served)
        key, access = session_key, gate.session_routes(path) or access
    origin = origin or origin_of(peer, headers, gate.settings)
    call = _Caller(path, key, origin, headers, method, served)
    return _RULES[access](call, gate)


@dataclass(frozen=True)
class _Caller:
    path: str
    key: ApiKey | None
    origin: Origin
    headers: dict[str, str]
    method: str
    scheme: str  # the box's own, as the caller's browser saw it


def _mcp(call: _Caller, gate: Gate) -> ApiKey | None:
    """Each tool is admitted again as the route it mirrors (views/mcp_tools.py)."""
    if call.key is not None:
        return call.key
    if not (call.origin.local or call.origin.trusted):
        raise AuthenticationFailed(
            f"MCP needs an API key: {call.origin.reason}.", code="missing_api_key"
        )
    if not address_host(call.headers.get("host", "")):
        # a web page whose name was rebound to this box would send its own name here:
        # without a key, its tools (load, unload) are the box's own
        raise PermissionDenied(
            "MCP without a key is served to an address (127.0.0.1, "
            "localhost), not a host name: send a key.",
            code="host_not_allowed",
        )
    check_browser(call.headers, call.method, gate.settings, call.scheme)
    return None


def _inference(call: _Caller, gate: Gate) -> ApiKey | None:
    key, origin = call.key, call.origin
    if key is not None:
        if not {"admin", "inference"} & set(key.scopes):
            raise PermissionDenied(
                f"This key's scopes ({', '.join(key.scopes)}) do not include inference."
            )
        return key
    if gate.require_keys:
        raise AuthenticationFailed(
            "This box requires an API key for inference: send Authorization: Bearer "
            "fb_<id>_<secret> (create one with 'fitbox keys create').",
            code="missing_api_key",
        )
    if origin.local and not names_box(call.headers, gate.settings):
        # a page whose name was rebound to 127.0.0.1 could read replies and start loads
        # that evict the operator's models (a trusted network's other machines keep
        # their names: their browsers are not this box's)
        raise PermissionDenied(
            f"The Host header {call.headers.get('host')!r} does not name this box: without a "
            "key, inference from the box itself is served only to an address, localhost, "
            "the box's hostname, FITBOX_HOST or a name in FITBOX_HOST_NAMES (a web page "
            "whose name was rebound to this box would send its own). Use "
            "http://127.0.0.1:PORT, add the name to FITBOX_HOST_NAMES, or send a key.",
            code="host_not_allowed",
            param="host",
        )
    if origin.local or origin.trusted:
        check_origin(call.headers, call.method, gate.settings, call.scheme)
        return None
    raise AuthenticationFailed(f"An API key is required: {origin.reason}.", code="missing_api_key")


def _read(call: _Caller, gate: Gate) -> ApiKey | None:
    key = call.key
    if key is not None and not {"admin", "read"} & set(key.scopes):
        raise PermissionDenied("Telemetry needs a key with the read or admin scope.")
    if key is not None:
        return key
    if call.origin.local:
        check_browser(call.headers, call.method, gate.settings, call.scheme)
        return None
    raise AuthenticationFailed(
        f"Telemetry needs a read key unless called from the box itself: {call.origin.reason}.",
        code="missing_api_key",
    )


def _admin(call: _Caller, gate: Gate) -> ApiKey | None:
    if call.key is not None:
        if "admin" not in call.key.scopes:
            raise PermissionDenied("Management routes need a key with the admin scope.")
        return call.key
    if call.origin.local:
        check_browser(call.headers, call.method, gate.settings, call.scheme)
        return None
    raise AuthenticationFailed(
        "Management routes need an admin key unless called from the box itself: "
        f"{call.origin.reason}.",
        code="missing_api_key",
    )


_RULES: dict[Access, Callable[[_Caller, Gate], ApiKey | None]] = {
    Access.MCP: _mcp,
    Access.INFERENCE: _inference,
    Access.READ: _read,
    Access.ADMIN: _admin,
}


def insider(key: ApiKey | None, origin: Origin, named_box: bool = True) -> bool:
    """Whether the caller may see engine internals (see the module's last rule);
    ``named_box``: its Host names this box (``names_box``)."""
    return "admin" in key.scopes if key is not None else origin.local and named_box


class AuthMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gate: Gate | None = getattr(scope["app"].state, "gate", None)
        if gate is not None:
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1")
                for k, v in scope.get("headers", [])
            }
            client = scope.get("client")
            peer = client[0] if client else None
            origin = origin_of(peer, headers, gate.settings)  # once: the check and insider
            method, path = scope.get("method", "GET"), scope["path"]
            try:
                scheme = scope.get("scheme", "http")
                verify = await verified(gate, path, headers)
                signed = await signed_in(gate, path, headers)
                if signed is not None:
                    check_csrf(signed[0], headers.get(CSRF_HEADER), method)
                session_key = signed[1] if signed else None
                key = admit(path, peer, headers, gate, method, origin, scheme, verify, session_key)
            except FitboxError as exc:
                await _refused(exc, method, path, headers)(scope, receive, send)
                return
            state = scope.setdefault("state", {})
            state["api_key"] = key
            state["session"] = signed[0] if signed else None
            state[INSIDER] = insider(key, origin, names_box(headers, gate.settings))
        await self.app(scope, receive, send)


# pages a person opens in a browser: one who has not signed in is sent to the sign-in form
_PAGES = frozenset({"/", "/calls"})


def _refused(exc: FitboxError, method: str, path: str, headers: dict[str, str]) -> ASGIApp:
    """The door's refusal: an error body, or, for a browser (it accepts HTML) that has not
    signed in and asked for a page, a redirect to the sign-in form."""
    page = method in ("GET", "HEAD") and path in _PAGES
    if isinstance(exc, AuthenticationFailed) and page and "text/html" in headers.get("accept", ""):
        return RedirectResponse("/login", status_code=303, headers={"cache-control": "no-store"})
    return error_response(exc)


def session_of(request: Request) -> Session | None:
    """The signed-in browser's session the door admitted the call under, if any."""
    found = getattr(request.state, "session", None)
    return found if isinstance(found, Session) else None


def is_insider(request: Request) -> bool:
    """What the door decided of the caller (see the module's last rule), for routes and
    error handlers."""
    return bool(getattr(request.state, INSIDER, False))
