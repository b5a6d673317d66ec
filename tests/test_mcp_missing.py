"""Without the optional ``mcp`` extra, fitbox still imports and serves, and ``/mcp`` says
how to add it (an OpenAI error body), in a Python where ``mcp`` cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys

PROGRAM = """
import json, sys
sys.modules["mcp"] = None  # as if 'fitbox[mcp]' were not installed
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient
from fitbox.server import app
from fitbox.server.views import mcp_tools
assert mcp_tools.MCPServer is None
server = Starlette(routes=[Route("/mcp", mcp_tools.door, methods=["POST"])])
server.state.mcp = mcp_tools.McpDoor()
reply = TestClient(server).post("/mcp", json={})
print(json.dumps({"status": reply.status_code, "body": reply.json()}))
"""


def test_mcp_without_the_extra_says_how_to_add_it() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found["status"] == 404
    error = found["body"]["error"]
    assert error["code"] == "mcp_not_installed" and "fitbox[mcp]" in error["message"]
    assert set(error) == {"message", "type", "code", "param"}
