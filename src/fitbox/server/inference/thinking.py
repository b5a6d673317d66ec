"""Where a call's thinking goes (server/streams/thinking.py ``target``): the call's own
``"reasoning_format": "none"``, else its key's ``reasoning_field`` setting, else the box's
(box/preferences.py KEY_KNOBS)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from fitbox.box.box import Box
from fitbox.server.streams import Thinking, target
from fitbox.server.streams.thinking import ROUTES


def thinking_for(request: Request, path: str, body: dict[str, Any]) -> Thinking | None:
    """The call's thinking target; None for a route that carries no generated text (its
    key's setting is not even read)."""
    if path not in ROUTES:
        return None
    box: Box = request.app.state.box
    key = getattr(request.state, "api_key", None)
    setting = str(box.prefs.for_key(key.key_id if key else None)["reasoning_field"])
    return target(path, body, setting)
