"""Server-Timing as a browser reads it, on a real fitbox serving a real SmolLM2: whole,
streamed and error responses, each figure the same as the call row says."""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fitbox import config
from fitbox.server.streams.events import figures

from .support.clients import app_client
from .support.holds import until
from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
HELLO = [{"role": "user", "content": "Say hello."}]
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 token: a metric's name


def parse_server_timing(value: str) -> dict[str, float | None]:
    """Each metric's name and ``dur``, as the W3C spec's processing model reads a header:
    entries split on commas, params on semicolons, a name that is no token is dropped, the
    first ``dur`` counts, a ``dur`` that is no number is 0."""
    out: dict[str, float | None] = {}
    for entry in value.split(","):
        name, *params = (p.strip() for p in entry.split(";"))
        if not _TOKEN.match(name) or name in out:
            continue
        dur: float | None = None
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip().lower() == "dur" and dur is None:
                try:
                    dur = float(raw.strip().strip('"'))
                except ValueError:
                    dur = 0.0
        out[name] = dur
    return out


def row_figures(row: dict[str, object]) -> dict[str, float]:
    stamps = {k: v for k, v in row.items() if k.endswith("_at") and isinstance(v, float | None)}
    return {k: round(v, 1) for k, v in figures(stamps).items()}


def row_of(box: FitboxProcess, reply: httpx.Response) -> dict[str, object]:
    """The reply's call row (by the request id the test sent), once stored and settled: its
    end is written a moment after the reply, so wait for it, not for a time."""
    rid = reply.request.headers["x-request-id"]
    return until(
        lambda: next(
            (r for r in box.calls() if r["request_id"] == rid and r["outcome"] != "pending"), None
        ),
        "the call's row",
    )


def rid() -> dict[str, str]:
    return {"x-request-id": uuid.uuid4().hex}


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path
) -> Iterator[FitboxProcess]:
    with running_fitbox(tmp_path_factory.mktemp("home"), [smollm2.parent]) as running:
        yield running


def test_a_whole_reply_carries_every_figure_the_row_has(box: FitboxProcess) -> None:
    body = {"model": SMOL, "messages": HELLO, "max_tokens": 4}
    first = httpx.post(f"{box.url}/v1/chat/completions", json=body, headers=rid(), timeout=120)
    assert first.status_code == 200, first.text
    timed = parse_server_timing(first.headers["server-timing"])
    assert list(timed) == ["queue", "load", "ttft", "total"]
    assert timed == row_figures(row_of(box, first))
    assert timed["load"] and timed["load"] > 0  # the first call loaded the model
    again = httpx.post(f"{box.url}/v1/chat/completions", json=body, headers=rid(), timeout=120)
    timed = parse_server_timing(again.headers["server-timing"])
    assert timed["load"] == 0  # resident now
    assert timed == row_figures(row_of(box, again))


def test_a_stream_sends_queue_and_load_first_and_the_rest_before_done(
    box: FitboxProcess,
) -> None:
    body = {"model": SMOL, "messages": HELLO, "max_tokens": 4, "stream": True}
    with httpx.stream(
        "POST",
        f"{box.url}/v1/chat/completions",
        json=body,
        headers={"te": "trailers", **rid()},
        timeout=120,
    ) as reply:
        assert reply.status_code == 200
        early = parse_server_timing(reply.headers["server-timing"])
        text = reply.read().decode()
    assert list(early) == ["queue", "load"]
    # uvicorn's HTTP/1.1 cannot send trailers: no Trailer header promises one
    assert "trailer" not in reply.headers
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    comment = events[-2]
    assert comment.startswith(": server-timing ")
    late = parse_server_timing(comment.removeprefix(": server-timing "))
    assert list(late) == ["queue", "load", "ttft", "total"]
    row = row_figures(row_of(box, reply))
    assert late == row
    assert early == {k: row[k] for k in ("queue", "load")}


def test_an_error_carries_the_figures_of_its_row(box: FitboxProcess) -> None:
    reply = httpx.post(
        f"{box.url}/v1/chat/completions",
        json={"model": "no-such-model", "messages": HELLO},
        headers=rid(),
        timeout=30,
    )
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "model_not_found"
    timed = parse_server_timing(reply.headers["server-timing"])
    assert "total" in timed and "ttft" not in timed  # no first token ever went
    assert timed == row_figures(row_of(box, reply))


def test_a_refused_body_and_a_route_that_is_no_call_have_a_total(box: FitboxProcess) -> None:
    bad = httpx.post(
        f"{box.url}/v1/chat/completions", content=b"{not json", headers=rid(), timeout=30
    )
    assert bad.status_code == 400
    assert parse_server_timing(bad.headers["server-timing"]) == row_figures(row_of(box, bad))
    models = httpx.get(f"{box.url}/v1/models", timeout=30)
    timed = parse_server_timing(models.headers["server-timing"])
    assert list(timed) == ["total"] and (timed["total"] or 0) >= 0


def test_the_parser_reads_what_the_spec_allows() -> None:
    assert parse_server_timing('miss, db;dur=53, app;dur=47.2;desc="x", 1 bad;dur=1') == {
        "miss": None,
        "db": 53.0,
        "app": 47.2,
    }


def test_a_server_that_offers_trailers_gets_the_last_figures_in_one(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """uvicorn offers no trailers (see the test above); Starlette's test transport does (the
    ASGI ``http.response.trailers`` extension). The real app and route on a real stream: a
    client that sent ``TE: trailers`` gets a Trailer header and then the figures its start
    could not carry (ttft, total), the same as the last SSE comment and the call row; a
    client that did not ask gets no trailer."""
    cfg = config.load({"home": str(tmp_path), "models": str(smollm2.parent)}, env={})
    body = {"model": SMOL, "messages": HELLO, "max_tokens": 4, "stream": True}
    with app_client(cfg) as client:
        # resident first: a stream that waits for a load has its 200 sent before any figure
        # is known (server/inference/progress.py), so its start would carry none
        loaded = client.post("/v1/chat/completions", json={**body, "stream": False})
        assert loaded.status_code == 200, loaded.text
        asked = client.post("/v1/chat/completions", json=body, headers={"te": "trailers", **rid()})
        unasked = client.post("/v1/chat/completions", json=body, headers=rid())
    assert asked.status_code == unasked.status_code == 200
    assert asked.headers["trailer"] == "server-timing"
    early = parse_server_timing(asked.headers["server-timing"])
    assert list(early) == ["queue", "load"] and early["load"] == 0
    trailers = dict(asked.extensions["http.response.trailers"])
    late = parse_server_timing(trailers[b"server-timing"].decode())
    assert list(late) == ["queue", "load", "ttft", "total"]
    events = [e for e in asked.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert late == parse_server_timing(events[-2].removeprefix(": server-timing "))
    with sqlite3.connect(tmp_path / "fitbox.sqlite3") as conn:
        conn.row_factory = sqlite3.Row
        row = dict(
            conn.execute(
                "SELECT * FROM call_log WHERE request_id = ?",
                (asked.request.headers["x-request-id"],),
            ).fetchone()
        )
    assert late == row_figures(row)
    assert early == {k: late[k] for k in ("queue", "load")}
    assert "trailer" not in unasked.headers
    assert "http.response.trailers" not in unasked.extensions
