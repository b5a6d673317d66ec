"""What a box tells the central, as the central's own inference client may see it.

The central calls a box with the box's admin key, so the box answers it as an insider:
an error's operator reason (the box's paths, owners and modes) is in its message, an
engine's log lines are in ``log_tail``, ``/props`` carries the child's ``model_path`` and
``/slots`` shows every caller's prompts. The central cannot ask a box for the outsider form
(it holds no other key of the box, and a box of an older version would not know such a
request), so it makes the outsider form itself, here, for every caller that is no insider
of the central (server/door/auth.py ``insider``: a central admin key, or the central's own
host). Paths are withheld wherever they stand in a message: the box's own outsider form
still names its model folders in a 404 (models/catalog.py ModelNotFound's "Put its GGUF
under ...")."""

from __future__ import annotations

import json
import re
from typing import Any

from fitbox.server.door.errors import INTERNAL, OPERATOR_REASON, WITHHELD
from fitbox.server.routes import ENDPOINTS

# an absolute path of two parts or more (``/srv/models``, ``/home/a/b.gguf``), alone or in a
# list joined by ':' (os.pathsep): a URL's path is not one (it follows a host, not a space),
# nor is a route of the box a message names (``GET /v1/fleet``, ``/tokenize?model=``)
_ROUTE_ROOTS = sorted({e.path.split("/")[1].split("{")[0] for e in ENDPOINTS} - {""})
_PATH = re.compile(
    r"(?<![\w:/.])/(?!(?:" + "|".join(map(re.escape, _ROUTE_ROOTS)) + r")(?:[/?\s]|$))"
    r"(?:[^\s/:;,'\")]+/)+[^\s/:;,'\")]*(?::/[^\s;,'\")]*)*"
)
PATH_WITHHELD = "(a path on the box, shown to the box itself and to admin keys)"
ENGINE_PATHS = ("model_path",)  # /props fields naming the box's files
WHOLE = ("/props",)  # a reply read whole and rewritten for an outsider, error or not
INSIDER_ONLY = ("/slots",)  # every caller's prompt and generated text


def rewritten(path: str, status: int) -> bool:
    """Whether an outsider is given the box's reply rewritten (not passed as it comes)."""
    return status >= 400 or path in WHOLE


def withhold_paths(text: str) -> str:
    """``text`` with each path of the box's filesystem replaced (a sentence's last full stop
    kept)."""
    return _PATH.sub(lambda m: PATH_WITHHELD + "." * m.group().endswith("."), text)


def error_body(raw: bytes) -> bytes:
    """A box's error body without paths or engine internals; a body that is not fitbox's
    error shape is given as it came (the box's paths are in fitbox's messages only)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return raw
    reason = error.pop(OPERATOR_REASON, None)  # a box that sends it apart: never told
    internal = [k for k in INTERNAL if k in error]
    for name in internal:
        del error[name]
    message = error.get("message")
    if isinstance(message, str):
        message = withhold_paths(message)
        if internal:
            message += WITHHELD
        error["message"] = message
    elif reason is not None or internal:
        error["message"] = "(details withheld: shown to the box itself and to admin keys)"
    return json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode()


def props_body(raw: bytes) -> bytes:
    """A child's /props without the paths of the box's files."""
    try:
        found: Any = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(found, dict):
        return raw
    for name in ENGINE_PATHS:
        found.pop(name, None)
    return json.dumps(found).encode()
