"""Box routes beyond the OpenAI surface: the dry-run plan and API keys (management:
the box itself or an admin key, enforced by server/door/auth.py). Keys are read and written
through store/waits.py: a store that does not answer in time is a 503 ``store_busy`` with
``Retry-After``, and a key it refused that way is never made."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.box.box import Box
from fitbox.errors import Conflict, InvalidRequest
from fitbox.errors import RouteNotFound as NotFound
from fitbox.server.door.bodies import json_body
from fitbox.store import keys as keydb
from fitbox.store.db import Store
from fitbox.store.waits import read, write


def _positive(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidRequest(f"Query parameter '{name}' must be a positive integer.", param=name)
    return int(raw)


async def plan(request: Request) -> Response:
    """GET /v1/plan?model=&ctx=&parallel=&kv= : the placement, priced, without loading."""
    box: Box = request.app.state.box
    model = request.query_params.get("model")
    if not model:
        raise InvalidRequest("Query parameter 'model' is required.", param="model")
    report = box.plan_for(
        model,
        ctx=_positive(request, "ctx"),
        parallel=_positive(request, "parallel"),
        kv=request.query_params.get("kv") or None,
        max_tokens=_positive(request, "max_tokens") or 0,
    )
    return JSONResponse(report)


def _key_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


async def list_keys(request: Request) -> Response:
    store = _key_store(request)
    keys = await read(store.path, keydb.list_keys, "list the keys")
    return JSONResponse({"object": "list", "data": [k.public() for k in keys]})


async def show_key(request: Request) -> Response:
    key_id = request.path_params["key_id"]
    store = _key_store(request)
    key = await read(store.path, lambda conn: keydb.find_key(conn, key_id), "read the key")
    if key is None:
        raise NotFound(f"No key with id {key_id!r}.", param="key_id")
    return JSONResponse(key.public())


async def revoke_key(request: Request) -> Response:
    key_id = request.path_params["key_id"]
    try:
        key = await write(
            _key_store(request), lambda conn: keydb.revoke_key(conn, key_id), "revoke the key"
        )
    except keydb.BoxKeyHeld as exc:
        raise Conflict(f"{exc}.", param="key_id", code="box_key_held") from None
    except keydb.KeyError_ as exc:
        raise NotFound(str(exc), param="key_id") from None
    return JSONResponse(key.public())


async def create_key(request: Request) -> Response:
    """POST /v1/keys {"name", "scopes": [...], "models": [...]?, "expires_in_s": N?}.
    The answer holds the secret; it is never shown again."""
    _, body = await json_body(request, empty=True)
    name, scopes = body.get("name", "unnamed"), body.get("scopes", ["inference"])
    models, expires_in = body.get("models"), body.get("expires_in_s")
    if (
        not isinstance(name, str)
        or not isinstance(scopes, list)
        or not all(isinstance(s, str) for s in scopes)
    ):
        raise InvalidRequest(
            "'name' must be a string and 'scopes' a list of strings.", param="scopes"
        )
    if models is not None and not (
        isinstance(models, list) and all(isinstance(m, str) for m in models)
    ):
        raise InvalidRequest("'models' must be a list of model names.", param="models")
    if expires_in is not None and (
        isinstance(expires_in, bool) or not isinstance(expires_in, int | float) or expires_in <= 0
    ):
        raise InvalidRequest("'expires_in_s' must be a positive number.", param="expires_in_s")
    expires_at = time.time() + expires_in if expires_in else None
    try:
        key, secret = await write(
            _key_store(request),
            lambda conn: keydb.create_key(
                conn, name, tuple(scopes), tuple(models) if models is not None else None, expires_at
            ),
            "make the key",
        )
    except keydb.KeyError_ as exc:
        raise InvalidRequest(str(exc), param="scopes") from None
    return JSONResponse({**key.public(), "key": secret}, status_code=201)
