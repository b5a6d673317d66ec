"""Fuzz the whole HTTP surface from its own OpenAPI document (an in-process equivalent of
schemathesis): every path and method, with generated bodies, query strings, headers and
keys, from the box itself and from outside. fitbox itself never answers 5xx here (no engine
is launched: the RAM cap refuses every load), and every error is an OpenAI error body."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from fitbox import config
from fitbox.server.app import create_app
from fitbox.server.openapi import PATHS

from .ggufs import write_tiny_llama

CASES = {"count": 0}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=4),
    max_leaves=12,
)  # fmt: skip
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
bodies = st.one_of(
    st.dictionaries(field_names, json_values | st.just("tiny"), max_size=5).map(json.dumps),
    json_values.map(json.dumps),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)
queries = st.dictionaries(st.sampled_from(["model", "ctx", "parallel", "kv", "x"]),
                          st.text(max_size=12) | st.just("tiny"), max_size=4)  # fmt: skip
keys = st.sampled_from([None, "sk-no-key", "fb_", "fb_000000000000_" + "A" * 43, "Bearer"])
peers = st.sampled_from([("127.0.0.1", 1), ("203.0.113.9", 1), ("10.0.0.2", 1)])
routes = [(path, method) for path, ops in PATHS.items() for method in ops]
fillers = st.sampled_from(["tiny", "nope", "load", "unload", "pin", "x" * 300, "..%2F", "0"])


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("fuzz")
    (home / "models").mkdir()
    write_tiny_llama(home / "models" / "tiny.gguf")
    yield home
    print(f"\nfuzzed the surface with {CASES['count']} generated requests")


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
    cfg = config.load({"home": str(home), "models": str(home / "models"), "ram_max": "1MiB"},
                      env={})  # fmt: skip
    with TestClient(create_app(cfg), client=peer, raise_server_exceptions=False) as client:
        kwargs: dict[str, Any] = {"params": query, "headers": headers}
        if method in ("post", "put"):
            kwargs["content"] = body.encode("utf-8", "surrogateescape")
        response = client.request(method.upper(), path, **kwargs)
    CASES["count"] += 1
    assert response.status_code < 500 or response.status_code == 507, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert {"message", "type", "code", "param"} <= set(error)
        assert isinstance(error["code"], str) and error["message"]
