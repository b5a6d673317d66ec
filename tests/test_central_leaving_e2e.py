"""A stopping central ends its fleet page's event streams at once: a real `fitbox central
serve` with a browser's stream open (`/dashboard/events`, from the central's own host) is
sent SIGTERM, and the stream ends and the process exits well within uvicorn's 5 s grace
period, which it would otherwise wait out for the stream that never ends on its own."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx

from .support.central import Central

GRACE_S = 5.0  # the central's uvicorn timeout_graceful_shutdown


def test_the_fleet_page_stream_ends_when_the_central_stops(tmp_path: Path) -> None:
    central = Central(tmp_path)
    central.start()
    assert central.proc is not None
    ended = threading.Event()
    lines: list[str] = []
    try:
        with httpx.stream("GET", f"{central.url}/dashboard/events", timeout=30) as stream:
            assert stream.status_code == 200, stream.read()
            assert stream.headers["content-type"].startswith("text/event-stream")
            read = stream.iter_lines()
            while (line := next(read)) != "":  # the first update: the stream is open
                lines.append(line)
            assert lines[0] == "event: update"

            def drain() -> None:
                for line in read:
                    lines.append(line)
                ended.set()

            reader = threading.Thread(target=drain, daemon=True)
            reader.start()
            stopped_at = time.monotonic()
            central.proc.send_signal(signal.SIGTERM)
            assert ended.wait(GRACE_S - 2), "the stream was still open"
        central.proc.wait(timeout=GRACE_S + 10)
        took = time.monotonic() - stopped_at
        assert took < GRACE_S - 1, f"the central took {took:.1f} s to exit"
        assert central.proc.returncode in (0, -signal.SIGTERM)  # uvicorn raises it again
    finally:
        central.stop(signal.SIGKILL)
