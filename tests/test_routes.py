"""The routes' parts without an engine: engine error bodies, the asked name in replies, the
end of Responses/Messages streams, CORS settings, and the new routes' keys and refusals
in-process. The real engine's side is tests/test_compat_e2e.py."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config
from fitbox.box.calls import stream_ended, stream_error, usage_of
from fitbox.models.gguf_facts import read_facts
from fitbox.server.inference.engine_errors import (
    client_status,
    engine_error_body,
    retry_cannot_help,
)
from fitbox.server.streams.names import NameRewrite, rewrite_for
from fitbox.server.streams.reshape import Pass
from fitbox.store.keys import create_key

from .support import clients
from .support.ggufs import write_tiny_llama

OVERFLOW = (
    b'{"error":{"code":400,"message":"request (431 tokens) exceeds the available context size '
    b'(256 tokens), try increasing it","type":"exceed_context_size_error",'
    b'"n_prompt_tokens":431,"n_ctx":256}}'
)  # what this llama-server build answered (seen running it)
NO_EMBEDDINGS = (
    b'{"error":{"code":501,"message":"This server does not support embeddings. Start it with '
    b'`--embeddings`","type":"not_supported_error"}}'
)


# -- engine errors -------------------------------------------------------------------------


def test_an_engine_error_keeps_its_type_and_numbers_in_the_envelope() -> None:
    error = engine_error_body(400, OVERFLOW, "smol")["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["code"] == "context_length_exceeded"  # OpenAI's code, a string
    assert (error["n_prompt_tokens"], error["n_ctx"]) == (431, 256)
    assert error["param"] is None and "431 tokens" in error["message"]


def test_an_engine_error_that_is_not_json_or_has_nested_fields() -> None:
    error = engine_error_body(502, b"<html>bad gateway</html>", "smol")["error"]
    assert error["message"] == "<html>bad gateway</html>" and error["code"] == "engine_http_502"
    assert error["type"] == "server_error"
    nested = b'{"error":{"message":"x","type":"t","code":"c","slot":{"id":1},"n":2}}'
    error = engine_error_body(400, nested, "smol")["error"]
    assert "slot" not in error and error["n"] == 2 and error["code"] == "c"


def test_an_unserved_route_names_the_model_not_the_engines_flag() -> None:
    body = engine_error_body(501, NO_EMBEDDINGS, "smol")
    error = body["error"]
    assert error["message"].startswith("'smol' is not an embeddings model on this box")
    # the client named a chat model for embeddings: its mistake, a 400 naming the mismatch
    assert error["type"] == "invalid_request_error" and error["param"] == "model"
    assert error["code"] == "not_an_embeddings_model"
    assert client_status(501, body) == 400


def test_an_engine_501_that_names_no_model_mismatch_stays_501() -> None:
    unknown = b'{"error":{"code":501,"message":"no such thing","type":"not_supported_error"}}'
    body = engine_error_body(501, unknown, "smol")
    assert body["error"]["type"] == "not_supported_error"
    assert client_status(501, body) == 501


@pytest.mark.parametrize(
    ("status", "hopeless"),
    [
        (400, True),
        (404, True),
        (413, True),
        (408, False),
        (409, False),
        (429, False),
        (500, False),
        (501, True),
        (503, False),
    ],
)
def test_which_statuses_a_retry_cannot_fix(status: int, hopeless: bool) -> None:
    assert retry_cannot_help(status) is hopeless


# -- names in replies ------------------------------------------------------------------


def test_the_asked_name_replaces_the_served_one_across_chunk_boundaries() -> None:
    rewrite = NameRewrite("Smol.Q4_1", "smollm2")
    events = (
        b'data: {"id":"1","model":"Smol.Q4_1","choices":[]}\n\n'
        b'data: {"model":"Smol.Q4_1","content":"\\"model\\":\\"Smol.Q4_1\\""}\n\n'
        b"data: [DONE]\n\n"
    )
    for cut in range(1, len(events)):
        one = Pass([], rewrite)  # the pass over whole events (server/streams/reshape.py)
        out = one.feed(events[:cut]) + one.feed(events[cut:]) + one.finish()
        assert out.count(b'"model":"smollm2"') == 2, cut
        assert b'\\"model\\":\\"Smol.Q4_1\\"' in out  # text the model wrote stays
    one = Pass([], rewrite)
    assert one.feed(b'data: {"model":"Smol.Q4_1"}') == b""  # an event waits for its end
    assert one.finish() == b'data: {"model":"smollm2"}'
    assert rewrite_for("x", "x") is None


def test_a_whole_reply_gets_the_asked_name() -> None:
    body = json.dumps(
        {"model": "Smol.Q4_1", "object": "chat.completion"}, separators=(",", ":")
    ).encode()
    assert json.loads(NameRewrite("Smol.Q4_1", "gpt-4o-mini").whole(body))["model"] == (
        "gpt-4o-mini"
    )


def test_responses_and_messages_streams_end_at_their_last_event() -> None:
    completed = b'event: response.completed\ndata: {"type":"response.completed"}\n\n'
    assert stream_ended(b"event: response.output_text.done\ndata: {}\n\n" + completed)
    assert stream_ended(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert not stream_ended(completed[:-2])  # the event's blank line has not come
    assert not stream_ended(b'event: message_delta\ndata: {"type":"message_delta"}\n\n')
    assert stream_ended(b"data: {}\n\ndata: [DONE]\n\n")
    usage = usage_of(b'"usage":{"input_tokens":31,"output_tokens":4,"total_tokens":35}')
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (31, 4)


def test_a_stream_the_engine_ended_with_its_error_event_is_that_error() -> None:
    """llama-server's server-context.cpp ends a stream it cannot go on with one error event
    and no [DONE]: ``format_oai_sse({"error": ...})``, or ``event: error`` for Anthropic's."""
    chunk = b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
    oai = chunk + b"data: " + OVERFLOW + b"\n\n"
    assert stream_error(oai) == (400, "exceed_context_size_error")
    error = b'{"code":500,"message":"Context size has been exceeded.","type":"server_error"}'
    anthropic = b"event: content_block_delta\ndata: {}\n\nevent: error\ndata: " + error + b"\n\n"
    assert stream_error(anthropic) == (500, "server_error")
    assert stream_error(chunk + b"data: [DONE]\n\n") is None
    assert stream_error(chunk) is None and stream_error(b"") is None
    assert stream_error(b'data: {"error": "not an object"}\n\n') is None


# -- settings --------------------------------------------------------------------------


def test_cors_any_origin_needs_keys_for_every_call() -> None:
    with pytest.raises(config.ConfigError, match=r"FITBOX_CORS_ORIGINS.*FITBOX_REQUIRE_KEYS"):
        config.load({"cors_origins": "*"}, env={})
    assert config.load({"cors_origins": "*", "require_keys": "true"}, env={}).cors_origins == ("*",)
    listed = config.load({"cors_origins": "http://a.example, https://b.example/"}, env={})
    assert listed.cors_origins == ("http://a.example", "https://b.example")
    with pytest.raises(config.ConfigError, match=r"'cors_origins'.*not one"):
        config.load({"cors_origins": "a.example"}, env={})
    defaults = config.load({}, env={})
    assert defaults.cors_origins == () and defaults.default_model == ""


# -- in-process: keys, refusals, models ---------------------------------------------------

LOCAL, LAN, OUTSIDE = ("127.0.0.1", 5000), ("192.168.7.7", 5000), ("203.0.113.5", 5000)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    write_tiny_llama(tmp_path / "models" / "tiny.Q8_0.gguf")
    (tmp_path / "aliases.toml").write_text('[aliases]\nlittle = "tiny.Q8_0"\n')
    return tmp_path


def app_client(home: Path, peer: tuple[str, int], **settings: str) -> TestClient:
    cfg = config.load(
        {
            "home": str(home),
            "models": str(home / "models"),
            "ram_max": "1MiB",
            "aliases": str(home / "aliases.toml"),
            **settings,
        },
        env={},
    )
    return clients.app_client(cfg, peer)


@pytest.fixture
def local(home: Path) -> Iterator[TestClient]:
    with app_client(home, LOCAL) as test_client:
        yield test_client


def error_of(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()["error"]
    assert set(body) >= {"message", "type", "code", "param"} and body["code"] == code
    return body


def test_the_engines_routes_outside_v1_need_a_key_from_outside(home: Path) -> None:
    with app_client(home, OUTSIDE) as outside:
        for path in ("/tokenize", "/detokenize", "/apply-template", "/infill", "/rerank"):
            error_of(outside.post(path, json={"model": "tiny.Q8_0"}), 401, "missing_api_key")
        error_of(outside.get("/props", params={"model": "tiny.Q8_0"}), 401, "missing_api_key")
        error_of(outside.get("/v1/models/tiny.Q8_0"), 401, "missing_api_key")


def test_slots_are_for_insiders(home: Path) -> None:
    with app_client(home, LOCAL):
        pass  # migrates the store
    with sqlite3.connect(home / "fitbox.sqlite3") as conn:
        key = create_key(conn, "t", ("inference",), None, None)[1]
    with app_client(home, LAN) as lan:
        refused = error_of(lan.get("/slots", params={"model": "tiny.Q8_0"}), 403, "insider_only")
        assert "admin key" in refused["message"]
        keyed = lan.get(
            "/slots", params={"model": "tiny.Q8_0"}, headers={"Authorization": f"Bearer {key}"}
        )
        error_of(keyed, 403, "insider_only")


def test_a_route_without_its_model_is_refused_and_recorded(home: Path) -> None:
    with app_client(home, LOCAL) as local:
        missing = error_of(local.get("/props"), 400, "invalid_request")
        assert missing["param"] == "model" and "/props?model=NAME" in missing["message"]
        error_of(local.post("/tokenize", json={"content": "hi"}), 400, "invalid_request")
        no_max = {"model": "tiny.Q8_0", "messages": []}
        error_of(local.post("/v1/messages", json=no_max), 400, "invalid_request")
    with sqlite3.connect(home / "fitbox.sqlite3") as conn:  # written whole at the close
        rows = conn.execute("SELECT endpoint, error_code FROM call_log").fetchall()
    assert ("/props", "invalid_request") in rows and ("/tokenize", "invalid_request") in rows


def test_a_new_route_is_placed_like_chat(local: TestClient) -> None:
    """1 MiB of RAM holds no model: the same refusal chat gets, with its numbers."""
    for path, body in (("/v1/responses", {"input": "hi"}), ("/tokenize", {"content": "hi"})):
        refused = error_of(
            local.post(path, json={"model": "tiny.Q8_0", **body}), 507, "does_not_fit"
        )
        assert refused["available_bytes"] == 1 << 20


def test_model_retrieve_by_name_alias_and_family(local: TestClient, home: Path) -> None:
    facts = read_facts(home / "models" / "tiny.Q8_0.gguf")
    for name in ("tiny.Q8_0", "little", "tiny"):
        found = local.get(f"/v1/models/{name}")
        assert found.status_code == 200 and found.json()["id"] == name
        assert found.headers["x-fitbox-model"] == "tiny.Q8_0"
        meta = found.json()["meta"]
        assert meta["n_ctx"] is None  # not resident: no window is held
        assert meta["n_params"] == facts.n_params > 0
        assert (meta["n_ctx_train"], meta["n_vocab"]) == (
            facts.shape.n_ctx_train,
            facts.shape.n_vocab,
        )
    missing = error_of(local.get("/v1/models/gpt-4o-mini"), 404, "model_not_found")
    assert missing["type"] == "invalid_request_error" and "GET /v1/models" in missing["message"]
    listed = local.get("/v1/models").json()["data"]
    assert listed[0]["meta"]["size"] == facts.shape.weights_bytes


def test_cors_is_off_by_default(local: TestClient) -> None:
    preflight = local.options(
        "/v1/chat/completions",
        headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 405 and "access-control-allow-origin" not in preflight.headers


def test_a_preflight_needs_no_key_when_keys_are_required(home: Path) -> None:
    with app_client(home, OUTSIDE, cors_origins="*", require_keys="true") as outside:
        preflight = outside.options(
            "/v1/chat/completions",
            headers={
                "Origin": "http://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "*"
        refused = outside.post(
            "/v1/chat/completions", json={}, headers={"Origin": "http://app.example"}
        )
        error_of(refused, 401, "missing_api_key")
        assert refused.headers["access-control-allow-origin"] == "*"  # the page can read why
        # and where the time went: Server-Timing is on the refusal and exposed to the page
        assert refused.headers["server-timing"].startswith("total;dur=")
        assert "server-timing" in refused.headers["access-control-expose-headers"].lower()


def test_the_default_model_stands_in_only_for_unknown_names(home: Path) -> None:
    with app_client(home, LOCAL, default_model="little") as local:
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}
        # it reached the default model: 1 MiB of RAM does not hold it
        error_of(local.post("/v1/chat/completions", json=body), 507, "does_not_fit")
    with app_client(home, LOCAL) as local:
        error_of(local.post("/v1/chat/completions", json=body), 404, "model_not_found")
    with app_client(home, LOCAL, default_model="gone") as local:
        missing = error_of(local.post("/v1/chat/completions", json=body), 404, "model_not_found")
        assert "'gpt-4o-mini'" in missing["message"] and "'gone'" in missing["message"]


def test_a_route_the_models_engine_kind_lacks_is_refused_before_loading() -> None:
    """A recording stand-in for the box's parts: one artifact whose engine kind serves chat
    only (the name as the call resolved it when it opened)."""
    from types import SimpleNamespace

    from fitbox.box.serving import check_served
    from fitbox.errors import EngineEnvBuilding, InvalidRequest, RouteNotServed

    kind = SimpleNamespace(
        name="a-chat-engine",
        routes=lambda: frozenset({"/v1/chat/completions"}),
        unavailable=lambda: None,
    )
    artifact = SimpleNamespace(facts=SimpleNamespace(is_reranker=False, is_embedding=False))
    named: Any = SimpleNamespace(asked="m", artifacts=(artifact,))
    engines: Any = SimpleNamespace(for_artifact=lambda a: kind)
    check_served(named, "/v1/chat/completions", engines)
    with pytest.raises(RouteNotServed, match="a-chat-engine, which does not serve /tokenize"):
        check_served(named, "/tokenize", engines)
    kind.routes = lambda: frozenset({"/v1/rerank"})
    with pytest.raises(InvalidRequest, match="not a reranker"):
        check_served(named, "/v1/rerank", engines)
    # an engine whose environment is being built: refused as its own error, nothing placed
    kind.routes = lambda: frozenset({"/v1/audio/speech"})
    kind.unavailable = lambda: EngineEnvBuilding("being built", retry_after=30)
    with pytest.raises(EngineEnvBuilding, match="being built"):
        check_served(named, "/v1/audio/speech", engines)
