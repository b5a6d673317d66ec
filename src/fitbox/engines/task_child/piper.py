"""The piper runner: /v1/audio/speech from a piper voice (``NAME.onnx`` + ``NAME.onnx.json``).

piper-tts is GPL-3.0: it is imported here only, in the piper environment's own child
process. The audio is made a sentence at a time (piper's ``synthesize`` yields one chunk a
sentence) and sent as each is made for wav and pcm, or as OpenAI's ``speech.audio.delta``
events with ``stream_format: "sse"``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .audio import CONTENT_TYPES, STREAMED, codecs, encoded, streamed
from .replies import BadRequest, Reply, Route, Stream, Whole

SPEECH = "/v1/audio/speech"


def voices_of(config: dict[str, Any]) -> list[str]:
    """A multi-speaker voice's speakers by name; a single voice is its dataset's name."""
    speakers = config.get("speaker_id_map") or {}
    if speakers:
        return sorted(speakers, key=lambda s: speakers[s])
    return [str(config.get("dataset") or "default")]


class Piper:
    def __init__(self, model: str, device: str) -> None:
        from piper import PiperVoice

        self.voice = PiperVoice.load(model, use_cuda=device == "cuda")
        self.config = json.loads(Path(model + ".json").read_text())
        self.rate = int(self.voice.config.sample_rate)
        self.voices = voices_of(self.config)
        self.codecs = codecs()
        self.routes: dict[str, Route] = {SPEECH: self.speech}
        self.measured: dict[str, float] = {}

    def extra_props(self) -> dict[str, Any]:
        return {"sample_rate": self.rate, "voices": self.voices, "formats": list(self.codecs)}

    def speech(self, body: dict[str, Any]) -> Reply:
        from piper import SynthesisConfig

        text, fmt, sse = _text(body), str(body.get("response_format") or "mp3"), _sse(body)
        if fmt not in self.codecs:
            raise BadRequest(
                f"response_format '{fmt}' cannot be written by this engine (it writes "
                f"{', '.join(self.codecs)})",
                "response_format",
                "unsupported_response_format",
            )
        voice = str(body.get("voice") or self.voices[0])
        if voice not in self.voices:
            raise BadRequest(
                f"voice '{voice}' is not one of this model's: {', '.join(self.voices)}",
                "voice",
                "unknown_voice",
            )
        speakers = self.config.get("speaker_id_map") or {}
        speed = float(body.get("speed") or 1.0)
        config = SynthesisConfig(speaker_id=speakers.get(voice), length_scale=1.0 / speed)
        self.measured["input_chars"] = len(text)
        pieces = self._counted(c.audio_int16_array for c in self.voice.synthesize(text, config))
        headers = {"x-fitbox-sample-rate": str(self.rate)}
        if sse:
            return Stream(_events(pieces, self.rate, fmt), "text/event-stream", headers)
        if fmt in STREAMED:
            return Stream(streamed(pieces, self.rate, fmt), CONTENT_TYPES[fmt], headers)
        return Whole(encoded(pieces, self.rate, fmt), CONTENT_TYPES[fmt], headers)

    def _counted(self, pieces: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        self.measured["audio_out_s"] = 0.0
        for piece in pieces:
            self.measured["audio_out_s"] += len(piece) / self.rate
            yield piece


def _text(body: dict[str, Any]) -> str:
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("'input' must be the text to speak", "input", "empty_input")
    return text


def _sse(body: dict[str, Any]) -> bool:
    form = body.get("stream_format") or "audio"
    if form not in ("audio", "sse"):
        raise BadRequest("stream_format must be 'audio' or 'sse'", "stream_format")
    return form == "sse"


def _events(pieces: Iterator[np.ndarray], rate: int, fmt: str) -> Iterator[bytes]:
    """OpenAI's speech events: a ``speech.audio.delta`` per piece, base64 of its bytes in
    ``fmt`` (one piece for a format written whole), then ``speech.audio.done``."""
    parts = streamed(pieces, rate, fmt) if fmt in STREAMED else iter([encoded(pieces, rate, fmt)])
    for part in parts:
        event = {"type": "speech.audio.delta", "audio": base64.b64encode(part).decode()}
        yield b"data: " + json.dumps(event).encode() + b"\n\n"
    done = {"type": "speech.audio.done", "usage": None}
    yield b"data: " + json.dumps(done).encode() + b"\n\n"


def load(model: str, device: str, threads: int) -> Piper:
    return Piper(model, device)
