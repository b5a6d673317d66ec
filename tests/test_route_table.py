"""The route table (server/routes.py) is the one declaration of a route: every route the app
serves has an access class and an OpenAPI operation for each of its methods, the door and
/openapi.json read the same table, the user guide (docs/guide/) names every route, and every
route a child answers is one an engine kind serves (and the other way round)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from starlette.routing import BaseRoute, Route

from fitbox.central.app import ROUTES as CENTRAL_ROUTES
from fitbox.engines import llama_server, tf
from fitbox.engines.task_runners import RUNNERS
from fitbox.server.door.auth import Access
from fitbox.server.routes import ACCESS, ENDPOINTS, PATHS, ROUTES, SESSION_ROUTES, Endpoint
from fitbox.server.views.mcp_tools import MIRRORED, build
from fitbox.server.views.openapi import spec

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide"


def guide_text() -> str:
    """The hand-written guide, every page (the reference pages are generated from the table)."""
    return "\n".join(page.read_text() for page in sorted(GUIDE.glob("*.md")))


def undeclared(routes: Iterable[BaseRoute], endpoints: Sequence[Endpoint]) -> list[str]:
    """Each ``METHOD path`` the app serves that no entry of ``endpoints`` gives an access
    class and an OpenAPI operation."""
    documented = {
        (e.path, method.upper()): e
        for e in endpoints
        for method in e.ops
        if isinstance(e.access, Access)
    }
    missing = []
    for route in routes:
        assert isinstance(route, Route), route
        for method in sorted((route.methods or set()) - {"HEAD"}):
            entry = documented.get((route.path, method))
            if entry is None or method.lower() not in spec([entry])["paths"][entry.doc_path]:
                missing.append(f"{method} {route.path}")
    return missing


async def _nothing(request: object) -> None:
    return None


def test_every_route_has_an_access_class_and_an_operation() -> None:
    assert undeclared(ROUTES, ENDPOINTS) == []
    assert len(ROUTES) == len({e.path for e in ENDPOINTS})  # one route a path


def test_a_route_the_table_does_not_declare_is_named() -> None:
    """The check above can fail: a route added beside the table, or a method an entry has
    no operation for, is named."""
    stray = Route("/v1/stray", _nothing, methods=["GET"])
    chat = next(e for e in ENDPOINTS if e.path == "/v1/chat/completions")
    extra_method = Route(chat.path, _nothing, methods=["POST", "DELETE"])
    assert undeclared([*ROUTES, stray, extra_method], ENDPOINTS) == [
        "GET /v1/stray",
        "DELETE /v1/chat/completions",
    ]


def test_the_door_and_the_document_read_the_table() -> None:
    for entry in ENDPOINTS:
        concrete = re.sub(r"\{[^}]+\}", "x", entry.path)
        assert ACCESS(concrete) is entry.access, entry.path
        for method, op in entry.ops.items():
            operation = PATHS[entry.doc_path][method]
            assert operation["summary"] == op.summary
            assert operation["description"] == f"Access: {op.who or entry.who}."
        # a signed-in browser's cookie counts exactly where the table says, as it says
        assert SESSION_ROUTES(concrete) is entry.session, entry.path
    # entries of one path agree on who may call it (the door decides by path)
    by_path: dict[str, set[Access]] = {}
    for entry in ENDPOINTS:
        by_path.setdefault(entry.path, set()).add(entry.access)
    assert all(len(found) == 1 for found in by_path.values()), by_path


def test_paths_no_route_has_meet_their_family_s_door() -> None:
    assert ACCESS("/v1/telemetry/nothing") is Access.READ
    assert ACCESS("/metrics/nothing") is Access.READ
    assert ACCESS("/v1/nothing") is Access.ADMIN
    assert ACCESS("/v1/models/a/b") is Access.INFERENCE
    assert ACCESS("/nothing") is None  # the router's 404, no door


def test_the_guide_names_every_route() -> None:
    readme = guide_text()
    missing = [e.doc_path for e in ENDPOINTS if f"`{e.doc_path}" not in readme]
    missing = [
        p for p in missing if not re.search(rf"`(GET|POST|DELETE)[^`]* {re.escape(p)}", readme)
    ]
    assert missing == [], f"docs/guide/ does not name these routes: {missing}"


def test_the_guide_names_no_route_the_table_lacks() -> None:
    """Every ``METHOD /path`` the guide writes is a route of the table (or of the central's
    own app, which the guide describes beside the box)."""
    readme = guide_text()
    named = re.findall(r"`(?:GET|POST|DELETE)(?:\|POST)? (/[^`\s\[?]*)", readme)
    known = {e.doc_path for e in ENDPOINTS} | {r.path for r in CENTRAL_ROUTES}
    templated = [re.compile(re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(p)) + "$") for p in known]
    unknown = [p for p in named if p not in known and not any(t.match(p) for t in templated)]
    assert unknown == [], f"docs/guide/ names routes the table does not have: {unknown}"


def test_every_engine_route_is_one_an_engine_kind_serves_and_back() -> None:
    served = llama_server.ROUTES | tf.ROUTES | {r for spec in RUNNERS for r in spec.routes}
    forwarded = {e.engine for e in ENDPOINTS if e.engine is not None}
    assert forwarded <= served, forwarded - served
    assert served <= forwarded, served - forwarded
    assert all(e.access is Access.INFERENCE for e in ENDPOINTS if e.engine is not None)


def test_each_mcp_tool_mirrors_a_route_of_the_table() -> None:
    """A tool is admitted as the route it mirrors: that route must be one the door knows."""
    build()
    assert MIRRORED
    for route in MIRRORED:
        entry = next(
            e for e in ENDPOINTS if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", e.path), route)
        )
        assert ACCESS(route) is entry.access, route
