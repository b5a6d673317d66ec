"""/openapi.json says what the box does: schemathesis, with every check it has, over a real
fitbox's own document, once with an admin key and once keyless from outside (a forwarded
peer that is no trusted proxy: every route's refusal). It fails on a 5xx that is not a
deliberate capacity answer (tests/support/contract_checks.py), on a status, header, body or
content type the document does not declare, on a request the document allows that the box
refuses and one it forbids that the box takes, and on a 405 without ``Allow``.

The box is a throwaway, started for this module with nothing it can load (``--ram-max
1MiB``: every load is a 507), so every operation runs, the ones that change the box too:
operator actions, settings, limits, key creation and revocation. None stops the box (there
is no shutdown route), and revoking the key in use would take guessing its 12 hex digits.
Left out: MCP and the dashboard's event stream (not JSON over HTTP, and GET of each is a
stream that never ends; tests/test_mcp_e2e.py and test_dashboard_e2e.py drive them).

Bounded: a fixed seed and a few examples per operation (the examples, coverage and fuzzing
phases), so a run is the same each time and takes well under a minute on two cores."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from fitbox.server.routes import OTHER_PROTOCOLS

from .support.ggufs import write_tiny_llama
from .support.processes import FitboxProcess, running_fitbox

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = 10
CONFIG = """
hooks = "tests.support.contract_checks"

# every check schemathesis has (its default; as `--checks all`), with the box's own in place
# of two (tests/support/contract_checks.py): not_a_server_error (some 5xx are deliberate)
# and positive_data_acceptance (some refusals are for what the box holds)
[checks]
enabled = true
not_a_server_error.enabled = false
positive_data_acceptance.enabled = false

# routes about one model reach past their 404 for the box's one model (its other
# parameters still fuzzed)
[[operations]]
include-path-regex = "^/v1/transfer/"
parameters = { "path.model" = "tiny" }

[[operations]]
include-name = "GET /v1/models/{model_id}"
parameters = { "path.model_id" = "tiny" }

[[operations]]
include-name = "GET /v1/telemetry/state"
# a long-poll: up to 60 s a request while nothing changes
parameters = { "query.wait" = 0 }
"""
CALLERS = {
    "admin key": [],
    # the door answers a keyless outsider 401 before the router can answer 405: a method
    # the path does not serve is refused for the key it lacks, as any other request is
    "keyless from outside": ["--exclude-checks", "unsupported_method"],
}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FitboxProcess]:
    place = tmp_path_factory.mktemp("contract")
    (place / "models").mkdir()
    write_tiny_llama(place / "models" / "tiny.gguf")
    with running_fitbox(place / "home", [place / "models"], "--ram-max", "1MiB") as box:
        yield box


def schemathesis(box: FitboxProcess, caller: str, config: Path) -> subprocess.CompletedProcess[str]:
    if caller == "admin key":
        header = f"Authorization: Bearer {(box.home / 'box.key').read_text().strip()}"
    else:
        header = "X-Forwarded-For: 203.0.113.9"
    argv = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run"]
    argv += [f"{box.url}/openapi.json", *CALLERS[caller]]
    argv += ["--max-examples", str(EXAMPLES), "--seed", "1", "--workers", "2"]
    argv += ["--phases", "examples,coverage,fuzzing", "--request-timeout", "30", "-H", header]
    for path in sorted(OTHER_PROTOCOLS):
        argv += ["--exclude-path", path]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["NO_COLOR"] = "1"
    return subprocess.run(
        argv, cwd=config.parent, env=env, capture_output=True, text=True, timeout=540
    )


@pytest.mark.parametrize("caller", list(CALLERS))
def test_the_box_answers_as_its_document_says(
    box: FitboxProcess, caller: str, tmp_path: Path
) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    run = schemathesis(box, caller, config)
    output = run.stdout + run.stderr
    tested = re.search(r"Tested: (\d+)", output)
    cases = re.search(r"(\d+) generated", output)
    print(f"\n{caller}: {tested and tested[1]} operations, {cases and cases[1]} cases")
    assert run.returncode == 0, output[-20000:]
    assert tested and int(tested[1]) >= 40, output[-3000:]  # every JSON route ran


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"\r\nzz\r\n",
    ],
)
def test_a_request_uvicorn_cannot_parse_gets_an_openai_error(
    box: FitboxProcess, request_bytes: bytes
) -> None:
    """uvicorn answers these itself, before the app: a 400 with an OpenAI error body, and
    the connection closed after it."""
    where = urlsplit(box.url)
    with socket.create_connection((where.hostname, where.port), timeout=30) as conn:
        conn.sendall(request_bytes)
        answer = b""
        while chunk := conn.recv(65536):  # the box closes the connection after its answer
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == "HTTP/1.1 400 Bad Request", answer
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["code"] == "bad_http_request" and error["type"] == "invalid_request_error"
    assert "HTTP/1.1" in error["message"] and error["param"] is None
