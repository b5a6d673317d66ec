"""The dashboard's sign-in sessions: a browser sends no ``Authorization`` header, so an
operator signs in once at /login with an admin or read key (checked as the door checks any
key: server/door/auth.py, store/keys.py) and the browser carries a session cookie after.

- The cookie holds a random id (``secrets.token_urlsafe``), never the key: the id maps, in
  this process's memory, to the key's id and scopes and a CSRF token. HttpOnly (no page
  script reads it), SameSite=Strict (no other site's page sends it), Path=/, Secure when
  the browser reached the box over https (a trusted proxy's X-Forwarded-Proto counts,
  server/door/browser.py ``served_scheme``).
- A session ends after ``IDLE_S`` unused, at POST /logout, when the box restarts (nothing
  is written down), and the first time it is used after its key was revoked or expired:
  each use reads the key's row again (``KeyChecker.current``, off the loop like every key
  check), so it grants exactly what the key still grants, read (view) or admin (act).
- The cookie is a credential only on the routes the table marks ``session`` (the dashboard,
  /calls, the operator actions and logs its buttons call: server/routes.py); elsewhere it is
  no key at all. A state-changing call (POST, PUT, PATCH, DELETE) with it must carry the
  session's CSRF token in an ``X-CSRF-Token`` header (the page's JavaScript sends the one
  the page was rendered with), and an Origin, if sent, must be the box's own.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from fitbox.errors import PermissionDenied
from fitbox.store.keys import ApiKey

COOKIE = "fitbox_session"
CSRF_HEADER = "x-csrf-token"
IDLE_S = 12 * 3600.0  # a session unused this long is gone
MOST = 10_000  # sessions kept at once: past it the least recently used goes


@dataclass
class Session:
    id: str
    key_id: str
    scopes: tuple[str, ...]
    csrf: str
    used_at: float = field(default_factory=time.monotonic)

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes


class Sessions:
    """The signed-in browsers of this process, by session id."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, key: ApiKey) -> Session:
        session = Session(
            secrets.token_urlsafe(32), key.key_id, key.scopes, secrets.token_urlsafe(32)
        )
        with self._lock:
            self._by_id[session.id] = session
            while len(self._by_id) > MOST:
                self._by_id.popitem(last=False)
        return session

    def find(self, session_id: str | None) -> Session | None:
        """The live session of ``session_id`` (its idle clock restarted), or None."""
        if not session_id:
            return None
        now = time.monotonic()
        with self._lock:
            session = self._by_id.get(session_id)
            if session is None:
                return None
            if now - session.used_at > self.idle_s:
                del self._by_id[session_id]
                return None
            session.used_at = now
            self._by_id.move_to_end(session_id)
            return session

    def close(self, session_id: str | None) -> None:
        with self._lock:
            self._by_id.pop(session_id or "", None)

    def __len__(self) -> int:
        return len(self._by_id)


def cookie_value(headers: Mapping[str, str], name: str = COOKIE) -> str | None:
    """The value of the cookie ``name`` in a request's Cookie header, if sent."""
    for part in headers.get("cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name and value:
            return value.strip().strip('"')
    return None


def set_cookie(session_id: str, secure: bool) -> str:
    """The Set-Cookie value that hands a browser its session (no Max-Age: it goes when the
    browser closes, or at the server's idle bound, whichever comes first)."""
    flags = "; Secure" if secure else ""
    return f"{COOKIE}={session_id}; HttpOnly; SameSite=Strict; Path=/{flags}"


def clear_cookie(secure: bool) -> str:
    flags = "; Secure" if secure else ""
    return f"{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{flags}"


def check_csrf(session: Session, sent: str | None, method: str) -> None:
    """Refuse a state-changing call made with the session's cookie but without its token
    (another site's page cannot read the page that holds it)."""
    if method.upper() not in {"POST", "PUT", "PATCH", "DELETE"}:
        return
    if sent is None or not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise PermissionDenied(
            f"A {method.upper()} signed in with the dashboard's session cookie must carry the "
            "session's CSRF token in the X-CSRF-Token header (the dashboard's page holds it); "
            "a script sends an API key instead.",
            code="csrf_failed",
            param=CSRF_HEADER,
        )
