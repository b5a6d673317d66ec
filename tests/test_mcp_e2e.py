"""MCP at /mcp on a real fitbox serving SmolLM2 on the real engine, exercised with the
official SDK's own client over Streamable HTTP: every tool, a failing tool as a readable
result, the scopes of the HTTP API (an inference key may list models, not load them), and
the door refusing the outside without a key.

fitbox listens on 127.0.0.2; a client bound to 127.0.0.3 is not the box itself."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SERVER, CLIENT = "127.0.0.2", "127.0.0.3"
SMOL = "SmolLM2-135M-Instruct.Q4_1"
TOOLS = {
    "list_models",
    "residents",
    "queue",
    "plan",
    "load",
    "unload",
    "recent_calls",
    "box_limits",
}


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path
) -> Iterator[FitboxProcess]:
    home = tmp_path_factory.mktemp("mcp") / "home"
    # 127.0.0.3 is outside every trusted network here: the door asks it for a key
    env = {"FITBOX_TRUSTED_NETWORKS": "10.99.0.0/16"}
    with running_fitbox(home, [smollm2.parent], "--host", SERVER, env=env) as running:
        yield running


class Result:
    def __init__(self, is_error: bool, text: str) -> None:
        self.is_error, self.text = is_error, text

    def json(self) -> Any:
        found = json.loads(self.text)
        listing = isinstance(found, dict) and found.get("object") == "list"
        return found["data"] if listing else found


def run_tools(
    box: FitboxProcess,
    calls: list[tuple[str, dict[str, Any]]],
    key: str | None = None,
    outside: bool = False,
) -> tuple[set[str], list[Result]]:
    """The tools listed, and each call's result, in one MCP session."""

    async def session() -> tuple[set[str], list[Result]]:
        transport = httpx2.AsyncHTTPTransport(local_address=CLIENT) if outside else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with (
            httpx2.AsyncClient(headers=headers, transport=transport, timeout=120) as http,
            streamable_http_client(f"{box.url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as client,
        ):
            await client.initialize()
            listed = {tool.name for tool in (await client.list_tools()).tools}
            results = []
            for name, arguments in calls:
                found = await client.call_tool(name, arguments)
                text = "".join(getattr(part, "text", "") for part in found.content)
                results.append(Result(bool(found.is_error), text))
            return listed, results

    return asyncio.run(session())


def test_every_tool_from_the_box_itself(box: FitboxProcess) -> None:
    listed, results = run_tools(
        box,
        [
            ("list_models", {}),
            ("plan", {"model": "smollm2", "window": 2048}),
            ("load", {"model": "smollm2"}),
            ("residents", {}),
            ("queue", {}),
            ("recent_calls", {"limit": 5}),
            ("box_limits", {}),
            ("unload", {"model": "smollm2"}),
            ("residents", {}),
        ],
    )
    assert listed == TOOLS
    assert not [r.text for r in results if r.is_error]
    models, plan, loaded, residents, queue, calls, limits, unloaded, after = results
    assert SMOL in {m["id"] for m in models.json()}
    assert plan.json()["model"] == SMOL and plan.json()["window"] == 2048
    assert loaded.json()["resident"]["state"] == "ready"
    assert [(r["model"], r["state"]) for r in residents.json()] == [(SMOL, "ready")]
    assert queue.json() == []
    assert isinstance(calls.json(), list)
    assert {t["resource"] for t in limits.json()} >= {"ram", "cores"}
    assert unloaded.json()["action"] == "unload"
    assert after.json() == []
    # the operator actions are recorded as the HTTP ones are
    actions = httpx.get(f"{box.url}/v1/telemetry", params={"table": "operator_actions"}).json()
    assert [(a["action"], a["outcome"]) for a in actions["rows"]][-2:] == [
        ("load", "ok"),
        ("unload", "ok"),
    ]


def test_a_failing_tool_is_a_readable_result(box: FitboxProcess) -> None:
    _, (plan, unload, limit) = run_tools(
        box,
        [
            ("plan", {"model": "no-such-model"}),
            ("unload", {"model": "no-such-model"}),
            ("recent_calls", {"limit": 0}),
        ],
    )
    assert plan.is_error and "model_not_found: " in plan.text
    assert "no-such-model" in plan.text
    assert unload.is_error and "model_not_found: " in unload.text
    assert limit.is_error and "'limit' must be within 1..200" in limit.text


def test_the_scopes_of_the_http_api(box: FitboxProcess) -> None:
    made = httpx.post(f"{box.url}/v1/keys", json={"name": "agent", "scopes": ["inference"]})
    inference_key = made.json()["key"]
    _, (models, load, residents) = run_tools(
        box,
        [
            ("list_models", {}),
            ("load", {"model": "smollm2"}),
            ("residents", {}),
        ],
        key=inference_key,
        outside=True,
    )
    assert not models.is_error and SMOL in {m["id"] for m in models.json()}
    assert load.is_error and "insufficient_scope: " in load.text
    assert "admin" in load.text
    assert residents.is_error and "insufficient_scope: " in residents.text
    box_key = (box.home / "box.key").read_text().strip()
    _, (admin_load,) = run_tools(box, [("unload", {"model": "smollm2"})], key=box_key, outside=True)
    # admitted (an admin key): the unload itself answers, here that nothing is loaded
    assert not admin_load.text.startswith(("insufficient_scope", "missing_api_key"))


def test_the_door_refuses_the_outside_without_a_key(box: FitboxProcess) -> None:
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    accept = {"accept": "application/json, text/event-stream"}
    outside = httpx.HTTPTransport(local_address=CLIENT)
    with httpx.Client(transport=outside, timeout=30) as client:
        refused = client.post(f"{box.url}/mcp", json=hello, headers=accept)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "missing_api_key"
        bad = client.post(
            f"{box.url}/mcp", json=hello, headers={**accept, "authorization": "Bearer fb_nope_nope"}
        )
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
    # from the box itself without a key, but under a host name a web page could rebind
    rebound = httpx.post(f"{box.url}/mcp", json=hello, headers={**accept, "host": "evil.example"})
    assert rebound.status_code == 403
    assert rebound.json()["error"]["code"] == "host_not_allowed"
