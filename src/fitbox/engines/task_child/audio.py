"""Audio as the speech route sends it: 16-bit PCM made into wav, pcm, flac, mp3 or opus.

wav and pcm are written by the stdlib as the samples come (a streamed wav's header says
an unknown length, 0xFFFFFFFF, as OpenAI's does); pcm is 24 kHz mono s16le, OpenAI's
contract. flac, mp3 and opus are encoded by libsndfile (``soundfile``) where the
environment has it, once the samples are all made (their containers are written whole).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator

import numpy as np

PCM_RATE = 24000  # OpenAI's pcm: 24 kHz, 16-bit signed, little-endian, mono
OPUS_RATES = (48000, 24000, 16000, 12000, 8000)
STREAMED = ("wav", "pcm")  # written as the samples come
ENCODED = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}
CONTENT_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/opus",
}


def codecs() -> tuple[str, ...]:
    """The formats this environment can write: wav and pcm always, the rest by libsndfile."""
    try:
        import soundfile
    except (ImportError, OSError):
        return STREAMED
    have = soundfile.available_formats()
    return STREAMED + tuple(f for f, (major, _) in ENCODED.items() if major in have)


def resample(samples: np.ndarray, rate: int, to: int) -> np.ndarray:
    """Linear interpolation from ``rate`` to ``to`` (int16 in, int16 out)."""
    if rate == to or not len(samples):
        return samples
    n = round(len(samples) * to / rate)
    at = np.linspace(0, len(samples) - 1, n)
    return np.interp(at, np.arange(len(samples)), samples.astype(np.float32)).astype(np.int16)


def wav_header(rate: int, data_bytes: int = 0xFFFFFFFF) -> bytes:
    """A RIFF/WAVE header for mono 16-bit PCM; the default length is "unknown"."""
    riff = 0xFFFFFFFF if data_bytes == 0xFFFFFFFF else data_bytes + 36
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


def streamed(pieces: Iterator[np.ndarray], rate: int, fmt: str) -> Iterator[bytes]:
    """wav or pcm bytes, a piece as each is made."""
    if fmt == "wav":
        yield wav_header(rate)
    for piece in pieces:
        yield (resample(piece, rate, PCM_RATE) if fmt == "pcm" else piece).astype("<i2").tobytes()


def encoded(pieces: Iterator[np.ndarray], rate: int, fmt: str) -> bytes:
    """The whole file in ``fmt`` (flac, mp3, opus) once every piece is made."""
    import soundfile

    samples = np.concatenate(list(pieces) or [np.zeros(0, np.int16)])
    if fmt == "opus":  # Opus codes only these rates
        to = next((r for r in OPUS_RATES if r <= rate), OPUS_RATES[-1])
        samples, rate = resample(samples, rate, to), to
    major, subtype = ENCODED[fmt]
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=major, subtype=subtype)
    return out.getvalue()
