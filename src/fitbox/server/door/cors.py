"""CORS for browser apps: off unless ``FITBOX_CORS_ORIGINS`` lists origins (or ``*``, which
config.py allows only when every call needs a key).

Starlette's CORSMiddleware sits outside AuthMiddleware: a preflight (``OPTIONS`` with
``Access-Control-Request-Method``) carries no key by the browser's rules, so fitbox answers
it before the key check and never forwards it; the call that follows carries its key and
meets the check as any other, and its answer (an error too) carries the CORS headers. The
bearer key is a header, not a cookie: credentials stay off.
"""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

# What a browser script may read of a reply: the served model, why a call was refused,
# where its time went (server/door/timing.py)
EXPOSED = (
    "x-fitbox-model",
    "x-fitbox-default-model",
    "x-fitbox-device",
    "x-should-retry",
    "retry-after",
    "x-request-id",
    "server-timing",
)
PREFLIGHT_MAX_AGE_S = 600


def middleware(origins: tuple[str, ...]) -> list[Middleware]:
    if not origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=list(origins),
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=list(EXPOSED),
            allow_credentials=False,
            max_age=PREFLIGHT_MAX_AGE_S,
        )
    ]
