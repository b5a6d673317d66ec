"""The route table: every route of the box declared once, with who may call it (its access
class, server/door/auth.py ``Access``), its OpenAPI operation per method (``Op``,
server/views/openapi.py) and, for a route a child answers, the engine route it reaches
(each engine kind's ``routes()`` says which it serves). The app's routes, the door's access
classes, /openapi.json and docs/reference/routes.md are made from it; the guide's route
list is checked against it (tests/test_route_table.py).

Adding a route is one entry here and its handler: see docs/design/path-of-a-call.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, request_response
from starlette.types import ASGIApp, Receive, Scope, Send

from fitbox.server.door.auth import Access, AccessMap
from fitbox.server.inference import audio, images, models, openai
from fitbox.server.manage import facts, logs, manage, operate, settings, telemetry, transfer
from fitbox.server.views import calls_page, login, openapi
from fitbox.server.views.dashboard import dashboard, events
from fitbox.server.views.mcp_tools import door
from fitbox.server.views.metrics import scrape
from fitbox.server.views.openapi import Op
from fitbox.server.views.openapi_shapes import (
    ACTION,
    APPLY_TEMPLATE,
    ARTIFACT,
    BOX_BODY,
    CHAT,
    COMPLETION,
    COUNT_TOKENS,
    DETOKENIZE,
    EMBEDDING,
    FACTS_BODY,
    HELPER_CHAT,
    IMAGE_FILE,
    IMAGES,
    INFILL,
    KEY,
    KEY_BODY,
    KEY_ID,
    KEY_PARAM,
    LIMITS_BODY,
    LOG_READ,
    MESSAGES,
    MODEL_ID,
    MODEL_NAMED,
    MODEL_PARAM,
    MODEL_PATH,
    MODEL_QUERY,
    OPERATOR_BODY,
    PAIR_BODY,
    PLAN,
    REPLAY,
    REPLY,
    RERANK,
    RESPONSES,
    ROWS,
    SCOUT,
    SINCE,
    SPEECH,
    STATE,
    TOKENIZE,
    TRANSCRIPTION,
    TRANSFER_FILE,
    TRANSLATION,
)

# a request handler, or an ASGI app of its own (MCP's door); a route a child answers is
# handed the engine route it reaches (the entry's ``engine``)
Handler = Callable[[Request], Awaitable[Response]] | ASGIApp
Forwarding = Callable[[Request, str], Awaitable[Response]]
INFERENCE, READ, ADMIN = Access.INFERENCE, Access.READ, Access.ADMIN


@dataclass(frozen=True)
class Endpoint:
    """One route: ``path`` (Starlette's syntax), its handler, who may call it, an operation
    per method (the methods it answers), the engine route it reaches (None: the box answers
    it), whether it is plain JSON over HTTP (MCP, the dashboard's event stream and its
    sign-in are not: they are documented, not fuzzed as JSON), and, where a signed-in
    browser's session cookie is a credential on it (server/door/sessions.py: the dashboard's
    pages and the routes its buttons and links call), the class its session's key must meet
    there (READ: a read key's session views the dashboard; ADMIN: it acts)."""

    path: str
    handler: Handler | Forwarding
    access: Access
    ops: Mapping[str, Op]
    engine: str | None = None
    json_api: bool = True
    session: Access | None = None

    @property
    def methods(self) -> list[str]:
        return [method.upper() for method in self.ops]

    @property
    def doc_path(self) -> str:
        """The path as OpenAPI writes it (no Starlette converters)."""
        return self.path.replace(":path}", "}")

    @property
    def who(self) -> str:
        if self.session is None:
            return self.access.who
        scopes = "an admin" if self.session is Access.ADMIN else "a read or admin"
        return f"{self.access.who}; or a browser signed in at /login with {scopes} key"


async def openapi_json(request: Request) -> Response:
    return JSONResponse(openapi.spec(ENDPOINTS))


# The calls first: Starlette tries routes in order, a regex each (~35 of them before chat
# came up). No route above them could match their paths. Laid out by hand: one entry a route.
# fmt: off
ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("/v1/chat/completions", openai.chat_completions, INFERENCE, {
        "post": Op("Chat (SSE with stream: true). " + REPLY + ". " + HELPER_CHAT, CHAT)},
        engine="/v1/chat/completions"),
    Endpoint("/v1/completions", openai.completions, INFERENCE, {
        "post": Op("Text completion. A model's thinking is in the choice's reasoning_content "
                   "(or reasoning) beside text", COMPLETION)},
        engine="/v1/completions"),
    Endpoint("/v1/embeddings", openai.embeddings, INFERENCE, {
        "post": Op("Embeddings (embedding models; a decoder with the embeddings setting)",
                   EMBEDDING)},
        engine="/v1/embeddings"),
    Endpoint("/v1/responses", openai.responses, INFERENCE, {
        "post": Op("OpenAI Responses API (SSE with stream: true); a model's thinking is a "
                   "reasoning output item", RESPONSES, MODEL_QUERY)},
        engine="/v1/responses"),
    Endpoint("/v1/messages", openai.messages, INFERENCE, {
        "post": Op("Anthropic Messages API shape (SSE with stream: true); a model's thinking "
                   "is a thinking block", MESSAGES, MODEL_QUERY)},
        engine="/v1/messages"),
    Endpoint("/v1/messages/count_tokens", openai.count_tokens, INFERENCE, {
        "post": Op("Anthropic's token count for a Messages body: input_tokens", COUNT_TOKENS,
                   MODEL_QUERY)},
        engine="/v1/messages/count_tokens"),
    Endpoint("/v1/rerank", openai.rerank, INFERENCE, {
        "post": Op("Rerank documents (reranker models)", RERANK, MODEL_QUERY)},
        engine="/v1/rerank"),
    Endpoint("/rerank", openai.rerank, INFERENCE, {
        "post": Op("Rerank documents: /v1/rerank's alias", RERANK, MODEL_QUERY)},
        engine="/v1/rerank"),
    Endpoint("/v1/audio/transcriptions", audio.transcriptions, INFERENCE, {
        "post": Op("Speech to text (multipart: file, model; response_format json, text, "
                   "verbose_json, srt, vtt; stream=true as transcript.text.delta events)",
                   TRANSCRIPTION, media="multipart/form-data")},
        engine="/v1/audio/transcriptions", json_api=False),
    Endpoint("/v1/audio/translations", audio.translations, INFERENCE, {
        "post": Op("Speech to English text (multipart, as transcriptions without language)",
                   TRANSLATION, media="multipart/form-data")},
        engine="/v1/audio/translations", json_api=False),
    Endpoint("/v1/audio/speech", audio.speech, INFERENCE, {
        "post": Op("Text to speech: the audio as it is made (chunked), or speech.audio.delta "
                   "events with stream_format sse", SPEECH)},
        engine="/v1/audio/speech", json_api=False),
    Endpoint("/v1/audio/voices", audio.list_voices, INFERENCE, {
        "get": Op("Every speech model's voices")}),
    Endpoint("/v1/images/generations", images.generations, INFERENCE, {
        "post": Op("Images from a prompt (diffusers models): n PNGs of size WIDTHxHEIGHT, as "
                   "b64_json or as a url fitbox serves until FITBOX_ARTIFACT_MAX_AGE passes; "
                   "seed and steps where the runner takes them", IMAGES)},
        engine="/v1/images/generations"),
    Endpoint("/v1/images/files/{name}", images.image_file, INFERENCE, {
        "get": Op("An image a generation kept, by the unguessable name its url carries "
                  "(404 image_expired once it is no longer kept)", params=IMAGE_FILE)}),
    Endpoint("/tokenize", openai.tokenize, INFERENCE, {
        "post": Op("The model's tokens for content", TOKENIZE, MODEL_QUERY)},
        engine="/tokenize"),
    Endpoint("/detokenize", openai.detokenize, INFERENCE, {
        "post": Op("Text for tokens", DETOKENIZE, MODEL_QUERY)},
        engine="/detokenize"),
    Endpoint("/apply-template", openai.apply_template, INFERENCE, {
        "post": Op("The prompt the model's chat template makes of messages",
                   APPLY_TEMPLATE, MODEL_QUERY)},
        engine="/apply-template"),
    Endpoint("/infill", openai.infill, INFERENCE, {
        "post": Op("Fill in the middle (models with FIM tokens)", INFILL, MODEL_QUERY)},
        engine="/infill"),
    Endpoint("/health", openai.health, Access.OPEN, {
        "get": Op("Liveness (200; status ok or degraded, with the problems to fix), version, "
                  "GPUs (simulated ones labelled), store")}),
    Endpoint("/v1/models", models.list_models, INFERENCE, {
        "get": Op("The catalog, with residency")}),
    Endpoint("/v1/models/{model_id:path}", models.show_model, INFERENCE, {
        "get": Op("One model by name, alias or family name (OpenAI's retrieve), with meta",
                  params=MODEL_ID)}),
    Endpoint("/v1/plan", manage.plan, ADMIN, {
        "get": Op("What the box would load for a model, and where", params=PLAN)}),
    Endpoint("/v1/telemetry/state", telemetry.state, READ, {
        "get": Op("The change counter; long-polls until it passes `since` or `wait` seconds "
                  "pass, or the box stops (stopping: true). `cursors=TABLE:CURSOR,…`: the "
                  "answer carries each changed table's first page from its cursor (pages); "
                  "queue_eta: per ready resident, the seconds a new call would wait for a "
                  "slot (null: not measured)",
                  params=STATE)}),
    Endpoint("/v1/telemetry", telemetry.rows, READ, {
        "get": Op("Cursor replay of a table by seq", params=REPLAY)}),
    Endpoint("/v1/telemetry/tables", telemetry.tables, READ, {
        "get": Op("Every table and view with the columns a reader may see (secrets withheld)")}),
    Endpoint("/v1/telemetry/rows", telemetry.table_rows, READ, {
        "get": Op("Rows of any table or view, read-only, ordered by one of its columns",
                  params=ROWS)}),
    Endpoint("/v1/telemetry/scout", telemetry.scout_findings, READ, {
        "get": Op("The newest findings of `fitbox scout`: path, what led to it, live or "
                  "historical, servable once its header was read", params=SCOUT)}),
    Endpoint("/calls", calls_page.calls_page, ADMIN, {
        "get": Op("An HTML page of the latest calls")}, session=ADMIN),
    Endpoint("/metrics", scrape, READ, {
        "get": Op("Prometheus text: calls, errors, tokens and times per model, devices, "
                  "loads, evictions, refusals, estimate errors, the build and the process, "
                  "and each child's llamacpp:* as llamacpp_* with a model label")}),
    Endpoint("/", dashboard, ADMIN, {
        "get": Op("The live dashboard (HTML; whole with JavaScript off); a browser that has "
                  "not signed in is sent to /login")}, session=READ),
    Endpoint("/dashboard/events", events, ADMIN, {
        "get": Op("The dashboard's updates: an SSE event with the re-rendered page body on "
                  "each change, a beat event between", params=SINCE)},
        json_api=False, session=READ),
    Endpoint("/login", login.login_form, Access.OPEN, {
        "get": Op("The dashboard's sign-in form (HTML)")}, json_api=False),
    Endpoint("/login", login.login, Access.OPEN, {
        "post": Op("Sign in with a read or admin key (form field key): 303 to / with a "
                   "session cookie (HttpOnly, SameSite=Strict), or the form again, 401",
                   ok=(303,))}, json_api=False),
    Endpoint("/logout", login.logout, Access.OPEN, {
        "post": Op("Sign out: the session ends (form field csrf, or X-CSRF-Token); 303 to "
                   "/login", ok=(303,))}, json_api=False),
    # stateless: no session to end (DELETE) and no server events to stream (GET), so those
    # are 405, as the MCP spec allows, not a stream that never sends anything
    Endpoint("/mcp", door, Access.MCP, {
        "post": Op("MCP over Streamable HTTP (JSON-RPC; needs 'fitbox[mcp]'): tools "
                   "list_models, residents, queue, plan, load, unload, recent_calls, "
                   "box_limits, each needing what the route it mirrors needs; stateless, "
                   "so GET (server events) and DELETE (end a session) are 405")},
        json_api=False),
    Endpoint("/v1/residents", operate.residents, ADMIN, {
        "get": Op("Loaded models: device, bytes, state, calls")}),
    Endpoint("/v1/storage", operate.storage, ADMIN, {
        "get": Op("Drives holding models")}),
    Endpoint("/v1/queue", operate.queue, ADMIN, {
        "get": Op("Calls waiting for room, and what blocks them")}),
    Endpoint("/v1/cores", settings.cores, ADMIN, {
        "get": Op("Physical cores: kept for the OS, claimed by which engine, free")}),
    Endpoint("/v1/limits", settings.limits, ADMIN, {
        "get": Op("Capacity tiers: device, box, central, effective"),
        "post": Op("Set box limits, or with tier: central the central tier (a central's "
                   "allotment); a value above its parent tier is refused", LIMITS_BODY,
                   body_optional=True)}),
    Endpoint("/v1/settings/box", settings.box_settings, ADMIN, {
        "get": Op("Box-wide knobs: own, default, effective"),
        "post": Op("Set box-wide knobs (null clears one)", BOX_BODY, body_optional=True)}),
    Endpoint("/v1/settings/pair", settings.pair_settings, ADMIN, {
        "get": Op("Per-model knobs: own, box-wide, effective", params=MODEL_PARAM),
        "post": Op("Set a model's knobs (null clears one)", PAIR_BODY)}),
    Endpoint("/v1/settings/key", settings.key_settings, ADMIN, {
        "get": Op("Per-key knobs (reasoning_field, progress): own, effective", params=KEY_PARAM),
        "post": Op("Set a key's knobs (null clears one)", KEY_BODY)}),
    Endpoint("/v1/verdicts", settings.verdicts, ADMIN, {
        "get": Op("Every variant x rung x K/V type priced now, and the Auto pick",
                  params=MODEL_PARAM)}),
    Endpoint("/v1/operator/{action}", operate.operator_action, ADMIN, {
        "post": Op("Operator action, recorded. reap-to-fit takes bytes (to free on the worker "
                   "drive), refresh-models nothing, pull-model a model (box://HOST:PORT/MODEL) "
                   "and a source_key, every other action a model", OPERATOR_BODY, ACTION,
                   body_optional=True)}, session=ADMIN),
    Endpoint("/openapi.json", openapi_json, Access.OPEN, {
        "get": Op("This document")}),
    Endpoint("/v1/transfer/{model}/manifest", transfer.manifest, ADMIN, {
        "get": Op("A model's files for another box: path, bytes, sha256", params=[MODEL_PATH])}),
    Endpoint("/v1/transfer/{model}/chunksums", transfer.chunksums, ADMIN, {
        "get": Op("The sha256 of each fixed chunk of one of the model's files",
                  params=TRANSFER_FILE)}),
    Endpoint("/v1/transfer/{model}/file", transfer.file, ADMIN, {
        "get": Op("One of the model's files, streamed; Range: bytes=… answered 206; 429 with "
                  "Retry-After beyond the transfer cap", params=TRANSFER_FILE, ok=(200, 206))}),
    Endpoint("/v1/hashes", transfer.kept_hashes, ADMIN, {
        "get": Op("Every weight file's kept sha256 (hashed once); ?artifact=PATH hashes that "
                  "model file of the catalog once and lists it alone", params=ARTIFACT)}),
    Endpoint("/v1/facts/import", facts.import_facts, ADMIN, {
        "post": Op("Footprints, refused windows and speeds another box measured for a file "
                   "with this sha256 (one list at least), filed under this box's file with "
                   "their origin; plans price from them (basis imported, refused_windows, "
                   "speeds_measured_by) until this box measures its own", FACTS_BODY)}),
    Endpoint("/v1/logs", logs.list_logs, ADMIN, {
        "get": Op("The engine children's log files (one per launch), newest first: name, "
                  "model, bytes, modified_at, running")}, session=ADMIN),
    Endpoint("/v1/logs/{name}", logs.read_log, ADMIN, {
        "get": Op("One child log as text: its last ?tail= lines (200), or from byte ?offset= "
                  "on (a follower's next read: x-fitbox-log-offset), 4 MiB at most",
                  params=LOG_READ)}, session=ADMIN),
    Endpoint("/v1/keys", manage.list_keys, ADMIN, {
        "get": Op("API keys, without secrets")}),
    Endpoint("/v1/keys", manage.create_key, ADMIN, {
        "post": Op("Create a key (the secret is shown once)", KEY, ok=(201,),
                   body_optional=True)}),
    Endpoint("/v1/keys/{key_id}", manage.show_key, ADMIN, {
        "get": Op("One key", params=KEY_ID)}),
    Endpoint("/v1/keys/{key_id}", manage.revoke_key, ADMIN, {
        "delete": Op("Revoke a key", params=KEY_ID)}),
    Endpoint("/props", openai.props, INFERENCE, {
        "get": Op("The loaded child's properties (model_path for insiders only)",
                  params=MODEL_NAMED)},
        engine="/props"),
    Endpoint("/slots", openai.slots, INFERENCE, {
        "get": Op("The loaded child's slots (every caller's prompt: insiders only)",
                  params=MODEL_NAMED, who=Access.ADMIN.who)},
        engine="/slots"),
)
# fmt: on
def _endpoint(entry: Endpoint) -> Handler:
    """What Starlette calls for ``entry``: its handler, told its engine route if it has one."""
    if entry.engine is None:
        return cast(Handler, entry.handler)
    return openai.bound(cast(Forwarding, entry.handler), entry.engine)


class _ByMethod:
    """One path's handlers, each for its own methods (``HEAD`` is ``GET``'s): a path split over
    entries (``/v1/keys``: list and create) is one Starlette route, so a method it does not
    answer gets one 405 whose ``Allow`` names every method it does."""

    def __init__(self, entries: list[Endpoint]) -> None:
        self.apps: dict[str, ASGIApp] = {}
        for entry in entries:
            handler = _endpoint(entry)
            app = request_response(handler) if inspect.isfunction(handler) else handler
            for method in entry.methods:
                self.apps[method] = cast(ASGIApp, app)
        if "GET" in self.apps:
            self.apps.setdefault("HEAD", self.apps["GET"])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.apps[scope["method"]](scope, receive, send)  # Route checked the method


def _routes(endpoints: tuple[Endpoint, ...]) -> tuple[Route, ...]:
    """One Starlette route per path, answering each method an entry of that path declares."""
    by_path: dict[str, list[Endpoint]] = {}
    for entry in endpoints:
        by_path.setdefault(entry.path, []).append(entry)
    routes = []
    for path, entries in by_path.items():
        methods = [method for entry in entries for method in entry.methods]
        handler = _endpoint(entries[0]) if len(entries) == 1 else _ByMethod(entries)
        routes.append(Route(path, handler, methods=methods))
    return tuple(routes)


ROUTES = _routes(ENDPOINTS)
ACCESS = AccessMap((e.path, e.access) for e in ENDPOINTS)
PATHS = openapi.paths(ENDPOINTS)
OTHER_PROTOCOLS = frozenset(e.doc_path for e in ENDPOINTS if not e.json_api)


class _SessionRoutes:
    """The class a session's key must meet on a path (None: the cookie is no credential
    there): an exact path of an entry with ``session``, or a templated one's
    (``/v1/logs/{name}``) by its prefix."""

    def __init__(self, endpoints: tuple[Endpoint, ...]) -> None:
        marked = [(e.path, e.session) for e in endpoints if e.session is not None]
        self.exact = {path: access for path, access in marked if "{" not in path}
        self.prefixes = [
            (path[: path.index("{")], access) for path, access in marked if "{" in path
        ]

    def __call__(self, path: str) -> Access | None:
        found = self.exact.get(path)
        if found is not None:
            return found
        return next((access for prefix, access in self.prefixes if path.startswith(prefix)), None)


SESSION_ROUTES = _SessionRoutes(ENDPOINTS)


def is_inference(path: str) -> bool:
    """The engine's own routes outside ``/v1`` (``/tokenize``, ``/props``…) are inference
    too: they reach a child, so they meet the same key check as chat."""
    return ACCESS(path) is Access.INFERENCE
