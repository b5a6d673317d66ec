"""The faster-whisper runner: /v1/audio/transcriptions and /translations from a CTranslate2
whisper folder (model.bin, config.json, tokenizer.json or vocabulary.*).

The upload is the spooled file fitbox's door wrote (``file`` in the body); faster-whisper
decodes it (PyAV). Replies are OpenAI's: json, text, verbose_json (segments with their
timestamps, words when ``timestamp_granularities`` asks), srt, vtt; ``stream`` sends a
``transcript.text.delta`` event per segment as it is decoded, then ``transcript.text.done``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from .replies import BadRequest, Reply, Route, Stream, Whole

TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
FORMATS = ("json", "text", "verbose_json", "srt", "vtt")


def stamp(seconds: float, sep: str) -> str:
    """``HH:MM:SS,mmm`` (srt: ``sep`` ",") or ``HH:MM:SS.mmm`` (vtt: ".")."""
    ms = round(seconds * 1000)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{sep}{ms:03d}"


def srt(segments: list[dict[str, Any]]) -> str:
    blocks = [
        f"{i}\n{stamp(s['start'], ',')} --> {stamp(s['end'], ',')}\n{s['text'].strip()}\n"
        for i, s in enumerate(segments, 1)
    ]
    return "\n".join(blocks)


def vtt(segments: list[dict[str, Any]]) -> str:
    cues = [
        f"{stamp(s['start'], '.')} --> {stamp(s['end'], '.')}\n{s['text'].strip()}\n"
        for s in segments
    ]
    return "WEBVTT\n\n" + "\n".join(cues)


class Whisper:
    def __init__(self, model: str, device: str, threads: int) -> None:
        from faster_whisper import WhisperModel

        self.model = WhisperModel(model, device=device, cpu_threads=threads or 0)
        self.routes: dict[str, Route] = {
            TRANSCRIPTIONS: lambda body: self.run(body, "transcribe"),
            TRANSLATIONS: lambda body: self.run(body, "translate"),
        }
        self.measured: dict[str, float] = {}

    def extra_props(self) -> dict[str, Any]:
        return {"multilingual": bool(self.model.model.is_multilingual)}

    def run(self, body: dict[str, Any], task: str) -> Reply:
        fmt = str(body.get("response_format") or "json")
        if fmt not in FORMATS:
            raise BadRequest(
                f"response_format must be one of {', '.join(FORMATS)}",
                "response_format",
                "unsupported_response_format",
            )
        segments, info = self._decoded(body, task)
        self.measured["audio_in_s"] = float(info.duration)
        headers = {"x-fitbox-audio-seconds": f"{info.duration:.3f}"}
        usage = {"type": "duration", "seconds": math.ceil(info.duration)}
        if body.get("stream"):
            return Stream(_events(segments, usage), "text/event-stream", headers)
        found = [_segment(i, s) for i, s in enumerate(segments)]
        text = "".join(s["text"] for s in found).strip()
        if fmt == "text":
            return Whole((text + "\n").encode(), "text/plain; charset=utf-8", headers)
        if fmt in ("srt", "vtt"):
            made = srt(found) if fmt == "srt" else vtt(found)
            return Whole(made.encode(), f"text/{'plain' if fmt == 'srt' else 'vtt'}", headers)
        reply: dict[str, Any] = {"text": text, "usage": usage}
        if fmt == "verbose_json":
            reply = {
                "task": task,
                "language": info.language,
                "duration": info.duration,
                "text": text,
                "segments": [{k: v for k, v in s.items() if k != "words"} for s in found],
                "usage": usage,
            }
            if "word" in _granularities(body):
                reply["words"] = [w for s in found for w in s.get("words", [])]
        return Whole(json.dumps(reply).encode(), "application/json", headers)

    def _decoded(self, body: dict[str, Any], task: str) -> tuple[Iterator[Any], Any]:
        language = body.get("language") or None
        if language and not self.model.model.is_multilingual and language != "en":
            raise BadRequest(
                f"this model transcribes English only, not '{language}'",
                "language",
                "unsupported_language",
            )
        temperature = body.get("temperature")
        try:
            return self.model.transcribe(  # type: ignore[no-any-return]
                str(body["file"]),
                language=language,
                task=task,
                initial_prompt=body.get("prompt") or None,
                temperature=float(temperature) if temperature is not None else 0.0,
                word_timestamps="word" in _granularities(body),
                vad_filter=False,
            )
        except Exception as exc:  # PyAV's InvalidDataError and its kin: not audio
            if type(exc).__module__.startswith("av") or isinstance(exc, (ValueError, OSError)):
                said = str(exc).replace(repr(str(body["file"])), "").replace(str(body["file"]), "")
                raise BadRequest(
                    f"the file is not audio the decoder can read ({said.rstrip(': ')})",
                    "file",
                    "invalid_audio",
                ) from None
            raise


def _granularities(body: dict[str, Any]) -> list[str]:
    found = body.get("timestamp_granularities") or []
    return [str(g) for g in (found if isinstance(found, list) else [found])]


def _segment(index: int, s: Any) -> dict[str, Any]:
    made = {
        "id": index,
        "seek": s.seek,
        "start": s.start,
        "end": s.end,
        "text": s.text,
        "tokens": list(s.tokens),
        "temperature": s.temperature,
        "avg_logprob": s.avg_logprob,
        "compression_ratio": s.compression_ratio,
        "no_speech_prob": s.no_speech_prob,
    }
    if s.words:
        made["words"] = [{"word": w.word, "start": w.start, "end": w.end} for w in s.words]
    return made


def _events(segments: Iterator[Any], usage: dict[str, Any]) -> Iterator[bytes]:
    text = ""
    for segment in segments:
        text += segment.text
        event = {"type": "transcript.text.delta", "delta": segment.text}
        yield b"data: " + json.dumps(event).encode() + b"\n\n"
    done = {"type": "transcript.text.done", "text": text.strip(), "usage": usage}
    yield b"data: " + json.dumps(done).encode() + b"\n\n"


def load(model: str, device: str, threads: int) -> Whisper:
    return Whisper(model, device, threads)
