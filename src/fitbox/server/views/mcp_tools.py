"""The box as tools for agents: MCP at ``/mcp`` over Streamable HTTP, with the official
``mcp`` SDK (an optional extra: ``pip install 'fitbox[mcp]'``; mcp 2 names its server class
``MCPServer``, which was ``FastMCP`` before).

Keys and scopes are the HTTP API's: each tool names the route it mirrors and is admitted by
``server/door/auth.py``'s ``admit`` for that route, so listing models takes what ``/v1/models``
takes, and ``load`` what ``POST /v1/operator/load`` takes (the box itself or an admin key).
The door itself (``/mcp``) lets in a valid key from anywhere, and no key only from the box
itself or a trusted network. A tool that fails (refused, a model not found, a load that
does not fit) returns a readable error result (``isError``), never a protocol error.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from fitbox import __version__
from fitbox.box.box import Box
from fitbox.box.limits import describe, on_this_box
from fitbox.errors import FitboxError, RouteNotFound
from fitbox.server.door.auth import admit
from fitbox.server.door.errors import error_response
from fitbox.server.inference import models
from fitbox.server.manage.operate import perform
from fitbox.server.views import calls_page
from fitbox.store.db import Store

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings
except ImportError:  # the optional extra is not installed: /mcp says how to add it
    MCPServer = None  # type: ignore[assignment,misc]

P = ParamSpec("P")
R = TypeVar("R")
MAX_CALLS = 200


def _readable(exc: FitboxError) -> str:
    return f"{exc.code}: {exc.message}"


def _request(ctx: Context) -> Request:
    request = ctx.request_context.request
    assert isinstance(request, Request), "tools are served over HTTP only"
    return request


def _admitted(ctx: Context, route: str) -> Request:
    """The tool's HTTP request, once the route it mirrors admits its caller."""
    request = _request(ctx)
    headers = {k.lower(): v for k, v in request.headers.items()}
    peer = request.client.host if request.client else None
    try:
        # the door checked the presented key for /mcp (off the loop): the same key's record
        known = getattr(request.state, "api_key", None)
        admit(route, peer, headers, request.app.state.gate, verify=lambda *_: known)
    except FitboxError as exc:
        raise ToolError(_readable(exc)) from None
    return request


# every route a tool mirrors, as the tools are built (tests hold each to the route table)
MIRRORED: set[str] = set()


def mirrors(route: str) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """A tool admitted as ``route`` is, whose fitbox errors come back readable."""
    MIRRORED.add(route)

    def wrap(tool: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(tool)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            ctx = kwargs["ctx"]
            assert isinstance(ctx, Context)
            _admitted(ctx, route)
            try:
                return await tool(*args, **kwargs)
            except FitboxError as exc:
                raise ToolError(_readable(exc)) from None

        return run

    return wrap


def _box(ctx: Context) -> Box:
    box: Box = _request(ctx).app.state.box
    return box


def _store(ctx: Context) -> Store:
    store: Store = _request(ctx).app.state.store
    return store


def _who(ctx: Context) -> tuple[str | None, str | None]:
    request = _request(ctx)
    key = getattr(request.state, "api_key", None)
    return (request.client.host if request.client else None), (key.key_id if key else None)


def _listing(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A list as the HTTP API answers one (and as one text result, not one per item)."""
    return {"object": "list", "data": items}


def build() -> MCPServer:
    server = MCPServer(
        "fitbox",
        version=__version__,
        instructions=(
            "fitbox places and runs local models. list_models names what can be served; plan "
            "says how a model would be placed without loading it; load and unload change what "
            "is resident (admin)."
        ),
    )
    _reading_tools(server)
    _changing_tools(server)
    return server


def _reading_tools(server: MCPServer) -> None:
    """The tools that read the box: each admitted as the GET route it mirrors."""

    @server.tool(
        description="The models this box can serve (GET /v1/models); a speech, "
        "transcription or image model says its task."
    )
    @mirrors("/v1/models")
    async def list_models(ctx: Context) -> dict[str, Any]:
        reply = await models.list_models(_request(ctx))
        found: dict[str, Any] = json.loads(bytes(reply.body))
        return found

    @server.tool(
        description="What is loaded: each resident, its task (a task model's), state, "
        "device and bytes."
    )
    @mirrors("/v1/residents")
    async def residents(ctx: Context) -> dict[str, Any]:
        return _listing([r.describe() for r in _box(ctx).residents()])

    @server.tool(description="Calls waiting for room, in admission order.")
    @mirrors("/v1/queue")
    async def queue(ctx: Context) -> dict[str, Any]:
        return _listing(_box(ctx).queue())

    @server.tool(
        description="How the box would place a model now, without loading it "
        "(GET /v1/plan): variant, rung, window, bytes per device, victims."
    )
    @mirrors("/v1/plan")
    async def plan(
        ctx: Context,
        model: str,
        window: int | None = None,
        parallel: int | None = None,
        kv: str | None = None,
    ) -> dict[str, Any]:
        return _box(ctx).plan_for(model, ctx=window, parallel=parallel, kv=kv)

    @server.tool(description="The box's limits per resource: device, box and central tiers.")
    @mirrors("/v1/limits")
    async def box_limits(ctx: Context) -> dict[str, Any]:
        box = _box(ctx)
        tiers = on_this_box(
            box.prefs.limit, box.gpus.read(), box.catalog.roots, box.prefs.central_limit
        )
        return _listing([dict(tier) for tier in describe(tiers)])

    @server.tool(description="The latest calls, newest first, with their timings (read).")
    @mirrors("/v1/telemetry")
    async def recent_calls(ctx: Context, limit: int = 20) -> dict[str, Any]:
        if not 1 <= limit <= MAX_CALLS:
            raise ToolError(f"invalid_request: 'limit' must be within 1..{MAX_CALLS}.")
        return _listing(await calls_page.recent_calls(_store(ctx), limit))


def _changing_tools(server: MCPServer) -> None:
    """The tools that change what is resident (admin, as their POST routes)."""

    @server.tool(description="Load a model now (admin; POST /v1/operator/load).")
    @mirrors("/v1/operator/load")
    async def load(ctx: Context, model: str) -> dict[str, Any]:
        return await perform(_box(ctx), _store(ctx), "load", model, *_who(ctx))

    @server.tool(description="Unload a resident model (admin; POST /v1/operator/unload).")
    @mirrors("/v1/operator/unload")
    async def unload(ctx: Context, model: str) -> dict[str, Any]:
        return await perform(_box(ctx), _store(ctx), "unload", model, *_who(ctx))


class McpDoor:
    """``/mcp``'s ASGI endpoint and the session manager's life (run for the app's)."""

    def __init__(self) -> None:
        self.manager: StreamableHTTPSessionManager | None = None
        if MCPServer is not None:
            server = build()
            # stateless: each POST is whole (its key is checked on it), no session to keep.
            # The SDK's Host check is off: fitbox serves any name its operator gives it, and
            # refuses a keyless call under a host name itself (server/door/auth.py).
            server.streamable_http_app(
                stateless_http=True,
                json_response=True,
                transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            )
            self.manager = server.session_manager

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        if self.manager is None:
            yield
            return
        async with self.manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.manager is None:
            missing = RouteNotFound(
                "MCP needs the optional extra: pip install 'fitbox[mcp]'.", code="mcp_not_installed"
            )
            await error_response(missing)(scope, receive, send)
            return
        await self.manager.handle_request(scope, receive, _openai_errors(scope, send))


def _openai_errors(scope: Scope, send: Send) -> Send:
    """``send``, with the SDK's plain-text refusals (a Content-Type that is not JSON, a body
    over its limit) turned into OpenAI error bodies of the same status. Its JSON answers,
    JSON-RPC errors included, pass as they are: a client of the protocol reads those."""
    held: dict[str, Any] = {}

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            kind = Headers(raw=message.get("headers", [])).get("content-type", "")
            if message["status"] >= 400 and not kind.startswith("application/json"):
                held["start"], held["text"] = message, b""
                return
        if "start" not in held:
            await send(message)
            return
        held["text"] += message.get("body", b"")
        if not message.get("more_body", False):
            await _send_error(scope, held["start"]["status"], held["text"], send)

    return sending


async def _send_error(scope: Scope, status: int, text: bytes, send: Send) -> None:
    reason = text.decode("utf-8", "replace").strip() or "refused"
    error = FitboxError(f"{scope['method']} {scope['path']}: {reason}")
    error.status = status
    error.type = "invalid_request_error" if status < 500 else "server_error"
    error.code = _MCP_CODES.get(status, "invalid_request")
    await error_response(error)(scope, _no_body, send)


_MCP_CODES = {400: "invalid_request", 413: "request_too_large", 421: "misdirected_request"}


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


class _Door:
    """The route's endpoint (an ASGI app, not a function: Starlette hands it the scope):
    the running app's ``McpDoor``, on ``app.state.mcp``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found: McpDoor = scope["app"].state.mcp
        await found(scope, receive, send)


door = _Door()
