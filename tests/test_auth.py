"""Keys and trust at the HTTP door, in-process, from every kind of peer."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from fitbox import cli, config
from fitbox.server.routes import ROUTES, is_inference

from .support.clients import app_client, make_key
from .support.ggufs import write_tiny_llama
from .support.paths import BOX

LOCAL, LAN, OUTSIDE = ("127.0.0.1", 5000), ("192.168.7.7", 5000), ("203.0.113.5", 5000)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    write_tiny_llama(tmp_path / "models" / "tiny.gguf")
    write_tiny_llama(tmp_path / "models" / "other.gguf")
    return tmp_path


def client(home: Path, peer: tuple[str, int], **settings: str) -> TestClient:
    cfg = config.load({"home": str(home), "models": str(home / "models"), **settings}, env={})
    return app_client(cfg, peer)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def error(response: Any, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()["error"]
    assert body["type"] == kind and set(body) >= {"message", "type", "code", "param"}
    return body


@pytest.fixture
def started(home: Path) -> Iterator[Path]:
    with client(home, LOCAL):
        pass  # the first start migrates the store and writes the box key
    yield home


def test_the_box_key_is_made_once_owner_only_and_works(started: Path) -> None:
    key_file = started / "box.key"
    first = key_file.read_text().strip()
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600 and first.startswith("fb_")
    with client(started, OUTSIDE) as outside:
        assert (
            outside.get("/v1/plan", params={"model": "tiny"}, headers=bearer(first)).status_code
            == 200
        )
    assert key_file.read_text().strip() == first  # a restart keeps it


def test_inference_from_outside_needs_a_key(started: Path) -> None:
    with client(started, OUTSIDE) as outside:
        refused = error(outside.get("/v1/models"), 401, "authentication_error")
        assert refused["code"] == "missing_api_key" and "203.0.113.5" in refused["message"]
        key = make_key(started, "inference")
        assert outside.get("/v1/models", headers=bearer(key)).status_code == 200
        assert outside.get("/v1/models", headers={"x-api-key": key}).status_code == 200
        # an SDK's placeholder is no key at all, not a wrong key
        assert outside.get("/v1/models", headers=bearer("sk-no-key")).status_code == 401


def test_a_trusted_network_may_infer_but_never_manage(started: Path) -> None:
    with client(started, LAN) as lan:
        assert lan.get("/v1/models").status_code == 200
        body = error(lan.get("/v1/plan", params={"model": "tiny"}), 401, "authentication_error")
        assert "admin key" in body["message"]
        inference = make_key(started, "inference")
        error(lan.get("/v1/keys", headers=bearer(inference)), 403, "permission_error")
        admin = make_key(started, "admin")
        assert lan.get("/v1/keys", headers=bearer(admin)).status_code == 200


def test_the_box_itself_manages_without_a_key(started: Path) -> None:
    with client(started, LOCAL) as local:
        created = local.post("/v1/keys", json={"name": "ci", "scopes": ["read"]})
        assert created.status_code == 201 and created.json()["key"].startswith("fb_")
        listed = local.get("/v1/keys").json()["data"]
        assert "key" not in listed[-1] and "digest" not in str(listed)  # secrets withheld
        error(local.post("/v1/keys", json={"scopes": ["root"]}), 400, "invalid_request_error")


def test_a_rebound_name_gets_nothing_from_the_box_without_a_key(started: Path) -> None:
    """A web page whose name DNS rebound to 127.0.0.1 sends its own name as Host: management,
    the dashboard and metrics refuse it without a key; the box's own names pass."""
    with client(started, LOCAL, host_names="fitbox.lan") as local:
        evil = {"Host": "evil.example"}
        for path in ("/v1/keys", "/", "/metrics", "/v1/telemetry/state"):
            body = error(local.get(path, headers=evil), 403, "permission_error")
            assert body["code"] == "host_not_allowed" and "FITBOX_HOST_NAMES" in body["message"]
        refused = local.post("/v1/keys", json={"name": "x"}, headers={"Host": "evil.example:80"})
        assert error(refused, 403, "permission_error")["param"] == "host"
        for host in (
            "127.0.0.1:8484",
            "localhost:8484",
            "[::1]:8484",
            "fitbox.lan:8484",
            "FITBOX.LAN",
            "app.localhost",
        ):
            assert local.get("/v1/keys", headers={"Host": host}).status_code == 200, host
        admin = make_key(started, "admin")  # a key decides for itself, whatever the Host
        assert local.get("/v1/keys", headers={**evil, **bearer(admin)}).status_code == 200
        assert local.get("/health", headers=evil).status_code == 200  # open stays open


# open to anyone, so no Host can matter: nothing of the box's is in them
PUBLIC = frozenset({"/health", "/openapi.json", "/login", "/logout"})  # no credential


def test_every_route_refuses_a_rebound_host_without_a_key(started: Path) -> None:
    """Each route family the app serves (management, telemetry, metrics, the dashboard and
    its events, the calls page, MCP), every method: a keyless call from the box itself
    under another name is refused at the door with an OpenAI-shaped 403, inference too
    (below). A route added later is checked here too, unless it is named PUBLIC."""
    checked = []
    with client(started, LOCAL) as local:
        for route in ROUTES:
            path = re.sub(r"\{[^}]+\}", "x", route.path)
            if path in PUBLIC or is_inference(path):
                continue
            for method in sorted((route.methods or set()) - {"HEAD"}):
                refused = local.request(method, path, headers={"Host": "evil.example"})
                body = error(refused, 403, "permission_error")
                assert body["code"] == "host_not_allowed", (method, path, body)
                assert "evil.example" in body["message"] or "host name" in body["message"]
                checked.append(f"{method} {path}")
        # inference too: a rebound page could read replies and start loads that evict
        for path in ("/v1/models", "/v1/chat/completions", "/props"):
            refused = local.request(
                "POST" if "chat" in path else "GET", path, headers={"Host": "evil.example"}, json={}
            )
            body = error(refused, 403, "permission_error")
            assert body["code"] == "host_not_allowed" and "evil.example" in body["message"]
        for own in ("127.0.0.1:8484", "localhost", socket.gethostname()):
            assert local.get("/v1/models", headers={"Host": own}).status_code == 200, own
        keyed = local.get(
            "/v1/models", headers={"Host": "evil.example", **bearer(make_key(started, "inference"))}
        )
        assert keyed.status_code == 200  # a key decides for itself, whatever the Host
    families = {
        "/v1/keys",
        "/v1/telemetry/state",
        "/metrics",
        "/",
        "/dashboard/events",
        "/calls",
        "/mcp",
        "/v1/operator/x",
        "/v1/settings/box",
        "/v1/transfer/x/file",
    }
    assert families <= {c.split(" ", 1)[1] for c in checked}


def test_a_rebound_host_is_no_insider(started: Path) -> None:
    """/slots holds every caller's prompts: a keyless call from the box itself sees it only
    under a Host naming the box (the door refuses any other before the insider rule)."""
    with client(started, LOCAL) as local:
        refused = error(
            local.get("/slots", params={"model": "no-such"}, headers={"Host": "evil.example"}),
            403,
            "permission_error",
        )
        assert refused["code"] == "host_not_allowed" and "FITBOX_HOST_NAMES" in refused["message"]
        # past the door and the insider rule, to the model lookup (no child is started)
        own = local.get("/slots", params={"model": "no-such"}, headers={"Host": "127.0.0.1:8484"})
        assert error(own, 404, "invalid_request_error")["code"] == "model_not_found"
        admin = make_key(started, "admin")  # a key decides for itself, whatever the Host
        keyed = local.get(
            "/slots", params={"model": "no-such"}, headers={"Host": "evil.example", **bearer(admin)}
        )
        assert error(keyed, 404, "invalid_request_error")["code"] == "model_not_found"


def test_another_page_cannot_change_the_box_without_a_key(started: Path) -> None:
    """A keyless POST that carries an Origin must come from the box's own origin."""
    with client(started, LOCAL) as local:
        for origin in ("http://evil.example", "http://127.0.0.1:3000", "null"):
            refused = local.post("/v1/keys", json={"name": "x"}, headers={"Origin": origin})
            body = error(refused, 403, "permission_error")
            assert body["code"] == "origin_not_allowed" and origin in body["message"]
        own = local.post(
            "/v1/keys", json={"name": "mine", "scopes": ["read"]}, headers={"Origin": BOX}
        )
        assert own.status_code == 201, own.text
        assert local.get("/v1/keys", headers={"Origin": "http://evil.example"}).status_code == 200
        admin = make_key(started, "admin")
        headers = {"Origin": "http://evil.example", **bearer(admin)}
        with_key = local.post("/v1/keys", json={"name": "y", "scopes": ["read"]}, headers=headers)
        assert with_key.status_code == 201


def test_forwarded_requests_from_an_untrusted_peer_are_outside(started: Path) -> None:
    with client(started, LOCAL) as local:
        spoofed = {"X-Forwarded-For": "127.0.0.1"}
        error(local.get("/v1/models", headers=spoofed), 401, "authentication_error")
        error(local.get("/v1/keys", headers=spoofed), 401, "authentication_error")
    with client(started, LOCAL, trusted_proxies="127.0.0.1") as proxied:
        assert proxied.get("/v1/models", headers={"X-Forwarded-For": "10.0.0.8"}).status_code == 200
        error(
            proxied.get("/v1/models", headers={"X-Forwarded-For": "203.0.113.1"}),
            401,
            "authentication_error",
        )


def test_revoked_and_expired_keys_fail_on_the_next_request(started: Path) -> None:
    key = make_key(started, "inference")
    soon = make_key(started, "inference", expires_at=time.time() + 1.0)
    with client(started, OUTSIDE) as outside, client(started, LOCAL) as local:
        assert outside.get("/v1/models", headers=bearer(key)).status_code == 200
        key_id = key.split("_")[1]
        assert local.delete(f"/v1/keys/{key_id}").json()["revoked_at"] is not None
        body = error(outside.get("/v1/models", headers=bearer(key)), 401, "authentication_error")
        assert key not in body["message"] and key_id not in body["message"]
        time.sleep(1.1)
        error(outside.get("/v1/models", headers=bearer(soon)), 401, "authentication_error")
        # a revoked key is refused even from a network that needs none
        error(local.get("/v1/models", headers=bearer(key)), 401, "authentication_error")
        forged = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
        error(outside.get("/v1/models", headers=bearer(forged)), 401, "authentication_error")


def test_keys_can_be_required_for_inference_everywhere(started: Path) -> None:
    with client(started, LOCAL, require_keys="true") as local:
        body = error(local.get("/v1/models"), 401, "authentication_error")
        assert "requires an API key" in body["message"]
        assert local.get("/v1/plan", params={"model": "tiny"}).status_code == 200  # still box


def test_a_key_limited_to_models_sees_and_uses_only_those(started: Path) -> None:
    key = make_key(started, "inference", models=("tiny",))
    with client(started, OUTSIDE) as outside:
        names = [m["id"] for m in outside.get("/v1/models", headers=bearer(key)).json()["data"]]
        assert names == ["tiny", "fitbox-helper"]  # the helper is no model a key limits
        refused = outside.post(
            "/v1/chat/completions",
            headers=bearer(key),
            json={"model": "other", "messages": [{"role": "user", "content": "x"}]},
        )
        assert error(refused, 403, "permission_error")["code"] == "model_not_allowed"


def test_health_stays_open(started: Path) -> None:
    with client(started, OUTSIDE) as outside:
        assert outside.get("/health").json()["status"] == "ok"


def test_a_damaged_key_row_never_breaks_a_listing_and_grants_nothing_new(
    started: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forever = make_key(started, "inference", expires_at=math.inf)  # what bodies let in before
    past, revoked, scrambled = (make_key(started, "inference") for _ in range(3))
    damage = [
        ("expires_at", -math.inf, past),
        ("revoked_at", "garbage", revoked),
        ("scopes", "not json", scrambled),
    ]
    with sqlite3.connect(started / "fitbox.sqlite3") as conn:
        for column, value, key in damage:
            conn.execute(
                f"UPDATE api_keys SET {column} = ? WHERE key_id = ?", (value, key.split("_")[1])
            )
    with client(started, LOCAL) as local, client(started, OUTSIDE) as outside:
        listed = local.get("/v1/keys")
        assert listed.status_code == 200, listed.text
        by_id = {k["id"]: k for k in listed.json()["data"]}
        stored = [by_id[k.split("_")[1]] for k in (forever, past, revoked, scrambled)]
        assert stored[0]["expires_at"] is None  # +Infinity meant no expiry
        assert stored[1]["expires_at"] == 0.0 and stored[2]["revoked_at"] == 0.0  # long past
        assert stored[3]["scopes"] == []
        rows = local.get("/v1/telemetry/rows", params={"table": "api_keys"})
        assert rows.status_code == 200 and len(rows.json()["rows"]) == len(by_id)
        assert outside.get("/v1/models", headers=bearer(forever)).status_code == 200
        for key in (past, revoked):
            error(outside.get("/v1/models", headers=bearer(key)), 401, "authentication_error")
        error(outside.get("/v1/models", headers=bearer(scrambled)), 403, "permission_error")
        assert local.get(f"/v1/keys/{stored[1]['id']}").status_code == 200
        assert local.delete(f"/v1/keys/{stored[0]['id']}").json()["revoked_at"] is not None
    capsys.readouterr()
    assert cli.main(["keys", "list", "--home", str(started), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))
    assert len(printed["data"]) == len(by_id)


LOG = ["srv  load_model: loading /home/me/models/tiny.gguf", "main: server is listening on :41234"]


@pytest.mark.parametrize(
    ("peer", "scopes", "sees"),
    [
        (LOCAL, None, True),  # the box itself
        (LOCAL, "box", True),
        (OUTSIDE, ("admin",), True),
        (OUTSIDE, ("inference",), False),
        (LOCAL, ("inference",), False),  # a key decides for itself, wherever it comes from
        (LAN, None, False),  # a trusted network may infer, not read the engine's log
    ],
    ids=["box-itself", "box-key", "admin", "inference", "inference-on-loopback", "trusted-lan"],
)
def test_engine_logs_reach_the_box_and_admins_never_inference_callers(
    started: Path,
    monkeypatch: pytest.MonkeyPatch,
    peer: tuple[str, int],
    scopes: tuple[str, ...] | str | None,
    sees: bool,
) -> None:
    from fitbox.errors import EngineFailed
    from fitbox.server.inference import openai

    async def failing(*args: object) -> None:
        raise EngineFailed("llama-server could not load 'tiny': it exited (1)", log_tail=LOG)

    monkeypatch.setattr(openai, "forward", failing)
    headers = {}
    if scopes == "box":
        headers = bearer((started / "box.key").read_text().strip())
    elif scopes is not None:
        headers = bearer(make_key(started, *scopes))
    with client(started, peer) as caller:
        response = caller.post(
            "/v1/chat/completions",
            headers=headers,
            json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]},
        )
    body = error(response, 502, "server_error")
    assert body["code"] == "engine_failed" and "could not load 'tiny'" in body["message"]
    assert ("log_tail" in body) is sees and (":41234" in response.text) is sees
    if not sees:
        assert "admin keys" in body["message"]  # where the log can be had


def test_a_stream_that_fails_mid_way_withholds_the_log_from_outsiders() -> None:
    import asyncio

    from fitbox.errors import EngineFailed
    from fitbox.server.inference import openai

    class Failing:
        endpoint, lease = "/v1/completions", None
        resident = SimpleNamespace(artifact=SimpleNamespace(name="tiny"))

        def __init__(self) -> None:
            self.stamps: dict[str, float | None] = {"received_at": 0.0}  # Server-Timing's

        async def relay(self, response: object) -> Any:
            yield b"data: {}\n\n"
            raise EngineFailed("llama-server serving 'tiny' failed mid-call", log_tail=LOG)

        async def finished(self) -> None:  # the error event is the last byte: nothing to wait
            return None

    async def events(insider: bool) -> bytes:
        async def count() -> int | None:
            return None

        chunks = openai._sse(Failing(), None, insider, count)  # type: ignore[arg-type]
        return b"".join([c async for c in chunks])

    outsider, inside = asyncio.run(events(False)), asyncio.run(events(True))
    assert b"log_tail" not in outsider and b"failed mid-call" in outsider
    assert b":41234" in inside and outsider.endswith(b"data: [DONE]\n\n")


def test_a_trusted_proxy_s_forwarding_is_judged_once_by_fitbox_in_the_real_server(
    home: Path,
) -> None:
    """``fitbox serve`` through uvicorn: uvicorn's own proxy-headers middleware (on by
    default, believing 127.0.0.1) would put the forwarded client in place of the proxy
    before fitbox's door looked, and the door would then find a forwarded request from a
    peer that is no trusted proxy: a LAN client behind a trusted proxy on the box refused."""
    from .support.processes import start_fitbox, stop_fitbox

    box = start_fitbox(
        home / "served", [home / "models"], env={"FITBOX_TRUSTED_PROXIES": "127.0.0.1"}
    )
    try:
        lan = httpx.get(f"{box.url}/v1/models", headers={"X-Forwarded-For": "10.0.0.8"})
        assert lan.status_code == 200, lan.text
        outside = httpx.get(f"{box.url}/v1/models", headers={"X-Forwarded-For": "203.0.113.1"})
        error(outside, 401, "authentication_error")
    finally:
        stop_fitbox(box)
