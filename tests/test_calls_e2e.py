"""A call's row against a real fitbox and a real llama-server: a stream the client got whole
is recorded as finished whatever the client does next.

The moment is the test's own: the fronted fake (tests/fakes/fronted-llama-server)
withholds the end of the engine's body so the client leaves while fitbox still reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from .conftest import running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
FRONTED = Path(__file__).parent / "fakes" / "fronted-llama-server"


def chat(**extra: object) -> dict[str, object]:
    return {"model": SMOL, "messages": [{"role": "user", "content": "Tell me a story."}],
            **extra}  # fmt: skip


def test_a_stream_the_client_got_whole_is_recorded_ok_whatever_the_client_does_next(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """Every event and [DONE] reach the client, which then leaves; fitbox is still waiting
    for the end of the engine's body (withheld by the fake) when it learns so."""
    env = {"LLAMA_SERVER_BIN": str(FRONTED), "FAKE_REAL_BIN": str(llama_server_bin),
           "FAKE_HOLD_STREAM_END": "1"}  # fmt: skip
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        body = chat(max_tokens=8, stream=True, ignore_eos=True,
                    stream_options={"include_usage": True})  # fmt: skip
        events: list[str] = []
        with httpx.stream("POST", f"{box.url}/v1/chat/completions", json=body,
                          timeout=60) as response:  # fmt: skip
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                if line == "data: [DONE]":
                    break  # the client has it all, and goes
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 8
        row = box.calls()[-1]
        assert (row["outcome"], row["http_status"], row["completion_tokens"]) == ("ok", 200, 8)
        assert row["decode_ms"] is not None  # its timings were measured, too
        assert httpx.get(f"{box.url}/v1/residents").json()["data"][0]["calls"] == 0
        assert "never retrieved" not in box.log()
