"""Task calls: fitbox's added latency per route (speech, transcription, images) over the
runner called directly, and the first audio byte of streamed speech against the whole file,
in one run.

Both paths hit the *same* task children (the ones fitbox launched for the piper voice and
whisper tiny.en, and the tiny random diffusers pipeline of tests/support/diffusers_engine.py,
in the runner environments the tests build: tests/support/task_engines.py),
interleaved, so runner, model and machine load are shared and only the door differs: for
transcription, the door's multipart parse, spool, hash and row against the child reading a
file already on disk; for images, the door's field checks, its size rule read from the
folder, and keeping each PNG (decoded, hashed, written) against the child's base64 reply.

    python bench/tasks.py [--calls 20]

Prints, per route, the p50 and p95 of the whole call direct and through fitbox, and the
added p50; then, for a long speech input streamed through fitbox, the first byte's time
against the last byte's (p50 over the calls).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.proxy_overhead import percentile, start_fitbox_argv  # noqa: E402
from tests.support.diffusers_engine import diffusers_python, tiny_pipeline  # noqa: E402
from tests.support.task_engines import (  # noqa: E402
    VOICE,
    WHISPER,
    engine_dir,
    piper_voice,
    whisper_folder,
)

SHORT = "The quick brown fox jumps over the lazy dog."
IMAGE = {"prompt": "a lighthouse at dusk", "size": "64x64", "n": 1, "seed": 1, "steps": 2}
LONG = " ".join(f"This is sentence number {n} of a longer reading." for n in range(1, 9))


def children(fitbox_pid: int) -> dict[str, str]:
    """Each task child's URL by its runner module (whisper, piper, diffusers)."""
    found = {}
    for child in psutil.Process(fitbox_pid).children(recursive=True):
        argv = child.cmdline()
        if "--runner" in argv and "--port" in argv:
            port = argv[argv.index("--port") + 1]
            found[argv[argv.index("--runner") + 1]] = f"http://127.0.0.1:{port}"
    return found


def timed(call: Callable[[], httpx.Response]) -> float:
    started = time.perf_counter()
    response = call()
    assert response.status_code == 200, response.text
    return time.perf_counter() - started


def row(route: str, direct: list[float], door: list[float]) -> str:
    added = statistics.median(door) - statistics.median(direct)
    return (
        f"{route:28s} direct p50 {statistics.median(direct) * 1000:8.1f} ms "
        f"p95 {percentile(direct, 95) * 1000:8.1f} | fitbox p50 "
        f"{statistics.median(door) * 1000:8.1f} ms p95 {percentile(door, 95) * 1000:8.1f} "
        f"| added p50 {added * 1000:7.1f} ms"
    )


def first_and_last(http: httpx.Client, url: str) -> tuple[float, float]:
    body = {"model": VOICE, "voice": "joe", "input": LONG, "response_format": "pcm"}
    started = time.perf_counter()
    first = None
    with http.stream("POST", url, json=body) as response:
        for _ in response.iter_raw():
            first = first if first is not None else time.perf_counter() - started
    return first or 0.0, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home, models = Path(tmp) / "home", Path(tmp) / "models"
        models.mkdir()
        (models / WHISPER).symlink_to(whisper_folder())
        (models / "joe").symlink_to(piper_voice().parent)
        (models / "tiny-sd").symlink_to(tiny_pipeline(diffusers_python()))
        env = dict(os.environ) | {"FITBOX_ENGINE_DIR": str(engine_dir(Path(tmp) / "engines"))}
        proc, url = start_fitbox_argv([sys.executable, "-m", "fitbox"], home, models, env)
        try:
            run(url, proc.pid, args.calls, Path(tmp))
        finally:
            proc.terminate()
            proc.wait(30)


def run(url: str, pid: int, calls: int, tmp: Path) -> None:
    http = httpx.Client(timeout=600)
    speech = {"model": VOICE, "voice": "joe", "input": SHORT, "response_format": "wav"}
    wav = http.post(f"{url}/v1/audio/speech", json=speech).content  # loads the voice
    (tmp / "said.wav").write_bytes(wav)
    form = {"model": WHISPER}
    http.post(f"{url}/v1/audio/transcriptions", data=form, files={"file": ("a.wav", wav)})
    http.post(f"{url}/v1/images/generations", json={"model": "tiny-sd", **IMAGE})  # loads it
    child = children(pid)

    def direct_transcription() -> httpx.Response:
        body = {"file": str(tmp / "said.wav"), "call": secrets.token_hex(4)}
        return http.post(f"{child['whisper']}/v1/audio/transcriptions", json=body)

    paths: dict[str, tuple[Callable[[], httpx.Response], Callable[[], httpx.Response]]] = {
        "/v1/audio/speech": (
            lambda: http.post(f"{child['piper']}/v1/audio/speech", json=speech),
            lambda: http.post(f"{url}/v1/audio/speech", json=speech),
        ),
        "/v1/audio/transcriptions": (
            direct_transcription,
            lambda: http.post(
                f"{url}/v1/audio/transcriptions", data=form, files={"file": ("a.wav", wav)}
            ),
        ),
        "/v1/images/generations": (
            lambda: http.post(
                f"{child['diffusers']}/v1/images/generations",
                json={**IMAGE, "call": secrets.token_hex(4)},
            ),
            lambda: http.post(f"{url}/v1/images/generations", json={"model": "tiny-sd", **IMAGE}),
        ),
    }
    for route, (direct, door) in paths.items():
        times: dict[str, list[float]] = {"direct": [], "door": []}
        for _ in range(calls):  # interleaved: the machine's drift lands on both alike
            times["direct"].append(timed(direct))
            times["door"].append(timed(door))
        print(row(route, times["direct"], times["door"]))
    streamed = [first_and_last(http, f"{url}/v1/audio/speech") for _ in range(max(calls // 4, 3))]
    first = statistics.median(f for f, _ in streamed)
    last = statistics.median(w for _, w in streamed)
    print(
        f"streamed speech ({len(LONG)} chars, pcm): first byte p50 {first * 1000:.1f} ms, "
        f"whole file p50 {last * 1000:.1f} ms ({first / last:.0%} of it)"
    )
    print(json.dumps({"child_urls": child}))


if __name__ == "__main__":
    main()
