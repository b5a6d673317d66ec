"""Fuzz the whole HTTP surface from its own OpenAPI document (an in-process equivalent of
schemathesis): every path and method, with generated bodies, query strings, headers and
keys, from the box itself and from outside. fitbox itself never answers 5xx here (no engine
is launched: the RAM cap refuses every load), and every error is an OpenAI error body.
Hostile bodies too: nesting thousands deep, NaN and Infinity, numbers past the digit limit,
lone surrogates (escaped and raw), bodies over the limit. The store is shared by every
case, so a row one case writes (a key that expires at Infinity) must not break another."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from fitbox import config
from fitbox.server.app import create_app
from fitbox.server.routes import OTHER_PROTOCOLS, PATHS

from .support.ggufs import write_tiny_llama
from .support.paths import BOX

CASES = {"count": 0}
MAX_BODY = 64 << 10  # FITBOX_MAX_BODY here: oversized bodies stay cheap to make
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])  # json.dumps writes NaN, Infinity
lone_surrogates = st.text(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | non_finite
    | lone_surrogates,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
field_names = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "input",
        "stream",
        "max_tokens",
        "name",
        "scopes",
        "models",
        "expires_in_s",
        "tiny",
        "",
    ]
)


def _nested(depth: int, kind: str) -> str:
    if kind == "object":
        return '{"a": ' * depth + "1" + "}" * depth
    return "[" * depth + ("]" * depth if kind == "array" else "")  # "open": never closed


hostile = st.one_of(
    st.builds(_nested, st.integers(200, 6000), st.sampled_from(["array", "object", "open"])),
    st.builds(
        lambda field, number: f'{{"model": "tiny", "messages": [], "{field}": {number}}}',
        field_names,
        st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "7" * 5000]),
    ),
    lone_surrogates.map(lambda s: f'{{"model": "{s}", "messages": [], "input": "x"}}'),  # raw
    st.integers(1, 4096).map(lambda extra: " " * (MAX_BODY + extra)),
)
bodies = st.one_of(
    st.dictionaries(field_names, json_values | st.just("tiny"), max_size=5).map(json.dumps),
    json_values.map(json.dumps),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    hostile,
)
queries = st.dictionaries(
    st.sampled_from(["model", "ctx", "parallel", "kv", "x"]),
    st.text(max_size=12) | st.just("tiny"),
    max_size=4,
)
keys = st.sampled_from([None, "sk-no-key", "fb_", "fb_000000000000_" + "A" * 43, "Bearer"])
peers = st.sampled_from([("127.0.0.1", 1), ("203.0.113.9", 1), ("10.0.0.2", 1)])
routes = [
    (path, method) for path, ops in PATHS.items() for method in ops if path not in OTHER_PROTOCOLS
]  # tested by their own (test_mcp_e2e, test_dashboard_e2e)
fillers = st.sampled_from(["tiny", "nope", "load", "unload", "pin", "x" * 300, "..%2F", "0"])


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("fuzz")
    (home / "models").mkdir()
    write_tiny_llama(home / "models" / "tiny.gguf")
    yield home
    print(f"\nfuzzed the surface with {CASES['count']} generated requests")


def _app(home: Path) -> Any:
    cfg = config.load(
        {"home": str(home), "models": str(home / "models"), "ram_max": "1MiB"},
        env={"FITBOX_MAX_BODY": str(MAX_BODY)},
    )
    return create_app(cfg)


def _well_shaped(response: Any) -> None:
    assert response.status_code < 500 or response.status_code == 507, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert {"message", "type", "code", "param"} <= set(error)
        assert isinstance(error["code"], str) and error["message"]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route=st.sampled_from(routes),
    body=bodies,
    query=queries,
    key=keys,
    peer=peers,
    filler=fillers,
    content_type=st.sampled_from(["application/json", "text/plain", ""]),
)
def test_no_5xx_and_every_error_is_an_openai_body(
    home: Path,
    route: tuple[str, str],
    body: str,
    query: dict[str, str],
    key: str | None,
    peer: tuple[str, int],
    filler: str,
    content_type: str,
) -> None:
    path, method = route
    path = path.replace("{action}", filler).replace("{key_id}", filler)
    headers = {"content-type": content_type} if content_type else {}
    if key:
        headers["authorization"] = f"Bearer {key}"
    with TestClient(_app(home), base_url=BOX, client=peer, raise_server_exceptions=False) as client:
        kwargs: dict[str, Any] = {"params": query, "headers": headers}
        if method in ("post", "put"):
            kwargs["content"] = body.encode("utf-8", "surrogatepass")  # surrogates raw
        response = client.request(method.upper(), path, **kwargs)
    CASES["count"] += 1
    _well_shaped(response)


posts = [path for path, method in routes if method == "post"]
reading = st.sampled_from(["load", "unload", "pin", "unpin", "clear-failed"])  # take a body


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.sampled_from(posts),
    case=st.tuples(st.just(True), hostile)
    | st.tuples(
        st.just(False), st.dictionaries(field_names, json_values, max_size=5).map(json.dumps)
    ),
    action=reading,
)
def test_hostile_bodies_from_the_box_itself_are_4xx_and_break_nothing_after(
    home: Path, path: str, case: tuple[bool, str], action: str
) -> None:
    """From the box itself, with no key, every body reaches the parser: a hostile one is
    refused (400, or 413 over the limit), and whatever was stored lists afterwards."""
    is_hostile, body = case
    with TestClient(
        _app(home), base_url=BOX, client=("127.0.0.1", 1), raise_server_exceptions=False
    ) as client:
        response = client.post(
            path.replace("{action}", action), content=body.encode("utf-8", "surrogatepass")
        )
        listed = client.get("/v1/keys")
    CASES["count"] += 1
    _well_shaped(response)
    if is_hostile:
        assert response.status_code in (400, 413), response.text
    assert listed.status_code == 200, listed.text
