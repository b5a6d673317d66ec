"""Keys over real sockets: fitbox listening on a second loopback address, a client arriving
from a third (not the box itself, so keys matter), the official openai client, and
`fitbox keys` run beside the live service."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .support.clients import openai_client
from .support.processes import running_fitbox

pytestmark = pytest.mark.engine
SERVER, CLIENT = "127.0.0.2", "127.0.0.3"


def keys_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fitbox", "keys", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def from_client(api_key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(
        transport=httpx.HTTPTransport(local_address=CLIENT), headers=headers, timeout=60
    )


def test_scoped_keys_over_real_sockets(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    home = tmp_path / "home"
    made = keys_cli(home, "create", "--name", "app", "--scope", "inference", "--json")
    assert made.returncode == 0, made.stderr  # offline: no service yet
    key = json.loads(made.stdout)["key"]
    env = {"FITBOX_REQUIRE_KEYS": "true"}
    with running_fitbox(home, [smollm2.parent], "--host", SERVER, env=env) as box:
        assert box.url == f"http://{SERVER}:{box.url.rsplit(':', 1)[1]}"
        with from_client() as anonymous:
            refused = anonymous.get(f"{box.url}/v1/models")
            assert refused.status_code == 401
            assert refused.json()["error"]["type"] == "authentication_error"
        # keys are required for inference even from the box itself here
        with openai_client(box.url, api_key=key, max_retries=0) as client:
            reply = client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            assert reply.choices[0].message.content is not None
        with from_client(key) as scoped:
            denied = scoped.get(f"{box.url}/v1/plan", params={"model": "smollm2"})
            assert denied.status_code == 403
            assert denied.json()["error"]["type"] == "permission_error"
        box_key = (home / "box.key").read_text().strip()
        with from_client(box_key) as admin:
            listed = admin.get(f"{box.url}/v1/keys").json()["data"]
            assert {k["name"] for k in listed} == {"app", "box key"}
        key_id = key.split("_")[1]
        revoked = keys_cli(home, "revoke", key_id)  # through the running service
        assert revoked.returncode == 0, revoked.stderr
        assert key_id in keys_cli(home, "list").stdout
        with from_client(key) as scoped:
            assert scoped.get(f"{box.url}/v1/models").status_code == 401
