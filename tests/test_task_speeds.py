"""A task call's ETA: its work (a WAV's seconds from its header, speech's characters) over
its model's measured units per second (core/admission.py ``task_seconds``,
box/task_speeds.py), as a waiting call's output and as a placed call's expected end."""

from __future__ import annotations

import io
import struct
import wave
from pathlib import Path

import pytest

from fitbox.box.facts import Facts
from fitbox.box.speeds import SpeedBook
from fitbox.box.task_speeds import TASK_WINDOW, TaskRates
from fitbox.box.waiting import waiter_eta
from fitbox.core.admission import task_seconds
from fitbox.core.audio_header import wav_seconds
from fitbox.models.catalog import Artifact
from fitbox.models.task_models import PIPER, task_facts


def _wav(seconds: float, rate: int = 16000, channels: int = 1) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * channels * int(rate * seconds))
    return out.getvalue()


def test_a_wav_says_its_seconds_from_its_header() -> None:
    made = _wav(2.5)
    assert wav_seconds(made[:4096], len(made)) == pytest.approx(2.5)
    stereo = _wav(1.25, rate=22050, channels=2)
    assert wav_seconds(stereo, len(stereo)) == pytest.approx(int(22050 * 1.25) / 22050)


def test_a_streamed_wav_counts_the_rest_of_its_file() -> None:
    made = bytearray(_wav(3.0))
    at = made.index(b"data")
    made[at + 4 : at + 8] = struct.pack("<I", 0xFFFFFFFF)  # a writer that streams
    assert wav_seconds(bytes(made[:64]), len(made)) == pytest.approx(3.0)


def test_what_is_not_a_wav_header_says_nothing() -> None:
    assert wav_seconds(b"ID3\x03\x00" + b"\0" * 100, 105) is None  # an mp3
    assert wav_seconds(b"RIFF\0\0\0\0WAVE", 12) is None  # no fmt, no data
    made = _wav(1.0)
    no_rate = made[:20] + b"\0" * (len(made) - 20)  # its fmt chunk zeroed
    assert wav_seconds(no_rate, len(made)) is None


def test_a_task_call_takes_its_work_over_the_median_rate() -> None:
    assert task_seconds(10.0, [2.0, 5.0, 100.0]) == pytest.approx(2.0)
    assert task_seconds(None, [5.0]) is None  # its work unknown (an mp3 upload)
    assert task_seconds(10.0, []) is None  # its model never measured
    assert task_seconds(10.0, [0.0]) is None


def _voice(tmp_path: Path) -> Artifact:
    onnx = tmp_path / "v.onnx"
    onnx.write_bytes(b"\0" * 1000)
    (tmp_path / "v.onnx.json").write_text('{"dataset": "v"}')
    return Artifact("v", onnx, task_facts(onnx, PIPER), format=PIPER)


def test_measured_rates_price_a_waiting_task_call(tmp_path: Path) -> None:
    voice = _voice(tmp_path)
    speeds, facts = SpeedBook(None), Facts(None, [])
    assert waiter_eta(speeds, facts, voice, 0, work=44.0) == (None, None)
    speeds.tasks.record(voice, units=440.0, seconds=2.0)  # 220 characters a second
    speeds.tasks.record(voice, units=0.0, seconds=2.0)  # nothing done: no rate
    assert speeds.tasks.rates(voice) == [220.0]
    assert speeds.tasks.seconds(voice, 44.0) == pytest.approx(0.2)
    # its load never measured: no ETA yet, as a chat call's
    load, output = waiter_eta(speeds, facts, voice, 0, work=44.0)
    assert load is None and output == pytest.approx(0.2)


def test_a_window_of_rates_is_kept(tmp_path: Path) -> None:
    voice, rates = _voice(tmp_path), TaskRates()
    for n in range(TASK_WINDOW + 5):
        rates.record(voice, units=float(n + 1), seconds=1.0)
    assert rates.rates(voice)[0] == 6.0 and len(rates.rates(voice)) == TASK_WINDOW
    voice.path.unlink()  # a file gone: nothing to price it by
    assert rates.seconds(voice, 1.0) is None
