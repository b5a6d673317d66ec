"""GET /login, POST /login, POST /logout: the dashboard's sign-in for a browser anywhere
(the session's rules are server/door/sessions.py's).

POST /login takes a form field ``key``: a read or admin key, checked as the door checks any
presented key (hashed, constant time, off the loop within the store's bound). A valid one
opens a session and answers 303 to ``/`` with the session cookie; anything else answers the
form again with what was wrong, 401. Nothing here waits on purpose: guessing is the keys'
own 2^256 and the door's connection limits' to stop. Both POSTs meet the Origin rule of a
keyless call (another site's page can neither sign the browser in with its own key nor
out); POST /logout also needs the session's CSRF token (a form field, or X-CSRF-Token).
"""

from __future__ import annotations

import functools
import time
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from fitbox.errors import InvalidRequest
from fitbox.server.door.auth import Gate, presented_key
from fitbox.server.door.browser import check_origin, served_scheme
from fitbox.server.door.sessions import (
    CSRF_HEADER,
    check_csrf,
    clear_cookie,
    cookie_value,
    set_cookie,
)
from fitbox.store.keys import ApiKey
from fitbox.store.waits import bounded

from .dashboard_assets import STYLE

FORM_MAX = 8192  # bytes of a sign-in form: a key is ~70
SIGN_IN_SCOPES = frozenset({"admin", "read"})
NO_STORE = {"cache-control": "no-store"}


def form_page(error: str = "") -> str:
    said = f'<p class="error" role="alert">{_escape(error)}</p>' if error else ""
    return (
        "<!doctype html><html lang=en><meta charset=utf-8><title>fitbox: sign in</title>"
        f"<style>{STYLE}</style><body><h1>fitbox</h1>{said}"
        '<form method="post" action="/login" class="login">'
        '<label>API key (admin, or read to view) <input type="password" name="key" '
        'autocomplete="current-password" required size="48" autofocus></label> '
        '<button type="submit">Sign in</button></form>'
        '<p class="muted">Make one on the box with <code>fitbox keys create --scope admin'
        "</code>. The key is checked once; the browser keeps a session cookie, never the "
        "key.</p></body></html>"
    )


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


async def login_form(request: Request) -> Response:
    return HTMLResponse(form_page(), headers=NO_STORE)


def _secure(request: Request, gate: Gate) -> bool:
    """Whether the browser reached the box over https (its own, or a trusted proxy's)."""
    peer = request.client.host if request.client else None
    headers = {k.lower(): v for k, v in request.headers.items()}
    return served_scheme(request.url.scheme, peer, headers, gate.settings) == "https"


async def _form(request: Request, gate: Gate) -> dict[str, str]:
    """The posted form's fields (their first values), after the Origin rule."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    scheme = "https" if _secure(request, gate) else "http"
    check_origin(headers, "POST", gate.settings, scheme)
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > FORM_MAX:
            raise InvalidRequest(f"A sign-in form is {FORM_MAX} bytes at most.", param="key")
    fields = parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items() if values}


async def _checked(gate: Gate, presented: str) -> ApiKey | None:
    if presented_key({"authorization": f"Bearer {presented}"}) is None:
        return None  # not a fitbox key at all: nothing to look up
    check = functools.partial(gate.checker.verify, presented, time.time())
    return await bounded(check, gate.checker.path, "check the API key")


async def login(request: Request) -> Response:
    gate: Gate = request.app.state.gate
    presented = (await _form(request, gate)).get("key", "").strip()
    key = await _checked(gate, presented) if presented else None
    if key is None:
        said = "That key is not valid: unknown, revoked or expired." if presented else ""
        return HTMLResponse(form_page(said or "Paste a key."), status_code=401, headers=NO_STORE)
    if not SIGN_IN_SCOPES & set(key.scopes):
        said = f"This key's scopes ({', '.join(key.scopes)}) include neither admin nor read."
        return HTMLResponse(form_page(said), status_code=401, headers=NO_STORE)
    session = gate.sessions.open(key)
    answer = RedirectResponse("/", status_code=303, headers=NO_STORE)
    answer.headers["set-cookie"] = set_cookie(session.id, _secure(request, gate))
    return answer


async def logout(request: Request) -> Response:
    gate: Gate = request.app.state.gate
    fields = await _form(request, gate)
    session = gate.sessions.find(cookie_value({"cookie": request.headers.get("cookie", "")}))
    if session is not None:
        check_csrf(session, request.headers.get(CSRF_HEADER) or fields.get("csrf"), "POST")
        gate.sessions.close(session.id)
    answer = RedirectResponse("/login", status_code=303, headers=NO_STORE)
    answer.headers["set-cookie"] = clear_cookie(_secure(request, gate))
    return answer
