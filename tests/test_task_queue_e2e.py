"""Task calls in the queue and in the plan, end to end on the real runners (the piper voice
en_US-joe-medium, faster-whisper tiny.en; tests/support/task_engines.py).

A speech call whose client reads nothing holds the voice's one slot (its child blocks on a
full socket once the buffers between them fill: the test lets go by closing it); a second
speech call waits in /v1/queue with an ETA from the voice's measured characters per second.
`fitbox plan` explains a task model by its runner, its environment and its measured speed.
"""

from __future__ import annotations

import io
import socket
import wave
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

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


def test_a_transcription_is_measured_in_audio_seconds(box: FitboxProcess) -> None:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:  # two seconds of silence: a WAV's header says its length
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 32000)
    answer = httpx.post(
        f"{box.url}/v1/audio/transcriptions",
        data={"model": WHISPER},
        files={"file": ("quiet.wav", out.getvalue())},
        timeout=300,
    )
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
