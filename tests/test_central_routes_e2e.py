"""Every inference route a box serves, through the central: a real `fitbox central serve`
and one real box (SmolLM2 on a real llama-server), both on loopback. Each route of the box's
route table (server/routes.py, inference access) called through the central answers as the
box itself does, whole and streamed; the client's x-request-id reaches the box's call row;
one date and one server header; a box's 404 names none of the box's folders."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fitbox.home import Home
from fitbox.server.door.auth import Access
from fitbox.server.routes import ENDPOINTS

from .support.central import Central, worker_key
from .support.holds import HOLD_IDLE_TIMEOUT, until
from .support.processes import FitboxProcess, start_fitbox, stop_fitbox

pytestmark = pytest.mark.engine
HELLO: list[Any] = [{"role": "user", "content": "Say hello."}]
# a body for each inference route of the box (the model added); a route the box gains
# fails the parity test until it is given one here
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": HELLO, "max_tokens": 4},
    "/v1/completions": {"prompt": "Hi", "max_tokens": 4},
    "/v1/embeddings": {"input": "Hi"},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 4},
    "/v1/messages": {"messages": HELLO, "max_tokens": 4},
    "/v1/messages/count_tokens": {"messages": HELLO},
    "/v1/rerank": {"query": "hi", "documents": ["a", "b"]},
    "/rerank": {"query": "hi", "documents": ["a", "b"]},
    "/tokenize": {"content": "Hi"},
    "/detokenize": {"tokens": [1, 2]},
    "/apply-template": {"messages": HELLO},
    "/infill": {"input_prefix": "def f(", "input_suffix": ")", "n_predict": 4},
}
STREAMED = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
# the box's own inference routes, from its route table (the central answers /v1/models itself)
FORWARDED = [e for e in ENDPOINTS if e.access is Access.INFERENCE and e.path != "/v1/models"]
QUERY_MODEL = ("/tokenize", "/detokenize", "/apply-template", "/infill", "/rerank", "/v1/rerank")


@dataclass
class Site:
    central: Central
    box: FitboxProcess
    box_id: str
    models: Path
    model: str
    central_key: str  # inference scope: no insider of the central
    box_key: str  # inference scope: no insider of the box


def _box_key(box: FitboxProcess) -> str:
    admin = Home(box.home).box_key.read_text().strip()
    made = httpx.post(
        f"{box.url}/v1/keys",
        json={"name": "parity", "scopes": ["inference"]},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    return str(made.json()["key"])


@pytest.fixture(scope="module")
def site(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path
) -> Iterator[Site]:
    central = Central(tmp_path_factory.mktemp("central"))
    worker = worker_key(central.home)
    models = tmp_path_factory.mktemp("models") / "root"
    models.mkdir()
    (models / smollm2.name).symlink_to(smollm2)
    central.start()
    box: FitboxProcess | None = None
    try:
        box = start_fitbox(
            tmp_path_factory.mktemp("box"),
            [models],
            "--central",
            central.url,
            "--central-key",
            worker,
            env=HOLD_IDLE_TIMEOUT,
        )
        box_id = str(httpx.get(f"{box.url}/health", timeout=10).json()["box_id"])
        model = smollm2.stem
        until(
            lambda: any(m["id"] == model for m in central.get("/v1/models")["data"]),
            "the box registered and its models mirrored",
        )
        key = worker_key(central.home, "inference")
        yield Site(central, box, box_id, models, model, key, _box_key(box))
    finally:
        if box is not None:
            with contextlib.suppress(Exception):
                stop_fitbox(box)
        central.stop()


def _call(url: str, key: str, path: str, model: str, stream: bool = False) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if "{model_id" in path:
        return httpx.get(f"{url}/v1/models/{model}", headers=headers, timeout=300)
    if path not in BODIES:  # a GET the child answers about itself (/props, /slots)
        return httpx.get(f"{url}{path}", params={"model": model}, headers=headers, timeout=300)
    body = dict(BODIES[path])
    params = {"model": model} if path in QUERY_MODEL else {}
    if not params:
        body["model"] = model
    if stream:
        body["stream"] = True
    return httpx.post(f"{url}{path}", params=params, json=body, headers=headers, timeout=300)


def _shape(response: httpx.Response) -> tuple[Any, ...]:
    """Status, and the body's shape: its keys (an error's code), or the SSE fields it sends."""
    kind = response.headers.get("content-type", "").split(";")[0]
    if kind == "text/event-stream":
        fields = {line.split(":", 1)[0] for line in response.text.splitlines() if line}
        return response.status_code, kind, sorted(fields - {""}), "[DONE]" in response.text
    try:
        body = response.json()
    except ValueError:
        return response.status_code, kind, None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return response.status_code, "error", body["error"].get("code"), sorted(body["error"])
    if isinstance(body, dict):
        return response.status_code, kind, sorted(body)
    first = body[0] if isinstance(body, list) and body else None
    return response.status_code, kind, type(body).__name__, sorted(first or {})


def test_every_inference_route_of_the_box_answers_through_the_central_as_on_the_box(
    site: Site,
) -> None:
    assert {"/v1/responses", "/v1/messages", "/tokenize", "/props"} <= {e.path for e in FORWARDED}
    differ = []
    for entry in FORWARDED:
        for stream in (False, True) if entry.path in STREAMED else (False,):
            direct = _call(site.box.url, site.box_key, entry.path, site.model, stream)
            through = _call(site.central.url, site.central_key, entry.path, site.model, stream)
            if _shape(direct) != _shape(through):
                differ.append((entry.path, stream, _shape(direct), _shape(through)))
            elif through.status_code == 200:
                assert through.headers["x-fitbox-box"] == site.box_id
    assert not differ, differ


def test_the_client_s_request_id_reaches_the_box_s_call_row(site: Site) -> None:
    mine = f"parity-{uuid.uuid4().hex}"
    answer = httpx.post(
        f"{site.central.url}/v1/completions",
        json={"model": site.model, "prompt": "Hi", "max_tokens": 2},
        headers={"Authorization": f"Bearer {site.central_key}", "x-request-id": mine},
        timeout=300,
    )
    assert answer.status_code == 200, answer.text
    rows = [r for r in site.box.calls() if r["request_id"] == mine]
    assert len(rows) == 1, [r["request_id"] for r in site.box.calls()]
    assert rows[0]["outcome"] == "ok"


def test_the_central_key_is_on_the_box_s_row_and_no_other_caller_can_say_it(
    site: Site,
) -> None:
    """The central names the key a call came with; the box keeps it on the call's row (and
    the central's mirror of it). The same header sent to the box with another key of the
    box is ignored."""
    key_id = site.central_key.split("_")[1]
    through, forged = f"through-{uuid.uuid4().hex}", f"forged-{uuid.uuid4().hex}"
    body = {"model": site.model, "prompt": "Hi", "max_tokens": 2}
    answer = httpx.post(
        f"{site.central.url}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {site.central_key}", "x-request-id": through},
        timeout=300,
    )
    assert answer.status_code == 200, answer.text
    borrowed = {"x-fitbox-central-key": f"{key_id} borrowed", "x-request-id": forged}
    direct = httpx.post(
        f"{site.box.url}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {site.box_key}", **borrowed},
        timeout=300,
    )
    assert direct.status_code == 200, direct.text
    rows = {r["request_id"]: r for r in site.box.calls()}
    assert rows[through]["central_key"] == key_id and rows[through]["central_key_name"]
    assert (rows[forged]["central_key"], rows[forged]["central_key_name"]) == (None, None)
    assert site.central_key.split("_")[2] not in str(rows[through])  # never the secret

    def mirrored() -> bool:
        found = site.central.mirrored("call_log", site.box_id)
        return any(r["request_id"] == through and r["central_key"] == key_id for r in found)

    until(mirrored, "the call's row, with its central key, in the central's mirror")


def test_a_forwarded_reply_has_one_date_and_one_server(site: Site) -> None:
    for stream in (False, True):
        answer = _call(
            site.central.url, site.central_key, "/v1/chat/completions", site.model, stream
        )
        assert answer.status_code == 200, answer.text
        assert len(answer.headers.get_list("date")) == 1, answer.headers
        assert len(answer.headers.get_list("server")) == 1, answer.headers


def test_a_box_s_404_through_the_central_names_none_of_the_box_s_paths(site: Site) -> None:
    """The box answers the central as an insider (it calls with the box's admin key): the
    central's inference client is none, and hears the box's 404 without its folders."""
    named = f"{site.box_id}/no-such-model"
    answer = _call(site.central.url, site.central_key, "/v1/chat/completions", named)
    assert answer.status_code == 404, answer.text
    error = answer.json()["error"]
    assert error["code"] == "model_not_found" and "no-such-model" in error["message"]
    assert str(site.models) not in answer.text and str(site.box.home) not in answer.text
    assert not re.search(r"(?<![\w:/.])/(?:tmp|home|root|srv|var)/", error["message"]), error


def test_a_head_of_a_forwarded_get_is_answered_as_its_get(site: Site) -> None:
    headers = {"Authorization": f"Bearer {site.central_key}"}
    url = f"{site.central.url}/v1/models/{site.model}"
    head = httpx.head(url, headers=headers, timeout=60)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["x-fitbox-box"] == site.box_id
