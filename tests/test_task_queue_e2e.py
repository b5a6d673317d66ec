"""Task calls in the queue, the plan, /metrics, the dashboard, Server-Timing and MCP, end to
end on the real runners (the piper voice en_US-joe-medium, faster-whisper tiny.en;
tests/support/task_engines.py).

A speech call whose client reads nothing holds the voice's one slot (its child blocks on a
full socket once the buffers between them fill: the test lets go by closing it); a second
speech call waits in /v1/queue with an ETA from the voice's measured characters per second.
`fitbox plan` explains a task model by its runner, its environment and its measured speed.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import wave
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from fitbox.box.planning import lines

from .support.holds import Background, until
from .support.processes import FitboxProcess, running_fitbox
from .support.task_engines import VOICE, WHISPER, engine_dir, piper_voice, whisper_folder

SAID = "The quick brown fox jumps over the lazy dog. "


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FitboxProcess]:
    tmp = tmp_path_factory.mktemp("task-queue")
    root = tmp / "models"
    root.mkdir()
    (root / WHISPER).symlink_to(whisper_folder())
    (root / "joe").symlink_to(piper_voice().parent)
    env = {"FITBOX_ENGINE_DIR": str(engine_dir(tmp / "engines"))}
    with running_fitbox(tmp / "home", [root], env=env) as running:
        yield running


def speak(box: FitboxProcess, text: str) -> httpx.Response:
    ask = {"model": VOICE, "voice": "joe", "input": text, "response_format": "wav"}
    return httpx.post(f"{box.url}/v1/audio/speech", json=ask, timeout=300)


def plan(box: FitboxProcess, model: str) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(
        f"{box.url}/v1/plan", params={"model": model}, timeout=60
    ).json()
    return found


def queued(box: FitboxProcess) -> list[dict[str, Any]]:
    answer = httpx.get(f"{box.url}/v1/queue", timeout=30).json()["data"]
    return [q for q in answer if q["model"] == VOICE]


def held_speech(box: FitboxProcess, text: str) -> socket.socket:
    """A streamed speech call whose client reads its status line and then nothing more (a
    small receive buffer: the audio backs up to the child, which blocks in its write)."""
    host, port = box.url.removeprefix("http://").rsplit(":", 1)
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.settimeout(300)
    conn.connect((host, int(port)))
    body = (
        f'{{"model": "{VOICE}", "voice": "joe", "input": "{text}", "speed": 0.25, '
        '"response_format": "pcm"}'
    ).encode()
    conn.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    assert conn.recv(12) == b"HTTP/1.1 200"  # placed: its row is stored before this
    return conn


def test_plan_says_a_task_models_runner_environment_and_speed(box: FitboxProcess) -> None:
    before = plan(box, VOICE)
    assert before["task"] == "speech" and before["runner"] == "piper"
    assert before["engine_env"]["state"] == "ready"
    assert before["speed"] == {"units": "characters", "per_second": None, "calls": 0}
    for chat_only in ("window", "parallel", "type_k", "band", "gpu_layers"):
        assert chat_only not in before
    said = lines(before | {"source": "test"})
    assert "task speech, runner piper (environment ready)" in said[1]
    assert "not measured yet" in said[2] and "window" not in "\n".join(said)
    assert speak(box, SAID).status_code == 200
    after = plan(box, VOICE)
    assert after["speed"]["calls"] == 1 and after["speed"]["per_second"] > 0
    assert "characters per second" in lines(after)[2]


def quiet_wav(seconds: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:  # silence: a WAV's header says its length
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 16000 * seconds)
    return out.getvalue()


def transcribe(box: FitboxProcess, wav: bytes) -> httpx.Response:
    return httpx.post(
        f"{box.url}/v1/audio/transcriptions",
        data={"model": WHISPER},
        files={"file": ("quiet.wav", wav)},
        timeout=300,
    )


def test_a_transcription_is_measured_in_audio_seconds(box: FitboxProcess) -> None:
    answer = transcribe(box, quiet_wav(2))
    assert answer.status_code == 200, answer.text
    speed = plan(box, WHISPER)["speed"]
    assert speed["units"] == "audio seconds" and speed["calls"] == 1
    assert speed["per_second"] > 0


def test_a_speech_call_waits_behind_another_with_an_eta(box: FitboxProcess) -> None:
    if plan(box, VOICE)["speed"]["calls"] == 0:
        assert speak(box, SAID).status_code == 200  # the voice's speed, measured
    conn = held_speech(box, (SAID * 90).strip())
    try:
        second = Background(lambda: speak(box, SAID))
        waiting = until(lambda: queued(box), "the second speech call in the queue")
        assert waiting[0]["blocked_by"] == [VOICE]
        eta = waiting[0]["eta_s"]
        assert eta is not None and eta > 0  # its own characters at the measured rate, at least
    finally:
        conn.close()  # the held call's client leaves: its slot is given back
    assert second.result().status_code == 200


def timing(response: httpx.Response) -> dict[str, float]:
    said = response.headers["server-timing"]
    return {m[1]: float(m[2]) for m in re.finditer(r"(\w+);dur=([\d.]+)", said)}


def metric(page: str, name: str, **labels: str) -> float:
    """The sample of ``name`` whose labels include ``labels`` (0 when there is none)."""
    for line in page.splitlines():
        if line.startswith(name + "{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if labels.items() <= found.items():
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_and_server_timing_count_task_calls(box: FitboxProcess) -> None:
    scrape = httpx.get(f"{box.url}/metrics", timeout=30)  # counting starts at the app's start
    before = metric(scrape.text, "fitbox_task_units_total", unit="audio_in_seconds")
    heard = transcribe(box, quiet_wav(3))
    assert heard.status_code == 200
    assert {"queue", "load", "ttft", "total"} <= timing(heard).keys()  # whole: every figure
    spoken = speak(box, SAID)
    assert spoken.status_code == 200 and {"queue", "load"} <= timing(spoken).keys()
    page = httpx.get(f"{box.url}/metrics", timeout=30).text
    speech = {"model": VOICE, "endpoint": "/v1/audio/speech"}
    assert metric(page, "fitbox_calls_total", **speech, outcome="ok") >= 1
    assert metric(page, "fitbox_audio_seconds_total", **speech, direction="out") > 0
    heard_in = metric(page, "fitbox_task_units_total", model=WHISPER, unit="audio_in_seconds")
    assert heard_in - before == pytest.approx(3.0, rel=0.01)


def test_dashboard_and_residents_show_each_task(box: FitboxProcess) -> None:
    assert speak(box, SAID).status_code == 200
    residents = httpx.get(f"{box.url}/v1/residents", timeout=30).json()["data"]
    assert {r["model"]: r["task"] for r in residents}.get(VOICE) == "speech"
    page = httpx.get(f"{box.url}/", timeout=30).text
    row = re.search(f"<tr class='resident [a-z]+'><td>{VOICE}</td>(.*?)</tr>", page)
    assert row is not None and "<td></td><td>speech</td>" in row[1]  # no window: its task
    assert "<td>/v1/audio/speech</td>" in page  # a call's route
    assert re.search(r"<td>[\d.]+ s out</td>", page)  # the audio it made


def test_mcp_lists_task_models_and_their_task(box: FitboxProcess) -> None:
    assert speak(box, SAID).status_code == 200

    async def session() -> list[Any]:
        async with (
            httpx2.AsyncClient(timeout=120) as http,
            streamable_http_client(f"{box.url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as client,
        ):
            await client.initialize()
            found = []
            for tool in ("list_models", "residents"):
                result = await client.call_tool(tool, {})
                assert not result.is_error
                found.append(json.loads("".join(getattr(p, "text", "") for p in result.content)))
            return found

    models, residents = asyncio.run(session())
    tasks = {m["id"]: m.get("task") for m in models["data"]}
    assert tasks[VOICE] == "speech" and tasks[WHISPER] == "transcription"
    assert {r["model"]: r["task"] for r in residents["data"]}[VOICE] == "speech"
