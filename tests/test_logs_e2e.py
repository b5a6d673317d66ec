"""The engine children's logs over HTTP on a real box with a real llama-server: listed with
the running child's marked, read by their last lines and followed from an offset; a name
that is not a log's is a 404, and the outside needs an admin key."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from .support.processes import running_fitbox

pytestmark = pytest.mark.engine
SERVER, CLIENT = "127.0.0.2", "127.0.0.3"


def test_a_running_child_s_log_is_listed_read_and_followed(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    with running_fitbox(tmp_path / "home", [smollm2.parent], "--host", SERVER) as box:
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
        chat = httpx.post(f"{box.url}/v1/chat/completions", json={**body, "max_tokens": 2})
        assert chat.status_code == 200, chat.text
        (log,) = httpx.get(f"{box.url}/v1/logs").json()["data"]
        assert log["running"] is True and log["bytes"] > 0
        assert log["name"].startswith("SmolLM2-135M-Instruct.Q4_1-")
        first = httpx.get(f"{box.url}/v1/logs/{log['name']}", params={"tail": 1000})
        assert first.status_code == 200 and first.text.startswith("$ ")  # its argv first
        assert "llama-server" in first.text.splitlines()[0]
        offset = int(first.headers["x-fitbox-log-offset"])
        assert offset == len(first.content)  # the whole file: the next read starts there
        two = httpx.get(f"{box.url}/v1/logs/{log['name']}", params={"tail": 2}).text
        assert two.count("\n") == 2 and first.text.endswith(two)
        later = httpx.get(f"{box.url}/v1/logs/{log['name']}", params={"offset": offset})
        assert int(later.headers["x-fitbox-log-offset"]) == offset + len(later.content)
        for name in ("..%2Ffitbox.sqlite3", "box.key", "nope-1.log"):
            missing = httpx.get(f"{box.url}/v1/logs/{name}")
            assert missing.status_code == 404, name
            assert missing.json()["error"]["code"] in ("log_not_found", "not_found")
        outside = httpx.Client(transport=httpx.HTTPTransport(local_address=CLIENT))
        with outside:
            refused = outside.get(f"{box.url}/v1/logs/{log['name']}")
        assert refused.status_code == 401
