"""The audio routes in OpenAI's shapes: transcriptions and translations (a multipart upload),
speech (a JSON body), and the voices of every speech model.

Each checks the client's fields here, refusing by name a field it cannot honour, then
serves the call as a task (server/inference/tasks.py). An upload is spooled as it streams
(server/door/uploads.py) and removed once the call ended, however it ended.
"""

from __future__ import annotations

from hashlib import sha256
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.box.box import Box
from fitbox.config import Config
from fitbox.core.audio_header import HEAD, wav_seconds
from fitbox.errors import FitboxError, InvalidRequest
from fitbox.models.task_models import PIPER, voices
from fitbox.server.door.bodies import json_object
from fitbox.server.door.uploads import Form, read_form
from fitbox.server.inference.openai import refused
from fitbox.server.inference.tasks import Task, serve_task

TRANSCRIBED = ("json", "text", "verbose_json", "srt", "vtt")
SPOKEN = ("wav", "pcm", "flac", "mp3", "opus")
NO_CODEC = ("aac",)  # OpenAI's formats no runner here writes
INPUT_MAX = 4096  # characters of speech input, as OpenAI's
TEXT_FIELDS = ("model", "prompt", "response_format", "temperature", "stream")
GRANULARITIES = ("timestamp_granularities[]", "timestamp_granularities")
EXT = {"json": "json", "verbose_json": "json", "text": "txt", "srt": "srt", "vtt": "vtt"}


def _unknown(given: set[str], known: set[str], route: str) -> None:
    extra = sorted(given - known)
    if extra:
        raise InvalidRequest(
            f"{route} cannot honour '{extra[0]}' here: fitbox's runners take only "
            f"{', '.join(sorted(known))}.",
            param=extra[0],
            code="unsupported_field",
        )


def _transcription_body(form: Form, path: str) -> dict[str, Any]:
    """The child's fields from the form, each checked; ``file`` is the spooled upload."""
    known = {*TEXT_FIELDS, *GRANULARITIES, "file"}
    if path.endswith("/transcriptions"):
        known.add("language")
    _unknown(set(form.fields) | set(form.files), known, f"POST {path}")
    body: dict[str, Any] = {k: form.value(k) for k in known if form.value(k) is not None}
    if not body.get("model"):
        raise InvalidRequest("Missing required field 'model'.", param="model")
    upload = form.files.get("file")
    if upload is None:
        raise InvalidRequest("Missing required file field 'file' (the audio).", param="file")
    if upload.size == 0:
        raise InvalidRequest("The uploaded 'file' is empty.", param="file", code="empty_file")
    body["file"] = str(upload.path)
    fmt = body.setdefault("response_format", "json")
    if fmt not in TRANSCRIBED:
        raise InvalidRequest(
            f"response_format '{fmt}' is not one of {', '.join(TRANSCRIBED)}.",
            param="response_format",
            code="unsupported_response_format",
        )
    body["stream"] = _flag(body.get("stream"), "stream")
    if "temperature" in body:
        body["temperature"] = _number(body["temperature"], "temperature", 0.0, 1.0)
    granular = [g for key in GRANULARITIES for g in form.fields.get(key, [])]
    if any(g not in ("segment", "word") for g in granular):
        raise InvalidRequest(
            "timestamp_granularities are 'segment' and 'word'.", param="timestamp_granularities"
        )
    for key in GRANULARITIES:
        body.pop(key, None)
    body["timestamp_granularities"] = granular
    return body


def _flag(value: Any, name: str) -> bool:
    if value in (None, "", "false", "False", "0"):
        return False
    if value in ("true", "True", "1"):
        return True
    raise InvalidRequest(f"'{name}' must be true or false.", param=name)


def _number(value: Any, name: str, low: float, high: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not low <= number <= high:
        raise InvalidRequest(f"'{name}' must be a number from {low} to {high}.", param=name)
    return number


async def _transcribe(request: Request, path: str) -> Response:
    config: Config = request.app.state.config
    form: Form | None = None
    body: dict[str, Any] = {}
    try:
        form = await read_form(request, config.spool_dir, config.upload_max)
        body = _transcription_body(form, path)
    except FitboxError as error:
        if form is not None:
            form.remove()
        refused(request, path, body, error)
        raise
    upload = form.files["file"]
    inputs = [{"role": "input", "name": "file", "bytes": upload.size, "sha256": upload.sha256}]
    task = Task(path, body, EXT[body["response_format"]], body["stream"], inputs, form.remove)
    task.work, task.measure = _audio_seconds(upload.path, upload.size), "audio_in_s"
    if body["stream"]:
        task.ext = "sse"
    return await serve_task(request, task)


def _audio_seconds(path: Path, size: int) -> float | None:
    """A WAV upload's seconds from its header (another format: unknown until its runner
    measured it, so its call waits without an ETA)."""
    try:
        with path.open("rb") as spooled:
            head = spooled.read(HEAD)
    except OSError:
        return None
    return wav_seconds(head, size)


async def transcriptions(request: Request, engine: str) -> Response:
    return await _transcribe(request, engine)


async def translations(request: Request, engine: str) -> Response:
    return await _transcribe(request, engine)


def _speech_body(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    path = "POST /v1/audio/speech"
    known = {"model", "input", "voice", "response_format", "speed", "stream_format"}
    if not body.get("instructions"):
        body.pop("instructions", None)  # an empty one asks nothing
    _unknown(set(body), known, path)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("Missing required field 'model'.", param="model")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest(
            "'input' is empty: send the text to speak.", param="input", code="empty_input"
        )
    if len(text) > INPUT_MAX:
        raise InvalidRequest(f"'input' is longer than {INPUT_MAX} characters.", param="input")
    voice = body.get("voice")
    if isinstance(voice, dict):
        voice = voice.get("id")
    if not isinstance(voice, str) or not voice:
        raise InvalidRequest("Missing required field 'voice'.", param="voice")
    body["voice"] = voice
    fmt = body.setdefault("response_format", "mp3")
    if fmt not in SPOKEN:
        why = "no codec for it on this box" if fmt in NO_CODEC else "not an audio format"
        raise InvalidRequest(
            f"response_format '{fmt}': {why}; ask for one of {', '.join(SPOKEN)}.",
            param="response_format",
            code="unsupported_response_format",
        )
    if "speed" in body:
        body["speed"] = _number(body["speed"], "speed", 0.25, 4.0)
    if body.setdefault("stream_format", "audio") not in ("audio", "sse"):
        raise InvalidRequest("stream_format must be 'audio' or 'sse'.", param="stream_format")
    _check_voice(request.app.state.box, body["model"], voice)
    return body


def _check_voice(box: Box, model: str, voice: str) -> None:
    """A voice the named speech model lacks, refused with the ones it has (a name the
    catalog does not know is the box's to refuse, as any)."""
    try:
        artifacts = box.catalog.variants(model)
    except FitboxError:
        return
    speech = [a for a in artifacts if a.format == PIPER]
    if not speech:
        return
    have = sorted({v for a in speech for v in voices(a.path)})
    if voice not in have:
        raise InvalidRequest(
            f"'{model}' has no voice '{voice}'; its voices: {', '.join(have)} "
            "(GET /v1/audio/voices lists every speech model's).",
            param="voice",
            code="unknown_voice",
        )


async def speech(request: Request, engine: str) -> Response:
    body: dict[str, Any] = {}
    try:
        _, body = await json_object(request)
        body = _speech_body(request, body)
    except FitboxError as error:
        refused(request, engine, body, error)
        raise
    fmt = body["response_format"]
    ext = "sse" if body["stream_format"] == "sse" else fmt
    text = body["input"].encode()
    inputs = [
        {"role": "input", "name": "input", "bytes": len(text), "sha256": sha256(text).hexdigest()}
    ]
    # its audio is always sent as it is made: the row is a stream's (stored before its
    # first byte)
    task = Task(engine, body, ext, True, inputs, work=float(len(body["input"])))
    return await serve_task(request, task)


async def list_voices(request: Request) -> Response:
    """Every speech model's voices: ``{"data": [{"id", "model", "object": "voice"}]}``."""
    box: Box = request.app.state.box
    found = [
        {"id": voice, "object": "voice", "model": a.name}
        for a in box.catalog.artifacts()
        if a.format == PIPER
        for voice in voices(a.path)
    ]
    return JSONResponse({"object": "list", "data": found})
